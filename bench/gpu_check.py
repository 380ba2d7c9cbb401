"""GPU check for raypipe's DeviceLoader (no Ray needed): correctness and speed on one CUDA device.

Run on a CUDA machine from the repository root: ``python bench/gpu_check.py`` (about a minute; always
well inside 8). It prints one table: correctness against the CPU reference; H2D copy of a
256x224x224x3 uint8 batch from pinned vs pageable memory; overlap (a compute step alone; with the
next batch's copy, then copy and normalise, issued on a side stream in the step itself, the physical
best; with the DeviceLoader's producer thread copying and normalising behind it; each step synced as
AMP training's is: share of the copy time hidden, the normalise kernel's own GPU time aside);
normalise / erasing / mixup cost per batch; timm's PrefetchLoader on the same input. Without CUDA it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import time
import traceback
import types

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _import_device():
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module("raypipe.device")
    except ImportError:  # e.g. no pyyaml for raypipe.config: load the device package on its own
        for name in [m for m in sys.modules if m == "raypipe" or m.startswith("raypipe.")]:
            del sys.modules[name]
        pkg = types.ModuleType("raypipe")
        pkg.__path__ = [str(ROOT / "raypipe")]
        sys.modules["raypipe"] = pkg
        return importlib.import_module("raypipe.device")


def cuda_ms(fn, iters: int) -> float:
    """Mean milliseconds of ``fn()`` on the current stream, timed with CUDA events after a warm-up."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def wall_ms(fn, iters: int) -> float:
    """Mean milliseconds of ``fn()`` by the wall clock after a warm-up (a CPU device's ``cuda_ms``)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def check_correctness(dev, rows):
    rng = np.random.default_rng(0)
    src = [
        {
            "image": rng.integers(0, 256, (16, 64, 64, 3), dtype=np.uint8),
            "label": rng.integers(0, 10, 16),
            "sample_id": np.arange(16),
        }
        for _ in range(4)
    ]
    kw = dict(
        img_dtype="float32",
        re_prob=0.5,
        re_mode="rand",
        re_count=2,
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        mixup_mode="elem",
        label_smoothing=0.1,
        num_classes=10,
        seed=1,
    )
    outs = {}
    for device in ("cpu", "cuda"):
        with dev.from_timm_args(src, device=device, **kw) as loader:
            outs[device] = [(b["image"].cpu(), b["label"].cpu()) for b in loader]
    err = max((g[0] - c[0]).abs().max().item() for g, c in zip(outs["cuda"], outs["cpu"], strict=True))
    terr = max((g[1] - c[1]).abs().max().item() for g, c in zip(outs["cuda"], outs["cpu"], strict=True))
    rows.append(
        (
            "cuda vs cpu reference (fp32, erasing+mixup)",
            f"image {err:.2e}, target {terr:.2e}",
            "PASS" if err < 1e-4 and terr < 1e-6 else "FAIL",
        )
    )
    from timm.data.loader import PrefetchLoader

    batches = [
        (torch.from_numpy(b["image"]).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(b["label"])) for b in src
    ]
    timm_loader = PrefetchLoader(batches, device=torch.device("cuda"), img_dtype=torch.float16)
    timm_out = [x.cpu() for x, _ in timm_loader]
    with dev.from_timm_args(batches, device="cuda", channels_last=False) as loader:
        ours = [x.cpu() for x, _ in loader]
    # Ours is one fused multiply-add, timm's sub then div: equal within fp16 rounding.
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, timm_out, strict=True))
    rows.append(("fp16 normalise vs timm PrefetchLoader", f"max |diff| {diff:.1e}", "PASS" if diff <= 4e-3 else "FAIL"))


def check_h2d(rows, n, size, iters):
    host = torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8)
    pinned = host.pin_memory()
    for name, src in (("pageable", host), ("pinned", pinned)):
        ms = cuda_ms(lambda s=src: s.to("cuda", non_blocking=True), iters)
        speed = f"{ms:.2f} ms, {host.nbytes / ms / 1e6:.1f} GB/s"
        rows.append((f"H2D {n}x{size}x{size}x3 uint8 from {name}", speed, ""))
    return cuda_ms(lambda: pinned.to("cuda", non_blocking=True), iters)


def make_batches(n, size, count):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8) for _ in range(2)]
    return [
        {"image": images[i % 2], "label": rng.integers(0, 1000, n), "sample_id": np.arange(n) + i * n}
        for i in range(count)
    ]


def step_loop(items, compute) -> tuple[float, float, float]:
    """Mean ms per step: its wall time, the part spent waiting in ``next(items)``, and the part spent
    issuing ``compute()`` (host time the GPU may idle for, e.g. waiting for the GIL). A step is
    ``compute()`` then a host sync, as an AMP training step ends (its scaler reads the inf check back):
    the host cannot run ahead of the GPU, so a wait for data is a stall, and device work beside the step
    shows in its time."""
    torch.cuda.synchronize()
    it = iter(items)
    walls, waits, issues = [], [], []
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        compute()
        t2 = time.perf_counter()
        torch.cuda.current_stream().synchronize()
        walls.append(time.perf_counter() - t0)
        waits.append(t1 - t0)
        issues.append(t2 - t1)
    return tuple(1e3 * sum(v) / max(1, len(v)) for v in (walls, waits, issues))


def side_stream_copies(pinned: torch.Tensor, count: int, transform=None):
    """The physical best a loader can do: each step, the next batch's host->device copy (and ``transform``
    of it) issued on a side stream from this thread, the step's stream ordered after the copy of the batch
    it trains on. No producer thread, no queue, no staging memcpy."""
    side = torch.cuda.Stream()
    bufs = [torch.empty(pinned.shape, dtype=pinned.dtype, device="cuda") for _ in range(2)]
    done: list = [None, None]
    for i in range(count + 1):
        j = i % 2
        with torch.cuda.stream(side):
            if done[j] is not None:
                side.wait_event(done[j])  # the step that read this buffer has been issued after its event
            bufs[j].copy_(pinned, non_blocking=True)
            if transform is not None:
                transform(bufs[j])
            ready = torch.cuda.Event()
            ready.record(side)
        if i == 0:
            prev = ready
            continue
        torch.cuda.current_stream().wait_event(prev)  # train on the batch copied in the previous step
        yield
        done[1 - j] = torch.cuda.Event()
        done[1 - j].record(torch.cuda.current_stream())
        prev = ready


def check_overlap(dev, rows, n, size, copy_ms, batches):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)

    def compute():
        for _ in range(reps):
            torch.mm(a, a)

    reps = 1
    one = cuda_ms(compute, 5)
    # The producer's host work per batch (memcpy into the pinned ring, single-threaded) must fit in a
    # step too, or the figure measures host memcpy rather than overlap: a 256-image batch's memcpy can
    # take as long as its device copy, so a step sized from the device copy alone would stall.
    pinned = torch.empty(batches[0]["image"].shape, dtype=torch.uint8, pin_memory=True)
    t0 = time.perf_counter()
    for b in batches[:8]:
        np.copyto(pinned.numpy(), b["image"])
    host_ms = (time.perf_counter() - t0) * 1e3 / len(batches[:8])
    reps = max(1, int(max(3 * copy_ms, 3 * host_ms, 10.0) / one))
    count = len(batches)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    x8 = torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, device="cuda")
    norm = lambda x: dev.normalize(x, mean=mean, std=std, dtype=torch.float16)
    norm_ms = cuda_ms(lambda: norm(x8), 5)
    runs: list[list[tuple[float, float, float]]] = [[], [], [], []]
    with dev.DeviceLoader(batches, device="cuda", prefetch=3) as loader:
        list(loader)  # warm-up: ring, allocator
        # The four in turn, three times, each figure the median of its three: the GPU's clocks and the
        # host drift over seconds by about as much as the copy takes.
        for _ in range(3):
            runs[0].append(step_loop(range(count), compute))
            runs[1].append(step_loop(side_stream_copies(pinned, count), compute))
            runs[2].append(step_loop(side_stream_copies(pinned, count, norm), compute))
            it = iter(loader)
            next(it)  # a pass's first batch waits for its producer to start: start-up, not overlap
            time.sleep(1.0)  # the producer fills its queue, as it does while a trainer runs its first step
            runs[3].append(step_loop(it, compute))
    medians = [tuple(sorted(r[k] for r in rs)[1] for k in range(3)) for rs in runs]
    (alone_ms, _, alone_issue), (raw_ms, _, _), (raw_norm_ms, _, _), (with_ms, stall_ms, with_issue) = medians

    def hidden(step_ms: float, normalised: bool) -> float:
        # A normalise is GPU work beside a kernel that already fills the GPU: it adds its own time
        # whatever the overlap. The host-to-device copy runs on a copy engine and should not.
        return 1.0 - max(0.0, step_ms - alone_ms - (norm_ms if normalised else 0.0)) / copy_ms

    def share(h: float) -> str:
        return f"{100 * max(min(h, 1.0), 0.0):.0f} % of {copy_ms:.2f} ms"

    rows.append(("host memcpy of a batch into pinned memory", f"{host_ms:.2f} ms", ""))
    rows.append(("compute step alone (synced per step)", f"{alone_ms:.2f} ms (issuing it {alone_issue:.2f})", ""))
    rows.append(
        ("  + side-stream copy issued in the step", f"{raw_ms:.2f} ms ({share(hidden(raw_ms, False))} hidden)", "")
    )
    rows.append(("  + side-stream copy and normalise", f"{raw_norm_ms:.2f} ms (normalise {norm_ms:.2f} ms)", ""))
    rows.append(
        (
            "  + DeviceLoader (producer thread ahead)",
            f"{with_ms:.2f} ms (stall {stall_ms:.2f}, issuing {with_issue:.2f})",
            "",
        )
    )
    h = hidden(with_ms, True)
    rows.append(("H2D copy time hidden by the DeviceLoader", share(h), "PASS" if h >= 0.9 else "FAIL"))


def check_transform_cost(dev, rows, n, size, iters, device="cuda"):
    """Normalise, erasing and mixup per batch on ``device`` (a CPU run only exercises the code)."""
    timer = cuda_ms if device == "cuda" else wall_ms
    x8 = torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, device=device)
    y = torch.randint(0, 1000, (n,), device=device)
    rng = np.random.default_rng(0)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    norm = lambda: dev.normalize(x8, mean=mean, std=std, dtype=torch.float16)
    rows.append(("normalise fp16 channels_last", f"{timer(norm, iters):.2f} ms/batch", ""))
    g = torch.Generator(device=device)
    for mode in ("const", "pixel"):
        erasing = dev.RandomErasing(probability=0.25, mode=mode)
        x = norm()
        ms = timer(lambda e=erasing, x=x: e(x, rng=rng, generator=g), iters)
        rows.append((f"random erasing re_prob=0.25 {mode}", f"{ms:.2f} ms/batch", ""))
    for mode in ("batch", "elem"):
        mixup = dev.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, mode=mode, label_smoothing=0.1, num_classes=1000)
        x = norm()
        ms = timer(lambda m=mixup, x=x: m(x, y, rng=rng), iters)
        rows.append((f"mixup+cutmix mode={mode}", f"{ms:.2f} ms/batch", ""))


def check_vs_timm(dev, rows, batches, device="cuda"):
    """timm's PrefetchLoader and the DeviceLoader on the same NCHW batches, fp16 on ``device``."""
    from timm.data.loader import PrefetchLoader

    nchw = [
        (torch.from_numpy(b["image"]).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(b["label"])) for b in batches
    ]
    results = {}
    with dev.from_timm_args(nchw, device=device, img_dtype="float16", channels_last=False) as loader:
        for name, it in (
            ("timm PrefetchLoader", lambda: PrefetchLoader(nchw, device=torch.device(device), img_dtype=torch.float16)),
            ("raypipe DeviceLoader", lambda: loader),
        ):
            list(it())
            sync(device)
            t0 = time.perf_counter()
            for x, _ in it():
                x.sum()
            sync(device)
            results[name] = len(nchw) * nchw[0][0].shape[0] / (time.perf_counter() - t0)
    for name, ips in results.items():
        rows.append((f"{name}, same NCHW tensors, fp16", f"{ips:,.0f} img/s", ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--batches", type=int, default=64, help="batches per overlap / throughput run")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is absent on this machine; nothing to check (run it on a CUDA machine).")
        return 0
    dev = _import_device()
    started = time.perf_counter()
    rows: list[tuple[str, str, str]] = []
    copy_ms = check_h2d(rows, args.batch, args.size, args.iters)
    batches = make_batches(args.batch, args.size, args.batches)
    checks = {
        "correctness": lambda: check_correctness(dev, rows),
        "overlap": lambda: check_overlap(dev, rows, args.batch, args.size, copy_ms, batches),
        "transform cost": lambda: check_transform_cost(dev, rows, args.batch, args.size, args.iters),
        "vs timm": lambda: check_vs_timm(dev, rows, batches),
    }
    for name, check in checks.items():
        try:  # one broken check must not lose the others' figures
            check()
        except Exception:
            traceback.print_exc()
            rows.append((f"{name}: error", traceback.format_exc(limit=1).strip().splitlines()[-1][:60], "FAIL"))
    print(
        f"\nraypipe DeviceLoader GPU check on {torch.cuda.get_device_name()} (torch {torch.__version__}), "
        f"{time.perf_counter() - started:.0f} s"
    )
    width = max(len(r[0]) for r in rows)
    for what, value, verdict in rows:
        print(f"  {what:<{width}}  {value:<40} {verdict}")
    return 0 if all(r[2] != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
