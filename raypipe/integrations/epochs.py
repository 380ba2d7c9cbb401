"""The same number of batches on every rank, every epoch.

Ranks take contiguous slices of an epoch that differ by one row, and a rank's skipped (unreadable)
images shorten its epoch further, so ranks can end with different batch counts. A training loop that
all-reduces once per step (DDP, timm's ``validate``) then hangs or fails on the rank that has one
step more. timm avoids this with its samplers; this view does the same for a raypipe source:

- **eval** (``pad_to`` rows): every rank yields exactly ``pad_to = ceil(n / world_size)`` rows, as
  timm's ``OrderedDistributedSampler`` does. Real rows come first; the padding (repeats of this
  rank's first rows, ``sample_id == -1``) is at the end, so timm's evaluator, which trims trailing
  predictions beyond ``sampler.num_valid_samples``, drops exactly the padding. A loop that does not
  trim counts each padded row twice, exactly as it would with timm's own loader.
- **train** (``pad_to=None``, batches full as ``drop_last`` makes them): every rank yields exactly
  ``num_batches`` batches. A rank with a batch more than that (its slice is one row longer) reads it
  but does not yield it (``held_back_rows``); a rank short of batches because images were skipped
  repeats its last batch (``repeated_batches``).

Pure Python over any re-iterable source of packed batches (dicts of ``image``, ``label``,
``sample_id``); no Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import numpy as np

from raypipe.plan.position import Position, read_positions

__all__ = ["EqualBatches", "eval_rows_per_rank", "train_batches_per_rank"]

log = logging.getLogger(__name__)


def eval_rows_per_rank(n: int, world_size: int) -> int:
    """Rows every rank evaluates: ``ceil(n / world_size)``, timm's ``OrderedDistributedSampler.num_samples``."""
    return -(-n // world_size)


def train_batches_per_rank(n: int, world_size: int, batch_size: int) -> int:
    """Full batches every rank trains on: those of the shortest rank's slice (``n // world_size`` rows)."""
    return (n // world_size) // batch_size


class EqualBatches:
    """``source`` (an ``EpochSource``-like re-iterable) with exactly ``num_batches`` batches per epoch.

    ``pad_to``: rows per epoch for eval (padded at the end, see the module doc); None for training.
    ``image_shape`` (H, W, C): the padding of a rank that has no row of its own (fewer rows than ranks).
    ``set_epoch``, ``next_epoch``, ``close`` and ``last_report`` are passed to the source. After each epoch,
    ``padded_rows``, ``held_back_rows`` and ``repeated_batches`` say what was done to even it out.
    """

    def __init__(
        self,
        source: Iterable,
        *,
        batch_size: int,
        num_batches: int,
        pad_to: int | None = None,
        image_shape: tuple[int, int, int] | None = None,
    ):
        if num_batches < 0 or batch_size < 1:
            raise ValueError(f"num_batches={num_batches}, batch_size={batch_size}: expected >= 0 and >= 1")
        if pad_to is not None and -(-pad_to // batch_size) != num_batches:
            raise ValueError(f"pad_to={pad_to} rows make {-(-pad_to // batch_size)} batches, not {num_batches}")
        self.source = source
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.pad_to = pad_to
        self.image_shape = image_shape
        self.padded_rows = 0
        self.held_back_rows = 0
        self.repeated_batches = 0
        # the source's count of its batches this epoch has yielded (repeats not counted; a resumed epoch
        # counts on from the position's), and the count the next epoch starts from
        self._source_batches = 0
        self._first = 0
        self._resumed: int | None = None  # batches the next epoch yields when it goes on from a saved position

    def __len__(self) -> int:
        return self.num_batches

    def state_dict(self, batches: int | None = None) -> dict:
        """The position (``raypipe.plan.position``) after ``batches`` of this epoch's (training only: an
        evaluation runs whole): the source's, with ``batches`` as the count. A batch repeated to even out
        the ranks is past the source's last: its position is the source's end."""
        if self.pad_to is not None:
            raise ValueError("an evaluation loader runs its epochs whole: it has no position to save")
        if batches is None:
            return self.source.state_dict()
        at = self.source.state_dict(batches=min(batches, self._source_batches))
        return Position.from_dict(at).with_batches(batches).as_dict()

    def load_state_dict(self, state) -> None:
        """Go on from ``state`` (this rank's, or every rank's for another number of ranks): the epoch
        yields the batches left of ``num_batches``, or, on another number of ranks, the full batches of
        the shortest new rank's part of what is left."""
        if self.pad_to is not None:
            raise ValueError("an evaluation loader runs its epochs whole: it has no position to load")
        saved = read_positions(state)
        self.source.load_state_dict(saved.as_state())
        world = getattr(self.source, "world_size", None)
        if not saved.every_rank or saved.world_size == world:
            self._resumed = max(0, self.num_batches - saved.batches)
        else:
            self._resumed = (saved.rows_left // world) // self.batch_size
        self._first = self._source_batches = saved.batches

    def set_epoch(self, epoch: int) -> None:
        if self.next_epoch is not None and epoch != self.next_epoch:
            self._resumed, self._first = None, 0  # a loaded position belongs to its own epoch
        move = getattr(self.source, "set_epoch", None)
        if move is not None:
            move(epoch)

    @property
    def next_epoch(self) -> int | None:
        return getattr(self.source, "next_epoch", None)

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if callable(close):
            close()

    @property
    def last_report(self):
        return getattr(self.source, "last_report", None)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self.padded_rows = self.held_back_rows = self.repeated_batches = 0
        self._source_batches, self._first = self._first, 0
        count, self._resumed = (self.num_batches if self._resumed is None else self._resumed), None
        inner = iter(self.source)
        body = self._eval(inner) if self.pad_to is not None else self._train(inner, count)
        return self._closing(body, inner)

    @staticmethod
    def _closing(body: Iterator, inner: Iterator) -> Iterator:
        # Stopping part way must stop the source's epoch too (its stream is cancelled, not left running).
        try:
            yield from body
        finally:
            close = getattr(inner, "close", None)
            if callable(close):
                close()

    def _train(self, inner: Iterator, count: int) -> Iterator[dict[str, np.ndarray]]:
        out, last = 0, None
        for batch in inner:
            if out < count:
                out += 1
                self._source_batches += 1
                last = batch
                yield batch
            else:  # read to the end all the same: the source's accounting and its stream stay in step
                self.held_back_rows += len(batch["sample_id"])
        if out < count:
            if last is None:
                raise RuntimeError("this rank's epoch produced no batch (every image skipped?)")
            self.repeated_batches = count - out
            log.warning("rank short of %d batch(es) (skipped images): repeating its last batch", self.repeated_batches)
            for _ in range(self.repeated_batches):
                yield last

    def _eval(self, inner: Iterator) -> Iterator[dict[str, np.ndarray]]:
        b, want = self.batch_size, self.pad_to
        rows, first, held = 0, None, None
        for batch in inner:
            n = len(batch["sample_id"])
            if rows + n > want:
                raise RuntimeError(f"the source gave more than pad_to={want} rows in an epoch")
            rows += n
            first = batch if first is None else first
            if n < b:  # the packer's final partial batch: padded below, so it is held back
                held = batch
            else:
                yield batch
        need = want - rows
        self.padded_rows = need
        if first is None and need and self.image_shape is not None:
            first = {
                "image": np.zeros((1, *self.image_shape), np.uint8),
                "label": np.zeros(1, np.int64),
                "sample_id": np.full(1, -1, np.int64),
            }
        if held is not None and need:
            take = min(need, b - len(held["sample_id"]))
            held = _concat(held, _padding(first, take))
            need -= take
        if held is not None:
            yield held
        while need > 0:
            take = min(need, b)
            need -= take
            yield _padding(first, take)


def _padding(template: dict[str, np.ndarray] | None, n: int) -> dict[str, np.ndarray]:
    """``n`` padding rows: this rank's first rows again (cycled), or black images of class 0 for a
    rank that had none; their ``sample_id`` is -1."""
    if template is None:
        raise RuntimeError("this rank's eval epoch has no image to pad with (every image skipped?)")
    idx = np.arange(n) % len(template["sample_id"])
    out = {key: _take(values, idx) for key, values in template.items()}  # fields too: the batch's keys
    out["image"] = np.ascontiguousarray(out["image"])
    out["label"] = np.asarray(out["label"], dtype=np.int64)
    out["sample_id"] = np.full(n, -1, dtype=np.int64)
    return out


def _take(values, idx: np.ndarray):
    return [values[i] for i in idx] if isinstance(values, list) else np.asarray(values)[idx]


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        k: [*a[k], *b[k]] if isinstance(a[k], list) else np.concatenate([np.asarray(a[k]), np.asarray(b[k])]) for k in a
    }
