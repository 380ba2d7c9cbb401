"""Touch most of this machine's free memory once, and say how long the first and a second touch took.

A freshly started virtual machine may back its memory lazily: the first write to each page of guest
memory traps to the hypervisor, and is then orders of magnitude slower than any later one. Every
loader's new buffers (a batch, an object-store region, a worker's heap) pay it until the machine's
memory has been touched once, and the loader with the most memory in play pays most, so the first
benchmarks on a new VM rank loaders by their footprint rather than their speed. Run this once before
benchmarking a new VM::

    python bench/warm_memory.py            # 90 % of the available memory
    python bench/warm_memory.py --gib 8
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psutil


def touch(nbytes: int) -> float:
    """Seconds to allocate and write ``nbytes`` (then freed)."""
    t0 = time.perf_counter()
    block = np.ones(nbytes // 8, dtype=np.float64)
    seconds = time.perf_counter() - t0
    del block
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, help="GiB to touch (default: 90 %% of the available memory)")
    a = p.parse_args()
    nbytes = int(a.gib * 2**30) if a.gib else int(0.9 * psutil.virtual_memory().available)
    first = touch(nbytes)
    second = touch(nbytes)
    gib = nbytes / 2**30
    print(f"{gib:.1f} GiB: first touch {first:.1f} s ({first / gib:.2f} s/GiB), again {second:.1f} s "
          f"({second / gib:.2f} s/GiB)")  # fmt: skip


if __name__ == "__main__":
    main()
