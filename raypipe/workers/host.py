"""What this machine offers a rank's workers: the cores this process may run on and shared memory."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

__all__ = ["local_cpus", "shared_memory_dir"]


def local_cpus() -> int:
    """The cores this process may run on (its affinity mask, as a container's cpuset sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def shared_memory_dir(need_bytes: int, candidates: Sequence[str] = ("/dev/shm",)) -> tuple[str, int]:
    """(directory, free bytes) that size the chunks in flight, and hold the slabs where there is no
    ``memfd`` (not Linux): the first of ``candidates`` with ``need_bytes`` free, else the temporary
    directory (disk-backed, its pages in the page cache all the same)."""
    for path in candidates:
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        free = st.f_bavail * st.f_frsize
        if free >= need_bytes and os.access(path, os.W_OK):
            return path, free
    path = tempfile.gettempdir()
    st = os.statvfs(path)
    return path, st.f_bavail * st.f_frsize
