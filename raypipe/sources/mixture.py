"""A weighted mixture of datasets: its parts listed, their classes made one space, its identity.

``Mixture([(source, weight), ...], samples_per_epoch=None)``: each source a path or URI, a listing
(``open_source``'s) or a Ray Dataset, optionally with its own ``ListingOptions`` as a third item.
``list_mixture`` lists the parts and returns a ``MixtureListing``: the parts' listings, each epoch's takes
(``raypipe.plan.mixture.part_takes``; ``samples_per_epoch`` defaults to the parts' rows together), the
classes, and a digest of it all (the parts' digests, the weights, the samples per epoch), which is the
mixture's part of a plan's identity.

Classes: parts with named classes share one space by name: the first part's names in its order, then
each later part's new names in its own order; each part's labels are renumbered to it. Parts with
unnamed integer labels keep them. A mixture of named and unnamed parts is a ``ValueError``: a label 3
of one and a class "dog" of another cannot be told to mean the same or not.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raypipe.plan.mixture import MixtureOrder, part_takes
from raypipe.plan.order import SHARDED_KINDS, ShardRuns
from raypipe.sources.options import ListingOptions

__all__ = ["Mixture", "MixtureListing", "list_mixture"]


@dataclass(frozen=True)
class Mixture:
    """Datasets mixed by weight (see the module doc).

    Args:
        parts: ``(source, weight)`` or ``(source, weight, ListingOptions)`` items.
        samples_per_epoch: rows an epoch takes of all parts together (None: the parts' rows together).

    Raises:
        ValueError: no part, an item of another shape, a weight that is negative, NaN or infinite,
            every weight zero, or ``samples_per_epoch`` < 1.
    """

    parts: tuple
    samples_per_epoch: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.parts, Sequence) or isinstance(self.parts, str) or not self.parts:
            raise ValueError(f"parts={self.parts!r}: expected a non-empty list of (source, weight) items")
        items = []
        for k, item in enumerate(self.parts):
            if not isinstance(item, Sequence) or isinstance(item, str) or len(item) not in (2, 3):
                raise ValueError(f"parts[{k}]={item!r}: expected (source, weight) or (source, weight, ListingOptions)")
            source, weight, *rest = item
            options = rest[0] if rest else None
            if options is not None and not isinstance(options, ListingOptions):
                raise ValueError(f"parts[{k}]: its third item {options!r} is not a ListingOptions")
            if isinstance(weight, bool) or not isinstance(weight, int | float | np.number):
                raise ValueError(f"parts[{k}]: weight {weight!r} is not a number")
            if not math.isfinite(float(weight)) or float(weight) < 0:
                raise ValueError(f"parts[{k}]: weight {weight!r}: expected a finite number >= 0")
            items.append((source, float(weight), options))
        if sum(w for _, w, _ in items) <= 0:
            raise ValueError("weights: every weight is 0; at least one part must be taken")
        spe = self.samples_per_epoch
        if spe is not None and (isinstance(spe, bool) or not isinstance(spe, int | np.integer) or spe < 1):
            raise ValueError(f"samples_per_epoch={spe!r}: expected an int >= 1, or None (the parts' rows)")
        object.__setattr__(self, "parts", tuple(items))

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(w for _, w, _ in self.parts)


@dataclass(frozen=True)
class MixtureListing:
    """A listed mixture: ``parts`` (each a listing), ``weights``, ``takes`` (rows of each part per epoch),
    ``classes`` (the one class space, empty for unnamed labels) and ``digest()``."""

    parts: tuple
    weights: tuple[float, ...]
    takes: tuple[int, ...]
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return int(sum(self.takes))

    @property
    def mixture_parts(self) -> tuple:
        """The parts' listings (what marks a listing as a mixture's to the plan and the pipeline)."""
        return self.parts

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.parts)

    @property
    def num_classes(self) -> int:
        return len(self.classes) if self.classes else max(p.num_classes for p in self.parts)

    @property
    def kind(self) -> str:
        """ "mixture"; "raydata" where a part's bytes are in Ray's object store (only Ray tasks read it)."""
        return "raydata" if any(p.kind == "raydata" for p in self.parts) else "mixture"

    @property
    def by_shard(self) -> bool:
        return False

    @property
    def fields(self) -> tuple[str, ...]:
        """Every part's fields (a part without one gives None for it)."""
        return tuple(dict.fromkeys(name for p in self.parts for name in p.fields))

    @property
    def multi_label(self) -> bool:
        return any(getattr(p, "multi_label", False) for p in self.parts)

    def columns(self) -> MixtureColumns:
        return MixtureColumns(self.parts)

    def mixture_order(self, epoch: int, *, seed: int, shuffle: bool, window_rows: int) -> MixtureOrder:
        """Epoch ``epoch``'s order (``raypipe.plan.mixture``), each part's shards its cycles' windows."""
        runs = tuple(_runs_of(p) for p in self.parts)
        return MixtureOrder(
            self.sizes, self.takes, seed=seed, epoch=epoch, shuffle=shuffle, runs=runs, window_rows=window_rows
        )

    def digest(self) -> str:
        """sha256 of the parts' digests (in order), the weights and the takes."""
        h = hashlib.sha256(f"raypipe-mixture-v1:{len(self.parts)}".encode())
        for part, weight, take in zip(self.parts, self.weights, self.takes, strict=True):
            h.update(f"{part.digest()}:{weight!r}:{take};".encode())
        return h.hexdigest()


class MixtureColumns:
    """A chunk's rows of a mixture from its takes (``plan.mixture.TAKE``): ``source``, ``cycle`` and
    ``take`` (the position in the epoch) per row, each part's own ``sample_id``, and ``parts``: each
    part's rows (its columns' ``take``) in the chunk's order, None for a part the chunk does not touch
    (``raypipe.stages.mixture_stage``)."""

    def __init__(self, parts):
        self._columns = [p.columns() for p in parts]

    def take(self, takes: np.ndarray) -> dict:
        part = np.asarray(takes["part"], dtype=np.int64)
        rows = {
            "source": part,
            "cycle": np.asarray(takes["cycle"], dtype=np.int64),
            "take": np.asarray(takes["position"], dtype=np.int64),
        }
        per_part = []
        sample_id = np.empty(len(part), dtype=np.int64)
        for i, columns in enumerate(self._columns):
            mine = np.flatnonzero(part == i)
            if not len(mine):
                per_part.append(None)
                continue
            taken = columns.take(np.asarray(takes["row"][mine], dtype=np.int64))
            sample_id[mine] = taken["sample_id"]
            per_part.append(taken)
        rows["sample_id"] = sample_id
        rows["parts"] = tuple(per_part)
        return rows


def _runs_of(rows) -> ShardRuns | None:
    """A part's shards as its cycles' windows (None: its rows are read one by one)."""
    if rows.by_shard:
        return ShardRuns.from_sizes(rows.shard_counts)
    if rows.kind in SHARDED_KINDS:
        return ShardRuns.from_shards(rows.shard_ids())
    return None


def list_mixture(mixture: Mixture, open_source) -> MixtureListing:
    """List each part (with ``open_source``, ``raypipe.sources``', and its own options) and make one
    class space.

    Raises:
        ValueError: parts with named classes mixed with parts of unnamed labels; a part that has no
            rows but is taken; and what ``open_source`` raises for a part.
    """
    parts = [open_source(source, options=options) for source, _, options in mixture.parts]
    named = [bool(p.classes) for p in parts]
    if any(named) and not all(named):
        which = [k for k, n in enumerate(named) if not n]
        raise ValueError(
            f"parts {which} have unnamed integer labels and the others named classes: a mixture's parts must all "
            "name their classes (one space by name) or none (labels kept as they are)"
        )
    classes: tuple[str, ...] = ()
    if all(named):
        union: dict[str, None] = {}
        for p in parts:
            union.update(dict.fromkeys(p.classes))
        classes = tuple(union)
        parts = [p.numbered_like(classes) for p in parts]
    spe = mixture.samples_per_epoch or sum(len(p) for p in parts)
    takes = part_takes(mixture.weights, int(spe))
    if len({bool(getattr(p, "multi_label", False)) for p in parts}) > 1:
        raise ValueError("a mixture's parts must all have one label per image, or all label sets")
    empty = [k for k, (p, t) in enumerate(zip(parts, takes, strict=True)) if len(p) == 0 and t > 0]
    if empty:
        raise ValueError(f"parts {empty} have no rows, and their weights take some")
    return MixtureListing(tuple(parts), mixture.weights, tuple(int(t) for t in takes), classes)
