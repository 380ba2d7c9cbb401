"""Per-epoch rates as a trainer sees them, through the README's Python API.

Each epoch is timed from the start of its loop to its last batch, epoch starts included, with
``FeederSource`` -> ``DeviceLoader`` on the CPU (fp32 normalised batches), RandomResizedCrop + flip::

    python bench/photolike.py /tmp/photo4k --classes 8 --per-class 500
    python bench/epoch_rates.py /tmp/photo4k --epochs 6 -b 128

Prints every epoch's images/s, the slowest and fastest of epochs 2..N against each other, and the
aggregate rate of epochs 2..N (images over their summed seconds).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--aa", default=None, help="timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1")
    p.add_argument("--num-tasks", type=int, help="ExecutionConfig.num_tasks (default: the rank's share)")
    p.add_argument("--prefetch-chunks", type=int, default=2, help="ExecutionConfig.prefetch_chunks")
    p.add_argument("--object-store-mb", type=int, help="the private local Ray's object store (default: Ray's)")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()

    import raypipe.runtime
    from raypipe import DeviceLoader, ExecutionConfig, FeederSource, Pipeline, PipelineConfig, TrainAugment

    raypipe.runtime.connect(object_store_memory=a.object_store_mb << 20 if a.object_store_mb else None)
    pipe = Pipeline(
        a.data,
        TrainAugment(input_size=a.img_size, color_jitter=None, auto_augment=a.aa),
        config=PipelineConfig(batch_size=a.batch_size, seed=0),
        execution=ExecutionConfig(num_tasks=a.num_tasks, prefetch_chunks=a.prefetch_chunks),
    )
    source = FeederSource(pipe, end_epoch=a.epochs)
    rates, seconds, images = [], [], []
    with DeviceLoader.from_timm(source, device="cpu", img_dtype="float32") as loader:
        for epoch in range(a.epochs):
            t0, n = time.perf_counter(), 0
            for batch in loader:
                n += int(batch["image"].shape[0])
            dt = time.perf_counter() - t0
            rates.append(n / dt)
            seconds.append(dt)
            images.append(n)
            print(f"epoch {epoch}: {n} images in {dt:.2f} s = {n / dt:.0f} img/s", flush=True)
    later = rates[1:]
    agg = sum(images[1:]) / sum(seconds[1:]) if len(rates) > 1 else rates[0]
    spread = max(later) / min(later) - 1 if later else 0.0
    print(f"epochs 2-{a.epochs}: aggregate {agg:.0f} img/s, slowest {min(later):.0f}, fastest {max(later):.0f} "
          f"(slowest = {100 * min(later) / max(later):.1f} % of fastest)")  # fmt: skip
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rates": rates, "aggregate": agg, "spread": spread}, fh, indent=1)


if __name__ == "__main__":
    main()
