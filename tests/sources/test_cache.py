"""The local cache of remote objects: later reads hit (no request where the listing gave the objects'
sizes and times), eviction keeps the bound, two processes fill one entry once, a partial file or
segment record is never served, another process finds what one appended, a changed object is not
served stale."""

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raypipe._values import parse_bytes
from raypipe.kernels.errors import MISSING, OUTSIDE_ROOT
from raypipe.sources import BlockReader, ReadOptions, open_source
from raypipe.sources.table import column_or_default
from raypipe.sources.transport.cache import LocalCache, local_cache
from raypipe.sources.transport.cache_config import CacheConfig
from raypipe.sources.transport.cached_objects import store_name
from raypipe.testing import S3Server

pytestmark = pytest.mark.timeout(120)


def _batch(rows):
    return {k: rows.table.column(k).to_numpy(zero_copy_only=False) for k in rows.table.column_names}


def _fill(data: bytes):
    return lambda f: f.write(data)


def test_config_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv("RAYPIPE_CACHE_MAX_BYTES", raising=False)
    for off in ("off", "OFF", "none"):
        monkeypatch.setenv("RAYPIPE_CACHE_DIR", off)
        assert CacheConfig.from_env() is None and ReadOptions().cache is None
    # nothing set: remote folders' images only, in the user's cache folder
    monkeypatch.delenv("RAYPIPE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = CacheConfig(dir=str(tmp_path / "xdg" / "raypipe"), max_bytes=50 << 30, folders_only=True)
    assert CacheConfig.from_env() == default == ReadOptions().cache
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CacheConfig.from_env().dir == str(tmp_path / "home" / ".cache" / "raypipe")
    assert [kind for kind in ("folder", "manifest", "webdataset", "parquet") if default.applies_to(kind)] == ["folder"]
    (tmp_path / "a-file").write_bytes(b"")  # a home where no folder can be made: no default cache
    monkeypatch.setenv("HOME", str(tmp_path / "a-file" / "home"))
    assert CacheConfig.from_env() is None and not (tmp_path / "a-file").is_dir()
    # a folder set: every remote object
    monkeypatch.setenv("RAYPIPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RAYPIPE_CACHE_MAX_BYTES", "2GB")
    assert ReadOptions().cache == CacheConfig(dir=str(tmp_path), max_bytes=2 << 30)
    assert all(ReadOptions().cache.applies_to(kind) for kind in ("folder", "manifest", "webdataset", "parquet"))
    assert parse_bytes("512MiB") == 512 << 20 and parse_bytes("1e6") == 10**6
    monkeypatch.setenv("RAYPIPE_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="RAYPIPE_CACHE_MAX_BYTES"):
        CacheConfig.from_env()
    with pytest.raises(ValueError, match="max_bytes"):
        CacheConfig(dir=str(tmp_path), max_bytes=0)


def test_entries_are_keyed_by_size_and_time(tmp_path):
    keys = {LocalCache.key("s3|h|http", "b/x.jpg", size, mtime) for size, mtime in ((10, 1), (11, 1), (10, 2))}
    assert len(keys) == 3
    assert LocalCache.key("s3|other|http", "b/x.jpg", 10, 1) not in keys


def test_eviction_keeps_the_bound_least_recently_used_first(tmp_path):
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=1000))
    keys = [LocalCache.key("t", f"k{i}", 100, 0) for i in range(12)]
    for i, key in enumerate(keys[:9]):
        os.close(cache.get(key, 100, _fill(bytes([i]) * 100)))
        os.utime(cache.path(key), (1000 + i, 1000 + i))  # filled in order, one second apart
    os.close(cache.open(keys[0], 100))  # used again: now the most recent
    for key in keys[9:]:
        os.close(cache.get(key, 100, _fill(b"z" * 100)))
    cache.evict()
    present = [k for k in keys if os.path.exists(cache.path(k))]
    assert cache.usage() <= 900
    assert keys[0] in present and keys[1] not in present and keys[-1] in present


def test_a_partial_file_is_never_served(tmp_path):
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    key = LocalCache.key("t", "obj", 100, 0)
    # a writer killed part way leaves a temporary file beside the entry: not an entry
    os.makedirs(os.path.dirname(cache.path(key)))
    with open(os.path.join(os.path.dirname(cache.path(key)), f".{key}.999.dead"), "wb") as f:
        f.write(b"a" * 100)
    assert cache.open(key, 100) is None and cache.usage() == 0
    # a fill that writes fewer bytes than the object has fails, and leaves nothing behind
    with pytest.raises(OSError, match="40 bytes of an object of 100"):
        cache.get(key, 100, _fill(b"a" * 40))
    assert cache.open(key, 100) is None and not os.path.exists(cache.path(key))
    assert _temporary(cache.dir) == [f".{key}.999.dead"]
    # an entry cut short after the fact (a full disk, a hand edit) is dropped and filled again
    os.close(cache.get(key, 100, _fill(b"b" * 100)))
    with open(cache.path(key), "r+b") as f:
        f.truncate(60)
    assert cache.open(key, 100) is None
    fd = cache.get(key, 100, _fill(b"c" * 100))
    with os.fdopen(fd, "rb") as f:
        assert f.read() == b"c" * 100


_FILLER = textwrap.dedent("""
    import os, sys, time
    from raypipe.sources.transport.cache import LocalCache
    from raypipe.sources.transport.cache_config import CacheConfig
    cache = LocalCache(CacheConfig(dir=sys.argv[1], max_bytes=10**6))
    key = LocalCache.key("t", "shared", 300_000, 0)
    while time.time() < float(sys.argv[3]):  # start together
        time.sleep(0.001)
    def fill(f):
        with open(sys.argv[2], "a") as log:
            log.write(f"{os.getpid()}\\n")
        for _ in range(30):  # a slow download
            f.write(b"s" * 10_000)
            time.sleep(0.01)
    with os.fdopen(cache.get(key, 300_000, fill), "rb") as f:
        assert f.read() == b"s" * 300_000
""")


def test_two_processes_fill_one_entry_once(tmp_path):
    log = tmp_path / "fills.log"
    start = time.time() + 2.0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen([sys.executable, "-c", _FILLER, str(tmp_path / "cache"), str(log), str(start)], env=env)
        for _ in range(2)
    ]
    try:
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(log.read_text().split()) == 1, "both processes downloaded the entry"
    assert _temporary(tmp_path / "cache") == []


def _temporary(folder) -> list[str]:
    """The names of the temporary files of a cache folder (dot files beside the entries)."""
    return sorted(p.name for p in Path(folder).glob("??/.*"))


def test_an_eviction_pass_sweeps_temporary_files_whose_writers_are_gone(tmp_path):
    """Temporary files an hour old go, beside the entries and in the folder ``tmp`` that caches written
    by earlier releases have; younger ones (a fill in progress) and the entries stay."""
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    key = LocalCache.key("t", "obj", 10, 0)
    os.close(cache.get(key, 10, _fill(b"e" * 10)))
    folder = os.path.dirname(cache.path(key))
    os.makedirs(tmp_path / "tmp")
    old = [os.path.join(folder, ".old.1.dead"), str(tmp_path / "tmp" / "old.1.dead")]
    young = os.path.join(folder, ".young.1.busy")
    for path in [*old, young]:
        with open(path, "wb") as f:
            f.write(b"t" * 10)
    for path in old:
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    assert cache.usage() == 10  # temporary files are no entries
    cache.evict()
    assert [os.path.exists(p) for p in old] == [False, False]
    assert os.path.exists(young)
    fd = cache.open(key, 10)
    assert fd is not None
    os.close(fd)


_APPENDER = textwrap.dedent("""
    import sys
    from raypipe.sources.transport.cache import LocalCache
    from raypipe.sources.transport.cache_config import CacheConfig
    cache = LocalCache(CacheConfig(dir=sys.argv[1], max_bytes=10**6))
    for i in range(3):
        cache.add(LocalCache.key("t", f"img{i}", 1000, 0), bytes([i]) * 1000)
""")


def test_what_one_process_appended_another_finds(tmp_path):
    """Images a process added lie in a segment of its own; a process that knew nothing of them finds
    them on a miss (it reads the index logs' new records) and reads the same bytes."""
    reader = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    keys = [LocalCache.key("t", f"img{i}", 1000, 0) for i in range(3)]
    assert reader.read(keys[0], 1000) is None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _APPENDER, str(tmp_path)], env=env, check=True, timeout=60)
    reader._refreshed = float("-inf")  # a second has passed since its last look
    assert [reader.read(k, 1000) for k in keys] == [bytes([i]) * 1000 for i in range(3)]
    assert reader.read(keys[0], 999) is None  # another size is another object
    assert len(list((tmp_path / "segments").glob("*.seg"))) == 1 and not list(tmp_path.glob("??"))


def _segment_of(cache: LocalCache, key: str) -> Path:
    return Path(cache.dir) / "segments" / (cache._index[bytes.fromhex(key)][0] + ".seg")


def test_a_torn_record_or_a_cut_segment_is_never_served(tmp_path):
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    keys = [LocalCache.key("t", f"k{i}", 100, 0) for i in range(3)]
    for i, key in enumerate(keys):
        cache.add(key, bytes([i]) * 100)
    seg = _segment_of(cache, keys[0])
    log = seg.with_suffix(".idx")
    with open(log, "ab") as f:  # a writer killed in the middle of a record
        f.write(b"\x07" * 20)
    fresh = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    assert [fresh.read(k, 100) for k in keys] == [bytes([i]) * 100 for i in range(3)]
    # a record whose bytes do not match its checksum is not read, nor are the records after it
    records = bytearray(log.read_bytes())
    records[56 + 40] ^= 0xFF  # the second record's size
    log.write_bytes(bytes(records))
    fresh = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    assert [fresh.read(k, 100) for k in keys] == [b"\x00" * 100, None, None]
    # a segment cut short: what lies beyond its end is not served, by the writer nor by anybody else
    os.truncate(seg, 150)
    assert cache.read(keys[0], 100) == b"\x00" * 100
    assert cache.read(keys[1], 100) is None and cache.read(keys[2], 100) is None


def test_segments_are_evicted_whole_least_recently_used_first(tmp_path):
    """A bound of 1600 bytes: segments of at most 100 bytes (two 50-byte images, and their log of two
    56-byte records: 212 bytes each); the oldest segment goes first, one read lately stays."""
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=1600))
    keys = [LocalCache.key("t", f"k{i}", 50, 0) for i in range(16)]
    for i, key in enumerate(keys[:12]):
        cache.add(key, bytes([i]) * 50)
    segments = [_segment_of(cache, k) for k in keys[:12:2]]
    assert len(set(segments)) == 6 and cache.usage() == 6 * 212
    for i, seg in enumerate(segments):
        os.utime(seg, (1000 + i, 1000 + i))  # filled in order, one second apart
    assert cache.read(keys[0], 50) == bytes([0]) * 50  # used again: now the most recent
    for i, key in enumerate(keys[12:], 12):
        cache.add(key, bytes([i]) * 50)  # over 90 % of the bound: a pass evicts the oldest
    cache.evict()  # passes run every 100 bytes added: between them the bound holds to within that
    assert cache.usage() <= 1440
    other = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=1600))
    for reader in (cache, other):
        got = [reader.read(k, 50) for k in keys]
        assert got[2:6] == [None] * 4, "the two oldest segments stay"
        assert got[:2] + got[6:] == [bytes([i]) * 50 for i in (0, 1, *range(6, 16))]
    assert not segments[1].exists() and not segments[1].with_suffix(".idx").exists()


def test_a_failed_append_leaves_nothing_behind(tmp_path, monkeypatch):
    """A disk that fills up in the middle of an append: the add fails, the segment is cut back to its
    last whole object, no record names the lost one, and the next add (room again) is kept."""
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    keys = [LocalCache.key("t", f"k{i}", 1000, 0) for i in range(3)]
    cache.add(keys[0], b"a" * 1000)
    seg = _segment_of(cache, keys[0])
    real = os.pwrite
    calls = []

    def fills_up(fd, data, offset):
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, memoryview(data)[:300], offset)  # a short write, then no more room
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", fills_up)
    with pytest.raises(OSError, match="No space left"):
        cache.add(keys[1], b"b" * 1000)
    monkeypatch.setattr(os, "pwrite", real)
    assert calls == [1000, 700] and seg.stat().st_size == 1000
    cache.add(keys[2], b"c" * 1000)
    fresh = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    assert [fresh.read(k, 1000) for k in keys] == [b"a" * 1000, None, b"c" * 1000]


def test_a_writer_whose_segment_was_evicted_starts_another(tmp_path):
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    keys = [LocalCache.key("t", f"k{i}", 10, 0) for i in range(2)]
    cache.add(keys[0], b"0" * 10)
    first = _segment_of(cache, keys[0])
    first.with_suffix(".idx").unlink()  # as another process's eviction pass removes it
    first.unlink()
    cache.add(keys[1], b"1" * 10)
    assert _segment_of(cache, keys[1]) != first
    fresh = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    assert fresh.read(keys[0], 10) is None and fresh.read(keys[1], 10) == b"1" * 10


def test_a_cache_removed_under_a_running_process_fills_again(tmp_path):
    """A user clears the cache folder while a process uses it: its next images and files are kept in the
    folder made again, where other processes find them, not appended to files no one can see."""
    folder = tmp_path / "cache"
    cache = LocalCache(CacheConfig(dir=str(folder), max_bytes=10**6))
    keys = [LocalCache.key("t", f"k{i}", 10, 0) for i in range(4)]
    cache.add(keys[0], b"0" * 10)
    os.close(cache.get(keys[1], 10, _fill(b"1" * 10)))
    shutil.rmtree(folder)
    cache.add(keys[2], b"2" * 10)
    os.close(cache.get(keys[3], 10, _fill(b"3" * 10)))
    other = LocalCache(CacheConfig(dir=str(folder), max_bytes=10**6))
    assert [other.read(key, 10) for key in keys] == [None, None, b"2" * 10, b"3" * 10]


def test_a_process_keeps_few_segments_open(tmp_path, monkeypatch):
    """A large cache has thousands of segments: a reader keeps the last few it read open, not one
    descriptor each (which would run the process out of descriptors)."""
    monkeypatch.setattr("raypipe.sources.transport.cache._OPEN_SEGMENTS", 2)
    writer = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=1600))  # a segment per 100 bytes
    keys = [LocalCache.key("t", f"k{i}", 100, 0) for i in range(5)]
    for i, key in enumerate(keys):
        writer.add(key, bytes([i]) * 100)
    reader = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=1600))
    for _ in range(2):
        assert [reader.read(k, 100) for k in keys] == [bytes([i]) * 100 for i in range(5)]
        assert len(reader._readers) == 2


def test_a_forked_child_appends_to_a_segment_of_its_own(tmp_path):
    """A DataLoader's forked worker inherits its parent's cache: it must not append to the parent's
    segment (each writer keeps its own end)."""
    config = CacheConfig(dir=str(tmp_path), max_bytes=10**6)
    keys = [LocalCache.key("t", f"k{i}", 100, 0) for i in range(3)]
    parent = local_cache(config)
    parent.add(keys[0], b"p" * 100)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        child = local_cache(config)
        child.add(keys[1], b"c" * 100)
        os._exit(0 if child is not parent and child._writer.name != parent._writer.name else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent.add(keys[2], b"q" * 100)
    fresh = LocalCache(config)
    assert [fresh.read(k, 100) for k in keys] == [b"p" * 100, b"c" * 100, b"q" * 100]
    assert len(list((tmp_path / "segments").glob("*.seg"))) == 2


@pytest.fixture
def served(sample_dir, tmp_path):
    root = tmp_path / "buckets"
    shutil.copytree(sample_dir, root / "bkt" / "folder")
    with S3Server(root, latency_ms=5) as server:
        yield server, root / "bkt"


def _options(folder) -> ReadOptions:
    return ReadOptions(in_flight=8, cache=CacheConfig(dir=str(folder), max_bytes=10**8))


def _write_shard(path, images, prefix: str) -> None:
    """A WebDataset tar shard of ``images`` (files), each a ``.jpg`` member and a ``.cls`` label of 1."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i, p in enumerate(images):
            for name, data in ((f"{prefix}{i:02d}.jpg", p.read_bytes()), (f"{prefix}{i:02d}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _entries(folder) -> list[bytes]:
    """The bytes of every entry of a cache folder (segments and files), sorted, as a process that did
    not write them finds them."""
    cache = LocalCache(CacheConfig(dir=str(folder), max_bytes=10**8))
    return sorted(cache.read(key, size) for key, size in cache.sizes().items())


def test_second_read_hits_the_cache(served, tmp_path):
    """A folder read twice: the second time makes no request at all (the listing's size and time key
    the entries), and returns the same bytes as the local folder."""
    server, bucket = served
    rows = open_source("s3://bkt/folder", filesystem=server.filesystem())
    paths = rows.table.column("path").to_pylist()
    assert rows.table.column("object_size").to_pylist() == [(bucket / "folder" / p).stat().st_size for p in paths]
    assert min(rows.table.column("object_mtime_ns").to_pylist()) > 0
    options = _options(tmp_path / "cache")
    first = BlockReader(rows.root, rows.kind, options=options)
    server.reset_counts()
    got = first.read_block(_batch(rows))
    assert server.count("GetObject") == len(rows)
    first.close()
    again = BlockReader(rows.root, rows.kind, options=options)  # a later epoch, or another worker
    server.reset_counts()
    assert again.read_block(_batch(rows)) == got
    assert server.count() == 0, dict(server.requests)  # no HeadObject, no GetObject
    assert not again._requests.started  # hits are local reads, made in the caller's thread: no request threads
    local = open_source(str(bucket / "folder"))
    assert got == BlockReader(local.root, local.kind).read_block(_batch(local))
    # the cache is no way out of the root
    batch = {k: v[:1] for k, v in _batch(rows).items()}
    batch["path"] = batch["path"].copy()
    batch["path"][0] = "../../etc/passwd"
    (skip,) = again.read_block(batch)
    assert skip.reason == OUTSIDE_ROOT
    again.close()


def test_a_cache_that_keeps_nothing_more_loses_no_image(served, tmp_path, monkeypatch, caplog):
    """A full (or read-only) cache disk: every image is still read, from the store, and the reader says
    once why the cache stopped filling."""
    server, bucket = served
    rows = open_source("s3://bkt/folder", filesystem=server.filesystem())

    def full(self, key, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LocalCache, "add", full)
    reader = BlockReader(rows.root, rows.kind, options=_options(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="raypipe.sources.reader"):
        got = reader.read_block(_batch(rows))
    reader.close()
    local = open_source(str(bucket / "folder"))
    assert got == BlockReader(local.root, local.kind).read_block(_batch(local))
    said = [r.getMessage() for r in caplog.records if "keeps no more objects" in r.getMessage()]
    assert len(said) == 1 and "No space left" in said[0], said


def test_an_object_changed_after_the_listing_is_read_as_it_is_now(served, tmp_path):
    """Objects replaced by others of another size, or deleted, after the listing: a new listing keys them
    anew (the old entries are not served); read with the old listing, they are fetched, found to differ
    from the listed size and read as the store has them now (never a cut or padded file), and nothing
    is kept under the listed key."""
    server, bucket = served
    fs = server.filesystem()
    rows = open_source("s3://bkt/folder", filesystem=fs)
    three = {k: v[:3] for k, v in _batch(rows).items()}
    paths = [str(p) for p in three["path"]]
    files = [bucket / "folder" / p for p in paths]
    reader = BlockReader(rows.root, rows.kind, options=_options(tmp_path / "cache"))
    assert reader.read_block(three) == [f.read_bytes() for f in files]  # cached under the listed keys
    new = [b"shorter", files[1].read_bytes() + b"and a tail"]
    files[0].write_bytes(new[0])
    files[1].write_bytes(new[1])
    files[2].unlink()

    relisted = open_source("s3://bkt/folder", filesystem=fs)
    assert relisted.table.column("path").to_pylist()[:2] == paths[:2]
    again = BlockReader(relisted.root, relisted.kind, options=_options(tmp_path / "cache"))
    assert again.read_block({k: v[:2] for k, v in _batch(relisted).items()}) == new
    again.close()

    # The old listing, nothing cached yet: each object is fetched whole and found to have changed.
    stale = BlockReader(rows.root, rows.kind, options=_options(tmp_path / "fresh"))
    server.reset_counts()
    out = stale.read_block(three)
    assert out[:2] == new
    assert out[2].reason == MISSING  # deleted: a counted skip, as without the cache
    assert _entries(tmp_path / "fresh") == sorted(new)  # what the store holds now, under what it says now
    cache = LocalCache(CacheConfig(dir=str(tmp_path / "fresh"), max_bytes=10**8))
    for i in range(2):
        size, mtime = int(three["object_size"][i]), int(three["object_mtime_ns"][i])
        listed = LocalCache.key(store_name(fs), rows.root.resolve(paths[i]), size, mtime)
        assert listed not in cache.sizes() and cache.read(listed, size) is None
    # read again: this reader knows they changed, so it asks the store (HEAD) and hits; no transfer
    server.reset_counts()
    assert stale.read_block({k: v[:2] for k, v in three.items()}) == new
    assert server.count("GetObject") == 0 and server.count("HeadObject") == 2, dict(server.requests)
    stale.close()
    reader.close()


def test_a_manifest_reads_through_the_cache(served, tmp_path):
    """A manifest's paths are not listed: each read asks the store for the size and time (HEAD), and
    later reads transfer nothing."""
    server, bucket = served
    images = sorted(str(p.relative_to(bucket / "folder")) for p in (bucket / "folder").rglob("*.jpg"))[:6]
    lines = "".join(f"{p},{i % 2}\n" for i, p in enumerate(images))
    (bucket / "folder" / "list.csv").write_text("path,label\n" + lines)
    rows = open_source("s3://bkt/folder/list.csv", filesystem=server.filesystem())
    assert rows.kind == "manifest" and set(column_or_default(rows.table, "object_size").to_pylist()) == {-1}
    want = [(bucket / "folder" / p).read_bytes() for p in images]
    options = _options(tmp_path / "cache")
    first = BlockReader(rows.root, rows.kind, options=options)
    server.reset_counts()
    assert first.read_block(_batch(rows)) == want
    assert server.count("GetObject") == len(rows)
    first.close()
    again = BlockReader(rows.root, rows.kind, options=options)
    server.reset_counts()
    assert again.read_block(_batch(rows)) == want
    assert server.count("GetObject") == 0 and server.count("HeadObject") == len(rows)
    again.close()


def test_shards_and_parquet_are_cached_whole(served, tmp_path):

    import pyarrow as pa
    import pyarrow.parquet as pq

    server, bucket = served
    files = sorted((bucket / "folder").rglob("*.jpg"))
    (bucket / "pq").mkdir()
    pq.write_table(
        pa.table({"image": [p.read_bytes() for p in files], "label": [i % 4 for i in range(len(files))]}),
        bucket / "pq" / "part.parquet",
        row_group_size=10,
    )
    (bucket / "wds").mkdir()
    for s in range(3):
        _write_shard(bucket / "wds" / f"shard-{s}.tar", files[s * 16 : (s + 1) * 16], f"k{s}")
    options = ReadOptions(in_flight=8, cache=CacheConfig(dir=str(tmp_path / "cache"), max_bytes=10**8))
    for where, objects in (("wds", 3), ("pq", 1)):
        rows = open_source(f"s3://bkt/{where}", filesystem=server.filesystem())
        local = open_source(str(bucket / where))
        want = BlockReader(local.root, local.kind, local.image_column).read_block(_batch(local))
        server.reset_counts()
        first = BlockReader(rows.root, rows.kind, rows.image_column, options=options)
        assert first.read_block(_batch(rows)) == want
        assert server.count("GetObject") == objects, where  # each shard or file fetched whole, once
        first.close()
        server.reset_counts()
        again = BlockReader(rows.root, rows.kind, rows.image_column, options=options)
        assert again.read_block(_batch(rows)) == want
        assert server.count() == 0, (where, dict(server.requests))  # the listing's size and time key them
        again.close()


def test_a_stage_made_before_the_cache_was_configured_is_made_again(served, tmp_path, monkeypatch):
    """A process's cached stage (its reader) follows the settings its spec carries: a spec made after
    RAYPIPE_CACHE_DIR is set (a later pipeline's, its chunks run in the consumer, as a stream's first
    are) reads through the cache, not through a reader made for a spec from before it was set."""
    from raypipe.config import DecodeConfig, EvalAugment
    from raypipe.stages.augment import StageSpec, augment_block, stage_for

    server, _ = served
    rows = open_source("s3://bkt/folder", filesystem=server.filesystem())

    def spec() -> StageSpec:
        return StageSpec(
            kind=rows.kind, root=rows.root, augment=EvalAugment(input_size=16), decode=DecodeConfig(), seed=0, epoch=0
        )

    monkeypatch.setenv("RAYPIPE_CACHE_DIR", "off")
    before = stage_for(spec())
    assert before.reader.options.cache is None and stage_for(spec()) is before  # reused while nothing changed
    monkeypatch.setenv("RAYPIPE_CACHE_DIR", str(tmp_path / "cache"))
    out = augment_block(_batch(rows), spec())
    assert out["ok"].all()
    after = stage_for(spec())
    assert after is not before and after.reader.options.cache == CacheConfig.from_env()
    assert len(_entries(tmp_path / "cache")) == len(rows)


def test_by_default_a_remote_folder_is_cached_and_shards_are_not(served, tmp_path, monkeypatch):
    """With nothing configured, a remote folder's second read makes no request (its images were kept in
    the user's cache folder); a remote tar shard is read in ranges again, never fetched whole; a
    manifest's objects, which no listing describes, are not cached either."""

    server, bucket = served
    monkeypatch.delenv("RAYPIPE_CACHE_DIR", raising=False)
    monkeypatch.delenv("RAYPIPE_CACHE_MAX_BYTES", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = open_source("s3://bkt/folder", filesystem=server.filesystem())
    requests = []
    for _ in range(2):  # a run, then a later epoch (or run) on other readers
        reader = BlockReader(folder.root, folder.kind, options=ReadOptions(in_flight=8))
        server.reset_counts()
        got = reader.read_block(_batch(folder))
        reader.close()
        requests.append(server.count())
    assert requests == [len(folder), 0], dict(server.requests)  # one GET per image, then none
    assert sorted(bytes(b) for b in got) == _entries(tmp_path / "xdg" / "raypipe")
    local = open_source(str(bucket / "folder"))
    assert got == BlockReader(local.root, local.kind).read_block(_batch(local))

    files = sorted((bucket / "folder").rglob("*.jpg"))[:8]
    (bucket / "wds").mkdir()
    _write_shard(bucket / "wds" / "shard-0.tar", files, "k")
    (bucket / "list.csv").write_text(
        "path,label\n" + "".join(f"folder/{p.relative_to(bucket / 'folder')},0\n" for p in files)
    )
    before = len(_entries(tmp_path / "xdg" / "raypipe"))
    for where in ("s3://bkt/wds", "s3://bkt/list.csv"):
        rows = open_source(where, filesystem=server.filesystem())
        for _ in range(2):
            reader = BlockReader(rows.root, rows.kind, rows.image_column, options=ReadOptions(in_flight=8))
            server.reset_counts()
            assert all(isinstance(r, bytes | memoryview) for r in reader.read_block(_batch(rows))), where
            reader.close()
            assert server.count("GetObject") >= 1, where  # read from the store every time
    assert len(_entries(tmp_path / "xdg" / "raypipe")) == before  # nothing of theirs was kept


def test_the_bound_leaves_the_disk_half_its_free_space(tmp_path, monkeypatch):
    """An eviction pass keeps the cache within half of what it and the disk's free space add up to:
    another writer that fills the disk makes the cache give up room; its own fills do not."""
    cache = LocalCache(CacheConfig(dir=str(tmp_path), max_bytes=10**6))
    disk = {"size": 10**9, "other": 0}  # a disk holding the cache and another writer's files

    class Stat:
        f_frsize = 1

        @property
        def f_bavail(self):
            return disk["size"] - disk["other"] - cache.usage()

    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: Stat() if str(path).startswith(str(tmp_path)) else real(path))
    keys = [LocalCache.key("t", f"k{i}", 100, 0) for i in range(9)]
    for i, key in enumerate(keys[:8]):  # file entries: evicted one by one
        os.close(cache.get(key, 100, _fill(bytes([i]) * 100)))
    cache.evict()
    assert cache.bound(cache.usage()) == 10**6 and len(cache.sizes()) == 8  # max_bytes binds
    disk["other"] = disk["size"] - 1600  # the disk filled by something else: 800 + 800 free, half of it
    cache.evict()
    assert cache.bound(cache.usage()) == 800 and set(cache.sizes()) == set(keys[1:8])  # 700 <= 0.9 x 800
    os.close(cache.get(keys[8], 100, _fill(b"\0" * 100)))  # its own fill: the bound stays, the oldest goes
    assert cache.bound(cache.usage()) == 800 and set(cache.sizes()) == set(keys[2:])
