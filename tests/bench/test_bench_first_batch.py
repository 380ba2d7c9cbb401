"""bench/first_batch.py on the CPU: each loader's first batch is timed, step by step, in its own process."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "first_batch.py"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from raypipe.sample_data import write_sample_data

    root = tmp_path_factory.mktemp("first-batch")
    write_sample_data(str(root), classes=2, per_class=4, workers=1)
    return root


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "loader, steps",
    [
        ("dropin", ["loader (listing)"]),
        ("timm", ["loader (listing)"]),
        ("feeder", ["Ray's start", "listing (Pipeline)", "FeederSource"]),
    ],
)
def test_each_loader_reports_its_first_batch(tiny_folder, loader, steps):
    cmd = [sys.executable, str(SCRIPT), str(tiny_folder), "--loader", loader, "-b", "4", "--img-size", "32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{loader} on cpu, batch 4" in proc.stdout
    times = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\s+(.+?)\s+(\d+\.\d\d) s$", line)
        if m:
            times[m.group(1)] = float(m.group(2))
    assert list(times) == [*steps, "first batch", "total"]
    assert times["first batch"] > 0
    assert times["total"] == pytest.approx(sum(v for k, v in times.items() if k != "total"), abs=0.03)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("loader", ["dropin", "feeder"])
def test_a_resumed_loader_reports_its_first_batch(tiny_folder, loader):
    cmd = [
        sys.executable,
        str(SCRIPT),
        str(tiny_folder),
        "--loader",
        loader,
        "-b",
        "2",
        "--img-size",
        "32",
        "--resume-at",
        "2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "resumed after batch 2" in proc.stdout and "first batch" in proc.stdout
    refused = subprocess.run([*cmd[:4], "timm", *cmd[5:]], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "no position" in refused.stderr
