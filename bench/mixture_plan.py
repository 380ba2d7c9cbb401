"""What a mixture of a billion-sample indexed WebDataset and an ImageNet-sized Parquet file costs to plan
its first epoch, in seconds and memory, in one process (no image is read)::

    python bench/mixture_plan.py --samples 1000000000 --per-shard 10000 --parquet-rows 1281167 \\
        --world-size 8 /tmp/raypipe-mixture-plan

Writes once under WORK_DIR (reused when there, small on disk): the WebDataset, ``--samples /
--per-shard`` empty ``.tar`` files with raypipe's index of ``--per-shard`` samples each, its footer
alone (``raypipe.benchmark.listing.write_shard_dataset``: all that a listing by shard and a plan read);
and a Parquet file of ``--parquet-rows`` rows (one tiny JPEG's bytes in every row, int labels, row
groups of 256 rows, as ``raypipe convert`` writes). The data is written in a child process, so the
measuring process's peak memory is its own.

Then, timed step by step: each part listed (``open_source``: the WebDataset by shard), the mixture
listed from them (``list_mixture``, weights the parts' sizes unless ``--weights``), the ``Pipeline``
over it and its identity (the parts' digests, as a saved position needs), and for rank 0 and the last
rank of ``--world-size``: its plan, epoch 0's order, its chunks and its first chunk's takes (what a
stream sends first). Prints each step's seconds, the process's peak RSS (``getrusage``) after listing
and after planning, and ``plan first epoch: X.XX s (listing Y.YY s), peak RSS Z MB``. The goal: the plan
after listing within 30 s, and memory about the parts' listings.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time
from pathlib import Path

PARQUET_GROUP_ROWS = 256


def write_parquet(path: Path, rows: int) -> Path:
    """``rows`` rows of one tiny JPEG's bytes and labels ``k % 1000`` (dictionary-encoded: a few MB)."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    if path.exists():
        return path
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 80, 40)).save(buf, format="JPEG")
    jpeg = buf.getvalue()
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
    tmp = path.with_suffix(".tmp")
    step = 64 * PARQUET_GROUP_ROWS
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            table = pa.table({"image": pa.array([jpeg] * n, pa.binary()), "label": np.arange(lo, lo + n) % 1000})
            writer.write_table(table.cast(schema), row_group_size=PARQUET_GROUP_ROWS)
    tmp.rename(path)
    return path


def write_parts(work: Path, samples: int, per_shard: int, parquet_rows: int) -> tuple[Path, Path]:
    from raypipe.benchmark.listing import write_shard_dataset

    shards = samples // per_shard
    wds = write_shard_dataset(work / f"wds-{shards}x{per_shard}", shards, per_shard, member_rows=False)
    return wds, write_parquet(work / f"parquet-{parquet_rows}.parquet", parquet_rows)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def held_mb() -> float:
    """The process's resident memory now (Linux's /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path, nargs="?", default=Path("/tmp/raypipe-mixture-plan"))
    p.add_argument("--samples", type=int, default=1_000_000_000, help="the WebDataset's samples")
    p.add_argument("--per-shard", type=int, default=10_000)
    p.add_argument("--parquet-rows", type=int, default=1_281_167, help="default: ImageNet-1k's")
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--weights", type=float, nargs=2, default=None, help="WebDataset, Parquet (default: sizes)")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    a = p.parse_args()
    if a.samples < a.per_shard or a.samples % a.per_shard:
        p.error(f"--samples {a.samples} must be a multiple of --per-shard {a.per_shard}")
    a.work.mkdir(parents=True, exist_ok=True)
    child = multiprocessing.get_context("spawn").Process(
        target=write_parts, args=(a.work, a.samples, a.per_shard, a.parquet_rows)
    )
    child.start()
    child.join()
    if child.exitcode:
        raise SystemExit(f"writing the data under {a.work} failed (exit {child.exitcode})")
    wds = a.work / f"wds-{a.samples // a.per_shard}x{a.per_shard}"
    parquet = a.work / f"parquet-{a.parquet_rows}.parquet"

    from raypipe import ExecutionConfig, Mixture, Pipeline, PipelineConfig, TrainAugment, open_source
    from raypipe.sources.mixture import list_mixture

    print(f"after imports: peak RSS {peak_mb():.0f} MB, held {held_mb():.0f} MB")
    steps: dict[str, float] = {}

    def timed(name: str, fn):
        t0 = time.perf_counter()
        out = fn()
        steps[name] = time.perf_counter() - t0
        print(f"{name:<34} {steps[name]:8.3f} s")
        return out

    wds_rows = timed("list WebDataset by shard", lambda: open_source(str(wds), by_shard=True))
    pq_rows = timed("list Parquet", lambda: open_source(str(parquet)))
    weights = a.weights or (len(wds_rows), len(pq_rows))
    mixture = Mixture([(wds_rows, weights[0]), (pq_rows, weights[1])])
    rows = timed("list_mixture", lambda: list_mixture(mixture, open_source))
    listing_s, listing_mb, listing_held = sum(steps.values()), peak_mb(), held_mb()
    print(
        f"listed: {rows.sizes[0]:,} samples in {wds_rows.num_shards:,} shards + {rows.sizes[1]:,} rows, takes "
        f"{rows.takes}; peak RSS {listing_mb:.0f} MB, held {listing_held:.0f} MB"
    )
    pipe = timed(
        "Pipeline",
        lambda: Pipeline(
            rows,
            TrainAugment(),
            config=PipelineConfig(batch_size=a.batch_size),
            execution=ExecutionConfig(backend="local"),
        ),
    )
    timed("identity (digests)", pipe.identity)
    for rank in sorted({0, a.world_size - 1}):
        plan = timed(f"rank {rank}: plan", lambda rank=rank: pipe.plan(rank, a.world_size))
        timed(f"rank {rank}: epoch 0's order", lambda plan=plan: plan.order(0))
        chunks = timed(f"rank {rank}: chunks", lambda plan=plan: plan.chunks(0, ramp=True))
        takes = timed(f"rank {rank}: first chunk's takes", lambda chunks=chunks: chunks[0])
        counts = [int((takes["part"] == i).sum()) for i in range(len(rows.sizes))]
        print(f"  {len(plan):,} rows in {len(chunks):,} chunks; the first {len(takes)} takes, per part {counts}")
    plan_s = sum(steps.values()) - listing_s
    print(
        f"peak RSS after listing {listing_mb:.0f} MB (held {listing_held:.0f} MB), after planning {peak_mb():.0f} "
        f"MB (held {held_mb():.0f} MB)"
    )
    print(f"plan first epoch: {plan_s:.2f} s (listing {listing_s:.2f} s), peak RSS {peak_mb():.0f} MB")


if __name__ == "__main__":
    main()
