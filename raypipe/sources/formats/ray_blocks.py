"""The image bytes of a Ray Dataset's rows, as the workers read them (kind ``raydata``).

Two ways a row carries them:

- ``block`` (an object ref) and ``row``: the listing put the row's block in the object store
  (``raypipe.sources.formats.raydata``). The listing's columns (``SourceRows.columns()``) add each row's ref
  to the rows a chunk takes from the listing, so a task carries the refs of its own blocks only (a
  chunk of a shard window touches a few), and Ray keeps them alive while the task runs. The reader
  gets each block once per chunk (``ray.get`` of all of them at once: zero-copy from this node's object
  store, pulled first when another node holds it) and takes its rows' cells.
- ``bytes``: the cells themselves, as ``raypipe.integrations.ray_data.RayDataAugment`` has them inside
  a Ray Data ``map_batches``; ``BlockReader.read_block`` takes those as they are, of any kind.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from raypipe.kernels.errors import NULL_IMAGE, SkipImage
from raypipe.sources.table import int64_array

__all__ = ["describe_row", "read_rows"]


def read_rows(rows: Mapping[str, np.ndarray], todo: list[int], out: list) -> None:
    """``out[i]``, for each row ``i`` in ``todo``, its image bytes from its block (or the ``SkipImage`` of
    a null cell)."""
    if not todo:
        return
    import ray

    shards = np.asarray(rows["shard"])
    by_shard: dict[int, list[int]] = {}
    for i in todo:
        by_shard.setdefault(int(shards[i]), []).append(i)
    refs = [rows["block"][idx[0]] for idx in by_shard.values()]
    missing = [shard for shard, ref in zip(by_shard, refs, strict=True) if ref is None]
    if missing:  # a bug of the caller's: rows taken without their blocks
        raise ValueError(f"rows of shards {missing[:5]} came without their block's object ref")
    tables = ray.get(refs)  # all at once: pulls from other nodes overlap
    for idx, table in zip(by_shard.values(), tables, strict=True):
        picked = table.column(0).take(int64_array([int(rows["row"][i]) for i in idx])).to_pylist()
        for i, cell in zip(idx, picked, strict=True):
            out[i] = _cell(cell)


def _cell(cell) -> bytes | SkipImage:
    return SkipImage(NULL_IMAGE, "a null image cell") if cell is None else bytes(cell)


def describe_row(rows: Mapping[str, np.ndarray], i: int) -> str:
    """Where row ``i`` is, as reports show it: ``ray.data/block3#row=17``, or its sample id where the row
    carries its bytes."""
    if "bytes" in rows or "path" not in rows:
        return f"ray.data#sample_id={int(rows['sample_id'][i])}"
    return f"ray.data/{rows['path'][i]}#row={int(rows['row'][i])}"
