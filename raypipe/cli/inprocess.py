"""The augmentation stage run in this process, for commands that touch few images.

Starting a local Ray and its first workers costs seconds, more than decoding a few hundred images
takes. ``preview`` (a grid of ``--count`` images) therefore always runs here, and ``scan`` runs
here when the dataset has at most ``SCAN_IN_PROCESS_MAX`` images (``--ray`` forces Ray). The stage is
the one Ray workers run (``StageSpec.run``, a mixture's ``MixtureSpec``, randomness seeded by
``(seed, epoch, sample_id)``), so the pixels are those a Ray run of the same epoch produces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from raypipe.config import DecodeConfig, EvalAugment, TrainAugment
from raypipe.sources import SourceRows
from raypipe.stages.augment import StageSpec
from raypipe.stages.mixture_stage import MixtureSpec

__all__ = ["SCAN_IN_PROCESS_MAX", "stage_blocks", "first_images", "ScanTally", "scan_blocks"]

# scan: datasets of at most this many images are decoded in this process. A full decode runs at a few
# hundred images/s per core; a local Ray needs several seconds to start before its first image.
SCAN_IN_PROCESS_MAX = 1000
_CHUNK = 64  # rows per stage call


def stage_blocks(
    rows: SourceRows,
    augment: TrainAugment | EvalAugment,
    decode: DecodeConfig,
    *,
    order: np.ndarray,
    seed: int = 0,
    epoch: int = 0,
    chunk: int = _CHUNK,
) -> Iterator[dict[str, np.ndarray]]:
    """The stage's output blocks for the rows at ``order`` (the listing's rows; a mixture's takes), in order."""

    def spec_of(part) -> StageSpec:
        return StageSpec(
            kind=part.kind,
            root=part.root,
            augment=augment,
            decode=decode,
            seed=seed,
            epoch=epoch,
            image_column=part.image_column,
            fields=part.fields,
        )

    parts = getattr(rows, "mixture_parts", None)
    spec = MixtureSpec(tuple(spec_of(p) for p in parts)) if parts is not None else spec_of(rows)
    columns = rows.columns()
    for start in range(0, len(order), chunk):
        yield spec.run(columns.take(order[start : start + chunk]))


def first_images(
    rows: SourceRows,
    augment: TrainAugment | EvalAugment,
    decode: DecodeConfig,
    *,
    count: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> dict[str, np.ndarray] | None:
    """The first ``count`` good images of epoch ``epoch`` (fewer if the dataset has fewer) as a packed
    batch (``image``, ``label``, ``sample_id``, and the listing's fields as lists); None when no image
    could be read."""
    from raypipe.config import PipelineConfig
    from raypipe.plan.order import RankPlan

    # the order a one-rank epoch of the pipeline reads (raypipe.plan.order: no Ray needed)
    window = PipelineConfig().shuffle_window
    order = RankPlan.for_rows(rows, seed=seed, shuffle=shuffle, chunk_rows=count, window_rows=window).rows(epoch)
    parts: list[dict[str, np.ndarray]] = []
    have = 0
    for block in stage_blocks(rows, augment, decode, order=order, seed=seed, epoch=epoch, chunk=max(count, 1)):
        ok = block["ok"]
        part = {k: block[k][ok] for k in ("image", "label", "sample_id")}
        for name, values in block.get("fields", {}).items():  # a mixture's ``source`` too
            part[name] = [v for v, good in zip(values, ok, strict=True) if good]
        parts.append(part)
        have += int(ok.sum())
        if have >= count:
            break
    if have == 0:
        return None
    out = {k: np.concatenate([p[k] for p in parts])[:count] for k in ("image", "label", "sample_id")}
    for name in (*rows.fields, *(("source",) if getattr(rows, "mixture_parts", None) else ())):
        out[name] = [v for p in parts for v in p[name]][:count]
    return out


@dataclass
class ScanTally:
    """What ``scan`` reports: rows seen, good ones, skips by reason and each skip's record."""

    total: int = 0
    ok: int = 0
    skipped: Counter = field(default_factory=Counter)
    skipped_paths: list[dict] = field(default_factory=list)

    def add(self, block: dict[str, np.ndarray]) -> None:
        self.total += len(block["ok"])
        self.ok += int(block["ok"].sum())
        for i in np.flatnonzero(~block["ok"]):
            reason = str(block["reason"][i])
            self.skipped[reason] += 1
            self.skipped_paths.append(
                {
                    "sample_id": int(block["sample_id"][i]),
                    "path": str(block["path"][i]),
                    "reason": reason,
                    "detail": str(block["detail"][i]),
                }
            )


def scan_blocks(rows: SourceRows, augment: EvalAugment, decode: DecodeConfig) -> Iterator[dict[str, np.ndarray]]:
    """Every row of ``rows`` through the stage, in listing order."""
    return stage_blocks(rows, augment, decode, order=np.arange(len(rows)))
