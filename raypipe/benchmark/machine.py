"""What the machine costs a loader beside its own work: first touches of memory, the spread of a fixed piece
of work and shared memory per chunk (a worker pool's start and Ray's own CPU are
``raypipe.benchmark.ray_costs``'s). ``python bench/profiles.py NAME --help`` runs each (``register`` adds
them to its command line)."""

from __future__ import annotations

import io
import mmap
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

# ---- warm-memory -----------------------------------------------------------------------------------


def _touch(nbytes: int) -> float:
    """Seconds to allocate and write ``nbytes`` (then freed)."""
    t0 = time.perf_counter()
    block = np.ones(nbytes // 8, dtype=np.float64)
    seconds = time.perf_counter() - t0
    del block
    return seconds


def warm_memory(gib: float | None = None) -> None:
    """Touch most of this machine's free memory once, and say how long the first and a second touch took.

    A freshly started virtual machine may back its memory lazily: the first write to each page of guest
    memory traps to the hypervisor, and is then orders of magnitude slower than any later one. Every
    loader's new buffers (a batch, an object-store region, a worker's heap) pay it until the machine's
    memory has been touched once, and the loader with the most memory in play pays most, so the first
    benchmarks on a new VM rank loaders by their footprint rather than their speed. Run this once before
    benchmarking a new VM::

        python bench/profiles.py warm-memory            # 90 % of the available memory
        python bench/profiles.py warm-memory --gib 8

    Some VMs hand the memory the guest frees back to their host (free page reporting): there a second
    run, seconds later, is as slow as the first, no warming lasts, and every page a loader makes beyond
    what it recently freed pays the first-touch cost, in every run and not only a new VM's first.
    """
    import psutil

    nbytes = int(gib * 2**30) if gib else int(0.9 * psutil.virtual_memory().available)
    first = _touch(nbytes)
    second = _touch(nbytes)
    gib = nbytes / 2**30
    print(
        f"{gib:.1f} GiB: first touch {first:.1f} s ({first / gib:.2f} s/GiB), again {second:.1f} s "
        f"({second / gib:.2f} s/GiB)"
    )


# ---- machine-spread --------------------------------------------------------------------------------


def _work(datas: list[bytes]) -> None:
    from PIL import Image

    for data in datas:
        im = Image.open(io.BytesIO(data))
        im.draft("RGB", (im.width // 2, im.height // 2))
        im.convert("RGB").resize((224, 224), Image.BILINEAR)


def _rates(datas: list[bytes], repeats: int, seconds: float) -> list[float]:
    """Images/s of each repeat, the work sized so that one repeat lasts about ``seconds``."""
    t0 = time.perf_counter()
    _work(datas)
    per_image = (time.perf_counter() - t0) / len(datas)
    work = (datas * (1 + int(seconds / per_image / len(datas))))[: max(1, int(seconds / per_image))]
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _work(work)
        rates.append(len(work) / (time.perf_counter() - t0))
    return rates


def _report_spread(label: str, rates: list[float]) -> None:
    spread = (max(rates) - min(rates)) / statistics.median(rates)
    print(
        f"{label:<22} median {statistics.median(rates):6.0f} img/s, spread {100 * spread:3.0f} %  "
        f"({' '.join(f'{r:.0f}' for r in rates)})"
    )


def machine_spread(
    data: str, images: int = 300, repeats: int = 7, seconds: float = 1.7, procs: int | None = None
) -> None:
    """The spread this machine gives a fixed piece of work: the floor under any loader's epoch spread.

    A loader's per-epoch spread ((fastest - slowest) / median, as ``raypipe bench`` reports it) mixes what
    the loader does with what the machine does to it: a virtual machine's cores are shared, and the same
    work takes more or less time from one second to the next. This times the same work again and again,
    ``--repeats`` times: decoding the same JPEGs (DCT-scaled to half size) and resizing them to 224 px,
    in one process and in one process per core at once (as a loader keeps every core busy), and prints
    each process's rates and spread. Each repeat lasts about as long as ``--seconds`` (an epoch's length)::

        raypipe sample-data /tmp/sample3k --per-class 300
        python bench/profiles.py machine-spread /tmp/sample3k --seconds 1.7

    A loader's spread at or below the all-cores figure is the machine's, not the loader's.
    """
    procs = procs or len(os.sched_getaffinity(0))
    files = sorted(f for f in Path(data).rglob("*") if f.suffix.lower() in (".jpg", ".jpeg"))[:images]
    if not files:
        raise SystemExit(f"no JPEGs under {data}")
    datas = [f.read_bytes() for f in files]
    _report_spread("1 process", _rates(datas, repeats, seconds))
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        runs = pool.starmap(_rates, [(datas, repeats, seconds)] * procs)
    for k, rates in enumerate(runs):
        _report_spread(f"{procs} at once: #{k}", rates)


# ---- slab-cost -------------------------------------------------------------------------------------

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _touch_pages(m: mmap.mmap) -> int:
    """Read one byte of every page, as a consumer of every image would fault each page in."""
    return int(np.frombuffer(m, np.uint8)[::4096].sum())


def _new_file(src: np.ndarray, directory: str) -> None:
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
        _touch_pages(m)
    os.close(fd)


def _reused(src: np.ndarray, fd: int) -> None:
    size = src.nbytes
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE) as m:
        np.frombuffer(m, np.uint8)[:] = src
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ) as m:
        _touch_pages(m)


def slab_cost(rows: int = 128, size: int = 224, repeat: int = 30) -> None:
    """What a chunk's shared memory costs beside the copy of its images, new each time or reused.

    The local workers hand each chunk's images to the trainer in shared memory (``raypipe.workers.slabs``).
    This times, for one chunk of ``--rows`` images of ``--size`` px, the way the trainer and a worker use
    that memory, without the decoding around it:

    - ``new file``: a new file in /dev/shm (or the temporary directory), written, then mapped read-only
      and unlinked by the reader, its pages freed when the mapping goes;
    - ``reused slab``: the same memory each time (a ``memfd`` made once), mapped for writing and for
      reading with every page mapped in one call, as a worker and the trainer do with a slab;
    - ``copy alone``: the writes into memory that is already mapped, the floor;
    - ``map populated`` and ``map lazily``: the reader's mapping of the slab and its unmapping, with every
      page mapped in one call (a trainer that reads the images) or none (a feeder that passes the slab
      on unread: ``SlabPool.populate_views``).

    ::

        python bench/profiles.py slab-cost                   # 128 rows of 224 px (19 MB), as a chunk
        python bench/profiles.py slab-cost --rows 2048       # a Parquet window's chunk
    """
    src = np.random.default_rng(0).integers(0, 256, rows * size * size * 3, dtype=np.uint8)
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

    def map_and_unmap(populate: bool) -> None:
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        mmap.mmap(fd, src.nbytes, flags=flags, prot=mmap.PROT_READ).close()

    contenders = {
        "new file": lambda: _new_file(src, directory),
        "reused slab": lambda: _reused(src, fd),
        "copy alone": copy_alone,
        "map populated": lambda: map_and_unmap(True),
        "map lazily": lambda: map_and_unmap(False),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():
        fn()  # warm-up
    for _ in range(repeat):  # in turn, so a drift of the machine's speed touches all alike
        for name, fn in contenders.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    print(
        f"one chunk of {rows} x {size}x{size}x3 uint8 ({src.nbytes / 2**20:.1f} MiB), "
        f"{repeat} rounds, new files in {directory}:"
    )
    for name, ts in times.items():
        print(f"  {name:13s} median {statistics.median(ts) * 1e3:7.2f} ms   min {min(ts) * 1e3:7.2f} ms")


# ---- the command line ------------------------------------------------------------------------------


def register(add) -> None:
    """Add this module's measurements to ``bench/profiles.py``: ``add(name, fn)`` returns the subcommand's
    parser, whose options are ``fn``'s keyword arguments."""
    p = add("warm-memory", warm_memory)
    p.add_argument("--gib", type=float, help="GiB to touch (default: 90 %% of the available memory)")

    p = add("machine-spread", machine_spread)
    p.add_argument("data", help="a folder of JPEGs (searched recursively)")
    p.add_argument("--images", type=int, default=300, help="distinct images to decode (default: 300)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats, as a bench's timed epochs (default: 7)")
    p.add_argument("--seconds", type=float, default=1.7, help="length of one repeat (default: 1.7)")
    p.add_argument("--procs", type=int, help="processes for the all-cores run (default: the cores)")

    p = add("slab-cost", slab_cost)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeat", type=int, default=30)
