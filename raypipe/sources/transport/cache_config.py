"""Where a node's cache of remote objects lives and how many bytes it may hold (``CacheConfig``), as
configured by the settings ``cache_dir`` and ``cache_max_bytes`` (``RAYPIPE_CACHE_DIR``,
``RAYPIPE_CACHE_MAX_BYTES``); the cache itself is ``raypipe.sources.transport.cache.LocalCache``.

A config is a small frozen value, so it travels with a reader's options to every worker, where each
process opens its own ``LocalCache`` of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from raypipe import settings

__all__ = ["CacheConfig", "default_cache_dir"]


def default_cache_dir() -> str:
    """The cache's folder when ``RAYPIPE_CACHE_DIR`` is not set: ``$XDG_CACHE_HOME/raypipe``, by default
    ``~/.cache/raypipe``, on the node where the reader runs."""
    base = os.environ.get("XDG_CACHE_HOME", "") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "raypipe")


def _can_make(folder: str) -> bool:
    """Whether ``folder`` is, or can be made as, a folder this process writes in: its nearest existing
    ancestor (itself included) is a writable folder. Nothing is made."""
    path = os.path.abspath(folder)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


@dataclass(frozen=True)
class CacheConfig:
    """Where remote objects are cached on each node, and how many bytes the cache may hold there.

    ``folders_only``: only the images of remote folders use it (the default cache, see ``from_env``);
    otherwise every remote object a reader reads whole does (tar shards and Parquet files too)."""

    dir: str
    max_bytes: int
    folders_only: bool = False

    def __post_init__(self) -> None:
        if not self.dir:
            raise ValueError("dir: the cache needs a folder")
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes={self.max_bytes}: must be positive")

    def applies_to(self, kind: str) -> bool:
        """Whether a reader of a remote dataset of this kind (folder, manifest, webdataset, parquet) uses it."""
        return kind == "folder" or not self.folders_only

    @classmethod
    def from_env(cls) -> CacheConfig | None:
        """The cache of the settings in force here (``raypipe.settings.current()``)."""
        return cls.from_settings(settings.current())

    @classmethod
    def from_settings(cls, s) -> CacheConfig | None:
        """The cache of settings ``s`` where this runs: ``cache_dir`` (``RAYPIPE_CACHE_DIR``; a folder:
        every remote object; ``off``: none) and ``cache_max_bytes`` (default 50 GiB). Not set: the
        images of remote folders are cached in ``default_cache_dir()``. A folder's images are objects of
        one image each, read again every epoch at a request apiece (the request costs the reader more CPU
        than reading its bytes from a local disk); shards and Parquet files come in large ranged reads
        already, and a manifest's objects are not listed, so a hit there would cost a request anyway.
        Where that folder cannot be made (a read-only home), None."""
        if s.cache_off:
            return None
        folder, max_bytes = s.cache_dir, s.cache_max_bytes
        if not folder:
            # A home a process cannot write in (a read-only container, a service user's /nonexistent)
            # leaves it without the default cache rather than failing its reads.
            default = default_cache_dir()
            return cls(dir=default, max_bytes=max_bytes, folders_only=True) if _can_make(default) else None
        return cls(dir=folder, max_bytes=max_bytes)
