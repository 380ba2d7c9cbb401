"""CPU that reading objects over S3 costs, per object, on the client and on the test server.

Reads every object under ``s3://bench/folder`` of a ``bench/cloud_input.py`` work folder (or any folder of
buckets) from ``raypipe.testing.s3server`` in its own process, with ``--threads`` requests in flight from
one client process, first whole objects through pyarrow's ``S3FileSystem`` (``open_input_stream``: a HEAD
and a GET each), then a HEAD alone, then whole objects with one GET each as raypipe reads a folder
(``raypipe.sources.single_get``, obstore)::

    python bench/cloud_input.py --images 3000 --epochs 1 --workdir /tmp/cloudbench
    python bench/s3_request_cost.py /tmp/cloudbench/buckets --prefix bench/folder

Prints objects/s, and the CPU time the client process and the server process spent per object.

``--ranges`` reads each object whole as one ranged read instead, as raypipe reads the members of a
tar shard (``--prefix bench/shards``): through a pyarrow handle opened beforehand (its HEAD not
counted), then with one ranged GET (``SingleGet.read_range``), and prints the CPU per MB.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("buckets", help="a folder whose folders are buckets")
    p.add_argument("--prefix", default="bench/folder", help="bucket/prefix to read")
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--ranges", action="store_true", help="ranged reads of whole objects (tar shards), per MB")
    a = p.parse_args()

    import psutil
    import pyarrow.fs as pafs

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cloud_input import S3Process

    server = S3Process(Path(a.buckets), a.latency_ms)
    try:
        fs = server.filesystem()
        selector = pafs.FileSelector(a.prefix, recursive=True)
        paths = [i.path for i in fs.get_file_info(selector) if i.type == pafs.FileType.File]
        served = psutil.Process(server.proc.pid)

        def whole(path: str) -> int:
            with fs.open_input_stream(path) as f:
                return len(f.read())

        def head(path: str) -> int:
            return fs.get_file_info(path).size

        from raypipe.sources.single_get import single_get_for

        getter = single_get_for(fs)

        def single(path: str) -> int:
            return len(getter.read(path))

        contenders = [("HEAD + GET (pyarrow)", whole), ("HEAD (pyarrow)", head)]
        if getter is not None:
            contenders.append(("GET (single_get, obstore)", single))
        unit, per_unit = "object", lambda n, nbytes: n
        if a.ranges:
            sizes = {path: fs.get_file_info(path).size for path in paths}
            handles = {path: fs.open_input_file(path) for path in paths}

            def pyarrow_range(path: str) -> int:
                return len(handles[path].read_at(sizes[path], 0))

            def single_range(path: str) -> int:
                return len(getter.read_range(path, 0, sizes[path]))

            contenders = [("ranged read (pyarrow handle)", pyarrow_range)]
            if getter is not None:
                contenders.append(("ranged GET (single_get, obstore)", single_range))
            unit, per_unit = "MB", lambda n, nbytes: nbytes / 2**20
        for name, fn in contenders:
            s0, c0, t0 = sum(served.cpu_times()[:2]), time.process_time(), time.perf_counter()
            with ThreadPoolExecutor(a.threads) as pool:
                got = list(pool.map(fn, paths))
            dt = time.perf_counter() - t0
            n, units = len(got), per_unit(len(got), sum(got))
            server_ms = 1e3 * (sum(served.cpu_times()[:2]) - s0) / units
            client_ms = 1e3 * (time.process_time() - c0) / units
            print(f"{name}: {n} objects in {dt:.2f} s = {n / dt:.0f}/s; CPU per {unit}: client {client_ms:.2f} ms, "
                  f"server {server_ms:.2f} ms", flush=True)  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()
