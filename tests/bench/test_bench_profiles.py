"""bench/profiles.py: every command the docs and comments quote names a script that exists and, for
profiles.py, one of its measurements; a few cheap measurements run end to end (figures not checked)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from raypipe.sources.transport.cache import LocalCache
from raypipe.sources.transport.cache_config import CacheConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "profiles.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


def _quoting_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").iterdir()]
    return files + [p for p in (ROOT / "raypipe").rglob("*") if p.suffix in (".py", ".c")]


def test_every_quoted_bench_script_exists_and_every_measurement_is_one_of_profiles():
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    measurements = set(re.findall(r"^    (\S+)", out.stdout.split("positional arguments:")[1], re.M))
    assert {"slab-cost", "warm-memory", "stage", "autoaug", "cpu-account", "s3-requests"} <= measurements
    for path in _quoting_files():
        text = path.read_text(errors="replace")
        for name in re.findall(r"(?<![\w/])bench/(\w+\.(?:py|sh))", text):  # not tests/bench/'s tests
            assert (ROOT / "bench" / name).exists(), f"{path.relative_to(ROOT)} quotes bench/{name}"
        for name in re.findall(r"profiles\.py\s+([a-z][\w-]*)", text):
            assert name in measurements, f"{path.relative_to(ROOT)} quotes profiles.py {name}"


@pytest.mark.parametrize(
    "name",
    [
        "slab-cost",
        "start-cost",
        "stage",
        "cpu-account",
        "s3-requests",
        "s3-listing",
        "s3-folder-listing",
        "rng",
        "shard-listing",
        "idle-ray",
        "cross-node",
    ],
)
def test_each_measurement_explains_itself(name):
    out = _run(name, "--help")
    assert out.returncode == 0 and "usage: profiles.py " + name in out.stdout, out.stderr


def test_cheap_measurements_run():
    out = _run("slab-cost", "--rows", "2", "--size", "16", "--repeat", "2")
    assert out.returncode == 0 and "reused slab" in out.stdout and "map lazily" in out.stdout, out.stderr
    out = _run("warm-memory", "--gib", "0.01")
    assert out.returncode == 0 and "first touch" in out.stdout, out.stderr


@pytest.mark.timeout(120)
def test_s3_requests_reads_every_object_each_way_and_the_same_files_from_disk(tmp_path):
    folder = tmp_path / "buckets" / "bench" / "folder"
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True)
        for i in range(3):
            (folder / label / f"{i}.jpg").write_bytes(bytes([i]) * 1000)
    out = _run("s3-requests", str(tmp_path / "buckets"), "--threads", "2")
    assert out.returncode == 0, out.stderr
    ways = {line.split(":")[0]: line for line in out.stdout.splitlines() if "CPU per object" in line}
    assert list(ways) == [
        "HEAD + GET (pyarrow)",
        "HEAD (pyarrow)",
        "GET (single_get, obstore)",
        "local file, 2 threads",
        "local file, in this thread",
    ], out.stdout
    assert all(": 6 objects in " in line for line in ways.values()), out.stdout
    cache = tmp_path / "cache"
    out = _run("s3-requests", str(tmp_path / "buckets"), "--threads", "2", "--cache-dir", str(cache))
    assert out.returncode == 0, out.stderr
    ways = {line.split(":")[0]: line for line in out.stdout.splitlines() if "CPU per object" in line}
    assert list(ways) == ["blocks, no cache", "blocks, cache filled", "blocks, cache read"], out.stdout
    assert all(": 6 objects in " in line for line in ways.values()), out.stdout
    entries = LocalCache(CacheConfig(dir=str(cache), max_bytes=1 << 30))
    got = sorted(entries.read(key, size) for key, size in entries.sizes().items())
    assert got == sorted(p.read_bytes() for p in folder.rglob("*.jpg"))


@pytest.mark.timeout(180)
def test_idle_ray_measurement_runs():
    out = _run("idle-ray", "--seconds", "1", "--settle", "0")
    assert out.returncode == 0 and "a private Ray, idle, over 1 s" in out.stdout and "raylet" in out.stdout, out.stderr


@pytest.mark.timeout(240)
def test_cross_node_measurement_runs():
    out = _run("cross-node", "--chunks", "2", "--rows", "2", "--size", "16", "--rounds", "1")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip().endswith(" ms")]
    assert [line.split(":")[0].strip() for line in lines] == ["same node", "across nodes", "loopback TCP"], out.stdout


def test_remote_folder_listing_measurement_runs(tmp_path):
    """Both listings list every object, and the server's count of requests comes back from its process."""
    out = _run(
        "s3-folder-listing",
        "--prefixes",
        "3",
        "--objects",
        "5",
        "--latency-ms",
        "0",
        "--server-cores",
        "0",
        "--workdir",
        str(tmp_path / "work"),
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "objects " in line and " s " in line]
    assert len(lines) == 2 and all(" 15 objects" in line for line in lines), out.stdout
    assert "served 1 requests" in lines[0] and "served 4 requests" in lines[1], out.stdout
    assert not (tmp_path / "work").exists()


def test_the_synthetic_shard_datasets_list_alike_by_shard(tmp_path):
    """The billion-sample measurement's datasets: the footer-only index and the one with every row give
    the same listing by shard; the latter's rows list by row too."""
    from raypipe.benchmark.listing import write_shard_dataset
    from raypipe.sources import open_source

    footer = write_shard_dataset(tmp_path / "footer", 3, 4, member_rows=False)
    rows = write_shard_dataset(tmp_path / "rows", 3, 4, member_rows=True)
    a, b = open_source(str(footer), by_shard=True), open_source(str(rows), by_shard=True)
    assert a.shard_counts.tolist() == b.shard_counts.tolist() == [4, 4, 4] and a.digest() == b.digest()
    listed = open_source(str(rows), by_shard=False)
    assert len(listed) == 12 and listed.table.column("label").to_pylist() == [0] * 4 + [1] * 4 + [2] * 4
