"""A worker process keeps the memory its chunks free for the next chunk, instead of handing it back to
the kernel and faulting it in again.

glibc's malloc gives a large block a mapping of its own, unmapped when it is freed, and returns the
free memory at the top of a heap once more than a threshold of it is free; both thresholds start at
128 KiB and rise only as the process frees such blocks. A worker that reads an
object store holds a chunk's requests' buffers (up to ``ReadOptions.in_flight`` ranges of up to a
megabyte) and its rows' bytes, and frees them by the chunk's end: until the thresholds have risen,
each chunk's buffers are new pages, a fault and a zeroed page each, the kernel time a remote shard's
reads cost beyond a local one's (docs/performance.md, "Object stores and shard formats").

Fixed thresholds from the start keep that memory: blocks up to 32 MiB come from the heaps (the bound
of glibc's own rising threshold), and up to 256 MiB free at a heap's top stays (twice what a chunk's
requests hold at once). What is kept is what the process used at its peak, which its next chunk uses
again. Only raypipe's own worker processes do this, never a trainer's or Ray's processes; a user's
``MALLOC_*`` or ``GLIBC_TUNABLES`` settings are left as they are, and another C library is left alone.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1  # mallopt's parameters, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Set this process's malloc thresholds as the module says; whether they were set (False: not
    glibc, or the environment sets malloc's own)."""
    if _user_settings() or not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # the mapping threshold first: setting either one ends glibc's rising of both
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _user_settings() -> bool:
    return "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") or any(
        name.startswith("MALLOC_") for name in os.environ
    )


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # no such name here: not glibc
        return False
