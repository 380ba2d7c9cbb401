"""bench/gpu_check.py must be runnable everywhere: --help works, and without CUDA it exits 0 saying so."""

from __future__ import annotations

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
