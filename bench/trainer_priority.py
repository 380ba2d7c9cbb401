"""An emulated GPU trainer fed by raypipe on this machine: does the workers' niceness matter?

A GPU training step is a short burst of CPU (the loop dispatching kernels) and then a wait for the
GPU; any delay in the burst leaves the GPU idle. Here each step burns ``--cpu-ms`` of CPU in this
process (GIL-free, like dispatch) and then sleeps ``--gpu-ms``. The batches come through a
``FeederSource`` as in the training job. For each ``--nice`` value it prints images/s, the
emulated GPU's busy share and the step's mean CPU-burst time (its ideal is ``--cpu-ms``)::

    python bench/trainer_priority.py DATA --nice 0 10
"""

from __future__ import annotations

import argparse
import hashlib
import time


def burn(ms: float, buf: bytes, per_call_s: float) -> None:
    for _ in range(max(1, round(ms / 1e3 / per_call_s))):
        hashlib.sha256(buf).digest()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--nice", type=int, nargs="+", default=[0, 10])
    p.add_argument("--cpu-ms", type=float, default=30.0)
    p.add_argument("--gpu-ms", type=float, default=90.0)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)

    from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
    from raypipe.pipeline import FeederSource, Pipeline
    from raypipe.runtime import connect

    connect()
    buf = bytes(1 << 16)
    t0 = time.perf_counter()
    for _ in range(200):
        hashlib.sha256(buf).digest()
    per_call = (time.perf_counter() - t0) / 200
    aug = TrainAugment(input_size=224, color_jitter=None)
    for nice in args.nice:
        pipe = Pipeline(args.data, aug, config=PipelineConfig(batch_size=args.batch_size),
                        execution=ExecutionConfig(worker_nice=nice))  # fmt: skip
        source = FeederSource(pipe, end_epoch=args.epochs)
        try:
            list(source)  # warm-up epoch: workers started, imports done
            images, busy, bursts, steps = 0, 0.0, 0.0, 0
            t0 = time.perf_counter()
            for _ in range(args.epochs - 1):
                for b in source:
                    c0 = time.perf_counter()
                    burn(args.cpu_ms, buf, per_call)
                    bursts += time.perf_counter() - c0
                    time.sleep(args.gpu_ms / 1e3)
                    busy += args.gpu_ms / 1e3
                    images += len(b["label"])
                    steps += 1
            elapsed = time.perf_counter() - t0
        finally:
            source.close()
        print(f"worker_nice {nice:2d}: {images / elapsed:6.0f} img/s  emulated GPU busy {100 * busy / elapsed:4.0f} %  "
              f"CPU burst {1e3 * bursts / steps:5.1f} ms (ideal {args.cpu_ms:.0f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
