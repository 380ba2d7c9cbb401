"""Indexed shards as users move them: copied or uploaded with their index (every object a new time, the
same bytes) they are listed from the index, by row and by shard, over S3; a shard whose bytes changed
under the same size and time is never read at the offsets its index gave (its reads check the member's
tar header and fail loudly); ``convert`` into a store leaves an index that the next listing uses."""

import io
import os
import shutil
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from image_factory import sample
from test_shard_index import _no_scan, _same, _shards

from raypipe.cli.main import main as cli_main
from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sources import ShardListing, SourceRows, open_source
from raypipe.sources.formats.tar_members import ShardChangedError
from raypipe.sources.formats.webdataset import list_webdataset
from raypipe.sources.indexes.indexer import index_shards
from raypipe.sources.indexes.shard_index import INDEX_NAME
from raypipe.sources.reader import BlockReader
from raypipe.testing import S3Server

pytestmark = pytest.mark.timeout(240)

_ROW_COLUMNS = ("sample_id", "label", "path", "error", "shard", "offset", "size", "member")


def _upload(src, dst, *, later_s: int = 3600) -> None:
    """Every file of ``src`` into ``dst`` as an upload, ``cp`` or ``rsync`` without ``-t`` puts it: the
    same bytes under a new modification time."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        shutil.copyfile(p, dst / p.name)
        st = os.stat(p)
        os.utime(dst / p.name, ns=(st.st_atime_ns, st.st_mtime_ns + later_s * 10**9))


def _without_header_digests(index) -> None:
    """The index as the current release writes it: the same rows and footer, no ``header_crc`` column."""
    table = pq.read_table(index)
    if "header_crc" in table.column_names:
        table = table.drop(["header_crc"])
    pq.write_table(table, index)


def _bytes_of(local, rows) -> list:
    """What each row's member holds in the original shards under ``local`` (None for a row known bad)."""
    out = []
    for path, offset, size, error in zip(rows["path"], rows["offset"], rows["size"], rows["error"], strict=True):
        out.append(None if error else (local / path).read_bytes()[offset : offset + size])
    return out


def _read(rows_listing, rows) -> list:
    got = BlockReader(rows_listing.root, "webdataset").read_block(rows)
    return [None if e else bytes(g) for g, e in zip(got, rows["error"], strict=True)]


@pytest.mark.parametrize("digests", [True, False], ids=["index", "index-without-header-digests"])
def test_shards_uploaded_with_their_index_are_listed_from_it_by_row_and_by_shard(tmp_path, monkeypatch, digests):
    local = _shards(tmp_path / "local" / "wds", n=4, per=20, image_bytes=60_000)
    index_shards(str(local), use_ray=False)
    index_shards(str(local), str(tmp_path / "local" / "named" / "i.parquet"), use_ray=False)  # kept elsewhere
    for index in (local / INDEX_NAME, tmp_path / "local" / "named" / "i.parquet"):
        if not digests:
            _without_header_digests(index)
    buckets = tmp_path / "buckets"
    _upload(local, buckets / "data" / "wds")
    _upload(tmp_path / "local" / "named", buckets / "data" / "named")
    total = sum(p.stat().st_size for p in local.glob("*.tar"))
    with S3Server(buckets, latency_ms=2) as server:
        fs = server.filesystem()
        scanned = list_webdataset("s3://data/wds", filesystem=fs, index=False)  # from the tar headers
        server.reset_counts()
        with monkeypatch.context() as m:
            _no_scan(m)
            by_row = open_source("s3://data/wds", filesystem=fs)
            by_shard = open_source("s3://data/wds", filesystem=fs, by_shard=True)
            assert server.bytes_sent <= 0.01 * total, (server.bytes_sent, total)
            # an index named elsewhere, written under a local folder and uploaded with the shards
            server.reset_counts()
            named = dict(filesystem=fs, index="s3://data/named/i.parquet")
            assert open_source("s3://data/wds", **named).table.equals(by_row.table)
            assert open_source("s3://data/wds", by_shard=True, **named).digest() == by_shard.digest()
            assert server.bytes_sent <= 0.01 * total, (server.bytes_sent, total)
        assert isinstance(by_row, SourceRows) and isinstance(by_shard, ShardListing)
        if digests:
            _same(by_row, scanned)
        else:  # the same rows; the headers' digests are what such an index lacks
            assert by_row.table.drop(["header_crc"]).equals(scanned.table.drop(["header_crc"]))
            assert by_row.digest() == scanned.digest()
        every = np.arange(len(scanned))
        want, from_shard = scanned.columns().take(every), by_shard.columns().take(every)
        for name in _ROW_COLUMNS:
            assert list(from_shard[name]) == list(want[name]), name
        # each read checks its member's header, and a copy's bytes are the indexed ones: the members come
        expected = _bytes_of(local, want)
        assert _read(by_row, by_row.columns().take(every)) == expected
        assert _read(by_shard, from_shard) == expected


def _members(s: int, per: int, *, order=None) -> list[tuple[str, bytes]]:
    """Shard ``s``'s members: ``per`` samples, images of one size (so any order makes a tar of one size)."""
    keys = [f"s{s}/k{i:03d}" for i in range(per)]
    out = []
    for i in order if order is not None else range(per):
        out += sample(keys[i], i % 3, image=bytes([40 + i]) * 3000)
    return out


def _write(path, members, *, mtime: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))


def _rewrite_keeping_size_and_time(path, members, **kwargs) -> None:
    """``path`` written again with ``members``: the same size and modification time as before."""
    st = os.stat(path)
    _write(path, members, **kwargs)
    assert os.path.getsize(path) == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _epoch(rows) -> list[int]:
    pipe = Pipeline(
        rows,
        TrainAugment(input_size=(16, 16)),
        config=PipelineConfig(batch_size=4, max_skip_ratio=1.0),
        execution=ExecutionConfig(backend="local", chunk_rows=8, num_tasks=1),
    )
    source = EpochSource(pipe, end_epoch=1)
    try:
        return [i for batch in source for i in batch["sample_id"].tolist()]
    finally:
        source.close()


@pytest.mark.parametrize("digests", [True, False], ids=["index", "index-without-header-digests"])
def test_a_shard_changed_under_the_same_size_and_time_is_never_read_at_the_indexed_offsets(tmp_path, capsys, digests):
    d = tmp_path / "wds"
    for s in range(3):
        _write(d / f"shard-{s}.tar", _members(s, 6))
    index_shards(str(d), use_ray=False)
    if not digests:
        _without_header_digests(d / INDEX_NAME)
    _rewrite_keeping_size_and_time(d / "shard-1.tar", _members(1, 6, order=[5, 4, 3, 2, 1, 0]))
    rows = open_source(str(d))
    assert isinstance(rows, SourceRows)  # taken from the index: its size and time are the indexed ones
    at_1 = np.flatnonzero(rows.table.column("shard").to_numpy() == 1)
    with pytest.raises(ShardChangedError, match=r"shard-1\.tar.*raypipe index"):
        BlockReader(rows.root, "webdataset").read_block(rows.columns().take(at_1))
    assert len(_read(rows, rows.columns().take(np.arange(6)))) == 6  # the unchanged shards read as indexed
    with pytest.raises(ShardChangedError, match=r"shard-1\.tar"):  # through the pipeline: the epoch fails
        _epoch(rows)
    with pytest.raises(ShardChangedError, match=r"shard-1\.tar"):
        _epoch(open_source(str(d), by_shard=True))
    capsys.readouterr()
    assert cli_main(["run", str(d), "--backend", "local", "--img-size", "16", "--max-skip-ratio", "1"]) == 1
    err = capsys.readouterr().err  # the run failed (exit 1), with what to run, whole
    assert "ShardChangedError" in err and "shard-1.tar" in err and f"raypipe index {d}" in err, err
    with S3Server(tmp_path, latency_ms=0) as server:  # a store's ranged reads check the headers too
        remote = open_source("s3://wds", filesystem=server.filesystem())
        with pytest.raises(ShardChangedError, match=r"s3://wds/shard-1\.tar"):
            BlockReader(remote.root, "webdataset").read_block(remote.columns().take(at_1), wait=True)
    if digests:
        # the same members at the same offsets under other headers (a later write's member times): the
        # header digests see it where names and sizes agree
        _rewrite_keeping_size_and_time(d / "shard-1.tar", _members(1, 6), mtime=1_700_000_000)
        with pytest.raises(ShardChangedError, match="digest"):
            BlockReader(rows.root, "webdataset").read_block(rows.columns().take(at_1))


def test_convert_into_a_store_leaves_an_index_the_next_listing_uses(ray_local, sample_dir, tmp_path, monkeypatch):
    from raypipe.sources.writing.convert import convert

    buckets = tmp_path / "buckets"
    (buckets / "data").mkdir(parents=True)
    with S3Server(buckets, latency_ms=2) as server:
        fs = server.filesystem()
        report = convert(
            str(sample_dir), "s3://data/direct", format="webdataset", samples_per_shard=16, dst_filesystem=fs
        )
        assert (buckets / "data" / "direct" / INDEX_NAME).is_file()
        convert(str(sample_dir), str(tmp_path / "local"), format="webdataset", samples_per_shard=16)
        _upload(tmp_path / "local", buckets / "data" / "uploaded")
        total = sum(p.stat().st_size for p in (buckets / "data" / "direct").glob("*.tar"))
        for prefix in ("direct", "uploaded"):
            scanned = list_webdataset(f"s3://data/{prefix}", filesystem=fs, index=False)
            server.reset_counts()
            with monkeypatch.context() as m:
                _no_scan(m)
                rows = open_source(f"s3://data/{prefix}", filesystem=fs)
            assert server.bytes_sent <= 0.01 * total, (prefix, server.bytes_sent, total)
            _same(rows, scanned)
            assert len(rows) == report.samples == 48
