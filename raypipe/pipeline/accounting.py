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
    """An epoch skipped more rows than ``PipelineConfig.max_skips`` or ``max_skip_ratio`` allow.

    The message is meant for a user as it is (no traceback needed): how many of how many, the top
    reasons, a few paths, and the setting that raises the limit."""


@dataclass(frozen=True)
class Skip:
    sample_id: int
    path: str
    reason: str
    detail: str
    key: int | None = None  # what the ledger counts it by: a mixture's take (None: the sample id)

    def as_dict(self) -> dict:
        return {"sample_id": self.sample_id, "path": self.path, "reason": self.reason, "detail": self.detail}


@dataclass
class EpochReport:
    """One epoch's accounting of a rank: each source row emitted, dropped by ``drop_last`` or skipped.

    Made at the epoch's end (``EpochSource.reports``, ``last_report``); ``as_dict()`` is its JSON.

    Args:
        epoch: the epoch.
        expected: source rows this epoch (this rank's shard).
        emitted: samples in the batches yielded.
        dropped_last: good samples ``drop_last`` cut with the final partial batch.
        skipped: skipped rows per reason.
        skipped_paths: every skipped row (``sample_id``, ``path``, ``reason``, ``detail``), by id.
        seconds, first_batch_s: the epoch's time, and the time to its first batch.
        ids_sha256: sha256 of the emitted sample ids, sorted.
        content_sha256: sha256 over the emitted samples' ids and pixels (None: not asked for,
            ``Pipeline(content_digest=False)``).

    Raises:
        Nothing: a plain record, its fields unchecked.
    """

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
        takes = block.get("fields", {}).get("take")  # a mixture's: a row taken twice is two takes
        for i in bad:
            sid, path = int(block["sample_id"][i]), str(block["path"][i])
            key = sid if takes is None else int(takes[i])
            self._skips.append(Skip(sid, path, str(block["reason"][i]), str(block["detail"][i]), key))
        if self.max_skips is not None and len(self._skips) > self.max_skips:
            raise SkipLimitError(self._limit_message(f"more than max_skips={self.max_skips}", "--max-skips"))
        # Skips only accumulate: once over the ratio the epoch cannot pass, so stop now, not at its end.
        self._check_ratio()

    def record_batch(self, batch: dict[str, np.ndarray]) -> None:
        ids = batch["sample_id"]
        self._ids.append(np.array(batch["take"] if "take" in batch else ids, dtype=np.int64))
        if self.with_content:
            img = batch["image"]
            for i in range(len(ids)):
                h = hashlib.sha256(np.int64(ids[i]).tobytes())
                h.update(memoryview(np.ascontiguousarray(img[i])).cast("B"))
                self._digests.append(h.digest())

    def record_dropped(self, ids: np.ndarray) -> None:
        self._dropped.append(np.asarray(ids, dtype=np.int64))

    def _check_ratio(self, final: bool = False) -> None:
        n, total, limit = len(self._skips), self.expected, self.max_skip_ratio
        if limit is not None and total and n / total > limit:  # exactly the limit passes
            why = f"more than max_skip_ratio={limit:g} allows"
            raise SkipLimitError(self._limit_message(why, "--max-skip-ratio", final=final))

    def _limit_message(self, why: str, flag: str, examples: int = 5, final: bool = False) -> str:
        """A few lines: the count, the top reasons, up to ``examples`` paths, and how to raise the limit."""
        n, total = len(self._skips), self.expected
        share = f" ({100 * n / total:.1f} %)" if total else ""
        reasons = Counter(s.reason for s in self._skips).most_common(3)
        field = flag.lstrip("-").replace("-", "_")
        lines = [
            f"epoch {self.epoch}: {n} of {total} samples skipped{'' if final else ' so far'}{share}, {why}",
            "  top reasons: " + ", ".join(f"{reason} {count}" for reason, count in reasons),
        ]
        for skip in self._skips[:examples]:
            detail = f" ({skip.detail[:120]})" if skip.detail else ""
            lines.append(f"  {skip.reason}: {skip.path}{detail}")
        if n > examples:
            lines.append(f"  … and {n - examples} more (raypipe scan DATA lists them all)")
        lines.append(f"  fix the data, or raise the limit: {flag} (PipelineConfig.{field})")
        return "\n".join(lines)

    def finish(self, seconds: float, first_batch_s: float) -> EpochReport:
        ids = np.concatenate(self._ids) if self._ids else np.empty(0, np.int64)
        dropped = np.concatenate(self._dropped) if self._dropped else np.empty(0, np.int64)
        skipped_ids = np.array([s.sample_id if s.key is None else s.key for s in self._skips], dtype=np.int64)
        seen = np.concatenate([ids, dropped, skipped_ids])
        if len(np.unique(seen)) != len(seen):
            raise RuntimeError(f"epoch {self.epoch}: a sample id reached the consumer twice (accounting broken)")
        if len(seen) != self.expected:
            raise RuntimeError(
                f"epoch {self.epoch}: {len(seen)} samples accounted for, {self.expected} expected (samples lost)"
            )
        self._check_ratio(final=True)
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
