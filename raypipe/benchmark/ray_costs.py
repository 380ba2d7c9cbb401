"""What Ray and the worker pools cost the machine beside the loader's own work: getting a rank's workers
going (a private Ray or local worker processes), a private Ray idle, and handing a chunk's images from
one node to another. ``python bench/profiles.py NAME --help`` runs each (``register`` adds them to its
command line)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time

import numpy as np

# ---- start-cost ------------------------------------------------------------------------------------


def _kind(proc) -> str:
    """A short name for one of the processes a start made."""
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001 - a process that ended meanwhile
        return "ended"
    for key, name in (
        ("gcs_server", "GCS"),
        ("raylet", "raylet"),
        ("dashboard/agent.py", "dashboard agent"),
        ("runtime_env/agent", "runtime-env agent"),
        ("log_monitor", "log monitor"),
        ("monitor.py", "autoscaler monitor"),
        ("dashboard.py", "dashboard"),
        ("default_worker", "Ray worker"),
        ("workers.worker_process", "local worker"),
    ):
        if key in cmd:
            return name
    return proc.name()


def _cpu_by_kind(settle: float) -> dict[str, float]:
    import psutil

    time.sleep(settle)
    me = psutil.Process()
    seen: dict[str, float] = collections.defaultdict(float)
    for child in me.children(recursive=True):
        try:
            t = child.cpu_times()
            seen[_kind(child)] += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    t = me.cpu_times()
    seen["this process"] = t.user + t.system
    return {k: round(v, 2) for k, v in sorted(seen.items(), key=lambda kv: -kv[1])}


def _spec(data: str):
    from raypipe.config import TrainAugment
    from raypipe.pipeline import Pipeline

    return Pipeline(data, TrainAugment(input_size=224)).stage_spec(0)


def _start_ray(data: str, settle: float) -> dict:
    import ray

    import raypipe.runtime
    from raypipe.stages.augment import stage_for

    start = time.perf_counter()
    raypipe.runtime.connect()
    cores = int(ray.cluster_resources().get("CPU", 1))

    @ray.remote(num_cpus=1)
    def set_up(spec):
        stage_for(spec)

    spec = _spec(data)
    ray.get([set_up.remote(spec) for _ in range(cores)])
    wall = time.perf_counter() - start
    return {"backend": "ray", "workers": cores, "ready_s": round(wall, 2), "cpu_s": _cpu_by_kind(settle)}


def _start_local(data: str, settle: float) -> dict:
    from raypipe.workers.local import LocalWorkers, local_cpus, shared_memory_dir

    start = time.perf_counter()
    cores = local_cpus()
    pool = LocalWorkers(cores, shared_memory_dir(1)[0])
    spec = _spec(data)
    pool.release_start()  # as a stream does once its first chunk's batches are out
    for task in pool.set_up(spec, cores):
        pool.get(task)
    wall = time.perf_counter() - start
    out = {"backend": "local", "workers": cores, "ready_s": round(wall, 2), "cpu_s": _cpu_by_kind(settle)}
    pool.shutdown()
    return out


# Each start runs in a fresh child process: python -c _CHILD BACKEND DATA SETTLE
_CHILD = (
    "import json, sys\n"
    "from raypipe.benchmark import ray_costs\n"
    "run = ray_costs._start_ray if sys.argv[1] == 'ray' else ray_costs._start_local\n"
    "print(json.dumps(run(sys.argv[2], float(sys.argv[3]))))\n"
)


def start_cost(data: str, only: str | None = None, settle: float = 5.0) -> None:
    """What it costs to get a rank's workers going on this machine: a private Ray or local workers.

    A private local Ray (``raypipe.connect()`` and one task per core) against raypipe's local worker
    processes (``ExecutionConfig(backend="local")``, each set up with the stage), in wall seconds and CPU
    seconds per kind of process::

        python bench/profiles.py start-cost /tmp/photo4k            # both, each in a fresh child process
        python bench/profiles.py start-cost /tmp/photo4k --only ray

    The CPU is read from the processes themselves (psutil) after ``--settle`` seconds, so what a process
    spends after its start (Ray's agents, the GCS) is counted up to then.
    """
    env = dict(os.environ, RAY_ADDRESS="")
    for backend in [only] if only else ["ray", "local"]:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, backend, data, str(settle)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        total = sum(r["cpu_s"].values())
        print(
            f"{r['backend']:5s}: {r['workers']} workers set up in {r['ready_s']:.2f} s; CPU {total:.2f} s in all "
            f"after {settle:g} s: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_s"].items())
        )


def idle_ray(seconds: float = 20.0, settle: float = 8.0) -> None:
    """The CPU a private local Ray takes with nothing to run, by kind of process.

    ``raypipe.connect()`` starts it (as the README's Python API does); after ``--settle`` seconds of its
    start, its processes' CPU is read over ``--seconds``, in cores::

        python bench/profiles.py idle-ray
    """
    import psutil

    import raypipe.runtime

    os.environ["RAY_ADDRESS"] = ""  # a private Ray of its own, never one this machine already runs
    raypipe.runtime.connect()
    time.sleep(settle)

    def cpu() -> dict[int, tuple[str, float]]:
        out = {}
        for child in psutil.Process().children(recursive=True):
            try:
                t = child.cpu_times()
                out[child.pid] = (_kind(child), t.user + t.system)
            except psutil.NoSuchProcess:
                pass
        return out

    before = cpu()
    time.sleep(seconds)
    by_kind: dict[str, float] = collections.defaultdict(float)
    for pid, (kind, used) in cpu().items():
        if pid in before:
            by_kind[kind] += (used - before[pid][1]) / seconds
    print(
        f"a private Ray, idle, over {seconds:g} s: {sum(by_kind.values()):.3f} cores in all: "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    )


def _tcp_loopback_cpu(nbytes: int, chunks: int) -> float:
    """This process's CPU seconds to send ``chunks`` buffers of ``nbytes`` over a loopback TCP socket and
    receive them into one buffer (both ends, each buffer reused: the kernel's two copies and little else)."""
    import resource
    import socket
    import threading

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    data = memoryview(np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8))

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            for _ in range(chunks):
                conn.sendall(data)

    out = memoryview(np.empty(nbytes, np.uint8))
    start = cpu()
    sender = threading.Thread(target=send)
    sender.start()
    conn, _ = server.accept()
    with conn, server:
        for _ in range(chunks):
            got = 0
            while got < nbytes:
                got += conn.recv_into(out[got:])
    sender.join()
    return cpu() - start


def cross_node(chunks: int = 40, rows: int = 128, size: int = 224, rounds: int = 3) -> None:
    """The machine's CPU per image to hand a chunk's images from one node to another.

    Three ways, each over ``--chunks`` chunks of ``--rows`` images of ``size`` x ``size`` x 3 uint8, in
    ``--rounds`` turns after one unreported (it touches the object stores' pages, which a long run
    finds warm); nothing else should run. On two simulated Ray nodes (``ray.cluster_utils``):
    a task on one node writes a chunk's images and returns them, and this process, on the other node
    (or on the task's own, for the same-node row), gets each one and reads it; less a task that writes
    the same images and returns nothing, so what is left is the hand-over (the result put into the
    object store, and across nodes its transfer). Then the same bytes over a loopback TCP socket, sent
    from a buffer and received into one (what a direct stream between the nodes would cost at least)::

        python bench/profiles.py cross-node
    """
    import ray
    from ray.cluster_utils import Cluster

    from raypipe.benchmark.measure import core_ticks

    nbytes = rows * size * size * 3
    images = chunks * rows
    if ray.is_initialized():
        ray.shutdown()
    store = 8 * nbytes + (200 << 20)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"here": 1}, "object_store_memory": store}
    )
    cluster.add_node(num_cpus=1, resources={"there": 1}, object_store_memory=store)
    try:
        ray.init(address=cluster.address, logging_level="ERROR")
        cluster.wait_for_nodes()

        @ray.remote(num_cpus=1)
        def write(keep: bool):
            a = np.empty(nbytes, np.uint8)
            a[::4096] = 1  # every page written, as a chunk's images are
            return a if keep else None

        def run(node: str, keep: bool) -> float:
            task = write.options(resources={node: 1})
            ray.get([task.remote(keep) for _ in range(2)])  # workers up
            before = core_ticks()[0]
            pending = collections.deque(task.remote(keep) for _ in range(min(4, chunks)))
            for i in range(chunks):
                got = ray.get(pending.popleft())
                if got is not None:
                    int(got[::4096].sum())
                del got
                if i + 4 < chunks:
                    pending.append(task.remote(keep))
            return (core_ticks()[0] - before) / os.sysconf("SC_CLK_TCK") / images * 1e3

        results = collections.defaultdict(list)
        for r in range(rounds + 1):  # the first touches the object stores' pages: a long run's are warm
            base = run("there", False)
            got = {
                "same node: task result put and got": run("here", True) - base,
                "across nodes: task result put, moved and got": run("there", True) - base,
                "loopback TCP: sent and received": _tcp_loopback_cpu(nbytes, chunks) / images * 1e3,
            }
            for name, value in got.items():
                if r:
                    results[name].append(value)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(
        f"{rows} images of {size}x{size}x3 uint8 ({nbytes / 2**20:.1f} MiB) per chunk, {chunks} chunks, "
        f"{rounds} rounds: machine CPU per image"
    )
    for name, values in results.items():
        print(f"  {name}: " + ", ".join(f"{v:.3f}" for v in values) + " ms")


# ---- the command line ------------------------------------------------------------------------------


def register(add) -> None:
    """Add this module's measurements to ``bench/profiles.py``: ``add(name, fn)`` returns the subcommand's
    parser, whose options are ``fn``'s keyword arguments."""
    p = add("start-cost", start_cost)
    p.add_argument("data", help="any source raypipe reads (its stage is what the workers set up)")
    p.add_argument("--only", choices=("ray", "local"))
    p.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the start before reading CPU")

    p = add("cross-node", cross_node)
    p.add_argument("--chunks", type=int, default=40)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)

    p = add("idle-ray", idle_ray)
    p.add_argument("--seconds", type=float, default=20.0, help="seconds over which the CPU is read")
    p.add_argument("--settle", type=float, default=8.0, help="seconds to wait after the start first")
