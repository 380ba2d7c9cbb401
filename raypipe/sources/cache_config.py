"""Where a node's cache of remote objects lives and how many bytes it may hold (``CacheConfig``), as
configured by ``RAYPIPE_CACHE_DIR`` and ``RAYPIPE_CACHE_MAX_BYTES``; the cache itself is
``raypipe.sources.cache.LocalCache``.

A config is a small frozen value, so it travels with a reader's options to every worker, where each
process opens its own ``LocalCache`` of it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["CacheConfig", "default_cache_dir", "parse_bytes"]

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


def parse_bytes(text: str | int) -> int:
    """``"50GB"``, ``"512MiB"``, ``"1e9"`` or an int as a byte count (binary units: 1 GB = 2**30)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r}: expected a size such as 50GB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


_OFF = ("off", "none", "0", "false", "no")  # values of RAYPIPE_CACHE_DIR that turn the cache off


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
        """The cache as configured where this runs: ``RAYPIPE_CACHE_DIR`` (a folder: every remote object;
        ``off``: none) and ``RAYPIPE_CACHE_MAX_BYTES`` (default 50 GiB). Not set: the images of remote
        folders are cached in ``default_cache_dir()``. A folder's images are objects of one image each,
        read again every epoch at a request apiece (the request costs the reader more CPU than reading
        its bytes from a local disk); shards and Parquet files come in large ranged reads already, and a
        manifest's objects are not listed, so a hit there would cost a request anyway. Where that
        folder cannot be made (a read-only home), None."""
        folder = os.environ.get("RAYPIPE_CACHE_DIR", "").strip()
        if folder.lower() in _OFF:
            return None
        size = os.environ.get("RAYPIPE_CACHE_MAX_BYTES", "") or "50GiB"
        try:
            max_bytes = parse_bytes(size)
        except ValueError as e:
            raise ValueError(f"RAYPIPE_CACHE_MAX_BYTES={size!r}: {e}") from None
        if not folder:
            # A home a process cannot write in (a read-only container, a service user's /nonexistent)
            # leaves it without the default cache rather than failing its reads.
            default = default_cache_dir()
            return cls(dir=default, max_bytes=max_bytes, folders_only=True) if _can_make(default) else None
        return cls(dir=folder, max_bytes=max_bytes)
