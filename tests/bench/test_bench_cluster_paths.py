"""bench/cluster_paths.py on the CPU at a small size: every path and the scaling mode run end to end and
account for every image (figures are the benchmark's business, never asserted here)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import psutil
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "cluster_paths.py"
IMAGES = 24


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from raypipe.sample_data import write_sample_data

    root = tmp_path_factory.mktemp("cluster-paths")
    write_sample_data(str(root), classes=2, per_class=IMAGES // 2, workers=1)
    return root


def _run(args: list[str], tmp_path) -> object:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(SCRIPT), *args, "--epochs", "1", "-b", "8", "--img-size", "32", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _check(r: dict) -> None:
    assert r["images"] == IMAGES  # the measured epoch, every image once
    assert r["seconds"] > 0 and r["images_per_s"] > 0
    # CPU is read in the kernel's 10 ms ticks: an epoch of 24 tiny images made ahead may take none
    assert r["cpu_ms_per_image"] >= 0 and 0 <= r["busy"] <= 1
    assert r["roles_ms_per_image"]["trainer"] >= 0


@pytest.mark.timeout(420)
def test_the_three_paths_and_timm_in_one_run(tiny_folder, tmp_path):
    stdout, rounds = _run(
        [str(tiny_folder), "--rounds", "1", "--nodes", "1", "--node-cpus", "1", "--timm-workers", "1"], tmp_path
    )
    assert list(rounds[0]) == ["local", "ray-node", "ray-nodes", "nodes", "timm-1"]
    for r in rounds[0].values():
        _check(r)
    # the README's API runs a feeder process (its CPU may round to 0 at this size), local workers none
    assert "feeder" in rounds[0]["ray-node"]["roles_ms_per_image"]
    assert "feeder" not in rounds[0]["local"]["roles_ms_per_image"]
    for name in rounds[0]:
        assert f"| {name} |" in stdout


@pytest.mark.timeout(420)
@pytest.mark.parametrize("path", ["ray-nodes", "nodes"])
def test_the_scaling_mode_runs_each_node_count(tiny_folder, tmp_path, path):
    stdout, results = _run(
        [str(tiny_folder), "--scaling", "1", "2", "--node-cpus", "1", "--scaling-path", path], tmp_path
    )
    assert sorted(results) == ["1", "2"]
    for r in results.values():
        _check(r)
    assert "| 2 | 2 |" in stdout  # two nodes, two augmentation CPUs


def test_process_roles():
    from raypipe.benchmark.paths import process_role

    me = psutil.Process()
    assert process_role(me, me.pid) == "trainer"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_role(psutil.Process(child.pid), me.pid) == "augmentation"  # a DataLoader worker's place
        assert process_role(psutil.Process(child.pid), -1) == "other"
    finally:
        child.kill()
        child.wait()


def test_the_table_without_the_local_path_has_no_ratios():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cluster_paths", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = {"images_per_s": 100.0, "cpu_ms_per_image": 2.0, "busy": 0.5, "roles_ms_per_image": {"trainer": 0.5}}
    table = bench._paths_table([{"ray-nodes": r}, {"ray-nodes": {**r, "images_per_s": 120.0}}])
    assert "| ray-nodes | 100 |  | 2.00 ms |  | 50 % | 0.50 |" in table  # the lower middle round; no local ratio
    with_local = bench._paths_table([{"local": r, "ray-node": {**r, "images_per_s": 50.0}}])
    assert "| ray-node | 50 | 0.50 (0.50) |" in with_local


@pytest.mark.timeout(200)
def test_the_compression_mode_reports_both_codings(tiny_folder, tmp_path):
    stdout, figures = _run([str(tiny_folder), "--compression"], tmp_path)
    assert sorted(figures) == ["up filter + zlib-1", "zlib-1"]
    for r in figures.values():
        assert 0 < r["ratio"] < 1.1 and r["compress_ms_per_image"] > 0 and r["decompress_ms_per_image"] >= 0
    assert "of the bytes" in stdout
