"""What mixing costs: two parts read alone, one after the other, against their ``Mixture`` taking every
row of each once per epoch (the same images, the same work), on local worker processes
(``ExecutionConfig(backend="local")``, ``EpochSource``: the exact uint8 batches a GPU trainer
receives)::

    python bench/mixture.py /tmp/photos /tmp/mixture --rounds 3 --epochs 3 -b 128 --img-size 224

The first argument is an image folder (class folders of JPEGs: ``raypipe sample-data``'s photos, or
your own). Its images, sorted, are split once into two parts under the second argument (reused when
there): A, WebDataset shards of the first half (``KEY.jpg`` + ``KEY.cls``), and B, one Parquet file of
the other half (``image`` bytes and an int ``label``, row groups of 256 rows, as ``raypipe convert``
writes). Every run augments with ``TrainAugment(input_size=S, color_jitter=None)``: RandomResizedCrop
and a flip.

Each round, in turn: (a) the parts alone, A's epochs then B's, timing only the epochs after each run's
first (a warm-up): parts alone img/s = their images / their time together; (b) the mixture
``Mixture([(A, len(A)), (B, len(B))])`` for as many epochs, timed alike. The ratio is mixture / parts
alone. Each epoch's report must account every row as emitted, else the script fails.

Read alone, B's chunks are whole shard windows (its row groups read once an epoch); in the mixture its
rows come in chunks of ``chunk_rows`` interleaved with A's, each reading the row groups it touches:
part of what mixing costs, measured here. Give B several windows (2048 rows each) per worker for its
run alone to fill the workers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tarfile
import time
from io import BytesIO
from pathlib import Path

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def write_parts(photos: Path, work: Path, per_shard: int = 200) -> tuple[Path, Path]:
    """Part A (WebDataset shards of the first half of ``photos``' images) and part B (a Parquet file of
    the other half) under ``work``, written once; labels are the class folders' sorted indexes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards, parquet = work / "part-a-shards", work / "part-b.parquet"
    if parquet.exists() and any(shards.glob("*.tar")):
        return shards, parquet
    files = sorted(p for p in photos.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if len(files) < 2:
        raise SystemExit(f"{photos}: found {len(files)} images, need at least 2 (class folders of JPEGs)")
    classes = {c: i for i, c in enumerate(sorted({p.parent.name for p in files}))}
    half = len(files) // 2
    shards.mkdir(parents=True, exist_ok=True)
    for s in range(0, half, per_shard):
        with tarfile.open(shards / f"part-a-{s // per_shard:05d}.tar", "w") as tar:
            for k, path in enumerate(files[s : min(s + per_shard, half)], start=s):
                for name, data in (
                    (f"{k:08d}.jpg", path.read_bytes()),
                    (f"{k:08d}.cls", str(classes[path.parent.name]).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, BytesIO(data))
    rest = files[half:]
    table = pa.table(
        {
            "image": pa.array([p.read_bytes() for p in rest], pa.binary()),
            "label": pa.array([classes[p.parent.name] for p in rest], pa.int64()),
        }
    )
    tmp = parquet.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=256, compression="none")
    os.replace(tmp, parquet)
    print(f"wrote part A: {half} images in {shards}, part B: {len(rest)} images in {parquet}")
    return shards, parquet


def epochs_rate(source, a) -> tuple[int, float]:
    """(images, seconds) of the epochs after the first, one stream (as a training run's), local workers.
    Each epoch is checked: its report accounts every row as emitted, and its batches hold each row of
    each part once."""
    import numpy as np

    from raypipe import EpochSource, ExecutionConfig, Pipeline, PipelineConfig, TrainAugment

    pipe = Pipeline(
        source,
        TrainAugment(input_size=a.img_size, color_jitter=None),
        config=PipelineConfig(batch_size=a.batch_size, drop_last=False),
        execution=ExecutionConfig(backend="local", num_tasks=a.num_tasks, worker_nice=0, worker_sched_idle=False),
    )
    sizes = getattr(pipe.rows, "sizes", (len(pipe),))
    every_row = np.concatenate([np.arange(n) + (i << 40) for i, n in enumerate(sizes)])
    stream = EpochSource(pipe, end_epoch=a.epochs)
    images, began, keys = 0, 0.0, [[] for _ in range(a.epochs)]
    try:
        for epoch in range(a.epochs):
            for batch in stream:
                part = np.asarray(batch.get("source", 0), np.int64)  # the mixture's part; 0 alone
                keys[epoch].append(np.asarray(batch["sample_id"], np.int64) + (part << 40))
                if epoch > 0:
                    images += len(batch["sample_id"])
            if epoch == 0:
                began = time.perf_counter()
        seconds = time.perf_counter() - began
    finally:
        stream.close()
    for epoch, seen in enumerate(keys):
        if not np.array_equal(np.sort(np.concatenate(seen)), every_row):
            raise SystemExit(f"epoch {epoch}: its batches do not hold each row of each part once")
    if len(stream.reports) != a.epochs:
        raise SystemExit(f"{len(stream.reports)} epoch reports, {a.epochs} epochs run")
    for report in stream.reports:
        if report.emitted != report.expected or report.expected != len(every_row):
            raise SystemExit(
                f"epoch {report.epoch}: {report.emitted} of {report.expected} rows emitted, {len(every_row)} in "
                f"the parts (skipped {report.skipped})"
            )
    return images, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("photos", type=Path, help="an image folder (class folders)")
    p.add_argument("work", type=Path, help="where the two parts are (written once)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="per run, the first a warm-up")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--num-tasks", type=int, default=None, help="local workers (default: this machine's share)")
    a = p.parse_args()
    if a.epochs < 2:
        p.error("--epochs must be at least 2 (the first is a warm-up)")
    from raypipe import Mixture, open_source

    shards, parquet = write_parts(a.photos, a.work)
    part_a, part_b = open_source(str(shards)), open_source(str(parquet))
    mixture = Mixture([(part_a, len(part_a)), (part_b, len(part_b))])
    workers = a.num_tasks or "auto"
    print(
        f"path: local workers (EpochSource), {os.cpu_count()} cores, workers {workers}, batch {a.batch_size}, "
        f"{a.img_size} px; part A {len(part_a)} rows (WebDataset), part B {len(part_b)} rows (Parquet)"
    )
    ratios = []
    for r in range(a.rounds):
        alone = [epochs_rate(part, a) for part in (part_a, part_b)]
        alone_rate = sum(n for n, _ in alone) / sum(s for _, s in alone)
        mixed, seconds = epochs_rate(mixture, a)
        ratios.append(mixed / seconds / alone_rate)
        rates = f"parts alone {alone_rate:7.0f} img/s  mixture {mixed / seconds:7.0f} img/s"
        print(f"round {r}: {rates}  ratio {ratios[-1]:.3f}")
    print(f"checked: each epoch emitted every row once (the mixture's: {len(part_a)} + {len(part_b)} rows)")
    print(f"median ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
