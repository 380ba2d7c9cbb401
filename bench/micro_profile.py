"""Small measurements behind constants and code paths in raypipe (the comments that cite them say which),
one subcommand each:

    python bench/micro_profile.py reads DATA          # read_bytes per file: cached directory vs full resolve
    python bench/micro_profile.py aa-import           # building a rand-m9 policy in a fresh process
    python bench/micro_profile.py kernel-procs DATA   # the train kernel alone, in 1, 2 and 4 processes at once
    python bench/micro_profile.py kernel-split DATA   # where the kernel's time goes (cProfile, own time)
    python bench/micro_profile.py prefilter DATA      # resize prefilter: sepFilter2D vs GaussianBlur
    python bench/micro_profile.py block-alloc         # a fresh np.zeros output block vs a reused one
    python bench/micro_profile.py rng [DATA]          # sample_rng and its parts, BlockRngs; with DATA the stage
    python bench/micro_profile.py resize DATA         # crop+resize to 224: Pillow, C (AVX2 / scalar), OpenCV
    python bench/micro_profile.py ray-null            # Ray's own CPU per 128-image block (a stage that only allocates)
    python bench/micro_profile.py ray-null --runs 8 [--object-store-mb 512]   # + page faults as the store warms
    python bench/micro_profile.py packer              # the consumer's packing CPU per epoch; copies after a short block

CPU figures are per-thread (``time.thread_time``) unless said otherwise.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import subprocess
import sys
import time

import numpy as np


def cpu_us(fn, n: int) -> float:
    """CPU µs of this thread per call of ``fn`` over ``n`` calls, after one warm-up call."""
    fn()
    start = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - start) / n * 1e6


def reads(args) -> None:
    from raypipe.sources import open_root, paths

    root = open_root(args.data)
    files = [os.path.relpath(p, root.root) for p in sorted(glob.glob(os.path.join(root.root, "*", "*")))]

    def read_all():
        for f in files:
            root.read_bytes(f)

    cached = cpu_us(read_all, 2) / len(files)
    nofollow, paths._NOFOLLOW = paths._NOFOLLOW, None  # every read resolves the whole path (the old way)
    try:
        full = cpu_us(read_all, 2) / len(files)
    finally:
        paths._NOFOLLOW = nofollow
    print(f"read_bytes over {len(files)} files, CPU µs/file: directory cached + O_NOFOLLOW {cached:.1f}, "
          f"full resolve {full:.1f}")  # fmt: skip


_BUILD = """
import resource, sys, time
t, c = time.perf_counter(), time.process_time()
{prelude}
from raypipe.kernels import autoaug
autoaug.build_auto_augment("rand-m9-mstd0.5-inc1", (224, 224), (0.485, 0.456, 0.406), "bilinear")
print(f"wall {{time.perf_counter() - t:.2f}} s, CPU {{time.process_time() - c:.2f}} s, "
      f"max RSS {{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}} MB, torch imported: "
      f"{{'torch' in sys.modules}}")
"""


def aa_import(args) -> None:
    for name, prelude in (("timm's module loaded alone (raypipe)", ""),
                          ("through the timm package (before)", "import timm.data.auto_augment")):  # fmt: skip
        out = subprocess.run([sys.executable, "-c", _BUILD.format(prelude=prelude)], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        print(f"build a rand-m9 policy in a fresh process, {name}: {out}")


_KERNEL = """
import glob, os, sys, time
import numpy as np
from raypipe.config import DecodeConfig, TrainAugment
from raypipe.kernels import build_transform, sample_rng
files = [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(sys.argv[1], "*", "*")))[:600]]
t = build_transform(TrainAugment(input_size=224, color_jitter=None), DecodeConfig())
out = np.empty((224, 224, 3), np.uint8)
for i, d in enumerate(files[:50]):
    t(d, sample_rng(0, 0, i), out=out)
c = time.thread_time()
for i, d in enumerate(files):
    t(d, sample_rng(0, 0, i), out=out)
print(f"{(time.thread_time() - c) / len(files) * 1e6:.0f}")
"""


def kernel_procs(args) -> None:
    for n in (1, 2, 4):
        procs = [subprocess.Popen([sys.executable, "-c", _KERNEL, args.data], stdout=subprocess.PIPE, text=True)
                 for _ in range(n)]  # fmt: skip
        figures = [p.communicate()[0].strip() for p in procs]
        print(f"RRC224+flip kernel, {n} process(es) at once: CPU µs/img {' / '.join(figures)}")


def kernel_split(args) -> None:
    import cProfile
    import pstats

    from raypipe.config import DecodeConfig, TrainAugment
    from raypipe.kernels import build_transform, sample_rng

    files = [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(args.data, "*", "*")))[::4]]
    t = build_transform(TrainAugment(input_size=224, color_jitter=None), DecodeConfig())
    out = np.empty((224, 224, 3), np.uint8)

    def run():
        for i, d in enumerate(files):
            t(d, sample_rng(0, 0, i), out=out)

    run()
    prof = cProfile.Profile()
    prof.runcall(run)
    own = {f[2]: v[2] for f, v in pstats.Stats(prof).stats.items()}  # function name -> own time
    total = sum(own.values())
    parts = {"JPEG decode": ("decode_region", "decode_jpeg"), "resize + prefilter": ("resize", "sepFilter2D",
             "warpAffine")}  # fmt: skip
    shares = {k: sum(v for name, v in own.items() if any(n in name for n in names)) for k, names in parts.items()}
    shares["the rest (Python, flips, ...)"] = total - sum(shares.values())
    print(f"RRC224+flip kernel over {len(files)} images, {total / len(files) * 1e6:.0f} µs/img under cProfile:",
          ", ".join(f"{k} {v / total:.0%}" for k, v in shares.items()))  # fmt: skip


def prefilter(args) -> None:
    import cv2

    cv2.setNumThreads(1)
    img = cv2.imread(sorted(glob.glob(os.path.join(args.data, "*", "*")))[0])
    for h, w in ((365, 480), (260, 280)):
        roi = np.ascontiguousarray(img[:h, :w])
        h, w = roi.shape[:2]
        taps, sigmas = [], []
        for s in (w / 224, h / 224):
            a = (s * s - 1) / 12
            taps.append(np.array([a, 1 - 2 * a, a], np.float32))
            sigmas.append(math.sqrt(-1 / (2 * math.log(a / (1 - 2 * a)))))  # Gaussian with the same taps
        sep, gauss = _prefilter_pair(cv2, roi, taps, sigmas)
        print(f"prefilter on a {h}x{w} crop, CPU µs: sepFilter2D {sep:.0f}, GaussianBlur {gauss:.0f}")


def _prefilter_pair(cv2, roi, taps, sigmas) -> tuple[float, float]:
    sep = cpu_us(lambda: cv2.sepFilter2D(roi, -1, taps[0], taps[1], borderType=cv2.BORDER_REPLICATE), 300)
    gauss = cpu_us(
        lambda: cv2.GaussianBlur(roi, (3, 3), sigmaX=sigmas[0], sigmaY=sigmas[1], borderType=cv2.BORDER_REPLICATE),
        300,
    )
    return sep, gauss


def block_alloc(args) -> None:
    shape = (128, 224, 224, 3)
    reused = np.empty(shape, np.uint8)

    def fresh():
        block = np.zeros(shape, np.uint8)
        block[:] = 1

    def again():
        reused[:] = 1

    print(f"128-image output block, CPU ms: np.zeros + writes {cpu_us(fresh, 20) / 1e3:.2f}, "
          f"reused block + writes {cpu_us(again, 20) / 1e3:.2f}")  # fmt: skip


def rng(args) -> None:
    from raypipe.kernels import sample_rng
    from raypipe.kernels.seeding import BlockRngs

    ss = np.random.SeedSequence([0, 3, 12345])
    block = BlockRngs(0, 3, np.arange(128))
    print(f"CPU µs: sample_rng {cpu_us(lambda: sample_rng(0, 3, 12345), 20000):.1f}, "
          f"SeedSequence {cpu_us(lambda: np.random.SeedSequence([0, 3, 12345]), 20000):.1f}, "
          f"PCG64 {cpu_us(lambda: np.random.PCG64(ss), 20000):.1f}; BlockRngs per 128-id block "
          f"{cpu_us(lambda: BlockRngs(0, 3, np.arange(128)), 300):.0f}, "
          f"get {cpu_us(lambda: block.get(5), 20000):.1f}")  # fmt: skip
    if args.data:
        _stage_with_and_without_block_rngs(args.data)


def _stage_with_and_without_block_rngs(data: str) -> None:
    """The augmentation stage over 4 x 128 files, per-sample generators from BlockRngs vs sample_rng."""
    from raypipe.config import DecodeConfig, TrainAugment
    from raypipe.kernels import sample_rng
    from raypipe.sources.paths import DatasetRoot
    from raypipe.stages import augment
    from raypipe.stages.augment import AugmentStage, StageSpec

    root = DatasetRoot(os.path.realpath(data))
    files = sorted(glob.glob(os.path.join(root.root, "*", "*")))[:512]
    spec = StageSpec(kind="folder", root=root, augment=TrainAugment(input_size=224, color_jitter=None),
                     decode=DecodeConfig(), seed=0, epoch=1)  # fmt: skip
    stage = AugmentStage(spec)
    blocks = [{"sample_id": np.arange(i, i + 128), "path": np.array([os.path.relpath(f, root.root) for f in
               files[i:i + 128]], dtype=object), "label": np.zeros(128, np.int64), "row": np.zeros(128, np.int64)}
              for i in range(0, 512, 128)]  # fmt: skip

    class PerSample:  # what the stage did before BlockRngs
        def __init__(self, seed, epoch, ids):
            self.seed, self.epoch, self.ids = seed, epoch, ids

        def get(self, i):
            return sample_rng(self.seed, self.epoch, int(self.ids[i]))

    def run():
        for b in blocks:
            stage(b)

    figures = {}
    for name, cls in (("BlockRngs", augment.BlockRngs), ("sample_rng", PerSample)) * 2:
        augment.BlockRngs = cls
        figures.setdefault(name, []).append(cpu_us(run, 2) / 512)
    print("stage CPU µs/img (two passes each, alternating): "
          + ", ".join(f"{k} {' / '.join(f'{v:.0f}' for v in vs)}" for k, vs in figures.items()))  # fmt: skip


def resize(args) -> None:
    from PIL import Image

    img = np.asarray(Image.open(sorted(glob.glob(os.path.join(args.data, "*", "*")))[0]).convert("RGB"))
    for interp in ("bilinear", "bicubic"):
        for h, w in ((310, 350), (200, 260), (360, 220)):  # shrink ~1.5x, ~1x, a tall crop (vertical first)
            row = _resize_row(img, w, h, interp)
            print(f"{interp:8s} {w}x{h} -> 224, CPU µs: " + ", ".join(f"{k} {v:.0f}" for k, v in row.items()))


def _resize_row(img: np.ndarray, w: int, h: int, interp: str) -> dict[str, float]:
    from PIL import Image

    from raypipe.kernels import geometry

    pil = Image.fromarray(np.ascontiguousarray(img[:h, :w]))
    filt = Image.BILINEAR if interp == "bilinear" else Image.BICUBIC
    row = {"Pillow": cpu_us(lambda: pil.resize((224, 224), filt), 100)}
    ext = geometry._resample

    def ours():
        geometry.crop_resize(img, (0, 0, w, h), (224, 224), interp)

    if ext is not None:
        for level in (1, 2, 0):  # the fastest the CPU has (AVX-512's vertical pass), AVX2 only, scalar
            on = ext.set_vector(level)
            if level and not on:
                continue  # no AVX2 here
            name = {1: f"C fastest ({ext.vector_path()})", 2: "C AVX2", 0: "C scalar"}[level]
            row[name] = cpu_us(ours, 300)
        ext.set_vector(1)
    geometry._resample = None
    row["no extension (Pillow)"] = cpu_us(ours, 300)  # the fallback: Pillow, the same bytes
    geometry._resample = ext
    return row


def ray_null(args) -> None:
    """A Ray Data pipeline shaped like raypipe's chunks (one object per 128-row block, tasks of 0.5 CPU, 4 at a time,
    blocks iterated in this process) with a stage that only allocates and touches its output: what Ray
    itself costs per block, split by process role."""
    import pyarrow as pa
    from pipeline_profile import _cpu_by_role  # bench/ is on sys.path when run as a script

    from raypipe.runtime import connect

    connect(object_store_memory=args.object_store_mb << 20 if args.object_store_mb else None)
    import ray
    import ray.data

    n, b = 128 * 120, 128
    table = pa.table({"sample_id": np.arange(n), "label": np.arange(n) % 10})
    blocks = [table.slice(i, b) for i in range(0, n, b)]
    for rep in range(args.runs):  # the first pays for starting the workers
        ds = ray.data.from_arrow_refs([ray.put(x) for x in blocks])
        ds = ds.map_batches(_null_stage, batch_size=b, batch_format="numpy", num_cpus=0.5,
                            compute=ray.data.TaskPoolStrategy(size=4))  # fmt: skip
        ds.context.op_resource_reservation_enabled = False
        ds.context.enable_progress_bars = False
        f0, c0, t0, rows = _ray_workers_minor_faults(), _cpu_by_role(), time.perf_counter(), 0
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=4):
            rows += len(batch["sample_id"])
        dt, c1 = time.perf_counter() - t0, _cpu_by_role()
        per = {k: (c1[k] - c0.get(k, 0)) / (rows / b) * 1e3 for k in ("driver", "workers", "ray-daemons")}
        # A page of the object store is zero-filled the first time any process writes it: a fresh
        # store costs each block's pages, a store the allocator has cycled through costs ~nothing.
        faults = (_ray_workers_minor_faults() - f0) / (rows / b)
        print(f"run {rep}: {rows / dt:5.0f} img/s, CPU ms per block: "
              + "  ".join(f"{k} {v:.1f}" for k, v in sorted(per.items()))
              + f"  workers' page faults per block {faults:.0f}")  # fmt: skip
    # the parts of a worker's share that are not Ray's task path, timed here in one process
    from ray.data.block import BlockAccessor

    rows_in = {"sample_id": np.arange(b), "label": np.zeros(b, np.int64)}
    out = _null_stage(rows_in)
    block = BlockAccessor.batch_to_block(out)
    stage_ms = cpu_us(lambda: _null_stage(rows_in), 20) / 1e3
    print(f"in one process, CPU ms per block: the stage (allocate + touch) {stage_ms:.1f}, "
          f"batch_to_block {cpu_us(lambda: BlockAccessor.batch_to_block(out), 20) / 1e3:.1f}, "
          f"ray.put {cpu_us(lambda: ray.put(block), 20) / 1e3:.1f}")  # fmt: skip


def _ray_workers_minor_faults() -> int:
    """Minor page faults so far of every process with a ``ray::`` title (Linux /proc)."""
    from pipeline_profile import _processes

    total = 0
    for pid, cmd, _, _ in _processes():
        if cmd and cmd[0].startswith("ray::"):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    total += int(f.read().rpartition(")")[2].split()[7])  # field 10: minflt
            except (OSError, ValueError, IndexError):
                pass  # exited meanwhile
    return total


def _null_stage(batch: dict) -> dict:
    n = len(batch["sample_id"])
    images = np.zeros((n, 224, 224, 3), np.uint8)
    images[:, ::8] = 1  # touch the pages, as a stage writing its images does
    empty = np.full(n, "", object)
    return {"image": images, "label": np.asarray(batch["label"], np.int64), "sample_id": batch["sample_id"],
            "ok": np.ones(n, bool), "reason": empty, "detail": empty, "path": empty}  # fmt: skip


def packer(args) -> None:
    """The Packer over one epoch of 16 blocks of 128 224 px rows, as the trainer process runs it: clean
    blocks, the epoch's short last block arriving early (Ray hands blocks over as they finish), and one
    bad row in the first block. Counts the batches that had to be copied and the CPU it took."""
    from raypipe.pipeline.pack import BatchSpec, Packer

    def blocks(short_first: bool, bad_row: bool) -> list[dict]:
        sizes = [128] * 15 + [80]
        if short_first:
            sizes = [80] + sizes[:-1]
        out, start = [], 0
        for k, n in enumerate(sizes):
            ok = np.ones(n, bool)
            ok[0] = not (bad_row and k == 0)
            image = np.zeros((n, 224, 224, 3), np.uint8)
            image[:, ::8] = 1  # paged in, as Ray's blocks are
            empty = np.full(n, "", object)
            ids = np.arange(start, start + n)
            out.append({"image": image, "label": ids % 10, "sample_id": ids, "ok": ok, "reason": empty,
                        "detail": empty, "path": empty})  # fmt: skip
            start += n
        return out

    cases = (("clean epoch, short block last", False, False), ("short block first", True, False),
             ("one bad row in block 0", False, True))
    for label, short_first, bad in cases:
        epoch = blocks(short_first, bad)
        figures = []
        for _ in range(3):
            p, copied = Packer(BatchSpec(128, (224, 224, 3))), 0
            t0 = time.thread_time()
            for blk in epoch:
                for b in p.add(blk):
                    copied += not any(np.shares_memory(b["image"], x["image"]) for x in epoch)
            copied += sum(1 for _ in p.flush())
            figures.append((time.thread_time() - t0) * 1e3)
        print(f"{label:30s}: {copied:2d} of 16 batches copied, packing CPU {min(figures):.1f} ms per epoch (best of 3)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    for name, fn, needs_data in (("reads", reads, True), ("aa-import", aa_import, False),
                                 ("kernel-procs", kernel_procs, True), ("kernel-split", kernel_split, True),
                                 ("prefilter", prefilter, True),
                                 ("block-alloc", block_alloc, False), ("rng", rng, None),
                                 ("resize", resize, True), ("ray-null", ray_null, False),
                                 ("packer", packer, False)):  # fmt: skip
        sp = sub.add_parser(name)
        if needs_data:
            sp.add_argument("data")
        elif needs_data is None:
            sp.add_argument("data", nargs="?")
        if name == "ray-null":
            sp.add_argument("--runs", type=int, default=3, help="executions in a row (the first starts the workers)")
            sp.add_argument("--object-store-mb", type=int, help="the local cluster's object store (default: Ray's)")
        sp.set_defaults(fn=fn)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
