"""What a listing and an epoch's plan cost at ImageNet scale: a synthetic CSV manifest of N rows
(``n01440764/n01440764_10026.JPEG``-like paths, class names as labels), listed in a fresh process
(seconds, the table's bytes per row, the process's resident and peak memory), the listing turned into
the columns a ``Pipeline`` takes each chunk's rows from (``Pipeline.columns()``, then one chunk's rows),
and, in another fresh process, one epoch's
order, rank slice and chunks (``RankPlan``) for one rank of a world. ``python bench/profiles.py
listing-cost --help`` runs it (``register`` adds it to that command line).

Memory is read from ``/proc/self/status``: ``VmRSS`` now, ``VmHWM`` the peak since the baseline (the
peak is reset after the imports by writing ``5`` to ``/proc/self/clear_refs``), so neither the
interpreter nor the imports count against the listing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

IMAGENET_1K = 1_281_167
IMAGENET_21K = 14_197_122
_CLASSES_1K, _CLASSES_21K = 1000, 21841


def write_manifest(path: Path, rows: int, *, labels: str = "names", classes: int | None = None) -> Path:
    """A CSV manifest ``path,label`` of ``rows`` rows spread evenly over ``classes`` ImageNet-like class
    folders (``n0…`` names, 1000 by default up to ImageNet-1k's size, else ImageNet-21k's 21841); the
    label is the class name (``labels="names"``) or its index (``"ints"``). Kept and reused when a file
    of that size and kind is there already."""
    if labels not in ("names", "ints"):
        raise ValueError(f"labels={labels!r}: expected 'names' or 'ints'")
    classes = classes or (_CLASSES_1K if rows <= IMAGENET_1K else _CLASSES_21K)
    path = Path(path)
    if path.exists():
        return path
    tmp = path.with_suffix(".tmp")
    per, extra = divmod(rows, classes)
    with open(tmp, "w") as f:
        f.write("path,label\n")
        for c in range(classes):
            wnid = f"n{1440764 + 3517 * c:08d}"
            label = wnid if labels == "names" else str(c)
            count = per + (1 if c < extra else 0)
            f.write("".join(f"{wnid}/{wnid}_{10000 + j}.JPEG,{label}\n" for j in range(count)))
    os.replace(tmp, path)
    return path


def _status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> int:
    """Reset the peak to the resident memory now (Linux ≥ 4.0); the baseline's bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status()["VmRSS"]


def _listing_child(manifest: str, chunk_rows: int = 128) -> dict:
    import gc

    import numpy as np

    from raypipe.config import TrainAugment
    from raypipe.pipeline.pipeline import Pipeline
    from raypipe.sources import open_source

    base = _reset_peak()
    t0 = time.perf_counter()
    rows = open_source(manifest)
    seconds = time.perf_counter() - t0
    gc.collect()
    after, peak = _status()["VmRSS"], _status()["VmHWM"]
    n = len(rows)
    table_bytes = rows.table.get_total_buffer_size()
    out = {
        "rows": n,
        "seconds": seconds,
        "columns": rows.table.column_names,
        "table_bytes": table_bytes,
        "resident_bytes": after - base,
        "peak_bytes": peak - base,
    }
    pipeline = Pipeline(rows, TrainAugment())
    idx = np.random.default_rng(0).permutation(n)[:chunk_rows]  # a global shuffle's chunk
    base = _reset_peak()
    t0 = time.perf_counter()
    columns = pipeline.columns()
    out["columns_seconds"] = time.perf_counter() - t0
    gc.collect()
    out["columns_resident_bytes"] = _status()["VmRSS"] - base
    out["columns_peak_bytes"] = _status()["VmHWM"] - base
    t0 = time.perf_counter()
    columns.take(idx)
    out["chunk_rows"], out["chunk_seconds"] = len(idx), time.perf_counter() - t0
    return out


def _plan_child(n: int, world_size: int, chunk_rows: int, shard_rows: int) -> dict:
    import numpy as np

    from raypipe.plan.order import RankPlan

    shards = np.arange(n, dtype=np.int64) // shard_rows if shard_rows else None
    base = _reset_peak()
    t0 = time.perf_counter()
    plan = RankPlan(n, seed=0, shuffle=True, chunk_rows=chunk_rows, rank=0, world_size=world_size, shards=shards)
    chunks = plan.chunks(0)
    seconds = time.perf_counter() - t0
    return {
        "rows": n,
        "rank_rows": len(plan),
        "chunks": len(chunks),
        "seconds": seconds,
        "peak_bytes": _status()["VmHWM"] - base,
        "held_bytes": _status()["VmRSS"] - base,
    }


def write_shard_dataset(folder: Path, shards: int, per_shard: int, *, member_rows: bool) -> Path:
    """A synthetic indexed WebDataset under ``folder``: ``shards`` empty ``.tar`` files and raypipe's index
    of ``per_shard`` samples each (no image data). ``member_rows``: the index holds every sample's row
    (offsets, sizes, labels), as a real one does; else its footer alone (``write_index(…, member_rows=False)``),
    which is all a listing by shard and the plan read. Kept and reused when there already."""
    import numpy as np

    from raypipe.sources.indexes.shard_index import INDEX_NAME, ShardRecord, write_index
    from raypipe.sources.transport.paths import open_root

    folder.mkdir(parents=True, exist_ok=True)
    index = folder / INDEX_NAME
    if index.exists():
        return folder
    names = [f"shard-{k:06d}.tar" for k in range(shards)]
    for name in names:
        (folder / name).touch()
    offsets = (np.arange(per_shard, dtype=np.int64) * 110_000 + 1024).tolist()
    sizes, nones = [110_000] * per_shard, [None] * per_shard
    unwritten = [0] * per_shard  # the footer alone counts each shard's samples: one list serves every shard
    records = [
        ShardRecord(
            path=name,
            size=0,
            mtime_ns=-1,
            labels=[k % 1000] * per_shard if member_rows else unwritten,
            errors=nones,
            offsets=offsets,
            sizes=sizes,
            members=nones,
            keys=per_shard,
        )
        for k, name in enumerate(names)
    ]
    write_index(records, str(index), root=open_root(str(folder)), member_rows=member_rows)
    return folder


def _shard_listing_child(
    folder: str, world_size: int, chunk_rows: int, window_rows: int, sample_chunks: int, read_rows: bool
) -> dict:
    import numpy as np

    from raypipe.plan.order import RankPlan
    from raypipe.sources import open_source

    base = _reset_peak()
    t0 = time.perf_counter()
    listing = open_source(folder, by_shard=True)
    out = {
        "shards": listing.num_shards,
        "samples": len(listing),
        "listing_seconds": time.perf_counter() - t0,
        "listing_peak_bytes": _status()["VmHWM"] - base,
    }
    t0 = time.perf_counter()
    plan = RankPlan.for_rows(
        listing, seed=0, shuffle=True, chunk_rows=chunk_rows, window_rows=window_rows, rank=0, world_size=world_size
    )
    chunks = plan.chunks(0)
    out.update(plan_seconds=time.perf_counter() - t0, chunks=len(chunks), rank_rows=len(plan))
    out["peak_bytes"], out["held_bytes"] = _status()["VmHWM"] - base, _status()["VmRSS"] - base
    picks = np.linspace(0, len(chunks) - 1, num=min(sample_chunks, len(chunks))).astype(int)
    columns = listing.columns()
    t0 = time.perf_counter()
    rows = 0
    for i in picks:  # each chunk of another window: its rows computed afresh, as a stream plans them
        idx = chunks[int(i)]
        rows += len(idx)
        if read_rows:
            columns.take(idx)
    out.update(sampled_chunks=len(picks), sampled_rows=rows, sampled_seconds=time.perf_counter() - t0)
    out["peak_after_chunks_bytes"] = _status()["VmHWM"] - base
    return out


def shard_listing(
    shards: int = 100_000,
    per_shard: int = 10_000,
    read_shards: int = 1_000,
    workdir: str = "/tmp/raypipe-listing",
    world_size: int = 1,
    chunk_rows: int = 128,
    window_rows: int = 2048,
    sample_chunks: int = 2000,
) -> None:
    """An indexed WebDataset of a billion samples listed by shard, and one epoch's plan of it.

    Writes (under --workdir, kept) --shards empty tar shards with raypipe's index of --per-shard samples
    each (its footer: no image data), and in a fresh process: lists it by shard (``open_source(…,
    by_shard=True)``: the folder, each shard's size, the index footer), plans epoch 0 for rank 0 of
    --world-size (``RankPlan``: order, rank slice, chunk bounds of whole windows), prints seconds and peak
    memory over the process's baseline, then computes the rows of --sample-chunks chunks spread over the
    epoch (as a stream plans them). Then the same over --read-shards shards whose index holds every
    sample's row, reading each sampled chunk's rows from it (``ShardColumns.take``): time per chunk.
    """
    for count, member_rows in ((shards, False), (read_shards, True)):
        kind = "rows" if member_rows else "footer"
        folder = write_shard_dataset(
            Path(workdir) / f"wds-{count}x{per_shard}-{kind}", count, per_shard, member_rows=member_rows
        )
        got = _in_child(
            "_shard_listing_child", str(folder), world_size, chunk_rows, window_rows, sample_chunks, member_rows
        )
        per_chunk = got["sampled_seconds"] / max(1, got["sampled_chunks"])
        what = "its rows read from the index" if member_rows else "positions to sample ids"
        print(
            f"== {got['shards']:,} shards x {per_shard:,} = {got['samples']:,} samples (index with {kind}: "
            f"{_mb(os.path.getsize(folder / 'raypipe-index.parquet'))})"
        )
        print(
            f"listing by shard: {got['listing_seconds']:.2f} s, peak +{_mb(got['listing_peak_bytes'])}; plan (rank "
            f"0 of {world_size}): {got['plan_seconds']:.2f} s, {got['chunks']:,} chunks of {got['rank_rows']:,} "
            f"rows; peak +{_mb(got['peak_bytes'])}, held +{_mb(got['held_bytes'])}"
        )
        print(
            f"a chunk, {what}: {1e3 * per_chunk:.2f} ms ({got['sampled_chunks']} chunks, "
            f"{got['sampled_rows'] / max(1, got['sampled_chunks']):,.0f} rows each); peak then "
            f"+{_mb(got['peak_after_chunks_bytes'])}"
        )


def _in_child(fn: str, *args) -> dict:
    code = (
        f"import json, sys; from raypipe.benchmark import listing; "
        f"print(json.dumps(listing.{fn}(*json.loads(sys.argv[1]))))"
    )
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{fn} failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.0f} MB"


def listing_cost(
    rows: list[int] | None = None,
    workdir: str = "/tmp/raypipe-listing",
    labels: str = "names",
    world_size: int = 8,
    chunk_rows: int = 128,
    shard_rows: int = 0,
    skip_listing: bool = False,
) -> None:
    """A manifest's listing and one epoch's plan, each measured in a fresh process, at ImageNet sizes.

        For each row count: writes (once, under --workdir) a CSV manifest of that many rows, lists it
        (seconds, the table's buffers in bytes per row, resident memory after and the peak, both over the
        process's baseline after its imports), makes a Pipeline over it and its columns (``Pipeline.columns()``:
    seconds, memory) and takes one chunk's rows from them (--chunk-rows rows picked at random: seconds),
        then plans epoch 0 for rank 0 of --world-size (order, rank slice, chunks of --chunk-rows rows):
        seconds and peak memory. --shard-rows plans rows in shards of that many rows (the shard-window
        shuffle of tar shards and Parquet row groups) instead of a manifest's global shuffle.
    """
    os.makedirs(workdir, exist_ok=True)
    for n in rows or [IMAGENET_1K]:
        print(f"== {n:,} rows, labels as {labels}")
        if not skip_listing:
            t0 = time.perf_counter()
            manifest = write_manifest(Path(workdir) / f"manifest-{n}-{labels}.csv", n, labels=labels)
            size = os.path.getsize(manifest)
            print(f"manifest: {manifest} ({_mb(size)}, ready in {time.perf_counter() - t0:.1f} s)")
            got = _in_child("_listing_child", str(manifest), chunk_rows)
            table = got["table_bytes"]
            print(f"listing: {got['seconds']:.2f} s, columns {got['columns']}")
            resident, peak = got["resident_bytes"], got["peak_bytes"]
            print(
                f"  table {_mb(table)} = {table / n:.1f} B/row; resident +{_mb(resident)} ({resident / n:.1f} "
                f"B/row); peak +{_mb(peak)} ({peak / max(table, 1):.2f}x the table, {peak / n:.0f} B/row)"
            )
            resident, peak = got["columns_resident_bytes"], got["columns_peak_bytes"]
            print(
                f"  Pipeline.columns: {got['columns_seconds']:.2f} s, resident +{_mb(resident)} "
                f"({resident / n:.1f} B/row), peak +{_mb(peak)}; a chunk's rows ({got['chunk_rows']} rows "
                f"picked at random) taken from them in {1e3 * got['chunk_seconds']:.2f} ms"
            )
        got = _in_child("_plan_child", n, world_size, chunk_rows, shard_rows)
        kind = f"shards of {shard_rows} rows" if shard_rows else "global shuffle"
        print(
            f"plan (rank 0 of {world_size}, {kind}): {got['seconds']:.2f} s, {got['chunks']:,} chunks of "
            f"{got['rank_rows']:,} rows; peak +{_mb(got['peak_bytes'])}, held +{_mb(got['held_bytes'])}"
        )


def register(add) -> None:
    """Add this module's measurement to ``bench/profiles.py``: ``add(name, fn)`` returns the subcommand's
    parser, whose options are ``fn``'s keyword arguments."""
    p = add("listing-cost", listing_cost)
    p.add_argument(
        "--rows",
        type=int,
        nargs="+",
        help=f"row counts (default: {IMAGENET_1K}, ImageNet-1k's; ImageNet-21k's is {IMAGENET_21K})",
    )
    p.add_argument("--workdir", default="/tmp/raypipe-listing", help="where the manifests are written and kept")
    p.add_argument("--labels", choices=("names", "ints"), default="names", help="labels as class names or ints")
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--chunk-rows", type=int, default=128)
    p.add_argument("--shard-rows", type=int, default=0, help="plan rows in shards of this many rows (default: none)")
    p.add_argument("--skip-listing", action="store_true", help="the plan only")
    p = add("shard-listing", shard_listing)
    p.add_argument("--shards", type=int, default=100_000)
    p.add_argument("--per-shard", type=int, default=10_000)
    p.add_argument("--read-shards", type=int, default=1_000, help="shards of the index that holds every row")
    p.add_argument("--workdir", default="/tmp/raypipe-listing", help="where the synthetic datasets are kept")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--chunk-rows", type=int, default=128)
    p.add_argument("--window-rows", type=int, default=2048)
    p.add_argument("--sample-chunks", type=int, default=2000)
