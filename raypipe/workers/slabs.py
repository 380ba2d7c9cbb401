"""Reusable shared-memory regions ("slabs") for the chunk images of ``LocalWorkers``.

Writing each chunk into new shared memory costs the kernel more than the copy itself: every page is
allocated and zeroed when the worker first touches it, and freed when the trainer lets the chunk go
(``python bench/profiles.py slab-cost``: 20-22 ms for a 128-row chunk of 224 px images, against 7 ms into a
region written before and 2 ms for the copy alone, on the 2-core machine of docs/performance.md,
where such a chunk is ~140 ms of decoding). So the trainer keeps its regions: a chunk's slab goes
back to the pool when the last view of its images is gone (a finalizer on the trainer's mapping; a
batch the caller keeps keeps its slab), and a later chunk that fits is written into it (a larger one
into a free slab grown to fit: only the added pages are new). No slab has a name: an anonymous
``memfd`` on Linux (elsewhere a file in ``directory``, unlinked as soon as it is made), sent to the
worker as a descriptor with each chunk, so nothing outlives the processes that hold it, however they
end.
"""

from __future__ import annotations

import collections
import mmap
import os
import secrets
import threading
import weakref

import numpy as np

__all__ = ["Slab", "SlabPool", "slab_room", "slab_of"]

_ROUND = 1 << 20  # capacities are whole MiB, so chunks of about one size share their slabs
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # one call maps every page, instead of a fault per page
# The slab behind each live mapping ``SlabPool.view`` made (by the mapping's id, removed as it goes), so
# that a feeder can pass a batch's slab on to the trainer's process (``slab_of``).
_MAPPED: dict[int, Slab] = {}


class Slab:
    """One region: a descriptor of ``capacity`` bytes."""

    __slots__ = ("fd", "capacity", "_writable")

    def __init__(self, fd: int, capacity: int):
        self.fd, self.capacity = fd, capacity
        self._writable: mmap.mmap | None = None

    def writable(self) -> memoryview:
        """The whole slab, writable, for a process that fills it itself (images received from another
        node's worker): mapped once and kept with the slab, since mapping 19 MB costs about a
        millisecond each time (``python bench/profiles.py slab-cost``)."""
        if self._writable is None or len(self._writable) != self.capacity:
            self._unmap()
            self._writable = mmap.mmap(self.fd, self.capacity, flags=mmap.MAP_SHARED | _POPULATE)
        return memoryview(self._writable)

    def _unmap(self) -> None:
        if self._writable is not None:
            try:
                self._writable.close()
            except BufferError:  # a view of it lives on: the mapping goes with that view
                pass
            self._writable = None

    def close(self) -> None:
        self._unmap()
        os.close(self.fd)


class SlabPool:
    """The slabs of one process's workers: ``take`` one for a chunk of ``nbytes``, ``view`` the images a
    worker wrote into it; it comes back by itself with its last view (``give_back`` for a chunk whose
    images are never viewed). At most ``keep`` free slabs are kept, the largest; a closed pool closes
    each slab as it comes back."""

    # Whether ``view`` maps every page at once (the reader reads them all). A process that passes the
    # slabs on unread (a feeder: ``raypipe.workers.handover``) maps them lazily: mapping and unmapping
    # a 128-row chunk of 224 px images costs ~1 ms populated, ~0.01 ms lazily (``python bench/profiles.py
    # slab-cost``, docs/performance.md's 2-core VM).
    populate_views = True

    def __init__(self, directory: str, keep: int):
        self.directory, self.keep = directory, keep
        self._lock = threading.Lock()
        self._free: list[Slab] = []  # least recently returned first
        # Slabs come back from finalizers, which run in any thread at any allocation (the collector),
        # possibly inside ``take`` itself: an append to a deque needs no lock, and ``take`` moves them.
        self._returned: collections.deque[Slab] = collections.deque()
        self.closed = False
        self.made = 0  # slabs made so far (each one's pages were new)

    def take(self, nbytes: int) -> Slab:
        """The smallest free slab of at least ``nbytes``; else the largest free one, grown to fit (its
        pages are kept, only the rest are new: a stream whose first chunks are pieces of a window grows
        their slabs into the window's); else a new one."""
        capacity = max(_ROUND, -(-nbytes // _ROUND) * _ROUND)
        with self._lock:
            if self.closed:
                raise RuntimeError("raypipe's local workers were shut down")
            self._collect()
            fits = [s for s in self._free if s.capacity >= nbytes]
            if fits:
                slab = min(fits, key=lambda s: s.capacity)
                self._free.remove(slab)
                return slab
            grown = max(self._free, key=lambda s: s.capacity, default=None)
            if grown is not None:
                self._free.remove(grown)
        if grown is not None:
            try:
                grown._unmap()  # a writable mapping of the old size
                os.ftruncate(grown.fd, capacity)  # no view maps a free slab: nothing sees it change
            except BaseException:
                grown.close()
                raise
            grown.capacity = capacity
            return grown
        slab = Slab(_new_region(self.directory, capacity), capacity)
        self.made += 1
        return slab

    def give_back(self, slab: Slab) -> None:
        self._returned.append(slab)
        if self.closed:
            self._close_returned()

    def view(self, slab: Slab, shape: tuple[int, ...]) -> np.ndarray:
        """The ``shape`` uint8 images at the start of ``slab``, mapped read-only (as Ray's objects are);
        the slab comes back to the pool when this array and every view of it are gone."""
        size = int(np.prod(shape))
        if size == 0:
            self.give_back(slab)
            return np.empty(shape, dtype=np.uint8)
        flags = mmap.MAP_SHARED | (_POPULATE if self.populate_views else 0)
        mapped = mmap.mmap(slab.fd, size, flags=flags, prot=mmap.PROT_READ)
        _MAPPED[id(mapped)] = slab
        weakref.finalize(mapped, self._unmapped, id(mapped), slab).atexit = False
        return np.frombuffer(mapped, dtype=np.uint8).reshape(shape)

    def _unmapped(self, key: int, slab: Slab) -> None:
        _MAPPED.pop(key, None)
        self.give_back(slab)

    def free_slabs(self) -> int:
        with self._lock:
            self._collect()
            return len(self._free)

    def close(self) -> None:
        """Close the free slabs now, and each slab in use as it comes back."""
        with self._lock:
            self.closed = True
            self._collect()
            free, self._free = self._free, []
        for slab in free:
            slab.close()
        self._close_returned()

    def _collect(self) -> None:
        """Move the returned slabs to the free list, closing the smallest beyond ``keep`` (the oldest of
        equals; holding the lock). A large slab takes any smaller chunk, so a stream whose chunks vary
        in size (a window of shards and its pieces, a short last chunk), or the next pipeline, keeps
        its large slabs instead of making their pages again (``python bench/profiles.py slab-cost``: about three
        times the cost of writing into pages made before)."""
        while self._returned:
            self._free.append(self._returned.popleft())
        while len(self._free) > self.keep:
            smallest = min(range(len(self._free)), key=lambda i: self._free[i].capacity)
            self._free.pop(smallest).close()

    def _close_returned(self) -> None:
        while True:
            try:
                slab = self._returned.popleft()
            except IndexError:
                return
            slab.close()


def slab_of(images: np.ndarray) -> Slab | None:
    """The slab ``images`` (or the array they view) were mapped from by ``SlabPool.view``; None for
    other memory. Valid while ``images`` lives: its slab is not given back before."""
    base = images
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's base
        base = base.obj
    return _MAPPED.get(id(base)) if isinstance(base, mmap.mmap) else None


def slab_room(directory_free: int) -> int:
    """The bytes slabs may take here: the memory still available (``MemAvailable``) where they are
    memfds, which no file system's size bounds (a container's 64 MB /dev/shm included); elsewhere the
    free space of their directory, ``directory_free``."""
    if not hasattr(os, "memfd_create"):
        return directory_free
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return directory_free


def _new_region(directory: str, capacity: int) -> int:
    """A descriptor of ``capacity`` bytes of shared memory that no other process can open by name."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("raypipe-chunk", os.MFD_CLOEXEC)
    else:
        path = os.path.join(directory, f"raypipe-{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        os.unlink(path)
    try:
        os.ftruncate(fd, capacity)
    except BaseException:
        os.close(fd)
        raise
    return fd
