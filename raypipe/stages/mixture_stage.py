"""A chunk of a mixture's rows on the worker: each part's rows through that part's own stage.

A mixture's chunk interleaves rows of several parts (``raypipe.plan.mixture``), and each part has its
kind, root and reader (``StageSpec``). ``MixtureSpec`` holds one spec per part; a chunk's rows are
``{"source": part per row, "cycle": cycle per row, "parts": (each part's rows, in the chunk's order)}``.
``augment_mixture`` runs each (part, cycle) group through ``stage_for`` of its part's spec, with the
augmentation's epoch word ``mixture_epoch(epoch, part, cycle)``: a row taken twice (an up-weighted
part's next cycle) is augmented anew, and a part's rows never share draws with another part's rows of
the same id. The block is the chunk's rows in order, each part's own ``sample_id``, its ``cycle``, and
as fields (the packer carries them into each batch) ``source`` and ``take``, the row's position in the
epoch's order: a row taken twice in one epoch is two takes, which the ledger counts apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from raypipe.stages.augment import StageSpec, stage_for

__all__ = ["MixtureSpec", "augment_mixture", "mixture_epoch"]

_M32 = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class MixtureSpec:
    """One ``StageSpec`` per part, all of one seed, epoch and image shape (small and picklable)."""

    parts: tuple[StageSpec, ...]
    nice: int | None = None  # set: every part's stage runs at this niceness (a consumer's own chunk: 0)
    sched_idle: bool | None = None
    kind = "mixture"

    def __post_init__(self) -> None:
        shapes = {p.image_shape for p in self.parts}
        if len(shapes) != 1 or len({(p.seed, p.epoch) for p in self.parts}) != 1:
            raise ValueError("a mixture's parts must share one image shape, seed and epoch")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.parts[0].image_shape

    @property
    def epoch(self) -> int:
        return self.parts[0].epoch

    def part(self, i: int, cycle: int) -> StageSpec:
        """Part ``i``'s spec for its rows of ``cycle``: their epoch word, and this spec's priority if set."""
        spec = self.parts[i]
        changes = {"epoch": mixture_epoch(spec.epoch, i, cycle)}
        if self.nice is not None:
            changes["nice"] = self.nice
        if self.sched_idle is not None:
            changes["sched_idle"] = self.sched_idle
        return dataclasses.replace(spec, **changes)

    def run(self, batch: Mapping, out: np.ndarray | None = None) -> dict:
        return augment_mixture(batch, self, out)

    def prepare(self) -> None:
        for spec in self.parts:
            stage_for(spec)


def mixture_epoch(epoch: int, part: int, cycle: int) -> int:
    """The epoch word a part's rows of one cycle are augmented with (32 bits: the seeding's fast path)."""
    words = np.random.SeedSequence([int(epoch), int(part), int(cycle), 0x31C7]).generate_state(1, np.uint32)
    return int(words[0]) & _M32


def augment_mixture(rows: Mapping, spec: MixtureSpec, out: np.ndarray | None = None) -> dict:
    """The chunk's block (see the module doc); ``out``: where the images go, as ``AugmentStage``'s."""
    source = np.asarray(rows["source"], dtype=np.int64)
    cycle = np.asarray(rows["cycle"], dtype=np.int64)
    n = len(source)
    images = np.empty((n, *spec.image_shape), np.uint8) if out is None else out
    block: dict = {
        "image": images,
        "sample_id": np.empty(n, np.int64),
        "ok": np.zeros(n, bool),
        "reason": np.full(n, "", object),
        "detail": np.full(n, "", object),
        "path": np.full(n, "", object),
    }
    labels = None
    fields: dict[str, list] = {}
    # each group's images go straight into the next rows of ``images`` (no array of their own, whose
    # fresh pages a whole window's rows would fault in), then the rows are put in the chunk's order
    at, held = 0, np.empty(n, np.int64)  # held[i]: the row of ``images`` that holds the chunk's row i
    for part in np.unique(source):
        mine = np.flatnonzero(source == part)  # the part's rows, in the chunk's order
        part_rows = rows["parts"][int(part)]
        for c in np.unique(cycle[mine]):
            pick = np.flatnonzero(cycle[mine] == c)
            where = mine[pick]
            sub = {k: _take(v, pick) for k, v in part_rows.items()}
            got = stage_for(spec.part(int(part), int(c)))(sub, images[at : at + len(where)])
            held[where] = np.arange(at, at + len(where))
            at += len(where)
            for key in ("sample_id", "ok", "reason", "detail", "path"):
                block[key][where] = got[key]
            if labels is None:
                labels = np.zeros((n, *got["label"].shape[1:]), dtype=got["label"].dtype)
            labels[where] = got["label"]
            for name, values in got.get("fields", {}).items():
                column = fields.setdefault(name, [None] * n)
                for j, row in enumerate(where):
                    column[row] = values[j]
    _put_in_order(images, held)
    block["label"] = labels if labels is not None else np.zeros(0, np.int64)
    block["cycle"] = cycle.copy()  # which take of its row each is; batches carry ``source``, not this
    block["fields"] = {
        "take": np.asarray(rows["take"], dtype=np.int64).copy(),
        "source": source.copy(),
        **{name: _packed(values, block["ok"]) for name, values in fields.items()},
    }
    return block


def _put_in_order(images: np.ndarray, held: np.ndarray) -> None:
    """Move each row ``held[i]`` of ``images`` to row ``i``, in place: along each cycle of the
    permutation, one row kept aside (each row is copied once, as a copy out of a group's own array was)."""
    done = held == np.arange(len(held))
    spare = np.empty(images.shape[1:], images.dtype) if not done.all() else None
    for i in np.flatnonzero(~done):
        if done[i]:
            continue
        spare[...] = images[i]
        j = i
        while held[j] != i:
            images[j] = images[held[j]]
            done[j] = True
            j = held[j]
        images[j] = spare
        done[j] = True


def _take(values, pick: np.ndarray):
    if isinstance(values, np.ndarray):
        return values[pick]
    return [values[i] for i in pick]


def _packed(values: list, ok: np.ndarray):
    from raypipe.stages.field_values import field_array

    return field_array(values, ok)
