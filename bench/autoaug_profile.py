"""Auto-augment costs, CPU µs per 224 px image: one affine warp through Pillow, through the C extension
``raypipe.kernels._warp`` (scalar and AVX2 loops), and whole timm policies with and without it.

    python bench/autoaug_profile.py [--policy rand-m9-mstd0.5-inc1] [--seeds 400]

The policy rows apply the policy to one photo (skimage's astronaut) under ``--seeds`` different seeds,
so each op is drawn as often as in training; bench/NOTES.md (fifth session) has the figures.
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
    args = p.parse_args()

    from skimage import data

    from raypipe.kernels import autoaug

    photo = np.asarray(Image.fromarray(data.astronaut()).resize((224, 224), Image.Resampling.BILINEAR))
    warp = autoaug._warp
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
            warp.set_vector(False)
            scalar = cpu_us(call, args.reps)
            vector = f"AVX2 {cpu_us(call, args.reps):6.0f}" if warp.set_vector(True) else "no AVX2"
            row += f"   C scalar {scalar:6.0f}   C {vector}"
        print(row)
    if warp is None:
        print("  (the _warp extension is not built: Pillow only)")

    print(f"policy {args.policy}, CPU µs per image over {args.seeds} seeds")
    for interp in ("bilinear", "bicubic"):
        figures = []
        for use_c in (True, False):
            autoaug._warp = warp if use_c else None
            try:
                op = autoaug.build_auto_augment(args.policy, (224, 224), (0.485, 0.456, 0.406), interp)
                start = time.thread_time()
                for seed in range(args.seeds):
                    autoaug.apply_auto_augment(op, photo, seed)
                figures.append((time.thread_time() - start) / args.seeds * 1e6)
            finally:
                autoaug._warp = warp
        with_c = f"{figures[0]:6.0f}" if warp is not None else "   n/a"
        print(f"  {interp:8s} with _warp {with_c}   Pillow only {figures[1]:6.0f}")


if __name__ == "__main__":
    main()
