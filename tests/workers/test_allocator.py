"""A worker process keeps the memory its chunks free (``raypipe.allocator``): a second round of
the same large allocations faults no new pages in, where glibc's defaults give them back and fault
them in again; a user's malloc settings are left alone; the worker process sets it up as it starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from raypipe import allocator
from raypipe.workers import worker_process

glibc_only = pytest.mark.skipif(not allocator._glibc(), reason="glibc's malloc thresholds")

# Rounds of 32 blocks of 1 MiB, as a chunk's ranged reads hold them: each block written, then all freed.
# Prints the minor page faults of each round.
_ROUNDS = """
import ctypes, resource, sys
from raypipe.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(1 << 20) for _ in range(32)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks:
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""
PAGES = 32 * (1 << 20) // os.sysconf("SC_PAGE_SIZE")  # pages a round writes


def _faults(mode: str) -> list[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return [int(x) for x in out.stdout.split()]


@glibc_only
def test_a_second_round_of_large_blocks_reuses_the_first_rounds_pages():
    default, kept = _faults("default"), _faults("keep")
    # glibc's defaults: each later round's blocks are new pages again (mapped and unmapped, or the heap trimmed)
    assert min(default[1:]) > PAGES // 2, default
    # kept: the first round makes the pages, the later ones write into them
    assert kept[0] > PAGES // 2, kept
    assert max(kept[1:]) < PAGES // 16, kept


@pytest.mark.parametrize(
    "name, value",
    [
        ("MALLOC_TRIM_THRESHOLD_", "131072"),
        ("MALLOC_ARENA_MAX", "2"),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536"),
    ],
)
def test_a_users_malloc_settings_are_left_as_they_are(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert allocator._user_settings()
    assert allocator.keep_freed_memory() is False


def test_other_tunables_are_not_malloc_settings(monkeypatch):
    for key in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F")
    assert not allocator._user_settings()


def test_a_worker_process_keeps_freed_memory_before_it_serves(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda: calls.append("kept"))
    mine, theirs = socket.socketpair()
    theirs.close()  # the parent is gone at once: the worker ends after its first message
    worker_process.main(["worker_process", str(mine.detach())])
    assert calls == ["kept"]
