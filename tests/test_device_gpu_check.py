"""bench/gpu_check.py must be runnable everywhere: --help works, and without CUDA it exits 0 saying so."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


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
    out = subprocess.run(["bash", str(script)], cwd=SCRIPT.parents[1], env=env, capture_output=True, text=True,
                         timeout=240)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "CUDA is absent" in (tmp_path / "gpu_check.log").read_text()
    assert "failed steps: 0" in out.stdout and not (tmp_path / "gpu_train.log").exists()
