"""A rank's figures as metrics: Ray's (``ray.util.metrics``, which its metrics agent serves to Prometheus),
or, for a run outside Ray, the same series served on loopback by ``prometheus_client`` (``serve``).

The names, types and tags below are a contract (docs/cluster.md lists them, and a test checks that list
against ``METRICS``): dashboards and alerts are written against them. Ray exports a metric ``NAME`` as
``ray_NAME`` (a counter as ``ray_NAME_total``, a histogram as ``ray_NAME_bucket``/``_sum``/``_count``);
the served path uses the same exported names, so one dashboard reads both.

What the hot path pays: the consumer (``EpochSource``, ``ChunkStream``) calls a ``RunMetrics`` once per
batch (an integer added) and once per chunk (a few numbers kept); the counts and observations go to the
metrics backend at most once per ``INTERVAL_S`` and at each epoch's end, and the gauges are read then.
Where nothing exports (no Ray in this process and no ``serve``), every call is a method that does
nothing (``NULL``). Tag values are the run's name, the rank, and members of fixed sets (the skip
reasons of ``raypipe.kernels.errors``, the backends, a mixture's part indexes): never a path or anything
else from the data.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from raypipe.kernels.errors import REASONS

__all__ = [
    "BACKENDS",
    "INTERVAL_S",
    "METRICS",
    "MetricSpec",
    "NULL",
    "RunMetrics",
    "exported_names",
    "metrics_for",
    "serve",
]

log = logging.getLogger(__name__)

# Gauges are read and counts sent at most this often: a few times per Prometheus scrape (15 s by
# default), and the same step as the elastic controller's order of magnitude.
INTERVAL_S = 5.0
# What made a chunk (tag ``backend``): Ray tasks, local worker processes, node workers, or the
# consumer itself (while the workers start).
BACKENDS = ("ray", "local", "nodes", "here")
OTHER_REASON = "other"  # a reason outside the fixed set: counted, never a new series
_RUN_TAGS = ("run", "rank")
# Seconds; a chunk is usually one to a few seconds of work.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
# Seconds of CPU per image: a 224 px RandomResizedCrop + flip is ~1-3 ms, rand-m9 more, a big decode 20+.
CPU_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128)


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: its name (before Ray's ``ray_`` prefix), type, tags and meaning."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    tags: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("raypipe_images_emitted", "counter", _RUN_TAGS, "images in the batches the rank handed out"),
    MetricSpec("raypipe_images_skipped", "counter", (*_RUN_TAGS, "reason"), "rows skipped, by reason"),
    MetricSpec("raypipe_chunks_made", "counter", (*_RUN_TAGS, "backend"), "chunks the rank took, by what made them"),
    MetricSpec(
        "raypipe_images_by_source",
        "counter",
        (*_RUN_TAGS, "source"),
        "a mixture's good rows the rank took, by part (its index in the mixture)",
    ),
    MetricSpec(
        "raypipe_wait_share",
        "gauge",
        _RUN_TAGS,
        "share of the last interval the rank's consumer waited for its next chunk (the trainer's stall)",
    ),
    MetricSpec("raypipe_width_wanted", "gauge", _RUN_TAGS, "workers the rank wants (elastic: its controller's)"),
    MetricSpec("raypipe_workers_running", "gauge", _RUN_TAGS, "workers running for the rank"),
    MetricSpec("raypipe_workers_pending", "gauge", _RUN_TAGS, "workers waiting for a node (pending launchers)"),
    MetricSpec("raypipe_chunks_ready_ahead", "gauge", _RUN_TAGS, "chunks finished before the consumer asked"),
    MetricSpec("raypipe_epoch", "gauge", _RUN_TAGS, "the epoch the rank reads"),
    MetricSpec("raypipe_epoch_batches", "gauge", _RUN_TAGS, "batches handed out in that epoch"),
    MetricSpec(
        "raypipe_chunk_latency_seconds",
        "histogram",
        _RUN_TAGS,
        "seconds from a chunk's submission to the consumer finding it done",
        LATENCY_BUCKETS,
    ),
    MetricSpec(
        "raypipe_augment_cpu_seconds_per_image",
        "histogram",
        _RUN_TAGS,
        "CPU seconds per image of the read-decode-augment stage, per chunk",
        CPU_BUCKETS,
    ),
)
_SPECS = {m.name: m for m in METRICS}


def exported_names(spec: MetricSpec) -> tuple[str, ...]:
    """The series names Prometheus shows for ``spec`` (Ray's and ``serve``'s alike).

    Args:
        spec: one of ``METRICS``.

    Returns:
        ``ray_NAME_total`` for a counter, ``ray_NAME`` for a gauge, ``ray_NAME_bucket``, ``_sum`` and
        ``_count`` for a histogram.

    Raises:
        ValueError: an unknown kind.
    """
    base = f"ray_{spec.name}"
    if spec.kind == "counter":
        return (f"{base}_total",)
    if spec.kind == "gauge":
        return (base,)
    if spec.kind == "histogram":
        return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
    raise ValueError(f"kind={spec.kind!r}")


class RunMetrics:
    """What a rank's consumer tells the metrics; this base class records nothing (``NULL``), and
    ``metrics_for`` gives one that records where something exports. All of a rank's calls come from its
    consumer's thread (the one iterating its ``EpochSource``)."""

    enabled = False
    interval_s = INTERVAL_S

    def epoch_started(self, epoch: int, batches: int) -> None:
        """The consumer begins ``epoch`` after ``batches`` batches of it (a resume)."""

    def batch(self, images: int) -> None:
        """A batch of ``images`` images was handed out."""

    def block(self, block: dict) -> None:
        """A chunk's rows reached the consumer: its skips (by reason) and its stage's CPU (``cpu_s``)."""

    def chunk(self, backend: str, latency_s: float) -> None:
        """A chunk made by ``backend`` was taken, ``latency_s`` after it was asked for."""

    def waited(self, seconds: float) -> None:
        """The consumer was blocked ``seconds`` on its next chunk."""

    def due(self) -> bool:
        """Whether an interval has passed (then ``tick`` sends the figures)."""
        return False

    def tick(self, probe: Callable[[], dict[str, float]] | None = None) -> None:
        """Send what was counted, and the gauges (``probe()``: the stream's width figures), if due."""

    def flush(self, probe: Callable[[], dict[str, float]] | None = None) -> None:
        """Send what was counted now (an epoch's end, a stop)."""


NULL = RunMetrics()


class _Recording(RunMetrics):
    """Counts kept in this process and sent to ``sink`` once per interval (``RunMetrics``'s methods)."""

    enabled = True

    def __init__(self, sink, run: str, rank: int, *, clock: Callable[[], float] = time.monotonic):
        self._sink, self._clock = sink, clock
        self._tags = {"run": run, "rank": str(rank)}
        self._lock = threading.Lock()  # a flush from another thread (a close) while the consumer counts
        self._since = clock()
        self._wait = 0.0
        self._shared = False  # whether a wait share was sent yet
        self._emitted = 0
        self._skipped: collections.Counter = collections.Counter()
        self._chunks: collections.Counter = collections.Counter()
        self._by_source: collections.Counter = collections.Counter()
        self._latency: list[float] = []
        self._cpu: list[float] = []
        self._epoch, self._batches = 0, 0

    def epoch_started(self, epoch: int, batches: int) -> None:
        self._epoch, self._batches = epoch, batches

    def batch(self, images: int) -> None:
        self._emitted += images
        self._batches += 1

    def block(self, block: dict) -> None:
        ok = block["ok"]
        rows = len(ok)
        if rows and not ok.all():
            reasons = block["reason"][~ok]
            for reason in reasons:
                self._skipped[reason if reason in REASONS else OTHER_REASON] += 1
        sources = block.get("fields", {}).get("source")  # a mixture's: each row's part
        if sources is not None and rows:
            self._by_source.update(np.asarray(sources)[ok].tolist())
        cpu = block.get("cpu_s")
        if cpu is not None and rows:
            self._cpu.append(float(cpu) / rows)

    def chunk(self, backend: str, latency_s: float) -> None:
        self._chunks[backend if backend in BACKENDS else "here"] += 1
        self._latency.append(latency_s)

    def waited(self, seconds: float) -> None:
        self._wait += seconds

    def due(self) -> bool:
        return self._clock() - self._since >= self.interval_s

    def tick(self, probe: Callable[[], dict[str, float]] | None = None) -> None:
        if self.due():
            self.flush(probe)

    def flush(self, probe: Callable[[], dict[str, float]] | None = None) -> None:
        with self._lock:
            now = self._clock()
            span, wait = now - self._since, self._wait
            # the wait share over at least half an interval (an epoch's end soon after a tick adds to the
            # next), or over what there is the first time, so that the gauge exists from the first epoch
            share = span > 0 and (span >= self.interval_s / 2 or not self._shared)
            if share:
                self._since, self._wait, self._shared = now, 0.0, True
            emitted, self._emitted = self._emitted, 0
            skipped, self._skipped = self._skipped, collections.Counter()
            chunks, self._chunks = self._chunks, collections.Counter()
            by_source, self._by_source = self._by_source, collections.Counter()
            latency, self._latency = self._latency, []
            cpu, self._cpu = self._cpu, []
        tags, sink = self._tags, self._sink
        try:
            if emitted:
                sink.inc("raypipe_images_emitted", emitted, tags)
            for reason, n in skipped.items():
                sink.inc("raypipe_images_skipped", n, {**tags, "reason": str(reason)})
            for backend, n in chunks.items():
                sink.inc("raypipe_chunks_made", n, {**tags, "backend": backend})
            for part, n in by_source.items():
                sink.inc("raypipe_images_by_source", n, {**tags, "source": str(part)})
            for value in latency:
                sink.observe("raypipe_chunk_latency_seconds", value, tags)
            for value in cpu:
                sink.observe("raypipe_augment_cpu_seconds_per_image", value, tags)
            gauges = {"raypipe_epoch": self._epoch, "raypipe_epoch_batches": self._batches}
            if share:
                gauges["raypipe_wait_share"] = min(1.0, wait / span)
            if probe is not None:
                gauges.update(probe())
            for name, value in gauges.items():
                if name in _SPECS:
                    sink.set(name, float(value), tags)
        except Exception as e:  # a metrics backend that fails must not fail the run
            log.warning("raypipe: metrics not sent (%s: %s); the run goes on without them", type(e).__name__, e)
            self._sink = _NullSink()


class _NullSink:
    def inc(self, name, value, tags) -> None:
        pass

    def observe(self, name, value, tags) -> None:
        pass

    def set(self, name, value, tags) -> None:
        pass


class _RaySink:
    """``ray.util.metrics`` objects, made once per process."""

    def __init__(self):
        from ray.util import metrics as ray_metrics

        made = {}
        for m in METRICS:
            if m.kind == "counter":
                made[m.name] = ray_metrics.Counter(m.name, m.help, tag_keys=m.tags)
            elif m.kind == "gauge":
                made[m.name] = ray_metrics.Gauge(m.name, m.help, tag_keys=m.tags)
            else:
                made[m.name] = ray_metrics.Histogram(m.name, m.help, boundaries=list(m.buckets), tag_keys=m.tags)
        self._m = made

    def inc(self, name, value, tags) -> None:
        self._m[name].inc(value, tags=tags)

    def observe(self, name, value, tags) -> None:
        self._m[name].observe(value, tags=tags)

    def set(self, name, value, tags) -> None:
        self._m[name].set(value, tags=tags)


class _PromSink:
    """``prometheus_client`` metrics in a registry of their own, under the names Ray exports."""

    def __init__(self):
        import prometheus_client as prom

        self.registry = prom.CollectorRegistry()
        made = {}
        for m in METRICS:
            name = f"ray_{m.name}"
            if m.kind == "counter":
                made[m.name] = prom.Counter(name, m.help, m.tags, registry=self.registry)
            elif m.kind == "gauge":
                made[m.name] = prom.Gauge(name, m.help, m.tags, registry=self.registry)
            else:
                made[m.name] = prom.Histogram(name, m.help, m.tags, buckets=m.buckets, registry=self.registry)
        self._m = made

    def inc(self, name, value, tags) -> None:
        self._m[name].labels(**tags).inc(value)

    def observe(self, name, value, tags) -> None:
        self._m[name].labels(**tags).observe(value)

    def set(self, name, value, tags) -> None:
        self._m[name].labels(**tags).set(value)


_sink_lock = threading.Lock()
_served: _PromSink | None = None  # set by serve(): this process's series go to its HTTP endpoint
_ray_sink: _RaySink | None = None
_ray_failed = False
_servers: list = []


def serve(port: int, host: str = "127.0.0.1") -> bool:
    """Serve this process's series for Prometheus on ``host:port`` (``/metrics``), from now on in place of
    Ray's (``raypipe run --metrics-port``).

    Args:
        port: the TCP port.
        host: the address to listen on; loopback by default (Prometheus on this machine).

    Returns:
        True when serving; False when the port could not be taken (one line on stderr says so, and the
        run goes on without metrics).

    Raises:
        Nothing: a port already taken, or a missing ``prometheus_client``, is the line on stderr.
    """
    global _served
    try:
        import prometheus_client as prom

        sink = _served or _PromSink()
        server = prom.start_http_server(port, addr=host, registry=sink.registry)
    except (OSError, ImportError) as e:
        print(
            f"raypipe: metrics not served on {host}:{port} ({e.strerror or e if isinstance(e, OSError) else e}); "
            "the run goes on without them",
            file=sys.stderr,
            flush=True,
        )
        return False
    with _sink_lock:
        _served = sink
        _servers.append(server)  # (server, thread) on prometheus_client >= 0.17; kept for tests to stop
    return True


def _sink():
    """This process's metrics backend: ``serve``'s, else Ray's where Ray is initialised here, else None."""
    global _ray_sink, _ray_failed
    if _served is not None:
        return _served
    ray = sys.modules.get("ray")  # not imported for a run that never used Ray
    if ray is None or _ray_failed or not ray.is_initialized():
        return None
    with _sink_lock:
        if _ray_sink is None and not _ray_failed:
            try:
                _ray_sink = _RaySink()
            except Exception as e:  # a Ray without metrics: the run goes on without them
                _ray_failed = True
                log.warning("raypipe: Ray's metrics are not available (%s: %s)", type(e).__name__, e)
        return _ray_sink


def metrics_for(run: str, rank: int) -> RunMetrics:
    """The metrics of rank ``rank`` of run ``run`` in this process: recording where something exports
    them (``serve`` was called, or Ray is initialised here), else ``NULL``.

    Args:
        run: the run's name (tag ``run``); "" is "raypipe".
        rank: the rank (tag ``rank``).

    Returns:
        A ``RunMetrics``.

    Raises:
        Nothing.
    """
    sink = _sink()
    if sink is None:
        return NULL
    return _Recording(sink, run or "raypipe", rank)
