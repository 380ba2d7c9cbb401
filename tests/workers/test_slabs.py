"""SlabPool: the shared memory of local workers' chunks is reused only once nothing views it."""

from __future__ import annotations

import gc
import mmap
import os

import numpy as np
import pytest

from raypipe.workers.slabs import SlabPool


def _write(slab, data: bytes) -> None:
    with mmap.mmap(slab.fd, len(data)) as m:  # as a worker writes a chunk
        m[:] = data


_INODES: dict[int, int] = {}


def _taken(pool: SlabPool, nbytes: int):
    slab = pool.take(nbytes)
    _INODES[id(slab)] = os.fstat(slab.fd).st_ino
    return slab


def _is_open(slab) -> bool:
    """Whether the slab's descriptor is still its own (a closed number is soon another file's)."""
    try:
        return os.fstat(slab.fd).st_ino == _INODES[id(slab)]
    except OSError:
        return False


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_a_slab_comes_back_with_its_last_view_and_is_reused(tmp_path):
    torch = pytest.importorskip("torch")
    pool = SlabPool(str(tmp_path), keep=4)
    slab = pool.take(3 * 1000)
    _write(slab, bytes(range(250)) * 12)
    images = pool.view(slab, (3, 10, 10, 10))
    assert not images.flags.writeable
    batch = images[1:3]  # what the packer hands on: a view
    tensor = torch.from_numpy(batch[:1].copy()), torch.as_tensor(batch)  # a copy, and a view of the view
    del images, batch
    gc.collect()
    assert pool.free_slabs() == 0  # the tensor still views it
    other = pool.take(100)
    assert other.fd != slab.fd  # so a chunk gets another slab
    del tensor
    gc.collect()
    assert pool.free_slabs() == 1
    again = pool.take(2000)  # fits: the same memory, no new pages
    assert again.fd == slab.fd
    pool.give_back(again)
    small = slab.capacity
    grown = pool.take(small + 1)  # too small for this chunk: grown, its pages kept, the rest new
    assert grown.fd == slab.fd and grown.capacity > small and os.fstat(grown.fd).st_size == grown.capacity
    view = pool.view(grown, (1, small + 1))
    assert view[0, :250].tobytes() == bytes(range(250))
    last = pool.take(grown.capacity + 1)
    assert last.fd not in (grown.fd, other.fd)  # none free: a new one
    del view
    assert pool.made == 3
    pool.give_back(other)
    pool.give_back(last)
    pool.close()


def test_the_pool_keeps_at_most_keep_free_slabs_and_a_closed_one_none(tmp_path):
    pool = SlabPool(str(tmp_path), keep=2)
    slabs = [_taken(pool, 1) for _ in range(4)]
    for s in slabs:
        pool.give_back(s)
    assert pool.free_slabs() == 2
    assert [_is_open(s) for s in slabs] == [False, False, True, True]  # the oldest returned closed
    in_use = pool.take(1)  # one of the two free ones
    assert in_use in slabs[2:]
    view = pool.view(in_use, (1, 4))
    pool.close()
    assert not any(_is_open(s) for s in slabs if s is not in_use)
    assert _is_open(in_use)  # still viewed
    del view
    gc.collect()
    assert not _is_open(in_use)  # closed as it came back
    with pytest.raises(RuntimeError, match="shut down"):
        pool.take(1)


def test_the_pool_keeps_its_largest_free_slabs(tmp_path):
    """Chunks of mixed sizes (a window of shards and its pieces): beyond ``keep`` the smallest free slabs
    are closed, so the next large chunk is written into a slab made before, not into new pages."""
    mb = 1 << 20
    pool = SlabPool(str(tmp_path), keep=2)
    slabs = [_taken(pool, n * mb) for n in (8, 1, 8, 2)]
    for s in slabs:
        pool.give_back(s)
    assert pool.free_slabs() == 2
    assert [_is_open(s) for s in slabs] == [True, False, True, False]
    made = pool.made
    again = [pool.take(8 * mb), pool.take(8 * mb)]
    assert {s.fd for s in again} == {slabs[0].fd, slabs[2].fd}
    assert pool.made == made
    for s in again:
        pool.give_back(s)
    pool.close()


def test_a_slab_without_memfd_is_an_unlinked_file(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "memfd_create", raising=False)
    pool = SlabPool(str(tmp_path), keep=1)
    slab = pool.take(10)
    assert list(tmp_path.iterdir()) == []  # nothing named, nothing to leave behind
    _write(slab, b"0123456789")
    assert pool.view(slab, (2, 5)).tobytes() == b"0123456789"
    pool.close()


def test_a_view_of_no_rows_maps_nothing(tmp_path):
    pool = SlabPool(str(tmp_path), keep=1)
    slab = pool.take(0)
    assert pool.view(slab, (0, 4, 4, 3)).shape == (0, 4, 4, 3)
    assert pool.free_slabs() == 1
    pool.close()


def test_views_pin_their_pixels_while_later_chunks_reuse_slabs(tmp_path):
    pool = SlabPool(str(tmp_path), keep=2)
    kept, want = [], []
    for i in range(20):
        slab = pool.take(64)
        data = np.full(64, i, np.uint8).tobytes()
        _write(slab, data)
        view = pool.view(slab, (4, 16))
        if i % 3 == 0:  # a caller that keeps some batches
            kept.append(view[1:])
            want.append(data[16:])
        del view
    assert [k.tobytes() for k in kept] == want
    assert pool.made <= len(kept) + 2
    pool.close()


def test_the_room_for_slabs_is_memory_where_they_are_memfds(monkeypatch):
    from raypipe.workers.slabs import slab_room

    sentinel = 12345  # a directory's free space, e.g. a container's 64 MB /dev/shm
    if hasattr(os, "memfd_create") and os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
        assert sentinel < slab_room(sentinel) <= total  # no file system bounds a memfd: memory does
    monkeypatch.delattr(os, "memfd_create", raising=False)
    assert slab_room(sentinel) == sentinel  # files in that directory: its free space


def test_local_chunks_in_flight_fit_the_room_for_their_slabs(sample_dir, monkeypatch):
    import raypipe.pipeline.execution as execution_module
    from raypipe.config import ExecutionConfig, TrainAugment
    from raypipe.pipeline import Pipeline

    pipe = Pipeline(
        str(sample_dir),
        TrainAugment(input_size=(32, 32)),
        execution=ExecutionConfig(backend="local", chunk_rows=16, num_tasks=4),
    )
    assert pipe.local_budget()[0].in_flight > 2
    chunk = 16 * 32 * 32 * 3
    monkeypatch.setattr(execution_module, "slab_room", lambda free: 4 * chunk)  # half of it: 2 chunks
    assert pipe.local_budget()[0].in_flight == 2
