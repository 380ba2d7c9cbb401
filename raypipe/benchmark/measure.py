"""Measuring a loader as a training loop sees it: each epoch timed from the start of its loop to its last
batch (epoch starts included), the first batch from the loader's start, the machine's CPU per image,
peak memory."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

__all__ = ["Result", "MemorySampler", "measure_epochs", "core_ticks"]

_CLOCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    # The headline, a trainer's view: the warm epochs' images over their seconds, each epoch timed from
    # the start of its loop to its last batch, so the wait at every epoch's start is in it.
    images_per_s: float
    # Cold: from the contender's start (its Ray, its worker processes) to the first batch.
    first_batch_s: float
    epoch_rates: list[float] = field(default_factory=list)  # each warm epoch's images / seconds
    # The same epochs without their starts: images after each epoch's first batch over the seconds after it.
    steady_per_s: float = 0.0
    epoch_start_s: float = 0.0  # median over warm epochs: the start of an epoch's loop to its first batch
    peak_rss_mb: float = 0.0  # the driver process
    peak_children_rss_mb: float = 0.0  # worker processes it started (timm's DataLoader workers)
    peak_object_store_mb: float | None = None
    note: str = ""
    # The whole machine's busy CPU over the warm epochs, per image (every process's, the loader's included)
    cpu_ms_per_image: float = 0.0
    # Where this row's images differ from raypipe's (another decoder, another resize filter)
    differs: str = ""
    # Why the row has no figure: "not installed: <the install command>", "not run: <why>"
    skipped: str = ""

    @property
    def median_rate(self) -> float:
        return statistics.median(self.epoch_rates) if self.epoch_rates else self.images_per_s

    @property
    def spread(self) -> float:
        """(fastest - slowest epoch) / the median epoch: 0.15 is a 15 % spread."""
        if len(self.epoch_rates) < 2 or self.median_rate <= 0:
            return 0.0
        return (max(self.epoch_rates) - min(self.epoch_rates)) / self.median_rate

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "images_per_s": round(self.images_per_s, 1),
            "steady_per_s": round(self.steady_per_s, 1),
            "median_epoch_per_s": round(self.median_rate, 1),
            "spread": round(self.spread, 3),
            "first_batch_s": round(self.first_batch_s, 3),
            "epoch_start_s": round(self.epoch_start_s, 3),
            "epoch_rates": [round(r, 1) for r in self.epoch_rates],
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "peak_children_rss_mb": round(self.peak_children_rss_mb, 1),
            "peak_object_store_mb": None if self.peak_object_store_mb is None else round(self.peak_object_store_mb, 1),
            "cpu_ms_per_image": round(self.cpu_ms_per_image, 3),
            "note": self.note,
            "differs": self.differs,
            "skipped": self.skipped,
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
    started: float | None = None,
    on_epoch: Callable[[int, int, float], None] | None = None,
) -> Result:
    """Run ``epochs`` epochs (epoch 0 is the warm-up) and summarise the warm ones. ``started`` is the
    ``time.perf_counter()`` at which the contender began (before its Ray or its workers started): the
    cold first batch is counted from there, else from the first epoch's loop. ``on_epoch(epoch, images,
    seconds)`` is called after each epoch (a progress line). The machine's CPU is read from ``/proc/stat``
    over the timed epochs: other work on the machine counts too, so take it from a quiet machine."""
    rates, starts, counts, times, after_n, after_s = [], [], [], [], [], []
    cold = 0.0
    busy0 = busy1 = 0
    with MemorySampler(object_store=object_store) as mem:
        for epoch in range(epochs):
            if epoch == min(1, epochs - 1):  # the first timed epoch
                busy0 = core_ticks()[0]
            t0 = time.perf_counter()
            first, first_n, n = None, 0, 0
            for batch in make_epoch(epoch):
                k = count(batch)
                if first is None:
                    first, first_n = time.perf_counter(), k
                n += k
            end = time.perf_counter()
            first = end if first is None else first
            if on_epoch is not None:
                on_epoch(epoch, n, end - t0)
            if epoch == 0:
                cold = first - (t0 if started is None else started)
            if epoch > 0 or epochs == 1:
                dt = end - t0
                rates.append(n / dt if dt > 0 else 0.0)
                counts.append(n)
                times.append(dt)
                starts.append(first - t0)
                after_n.append(n - first_n)
                after_s.append(end - first)
        busy1 = core_ticks()[0]
    return Result(
        name=name,
        # Aggregate, not the median of per-epoch rates: a pipeline that runs ahead across epochs can credit
        # one epoch with work done during its predecessor; images over seconds counts each image once.
        images_per_s=sum(counts) / sum(times) if sum(times) > 0 else 0.0,
        first_batch_s=cold,
        epoch_rates=rates,
        steady_per_s=sum(after_n) / sum(after_s) if sum(after_s) > 0 else 0.0,
        epoch_start_s=statistics.median(starts) if starts else 0.0,
        peak_rss_mb=mem.peak_rss / 2**20,
        peak_children_rss_mb=mem.peak_children / 2**20,
        peak_object_store_mb=mem.peak_store,
        note=note,
        cpu_ms_per_image=1000 * (busy1 - busy0) / _CLOCK / sum(counts) if sum(counts) else 0.0,
    )


def core_ticks(cores: set[int] | None = None) -> tuple[int, int]:
    """(busy, total) clock ticks of ``cores`` (None: every core) so far, from ``/proc/stat``; idle and
    iowait count as not busy."""
    busy = total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            if cores is not None and int(name[3:]) not in cores:
                continue
            values = [int(v) for v in fields]
            total += sum(values)
            busy += sum(values) - values[3] - values[4]
    return busy, total
