"""Per-epoch rates as a trainer sees them, through the README's Python API.

Each epoch is timed from the start of its loop to its last batch, epoch starts included, with
``FeederSource`` -> ``DeviceLoader`` on the CPU (fp32 normalised batches), RandomResizedCrop + flip,
raypipe's own defaults (``raypipe bench`` runs the same with every contender at the same priority)::

    python bench/photolike.py /tmp/photo4k --classes 8 --per-class 500
    python bench/epoch_rates.py /tmp/photo4k --epochs 6 -b 128

Prints every epoch's images/s and the summary of ``raypipe.benchmark.measure`` over epochs 2..N: the
aggregate rate (images over their summed seconds), the median epoch and the spread, the steady-state
rate, and the first batch from the start (Ray's start included).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="any source raypipe reads")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--aa", default=None, help="timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1")
    p.add_argument("--num-tasks", type=int, help="ExecutionConfig.num_tasks (default: the rank's share)")
    p.add_argument("--prefetch-chunks", type=int, default=2, help="ExecutionConfig.prefetch_chunks")
    p.add_argument("--worker-nice", type=int, default=10, help="ExecutionConfig.worker_nice")
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "ray", "local"),
        help="ExecutionConfig.backend: auto (the private local Ray's feeder on local worker processes) "
        "or ray (Ray tasks, as a rank on a cluster it joined)",
    )
    p.add_argument("--object-store-mb", type=int, help="the private local Ray's object store (default: Ray's)")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    started = time.perf_counter()

    import raypipe.runtime
    from raypipe import ExecutionConfig, FeederSource, Pipeline, PipelineConfig, TrainAugment, from_timm_args
    from raypipe.benchmark.measure import measure_epochs

    raypipe.runtime.connect(object_store_memory=a.object_store_mb << 20 if a.object_store_mb else None)
    pipe = Pipeline(
        a.data,
        TrainAugment(input_size=a.img_size, color_jitter=None, auto_augment=a.aa),
        config=PipelineConfig(batch_size=a.batch_size, seed=0),
        execution=ExecutionConfig(
            num_tasks=a.num_tasks, prefetch_chunks=a.prefetch_chunks, worker_nice=a.worker_nice, backend=a.backend
        ),
    )
    with from_timm_args(FeederSource(pipe, end_epoch=a.epochs), device="cpu", img_dtype="float32") as loader:
        r = measure_epochs(
            "raypipe",
            lambda epoch: loader,
            epochs=a.epochs,
            count=lambda b: int(b["image"].shape[0]),
            object_store=True,
            started=started,
            on_epoch=lambda e, n, s: print(f"epoch {e}: {n} images in {s:.2f} s = {n / s:.0f} img/s", flush=True),
        )
    print(
        f"epochs 2-{a.epochs}: {r.images_per_s:.0f} img/s, median epoch {r.median_rate:.0f}, spread "
        f"{100 * r.spread:.0f} % (slowest {min(r.epoch_rates):.0f}, fastest {max(r.epoch_rates):.0f}), steady "
        f"{r.steady_per_s:.0f}; first batch {r.first_batch_s:.2f} s from the start"
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r.as_dict(), fh, indent=1)


if __name__ == "__main__":
    main()
