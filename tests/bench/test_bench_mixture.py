"""bench/mixture.py and bench/mixture_plan.py on tiny inputs: they write their parts, print figures that
parse and are positive, and the mixture's epochs emit every row."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def _run(*args: str, timeout: int) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.timeout(240)
def test_the_mixture_bench_compares_the_parts_alone_with_their_mixture_taking_every_row(tmp_path):
    from raypipe.sample_data import write_sample_data

    write_sample_data(str(tmp_path / "photos"), classes=2, per_class=8, workers=1)
    cmd = [str(BENCH / "mixture.py"), str(tmp_path / "photos"), str(tmp_path / "work")]
    out = _run(*cmd, "--rounds", "1", "--epochs", "2", "-b", "4", "--img-size", "32", "--num-tasks", "1", timeout=220)
    assert "wrote part A: 8 images" in out and "part B: 8 images" in out
    m = re.search(r"round 0: parts alone\s+(\d+) img/s\s+mixture\s+(\d+) img/s\s+ratio (\d+\.\d{3})", out)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0 and float(m.group(3)) > 0
    assert "checked: each epoch emitted every row once (the mixture's: 8 + 8 rows)" in out
    assert float(re.search(r"median ratio (\d+\.\d{3})$", out.strip()).group(1)) > 0
    assert len(list((tmp_path / "work" / "part-a-shards").glob("*.tar"))) == 1
    assert (tmp_path / "work" / "part-b.parquet").exists()


@pytest.mark.timeout(120)
def test_the_mixture_plan_bench_times_listing_and_planning_both_ranks_first_chunks(tmp_path):
    args = ["--samples", "100000", "--per-shard", "1000", "--parquet-rows", "5000", "--world-size", "4"]
    out = _run(str(BENCH / "mixture_plan.py"), *args, str(tmp_path), timeout=100)
    assert "100,000 samples in 100 shards + 5,000 rows, takes (100000, 5000)" in out
    for rank in (0, 3):
        assert re.search(rf"rank {rank}: first chunk's takes\s+\d+\.\d+ s", out)
    firsts = re.findall(r"rows in [\d,]+ chunks; the first (\d+) takes, per part \[(\d+), (\d+)\]", out)
    assert len(firsts) == 2 and all(int(n) == int(a) + int(b) > 0 for n, a, b in firsts)
    m = re.search(r"plan first epoch: (\d+\.\d\d) s \(listing (\d+\.\d\d) s\), peak RSS (\d+) MB", out)
    assert m and float(m.group(1)) >= 0 and float(m.group(2)) > 0 and int(m.group(3)) > 0
    assert len(list((tmp_path / "wds-100x1000").glob("*.tar"))) == 100
