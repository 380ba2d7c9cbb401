"""Training throughput on one GPU: the synthetic-data ceiling, fed by raypipe, fed by timm's loader.

Run on a CUDA machine from the repository root: ``python bench/gpu_train.py`` (ResNet-50, AMP fp16,
channels_last, batch 256, all the machine's cores; about 3-4 minutes with both augmentations). It writes
sample-data JPEGs (``--images``, in parallel) unless ``--data`` is given, then for each augmentation:

1. ceiling — the same training step on one batch already on the GPU (no loader at all);
2. raypipe — Ray tasks decode and augment, a feeder process beside the trainer packs batches
   (``FeederSource``, as the training job does), the DeviceLoader copies on a side stream and
   normalises; raypipe-local: the timm drop-in (``raypipe.timm.create_loader``) as a training script
   that never called ``ray.init`` runs it, on local worker processes, the rank's consumer and the
   DeviceLoader in the trainer's process; raypipe-thread: the Ray feed with the rank's consumer in the
   trainer's own process (``EpochSource``); raypipe-data: raypipe's batches with no training (what it
   can deliver);
3. timm — ``create_loader(is_training=True, use_prefetcher=True, num_workers=<cores>)``, with the
   channels_last conversion timm's train.py does.

Each feed trains for ``--seconds`` after ``--warmup-steps`` steps; images/s counts every image trained
in that window; "stall" is the share of it the training loop spent waiting in ``next()`` for a batch;
"step ms" is the median training step without that wait (the ceiling's is the GPU's own pace; a feed's
longer steps mean it competes with training for the host or the GPU), with p90, max and the share of
step time in steps over 3x the median in the per-feed lines (one-off costs such as cuDNN autotuning),
and the median time the host took to issue forward and backward. The training thread's own counters
(Linux) tell why steps slow down: waiting for a core (other processes), sleeping (the GIL, a lock)
or spinning in the CUDA wait (slower GPU work).
raypipe's feeds drop the epoch's short last batch as timm's training loader does.
The share of the ceiling is the goal figure (>= 95 %). ``--device cpu`` runs the same code on the CPU
(small model and batch: a smoke test of the script, not a figure).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import traceback

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FEEDS = ["ceiling", "raypipe", "raypipe-local", "raypipe-thread", "raypipe-data", "timm"]
AUGMENTS = {
    "rrc": dict(color_jitter=None),
    "rand-m9": dict(color_jitter=None, auto_augment="rand-m9-mstd0.5-inc1"),
}


def write_data(out: str, images: int, workers: int) -> str:
    from raypipe.sample_data import PHOTOS, write_sample_data

    classes = len(PHOTOS)
    t0 = time.perf_counter()
    paths = write_sample_data(out, classes=classes, per_class=max(1, images // classes), workers=workers)
    print(f"wrote {len(paths)} sample JPEGs to {out} in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


class Trainer:
    """One model, optimizer and AMP scaler; ``step(x, y)`` is one training step as timm's train.py does it."""

    def __init__(self, model_name: str, device: torch.device, amp: bool, channels_last: bool):
        import timm

        self.device = device
        self.channels_last = channels_last
        self.model = timm.create_model(model_name, pretrained=False, num_classes=1000).to(device)
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.amp = amp and device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if self.amp else None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One step; returns the seconds spent issuing forward and backward (the host's share: the
        rest of the step is mostly the wait for the GPU in the scaler's inf check)."""
        t0 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp):
            loss = self.loss_fn(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            issued = time.perf_counter() - t0
            self.scaler.step(self.opt)  # reads the inf check back: one host sync per step, as in timm
            self.scaler.update()
            return issued
        loss.backward()
        issued = time.perf_counter() - t0
        self.opt.step()
        return issued

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """pid -> (name, CPU seconds so far) of every process (Ray workers by their ``ray::`` title)."""
    import psutil

    out = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
        t = proc.info["cpu_times"]
        if t is None:
            continue
        cmd = proc.info["cmdline"] or []
        name = cmd[0].split(" ")[0] if cmd and cmd[0].startswith("ray::") else proc.info["name"]
        out[proc.info["pid"]] = (name, t.user + t.system)
    return out


def thread_sched() -> dict[str, float] | None:
    """The calling thread's scheduler counters (Linux ``/proc/thread-self``): CPU seconds, seconds spent
    runnable but waiting for a core, voluntary (sleeps: the GIL, a lock, a blocking CUDA wait) and
    involuntary (preempted) context switches. None where the files are absent."""
    try:
        cpu_ns, runq_ns, _ = open("/proc/thread-self/schedstat").read().split()[:3]
        status = dict(
            line.split(":", 1) for line in open("/proc/thread-self/status").read().splitlines() if ":" in line
        )
        return {
            "cpu_s": int(cpu_ns) / 1e9,
            "runqueue_s": int(runq_ns) / 1e9,
            "voluntary": int(status["voluntary_ctxt_switches"]),
            "involuntary": int(status["nonvoluntary_ctxt_switches"]),
        }
    except (OSError, KeyError, ValueError):
        return None


def main_thread_use(before: dict | None, after: dict | None, seconds: float, steps: int) -> dict:
    """Shares of the window the training thread spent on a core and waiting for one, and its context
    switches per step: a thread slowed by other processes waits in the run queue; one slowed by the
    GIL or a lock sleeps (voluntary switches) instead of spinning in the CUDA wait as the ceiling's does."""
    if before is None or after is None or seconds <= 0:
        return {}
    per_step = max(steps, 1)
    return {
        "main_cpu_share": (after["cpu_s"] - before["cpu_s"]) / seconds,
        "main_runqueue_share": (after["runqueue_s"] - before["runqueue_s"]) / seconds,
        "main_voluntary_per_step": (after["voluntary"] - before["voluntary"]) / per_step,
        "main_involuntary_per_step": (after["involuntary"] - before["involuntary"]) / per_step,
    }


def cpu_use(before: dict, after: dict, seconds: float) -> tuple[dict[str, float], int]:
    """Cores used per process name between two ``cpu_by_process`` snapshots, and how many processes
    started in between (worker churn)."""
    cores: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        start = before.get(pid, (name, 0.0))[1]
        cores[name] = cores.get(name, 0.0) + (cpu - start) / seconds
    top = dict(sorted(((k, round(v, 2)) for k, v in cores.items() if v >= 0.05), key=lambda kv: -kv[1])[:8])
    return top, len(set(after) - set(before))


def measure(trainer: Trainer, batches, *, warmup_steps: int, seconds: float, train: bool = True) -> dict:
    """Train on ``batches`` (an iterator of (x, y) on the device): ``warmup_steps`` untimed, then as
    many as fit in ``seconds``. Returns images/s, the stall share, the time to the first batch, and
    the CPU cores this (trainer) process and the whole machine used in the window. ``train=False``
    only reads the batches: what the feed can deliver when nothing else runs in this process."""
    import psutil

    step = trainer.step if train else (lambda x, y: 0.0)
    me = psutil.Process()
    t_start = time.perf_counter()
    first_batch_s = None
    for _ in range(warmup_steps):
        x, y = next(batches)
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t_start
        step(x, y)
    trainer.sync()
    images = steps = 0
    wait = 0.0
    step_s: list[float] = []
    issue_s: list[float] = []
    cpu0 = sum(me.cpu_times()[:2])
    sched0 = thread_sched()
    procs0 = cpu_by_process()
    psutil.cpu_percent(None)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        w0 = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            break
        w1 = time.perf_counter()
        wait += w1 - w0
        issue_s.append(step(x, y))  # AMP's scaler reads its inf check back: the GPU work is done on return
        step_s.append(time.perf_counter() - w1)
        images += int(x.shape[0])
        steps += 1
    trainer.sync()
    elapsed = time.perf_counter() - t0
    sched1 = thread_sched()
    machine = psutil.cpu_percent(None) / 100 * (os.cpu_count() or 1)
    by_name, started = cpu_use(procs0, cpu_by_process(), elapsed)
    return {
        "cores_by_process": by_name,
        "processes_started": started,
        "trainer_cores": (sum(me.cpu_times()[:2]) - cpu0) / elapsed,
        "machine_cores": machine,
        "images_per_s": images / elapsed,
        "steps": steps,
        "images": images,
        "seconds": elapsed,
        "stall_share": wait / elapsed,
        "first_batch_s": first_batch_s,
        **step_times(step_s),
        **({"issue_ms_median": 1e3 * sorted(issue_s)[len(issue_s) // 2]} if train and issue_s else {}),
        **main_thread_use(sched0, sched1, elapsed, steps),
    }


def step_times(step_s: list[float]) -> dict:
    """Training-step times (ms) without the wait for data: median, 90th percentile, longest, and the
    share of the window's step time spent in steps over 3x the median. A feed whose steps are all
    slower than the ceiling's competes with the step for the host or the GPU; one with a few very
    long steps pays one-off costs (cuDNN autotuning a new batch shape, an epoch's start)."""
    if not step_s:
        return {}
    ordered = sorted(step_s)
    median = ordered[len(ordered) // 2]
    slow = sum(t for t in step_s if t > 3 * median)
    total = sum(step_s)
    return {
        "step_ms_median": 1e3 * median,
        "step_ms_p90": 1e3 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "step_ms_max": 1e3 * ordered[-1],
        "slow_step_share": slow / total if total > 0 else 0.0,
    }


def synthetic_batches(trainer: Trainer, batch: int, size: int, dtype: torch.dtype):
    x = torch.randn(batch, 3, size, size, device=trainer.device).to(dtype)
    if trainer.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=trainer.device)
    while True:
        yield x, y


def raypipe_batches(data: str, aug, trainer: Trainer, args, dtype: torch.dtype, closers: list, feeder: bool):
    from raypipe.config import ExecutionConfig, PipelineConfig
    from raypipe.device import from_timm_args
    from raypipe.pipeline import EpochSource, FeederSource, Pipeline

    # drop_last as timm's training loader (create_loader(is_training=True)): both feeds then train on
    # one batch shape only; an epoch's short last batch would make cuDNN (benchmark mode) autotune anew
    cfg = PipelineConfig(batch_size=args.batch, drop_last=True)
    ex = ExecutionConfig(
        chunk_rows=args.chunk_rows,
        worker_nice=args.worker_nice,
        worker_sched_idle=args.worker_sched_idle,
        cpus_per_task=args.cpus_per_task,
    )
    ex = ex.resolved_for(gpu_trainer=trainer.device.type == "cuda")
    source = (FeederSource if feeder else EpochSource)(Pipeline(data, aug, config=cfg, execution=ex))
    loader = from_timm_args(source, device=trainer.device, img_dtype=dtype, channels_last=trainer.channels_last)
    closers.append(loader.close)
    while True:  # as many epochs as the window needs; each pass is the next epoch
        for b in loader:
            yield b["image"], b["label"]


def dropin_batches(data: str, aug, trainer: Trainer, args, dtype: torch.dtype, closers: list):
    from raypipe.benchmark.contenders import _timm_kwargs
    from raypipe.config import ExecutionConfig
    from raypipe.timm import create_loader
    from raypipe.workers.local import LocalWorkers

    ex = ExecutionConfig(
        backend="local",
        chunk_rows=args.chunk_rows,
        worker_nice=args.worker_nice,
        worker_sched_idle=args.worker_sched_idle,
        cpus_per_task=args.cpus_per_task,
    )
    on_gpu = trainer.device.type == "cuda"
    loader = create_loader(
        data,
        batch_size=args.batch,
        is_training=True,
        use_prefetcher=True,
        device=trainer.device,
        img_dtype=dtype,
        pin_memory=on_gpu,
        channels_last=trainer.channels_last,
        execution=ex,
        **_timm_kwargs(aug),
    )
    closers.append(loader.close)
    # The process's pool of local workers outlives a loader (for the next one); end it with the feed, as
    # timm's workers end with theirs, so the next feed starts on idle cores and its own fresh workers.
    closers.append(LocalWorkers.shutdown_shared)
    while True:  # timm's training loader: full batches only, each pass the next epoch
        yield from loader


def timm_batches(data: str, aug, trainer: Trainer, batch: int, dtype: torch.dtype, workers: int, closers: list):
    from timm.data import create_dataset, create_loader

    from raypipe.benchmark.contenders import _patch_timm_posterize, _timm_kwargs

    dataset = create_dataset("", root=data, split="train", is_training=True)
    on_gpu = trainer.device.type == "cuda"
    loader = create_loader(
        dataset,
        batch_size=batch,
        is_training=True,
        use_prefetcher=True,
        num_workers=workers,
        device=trainer.device,
        img_dtype=dtype,
        pin_memory=on_gpu,
        persistent_workers=True,
        **_timm_kwargs(aug),
    )
    _patch_timm_posterize(dataset.transform)
    closers.append(lambda: getattr(loader.loader, "_iterator", None) and loader.loader._iterator._shutdown_workers())
    while True:
        for x, y in loader:
            if trainer.channels_last:  # timm's train.py converts each batch like this
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, y


def run_feed(name: str, make, trainer: Trainer, args, results: dict, key: str, train: bool = True) -> None:
    closers: list = []
    try:
        results[key] = measure(
            trainer, make(closers), warmup_steps=args.warmup_steps, seconds=args.seconds, train=train
        )
    except Exception:  # one broken feed must not lose the others' figures
        traceback.print_exc()
        results[key] = {"error": traceback.format_exc(limit=3)}
    finally:
        for close in closers:
            try:
                close()
            except Exception:
                traceback.print_exc()
    left = [t.name for t in threading.enumerate() if t.name.startswith("raypipe")]
    if left:  # a feed that does not stop its threads would skew the next feed's figures
        print(f"  threads left running after {name}: {left}", flush=True)
        results[key]["threads_left"] = left
    r = results[key]
    if "error" not in r:
        print(
            f"  {name:<12} {r['images_per_s']:8,.0f} img/s  stall {100 * r['stall_share']:5.1f} %  "
            f"first batch {r['first_batch_s']:.2f} s  ({r['steps']} steps)  CPU cores: trainer process "
            f"{r['trainer_cores']:.2f}, machine {r['machine_cores']:.1f}",
            flush=True,
        )
        print(
            f"               cores by process: {r['cores_by_process']}; processes started: {r['processes_started']}",
            flush=True,
        )
        if "step_ms_median" in r:
            print(
                f"               step ms (no data wait): median {r['step_ms_median']:.1f}, p90 "
                f"{r['step_ms_p90']:.1f}, max {r['step_ms_max']:.1f}; steps > 3x median: "
                f"{100 * r['slow_step_share']:.0f} % of step time; issuing fwd+bwd median "
                f"{r.get('issue_ms_median', float('nan')):.1f}",
                flush=True,
            )
        if "main_cpu_share" in r:
            print(
                f"               training thread: on a core {100 * r['main_cpu_share']:.0f} %, waiting for one "
                f"{100 * r['main_runqueue_share']:.1f} % of the window; per step "
                f"{r['main_voluntary_per_step']:.1f} sleeps, {r['main_involuntary_per_step']:.1f} preemptions",
                flush=True,
            )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="image folder (default: write sample data to a temp dir)")
    p.add_argument("--images", type=int, default=20000, help="sample images to write when --data is absent")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--augments", nargs="+", choices=sorted(AUGMENTS), default=["rrc", "rand-m9"])
    p.add_argument(
        "--feeds",
        nargs="+",
        choices=FEEDS,
        default=FEEDS,
        help="raypipe-data: raypipe's batches on the GPU, no training (what it can deliver)",
    )
    p.add_argument("--chunk-rows", type=int, help="raypipe rows per chunk (default: ExecutionConfig.chunk_rows_for)")
    p.add_argument("--worker-nice", type=int, default=10, help="augmentation workers' niceness (as PipelineConfig)")
    p.add_argument(
        "--worker-sched-idle",
        action=argparse.BooleanOptionalAction,
        help="augmentation threads under SCHED_IDLE (default: on for cuda, like the job)",
    )
    p.add_argument("--cpus-per-task", type=float, default=0.5, help="CPUs per raypipe augmentation task")
    p.add_argument("--seconds", type=float, default=20.0, help="timed window per feed")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="timm loader workers")
    p.add_argument("--object-store-gb", type=float, help="default: Ray's (30%% of the memory it sees)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_train: CUDA is absent on this machine; nothing to measure (run it on a CUDA machine).")
        return 0
    from raypipe.config import TrainAugment
    from raypipe.runtime import connect

    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    tmp = None
    data = args.data
    if data is None:
        tmp = tempfile.TemporaryDirectory(prefix="raypipe-gpu-train-")
        data = write_data(tmp.name, args.images, args.workers)
    trainer = Trainer(args.model, device, amp=True, channels_last=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results: dict = {
        "device": name,
        "torch": torch.__version__,
        "model": args.model,
        "batch": args.batch,
        "cpus": os.cpu_count(),
        "data": data,
        "seconds": args.seconds,
        "augments": {},
    }
    print(f"{args.model} batch {args.batch} AMP fp16 channels_last on {name}, {os.cpu_count()} CPUs", flush=True)
    if {"raypipe", "raypipe-thread", "raypipe-data"} & set(args.feeds):
        # One Ray for the whole run: re-initialising Ray in one process is not something a trainer
        # does, and a thread of the first Ray session can outlive it and end the process.
        # Its idle workers take no CPU from timm's loader.
        connect(object_store_memory=int(args.object_store_gb * 2**30) if args.object_store_gb else None)
    if "ceiling" in args.feeds:
        run_feed(
            "ceiling",
            lambda c: synthetic_batches(trainer, args.batch, args.size, dtype),
            trainer,
            args,
            results,
            "ceiling",
        )
    for aug_name in args.augments:
        aug = TrainAugment(input_size=args.size, **AUGMENTS[aug_name])
        res = results["augments"].setdefault(aug_name, {})
        print(f"{aug_name}:", flush=True)
        feeds = {
            "raypipe": lambda c, aug=aug: raypipe_batches(data, aug, trainer, args, dtype, c, feeder=True),
            "raypipe-local": lambda c, aug=aug: dropin_batches(data, aug, trainer, args, dtype, c),
            "raypipe-thread": lambda c, aug=aug: raypipe_batches(data, aug, trainer, args, dtype, c, feeder=False),
            "raypipe-data": lambda c, aug=aug: raypipe_batches(data, aug, trainer, args, dtype, c, feeder=True),
            "timm": lambda c, aug=aug: timm_batches(data, aug, trainer, args.batch, dtype, args.workers, c),
        }
        for feed, make in feeds.items():
            if feed in args.feeds:
                run_feed(feed, make, trainer, args, res, feed, train=feed != "raypipe-data")
        if args.json:  # after every augmentation: a run cut short still leaves its figures
            pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    print_table(results)
    if ray_started():
        import ray

        ray.shutdown()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    if tmp is not None:
        tmp.cleanup()
    return 0 if _all_ok(results) else 1


def ray_started() -> bool:
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def _all_ok(results: dict) -> bool:
    feeds = [results.get("ceiling", {})] + [f for a in results["augments"].values() for f in a.values()]
    return all("error" not in f for f in feeds)


def print_table(results: dict) -> None:
    ceiling = results.get("ceiling", {}).get("images_per_s")
    print(f"\n{results['model']} training, batch {results['batch']}, {results['device']}, {results['cpus']} CPUs")
    print(
        f"  {'feed':<22} {'img/s':>8} {'of ceiling':>10} {'stall':>7} {'first batch':>12} {'trainer CPU':>12}"
        f" {'step ms':>8}"
    )
    if ceiling:
        step = results["ceiling"].get("step_ms_median")
        print(f"  {'ceiling (on-GPU data)':<22} {ceiling:8,.0f} {'100 %':>10}" + (f"{step:43.1f}" if step else ""))
    for aug_name, feeds in results["augments"].items():
        for feed, r in feeds.items():
            label = f"{feed} {aug_name}"
            if "error" in r:
                print(f"  {label:<22} error: {r['error'].strip().splitlines()[-1]}")
                continue
            share = f"{100 * r['images_per_s'] / ceiling:.0f} %" if ceiling else "-"
            step = f"{r['step_ms_median']:8.1f}" if "step_ms_median" in r else f"{'-':>8}"
            print(
                f"  {label:<22} {r['images_per_s']:8,.0f} {share:>10} {100 * r['stall_share']:6.1f}% "
                f"{r['first_batch_s']:11.2f}s {r['trainer_cores']:11.2f}c {step}"
            )
    if not ceiling:
        print("  (no ceiling measured: shares are not shown)")


if __name__ == "__main__":
    sys.exit(main())
