"""Listing a remote image folder of many objects: one recursive listing (pages in turn) against class
prefixes listed concurrently (``sources.formats.folder.list_remote``), over ``raypipe.testing.s3server`` in a
process of its own. ``python bench/profiles.py s3-folder-listing --help`` runs it.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

from raypipe.benchmark.s3 import S3Process, keep_to, split_cores


def _make_tree(folder: Path, prefixes: int, objects: int) -> float:
    """``prefixes`` class folders of ``objects`` empty ``.JPEG`` files each (a listing reads no bytes:
    an inode a key is all it needs); the seconds it took."""
    t0 = time.perf_counter()
    flags = os.O_CREAT | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    for c in range(prefixes):
        d = folder / f"n{c:08d}"
        d.mkdir(parents=True)
        for i in range(objects):
            os.close(os.open(d / f"n{c:08d}_{i:07d}.JPEG", flags, 0o644))
    return time.perf_counter() - t0


def folder_listing(
    prefixes: int = 100,
    objects: int = 1000,
    latency_ms: float = 20.0,
    in_flight: int = 64,
    server_cores: int = 1,
    io_threads: int = 0,
    workdir: str = "/tmp/folderlist",
    keep: bool = False,
) -> None:
    """Seconds, requests and CPU to list an ``s3://`` image folder, in one listing and by class prefixes.

    Makes ``--prefixes`` class folders of ``--objects`` empty objects each under ``--workdir`` (kept with
    ``--keep`` and reused when the same size asks again), serves them with ``raypipe.testing.s3server``
    (``--latency-ms`` before every answer, listings walked once: ``--cache-listings``) in a process of its
    own on ``--server-cores`` cores of its own, and lists ``s3://bench/folder`` as ``open_source`` does:
    with ``RAYPIPE_LIST_IN_FLIGHT=1`` (one recursive listing, 1,000 keys a page, each page after the last)
    and with ``--in-flight`` class prefixes at once (pyarrow's S3 client sends at most
    ``pyarrow.io_thread_count()`` requests at a time, 8 by default: ``--io-threads N`` sets it)::

        python bench/profiles.py s3-folder-listing --prefixes 1000 --objects 1281 --keep

    Prints, per listing, the objects listed, the seconds, the requests the server answered and the most
    at once, the server's CPU (per page) and the listing process's CPU; and the floor latency alone sets:
    pages x latency for one listing, pages / requests at once x latency by prefixes.
    """
    import psutil
    import pyarrow as pa

    from raypipe.sources.formats.folder import list_remote
    from raypipe.sources.transport.paths import open_root
    from raypipe.sources.transport.remote import ReadOptions

    try:
        mine, server_set = split_cores(server_cores)
    except ValueError as e:
        print(f"profiles.py s3-folder-listing: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    work = Path(workdir)
    stamp = work / f"made-{prefixes}x{objects}"
    if not stamp.exists():
        shutil.rmtree(work, ignore_errors=True)
        made = _make_tree(work / "buckets" / "bench" / "folder", prefixes, objects)
        stamp.touch()
        print(f"made {prefixes} x {objects} = {prefixes * objects} objects in {made:.0f} s", flush=True)
    if server_set:
        keep_to(mine)
    if io_threads:
        pa.set_io_thread_count(io_threads)
    pages_flat = math.ceil(prefixes * objects / 1000)
    pages_prefixed = math.ceil(prefixes / 1000) + prefixes * max(1, math.ceil(objects / 1000))
    print(
        f"{prefixes} prefixes x {objects} objects, {latency_ms:g} ms per request, the server on "
        f"{len(server_set) if server_set else 'shared'} core(s), the listing on {len(mine)}, pyarrow IO threads "
        f"{pa.io_thread_count()}",
        flush=True,
    )
    try:
        for name, n, pages in (
            ("one recursive listing", 1, pages_flat),
            (f"prefixes, {in_flight} at once", in_flight, pages_prefixed),
        ):
            server = S3Process(work / "buckets", latency_ms, server_set, cache_listings=True)
            try:
                served = psutil.Process(server.proc.pid)
                root = open_root("s3://bench/folder", filesystem=server.filesystem())
                s0, c0, t0 = sum(served.cpu_times()[:2]), time.process_time(), time.perf_counter()
                _, files, _ = list_remote(root, ReadOptions(list_in_flight=n))
                seconds = time.perf_counter() - t0
                server_s, client_s = sum(served.cpu_times()[:2]) - s0, time.process_time() - c0
            finally:
                server.stop()
            listed = sum(map(len, files.values()))
            at_once = int(server.served.split("at most ")[1].split()[0]) if "at most " in server.served else 0
            # a prefix's pages go in turn (each asks after the last one's continuation token)
            floor = (pages if n == 1 else pages / max(1, min(n, at_once))) * latency_ms / 1e3
            print(
                f"{name:<26} {listed:>9} objects {seconds:7.2f} s  {server.served or '(server said nothing)'}; "
                f"latency floor {floor:5.2f} s; server CPU {server_s:6.2f} s ({1e3 * server_s / pages:.1f} ms a "
                f"page), listing CPU {client_s:6.2f} s",
                flush=True,
            )
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def register(add) -> None:
    """Add this module's measurement to ``bench/profiles.py`` (see ``s3.register``)."""
    p = add("s3-folder-listing", folder_listing)
    p.add_argument("--prefixes", type=int, default=100, help="class folders")
    p.add_argument("--objects", type=int, default=1000, help="per class folder")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added before every S3 response")
    p.add_argument("--in-flight", type=int, default=64, help="class prefixes listed at once (RAYPIPE_LIST_IN_FLIGHT)")
    p.add_argument("--server-cores", type=int, default=1, help="cores of the S3 server's own (0: shared)")
    p.add_argument("--io-threads", type=int, default=0, help="pyarrow.set_io_thread_count (0: pyarrow's own, 8)")
    p.add_argument("--workdir", default="/tmp/folderlist", help="where the objects are made")
    p.add_argument("--keep", action="store_true", help="keep the objects for another run")
