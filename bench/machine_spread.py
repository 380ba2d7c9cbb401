"""The spread this machine gives a fixed piece of work: the floor under any loader's epoch spread.

A loader's per-epoch spread ((fastest - slowest) / median, as ``raypipe bench`` reports it) mixes what
the loader does with what the machine does to it: a virtual machine's cores are shared, and the same
work takes more or less time from one second to the next. This times the same work again and again,
``--repeats`` times: decoding the same JPEGs (DCT-scaled to half size) and resizing them to 224 px,
in one process and in one process per core at once (as a loader keeps every core busy), and prints
each process's rates and spread. Each repeat lasts about as long as ``--seconds`` (an epoch's length)::

    raypipe sample-data /tmp/sample3k --per-class 300
    python bench/machine_spread.py /tmp/sample3k --seconds 1.7

A loader's spread at or below the all-cores figure is the machine's, not the loader's.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import statistics
import time
from pathlib import Path


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


def _spread(rates: list[float]) -> float:
    return (max(rates) - min(rates)) / statistics.median(rates)


def _report(label: str, rates: list[float]) -> None:
    print(f"{label:<22} median {statistics.median(rates):6.0f} img/s, spread {100 * _spread(rates):3.0f} %  "
          f"({' '.join(f'{r:.0f}' for r in rates)})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a folder of JPEGs (searched recursively)")
    p.add_argument("--images", type=int, default=300, help="distinct images to decode (default: 300)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats, as a bench's timed epochs (default: 7)")
    p.add_argument("--seconds", type=float, default=1.7, help="length of one repeat (default: 1.7)")
    p.add_argument("--procs", type=int, default=len(os.sched_getaffinity(0)),
                   help="processes for the all-cores run (default: the cores)")  # fmt: skip
    a = p.parse_args()
    files = sorted(f for f in Path(a.data).rglob("*") if f.suffix.lower() in (".jpg", ".jpeg"))[: a.images]
    if not files:
        raise SystemExit(f"no JPEGs under {a.data}")
    datas = [f.read_bytes() for f in files]
    _report("1 process", _rates(datas, a.repeats, a.seconds))
    with multiprocessing.get_context("spawn").Pool(a.procs) as pool:
        runs = pool.starmap(_rates, [(datas, a.repeats, a.seconds)] * a.procs)
    for k, rates in enumerate(runs):
        _report(f"{a.procs} at once: #{k}", rates)


if __name__ == "__main__":
    main()
