"""bench/gpu_check.py must be runnable everywhere: --help works, and without CUDA it exits 0 saying so."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def test_help_runs():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--batch" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the script would run for real")
def test_exits_cleanly_without_cuda():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "CUDA is absent" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the session would run for real")
def test_gpu_session_script_runs_its_steps_and_logs_them(tmp_path):
    script = SCRIPT.parent / "gpu_session.sh"
    env = dict(os.environ, OUT=str(tmp_path), STEPS="gpu_check")
    out = subprocess.run(
        ["bash", str(script)], cwd=SCRIPT.parents[1], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "CUDA is absent" in (tmp_path / "gpu_check.log").read_text()
    assert "failed steps: 0" in out.stdout and not (tmp_path / "gpu_train.log").exists()


def test_the_checks_that_need_no_stream_run_on_the_cpu():
    """The transform-cost and timm checks call raypipe's device API as the CUDA run will: run them on the
    CPU (tiny batches), so a renamed class or argument fails here rather than on a lent GPU."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    dev = gpu_check._import_device()
    rows: list = []
    gpu_check.check_transform_cost(dev, rows, 4, 16, 1, device="cpu")
    gpu_check.check_vs_timm(dev, rows, gpu_check.make_batches(4, 16, 3), device="cpu")
    names = [r[0] for r in rows]
    assert names == [
        "normalise fp16 channels_last",
        "random erasing re_prob=0.25 const",
        "random erasing re_prob=0.25 pixel",
        "mixup+cutmix mode=batch",
        "mixup+cutmix mode=elem",
        "timm PrefetchLoader, same NCHW tensors, fp16",
        "raypipe DeviceLoader, same NCHW tensors, fp16",
    ]
    assert all(r[1].endswith(("ms/batch", "img/s")) and r[2] == "" for r in rows)
