"""Pack augmented blocks into exact-size training batches.

Blocks arrive in the rank's order with any number of rows, some of them skip records. Batch ``i`` is
the good rows ``i * batch_size`` … ``(i + 1) * batch_size - 1`` of the rank's order (the last one
partial unless ``drop_last``): ``image`` uint8 (N, H, W, C) C-contiguous, ``label`` int64,
``sample_id`` int64, and each of the listing's fields under its own name (a block's ``fields``: an
array of ``(N, *shape)`` packed like the image, or a list: ``raypipe.stages.field_values``). That
is a function of the order and of which rows are bad, never of where the
work was cut into chunks, so a run resumed at any batch (``raypipe.plan.position``) goes on with
the batches an uninterrupted one makes. A batch that is consecutive good rows of one block is passed
on as a view of it, without a copy; one that spans a block's end or a bad row is copied. So a short or
partly bad block costs one copied batch, and the blocks after it are views again. A block of many
batches (a whole window) ends in a copied batch too, so that the batch a consumer keeps while it waits
for the next block does not keep the whole block's memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["BatchSpec", "Packer"]

# A block of at least this many batches (a whole window of shards) has its last whole batch copied. The
# consumer holds its latest batch while it waits for the next block, and a view would keep the block's
# whole slab from the pool until then, as the next chunk but one is sent out: each stream then has two
# windows of images in memory instead of one. The copy is at most an eighth of the block's rows.
_COPY_LAST_FROM = 8


@dataclass(frozen=True)
class BatchSpec:
    """What every packed batch looks like; checked once, buffers allocated from it."""

    batch_size: int
    image_shape: tuple[int, int, int]  # (H, W, C)

    def check(self, block: dict[str, np.ndarray]) -> None:
        img = block["image"]
        if img.dtype != np.uint8 or tuple(img.shape[1:]) != self.image_shape:
            raise ValueError(f"block image is {img.dtype}{tuple(img.shape[1:])}, expected uint8{self.image_shape}")


class Packer:
    """Accumulate good rows; yield exact batches. Not thread-safe (one consumer)."""

    def __init__(self, spec: BatchSpec, *, drop_last: bool = False):
        self.spec = spec
        self.drop_last = drop_last
        self._new_buffers()
        self.dropped_ids: list[np.ndarray] = []  # ids (a mixture's takes) of a final batch drop_last cut
        self.last_row = -1  # the block row of the last sample of the batch that is out

    def _new_buffers(self) -> None:
        b = self.spec.batch_size
        # A fresh buffer per batch: the consumer may keep a batch while we fill the next one.
        self._image = np.empty((b, *self.spec.image_shape), dtype=np.uint8)
        self._label: np.ndarray | None = None  # made as the first block's labels are: ids, or multi-hot rows
        self._sid = np.empty(b, dtype=np.int64)
        self._fields: dict[str, np.ndarray | list] = {}  # made as the first block's fields say
        self._fill = 0

    def _label_rows(self, labels: np.ndarray) -> np.ndarray:
        """This batch's label buffer, shaped as a block's labels are (ids: int64; multi-hot rows: their dtype)."""
        if self._label is None:
            shape, dtype = labels.shape[1:], (labels.dtype if labels.ndim > 1 else np.int64)
            self._label = np.empty((self.spec.batch_size, *shape), dtype=dtype)
        return self._label

    def _emit(self, n: int) -> dict[str, np.ndarray]:
        out = {"image": self._image[:n], "label": self._label[:n], "sample_id": self._sid[:n]}
        for name, values in self._fields.items():
            out[name] = values[:n]
        self._new_buffers()
        return out

    def _take_fields(self, fields: dict, take: np.ndarray, f: int) -> None:
        """Rows ``take`` of a block's fields into this batch's, from row ``f``."""
        for name, values in fields.items():
            have = self._fields.get(name)
            if isinstance(values, np.ndarray) and (have is None or isinstance(have, np.ndarray)):
                if have is None or have.shape[1:] != values.shape[1:] or have.dtype != values.dtype:
                    if have is not None and f:  # earlier rows of this batch had another shape: a list
                        self._fields[name] = [*have[:f], *values[take]]
                        continue
                    have = self._fields[name] = np.empty((self.spec.batch_size, *values.shape[1:]), values.dtype)
                have[f : f + len(take)] = values[take]
            else:
                kept = list(have[:f]) if have is not None else []
                kept += [values[i] for i in take]
                self._fields[name] = kept

    def add(self, block: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """Add one block of rows (with an ``ok`` mask); yield every batch that became full. While a batch
        is out, ``last_row`` is the block row of its last sample."""
        self.spec.check(block)
        image = block["image"]
        good = np.flatnonzero(block["ok"])
        views = image.flags.c_contiguous
        b, g = self.spec.batch_size, 0
        while g < len(good):
            first = int(good[g])
            last_whole = len(good) - g < 2 * b  # no whole batch of this block after this one
            if (
                self._fill == 0
                and views
                and g + b <= len(good)
                and int(good[g + b - 1]) - first == b - 1
                and not (last_whole and len(image) >= _COPY_LAST_FROM * b)
            ):
                rows = slice(first, first + b)  # b consecutive good rows: a view
                self.last_row = first + b - 1
                yield {
                    "image": image[rows],
                    "label": _labels(block["label"][rows]),
                    "sample_id": np.ascontiguousarray(block["sample_id"][rows], dtype=np.int64),
                    **{name: values[rows] for name, values in block.get("fields", {}).items()},
                }
                g += b
                continue
            take = good[g : g + b - self._fill]
            k, f = len(take), self._fill
            # mode="clip": indices are in range by construction, and the default ("raise") copies through a
            # temporary buffer, about 3x the time (``python bench/pipeline_profile.py --take`` times both)
            np.take(image, take, axis=0, out=self._image[f : f + k], mode="clip")
            self._label_rows(block["label"])[f : f + k] = block["label"][take]
            self._sid[f : f + k] = block["sample_id"][take]
            if "fields" in block:
                self._take_fields(block["fields"], take, f)
            self._fill += k
            g += k
            if self._fill == b:
                self.last_row = int(take[-1])
                yield self._emit(b)

    def flush(self) -> Iterator[dict[str, np.ndarray]]:
        """End of epoch: the partial batch, or nothing if empty or ``drop_last``."""
        if self._fill == 0:
            return
        if self.drop_last:
            takes = self._fields.get("take")  # a mixture's rows are counted by their takes
            self.dropped_ids.append(np.array((self._sid if takes is None else takes)[: self._fill], dtype=np.int64))
            self._fill = 0
            return
        yield self._emit(self._fill)


def _labels(rows: np.ndarray) -> np.ndarray:
    """A view's labels: class ids as int64, multi-hot rows as they are (contiguous)."""
    return np.ascontiguousarray(rows, dtype=np.int64 if rows.ndim == 1 else rows.dtype)
