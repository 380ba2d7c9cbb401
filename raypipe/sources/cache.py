"""A node-local disk cache of remote objects: read once from the store, then from local disk.

Whole objects are cached: an image file of a folder or manifest, a whole tar shard, a whole Parquet
file. Later reads (the next epoch, the next run, another worker process on the node) take the bytes
from the cache. Shards are worth caching whole: each is read in full once per epoch anyway.

- **Key.** The store (filesystem type and endpoint), the object's path, its size and modification
  time, hashed: once an object's new size or time is known, it is a new entry, never served from the
  old one. The reader takes the size and time from the listing when the rows carry them (a hit then
  costs no request, and a change shows at the next listing, or at a miss as a byte count other than
  the listed size), otherwise from a ``HEAD`` request per read (see ``raypipe.sources.reader``).
- **Atomic entries.** An entry is written to a temporary file (a dot file beside it), its size
  checked against the object's, then renamed into place (``os.replace``, atomic on one filesystem).
  Readers open entries only under their final names and check the size again, so a partial file
  (a killed writer, a full disk) is never served; orphaned temporary files are removed by a later
  eviction pass once they are an hour old. Beside its entry, not in one folder for all: creating
  and renaming files takes the folder's lock, and a worker fills up to a hundred entries at once.
- **Concurrent fillers.** Processes that fetch an object into the cache (``get``) take an advisory
  lock (``flock``) on a lock file (one per 1/256 of the keys), so one downloads and the others then
  find it. The lock only saves bandwidth: correctness comes from the atomic rename (two fillers would
  write identical bytes). Bytes a reader already holds are written without it (``add``).
- **Bound and eviction.** Least recently used first. A hit sets the entry's modification time to
  now (``atime`` is unreliable under ``noatime``/``relatime`` mounts), and an eviction pass removes the
  oldest entries until the folder holds at most 90 % of ``max_bytes``. A pass lists the whole folder, so
  a process runs one after each ``max_bytes / 16`` bytes it added (and on its first fill): the bound is
  exceeded by at most that much per filling process in between. Entries that vanish during a pass
  (another process evicted them) are skipped; a reader that already opened an entry keeps reading it
  (an unlinked file stays readable while open).

The cache serves only what the reader asked for after the reader checked that the object lies inside
the dataset's root: entry names are hashes, so nothing in the cache can name a path outside it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["CacheConfig", "LocalCache", "SizeMismatch", "local_cache", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_TMP_MAX_AGE_S = 3600.0  # a temporary file older than this has lost its writer
_LOW_WATER = 0.9  # an eviction pass empties to this fraction of the bound, so the next fill has room


class SizeMismatch(OSError):
    """A fill wrote another byte count than the entry's size: the object is not the one the key names."""


def parse_bytes(text: str | int) -> int:
    """``"50GB"``, ``"512MiB"``, ``"1e9"`` or an int as a byte count (binary units: 1 GB = 2**30)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r}: expected a size such as 50GB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class CacheConfig:
    """Where remote objects are cached on each node, and how many bytes the cache may hold there."""

    dir: str
    max_bytes: int

    def __post_init__(self) -> None:
        if not self.dir:
            raise ValueError("dir: the cache needs a folder")
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes={self.max_bytes}: must be positive")

    @classmethod
    def from_env(cls) -> CacheConfig | None:
        """``RAYPIPE_CACHE_DIR`` (and ``RAYPIPE_CACHE_MAX_BYTES``, default 50 GiB) as read where this
        runs; None when the folder is not set (no cache)."""
        folder = os.environ.get("RAYPIPE_CACHE_DIR", "")
        if not folder:
            return None
        size = os.environ.get("RAYPIPE_CACHE_MAX_BYTES", "") or "50GiB"
        try:
            return cls(dir=folder, max_bytes=parse_bytes(size))
        except ValueError as e:
            raise ValueError(f"RAYPIPE_CACHE_MAX_BYTES={size!r}: {e}") from None


class LocalCache:
    """The cache folder of one :class:`CacheConfig`, as used by one process (see ``local_cache``)."""

    def __init__(self, config: CacheConfig):
        self.config = config
        self.dir = os.path.realpath(config.dir)
        self._locks = os.path.join(self.dir, "locks")
        for d in (self.dir, self._locks):
            os.makedirs(d, exist_ok=True)
        self._folders: set[str] = set()  # entry folders this process has made (never removed)
        self._added = 0  # bytes this process filled since its last eviction pass
        self._passes = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(store: str, path: str, size: int, mtime_ns: int | None) -> str:
        """The entry name of object ``path`` of ``store`` as it is now (size and time included)."""
        raw = f"{store}\0{path}\0{size}\0{mtime_ns if mtime_ns is not None else ''}"
        return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()

    def path(self, key: str) -> str:
        return os.path.join(self.dir, key[:2], key)

    def open(self, key: str, size: int) -> int | None:
        """A read-only descriptor of a complete entry (the caller closes it), or None (a miss)."""
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_size != size:  # cut short behind our back (or a foreign file): never serve it
            os.close(fd)
            _unlink(path)
            return None
        try:
            os.utime(path)  # most recently used
        except OSError:
            pass  # evicted meanwhile: the open descriptor still reads it
        return fd

    def get(self, key: str, size: int, fill: Callable[[BinaryIO], None]) -> int:
        """A descriptor of entry ``key``, filled first by ``fill(file)`` if absent. ``fill`` writes the
        object's ``size`` bytes; if it fails, or writes another count, nothing enters the cache and the
        failure (:class:`SizeMismatch` for another count) propagates."""
        fd = self.open(key, size)
        if fd is not None:
            return fd
        with self._entry_lock(key):
            fd = self.open(key, size)  # another process filled it while we waited
            if fd is None:
                fd = self._write(key, size, fill, reopen=True)
        return fd  # type: ignore[return-value]

    def add(self, key: str, data: bytes | memoryview) -> None:
        """Enter ``data``, the whole object, as entry ``key`` (bytes a reader fetched anyway)."""
        self._write(key, len(data), lambda f: f.write(data), reopen=False)

    def _write(self, key: str, size: int, fill: Callable[[BinaryIO], None], *, reopen: bool) -> int | None:
        """Write entry ``key`` through a temporary file; a read-only descriptor of it if ``reopen``."""
        path = self.path(key)
        folder = os.path.dirname(path)
        if folder not in self._folders:
            os.makedirs(folder, exist_ok=True)
            self._folders.add(folder)
        tmp = os.path.join(folder, f".{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        fd = None
        try:
            with open(tmp, "xb") as f:
                fill(f)
                written = f.tell()
            if written != size:
                raise SizeMismatch(errno.EIO, f"read {written} bytes of an object of {size} (changed while read?)")
            if reopen:  # opened before the rename: the descriptor reads the entry even if a pass evicts it at once
                fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            os.replace(tmp, path)
        except BaseException:
            if fd is not None:
                os.close(fd)
            _unlink(tmp)
            raise
        self._filled(size)
        return fd

    def _entry_lock(self, key: str):
        return _FileLock(os.path.join(self._locks, key[:2]))  # 256 lock files: contention is rare, files few

    def _filled(self, size: int) -> None:
        with self._lock:
            self._added += size
            due = self._passes == 0 or self._added >= self.config.max_bytes // 16
            if due:
                self._added, self._passes = 0, self._passes + 1
        if due:
            self.evict()

    def usage(self) -> int:
        """Bytes the entries hold now."""
        return sum(size for _, size, _ in self._files()[0])

    def _files(self) -> tuple[list[tuple[float, int, str]], list[tuple[float, int, str]]]:
        """(the entries, the temporary files) as (modification time, size, path) each. Temporary files
        lie beside the entries; older releases wrote them to the folder ``tmp``, swept too."""
        entries, temporary = [], []
        for sub in _scandir(self.dir):
            if not ((len(sub.name) == 2 or sub.name == "tmp") and sub.is_dir(follow_symlinks=False)):
                continue
            for entry in _scandir(sub.path):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                kept = temporary if sub.name == "tmp" or entry.name.startswith(".") else entries
                kept.append((st.st_mtime, st.st_size, entry.path))
        return entries, temporary

    def evict(self) -> None:
        """Remove the least recently used entries until the cache holds at most 90 % of its bound,
        and temporary files whose writers are gone."""
        entries, temporary = self._files()
        entries.sort()
        total = sum(size for _, size, _ in entries)
        limit = int(self.config.max_bytes * _LOW_WATER)
        for _, size, path in entries:
            if total <= limit:
                break
            _unlink(path)
            total -= size
        now = time.time()
        for mtime, _, path in temporary:
            if now - mtime > _TMP_MAX_AGE_S:
                _unlink(path)


class _FileLock:
    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _scandir(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except FileNotFoundError:
        return []


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


_CACHES: dict[CacheConfig, LocalCache] = {}
_CACHES_LOCK = threading.Lock()


def local_cache(config: CacheConfig) -> LocalCache:
    """This process's ``LocalCache`` for ``config`` (shared by its readers, so its fill count is one)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(config)
        if cache is None:
            cache = _CACHES[config] = LocalCache(config)
        return cache
