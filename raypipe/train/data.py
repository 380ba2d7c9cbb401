"""The job's datasets: listed once on the driver, split train/eval by a hash of each row's location."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa

from raypipe.sources import SourceRows, open_source
from raypipe.sources.data_parts import DataParts, data_parts
from raypipe.train.args import TrainJobConfig

__all__ = ["held_out_mask", "split_rows", "job_rows", "held_out_mixture", "SAMPLE_CLASSES"]

log = logging.getLogger(__name__)
SAMPLE_CLASSES = 10


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash (splitmix64's finaliser), vectorised; wraps modulo 2**64 by design."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def held_out_mask(keys: np.ndarray, fraction: float) -> np.ndarray:
    """True for keys in the held-out split: a function of each key alone (``SourceRows.split_keys``), so
    the split is the same on every run and every cluster size."""
    buckets = _splitmix64(np.asarray(keys).astype(np.uint64)) % np.uint64(1_000_000)
    return buckets < np.uint64(round(fraction * 1_000_000))


def split_rows(rows: SourceRows, fraction: float) -> tuple[SourceRows, SourceRows]:
    """(train, held-out) views of ``rows``; sample ids are kept, not renumbered.

    Split by each row's path (and Parquet row), not by ``sample_id``: ids are listing positions, which a
    file added to the dataset shifts, and a split by id would then move images between train and eval."""
    mask = held_out_mask(rows.split_keys(), fraction)
    val = rows.table.filter(pa.array(mask))
    train = rows.table.filter(pa.array(~mask))
    return dataclasses.replace(rows, table=train), dataclasses.replace(rows, table=val)


def _ensure_sample_data(job: TrainJobConfig) -> str:
    from raypipe.sample_data import write_sample_data

    out = Path(job.sample_dir).resolve()
    marker = out / ".complete"
    if not marker.exists():
        print(f"writing sample data: {SAMPLE_CLASSES} classes x {job.sample_per_class} JPEGs to {out}", flush=True)
        write_sample_data(out, classes=SAMPLE_CLASSES, per_class=job.sample_per_class)
        marker.write_text(f"classes={SAMPLE_CLASSES} per_class={job.sample_per_class}\n", encoding="utf-8")
    return str(out)


def job_rows(job: TrainJobConfig) -> tuple[SourceRows, SourceRows, str]:
    """List the train and eval rows once (on the driver) and name the data they came from. A mixture's
    eval rows are each part's held-out rows, every one once (``held_out_mixture``)."""
    parts = job.data if isinstance(job.data, DataParts) else data_parts([job.data or _ensure_sample_data(job)])
    if job.index is not None and len(parts.parts) > 1:
        raise ValueError("--index with several datasets: give each its index in the config's data: list")
    rows = parts.open(job.listing)  # a non-WebDataset with an index: refused
    data = parts.describe()
    if job.val_data:
        # A separate eval set lists its own classes (folders, or a manifest's names): number them as the
        # training data does, or a class missing from one split would shift every later label.
        val = open_source(job.val_data, options=dataclasses.replace(job.listing, index=None))  # the index is data's
        try:
            val = val.numbered_like(rows.classes)
        except ValueError as e:
            raise ValueError(f"--val-data {job.val_data!r}: {e}") from None
        return rows, val, data
    if job.val_split <= 0:
        raise ValueError("no eval data: give --val-data or a --val-split > 0")
    if not parts.is_mixture:
        train, val = split_rows(rows, job.val_split)
        return train, val, data
    # each part split as one dataset is, in the mixture's class space; training mixes what is left
    splits = [split_rows(part, job.val_split) for part in rows.mixture_parts]
    return parts.mix([train for train, _ in splits]), held_out_mixture([val for _, val in splits]), data


def held_out_mixture(parts: list[SourceRows]):
    """The parts' held-out rows as one mixture whose epoch takes each row once (weights: their rows)."""
    from raypipe.sources.mixture import Mixture, list_mixture

    if not sum(len(p) for p in parts):
        raise ValueError("no eval data: --val-split held out no row of any dataset; raise it or give --val-data")
    return list_mixture(Mixture([(p, len(p)) for p in parts]), open_source)
