"""A block reader's remote objects in the node-local cache (``raypipe.sources.transport.cache``): the key of an
object as the listing described it, a hit read without a request, a miss fetched whole and kept, and
the objects found changed since their listing, read as the store has them now.

The cache only saves requests: a reader asks it for nothing else, and what it serves is keyed by the
object's store, path, size and time, so a changed object is never read from an old entry.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable

import pyarrow.fs as pafs

from raypipe.kernels.errors import SkipImage
from raypipe.sources.transport.cache import LocalCache, SizeMismatch, local_cache
from raypipe.sources.transport.paths import DatasetRoot
from raypipe.sources.transport.remote import ReadOptions, with_retries

__all__ = ["UNLISTED", "CachedObjects", "store_name"]

UNLISTED = (-1, -1)  # (object_size, object_mtime_ns) of an object the listing did not describe
_FETCH_READ = 16 * 1024 * 1024  # bytes per request when a whole object is fetched into the cache
_MEMO_MAX = 65536  # keys of objects found changed kept before the set is cleared


class CachedObjects:
    """The cache as one reader of ``root`` uses it. ``get_whole(where)`` fetches an object with one
    request where the store allows (or returns None: it is then streamed through pyarrow)."""

    def __init__(self, root: DatasetRoot, options: ReadOptions, get_whole: Callable[[str], bytes | None]):
        self.root, self.options = root, options
        self._get_whole = get_whole
        self._cache: LocalCache | None = None  # made on first use: the folder is the reading node's
        self._store = ""  # the store's name in cache keys, set with _cache
        # Listed cache keys of objects found changed since the listing: read through the HEAD path
        # directly, rather than fetched in full again only to find the size wrong once more.
        self._changed: set[str] = set()

    def local_cache(self) -> LocalCache:
        """This process's cache of the reader's config, opened on first use (the folder is the reading
        node's)."""
        if self._cache is None:
            self._store = store_name(self.root.filesystem)
            self._cache = local_cache(self.options.cache)  # type: ignore[arg-type]
        return self._cache

    def listed_key(self, where: str, listed: tuple[int, int]) -> str | None:
        """The cache key of object ``where`` as the listing saw it, or None: the listing did not describe
        it (-1s), or it was found changed since."""
        size, mtime_ns = listed
        if size < 0 or mtime_ns < 0:
            return None
        self.local_cache()  # sets the store's name
        key = LocalCache.key(self._store, where, size, mtime_ns)
        return None if key in self._changed else key

    def hit(self, path: str, listed: tuple[int, int]) -> bytes | SkipImage | None:
        """The bytes of ``path`` when the cache holds the object as listed (or the skip of a path outside
        the root); None when the store must be asked (a miss, an unlisted object, a changed one)."""
        try:
            where = self.root.resolve(path)
        except SkipImage as e:
            return e
        key = self.listed_key(where, listed)
        if key is None:
            return None
        try:
            return self.local_cache().read(key, listed[0])
        except OSError:
            return None

    def fd(self, where: str, listed: tuple[int, int] = UNLISTED) -> int:
        """A descriptor of the whole object ``where`` (inside the root) in the local cache, fetched
        first if it is not there or changed (its size or time); retried as any remote read. ``listed``:
        the object's (size, mtime_ns) as the listing saw them, which key the entry without asking the
        store; -1s: the store is asked (a ``HEAD``)."""
        fs, cache, store = self.root.filesystem, self.local_cache(), self._store

        def fill(f) -> None:
            data = self._get_whole(where)
            if data is not None:
                f.write(data)
            else:
                _copy_object(fs, where, f)

        key = self.listed_key(where, listed)
        if key is not None:
            try:
                # A hit opens the local entry: no request. A miss fetches the object and keeps it
                # only if it brought the listed size.
                return with_retries(lambda: cache.get(key, listed[0], fill), self.options)
            except SizeMismatch:
                # Changed since the listing: keyed below by what the store says now, so the read
                # returns what it holds now.
                self.forget(key)

        def fetch() -> int:
            info = fs.get_file_info(where)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(errno.ENOENT, f"{where}: not found")
            if info.type != pafs.FileType.File:
                raise IsADirectoryError(errno.EISDIR, f"{where}: not a file")
            key = LocalCache.key(store, where, info.size, info.mtime_ns)
            return cache.get(key, info.size, fill)

        return with_retries(fetch, self.options)

    def open(self, where: str, listed: tuple[int, int] = UNLISTED):
        """The whole object ``where`` as a file read from the cache (see ``fd``)."""
        return os.fdopen(self.fd(where, listed), "rb")

    def forget(self, key: str) -> None:
        """Key ``key`` names an object that changed since the listing: its reads ask the store (a HEAD)."""
        if len(self._changed) >= _MEMO_MAX:
            self._changed.clear()
        self._changed.add(key)


def store_name(fs: pafs.FileSystem) -> str:
    """The store a filesystem reads (its type and endpoint), for cache keys: the same bucket and key on
    two endpoints are two objects."""
    try:
        opts = fs.__reduce__()[1][0]
    except Exception:  # noqa: BLE001 - a filesystem without picklable options: its type alone
        opts = {}
    opts = opts if isinstance(opts, dict) else {}
    return f"{fs.type_name}|{opts.get('endpoint_override', '')}|{opts.get('scheme', '')}"


def _copy_object(fs: pafs.FileSystem, where: str, out) -> None:
    # Each read of a remote stream is one request: large reads keep the requests per object few (a
    # 256 MB shard in 16), while the memory a fetch holds stays bounded.
    with fs.open_input_stream(where) as f:
        shutil.copyfileobj(f, out, _FETCH_READ)
