"""glibc's malloc thresholds for raypipe's own processes, which free large buffers all their lives, in
two opposite ways.

glibc gives a large block a mapping of its own, unmapped when it is freed, and returns the free
memory at the top of a heap once more than a threshold of it is free; both thresholds start at
128 KiB and rise (the mapping one up to 32 MiB) each time the process frees such a block.

- A consumer (a feeder, the ``raypipe`` command: ``raypipe.runtime.tune_consumer_process``) holds
  10-40 MB batch buffers: once the threshold has risen past them they come from per-thread heap
  arenas that keep their pages, and its RSS climbs by hundreds of MB over the first epochs before it
  levels off. ``pin_mmap_threshold`` fixes the mapping threshold at 1 MiB, so they go back on free.
- A worker (``raypipe.workers.worker_process``) that reads an object store holds a chunk's requests'
  buffers (up to ``ReadOptions.in_flight`` ranges of up to a megabyte) and its rows' bytes, and frees
  them by the chunk's end: until the thresholds have risen, each chunk's buffers are new pages, a fault
  and a zeroed page each, the kernel time a remote shard's reads cost beyond a local one's
  (docs/performance.md, "Object stores and shard formats"). ``keep_freed_memory`` fixes both from the
  start: blocks up to 32 MiB come from the heaps (the bound of glibc's own rising threshold), and up to
  256 MiB free at a heap's top stays (twice what a chunk's requests hold at once). What is kept is what
  the process used at its peak, which its next chunk uses again; a user's ``MALLOC_*`` or
  ``GLIBC_TUNABLES`` settings are left as they are.

Never a trainer's or Ray's processes; off glibc, nothing is done. No Ray import: a worker imports this.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_memory", "pin_mmap_threshold"]

_M_TRIM_THRESHOLD = -1  # mallopt's parameters, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20

_MMAP_PINNED = False


def pin_mmap_threshold(nbytes: int = 1 << 20) -> bool:
    """Make glibc serve every allocation >= ``nbytes`` with its own mapping, returned to the OS on free
    (a consumer's setting, see the module); whether it is set (False off glibc)."""
    global _MMAP_PINNED
    if not _MMAP_PINNED:
        _MMAP_PINNED = _mallopt(_M_MMAP_THRESHOLD, int(nbytes))
    return _MMAP_PINNED


def keep_freed_memory() -> bool:
    """Fix this process's malloc thresholds as a worker's (see the module); whether they were set
    (False: not glibc, or the environment sets malloc's own)."""
    if _user_settings():
        return False
    # the mapping threshold first: setting either one ends glibc's rising of both
    return _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and _mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; False where it failed or this is not glibc."""
    if not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(param, value))


def _user_settings() -> bool:
    return "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") or any(
        name.startswith("MALLOC_") for name in os.environ
    )


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # no such name here: not glibc
        return False
