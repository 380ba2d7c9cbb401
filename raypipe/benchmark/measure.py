"""Measuring a loader: images/s per epoch, time to first batch, peak driver RSS and object store."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

__all__ = ["Result", "MemorySampler", "measure_epochs"]


@dataclass
class Result:
    name: str
    images_per_s: float  # all warm epochs together (images / seconds), after the warm-up epoch
    first_batch_s: float  # median time from starting an epoch to its first batch (warm epochs)
    epoch_rates: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0  # the driver process
    peak_children_rss_mb: float = 0.0  # worker processes it started (timm's DataLoader workers)
    peak_object_store_mb: float | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "images_per_s": round(self.images_per_s, 1),
            "first_batch_s": round(self.first_batch_s, 3),
            "epoch_rates": [round(r, 1) for r in self.epoch_rates],
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "peak_children_rss_mb": round(self.peak_children_rss_mb, 1),
            "peak_object_store_mb": None if self.peak_object_store_mb is None else round(self.peak_object_store_mb, 1),
            "note": self.note,
        }


def _object_store_used_mb() -> float | None:
    try:
        import ray

        if not ray.is_initialized():
            return None
        total = ray.cluster_resources().get("object_store_memory", 0.0)
        free = ray.available_resources().get("object_store_memory", total)
        return max(0.0, (total - free) / 2**20)
    except Exception:  # noqa: BLE001 - best effort
        return None


class MemorySampler:
    """Samples the driver's RSS (and its children's, and Ray's object store) in a thread."""

    def __init__(self, interval_s: float = 0.2, object_store: bool = False):
        self.interval_s = interval_s
        self.object_store = object_store
        self.peak_rss = 0
        self.peak_children = 0
        self.peak_store: float | None = None
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True, name="raypipe-mem-sampler")

    def _sample(self) -> None:
        self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)
        children = 0
        for child in self._proc.children(recursive=True):
            try:
                children += child.memory_info().rss
            except psutil.Error:
                pass
        self.peak_children = max(self.peak_children, children)
        if self.object_store:
            used = _object_store_used_mb()
            if used is not None:
                self.peak_store = max(self.peak_store or 0.0, used)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> MemorySampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def measure_epochs(
    name: str,
    make_epoch: Callable[[int], Iterable],
    *,
    epochs: int,
    count: Callable[[object], int],
    object_store: bool = False,
    note: str = "",
) -> Result:
    """Run ``epochs`` epochs (epoch 0 is the warm-up) and summarise the warm ones: images/s over all of
    them together, the median time to first batch, peak memory."""
    rates, firsts, counts, times = [], [], [], []
    with MemorySampler(object_store=object_store) as mem:
        for epoch in range(epochs):
            t0 = time.perf_counter()
            first = None
            n = 0
            for batch in make_epoch(epoch):
                if first is None:
                    first = time.perf_counter() - t0
                n += count(batch)
            dt = time.perf_counter() - t0
            if epoch > 0 or epochs == 1:
                rates.append(n / dt if dt > 0 else 0.0)
                counts.append(n)
                times.append(dt)
                firsts.append(first or dt)
    return Result(
        name=name,
        # Aggregate, not the median of per-epoch rates: raypipe starts each epoch's execution while the
        # previous one drains, so one epoch can be credited with work done during its predecessor.
        images_per_s=sum(counts) / sum(times) if sum(times) > 0 else 0.0,
        first_batch_s=statistics.median(firsts),
        epoch_rates=rates,
        peak_rss_mb=mem.peak_rss / 2**20,
        peak_children_rss_mb=mem.peak_children / 2**20,
        peak_object_store_mb=mem.peak_store,
        note=note,
    )
