"""What a chunk's shared memory costs beside the copy of its images, new each time or reused.

The local workers hand each chunk's images to the trainer in shared memory (``raypipe.pipeline.slabs``).
This times, for one chunk of ``--rows`` images of ``--size`` px, the way the trainer and a worker use
that memory, without the decoding around it:

- ``new file``: a new file in /dev/shm (or the temporary directory), written, then mapped read-only
  and unlinked by the reader, its pages freed when the mapping goes;
- ``reused slab``: the same memory each time (a ``memfd`` made once), mapped for writing and for
  reading with every page mapped in one call, as a worker and the trainer do with a slab;
- ``copy alone``: the writes into memory that is already mapped, the floor.

    python bench/slab_cost.py                   # 128 rows of 224 px (19 MB), as a chunk
    python bench/slab_cost.py --rows 2048       # a Parquet window's chunk
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time

import numpy as np

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def touch(m: mmap.mmap) -> int:
    """Read one byte of every page, as a consumer of every image would fault each page in."""
    return int(np.frombuffer(m, np.uint8)[::4096].sum())


def new_file(src: np.ndarray, directory: str) -> None:
    size = src.nbytes
    path = os.path.join(directory, f"slab-cost-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size) as m:
        np.frombuffer(m, np.uint8)[:] = src
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.unlink(path)
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ) as m:
        touch(m)
    os.close(fd)


def reused(src: np.ndarray, fd: int) -> None:
    size = src.nbytes
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE) as m:
        np.frombuffer(m, np.uint8)[:] = src
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ) as m:
        touch(m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    src = np.random.default_rng(0).integers(0, 256, args.rows * args.size * args.size * 3,
                                                 dtype=np.uint8)  # fmt: skip
    directory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("slab-cost")
    else:
        path = os.path.join(directory, f"slab-cost-{os.getpid()}-slab")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(path)
    os.ftruncate(fd, src.nbytes)
    held = mmap.mmap(fd, src.nbytes)

    def copy_alone() -> None:
        np.frombuffer(held, np.uint8)[:] = src

    contenders = {"new file": lambda: new_file(src, directory), "reused slab": lambda: reused(src, fd),
                  "copy alone": copy_alone}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():
        fn()  # warm-up
    for _ in range(args.repeat):  # in turn, so a drift of the machine's speed touches all alike
        for name, fn in contenders.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    print(f"one chunk of {args.rows} x {args.size}x{args.size}x3 uint8 ({src.nbytes / 2**20:.1f} MiB), "
          f"{args.repeat} rounds, new files in {directory}:")  # fmt: skip
    for name, ts in times.items():
        print(f"  {name:12s} median {statistics.median(ts) * 1e3:7.2f} ms   min {min(ts) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
