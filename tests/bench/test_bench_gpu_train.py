"""bench/gpu_train.py on the CPU: every feed trains and reports (the GPU figures come from a CUDA run)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu_train.py"


@pytest.mark.timeout(240)
def test_cpu_smoke_run_reports_every_feed(tmp_path):
    out = tmp_path / "train.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--device",
        "cpu",
        "--model",
        "resnet10t",
        "--batch",
        "8",
        "--size",
        "48",
        "--images",
        "48",
        "--augments",
        "rrc",
        "--seconds",
        "1",
        "--warmup-steps",
        "1",
        "--workers",
        "2",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    feeds = [res["ceiling"], res["augments"]["rrc"]["raypipe"], res["augments"]["rrc"]["timm"]]
    for feed in feeds:
        assert feed["steps"] >= 1 and feed["images"] >= feed["steps"]
        assert feed["images_per_s"] > 0 and 0.0 <= feed["stall_share"] <= 1.0
        assert 0 < feed["step_ms_median"] <= feed["step_ms_p90"] <= feed["step_ms_max"]
        assert 0.0 <= feed["slow_step_share"] <= 1.0
        assert 0 < feed["issue_ms_median"] <= feed["step_ms_max"]
        # the training thread's scheduler counters (Linux): shares of the window, switches per step
        assert 0.0 < feed["main_cpu_share"] <= 1.05 and 0.0 <= feed["main_runqueue_share"] <= 1.05
        assert feed["main_voluntary_per_step"] >= 0 and feed["main_involuntary_per_step"] >= 0
    assert "step ms (no data wait): median" in proc.stdout and "training thread: on a core" in proc.stdout
    assert "of ceiling" in proc.stdout and "raypipe rrc" in proc.stdout and "timm rrc" in proc.stdout


def test_exits_cleanly_without_cuda_when_asked_for_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the script would run for real")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "CUDA is absent" in proc.stdout
