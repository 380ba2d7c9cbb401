"""Where a run's first batch goes, after the imports a training script pays anyway: Ray's start
(``raypipe.connect()``), the listing (``Pipeline``), the feeder (``FeederSource``) and the first batch
out of a ``DeviceLoader`` on the CPU (a fresh worker's start, the first chunk, the feeder's pack)::

    python bench/first_batch.py /tmp/photo4k

This is the path that waits for Ray (``connect()``, a ``FeederSource``). ``raypipe bench`` reports the
first batch of the timm drop-in, which starts Ray in the background and makes its first chunks in the
trainer's process meanwhile, beside timm's.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="any source raypipe reads")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    a = p.parse_args()

    import torch  # noqa: F401 - a training script has imported it before its loader starts

    import raypipe.runtime
    from raypipe import DeviceLoader, ExecutionConfig, FeederSource, Pipeline, PipelineConfig, TrainAugment

    marks = [("start", time.perf_counter())]
    raypipe.runtime.connect()
    marks.append(("Ray's start", time.perf_counter()))
    pipe = Pipeline(a.data, TrainAugment(input_size=a.img_size, color_jitter=None),
                    config=PipelineConfig(batch_size=a.batch_size),
                    execution=ExecutionConfig(worker_nice=0))  # fmt: skip
    marks.append(("listing (Pipeline)", time.perf_counter()))
    source = FeederSource(pipe, end_epoch=1)
    marks.append(("FeederSource", time.perf_counter()))
    with DeviceLoader.from_timm(source, device="cpu", img_dtype="float32") as loader:
        next(iter(loader))
        marks.append(("first batch", time.perf_counter()))
    for (_, before), (what, at) in zip(marks[:-1], marks[1:], strict=True):
        print(f"{what:<20} {at - before:6.2f} s")
    print(f"{'total':<20} {marks[-1][1] - marks[0][1]:6.2f} s")


if __name__ == "__main__":
    main()
