"""Reading from an object store, measured against a local S3-compatible server in a process of its own
(``raypipe.testing.s3server``): the CPU each request costs the client and the server, and where a run's
CPU goes per image, by process, for each source of a ``bench/cloud_input.py`` work folder.
``python bench/profiles.py NAME --help`` runs each (``register`` adds them to its command line);
``bench/cloud_input.py`` starts its server and splits the cores with the helpers here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from raypipe.benchmark.measure import core_ticks


class S3Process:
    """``raypipe.testing.s3server`` in a child process serving ``root``; stopped on exit."""

    def __init__(self, root: Path, latency_ms: float, cores: set[int] | None = None, *, cache_listings: bool = False):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "raypipe.testing.s3server",
                str(root),
                "--latency-ms",
                str(latency_ms),
                *(["--cache-listings"] if cache_listings else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.served = ""  # the server's last line once stopped: the requests it answered, the most at once
        if cores:  # before it serves: its threads, started later, take the same cores
            os.sched_setaffinity(self.proc.pid, cores)
        line = self.proc.stdout.readline()
        if " at http://" not in line:
            self.stop()
            raise RuntimeError(f"the S3 server did not start: {line!r}")
        self.host_port = line.split(" at http://", 1)[1].split()[0]

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(anonymous=True, endpoint_override=self.host_port, scheme="http", region="us-east-1")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.served = self.proc.communicate(timeout=10)[0].strip()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def split_cores(server_cores: int) -> tuple[set[int], set[int] | None]:
    """(the cores this process keeps, the last ``server_cores`` of its cores for the S3 server or None
    for 0); ValueError when that leaves this process none."""
    cores = sorted(os.sched_getaffinity(0))
    if server_cores and not 0 < server_cores < len(cores):
        raise ValueError(f"--server-cores must leave at least one of the {len(cores)} cores")
    server = set(cores[len(cores) - server_cores :]) if server_cores else None
    return set(cores) - (server or set()), server


def keep_to(cores: set[int]) -> None:
    """Every thread of this process on ``cores`` (the workers it starts afterwards inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cores)


def s3_requests(
    buckets: str,
    prefix: str = "bench/folder",
    threads: int = 32,
    latency_ms: float = 0.0,
    ranges: bool = False,
    cache_dir: str = "",
) -> None:
    """CPU that reading objects over S3 costs, per object, on the client and on the test server.

    Reads every object under ``s3://bench/folder`` of a ``bench/cloud_input.py`` work folder (or any folder
    of buckets) from ``raypipe.testing.s3server`` in its own process, with ``--threads`` requests in flight
    from one client process, first whole objects through pyarrow's ``S3FileSystem``
    (``open_input_stream``: a HEAD and a GET each), then a HEAD alone, then whole objects with one GET each
    as raypipe reads a folder (``raypipe.sources.transport.single_get``, obstore); then the same files from the local
    disk, through the same threads (what handing each object to a thread and back costs, without a
    request) and in this thread one after another, as a local folder's rows are read. The GET's client
    CPU over the last is what each image of an ``s3://`` folder costs its reading worker beyond the local
    folder's::

        python bench/cloud_input.py --images 3000 --epochs 1 --workdir /tmp/cloudbench
        python bench/profiles.py s3-requests /tmp/cloudbench/buckets --prefix bench/folder

    Prints objects/s, and the CPU time the client process and the server process spent per object.

    ``--ranges`` reads each object whole as one ranged read instead, as raypipe reads the members of a
    tar shard (``--prefix bench/shards``): through a pyarrow handle opened beforehand (its HEAD not
    counted), then with one ranged GET (``SingleGet.read_range``), and prints the CPU per MB.

    ``--cache-dir DIR`` reads the objects as a worker reads an ``s3://`` folder's blocks of 128 rows
    (``BlockReader.read_block``): without a cache, then through a cache in ``DIR`` (emptied first) twice,
    the first pass filling it, the second reading what it holds.
    """
    import psutil
    import pyarrow.fs as pafs

    from raypipe.sources.transport.single_get import single_get_for

    if ranges and cache_dir:  # each replaces the contenders: together one would be dropped unsaid
        raise SystemExit("--ranges and --cache-dir measure different reads: give one of them")
    server = S3Process(Path(buckets), latency_ms)
    try:
        fs = server.filesystem()
        selector = pafs.FileSelector(prefix, recursive=True)
        listed = {i.path: i for i in fs.get_file_info(selector) if i.type == pafs.FileType.File}
        paths = list(listed)
        served = psutil.Process(server.proc.pid)

        def whole(path: str) -> int:
            with fs.open_input_stream(path) as f:
                return len(f.read())

        def head(path: str) -> int:
            return fs.get_file_info(path).size

        getter = single_get_for(fs)

        def single(path: str) -> int:
            return len(getter.read(path))

        def local(path: str) -> int:
            with open(os.path.join(buckets, path), "rb") as f:
                return len(f.read())

        contenders = [("HEAD + GET (pyarrow)", whole), ("HEAD (pyarrow)", head)]
        if getter is not None:
            contenders.append(("GET (single_get, obstore)", single))
        contenders.append((f"local file, {threads} threads", local))
        in_this_thread = "local file, in this thread"  # read as a local folder's rows are: no hand-offs
        contenders.append((in_this_thread, local))
        if cache_dir:
            contenders = [
                (name, _block_reads(fs, prefix, listed, threads, cache)) for name, cache in _cache_passes(cache_dir)
            ]
        unit, per_unit = "object", lambda n, nbytes: n
        if ranges:
            sizes = {path: info.size for path, info in listed.items()}
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
            if name == in_this_thread or cache_dir:
                got = [fn(path) for path in paths]
            else:
                with ThreadPoolExecutor(threads) as pool:
                    got = list(pool.map(fn, paths))
            dt = time.perf_counter() - t0
            n, units = len(got), per_unit(len(got), sum(got))
            server_ms = 1e3 * (sum(served.cpu_times()[:2]) - s0) / units
            client_ms = 1e3 * (time.process_time() - c0) / units
            print(
                f"{name}: {n} objects in {dt:.2f} s = {n / dt:.0f}/s; CPU per {unit}: client {client_ms:.2f} ms, "
                f"server {server_ms:.2f} ms",
                flush=True,
            )
    finally:
        server.stop()


def _cache_passes(cache_dir: str):
    """(name, CacheConfig or None) of the three passes of ``--cache-dir``, the cache emptied first."""
    import shutil

    from raypipe.sources.transport.cache_config import CacheConfig

    shutil.rmtree(cache_dir, ignore_errors=True)
    config = CacheConfig(dir=cache_dir, max_bytes=1 << 40)
    return [("blocks, no cache", None), ("blocks, cache filled", config), ("blocks, cache read", config)]


def _block_reads(fs, prefix: str, listed: dict, threads: int, cache):
    """A function of one path that reads the block of up to 128 listed objects it starts (0 for the other
    paths) through a ``BlockReader`` as a worker's, and returns the bytes read. ``listed``: the objects'
    ``FileInfo`` by path, in order."""
    import numpy as np

    from raypipe.sources.reader import BlockReader
    from raypipe.sources.transport.paths import DatasetRoot
    from raypipe.sources.transport.remote import ReadOptions

    paths = list(listed)
    reader = BlockReader(
        DatasetRoot(prefix, fs, f"s3://{prefix}"), "folder", options=ReadOptions(in_flight=threads, cache=cache)
    )
    starts = {path: n for n, path in enumerate(paths) if n % 128 == 0}

    def block(path: str) -> int:
        if path not in starts:
            return 0
        chosen = paths[starts[path] : starts[path] + 128]
        rows = {
            "path": np.array([p[len(prefix) + 1 :] for p in chosen], dtype=object),
            "object_size": np.array([listed[p].size for p in chosen]),
            "object_mtime_ns": np.array([listed[p].mtime_ns for p in chosen]),
        }
        out = [r.result() if hasattr(r, "result") else r for r in reader.read_block(rows, wait=False)]
        bad = [r for r in out if not isinstance(r, bytes | memoryview)]
        if bad:
            raise RuntimeError(f"{len(bad)} of {len(out)} objects not read: {bad[0]!r}")
        return sum(len(r) for r in out)

    return block


# The sources of a bench/cloud_input.py work folder, under its buckets/bench/
SOURCES = {
    "folder": "folder",
    "parquet": "parquet/train.parquet",
    "webdataset": "shards",
    "s3-folder": "folder",
    "s3-shards": "shards",
}


def cpu_account(
    source: str,
    workdir: str = "/tmp/cloudbench",
    epochs: int = 4,
    latency_ms: float = 20.0,
    cpus_per_task: float | None = None,
    server_cores: int = 0,
) -> None:
    """Where the CPU goes per image when a source is read as ``raypipe run`` reads it, by process.

    Runs ``Pipeline`` + ``EpochSource`` (RandomResizedCrop 224 + flip, batch 128, local workers) over one
    source of a ``bench/cloud_input.py`` work folder, an unmeasured epoch first, and prints the images/s
    of the measured epochs, how busy its cores were (``/proc/stat``), and the CPU milliseconds per image
    of the driver, of the worker processes (user and system), and of the S3 test server where there is
    one (``raypipe.testing.s3server`` in its own process, adding ``--latency-ms`` to every response),
    with the worker processes' minor page faults per image (``/proc/PID/stat``)::

        python bench/cloud_input.py --images 3000 --epochs 1 --workdir /tmp/cloudbench   # makes the data
        python bench/profiles.py cpu-account folder --workdir /tmp/cloudbench
        python bench/profiles.py cpu-account s3-folder --workdir /tmp/cloudbench --latency-ms 20

    The ``s3-`` sources are read without the local cache (``RAYPIPE_CACHE_DIR=off`` unless it is set), so
    that every epoch's requests are measured.

    ``--server-cores N`` gives the server N cores of its own and the pipeline the others, as
    ``bench/cloud_input.py --server-cores`` does (compare with ``taskset -c 0 python bench/profiles.py
    cpu-account folder`` for a local source on the same one core).

    On a machine whose cores are all busy, a contender's rate is the cores over its CPU per image, so the
    milliseconds tell where a gap between two sources comes from: the reading workers' own extra CPU, or
    the test server's, which a real object store does not take from the reader's machine.
    """
    import psutil

    from raypipe import ExecutionConfig, Pipeline, PipelineConfig, TrainAugment
    from raypipe.pipeline import EpochSource
    from raypipe.sources import open_source

    buckets = Path(workdir) / "buckets"
    # The requests are what an s3 source's figures are about: by default a remote folder's images would
    # be read from the local cache after the unmeasured epoch (and kept in ~/.cache). Its workers, which
    # start below, inherit this; RAYPIPE_CACHE_DIR set to a folder measures that cache instead.
    os.environ.setdefault("RAYPIPE_CACHE_DIR", "off")
    try:
        mine, server_set = split_cores(server_cores)  # mine: the cores whose busy share is printed
    except ValueError as e:
        print(f"profiles.py cpu-account: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if server_set:
        keep_to(mine)
    server = S3Process(buckets, latency_ms, server_set) if source.startswith("s3-") else None
    try:
        if server is not None:
            rows = open_source(f"s3://bench/{SOURCES[source]}", filesystem=server.filesystem())
        else:
            rows = open_source(str(buckets / "bench" / SOURCES[source]))
        execution = ExecutionConfig(cpus_per_task=cpus_per_task)  # None: decided by the dataset
        pipe = Pipeline(
            rows,
            TrainAugment(input_size=224, color_jitter=None),
            config=PipelineConfig(batch_size=128, seed=0),
            execution=execution,
        )
        stream = EpochSource(pipe, end_epoch=epochs + 1)
        me = psutil.Process()
        served = psutil.Process(server.proc.pid) if server is not None else None

        def cpu() -> tuple[float, float, float, float, float]:
            own = me.cpu_times()
            procs = [c for c in me.children(recursive=True) if served is None or c.pid != served.pid]
            kids = [c.cpu_times() for c in procs]
            srv = sum(served.cpu_times()[:2]) if served is not None else 0.0
            faults = sum(_minor_faults(c.pid) for c in procs)
            return own.user + own.system, sum(k.user for k in kids), sum(k.system for k in kids), srv, faults

        images = 0
        for epoch in range(epochs + 1):
            if epoch == 1:
                c0, b0, t0 = cpu(), core_ticks(mine), time.perf_counter()
            n = sum(len(batch["label"]) for batch in stream)
            images += n if epoch else 0
        seconds = time.perf_counter() - t0
        c1, b1 = cpu(), core_ticks(mine)
        stream.close()
    finally:
        if server is not None:
            server.stop()
    busy = (b1[0] - b0[0]) / max(1, b1[1] - b0[1])
    per = [1e3 * (x1 - x0) / images for x0, x1 in zip(c0, c1, strict=True)]
    print(
        f"{source}: {images / seconds:.0f} img/s over {epochs} epochs, its cores {100 * busy:.0f} % busy; "
        f"CPU ms per image: driver {per[0]:.2f}, workers {per[1] + per[2]:.2f} (user {per[1]:.2f}, system "
        f"{per[2]:.2f}), S3 server {per[3]:.2f}; the workers' minor page faults per image {per[4] / 1e3:.1f}"
    )


def _minor_faults(pid: int) -> int:
    """The minor page faults of process ``pid`` so far (``/proc/PID/stat``; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])  # minflt: the 10th field, the 8th after the name
    except (OSError, ValueError, IndexError):
        return 0


def s3_listing(
    shards: int = 10, samples: int = 250, image_kb: int = 150, latency_ms: float = 20.0, workdir: str = "/tmp/listbench"
) -> None:
    """Bytes a WebDataset listing reads over S3, as a share of the dataset's bytes, with and without an index.

    Writes ``--shards`` tar shards of ``--samples`` samples (``--image-kb`` KB of JPEG-headed random bytes
    and a ``.cls`` each) into ``raypipe.testing.S3Server`` (in this process, ``--latency-ms`` before every
    response) and lists them with ``open_source``: without an index, after ``raypipe index``
    (``index_shards``, shards over Ray tasks), and the same samples as written by ``raypipe convert``
    (which writes the index itself)::

        python bench/profiles.py s3-listing --shards 10 --samples 50

    Prints, per listing, the object bytes the server sent, the dataset's bytes, their ratio, the requests
    and the seconds.
    """
    import shutil
    import tarfile

    import ray

    from raypipe.sources import open_source
    from raypipe.sources.indexes.indexer import index_shards
    from raypipe.sources.writing.convert import convert
    from raypipe.testing import S3Server

    work = Path(workdir)
    shutil.rmtree(work, ignore_errors=True)
    shard_dir, folder = work / "buckets" / "bench" / "shards", work / "folder"
    shard_dir.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(shard_dir / f"shard-{s:04d}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for i in range(samples):
                key, label = f"{s:04d}{i:05d}", (s * samples + i) % 10
                image = b"\xff\xd8\xff" + os.urandom(image_kb * 1000 - 3)
                (folder / str(label)).mkdir(parents=True, exist_ok=True)
                (folder / str(label) / f"{key}.jpg").write_bytes(image)
                for name, data in ((f"{key}.jpg", image), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, __import__("io").BytesIO(data))

    def dataset_bytes(d: Path) -> int:
        return sum(p.stat().st_size for p in d.glob("*.tar"))

    def listing(name: str, data: str, fs, server, total: int) -> None:
        server.reset_counts()
        t0 = time.perf_counter()
        rows = open_source(data, filesystem=fs)
        seconds = time.perf_counter() - t0
        print(
            f"{name:<34} {len(rows):>6} samples  read {server.bytes_sent / 1e6:8.2f} MB of {total / 1e6:7.1f} MB "
            f"= {100 * server.bytes_sent / total:6.2f} %, {server.count():>5} requests, {seconds:5.2f} s"
        )

    started = not ray.is_initialized()
    with S3Server(work / "buckets", latency_ms=latency_ms) as server:
        fs = server.filesystem()
        total = dataset_bytes(shard_dir)
        print(f"{shards} shards of {samples} samples of {image_kb} KB, {latency_ms:g} ms per request")
        listing("no index", "s3://bench/shards", fs, server, total)
        index_shards("s3://bench/shards", filesystem=fs)
        listing("index by `raypipe index`", "s3://bench/shards", fs, server, total)
        convert(str(folder), "s3://bench/converted", format="webdataset", samples_per_shard=samples, dst_filesystem=fs)
        listing(
            "shards by `raypipe convert`",
            "s3://bench/converted",
            fs,
            server,
            dataset_bytes(work / "buckets" / "bench" / "converted"),
        )
    if started:
        ray.shutdown()
    shutil.rmtree(work, ignore_errors=True)


def register(add) -> None:
    """Add this module's measurements to ``bench/profiles.py``: ``add(name, fn)`` returns the subcommand's
    parser, whose options are ``fn``'s keyword arguments."""
    p = add("s3-requests", s3_requests)
    p.add_argument("buckets", help="a folder whose folders are buckets")
    p.add_argument("--prefix", default="bench/folder", help="bucket/prefix to read")
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--ranges", action="store_true", help="ranged reads of whole objects (tar shards), per MB")
    p.add_argument("--cache-dir", default="", help="read blocks as a worker does, without and through a cache here")

    p = add("s3-listing", s3_listing)
    p.add_argument("--shards", type=int, default=10)
    p.add_argument("--samples", type=int, default=250, help="per shard")
    p.add_argument("--image-kb", type=int, default=150)
    p.add_argument("--latency-ms", type=float, default=20.0, help="added before every S3 response")
    p.add_argument("--workdir", default="/tmp/listbench", help="written, then removed")

    p = add("cpu-account", cpu_account)
    p.add_argument("source", choices=sorted(SOURCES))
    p.add_argument("--workdir", default="/tmp/cloudbench", help="a bench/cloud_input.py work folder")
    p.add_argument("--epochs", type=int, default=4, help="measured epochs, after an unmeasured one")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added before every S3 response")
    p.add_argument("--cpus-per-task", type=float, default=None, help="ExecutionConfig.cpus_per_task (default: its own)")
    p.add_argument(
        "--server-cores",
        type=int,
        default=0,
        help="cores of the S3 server's own; the pipeline gets the rest (as in bench/cloud_input.py)",
    )
