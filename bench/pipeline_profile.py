"""Profile the pipeline on one machine: img/s per epoch, the driver's CPU and the machine's CPU use.

Usage (``--chunk-rows``, ``--cpus-per-task`` and ``--num-tasks`` set ``ExecutionConfig``)::

    python bench/pipeline_profile.py DATA --chunk-rows 64 --cpus-per-task 1      # 1 task per core
    python bench/pipeline_profile.py DATA --chunk-rows 128|256                    # default: auto_chunk_rows
    python bench/pipeline_profile.py DATA --device-loader                          # + CPU DeviceLoader
    python bench/pipeline_profile.py DATA --device-loader --auto-augment rand-m9-mstd0.5-inc1
    python bench/pipeline_profile.py --normalise                                   # the CPU trainer side only
    python bench/pipeline_profile.py DATA -b 256 --chunk-rows 128|256              # packing copy or views
    python bench/pipeline_profile.py --take                                        # np.take "raise" vs "clip"
    python bench/pipeline_profile.py DATA --consumer-ms 300 [--ray-soft-limit 2]   # worker restarts
    python bench/pipeline_profile.py DATA --device-loader --by-process             # cores per process title

``--consumer-ms`` sleeps that long per batch, like a trainer applying backpressure; each epoch line then
also counts the Ray worker processes started during it. ``--ray-soft-limit N`` sets Ray's
``num_workers_soft_limit`` (N = the CPU count is Ray's own default; raypipe's connect() uses 2 x CPUs + 4).
"workers-stage" is the part of the workers' CPU spent on their augmentation threads (those above
niceness 0, i.e. with ``--worker-nice`` > 0); the rest of "workers" is Ray's task loop and hand-off.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time

import psutil


def _start_hog() -> subprocess.Popen:
    """A process that only burns CPU at normal priority: another job sharing the machine."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def profile_pipeline(args: argparse.Namespace) -> None:
    from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
    from raypipe.device import from_timm_args
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.runtime import connect

    if args.ray_soft_limit:
        os.environ["RAY_num_workers_soft_limit"] = str(args.ray_soft_limit)  # connect() then leaves it be
    connect(object_store_memory=args.object_store_mb << 20 if args.object_store_mb else None)
    started = _WorkerWatch()
    cfg = PipelineConfig(batch_size=args.batch_size)
    ex = ExecutionConfig(
        chunk_rows=args.chunk_rows,
        cpus_per_task=args.cpus_per_task,
        num_tasks=args.num_tasks,
        worker_nice=args.worker_nice,
    )
    aug = TrainAugment(input_size=args.img_size, color_jitter=None, auto_augment=args.auto_augment)
    pipe = Pipeline(args.data, aug, config=cfg, execution=ex)
    source = EpochSource(pipe, end_epoch=args.epochs)
    it = from_timm_args(source, device="cpu", img_dtype=args.img_dtype) if args.device_loader else source
    total_n, total_s = 0, 0.0
    for epoch in range(args.epochs):
        psutil.cpu_percent(None)
        c0, t0, n, batches = _cpu_by_role(), time.perf_counter(), 0, 0
        p0 = _cpu_by_title() if args.by_process else None
        seen, faults = len(started.pids), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for batch in it:
            n += int(batch["image"].shape[0])
            batches += 1
            time.sleep(args.consumer_ms / 1e3)
        dt, c1 = time.perf_counter() - t0, _cpu_by_role()
        if epoch > 0:  # the first epoch pays for starting the workers
            total_n, total_s = total_n + n, total_s + dt
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / max(1, batches)
        machine = psutil.cpu_percent(None)
        roles = "  ".join(f"{k} {(c1.get(k, 0) - c0.get(k, 0)) / dt:.2f}" for k in sorted(c1))
        # the driver's page faults per batch: fresh memory (new buffers) costs the kernel a page clear each
        print(
            f"epoch {epoch}: {n / dt:7.0f} img/s  machine {machine:.0f} %  cores: {roles}  "
            f"worker processes started {len(started.pids) - seen}  "
            f"driver page faults/batch {faults:.0f}"
        )
        if p0 is not None:
            p1 = _cpu_by_title()
            cores = sorted(((k, (v - p0.get(k, 0.0)) / dt) for k, v in p1.items()), key=lambda kv: -kv[1])
            print("    by process: " + "  ".join(f"{k} {v:.3f}" for k, v in cores if v >= 0.005))
    started.stop()
    if total_s:  # epochs overlap (the next one is warmed up early): the per-epoch rates scatter around this
        print(f"epochs 1-{args.epochs - 1} aggregate: {total_n / total_s:.0f} img/s")


class _WorkerWatch:
    """Collects the pids of this process's Ray workers every 0.1 s (a restarted worker is a new pid)."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for proc in psutil.Process().children(recursive=True):
                try:
                    cmd = " ".join(proc.cmdline())
                except psutil.Error:
                    continue
                if "default_worker.py" in cmd or cmd.startswith("ray::"):
                    self.pids.add(proc.pid)

    def stop(self) -> None:
        self._stop.set()


def profile_take(args: argparse.Namespace) -> None:
    """The Packer's gather of good rows: np.take into a batch buffer, default mode vs mode="clip"."""
    import numpy as np

    b, s = args.chunk_rows or 128, args.img_size
    block = np.random.default_rng(0).integers(0, 256, (b, s, s, 3), dtype=np.uint8)
    out = np.empty((2 * b, s, s, 3), np.uint8)
    idx = np.arange(b)
    for mode in ("raise", "clip"):
        np.take(block, idx, axis=0, out=out[:b], mode=mode)
        t0 = time.perf_counter()
        for _ in range(40):
            np.take(block, idx, axis=0, out=out[:b], mode=mode)
        print(f"np.take mode={mode!r}: {(time.perf_counter() - t0) / 40 * 1e3:.2f} ms per {b}-row block")


def _processes():
    """(pid, command line, name, CPU seconds so far) of every process that can be read."""
    for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
        t = proc.info["cpu_times"]
        if t is not None:
            yield proc.info["pid"], proc.info["cmdline"] or [], proc.info["name"], t.user + t.system


def _cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of this process ("driver"), Ray workers, and Ray's own daemons."""
    me = psutil.Process().pid
    out: dict[str, float] = {}
    for pid, cmd, _, cpu in _processes():
        line = " ".join(cmd)
        if pid == me:
            role = "driver"
        elif line.startswith("ray::"):
            role = "workers"
            out["workers-stage"] = out.get("workers-stage", 0.0) + _lowered_threads_cpu(pid)
        elif "raylet" in line or "gcs_server" in line or "/ray/" in line or "dashboard" in line:
            role = "ray-daemons"
        else:
            continue
        out[role] = out.get(role, 0.0) + cpu
    return out


def _cpu_by_title() -> dict[str, float]:
    """CPU seconds so far per kind of process: this one ("driver"), the Ray workers that run tasks
    ("ray workers": their title moves between ``ray::IDLE`` and the task's), each other ``ray::`` title
    (the feeder, the dashboard agent), kernel threads by their name before
    the "/" (``kworker``), anything else by its executable's name."""
    me = psutil.Process().pid
    out: dict[str, float] = {}
    for pid, cmd, name, cpu in _processes():
        title = cmd[0].split(" ")[0] if cmd else ""
        if pid == me:
            kind = "driver"
        elif title.startswith("ray::"):
            kind = "ray workers" if title == "ray::IDLE" or title.startswith("ray::Map") else title
        elif not cmd:  # a kernel thread
            kind = (name or "?").split("/")[0]
        else:
            kind = name
        out[kind] = out.get(kind, 0.0) + cpu
    return out


def _lowered_threads_cpu(pid: int) -> float:
    """CPU seconds of a worker's threads running above niceness 0: the augmentation stage's own thread
    (``PipelineConfig.worker_nice`` > 0), as against Ray's task loop and hand-off on the others."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            if int(fields[16]) > 0:  # field 19 of stat: nice
                total += int(fields[11]) + int(fields[12])  # fields 14, 15: utime, stime (clock ticks)
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        pass  # the worker exited meanwhile
    return total / os.sysconf("SC_CLK_TCK")


def profile_normalise(args: argparse.Namespace) -> None:
    """The CPU trainer side, µs/image on ``--threads`` torch threads (1 by default): the normalisation
    kernels and the whole DeviceLoader, through torch's ops and through the C extension (``_affine``).
    "not chunked" runs each torch op over the whole batch (torch then spreads it over its intra-op
    threads); "CPU" counts every thread's time."""
    import importlib

    import numpy as np
    import torch

    from raypipe.config import IMAGENET_MEAN, IMAGENET_STD
    from raypipe.device import from_timm_args
    from raypipe.device.normalize import _affine, normalize

    normalize_module = importlib.import_module("raypipe.device.normalize")  # the package exports the function
    torch.set_num_threads(args.threads)
    b, s = args.batch_size, args.img_size
    x = torch.randint(0, 255, (b, s, s, 3), dtype=torch.uint8)
    kw = dict(mean=IMAGENET_MEAN, std=IMAGENET_STD)

    def per_image(fn, *fn_args, reps: int = 5, **fn_kwargs) -> float:
        return per_image_wall_cpu(fn, *fn_args, reps=reps, **fn_kwargs)[0]

    def per_image_wall_cpu(fn, *fn_args, reps: int = 5, **fn_kwargs) -> tuple[float, float]:
        fn(*fn_args, **fn_kwargs)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(reps):
            fn(*fn_args, **fn_kwargs)
        return ((time.perf_counter() - t0) / reps / b * 1e6, (time.process_time() - c0) / reps / b * 1e6)

    cext = normalize_module._cext
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        mul, add = _affine(IMAGENET_MEAN, IMAGENET_STD, 255.0, dtype, x.device)
        out = torch.empty(b, 3, s, s, dtype=dtype).contiguous(memory_format=torch.channels_last)
        one_pass = per_image(torch.addcmul, add, x.permute(0, 3, 1, 2), mul, out=out)  # the GPU kernel
        normalize_module._cext = None  # the torch path
        try:
            fresh = per_image(normalize, x, dtype=dtype, **kw)
            reused, reused_cpu = per_image_wall_cpu(normalize, x, dtype=dtype, out=out, **kw)
            sizes = normalize_module._CHUNK_BYTES, normalize_module._SERIAL_ELEMENTS
            normalize_module._CHUNK_BYTES = normalize_module._SERIAL_ELEMENTS = 2**62  # the whole batch at once
            try:
                unchunked, unchunked_cpu = per_image_wall_cpu(normalize, x, dtype=dtype, out=out, **kw)
            finally:
                normalize_module._CHUNK_BYTES, normalize_module._SERIAL_ELEMENTS = sizes
        finally:
            normalize_module._cext = cext
        fused = planar = "not built"
        if normalize_module.reads_host_directly(dtype, "NHWC", True):
            wall, cpu = per_image_wall_cpu(normalize, x, dtype=dtype, out=out, **kw)
            fused = f"{wall:6.0f} (CPU {cpu:4.0f})"
            # into contiguous NCHW, as timm's prefetcher yields (and the timm drop-in): torch's path, then C's
            nchw = torch.empty(b, 3, s, s, dtype=dtype)
            normalize_module._cext = None
            try:
                torch_planar = per_image(normalize, x, dtype=dtype, out=nchw, channels_last=False, **kw)
            finally:
                normalize_module._cext = cext
            wall = per_image(normalize, x, dtype=dtype, out=nchw, channels_last=False, **kw)
            planar = f"torch path {torch_planar:6.0f}, C extension {wall:6.0f}"
        elif cext is not None:
            fused = planar = "n/a for this dtype"
        print(
            f"normalise {str(dtype):15s} µs/image: one-pass torch kernel {one_pass:6.0f}; torch path: two passes "
            f"into a fresh output {fresh:6.0f}, into a reused output {reused:6.0f} (CPU {reused_cpu:4.0f}; not "
            f"chunked: {unchunked:6.0f}, CPU {unchunked_cpu:4.0f}); C extension, reused output: {fused}; "
            f"into contiguous NCHW: {planar}"
        )
    images = [np.random.default_rng(i).integers(0, 256, (b, s, s, 3), dtype=np.uint8) for i in range(4)]
    for a in images:
        a.flags.writeable = False  # like the object store's arrays
    batches = [{"image": images[i % 4], "label": np.arange(b), "sample_id": np.arange(b) + i * b} for i in range(40)]
    for name, ext in (("torch path", None), ("C extension", cext)):
        if name == "C extension" and cext is None:
            continue
        normalize_module._cext = ext
        try:
            with from_timm_args(batches, device="cpu", img_dtype="float32") as loader:
                for _ in loader:  # first pass allocates the ring and the output pool
                    pass
                c0, n = time.process_time(), 0
                for batch in loader:
                    n += int(batch["image"].shape[0])
        finally:
            normalize_module._cext = cext
        per_img = (time.process_time() - c0) / n * 1e6
        print(f"DeviceLoader(cpu, fp32) with the {name}, whole trainer side: {per_img:.0f} µs/image CPU")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--auto-augment", help="a timm policy, e.g. rand-m9-mstd0.5-inc1 (default: none)")
    p.add_argument("--chunk-rows", type=int, help="rows per chunk (default: raypipe's auto_chunk_rows)")
    p.add_argument("--cpus-per-task", type=float, default=1.0, help="ExecutionConfig.cpus_per_task")
    p.add_argument("--num-tasks", type=int, help="ExecutionConfig.num_tasks")
    p.add_argument("--device-loader", action="store_true", help="read through a CPU DeviceLoader")
    p.add_argument("--img-dtype", default="float32")
    p.add_argument("--normalise", action="store_true", help="only time the trainer-side normalisation")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for --normalise")
    p.add_argument("--take", action="store_true", help="only time the Packer's np.take, both modes")
    p.add_argument("--consumer-ms", type=float, default=0.0, help="sleep per batch (a trainer's backpressure)")
    p.add_argument("--ray-soft-limit", type=int, help="Ray's num_workers_soft_limit for the local cluster")
    p.add_argument("--worker-nice", type=int, default=10, help="ExecutionConfig.worker_nice")
    p.add_argument("--object-store-mb", type=int, help="the local cluster's object store (default: Ray's)")
    p.add_argument("--by-process", action="store_true", help="also print each epoch's cores per process title")
    p.add_argument("--busy", type=int, default=0, help="N busy-loop processes beside (CPU contention), any mode")
    args = p.parse_args()
    if not (args.normalise or args.take or args.data):
        p.error("DATA is required unless --normalise or --take")
    hogs = [_start_hog() for _ in range(args.busy)]
    try:
        if args.normalise:
            profile_normalise(args)
        elif args.take:
            profile_take(args)
        else:
            profile_pipeline(args)
    finally:
        for hog in hogs:
            hog.kill()


if __name__ == "__main__":
    main()
