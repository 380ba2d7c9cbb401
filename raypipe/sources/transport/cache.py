"""A node-local disk cache of remote objects: read once from the store, then from local disk.

Whole objects are cached: an image file of a folder or manifest, a whole tar shard, a whole Parquet
file. Later reads (the next epoch, the next run, another worker process on the node) take the bytes
from the cache. Shards are worth caching whole: each is read in full once per epoch anyway. Without
configuration only the images of remote folders are cached, in ``~/.cache/raypipe``
(``raypipe.sources.transport.cache_config.CacheConfig.from_env``).

- **Key.** The store (filesystem type and endpoint), the object's path, its size and modification
  time, hashed: once an object's new size or time is known, it is a new entry, never served from the
  old one. The reader takes the size and time from the listing when the rows carry them (a hit then
  costs no request, and a change shows at the next listing, or at a miss as a byte count other than
  the listed size), otherwise from a ``HEAD`` request per read (see ``raypipe.sources.reader``).
- **Two forms of entry.** An object fetched for the cache (``get``: a whole shard or Parquet file,
  read through a descriptor) is a file of its own. An object a reader fetched anyway (``add``: an image
  of a folder) is appended to a *segment*, a large file of the process's own, and found through the
  segment's index log. A file per image would cost the kernel an inode per object: creating one is
  several times the cost of the GET that fetched the image, and grows as a full cache evicts and
  refills (the inode allocator searches past recently freed inodes); an append costs a copy.
- **Never partial.** A file entry is written to a temporary file (a dot file beside it), its size
  checked against the object's, then renamed into place (``os.replace``, atomic on one filesystem);
  readers open entries only under their final names and check the size again. A segment's bytes are
  written before the index record that names them, and a record carries a checksum: a record cut
  short (a killed writer) or torn is not read, a failed append is cut off again, and a record whose
  bytes lie beyond the segment's end (a segment cut short) is not served. Orphaned temporary files are
  removed by a later eviction pass once they are an hour old.
- **Concurrent processes.** Processes that fetch an object into the cache (``get``) take an advisory
  lock (``flock``) on a lock file (one per 1/256 of the keys), so one downloads and the others then
  find it. The lock only saves bandwidth: correctness comes from the atomic rename. Each process
  appends to segments of its own (no lock between processes); another process reads the records new
  to it when it misses (at most once a second), so an image fetched by two processes at once is kept
  twice until its segments are evicted, never read wrong.
- **Bound and eviction.** Least recently used first, by file entry and by whole segment. A hit sets
  the file's (the segment's, at most every 10 s per process) modification time to now (``atime`` is
  unreliable under ``noatime``/``relatime`` mounts), and an eviction pass removes the oldest until the
  folder holds at most 90 % of the bound: ``max_bytes``, and at most half of what the cache and its
  disk's free space add up to (``LocalCache.bound``). A pass lists the whole folder, so a process runs
  one after each 1/16 of the bound it added (and on its first fill); a segment takes at most that much
  (and 1 GiB) before its process starts the next. The bound is exceeded by at most that much per
  filling process in between. What a pass removes while another process reads it stays readable
  there (an unlinked file stays readable while open); a process whose segment was removed starts
  another.

The cache serves only what the reader asked for after the reader checked that the object lies inside
the dataset's root: entry names are hashes, so nothing in the cache can name a path outside it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import BinaryIO

from raypipe.sources.transport.cache_config import CacheConfig
from raypipe.sources.transport.cache_segments import SegmentWriter, parse_records

__all__ = ["LocalCache", "SizeMismatch", "local_cache"]

_TMP_MAX_AGE_S = 3600.0  # a temporary file older than this has lost its writer
_LOW_WATER = 0.9  # an eviction pass empties to this fraction of the bound, so the next fill has room
_SEGMENTS = "segments"  # the sub-folder of the segments and their index logs
_SEGMENT_MAX = 1 << 30  # a segment's bytes at most (and max_bytes / 16): eviction removes whole segments
_REFRESH_EVERY_S = 1.0  # a miss reads other processes' new index records at most this often
_TOUCH_EVERY_S = 10.0  # a hit marks its segment used at most this often (per process)
_OPEN_SEGMENTS = 64  # read descriptors a process keeps open (a 10 TB cache has 10,000 segments)


class SizeMismatch(OSError):
    """A fill wrote another byte count than the entry's size: the object is not the one the key names."""


class LocalCache:
    """The cache folder of one :class:`CacheConfig`, as used by one process (see ``local_cache``)."""

    def __init__(self, config: CacheConfig):
        self.config = config
        self.dir = os.path.realpath(config.dir)
        self._locks = os.path.join(self.dir, "locks")
        self._segments = os.path.join(self.dir, _SEGMENTS)
        for d in (self.dir, self._locks, self._segments):
            os.makedirs(d, exist_ok=True)
        self._added = 0  # bytes this process filled since its last eviction pass
        self._passes = 0
        self._lock = threading.Lock()
        self._bound = config.max_bytes  # see ``bound``; set again by every eviction pass
        self._writer: SegmentWriter | None = None  # this process's segment being appended to
        self._write_lock = threading.Lock()
        # what this process knows of the segments: key digest -> (segment name, offset, size)
        self._index: dict[bytes, tuple[str, int, int]] = {}
        self._index_read: dict[str, int] = {}  # index log name -> bytes of it read
        self._index_lock = threading.Lock()
        self._refreshed = float("-inf")
        self._readers: OrderedDict[str, int] = OrderedDict()  # segment name -> read descriptor, oldest use first
        self._touched: dict[str, float] = {}  # segment name -> when this process last marked it used

    @staticmethod
    def key(store: str, path: str, size: int, mtime_ns: int | None) -> str:
        """The entry name of object ``path`` of ``store`` as it is now (size and time included)."""
        raw = f"{store}\0{path}\0{size}\0{mtime_ns if mtime_ns is not None else ''}"
        return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()

    def path(self, key: str) -> str:
        """Where the file entry ``key`` lies (``get``'s entries; ``add``'s lie in segments)."""
        return os.path.join(self.dir, key[:2], key)

    def read(self, key: str, size: int) -> bytes | None:
        """The bytes of entry ``key`` (of ``size`` bytes), in a segment or a file, or None (a miss)."""
        digest = bytes.fromhex(key)
        where = self._index.get(digest)
        if where is None and time.monotonic() - self._refreshed >= _REFRESH_EVERY_S:
            self.refresh()
            where = self._index.get(digest)
        if where is not None:
            data = self._read_segment(digest, where, size)
            if data is not None:
                return data
        fd = self.open(key, size)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def _read_segment(self, digest: bytes, where: tuple[str, int, int], size: int) -> bytes | None:
        name, offset, stored = where
        # Under the lock that ``refresh`` closes the descriptors of removed segments with: a descriptor
        # is never read after it was closed (its number may name another file by then).
        with self._index_lock:
            fd = self._reader(name)
            data = os.pread(fd, size, offset) if fd is not None and stored == size else b""
            if len(data) != size:  # the segment is gone, or cut short: never served
                if self._index.get(digest) == where:
                    del self._index[digest]
                return None
        now = time.monotonic()
        if now - self._touched.get(name, float("-inf")) >= _TOUCH_EVERY_S:
            self._touched[name] = now
            try:
                os.utime(os.path.join(self._segments, name + ".seg"))  # most recently used
            except OSError:
                pass  # evicted meanwhile: the open descriptor still reads it
        return data

    def _reader(self, name: str) -> int | None:
        """A read-only descriptor of segment ``name``, kept open while it is among the last 64 read
        (the caller holds the index lock, under which every read is made)."""
        fd = self._readers.get(name)
        if fd is not None:
            self._readers.move_to_end(name)
            return fd
        try:
            fd = os.open(os.path.join(self._segments, name + ".seg"), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        self._readers[name] = fd
        while len(self._readers) > _OPEN_SEGMENTS:
            os.close(self._readers.popitem(last=False)[1])
        return fd

    def refresh(self) -> None:
        """Read the index records written since the last refresh (by any process), and forget the
        segments an eviction pass removed."""
        with self._index_lock:
            self._refreshed = time.monotonic()
            logs = {e.name[: -len(".idx")] for e in _scandir(self._segments) if e.name.endswith(".idx")}
            for name in logs:
                self._read_log(name)
            gone = [name for name in self._index_read if name not in logs]
            if gone:
                self._drop(set(gone))

    def _read_log(self, name: str) -> None:
        start = self._index_read.get(name, 0)
        try:
            with open(os.path.join(self._segments, name + ".idx"), "rb") as f:
                f.seek(start)
                tail = f.read()
        except FileNotFoundError:
            return
        records, read = parse_records(tail)
        for digest, offset, size in records:
            self._index[digest] = (name, offset, size)
        self._index_read[name] = start + read

    def _drop(self, names: set[str]) -> None:
        """Forget segments that are gone (the caller holds the index lock)."""
        for digest in [d for d, (name, _, _) in self._index.items() if name in names]:
            del self._index[digest]
        for name in names:
            self._index_read.pop(name, None)
            self._touched.pop(name, None)
            fd = self._readers.pop(name, None)
            if fd is not None:
                os.close(fd)

    def open(self, key: str, size: int) -> int | None:
        """A read-only descriptor of a complete file entry (the caller closes it), or None (a miss)."""
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
        """A descriptor of file entry ``key``, filled first by ``fill(file)`` if absent. ``fill`` writes
        the object's ``size`` bytes; if it fails, or writes another count, nothing enters the cache and
        the failure (:class:`SizeMismatch` for another count) propagates."""
        fd = self.open(key, size)
        if fd is not None:
            return fd
        with self._entry_lock(key):
            fd = self.open(key, size)  # another process filled it while we waited
            if fd is None:
                fd = self._write(key, size, fill)
        return fd

    def add(self, key: str, data: bytes | memoryview) -> None:
        """Enter ``data``, the whole object, as entry ``key`` (bytes a reader fetched anyway): appended
        to this process's segment. An ``OSError`` (a full disk) leaves nothing of it behind."""
        digest = bytes.fromhex(key)
        with self._write_lock:
            writer = self._writer
            if writer is not None and (writer.end + len(data) > self._segment_max or writer.removed()):
                writer.close()
                writer = self._writer = None
            if writer is None:
                # a user may clear the cache (rm -r ~/.cache/raypipe) under a running process: the
                # folders are made again, and what it appends from then on is found by others
                os.makedirs(self._segments, exist_ok=True)
                writer = self._writer = SegmentWriter(self._segments)
            offset = writer.append(digest, data)
            with self._index_lock:
                self._index[digest] = (writer.name, offset, len(data))
        self._filled(len(data))

    def sizes(self) -> dict[str, int]:
        """The key and size of every entry, as this process sees the folder now."""
        self.refresh()
        out = {digest.hex(): size for digest, (_, _, size) in self._index.items()}
        for _, size, path in self._files()[0]:
            if not path.endswith(".seg"):
                out[os.path.basename(path)] = size
        return out

    def _write(self, key: str, size: int, fill: Callable[[BinaryIO], None]) -> int:
        """Write file entry ``key`` through a temporary file; a read-only descriptor of it."""
        path = self.path(key)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)  # made again if the cache was removed under this process
        tmp = os.path.join(folder, f".{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        fd = None
        try:
            with open(tmp, "xb") as f:
                fill(f)
                written = f.tell()
            if written != size:
                raise SizeMismatch(errno.EIO, f"read {written} bytes of an object of {size} (changed while read?)")
            # opened before the rename: the descriptor reads the entry even if a pass evicts it at once
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
        os.makedirs(self._locks, exist_ok=True)
        return _FileLock(os.path.join(self._locks, key[:2]))  # 256 lock files: contention is rare, files few

    def _filled(self, size: int) -> None:
        with self._lock:
            self._added += size
            due = self._passes == 0 or self._added >= self._bound // 16
            if due:
                self._added, self._passes = 0, self._passes + 1
        if due:
            self.evict()

    def usage(self) -> int:
        """Bytes the entries hold now."""
        return sum(size for _, size, _ in self._files()[0])

    def _files(self) -> tuple[list[tuple[float, int, str]], list[tuple[float, int, str]]]:
        """(the entries, the temporary files) as (modification time, size, path) each; a segment is one
        entry (its ``.seg`` path, its size and its index log's). Temporary files lie beside the file
        entries; older releases wrote them to the folder ``tmp``, swept too."""
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
        logs = {e.name: e for e in _scandir(self._segments)}
        for name, entry in logs.items():
            if not name.endswith(".seg"):
                continue
            log = logs.get(name[: -len(".seg")] + ".idx")
            try:
                st = entry.stat(follow_symlinks=False)
                size = st.st_size + (log.stat(follow_symlinks=False).st_size if log is not None else 0)
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, size, entry.path))
        return entries, temporary

    @property
    def _segment_max(self) -> int:
        """The bytes a segment takes before its process starts the next: 1/16 of the bound (an eviction
        pass removes whole segments), and at most 1 GiB."""
        return max(1, min(_SEGMENT_MAX, self._bound // 16))

    def bound(self, usage: int) -> int:
        """The bytes the cache may hold now: ``max_bytes``, and at most half of what the cache (``usage``)
        and its disk's free space add up to. The cache's own fills leave that sum as it is; whatever
        else fills the disk (checkpoints, logs) makes the cache give up room, so it never takes a
        disk's last free half."""
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return self.config.max_bytes
        return max(1, min(self.config.max_bytes, (usage + st.f_bavail * st.f_frsize) // 2))

    def evict(self) -> None:
        """Remove the least recently used entries until the cache holds at most 90 % of its bound,
        and temporary files whose writers are gone."""
        entries, temporary = self._files()
        entries.sort()
        total = sum(size for _, size, _ in entries)
        self._bound = self.bound(total)
        limit = int(self._bound * _LOW_WATER)
        for _, size, path in entries:
            if total <= limit:
                break
            if path.endswith(".seg"):
                _unlink(path[: -len(".seg")] + ".idx")  # the log first: no record outlives its bytes
            _unlink(path)
            total -= size
        now = time.time()
        for mtime, _, path in temporary:
            if now - mtime > _TMP_MAX_AGE_S:
                _unlink(path)
        self.refresh()  # let go of the segments removed (an open descriptor keeps a file's space)


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


_CACHES: dict[tuple[CacheConfig, int], LocalCache] = {}
_CACHES_LOCK = threading.Lock()


def local_cache(config: CacheConfig) -> LocalCache:
    """This process's ``LocalCache`` for ``config`` (shared by its readers, so its fill count is one).
    A forked child (a DataLoader's worker) gets one of its own: two processes appending to one
    segment would write over each other."""
    with _CACHES_LOCK:
        cache = _CACHES.get((config, os.getpid()))
        if cache is None:
            cache = _CACHES[(config, os.getpid())] = LocalCache(config)
        return cache
