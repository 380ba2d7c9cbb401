"""Where the CPU goes per image when a source is read as ``raypipe run`` reads it, by process.

Runs ``Pipeline`` + ``EpochSource`` (RandomResizedCrop 224 + flip, batch 128, local workers) over one
source of a ``bench/cloud_input.py`` work folder, an unmeasured epoch first, and prints the images/s
of the measured epochs, how busy its cores were (``/proc/stat``), and the CPU milliseconds per image
of the driver, of the worker processes (user and system), and of the S3 test server where there is
one (``raypipe.testing.s3server`` in its own process, adding ``--latency-ms`` to every response)::

    python bench/cloud_input.py --images 3000 --epochs 1 --workdir /tmp/cloudbench   # makes the data
    python bench/cpu_account.py folder --workdir /tmp/cloudbench
    python bench/cpu_account.py s3-folder --workdir /tmp/cloudbench --latency-ms 20

``--server-cores N`` gives the server N cores of its own and the pipeline the others, as
``bench/cloud_input.py --server-cores`` does (compare with ``taskset -c 0 python bench/cpu_account.py
folder`` for a local source on the same one core).

On a machine whose cores are all busy, a contender's rate is the cores over its CPU per image, so the
milliseconds tell where a gap between two sources comes from: the reading workers' own extra CPU, or
the test server's, which a real object store does not take from the reader's machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

SOURCES = {"folder": "folder", "parquet": "parquet/train.parquet", "webdataset": "shards",
           "s3-folder": "folder", "s3-shards": "shards"}  # fmt: skip


def _busy(cores: set[int]) -> tuple[int, int]:
    """(all jiffies, idle + iowait jiffies) of ``cores`` so far."""
    total = idle = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                values = [int(v) for v in fields]
                total, idle = total + sum(values), idle + values[3] + values[4]
    return total, idle


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", choices=sorted(SOURCES))
    p.add_argument("--workdir", default="/tmp/cloudbench", help="a bench/cloud_input.py work folder")
    p.add_argument("--epochs", type=int, default=4, help="measured epochs, after an unmeasured one")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added before every S3 response")
    p.add_argument("--cpus-per-task", type=float, default=None, help="ExecutionConfig.cpus_per_task (default: its own)")
    p.add_argument("--server-cores", type=int, default=0,
                   help="cores of the S3 server's own; the pipeline gets the rest (as in bench/cloud_input.py)")
    a = p.parse_args()

    import psutil

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cloud_input import S3Process, keep_to, split_cores

    from raypipe import ExecutionConfig, Pipeline, PipelineConfig, TrainAugment
    from raypipe.pipeline import EpochSource
    from raypipe.sources import open_source

    buckets = Path(a.workdir) / "buckets"
    try:
        mine, server_cores = split_cores(a.server_cores)  # mine: the cores whose busy share is printed
    except ValueError as e:
        p.error(str(e))
    if server_cores:
        keep_to(mine)
    server = S3Process(buckets, a.latency_ms, server_cores) if a.source.startswith("s3-") else None
    try:
        if server is not None:
            rows = open_source(f"s3://bench/{SOURCES[a.source]}", filesystem=server.filesystem())
        else:
            rows = open_source(str(buckets / "bench" / SOURCES[a.source]))
        execution = ExecutionConfig(cpus_per_task=a.cpus_per_task)  # None: decided by the dataset
        pipe = Pipeline(rows, TrainAugment(input_size=224, color_jitter=None),
                        config=PipelineConfig(batch_size=128, seed=0), execution=execution)  # fmt: skip
        epochs = EpochSource(pipe, end_epoch=a.epochs + 1)
        me = psutil.Process()
        served = psutil.Process(server.proc.pid) if server is not None else None

        def cpu() -> tuple[float, float, float, float]:
            own = me.cpu_times()
            kids = [c.cpu_times() for c in me.children(recursive=True) if served is None or c.pid != served.pid]
            srv = sum(served.cpu_times()[:2]) if served is not None else 0.0
            return own.user + own.system, sum(k.user for k in kids), sum(k.system for k in kids), srv

        images = 0
        for epoch in range(a.epochs + 1):
            if epoch == 1:
                c0, b0, t0 = cpu(), _busy(mine), time.perf_counter()
            n = sum(len(batch["label"]) for batch in epochs)
            images += n if epoch else 0
        seconds = time.perf_counter() - t0
        c1, b1 = cpu(), _busy(mine)
        epochs.close()
    finally:
        if server is not None:
            server.stop()
    busy = 1 - (b1[1] - b0[1]) / max(1, b1[0] - b0[0])
    per = [1e3 * (x1 - x0) / images for x0, x1 in zip(c0, c1, strict=True)]
    print(f"{a.source}: {images / seconds:.0f} img/s over {a.epochs} epochs, its cores {100 * busy:.0f} % busy; "
          f"CPU ms per image: driver {per[0]:.2f}, workers {per[1] + per[2]:.2f} (user {per[1]:.2f}, system "
          f"{per[2]:.2f}), S3 server {per[3]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
