"""Pack augmented blocks into exact-size training batches.

Blocks arrive from Ray with any number of rows, some of them skip records. The packer keeps the
good rows and emits batches of exactly ``batch_size`` (the last one partial unless ``drop_last``):
``image`` uint8 (N, H, W, C) C-contiguous, ``label`` int64, ``sample_id`` int64. The whole batches
at the start of a clean block (every row good) are passed on as views of it, without a copy, also
while rows of earlier blocks wait in the pending batch; other rows are copied into the pending batch.
So one short or partly bad block costs one partial copy, not a copy of every block after it (blocks
arrive in Ray's completion order, so the rows' order across blocks was never fixed anyway).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["BatchSpec", "Packer"]


@dataclass(frozen=True)
class BatchSpec:
    """What every packed batch looks like; checked once, buffers allocated from it."""

    batch_size: int
    image_shape: tuple[int, int, int]  # (H, W, C)

    def check(self, block: dict[str, np.ndarray]) -> None:
        img = block["image"]
        if img.dtype != np.uint8 or tuple(img.shape[1:]) != self.image_shape:
            raise ValueError(
                f"block image is {img.dtype}{tuple(img.shape[1:])}, expected uint8{self.image_shape}"
            )


class Packer:
    """Accumulate good rows; yield exact batches. Not thread-safe (one consumer)."""

    def __init__(self, spec: BatchSpec, *, drop_last: bool = False):
        self.spec = spec
        self.drop_last = drop_last
        self._new_buffers()
        self.dropped_ids: list[np.ndarray] = []  # ids of a final partial batch dropped by drop_last

    def _new_buffers(self) -> None:
        b = self.spec.batch_size
        # A fresh buffer per batch: the consumer may keep a batch while we fill the next one.
        self._image = np.empty((b, *self.spec.image_shape), dtype=np.uint8)
        self._label = np.empty(b, dtype=np.int64)
        self._sid = np.empty(b, dtype=np.int64)
        self._fill = 0

    def _emit(self, n: int) -> dict[str, np.ndarray]:
        out = {"image": self._image[:n], "label": self._label[:n], "sample_id": self._sid[:n]}
        self._new_buffers()
        return out

    def add(self, block: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """Add one block of rows (with an ``ok`` mask); yield every batch that became full."""
        self.spec.check(block)
        ok = block["ok"]
        b = self.spec.batch_size
        start_row = 0
        if ok.all() and block["image"].flags.c_contiguous:
            # Whole clean batches at the start of a block are views of it: no copy in this process.
            # Pending rows stay pending: copying this block behind them would copy every block after.
            full = len(ok) // b
            for j in range(full):
                rows = slice(j * b, (j + 1) * b)
                yield {
                    "image": block["image"][rows],
                    "label": np.ascontiguousarray(block["label"][rows], dtype=np.int64),
                    "sample_id": np.ascontiguousarray(block["sample_id"][rows], dtype=np.int64),
                }
            start_row = full * b
            if start_row == len(ok):
                return
        idx = np.flatnonzero(ok[start_row:]) + start_row
        start = 0
        while start < len(idx):
            take = idx[start : start + b - self._fill]
            k = len(take)
            f = self._fill
            # mode="clip": indices are in range by construction, and the default ("raise") copies through a
            # temporary buffer, about 3x the time (``python bench/pipeline_profile.py --take`` times both)
            np.take(block["image"], take, axis=0, out=self._image[f : f + k], mode="clip")
            self._label[f : f + k] = block["label"][take]
            self._sid[f : f + k] = block["sample_id"][take]
            self._fill += k
            start += k
            if self._fill == b:
                yield self._emit(b)

    def flush(self) -> Iterator[dict[str, np.ndarray]]:
        """End of epoch: the partial batch, or nothing if empty or ``drop_last``."""
        if self._fill == 0:
            return
        if self.drop_last:
            self.dropped_ids.append(self._sid[: self._fill].copy())
            self._fill = 0
            return
        yield self._emit(self._fill)
