"""A trainer's demand stepped up and down on Ray's fake autoscaling cluster, and the CPU nodes that follow.

Head = the trainer's node (1 CPU); a CPU node type of 1 CPU with ``preprocess``, 0 to ``--max-nodes`` nodes,
idle timeout ``--idle-timeout-s``. The trainer takes a batch every ``--step-ms-low`` ms for ``--phase-s``,
every ``--step-ms-high`` ms (more than one node makes) for as long, then at the low rate again. Three
configurations of the default backend on a cluster joined (node workers), each in a fresh process: ``elastic``
(the default: ``ExecutionConfig()``), ``floor`` (``num_tasks=1``, one node kept up) and ``ceiling``
(``num_tasks=--max-nodes``, as many kept up).
Per ``--interval-s`` from the first batch: the trainer's stall (blocked on its next batch), the CPU nodes
alive, CPU-seconds per trained image (nodes x seconds x CPUs per node / images) and the machine's busy CPU
(``/proc/stat``) per image; per phase the same, the time from the step up to the stall at <= 2 % and from
the step down to one node left; where the machine's CPU went, by process role. The defaults are the size
of docs/performance.md (2000 sample images, 224 px RandomResizedCrop + rand-m9, batch 64, 160 then 800
then 160 img/s for 60 s each), measured on a quiet machine::

    python bench/elastic.py --plot /tmp/elastic.png
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULT = "RESULT "  # the line a measuring process prints its figures on
CONFIGS = ("elastic", "floor", "ceiling")
PHASES = ("low", "high", "low again")
FED = 0.02  # a stall share at or below this is a fed trainer (the 2 %)
POLL_S = 0.5  # how often the CPU nodes and /proc/stat are read
NODE_CPUS = 1  # CPUs of a CPU node (and of a worker)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

log = logging.getLogger("bench.elastic")


# -- what one configuration's run saw -------------------------------------------------------------------------


@dataclass
class Trace:
    """The trainer's run (times on ``time.monotonic``): ``t0`` its first batch, ``waits`` each span it was
    blocked on the next batch after that, ``batches`` each batch's arrival and images; ``samples`` the
    (time, CPU nodes alive, machine busy clock ticks) read every ``POLL_S``; ``changes`` the elastic
    width's log lines (time, message)."""

    started: float
    t0: float
    waits: list[tuple[float, float]] = field(default_factory=list)
    batches: list[tuple[float, int]] = field(default_factory=list)
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    changes: list[tuple[float, str]] = field(default_factory=list)
    epochs: int = 0


def _overlap(spans: list[tuple[float, float]], a: float, b: float) -> float:
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans)


def _node_seconds(samples: list[tuple[float, int, int]], a: float, b: float) -> float:
    """The CPU nodes alive integrated over [a, b): each sample's count holds until the next sample (the
    first's from before it, the last's on)."""
    total = 0.0
    for i, (t, n, _) in enumerate(samples):
        start = -float("inf") if i == 0 else t
        end = samples[i + 1][0] if i + 1 < len(samples) else float("inf")
        total += n * max(0.0, min(end, b) - max(start, a))
    return total


def _ticks_at(samples: list[tuple[float, int, int]], t: float) -> float:
    """The machine's busy clock ticks at ``t``, linear between samples (clamped to the first and last)."""
    if t <= samples[0][0]:
        return float(samples[0][2])
    for (ta, _, ka), (tb, _, kb) in zip(samples, samples[1:], strict=False):
        if t <= tb:
            return ka + (kb - ka) * (t - ta) / (tb - ta) if tb > ta else float(kb)
    return float(samples[-1][2])


def _span(trace: Trace, a: float, b: float) -> dict:
    """The figures of [a, b) (times relative to the first batch)."""
    t0 = trace.t0
    images = sum(n for t, n in trace.batches if a <= t - t0 < b)
    wait = _overlap(trace.waits, t0 + a, t0 + b)
    node_s = _node_seconds(trace.samples, t0 + a, t0 + b)
    machine = (_ticks_at(trace.samples, t0 + b) - _ticks_at(trace.samples, t0 + a)) / CLOCK_TICKS
    before = [n for t, n, _ in trace.samples if t <= t0 + a][-1:]  # the count in force at its start
    inside = before + [n for t, n, _ in trace.samples if t0 + a < t < t0 + b]
    return {
        "start_s": round(a, 3),
        "seconds": round(b - a, 3),
        "images": images,
        "wait_s": round(wait, 4),
        "stall": round(wait / (b - a), 4),
        "nodes": round(node_s / (b - a), 3),  # mean over the span
        "most_nodes": max(inside, default=0),
        "node_s": round(node_s, 3),
        "machine_cpu_s": round(machine, 3),
        "cpu_s_per_image": round(node_s * NODE_CPUS / images, 7) if images else None,
        "machine_cpu_s_per_image": round(machine / images, 7) if images else None,
    }


def account(trace: Trace, *, phase_s: float, interval_s: float, steps_s: tuple[float, ...], batch_size: int) -> dict:
    """Pure: a run's figures per interval, per phase and in all, and the times the loop took to follow."""
    per_phase = round(phase_s / interval_s)
    intervals = []
    for k in range(per_phase * len(steps_s)):
        row = _span(trace, k * interval_s, (k + 1) * interval_s)
        intervals.append({"phase": PHASES[k // per_phase], **row})
    phases = {}
    for i, (name, step) in enumerate(zip(PHASES, steps_s, strict=True)):
        phases[name] = {"step_ms": round(1000 * step, 3), "demand_per_s": round(batch_size / step, 1)}
        phases[name].update(_span(trace, i * phase_s, (i + 1) * phase_s))
    whole = _span(trace, 0.0, len(steps_s) * phase_s)
    high = [r for r in intervals if r["phase"] == "high"]
    fed = next(
        (
            r["start_s"] - phase_s
            for j, r in enumerate(high)
            if r["stall"] <= FED and (j + 1 == len(high) or high[j + 1]["stall"] <= FED)
        ),
        None,
    )
    # two intervals at <= FED in a row can be a lull: the stall from there to the phase's end says whether it held
    after = None if fed is None else _overlap(trace.waits, trace.t0 + phase_s + fed, trace.t0 + 2 * phase_s)
    rel = [(t - trace.t0, n) for t, n, _ in trace.samples]
    most_high = max((n for t, n in rel if phase_s <= t < 2 * phase_s), default=0)
    up = next((t - phase_s for t, n in rel if t >= phase_s and n >= most_high), None)
    down = 2 * phase_s
    at_down = [n for t, n in rel if t <= down]
    if at_down and at_down[-1] <= 1:
        released = 0.0
    else:
        released = next((t - down for t, n in rel if down < t < 3 * phase_s and n <= 1), None)
    timeline = [(round(t, 2), n) for i, (t, n) in enumerate(rel) if i == 0 or n != rel[i - 1][1]]
    return {
        "interval_s": interval_s,
        "phase_s": phase_s,
        "batch_size": batch_size,
        "node_cpus": NODE_CPUS,
        "first_batch_s": round(trace.t0 - trace.started, 3),
        "epochs": trace.epochs,
        "intervals": intervals,
        "phases": phases,
        "run": whole,
        "most_nodes_before_step_up": max((n for t, n in rel if t < phase_s), default=0),  # start-up included
        "nodes_up_after_step_up_s": None if up is None else round(max(0.0, up), 2),
        "fed_after_step_up_s": None if fed is None else round(fed, 2),
        "stall_after_fed": None if fed is None else round(after / (phase_s - fed), 4),
        "one_node_after_step_down_s": None if released is None else round(released, 2),
        "nodes_timeline": timeline,
        "width_changes": [(round(t - trace.t0, 2), message) for t, message in trace.changes],
    }


# -- one configuration, in a process of its own -----------------------------------------------------------------


class _RoleCpu:
    """CPU seconds by the role of each process (``raypipe.benchmark.paths.process_role``) from ``start()``
    on, read at each ``read()``: a process that ended meanwhile (a released node's) counts up to its last
    reading, one started later from 0."""

    def __init__(self):
        self._lock = threading.Lock()
        self._first: dict[int, float] | None = None
        self._last: dict[int, tuple[str, float]] = {}

    def start(self) -> None:
        self.read()
        with self._lock:
            self._first = {pid: cpu for pid, (_, cpu) in self._last.items()}

    def read(self) -> None:
        import psutil

        from raypipe.benchmark.paths import process_role

        with self._lock:
            for proc in psutil.process_iter():
                try:
                    times = proc.cpu_times()
                    role = self._last[proc.pid][0] if proc.pid in self._last else process_role(proc, os.getpid())
                except psutil.Error:
                    continue
                self._last[proc.pid] = (role, times.user + times.system)

    @property
    def started(self) -> bool:
        return self._first is not None

    def seconds(self) -> dict[str, float]:
        roles: dict[str, float] = {}
        for pid, (role, cpu) in self._last.items():
            roles[role] = roles.get(role, 0.0) + cpu - (self._first or {}).get(pid, 0.0)
        return roles


class _Sampler(threading.Thread):
    """Reads the CPU nodes alive and the machine's busy ticks every ``POLL_S``, and once ``roles`` started,
    the processes' CPU every ``roles_s``, until stopped."""

    def __init__(self, cluster, roles: _RoleCpu, roles_s: float):
        super().__init__(daemon=True, name="bench-elastic-sampler")
        self.cluster = cluster
        self.roles, self.roles_s = roles, roles_s
        self.samples: list[tuple[float, int, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        from raypipe.benchmark.measure import core_ticks

        roles_at = 0.0
        while True:
            now = time.monotonic()
            self.samples.append((now, self.cluster.alive_workers(), core_ticks()[0]))
            if self.roles.started and now - roles_at >= self.roles_s:
                self.roles.read()
                roles_at = now
            if self._stop_event.wait(POLL_S):
                return

    def latest(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


class _Changes(logging.Handler):
    """The elastic width's changes, as it logs them."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.seen: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((time.monotonic(), record.getMessage()))


def _train(source, steps_s: tuple[float, ...], phase_s: float, batch_size: int, trace: Trace, on_first) -> None:
    """The trainer: a batch every ``steps_s[phase]`` (a short batch: its share), until the phases are over.
    Its waits count from its first batch on (``on_first()`` is called then); an epoch's start is a wait
    like any."""
    end = len(steps_s) * phase_s
    epoch = 0
    while True:
        source.set_epoch(epoch)
        batches = iter(source)
        while True:
            w0 = time.monotonic()
            batch = next(batches, None)
            now = time.monotonic()
            if trace.batches:
                trace.waits.append((w0, now))
            if batch is None:
                break
            if not trace.batches:
                trace.t0 = now
                on_first()
            if now - trace.t0 >= end:
                return
            images = len(batch["sample_id"])
            trace.batches.append((now, images))
            time.sleep(steps_s[int((now - trace.t0) // phase_s)] * images / batch_size)
        epoch += 1
        trace.epochs = epoch


def _one(a: argparse.Namespace) -> None:
    from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.testing.autoscaler import PREPROCESS, FakeAutoscalingCluster
    from raypipe.workers.node import NodeWorkers

    steps = (a.step_ms_low / 1000, a.step_ms_high / 1000, a.step_ms_low / 1000)
    kept = {"elastic": 0, "floor": 1, "ceiling": a.max_nodes}[a.one]
    # the default backend on a cluster joined (node workers): elastic, or the width num_tasks fixes
    sizing = {"max_cpus": float(a.max_nodes * NODE_CPUS)} if a.one == "elastic" else {"num_tasks": kept}
    execution = ExecutionConfig(resources={PREPROCESS: 0.001}, chunk_rows=a.chunk_rows, **sizing)
    augment = TrainAugment(input_size=a.input_size, auto_augment=a.aa or None)
    changes = _Changes()
    elastic_log = logging.getLogger("raypipe.pipeline.elastic")
    elastic_log.setLevel(logging.INFO)
    elastic_log.addHandler(changes)
    with FakeAutoscalingCluster(
        head_cpus=1,
        worker_cpus=NODE_CPUS,
        min_workers=kept,
        max_workers=a.max_nodes,
        idle_timeout_s=a.idle_timeout_s,
    ) as cluster:
        cluster.connect()
        os.environ["RAY_ADDRESS"] = cluster.address  # a cluster joined, as `ray job submit` tells a job
        roles = _RoleCpu()
        sampler = _Sampler(cluster, roles, a.interval_s)
        sampler.start()
        try:
            deadline = time.monotonic() + 180
            while sampler.latest() < kept:  # the fixed sizings start with their nodes up
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{kept} CPU node(s) not up in 180 s")
                time.sleep(POLL_S)
            config = PipelineConfig(batch_size=a.batch_size, seed=0)
            pipe = Pipeline(a.data, augment, config=config, execution=execution)
            trace = Trace(started=time.monotonic(), t0=0.0)
            source = EpochSource(pipe)
            try:
                _train(source, steps, a.phase_s, a.batch_size, trace, roles.start)
                roles.read()
                pool = NodeWorkers._shared
                if pool is None or pool.elastic != (a.one == "elastic"):  # the default did not run this sizing
                    raise RuntimeError(f"{a.one}: the rank ran {pool!r}, not node workers of this sizing")
            finally:
                source.close()
                NodeWorkers.shutdown_shared()
        finally:
            sampler.stop()
    trace.samples, trace.changes = sampler.samples, changes.seen
    r = account(trace, phase_s=a.phase_s, interval_s=a.interval_s, steps_s=steps, batch_size=a.batch_size)
    # where the machine's CPU went from the first batch to the end, by the role of each process ("other":
    # whatever else ran on the machine)
    per_image = {role: round(1000 * s / max(1, r["run"]["images"]), 3) for role, s in sorted(roles.seconds().items())}
    print(RESULT + json.dumps({"config": a.one, **r, "roles_ms_per_image": per_image}), flush=True)


# -- the parent: each configuration in turn, the tables, the plot -------------------------------------------------

_PASSED = (
    "phase_s",
    "interval_s",
    "step_ms_low",
    "step_ms_high",
    "input_size",
    "aa",
    "batch_size",
    "chunk_rows",
    "max_nodes",
    "idle_timeout_s",
)


def _measure(a: argparse.Namespace, config: str, data: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", config, "--data", data]
    for name in _PASSED:
        value = getattr(a, name)
        if value is not None:
            cmd += [f"--{name.replace('_', '-')}", str(value)]
    # the fake cluster's token auth is read when Ray is imported; its node workers listen on loopback
    env = dict(os.environ, RAY_AUTH_MODE="token", RAYPIPE_NODE_WORKERS_HOST="127.0.0.1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT)]
    if out.returncode or not lines:
        raise SystemExit(f"{config} failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _secs(x: float | None, never: str) -> str:
    return never if x is None else f"{x:.0f} s"


def _fed(r: dict) -> str:
    """The time from the step up to two intervals in a row at <= FED, and the stall from there on."""
    if r["fed_after_step_up_s"] is None:
        return "never"
    return f"{r['fed_after_step_up_s']:.0f} s (then {_pct(r['stall_after_fed'])})"


def _config_table(r: dict) -> str:
    rows = [
        f"{r['config']}: first batch after {r['first_batch_s']:.1f} s, {r['epochs']} whole epochs",
        "| phase | demand img/s | trained img/s | stall | CPU nodes (mean, most) | CPU-s per image "
        "| machine CPU-s per image |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in [*r["phases"].items(), ("run", r["run"])]:
        demand = f"{p['demand_per_s']:.0f}" if "demand_per_s" in p else ""
        cpu, machine = p["cpu_s_per_image"], p["machine_cpu_s_per_image"]
        rows.append(
            f"| {name} | {demand} | {p['images'] / p['seconds']:.0f} | {_pct(p['stall'])} | "
            f"{p['nodes']:.2f}, {p['most_nodes']} | {'-' if cpu is None else f'{1000 * cpu:.2f} ms'} | "
            f"{'-' if machine is None else f'{1000 * machine:.2f} ms'} |"
        )
    rows.append(
        f"step up -> stall <= {FED:.0%}: {_fed(r)} (nodes up after "
        f"{_secs(r['nodes_up_after_step_up_s'], '-')}); step down -> one CPU node: "
        f"{_secs(r['one_node_after_step_down_s'], 'not in the run')}; most CPU nodes before the step up "
        f"(start-up included): {r['most_nodes_before_step_up']}"
    )
    rows.append(f"per {r['interval_s']:g} s, CPU nodes: " + " ".join(f"{i['nodes']:.1f}" for i in r["intervals"]))
    rows.append(f"per {r['interval_s']:g} s, stall %: " + " ".join(f"{100 * i['stall']:.0f}" for i in r["intervals"]))
    roles = ", ".join(f"{role} {ms:.2f}" for role, ms in r["roles_ms_per_image"].items())
    rows.append(f"the machine's CPU over the run by process role (every process of the machine), ms per image: {roles}")
    rows += [f"  width at {t:.0f} s: {message}" for t, message in r["width_changes"]]
    return "\n".join(rows)


def _summary(results: list[dict]) -> str:
    stalls, nodes = " | ".join(f"stall {p}" for p in PHASES), " | ".join(f"CPU nodes {p}" for p in PHASES)
    rows = [
        f"| configuration | {stalls} | {nodes} | CPU-s per image | machine CPU-s per image | step up -> stall "
        f"<= {FED:.0%} | step down -> 1 node |",
        "|---" * (3 + 2 * len(PHASES) + 2) + "|",
    ]
    for r in results:
        phases = [r["phases"][p] for p in PHASES]
        rows.append(
            f"| {r['config']} | "
            + " | ".join(_pct(p["stall"]) for p in phases)
            + " | "
            + " | ".join(f"{p['nodes']:.2f}" for p in phases)
            + f" | {1000 * (r['run']['cpu_s_per_image'] or 0):.2f} ms | "
            f"{1000 * (r['run']['machine_cpu_s_per_image'] or 0):.2f} ms | "
            f"{_fed(r)} | {_secs(r['one_node_after_step_down_s'], 'not in the run')} |"
        )
    return "\n".join(rows)


def _plot(results: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("--plot needs matplotlib (pip install matplotlib): no plot written")
        return
    fig, (nodes, stall) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for r in results:
        end = r["run"]["seconds"]
        line = [(t, n) for t, n in r["nodes_timeline"] if t < end]
        nodes.step([t for t, _ in line] + [end], [n for _, n in line] + [line[-1][1]], where="post", label=r["config"])
        stall.step(
            [i["start_s"] for i in r["intervals"]] + [end],
            [100 * i["stall"] for i in r["intervals"]] + [100 * r["intervals"][-1]["stall"]],
            where="post",
            label=r["config"],
        )
    phase_s = results[0]["phase_s"]
    for ax in (nodes, stall):
        for k in (1, 2):
            ax.axvline(k * phase_s, color="grey", linestyle=":")
        ax.grid(alpha=0.3)
    nodes.set_ylabel("CPU nodes alive")
    stall.set_ylabel(f"trainer's stall per {results[0]['interval_s']:g} s (%)")
    stall.set_xlabel("seconds from the first batch (dotted: the step up, the step down)")
    nodes.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def _options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--data", help="an image folder (default: raypipe's sample data, --images of it, written here)")
    p.add_argument("--images", type=int, default=2000, help="images of the sample data written without --data")
    p.add_argument("--phase-s", type=float, default=60.0, help="seconds of each phase: low, high, low again")
    p.add_argument("--interval-s", type=float, default=3.0, help="the figures' interval (a divisor of --phase-s)")
    p.add_argument("--step-ms-low", type=float, default=400.0, help="the trainer's step per batch at low demand")
    p.add_argument("--step-ms-high", type=float, default=80.0, help="its step at high demand")
    p.add_argument("--input-size", type=int, default=224, help="RandomResizedCrop's size")
    p.add_argument("--aa", default="rand-m9-mstd0.5-inc1", help="timm's auto-augment policy ('' for none)")
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--chunk-rows", type=int, help="ExecutionConfig.chunk_rows (default: auto)")
    p.add_argument("--max-nodes", type=int, default=3, help="the CPU node type's max_workers (the ceiling's nodes)")
    p.add_argument("--idle-timeout-s", type=float, default=6.0, help="the autoscaler's idle timeout")
    p.add_argument("--timeout", type=float, default=900, help="seconds one configuration's process may take")
    p.add_argument("--json", help="write every configuration's figures here")
    p.add_argument("--plot", help="a PNG of the CPU nodes and the stall over time (needs matplotlib)")
    p.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # a measuring process: a RESULT line
    return p


def main() -> None:
    p = _options()
    a = p.parse_args()
    per_phase = a.phase_s / a.interval_s
    if a.interval_s <= 0 or per_phase < 1 or abs(per_phase - round(per_phase)) > 1e-9:
        p.error(f"--phase-s={a.phase_s:g}: expected a whole number (>= 1) of --interval-s={a.interval_s:g}")
    if min(a.step_ms_low, a.step_ms_high) <= 0 or a.images < 1 or a.batch_size < 1 or a.max_nodes < 1:
        p.error("--step-ms-low, --step-ms-high, --images, --batch-size and --max-nodes must be > 0")
    if a.one:
        if not a.data:
            p.error("--one needs --data")
        return _one(a)
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
        data = a.data
        if data is None:
            from raypipe.sample_data import write_sample_data

            classes = min(8, a.images)
            data = tmp
            write_sample_data(tmp, classes=classes, per_class=-(-a.images // classes), workers=2)
        results = []
        for config in a.configs:
            results.append(_measure(a, config, data))
            print(_config_table(results[-1]) + "\n", flush=True)
    print(_summary(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    if a.plot:
        _plot(results, a.plot)


if __name__ == "__main__":
    main()
