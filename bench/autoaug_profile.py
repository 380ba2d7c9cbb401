"""Auto-augment costs, CPU µs per 224 px image: one affine warp through Pillow, through the C extension
``raypipe.kernels._warp`` (scalar, AVX2 and the fastest loops the CPU has: AVX-512 for bilinear), and whole
timm policies with and without it.

    python bench/autoaug_profile.py [--policy rand-m9-mstd0.5-inc1] [--seeds 400] [--per-op]

The policy rows apply the policy to one photo (the shipped astronaut sample photo) under ``--seeds`` different seeds,
so each op is drawn as often as in training: on arrays (raypipe's path with both extensions built), on PIL
images with the C warps (policies with ops that have no array version), and Pillow alone.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from micro_profile import cpu_us  # bench/ is on sys.path when run as a script
from PIL import Image


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="rand-m9-mstd0.5-inc1")
    p.add_argument("--seeds", type=int, default=400)
    p.add_argument("--reps", type=int, default=40, help="warps per timing")
    p.add_argument("--per-op", action="store_true", help="also each op of the policy, always applied")
    args = p.parse_args()

    from raypipe.kernels import aa_arrays, autoaug
    from raypipe.sample_data import load_photo

    photo = np.asarray(load_photo("astronaut").resize((224, 224), Image.Resampling.BILINEAR))
    warp = aa_arrays._warp
    angle = -math.radians(25)  # a rotation about the centre, as Image.rotate builds it
    a = [math.cos(angle), math.sin(angle), 0.0, -math.sin(angle), math.cos(angle), 0.0]
    a[2], a[5] = a[0] * -112 + a[1] * -112 + 112, a[3] * -112 + a[4] * -112 + 112
    plain, src, out = Image.fromarray(photo), photo.tobytes(), np.empty_like(photo)
    print("one 224 px affine warp (rotate 25°), CPU µs")
    for name, flt in (("bilinear", Image.Resampling.BILINEAR), ("bicubic", Image.Resampling.BICUBIC)):
        pil = cpu_us(lambda f=flt: Image.Image.transform(plain, (224, 224), Image.Transform.AFFINE, a, f), args.reps)
        row = f"  {name:8s} Pillow {pil:6.0f}"
        if warp is not None:
            call = lambda f=flt: warp.affine_rgb(src, 224, 224, out, 224, 224, *a, int(f), b"\0\0\0")
            for level, label in ((0, "C scalar"), (2, "C AVX2"), (1, "C fastest")):
                on = warp.set_vector(level)
                if level == 0 or on:
                    path = f" ({warp.vector_path()})" if level == 1 else ""
                    row += f"   {label}{path} {cpu_us(call, args.reps):6.0f}"
            warp.set_vector(1)
        print(row)
    if warp is None:
        print("  (the _warp extension is not built: Pillow only)")

    print(f"policy {args.policy}, CPU µs per image over {args.seeds} seeds")
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
                op = autoaug.build_auto_augment(args.policy, (224, 224), (0.485, 0.456, 0.406), interp)
                start = time.thread_time()
                for seed in range(args.seeds):
                    autoaug.apply_auto_augment(op, photo, seed)
                row += f"   {label} {(time.thread_time() - start) / args.seeds * 1e6:6.0f}"
            finally:
                aa_arrays._warp, aa_arrays._colorops = warp, colorops
        print(row)
    if args.per_op:
        _per_op(args, photo)


def _per_op(args, photo: np.ndarray) -> None:
    """Each op of the (bilinear) policy applied every time, magnitudes drawn as in training: on PIL images
    (the conversions in and out included, as apply_auto_augment pays them) and on arrays."""
    import random

    from raypipe.kernels import aa_arrays, autoaug

    op = autoaug.build_auto_augment(args.policy, (224, 224), (0.485, 0.456, 0.406), "bilinear")
    print(f"each op of {args.policy} (bilinear), applied every time, CPU µs per 224 px image")
    for o in autoaug._ops(op):
        prob, o.prob = o.prob, 1.0
        try:
            row = f"  {o.name:22s}"
            for label, wrap in (("PIL images", _on_pil), ("arrays", _on_array)):
                if label == "arrays" and not aa_arrays.available():
                    continue
                random.seed(0)
                row += f"   {label} {cpu_us(lambda w=wrap, o=o: w(o, photo), args.seeds // 4):6.0f}"
            print(row)
        finally:
            o.prob = prob


def _on_pil(o, photo: np.ndarray) -> np.ndarray:

    out = o(Image.fromarray(photo, "RGB"))
    return np.asarray(out.convert("RGB") if out.mode != "RGB" else out)


def _on_array(o, photo: np.ndarray) -> np.ndarray:
    from raypipe.kernels import aa_arrays

    return o(aa_arrays.ArrayImage(photo)).array


if __name__ == "__main__":
    main()
