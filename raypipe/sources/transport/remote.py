"""How reads from object stores are made: how many at once, which failures are retried, how long to wait.

A worker reading one object after another runs at ``1 / latency`` objects per second whatever its CPUs
(20 ms per request: 50 img/s). Little's law says how many requests must be in flight to sustain a rate:
``in_flight = rate × latency``; e.g. 1000 img/s per node × 30 ms ≈ 30. That is the least: a task
decodes its block's rows in order, and a block's later rows are requested only as slots free up, so
with fewer slots than rows the store's first-byte latency comes back in waves through the block, and
each block starts with a wait. Requests are cheap to keep in flight (a thread blocked on a socket costs
no CPU), so the default, 128 per reading worker, sends a block of up to 128 rows (the chunk of a batch
of 128) all at once, and the task waits for the store about once per block. A node with several workers
keeps that many per worker, each request a thread of the worker's while it runs. Lower it when the
store throttles or threads are scarce; raise it for larger blocks or a slower store.

Transient failures (a reset connection, a timeout, throttling, a 5xx answer) are retried with
exponential back-off and jitter; only when the retries are spent does the image become a counted skip
(``unreadable``, with the last error). A missing object is ``missing`` at once: waiting will not make it
appear. Everything else (access denied, a bad request) is not retried. pyarrow reports all of these as
``OSError`` with the store's message, so the classification reads the message, conservatively: only
what is known to be transient is retried.

Process-wide defaults are raypipe's settings (``raypipe.settings``: ``read_in_flight``, ``read_retries`` …,
which the ``RAYPIPE_READ_*`` variables set); a pipeline's workers read with the settings its stage spec
carries (``ReadOptions.from_settings``); per-reader values are given with :class:`ReadOptions`.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from raypipe import settings
from raypipe.kernels.errors import MISSING, UNREADABLE, SkipImage
from raypipe.settings import Settings
from raypipe.sources.transport.cache_config import CacheConfig

__all__ = ["ReadOptions", "is_missing", "is_transient", "read_skip", "reads_store_objects", "with_retries"]

T = TypeVar("T")


@dataclass(frozen=True)
class ReadOptions:
    """How a worker reads from a non-local filesystem (local roots read sequentially: no waiting to hide).
    A field left out is the settings' in force where it is made (``raypipe.settings.current()``)."""

    # Requests in flight per reading worker: at least rate × latency (Little's law); as many as a block's
    # rows, so that a block's requests go out together (see the module doc).
    in_flight: int = field(default_factory=lambda: settings.current().read_in_flight)
    # Class prefixes listed at once when a remote folder is listed (a store answers 1,000 keys a page): enough
    # that waiting is not what bounds it (2,300 pages of 20 ms are 0.7 s at 64); pyarrow's S3 client sends
    # at most ``pyarrow.io_thread_count()`` (8 by default) at a time. 1: one recursive listing, page by page.
    list_in_flight: int = field(default_factory=lambda: settings.current().list_in_flight)
    # Retries after the first attempt of a transiently failing request: 5 wait at most ~3 s in all by default,
    # longer than the brief throttling and connection resets a store shows under load.
    retries: int = field(default_factory=lambda: settings.current().read_retries)
    # First back-off; doubled per retry, capped at ``max_backoff_s``, and drawn uniformly in [0, that] so
    # that many workers throttled at once do not retry in step.
    backoff_s: float = field(default_factory=lambda: settings.current().read_backoff_s)
    max_backoff_s: float = 5.0
    # A node-local cache of whole remote objects (``raypipe.sources.transport.cache``); None: every read goes to the
    # store. By default from the settings' ``cache_dir`` / ``cache_max_bytes`` where the reader is made
    # (neither set: remote folders' images, in ~/.cache/raypipe).
    cache: CacheConfig | None = field(default_factory=CacheConfig.from_env)

    def __post_init__(self) -> None:
        if self.in_flight < 1:
            raise ValueError(f"in_flight={self.in_flight}: must be at least 1")
        if self.list_in_flight < 1:
            raise ValueError(f"list_in_flight={self.list_in_flight}: must be at least 1")
        if self.retries < 0:
            raise ValueError(f"retries={self.retries}: must be 0 or more")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"backoff_s={self.backoff_s}, max_backoff_s={self.max_backoff_s}: must be 0 or more")

    @classmethod
    def from_settings(cls, s: Settings) -> ReadOptions:
        """The options of ``s``: what a worker reads with for a stage spec that carries ``s``; the cache's
        default folder is this node's (``CacheConfig.from_settings``)."""
        return cls(
            in_flight=s.read_in_flight,
            list_in_flight=s.list_in_flight,
            retries=s.read_retries,
            backoff_s=s.read_backoff_s,
            cache=CacheConfig.from_settings(s),
        )


_MISSING_WORDS = ("not found", "does not exist", "no such key", "nosuchkey", "no such file")
# Words of transient failures in the messages of pyarrow's S3/GCS/Azure/HDFS filesystems and of curl.
_TRANSIENT = re.compile(
    r"connection (reset|refused|aborted|closed)|broken pipe|timed? ?out|timeout|throttl|slow ?down|"
    r"too many requests|service ?unavailable|internal ?(server )?error|internal_failure|network_connection|"
    r"temporar(il)?y unavailable|try again|curl ?code|unexpected eof|(status|code)[ :=]*(429|5\d\d)\b",
    re.IGNORECASE,
)


def is_missing(exc: BaseException) -> bool:
    """The object does not exist (no retry can help)."""
    if isinstance(exc, FileNotFoundError):
        return True
    return isinstance(exc, OSError) and any(w in str(exc).lower() for w in _MISSING_WORDS)


def is_transient(exc: BaseException) -> bool:
    """A failure that a later attempt may not meet: a network error, a timeout, throttling, a 5xx."""
    if is_missing(exc) or isinstance(exc, (PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and _TRANSIENT.search(str(exc)) is not None


def with_retries(fn: Callable[[], T], options: ReadOptions, *, sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, again after a back-off while it fails transiently, at most ``options.retries`` more times;
    the last failure (or any that is not transient) is raised as it is."""
    attempt = 0
    while True:
        try:
            return fn()
        except OSError as exc:
            if attempt >= options.retries or not is_transient(exc):
                raise
            cap = min(options.max_backoff_s, options.backoff_s * 2**attempt)
            sleep(random.Random().uniform(0, cap))  # its own generator: never touches the global RNG
            attempt += 1


def read_skip(exc: OSError, what: str) -> SkipImage:
    """The skip record of a failed read of ``what`` (after any retries)."""
    return SkipImage(MISSING if is_missing(exc) else UNREADABLE, f"{what}: {exc}")


def reads_store_objects(rows, s: Settings | None = None) -> bool:
    """Whether the tasks reading ``rows`` (``SourceRows``) send a request per row to an object store: a
    remote folder or manifest, without a local cache for it in the settings they read with (``s``,
    by default those in force here). A sharded source's task reads a whole window of shards in a few
    requests."""
    if rows.kind not in ("folder", "manifest") or rows.root.is_local:
        return False
    cache = CacheConfig.from_settings(s or settings.current())
    return cache is None or not cache.applies_to(rows.kind)
