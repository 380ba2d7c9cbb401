"""bench/cloud_input.py runs end to end at a small size and prints its table (figures not checked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raypipe.sources.transport.cache import LocalCache
from raypipe.sources.transport.cache_config import CacheConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cloud_input_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAYPIPE_NO_PROGRESS="1")
    env.pop("RAYPIPE_CACHE_DIR", None)
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "figures.json"
    # the S3 server on a core of its own where there are two or more (the contenders on the others)
    split = ["--server-cores", "1"] if len(os.sched_getaffinity(0)) > 1 else []
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "cloud_input.py"),
            "--images",
            "200",
            "--epochs",
            "2",
            "--rounds",
            "2",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
            *split,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert len(figures["server_cores"]) == (1 if split else 0)
    names = ["folder", "parquet", "webdataset", "s3 shards", "s3 parquet", "s3 folder", "s3 folder, no cache"]
    assert list(figures["ratios"]) == [*names, "s3 folder, warm cache"]
    # a ratio per round; the warm cache once
    assert [len(figures["ratios"][n]) for n in names] == [2] * 7 and len(
        figures["ratios"]["s3 folder, warm cache"]
    ) == 1
    assert figures["ratios"]["folder"] == [1.0, 1.0]
    runs = [r[n] for r in figures["rounds"] for n in names] + [
        figures["warm cache"],
        figures["warm cache"]["folder after"],
    ]
    assert len(runs) == 16 and all(r["images"] == [200, 200] for r in runs)
    assert 0 < figures["entropy"]["ratio"] <= 1.5
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| s3 (20 ms) folder, warm cache |")
    # "s3 folder" ran with nothing configured: its images went to the default cache (here under the work
    # folder), one entry per image; the contenders with the cache off added none
    for k in (1, 2):  # a new cache for each round
        cache = tmp_path / "work" / "xdg-cache" / f"round-{k}" / "raypipe"
        assert len(LocalCache(CacheConfig(dir=str(cache), max_bytes=1 << 30)).sizes()) == 200

    # --only: those contenders and their baseline, on the data the first run made
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "cloud_input.py"),
            "--images",
            "200",
            "--epochs",
            "1",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
            "--only",
            "s3 parquet",
            *split,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert list(figures["ratios"]) == ["folder", "s3 parquet"] and figures["warm cache"] is None
