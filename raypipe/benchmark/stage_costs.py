"""The CPU of the augmentation stage and its parts, per image: the stage in one process, the resize, the
per-sample generators, auto-augment, reads and imports; the measurements behind constants and code paths
in raypipe (the comments that cite them say which). ``python bench/profiles.py NAME --help`` runs each
(``register`` adds them to its command line).

CPU figures are per-thread (``time.thread_time``) unless said otherwise, so other processes on the
machine do not inflate them.
"""

from __future__ import annotations

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


# ---- stage -----------------------------------------------------------------------------------------


def _per_image(fn, n: int, repeat: int) -> float:
    fn()  # warm caches and lazy imports
    runs = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        runs.append((time.thread_time() - t0) / n * 1e6)
    return float(np.median(runs))


def stage(data: str, block_size: int = 128, img_size: int = 224, repeat: int = 3) -> None:
    """The augmentation stage in one process, CPU µs per image, and its JPEG decodes and hand-off to Ray.

    The stage with and without the partial JPEG decoder, where a JPEG decode spends its time, and what
    handing a block to Ray's object store costs.

    The first figures run one block again and again (its files and decoder state stay in the CPU's caches);
    "every row once" runs the stage over all of DATA in blocks, each image once, as the workers meet them::

        python bench/profiles.py stage /tmp/photo4k
    """
    import simplejpeg

    from raypipe.config import DecodeConfig, TrainAugment
    from raypipe.kernels import decode
    from raypipe.sources import open_source
    from raypipe.stages.augment import AugmentStage, StageSpec

    rows = open_source(data)
    table = rows.table.slice(0, block_size)
    block = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    n = len(block["sample_id"])
    aug = TrainAugment(input_size=img_size, color_jitter=None)
    spec = StageSpec(
        kind=rows.kind,
        root=rows.root,
        augment=aug,
        decode=DecodeConfig(),
        seed=0,
        epoch=0,
        image_column=rows.image_column,
    )

    print(f"augmentation stage, {n}-row block, RRC{img_size} + flip, CPU µs/image")
    region = decode._decode_region
    run_stage = AugmentStage(spec)
    with_region = _per_image(lambda: run_stage(block), n, repeat)
    decode._decode_region = None
    try:
        whole = _per_image(lambda: run_stage(block), n, repeat)
    finally:
        decode._decode_region = region
    print(f"  whole-image decodes   {whole:7.0f}")
    print(f"  partial decodes       {with_region:7.0f}" + ("" if region else "  (extension not built)"))
    every = {c: rows.table.column(c).to_numpy(zero_copy_only=False) for c in rows.table.column_names}
    t0 = time.thread_time()
    for start in range(0, len(rows), block_size):
        run_stage({c: col[start : start + block_size] for c, col in every.items()})
    once = (time.thread_time() - t0) / max(1, len(rows)) * 1e6
    print(f"  every row once ({len(rows)} images, partial decodes) {once:7.0f}")

    datas = [rows.root.read_bytes(str(path)) for path in block["path"]]
    heads = [simplejpeg.decode_jpeg_header(d) for d in datas]
    buf = np.empty(max(h * w * 3 for h, w, _, _ in heads), np.uint8)
    print("one JPEG decode, CPU µs/image")
    full = lambda: [simplejpeg.decode_jpeg(d, colorspace="RGB", buffer=buf) for d in datas]
    print(f"  simplejpeg, whole image{'':19}{_per_image(full, n, repeat):7.0f}")
    if region is not None:
        parts = {
            "whole image": lambda h, w: (0, 0, w, h),
            "top half": lambda h, w: (0, 0, w, h // 2),
            "bottom half": lambda h, w: (0, h // 2, w, h - h // 2),
            "left half of the columns": lambda h, w: (0, 0, w // 2, h),
            "centre 0.7 x 0.7": lambda h, w: (int(w * 0.15), int(h * 0.15), int(w * 0.7), int(h * 0.7)),
        }
        for name, box in parts.items():

            def run(box=box):
                for d, (h, w, _, _) in zip(datas, heads, strict=True):
                    region(d, 8, *box(h, w), buf, w * 3)

            print(f"  partial decode, {name:<26}{_per_image(run, n, repeat):7.0f}")

    import ray
    from ray.data.block import BlockAccessor

    from raypipe.runtime import connect

    connect(num_cpus=1)
    out = BlockAccessor.batch_to_block(run_stage(block))
    ray.put(out)
    t0 = time.perf_counter()
    for _ in range(repeat):
        ray.put(out)
    put_us = (time.perf_counter() - t0) / repeat / n * 1e6
    print(f"ray.put of one {n}-image output block: {put_us:.0f} µs/image (wall)")
    ray.shutdown()


# ---- autoaug ---------------------------------------------------------------------------------------


def autoaug(policy: str = "rand-m9-mstd0.5-inc1", seeds: int = 400, reps: int = 40, per_op: bool = False) -> None:
    """Auto-augment costs, CPU µs per 224 px image: one affine warp and whole timm policies.

    One affine warp through Pillow, through the C extension ``raypipe.kernels._warp`` (scalar, AVX2 and
    the fastest loops the CPU has: AVX-512 for bilinear), and whole timm policies with and without it::

        python bench/profiles.py autoaug [--policy rand-m9-mstd0.5-inc1] [--seeds 400] [--per-op]

    The policy rows apply the policy to one photo (the shipped astronaut sample photo) under ``--seeds``
    different seeds, so each op is drawn as often as in training: on arrays (raypipe's path with both
    extensions built), on PIL images with the C warps (policies with ops that have no array version), and
    Pillow alone.
    """
    from PIL import Image

    from raypipe.kernels import aa_arrays
    from raypipe.kernels import autoaug as aa
    from raypipe.sample_data import load_photo

    photo = np.asarray(load_photo("astronaut").resize((224, 224), Image.Resampling.BILINEAR))
    warp = aa_arrays._warp
    angle = -math.radians(25)  # a rotation about the centre, as Image.rotate builds it
    a = [math.cos(angle), math.sin(angle), 0.0, -math.sin(angle), math.cos(angle), 0.0]
    a[2], a[5] = a[0] * -112 + a[1] * -112 + 112, a[3] * -112 + a[4] * -112 + 112
    plain, src, out = Image.fromarray(photo), photo.tobytes(), np.empty_like(photo)
    print("one 224 px affine warp (rotate 25°), CPU µs")
    for name, flt in (("bilinear", Image.Resampling.BILINEAR), ("bicubic", Image.Resampling.BICUBIC)):
        pil = cpu_us(lambda f=flt: Image.Image.transform(plain, (224, 224), Image.Transform.AFFINE, a, f), reps)
        row = f"  {name:8s} Pillow {pil:6.0f}"
        if warp is not None:
            call = lambda f=flt: warp.affine_rgb(src, 224, 224, out, 224, 224, *a, int(f), b"\0\0\0")
            for level, label in ((0, "C scalar"), (2, "C AVX2"), (1, "C fastest")):
                on = warp.set_vector(level)
                if level == 0 or on:
                    path = f" ({warp.vector_path()})" if level == 1 else ""
                    row += f"   {label}{path} {cpu_us(call, reps):6.0f}"
            warp.set_vector(1)
        print(row)
    if warp is None:
        print("  (the _warp extension is not built: Pillow only)")

    print(f"policy {policy}, CPU µs per image over {seeds} seeds")
    colorops = aa_arrays._colorops
    setups = {  # (aa_arrays._warp, aa_arrays._colorops)
        "on arrays": (warp, colorops),  # what raypipe runs when both extensions are built
        "PIL images + _warp": (warp, None),
        "Pillow only": (None, None),
    }
    for interp in ("bilinear", "bicubic"):
        row = f"  {interp:8s}"
        for label, (w, ops) in setups.items():
            if label != "Pillow only" and (w is None or (label == "on arrays" and ops is None)):
                row += f"   {label}    n/a"
                continue
            aa_arrays._warp, aa_arrays._colorops = w, ops
            try:
                op = aa.build_auto_augment(policy, (224, 224), (0.485, 0.456, 0.406), interp)
                start = time.thread_time()
                for seed in range(seeds):
                    aa.apply_auto_augment(op, photo, seed)
                row += f"   {label} {(time.thread_time() - start) / seeds * 1e6:6.0f}"
            finally:
                aa_arrays._warp, aa_arrays._colorops = warp, colorops
        print(row)
    if per_op:
        _per_op(policy, seeds, photo)


def _per_op(policy: str, seeds: int, photo: np.ndarray) -> None:
    """Each op of the (bilinear) policy applied every time, magnitudes drawn as in training: on PIL images
    (the conversions in and out included, as apply_auto_augment pays them) and on arrays."""
    import random

    from raypipe.kernels import aa_arrays
    from raypipe.kernels import autoaug as aa

    op = aa.build_auto_augment(policy, (224, 224), (0.485, 0.456, 0.406), "bilinear")
    print(f"each op of {policy} (bilinear), applied every time, CPU µs per 224 px image")
    for o in aa._ops(op):
        prob, o.prob = o.prob, 1.0
        try:
            row = f"  {o.name:22s}"
            for label, wrap in (("PIL images", _on_pil), ("arrays", _on_array)):
                if label == "arrays" and not aa_arrays.available():
                    continue
                random.seed(0)
                row += f"   {label} {cpu_us(lambda w=wrap, o=o: w(o, photo), seeds // 4):6.0f}"
            print(row)
        finally:
            o.prob = prob


def _on_pil(o, photo: np.ndarray) -> np.ndarray:
    from PIL import Image

    out = o(Image.fromarray(photo, "RGB"))
    return np.asarray(out.convert("RGB") if out.mode != "RGB" else out)


def _on_array(o, photo: np.ndarray) -> np.ndarray:
    from raypipe.kernels import aa_arrays

    return o(aa_arrays.ArrayImage(photo)).array


# ---- reads, aa-import, rng, resize -----------------------------------------------------------------


def reads(data: str) -> None:
    """read_bytes per file of an image folder: the cached directory + O_NOFOLLOW against a full resolve."""
    from raypipe.sources import open_root
    from raypipe.sources.transport import paths

    root = open_root(data)
    files = [os.path.relpath(p, root.root) for p in sorted(glob.glob(os.path.join(root.root, "*", "*")))]

    def read_all():
        for f in files:
            root.read_bytes(f)

    cached = cpu_us(read_all, 2) / len(files)
    nofollow, paths._NOFOLLOW = paths._NOFOLLOW, None  # every read resolves the whole path
    try:
        full = cpu_us(read_all, 2) / len(files)
    finally:
        paths._NOFOLLOW = nofollow
    print(
        f"read_bytes over {len(files)} files, CPU µs/file: directory cached + O_NOFOLLOW {cached:.1f}, "
        f"full resolve {full:.1f}"
    )


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


def aa_import() -> None:
    """Building a rand-m9 policy in a fresh process: timm's module loaded alone, or through the timm package."""
    for name, prelude in (
        ("timm's module loaded alone (raypipe)", ""),
        ("through the timm package", "import timm.data.auto_augment"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", _BUILD.format(prelude=prelude)], capture_output=True, text=True, check=True
        ).stdout.strip()
        print(f"build a rand-m9 policy in a fresh process, {name}: {out}")


def rng(data: str | None = None) -> None:
    """sample_rng and its parts, and BlockRngs; with DATA, the stage with either per-sample generator."""
    from raypipe.kernels import sample_rng
    from raypipe.kernels.seeding import BlockRngs

    ss = np.random.SeedSequence([0, 3, 12345])
    block = BlockRngs(0, 3, np.arange(128))
    print(
        f"CPU µs: sample_rng {cpu_us(lambda: sample_rng(0, 3, 12345), 20000):.1f}, "
        f"SeedSequence {cpu_us(lambda: np.random.SeedSequence([0, 3, 12345]), 20000):.1f}, "
        f"PCG64 {cpu_us(lambda: np.random.PCG64(ss), 20000):.1f}; BlockRngs per 128-id block "
        f"{cpu_us(lambda: BlockRngs(0, 3, np.arange(128)), 300):.0f}, "
        f"get {cpu_us(lambda: block.get(5), 20000):.1f}"
    )
    if data:
        _stage_with_and_without_block_rngs(data)


def _stage_with_and_without_block_rngs(data: str) -> None:
    """The augmentation stage over 4 x 128 files, per-sample generators from BlockRngs vs sample_rng."""
    from raypipe.config import DecodeConfig, TrainAugment
    from raypipe.kernels import sample_rng
    from raypipe.sources.transport.paths import DatasetRoot
    from raypipe.stages import augment
    from raypipe.stages.augment import AugmentStage, StageSpec

    root = DatasetRoot(os.path.realpath(data))
    files = sorted(glob.glob(os.path.join(root.root, "*", "*")))[:512]
    spec = StageSpec(
        kind="folder",
        root=root,
        augment=TrainAugment(input_size=224, color_jitter=None),
        decode=DecodeConfig(),
        seed=0,
        epoch=1,
    )
    stage = AugmentStage(spec)
    blocks = [
        {
            "sample_id": np.arange(i, i + 128),
            "path": np.array([os.path.relpath(f, root.root) for f in files[i : i + 128]], dtype=object),
            "label": np.zeros(128, np.int64),
            "row": np.zeros(128, np.int64),
        }
        for i in range(0, 512, 128)
    ]

    class PerSample:  # one sample_rng per image
        def __init__(self, seed, epoch, ids):
            self.seed, self.epoch, self.ids = seed, epoch, ids

        def get(self, i):
            return sample_rng(self.seed, self.epoch, int(self.ids[i]))

    def run():
        for b in blocks:
            stage(b)

    figures = {}
    block_rngs = augment.BlockRngs
    try:
        for name, cls in (("BlockRngs", block_rngs), ("sample_rng", PerSample)) * 2:
            augment.BlockRngs = cls
            figures.setdefault(name, []).append(cpu_us(run, 2) / 512)
    finally:
        augment.BlockRngs = block_rngs
    print(
        "stage CPU µs/img (two passes each, alternating): "
        + ", ".join(f"{k} {' / '.join(f'{v:.0f}' for v in vs)}" for k, vs in figures.items())
    )


def resize(data: str) -> None:
    """Crop + resize to 224 px: Pillow, raypipe's C resample (fastest, AVX2, scalar) and the Pillow fallback."""
    from PIL import Image

    img = np.asarray(Image.open(sorted(glob.glob(os.path.join(data, "*", "*")))[0]).convert("RGB"))
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


# ---- the command line ------------------------------------------------------------------------------


def register(add) -> None:
    """Add this module's measurements to ``bench/profiles.py``: ``add(name, fn)`` returns the subcommand's
    parser, whose options are ``fn``'s keyword arguments."""
    p = add("stage", stage)
    p.add_argument("data", help="any source raypipe reads")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--repeat", type=int, default=3)

    p = add("autoaug", autoaug)
    p.add_argument("--policy", default="rand-m9-mstd0.5-inc1")
    p.add_argument("--seeds", type=int, default=400)
    p.add_argument("--reps", type=int, default=40, help="warps per timing")
    p.add_argument("--per-op", action="store_true", help="also each op of the policy, always applied")

    add("reads", reads).add_argument("data", help="an image folder")
    add("aa-import", aa_import)
    add("rng", rng).add_argument("data", nargs="?", help="an image folder: also the stage with either")
    add("resize", resize).add_argument("data", help="an image folder")
