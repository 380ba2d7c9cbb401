"""bench/elastic.py: its accounting over a made-up run (what each figure is), and the script end to end
at a tiny size on Ray's fake autoscaling cluster, each configuration's figures adding up (the figures
themselves are the benchmark's business, never asserted here)."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "elastic.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_elastic", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclass looks its module up
    spec.loader.exec_module(bench)
    return bench


def test_the_accounting_of_a_made_up_run():
    bench = _bench()
    tick = bench.CLOCK_TICKS
    t0 = 100.0
    # phases of 6 s, intervals of 3 s; one node until 7 s, three from 7 s, one again from 14 s; the
    # machine busy one core throughout
    samples = [(t0 + t, 1 if t < 7 or t >= 14 else 3, round(tick * (t + 2))) for t in range(-2, 19)]
    trace = bench.Trace(started=t0 - 4, t0=t0, samples=samples, changes=[(t0 + 6.5, "1 -> 3 workers")])
    trace.batches = [(t0 + t, 8) for t in range(18)]  # 8 images a second
    trace.waits = [(t0 + 6.0, t0 + 7.5), (t0 + 8.0, t0 + 8.3), (t0 + 12.9, t0 + 13.0)]
    r = bench.account(trace, phase_s=6.0, interval_s=3.0, steps_s=(0.5, 0.25, 0.5), batch_size=8)

    assert r["first_batch_s"] == 4.0
    assert [i["phase"] for i in r["intervals"]] == ["low", "low", "high", "high", "low again", "low again"]
    assert [i["images"] for i in r["intervals"]] == [24] * 6
    assert [i["wait_s"] for i in r["intervals"]] == [0.0, 0.0, 1.8, 0.0, 0.1, 0.0]
    assert [i["node_s"] for i in r["intervals"]] == [3.0, 3.0, 7.0, 9.0, 7.0, 3.0]
    assert r["intervals"][2]["cpu_s_per_image"] == round(7.0 / 24, 7)
    assert r["intervals"][2]["machine_cpu_s"] == pytest.approx(3.0)
    high = r["phases"]["high"]
    assert (high["demand_per_s"], high["images"], high["stall"]) == (32.0, 48, round(1.8 / 6, 4))
    assert (high["node_s"], high["most_nodes"]) == (16.0, 3)
    assert r["run"]["images"] == 144 and r["run"]["node_s"] == 32.0
    assert r["most_nodes_before_step_up"] == 1  # start-up included
    assert r["nodes_up_after_step_up_s"] == 1.0  # three nodes from 7 s
    assert r["fed_after_step_up_s"] == 3.0  # the second interval of the high phase: the first at <= 2 %
    assert r["stall_after_fed"] == 0.0  # and it held
    assert r["one_node_after_step_down_s"] == 2.0  # one node again from 14 s
    assert r["nodes_timeline"] == [(-2.0, 1), (7.0, 3), (14.0, 1)]
    assert r["width_changes"] == [(6.5, "1 -> 3 workers")]


def test_a_trainer_never_fed_and_nodes_never_released_say_so():
    bench = _bench()
    t0 = 0.0
    samples = [(float(t), 2, 0) for t in range(0, 10)]
    trace = bench.Trace(started=0.0, t0=t0, samples=samples, batches=[(0.5, 4)], waits=[(1.0, 9.0)])
    r = bench.account(trace, phase_s=3.0, interval_s=3.0, steps_s=(0.1, 0.1, 0.1), batch_size=4)
    assert r["fed_after_step_up_s"] is None and r["one_node_after_step_down_s"] is None
    assert r["stall_after_fed"] is None
    assert r["intervals"][1]["cpu_s_per_image"] is None  # no image trained in it
    assert r["nodes_up_after_step_up_s"] == 0.0  # as many nodes as it ever held, from the step up


def test_a_lull_after_the_step_up_is_told_apart_by_the_stall_after_it():
    bench = _bench()
    samples = [(float(t), 1, 0) for t in range(0, 19)]
    trace = bench.Trace(started=0.0, t0=0.0, samples=samples, batches=[(0.5, 4)], waits=[(10.0, 12.0)])
    r = bench.account(trace, phase_s=6.0, interval_s=2.0, steps_s=(0.1, 0.1, 0.1), batch_size=4)
    assert r["fed_after_step_up_s"] == 0.0  # its first two intervals waited for nothing
    assert r["stall_after_fed"] == round(2 / 6, 4)  # the third did, the whole of it
    assert r["one_node_after_step_down_s"] == 0.0  # one node throughout: nothing to release


def test_a_phase_that_is_no_whole_number_of_intervals_is_refused():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--phase-s", "10", "--interval-s", "3"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--phase-s=10" in proc.stderr


def _adds_up(r: dict, interval_s: float, phase_s: float) -> None:
    intervals, phases, run = r["intervals"], r["phases"], r["run"]
    assert len(intervals) == round(3 * phase_s / interval_s) and list(phases) == ["low", "high", "low again"]
    for key in ("images", "wait_s", "node_s", "machine_cpu_s"):
        by_interval = sum(i[key] for i in intervals)
        by_phase = sum(p[key] for p in phases.values())
        assert math.isclose(by_interval, run[key], rel_tol=1e-3, abs_tol=0.01), key
        assert math.isclose(by_phase, run[key], rel_tol=1e-3, abs_tol=0.01), key
    for span in [*intervals, *phases.values(), run]:
        assert 0 <= span["stall"] <= 1 and span["most_nodes"] <= 2
        assert math.isclose(span["stall"], span["wait_s"] / span["seconds"], abs_tol=1e-3)
        assert math.isclose(span["nodes"], span["node_s"] / span["seconds"], abs_tol=1e-2)
        if span["images"]:
            cpu_s = span["node_s"] * r["node_cpus"] / span["images"]  # node_s rounded to ms
            assert math.isclose(span["cpu_s_per_image"], cpu_s, rel_tol=1e-3, abs_tol=1e-3 / span["images"])
        else:
            assert span["cpu_s_per_image"] is None
    assert run["images"] > 0 and r["first_batch_s"] > 0
    assert r["nodes_timeline"] and all(0 <= n <= 2 for _, n in r["nodes_timeline"])
    assert "trainer" in r["roles_ms_per_image"] and all(ms >= 0 for ms in r["roles_ms_per_image"].values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_three_configurations_at_a_tiny_size(tmp_path):
    from raypipe.sample_data import write_sample_data

    data = tmp_path / "data"
    write_sample_data(data, classes=2, per_class=16)
    out, plot = tmp_path / "figures.json", tmp_path / "elastic.png"
    interval_s, phase_s = 2.0, 4.0
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--data",
        str(data),
        "--phase-s",
        str(phase_s),
        "--interval-s",
        str(interval_s),
        "--step-ms-low",
        "200",
        "--step-ms-high",
        "50",
        "--input-size",
        "32",
        "--aa",
        "",
        "-b",
        "8",
        "--max-nodes",
        "2",
        "--idle-timeout-s",
        "3",
        "--timeout",
        "120",
        "--json",
        str(out),
        "--plot",
        str(plot),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [r["config"] for r in results] == ["elastic", "floor", "ceiling"]
    for r in results:
        _adds_up(r, interval_s, phase_s)
        assert f"{r['config']}: first batch after" in proc.stdout and f"| {r['config']} |" in proc.stdout
    assert results[2]["most_nodes_before_step_up"] == 2  # the ceiling's nodes, up from the start
    assert plot.stat().st_size > 0 or "no plot written" in proc.stderr
