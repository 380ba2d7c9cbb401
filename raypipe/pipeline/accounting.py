"""Per-epoch accounting: every source row ends as emitted or skipped(reason), exactly once.

Counts are taken from what reached the consumer (not from worker-side counters), so a task Ray
retried after a crash cannot be counted twice; a duplicate or missing sample id is an error.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

__all__ = ["EpochReport", "EpochLedger", "SkipLimitError", "Skip"]


class SkipLimitError(RuntimeError):
    """Too many samples were skipped; the message lists their paths and reasons."""


@dataclass(frozen=True)
class Skip:
    sample_id: int
    path: str
    reason: str
    detail: str

    def as_dict(self) -> dict:
        return {"sample_id": self.sample_id, "path": self.path, "reason": self.reason, "detail": self.detail}


@dataclass
class EpochReport:
    epoch: int
    expected: int  # source rows this epoch (this rank's shard)
    emitted: int
    dropped_last: int  # good samples not emitted because drop_last cut the final partial batch
    skipped: dict[str, int]
    skipped_paths: list[dict]
    seconds: float
    first_batch_s: float
    ids_sha256: str
    content_sha256: str | None

    @property
    def images_per_s(self) -> float:
        return self.emitted / self.seconds if self.seconds > 0 else 0.0

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def as_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "expected": self.expected,
            "emitted": self.emitted,
            "dropped_last": self.dropped_last,
            "skipped": dict(self.skipped),
            "skipped_paths": list(self.skipped_paths),
            "images_per_s": round(self.images_per_s, 2),
            "seconds": round(self.seconds, 3),
            "first_batch_s": round(self.first_batch_s, 3),
            "ids_sha256": self.ids_sha256,
            "content_sha256": self.content_sha256,
        }


def ids_digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.sort(ids.astype("<i8")).tobytes()).hexdigest()


@dataclass
class EpochLedger:
    """Collects what the consumer saw during one epoch."""

    epoch: int
    expected: int
    with_content: bool = False
    max_skip_ratio: float | None = None
    max_skips: int | None = None
    _ids: list[np.ndarray] = field(default_factory=list)
    _dropped: list[np.ndarray] = field(default_factory=list)
    _digests: list[bytes] = field(default_factory=list)
    _skips: list[Skip] = field(default_factory=list)

    def record_block(self, block: dict[str, np.ndarray]) -> None:
        """Record the skip records of a raw block (emitted ids are recorded per batch)."""
        bad = np.flatnonzero(~block["ok"])
        for i in bad:
            sid, path = int(block["sample_id"][i]), str(block["path"][i])
            self._skips.append(Skip(sid, path, str(block["reason"][i]), str(block["detail"][i])))
        if self.max_skips is not None and len(self._skips) > self.max_skips:
            raise SkipLimitError(self._limit_message(f"more than max_skips={self.max_skips}"))

    def record_batch(self, batch: dict[str, np.ndarray]) -> None:
        ids = batch["sample_id"]
        self._ids.append(np.array(ids, dtype=np.int64))
        if self.with_content:
            img = batch["image"]
            for i in range(len(ids)):
                h = hashlib.sha256(np.int64(ids[i]).tobytes())
                h.update(memoryview(np.ascontiguousarray(img[i])).cast("B"))
                self._digests.append(h.digest())

    def record_dropped(self, ids: np.ndarray) -> None:
        self._dropped.append(np.asarray(ids, dtype=np.int64))

    def _limit_message(self, why: str) -> str:
        lines = [f"epoch {self.epoch}: {len(self._skips)} of {self.expected} samples skipped ({why}):"]
        lines += [f"  {s.path}: {s.reason} {s.detail}".rstrip() for s in self._skips[:200]]
        if len(self._skips) > 200:
            lines.append(f"  … and {len(self._skips) - 200} more")
        return "\n".join(lines)

    def finish(self, seconds: float, first_batch_s: float) -> EpochReport:
        ids = np.concatenate(self._ids) if self._ids else np.empty(0, np.int64)
        dropped = np.concatenate(self._dropped) if self._dropped else np.empty(0, np.int64)
        skipped_ids = np.array([s.sample_id for s in self._skips], dtype=np.int64)
        seen = np.concatenate([ids, dropped, skipped_ids])
        if len(np.unique(seen)) != len(seen):
            raise RuntimeError(f"epoch {self.epoch}: a sample id reached the consumer twice (accounting broken)")
        if len(seen) != self.expected:
            raise RuntimeError(
                f"epoch {self.epoch}: {len(seen)} samples accounted for, {self.expected} expected (samples lost)"
            )
        n_skip = len(self._skips)
        if self.max_skip_ratio is not None and self.expected and n_skip / self.expected > self.max_skip_ratio:
            raise SkipLimitError(self._limit_message(f"ratio {n_skip / self.expected:.4f} > {self.max_skip_ratio}"))
        content = None
        if self.with_content:
            content = hashlib.sha256(b"".join(sorted(self._digests))).hexdigest()
        return EpochReport(
            epoch=self.epoch,
            expected=self.expected,
            emitted=int(len(ids)),
            dropped_last=int(len(dropped)),
            skipped=dict(sorted(Counter(s.reason for s in self._skips).items())),
            skipped_paths=[s.as_dict() for s in sorted(self._skips, key=lambda s: s.sample_id)],
            seconds=seconds,
            first_batch_s=first_batch_s,
            ids_sha256=ids_digest(ids),
            content_sha256=content,
        )
