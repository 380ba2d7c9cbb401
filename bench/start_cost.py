"""What it costs to get a rank's workers going on this machine: a private local Ray (``raypipe.connect()``
and one task per core) against raypipe's local worker processes (``ExecutionConfig(backend="local")``,
each set up with the stage), in wall seconds and CPU seconds per kind of process::

    python bench/start_cost.py /tmp/photo4k            # both, each in a fresh child process
    python bench/start_cost.py /tmp/photo4k --only ray

The CPU is read from the processes themselves (psutil) after ``--settle`` seconds, so what a process
spends after its start (Ray's agents, the GCS) is counted up to then.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time


def _kind(proc) -> str:
    """A short name for one of the processes a start made."""
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001 - a process that ended meanwhile
        return "ended"
    for key, name in (("gcs_server", "GCS"), ("raylet", "raylet"), ("dashboard/agent.py", "dashboard agent"),
                      ("runtime_env/agent", "runtime-env agent"), ("log_monitor", "log monitor"),
                      ("monitor.py", "autoscaler monitor"), ("dashboard.py", "dashboard"),
                      ("default_worker", "Ray worker"), ("_local_worker", "local worker")):  # fmt: skip
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


def _ray(data: str, settle: float) -> dict:
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


def _local(data: str, settle: float) -> dict:
    from raypipe.pipeline.local_workers import LocalWorkers, local_cpus, shared_memory_dir

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="any source raypipe reads (its stage is what the workers set up)")
    p.add_argument("--only", choices=("ray", "local"))
    p.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the start before reading CPU")
    p.add_argument("--child", choices=("ray", "local"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps((_ray if a.child == "ray" else _local)(a.data, a.settle)))
        return
    env = dict(os.environ, RAY_ADDRESS="")
    for backend in [a.only] if a.only else ["ray", "local"]:
        out = subprocess.run([sys.executable, __file__, a.data, "--child", backend, "--settle", str(a.settle)],
                             capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
        r = json.loads(out.strip().splitlines()[-1])
        total = sum(r["cpu_s"].values())
        print(f"{r['backend']:5s}: {r['workers']} workers set up in {r['ready_s']:.2f} s; CPU {total:.2f} s in all "
              f"after {a.settle:g} s: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_s"].items()))


if __name__ == "__main__":
    main()
