"""raypipe's process-wide settings: one frozen value whose defaults the ``RAYPIPE_*`` environment
variables override (docs/design.md, "Settings", lists them).

``current()`` is the value in force: the one a ``use(...)`` block set, else the environment's, read
again only when one of its variables changed (so a program, or a test, that sets a variable before it
makes a ``Pipeline`` or lists a dataset sees it). What a worker needs travels with its work: a
``Pipeline`` takes ``current()`` (or its ``settings=``) when it is made, and its ``StageSpec`` carries
it to local workers, Ray tasks and node workers alike, which read with it whatever their own
environment holds. What depends on the node is still decided there (the default cache folder is under
the home of the user the reader runs as).

Two ``RAYPIPE_`` variables are not settings and are read where they are used:
``RAYPIPE_NODE_WORKER_SECRET`` (``raypipe.workers.peer_auth``) is a secret a launcher makes per run and
hands to its own child processes only: a value users never set, which must not travel in every stage
spec or show in a ``repr``; ``RAYPIPE_FAKE_CLUSTER`` (``raypipe.testing.autoscaler``) marks every
process of one fake test cluster with that cluster's name, so the harness can find them: a label on
processes, not an option.

    >>> from raypipe import settings
    >>> with settings.use(settings.Settings(read_in_flight=16)):
    ...     settings.current().read_in_flight
    16
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from raypipe._values import fail, is_int, is_number, parse_bytes

__all__ = ["Settings", "VARIABLES", "CACHE_OFF", "current", "use"]

# Values of RAYPIPE_CACHE_DIR that turn the cache off (kept as "off").
CACHE_OFF = ("off", "none", "0", "false", "no")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What raypipe's processes wait for, read with and show, the same on every node of a run."""

    # --- Waits on something outside this process (raypipe.timeouts), in seconds unless named otherwise.
    # TCP connect to RAY_ADDRESS before ray.init and its first gRPC answer: a live head answers in
    # milliseconds; without the probe a wrong address costs ray.init 20 s or more of gRPC retries.
    ray_connect_s: float = 5.0
    # S3: opening a connection; an endpoint that does not accept in this long is not there.
    store_connect_s: float = 5.0
    # S3: the longest silence within one request; a healthy store starts answering well under a second.
    store_request_s: float = 10.0
    # S3: attempts per request (the SDK's default with back-off): a request fails in ~3 x store_request_s.
    store_attempts: int = 3
    # GCS: how long one operation is retried (pyarrow's default, 15 minutes, retries a missing credential).
    gcs_retry_s: float = 10.0
    # A remote dataset's root answers its first request in this, or the credentials/endpoint are wrong.
    first_answer_s: float = 20.0
    # A remote dataset's whole listing: ~1000 keys a request, a million objects in a few minutes.
    listing_s: float = 900.0

    # --- Listing
    # Above this many samples an indexed WebDataset is listed by shard: as rows it would hold ~2.5 GB
    # (50 bytes a sample) in each planning process, and listing row by row is most of a start.
    by_shard_rows: int = 50_000_000

    # --- Reads from object stores (raypipe.sources.transport.remote.ReadOptions)
    # Requests in flight per reading worker: a block's rows go out together (Little's law: rate x latency).
    read_in_flight: int = 128
    # Class prefixes listed at once: a page of 1,000 keys takes a round trip; 1 lists page by page.
    list_in_flight: int = 64
    # Retries of a transiently failing request: 5 wait ~3 s in all, past a store's brief throttling.
    read_retries: int = 5
    # First back-off of a retry in seconds, doubled per retry and jittered, so workers do not retry in step.
    read_backoff_s: float = 0.1
    # The node-local cache of remote objects: "" the default (remote folders' images, in
    # $XDG_CACHE_HOME/raypipe on each node), "off", or a folder (every remote object read whole).
    cache_dir: str = ""
    # The most the cache may hold on a node, in bytes: 50 GiB keeps ImageNet's 1.28M images.
    cache_max_bytes: int = 50 << 30

    # --- Node workers
    # The address the consumer listens on for its node workers; "": its node's address as Ray knows it.
    # Set it to the interface of the network that should carry the images, on a machine with several.
    node_workers_host: str = ""

    # --- Metrics (raypipe.pipeline.metrics)
    # The run's name in raypipe's metrics (tag ``run``); "" is "raypipe". The training job sets its --name.
    run_name: str = ""

    # --- Commands
    # No progress bars or progress lines (logs of tests and benchmarks, where they are noise).
    no_progress: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            why = _check(f.name, getattr(self, f.name))
            if why:
                fail(f.name, getattr(self, f.name), why)
        if self.cache_dir.strip().lower() in CACHE_OFF:
            object.__setattr__(self, "cache_dir", "off")
        else:
            object.__setattr__(self, "cache_dir", self.cache_dir.strip())

    @property
    def cache_off(self) -> bool:
        return self.cache_dir == "off"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The defaults, each overridden by its variable in ``environ`` where that is set and not empty;
        a value that does not parse, or is out of range, is a ``ValueError`` naming the variable."""
        given: dict[str, Any] = {}
        for name, variable in VARIABLES.items():
            text = environ.get(variable, "")
            if text == "":
                continue
            value = _TABLE[name][1](variable, text)
            why = _check(name, value)
            if why:
                fail(variable, text, why)
            given[name] = value
        return cls(**given)


def _seconds(variable: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        fail(variable, text, "expected a number of seconds")


def _int(variable: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)  # "1e6", "3.0"
    except ValueError:
        number = float("nan")
    if not number.is_integer():
        fail(variable, text, "expected an int")
    return int(number)


def _float(variable: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        fail(variable, text, "expected a number")


def _bytes(variable: str, text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        fail(variable, text, str(e))


def _switch(variable: str, text: str) -> bool:
    return text == "1"  # only "1" turns it on, as every command has read it


def _text(variable: str, text: str) -> str:
    return text


def _seconds_ok(v: Any) -> bool:
    return is_number(v) and v > 0


def _run_name_ok(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 100 and v.isprintable()


_SECONDS = (_seconds, _seconds_ok, "expected a number of seconds > 0")
# Each field: its variable, how the variable's text parses, what the value must be, and why not.
_TABLE: dict[str, tuple[str, Callable[[str, str], Any], Callable[[Any], bool], str]] = {
    "ray_connect_s": ("RAYPIPE_RAY_CONNECT_S", *_SECONDS),
    "store_connect_s": ("RAYPIPE_STORE_CONNECT_S", *_SECONDS),
    "store_request_s": ("RAYPIPE_STORE_REQUEST_S", *_SECONDS),
    "store_attempts": ("RAYPIPE_STORE_ATTEMPTS", _int, lambda v: is_int(v) and v >= 1, "expected an int >= 1"),
    "gcs_retry_s": ("RAYPIPE_GCS_RETRY_S", *_SECONDS),
    "first_answer_s": ("RAYPIPE_FIRST_ANSWER_S", *_SECONDS),
    "listing_s": ("RAYPIPE_LISTING_S", *_SECONDS),
    "by_shard_rows": ("RAYPIPE_BY_SHARD_ROWS", _int, lambda v: is_int(v) and v >= 0, "expected an int >= 0"),
    "read_in_flight": ("RAYPIPE_READ_IN_FLIGHT", _int, lambda v: is_int(v) and v >= 1, "must be at least 1"),
    "list_in_flight": ("RAYPIPE_LIST_IN_FLIGHT", _int, lambda v: is_int(v) and v >= 1, "must be at least 1"),
    "read_retries": ("RAYPIPE_READ_RETRIES", _int, lambda v: is_int(v) and v >= 0, "must be 0 or more"),
    "read_backoff_s": ("RAYPIPE_READ_BACKOFF_S", _float, lambda v: is_number(v) and v >= 0, "must be 0 or more"),
    "cache_dir": ("RAYPIPE_CACHE_DIR", _text, lambda v: isinstance(v, str), "expected a folder, 'off' or ''"),
    "cache_max_bytes": ("RAYPIPE_CACHE_MAX_BYTES", _bytes, lambda v: is_int(v) and v > 0, "must be positive"),
    "node_workers_host": (
        "RAYPIPE_NODE_WORKERS_HOST",
        _text,
        lambda v: isinstance(v, str),
        "expected an address or ''",
    ),
    "run_name": ("RAYPIPE_RUN_NAME", _text, _run_name_ok, "expected at most 100 printable characters"),
    "no_progress": ("RAYPIPE_NO_PROGRESS", _switch, lambda v: isinstance(v, bool), "expected True or False"),
}
# Each field's environment variable.
VARIABLES: dict[str, str] = {name: row[0] for name, row in _TABLE.items()}


def _check(name: str, value: Any) -> str:
    """Why ``value`` cannot be field ``name``'s, or ""."""
    _, _, ok, why = _TABLE[name]
    return "" if ok(value) else why


_lock = threading.Lock()
_override: Settings | None = None
_read: tuple[tuple[str | None, ...], Settings] | None = None  # the environment's variables, and their value


def current() -> Settings:
    """The settings in force in this process: those of the innermost ``use`` block, else the
    environment's (``Settings.from_env``), made again when a ``RAYPIPE_*`` variable changed."""
    global _read
    if _override is not None:
        return _override
    key = tuple(os.environ.get(v) for v in VARIABLES.values())
    read = _read
    if read is not None and read[0] == key:
        return read[1]
    value = Settings.from_env(os.environ)
    with _lock:
        _read = (key, value)
    return value


@contextmanager
def use(settings: Settings) -> Iterator[Settings]:
    """Within the block, ``current()`` is ``settings`` for the whole process (every thread), whatever
    the environment holds; the previous value comes back after it. For tests, and for a program that
    sets raypipe's settings in code rather than in its environment."""
    global _override
    if not isinstance(settings, Settings):
        fail("settings", settings, "expected a raypipe.settings.Settings")
    with _lock:
        before, _override = _override, settings
    try:
        yield settings
    finally:
        with _lock:
            _override = before
