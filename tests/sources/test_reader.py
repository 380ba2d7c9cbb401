"""BlockReader: a block's bytes at once, each Parquet row group once, remote reads in flight, retries."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wrapped_fs import wrapped

from raypipe.kernels.errors import MISSING, NULL_IMAGE, OUTSIDE_ROOT, UNREADABLE, SkipImage
from raypipe.sources import BlockReader, ReadOptions, open_source
from raypipe.sources.transport.remote import is_transient, with_retries

pytestmark = pytest.mark.timeout(120)

FAST = ReadOptions(backoff_s=0.001, max_backoff_s=0.002)


def _batch(table: pa.Table) -> dict[str, np.ndarray]:
    return {k: table.column(k).to_numpy(zero_copy_only=False) for k in table.column_names}


def _folder(tmp_path, n=12):
    for i in range(n):
        p = tmp_path / "data" / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"image-%d" % i)
    return tmp_path / "data"


def _expected(rows) -> list[bytes]:
    return [b"image-%d" % int(p.split("/")[1][:3]) for p in rows.table.column("path").to_pylist()]


def test_local_folder_block_with_skips(tmp_path):
    data = _folder(tmp_path)
    (tmp_path / "outside.jpg").write_bytes(b"secret")
    os.symlink(tmp_path / "outside.jpg", data / "c0" / "zz-link.jpg")
    rows = open_source(str(data))
    batch = _batch(rows.table)
    batch["path"] = np.append(batch["path"], ["c1/gone.jpg"]).astype(object)
    batch["error"] = np.append(batch["error"], [None]).astype(object)
    batch["error"][1] = "bad_label: label 'x'"
    out = BlockReader(rows.root, "folder").read_block(batch)
    assert len(out) == len(rows) + 1
    good = [i for i, p in enumerate(batch["path"][:-1]) if "link" not in p and i != 1]
    assert [out[i] for i in good] == [b"image-%d" % int(batch["path"][i].split("/")[1][:3]) for i in good]
    link = list(batch["path"]).index("c0/zz-link.jpg")
    assert out[link].reason == OUTSIDE_ROOT
    assert out[1].reason == "bad_label" and out[-1].reason == MISSING


def test_parquet_row_groups_are_read_once_per_block(tmp_path, row_group_reads):
    n = 40
    cells = [b"cell%d" % i for i in range(n)]
    cells[13] = None
    pq.write_table(
        pa.table({"image": cells, "label": [i % 4 for i in range(n)]}), tmp_path / "a.parquet", row_group_size=10
    )
    rows = open_source(str(tmp_path / "a.parquet"))
    assert rows.table.column("shard").to_pylist() == [i // 10 for i in range(n)] and rows.num_shards == 4
    reads = row_group_reads
    order = np.random.default_rng(0).permutation(n)[:25]  # rows of every group, in random order
    out = BlockReader(rows.root, "parquet", "image").read_block(_batch(rows.table.take(pa.array(order))))
    assert sorted(reads) == sorted(set(int(i) // 10 for i in order))  # each group touched: once
    for i, got in zip(order, out, strict=True):
        if i == 13:
            assert isinstance(got, SkipImage) and got.reason == NULL_IMAGE
        else:
            assert got == b"cell%d" % i


def test_parquet_missing_and_corrupt_files_are_skips(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    for name in ("a", "b"):
        pq.write_table(pa.table({"image": [b"x", b"y"], "label": [0, 1]}), d / f"{name}.parquet")
    rows = open_source(str(d))
    (d / "a.parquet").unlink()
    (d / "b.parquet").write_bytes(b"PAR1 not really")
    out = BlockReader(rows.root, "parquet", "image").read_block(_batch(rows.table))
    assert [o.reason for o in out] == [MISSING, MISSING, UNREADABLE, UNREADABLE]


def test_remote_reads_overlap(tmp_path):
    """32 reads of 50 ms each are in flight together: the block takes far less than 32 × 50 ms."""
    data = _folder(tmp_path, n=32)
    fs, handler = wrapped(delay_s=0.05)
    rows = open_source(str(data), filesystem=fs)
    assert not rows.root.is_local
    reader = BlockReader(rows.root, "folder", options=ReadOptions(in_flight=16))
    out = reader.read_block(_batch(rows.table))
    reader.close()
    assert out == _expected(rows)
    assert handler.max_active >= 8  # requests overlapped (bounded by in_flight)
    assert handler.max_active <= 16


def test_a_default_reader_sends_a_batch_sized_blocks_requests_together(tmp_path):
    """A block of 128 rows (the chunk of a batch of 128) from a store with 50 ms of latency: every request
    in flight at once, so the block waits for the store's first byte about once, not in waves. (The
    store holds each answer until 128 are asked for, or 10 s: on a loaded machine 128 threads can take
    longer than the latency to start.)"""
    data = _folder(tmp_path, n=128)
    fs, handler = wrapped(delay_s=0.05, gather=128)
    rows = open_source(str(data), filesystem=fs)
    reader = BlockReader(rows.root, "folder")
    out = reader.read_block(_batch(rows.table))
    reader.close()
    assert out == _expected(rows)
    assert handler.max_active == 128


def test_remote_shard_and_parquet_rows_without_waiting_are_futures_fetched_in_row_order(tmp_path):
    """read_block(wait=False) on remote tar shards and Parquet row groups: every row a Future of the
    bytes read_block() gives, and the requests sent for the block's earliest rows first (one request
    thread, so they run in the order sent), so decoding starts when the first ones are in."""
    from concurrent.futures import Future

    from image_factory import tar_bytes

    (tmp_path / "wds").mkdir()
    for s in range(3):
        members = [m for i in range(4) for m in ((f"k{s}{i}.jpg", b"image-%d-%d" % (s, i)), (f"k{s}{i}.cls", b"1"))]
        (tmp_path / "wds" / f"shard-{s}.tar").write_bytes(tar_bytes(members))
    table = pa.table({"image": [b"cell-%d" % i for i in range(12)], "label": list(range(12))})
    pq.write_table(table, tmp_path / "part.parquet", row_group_size=4)
    for path in (tmp_path / "wds", tmp_path / "part.parquet"):
        fs, handler = wrapped()
        rows = open_source(str(path), filesystem=fs)
        assert not rows.root.is_local
        batch = {k: v[::-1].copy() for k, v in _batch(rows.table).items()}  # the last shard's rows first
        want = BlockReader(rows.root, rows.kind, rows.image_column).read_block(batch)
        reader = BlockReader(rows.root, rows.kind, rows.image_column, options=ReadOptions(in_flight=1))
        handler.opened.clear()
        pending = reader.read_block(batch, wait=False)
        assert all(isinstance(x, Future) for x in pending)
        assert [x.result() for x in pending] == want
        assert all(isinstance(x, bytes) for x in want) and len(set(want)) == 12
        if rows.kind == "webdataset":  # one ranged read per shard, the last shard's first
            assert [os.path.basename(p) for p in handler.opened] == ["shard-2.tar", "shard-1.tar", "shard-0.tar"]
        reader.close()


def test_remote_tar_members_come_in_ranges_of_at_most_a_megabyte_sent_in_row_order(tmp_path):
    """A shard's members read from S3 in one block: merged into ranged GETs of at most ``_MAX_RANGE``
    (a larger member in one of its own), each from its first member's header (which the read checks),
    each member's bytes exact, and with one request thread the GETs sent in the order of the first row
    that needs each one (the block's rows shuffled)."""
    from image_factory import tar_bytes

    from raypipe.sources import reader as reader_module
    from raypipe.testing import S3Server

    rng = np.random.default_rng(0)
    sizes = [300_000] * 6 + [1_500_000] + [300_000] * 3  # 4.5 MB; one member over the cap
    images = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    members = [m for i, data in enumerate(images) for m in ((f"k{i:02d}.jpg", data), (f"k{i:02d}.cls", b"0"))]
    (tmp_path / "buckets" / "bkt" / "wds").mkdir(parents=True)
    (tmp_path / "buckets" / "bkt" / "wds" / "shard-0.tar").write_bytes(tar_bytes(members))
    with S3Server(tmp_path / "buckets") as server:
        rows = open_source("s3://bkt/wds", filesystem=server.filesystem())
        batch = _batch(rows.table)
        order = rng.permutation(len(images))
        batch = {k: v[order] for k, v in batch.items()}
        server.reset_counts()
        reader = BlockReader(rows.root, rows.kind, options=ReadOptions(in_flight=1))
        got = [x.result() for x in reader.read_block(batch, wait=False)]
        reader.close()
        log = [entry for entry in server.log if entry[0] == "GET"]
    assert got == [images[int(m[1:3])] for m in batch["member"]]
    spans = [tuple(int(x) for x in rng_header.removeprefix("bytes=").split("-")) for _, _, _, rng_header in log]
    lengths = [end - start + 1 for start, end in spans]
    big = 512 + 1_500_000  # the large member with its tar header, which each range starts with
    assert len(spans) >= 4 and all(n <= reader_module._MAX_RANGE or n == big for n in lengths)
    assert big in lengths
    offsets = batch["offset"]
    first_row = [min(i for i in range(len(order)) if start <= offsets[i] <= end) for start, end in spans]
    assert first_row == sorted(first_row)  # the rows' order, not the shard's


def test_transient_errors_are_retried_then_counted(tmp_path):
    data = _folder(tmp_path, n=6)
    fs, handler = wrapped(fail_first=2)
    rows = open_source(str(data), filesystem=fs)
    out = BlockReader(rows.root, "folder", options=FAST).read_block(_batch(rows.table))
    assert out == _expected(rows) and set(handler.attempts.values()) == {3}
    fs, handler = wrapped(
        fail_first=100,
        error=OSError(
            "AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate. (HTTP status 503)"
        ),
    )
    rows = open_source(str(data), filesystem=fs)
    out = BlockReader(rows.root, "folder", options=ReadOptions(retries=3, backoff_s=0.001)).read_block(
        _batch(rows.table)
    )
    assert all(o.reason == UNREADABLE and "SLOW_DOWN" in o.detail for o in out)
    assert set(handler.attempts.values()) == {4}  # the first attempt and 3 retries


def test_missing_and_denied_are_not_retried(tmp_path):
    data = _folder(tmp_path, n=3)
    fs, handler = wrapped(fail_first=100, error=PermissionError("AWS Error ACCESS_DENIED: Access Denied"))
    rows = open_source(str(data), filesystem=fs)
    out = BlockReader(rows.root, "folder", options=FAST).read_block(_batch(rows.table))
    assert all(o.reason == UNREADABLE for o in out) and set(handler.attempts.values()) == {1}
    fs, handler = wrapped()
    rows = open_source(str(data), filesystem=fs)
    batch = _batch(rows.table)
    batch["path"] = np.array(["c0/nope.jpg"] * 3, dtype=object)
    out = BlockReader(rows.root, "folder", options=FAST).read_block(batch)
    assert [o.reason for o in out] == [MISSING] * 3


def test_errors_that_are_not_io_propagate(tmp_path):
    data = _folder(tmp_path, n=3)
    fs, _ = wrapped(fail_first=100, error=ZeroDivisionError("a bug"))
    rows = open_source(str(data), filesystem=fs)
    with pytest.raises(ZeroDivisionError):
        BlockReader(rows.root, "folder", options=FAST).read_block(_batch(rows.table))


@pytest.mark.parametrize(
    "message, transient",
    [
        ("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56, Failure when receiving data", True),
        ("AWS Error UNKNOWN (HTTP status 500) during GetObject operation: InternalError", True),
        ("AWS Error SLOW_DOWN during GetObject operation (HTTP status 503)", True),
        ("Connection reset by peer", True),
        ("Operation timed out", True),
        ("AWS Error ACCESS_DENIED during GetObject operation: Access Denied", False),
        ("Path does not exist 'bucket/x.jpg'", False),
        ("images/500/x.jpg: Is a directory", False),
    ],
)
def test_transient_classification(message, transient):
    assert is_transient(OSError(message)) is transient
    assert is_transient(TimeoutError()) and not is_transient(FileNotFoundError("x"))


def test_with_retries_backs_off_exponentially():
    waits, calls = [], []

    def flaky():
        calls.append(1)
        raise ConnectionResetError("Connection reset by peer")

    opts = ReadOptions(retries=4, backoff_s=0.1, max_backoff_s=0.3)
    with pytest.raises(ConnectionResetError):
        with_retries(flaky, opts, sleep=waits.append)
    assert len(calls) == 5 and len(waits) == 4
    assert all(0 <= w <= cap for w, cap in zip(waits, [0.1, 0.2, 0.3, 0.3], strict=True))
    with pytest.raises(ValueError, match="in_flight"):
        ReadOptions(in_flight=0)


def test_reader_pickles_without_its_threads(tmp_path):
    import pickle

    _folder(tmp_path, n=4)
    fs = pa.fs.SubTreeFileSystem(str(tmp_path), pa.fs.LocalFileSystem())  # not local to raypipe, picklable
    rows = open_source("data", filesystem=fs)
    assert not rows.root.is_local
    reader = BlockReader(rows.root, "folder", options=FAST)
    reader.read_block(_batch(rows.table))
    again = pickle.loads(pickle.dumps(reader))
    assert again.read_block(_batch(rows.table)) == _expected(rows)
    reader.close()
    again.close()


def test_a_requests_outcome_reaches_each_of_its_rows():
    from concurrent.futures import Future

    from raypipe.sources.transport.request_pool import fan_out

    def fanned(outcome) -> list[Future]:
        request, rows = Future(), [Future() for _ in range(3)]
        request.add_done_callback(lambda done: fan_out(done, rows))
        if isinstance(outcome, BaseException):
            request.set_exception(outcome)
        else:
            request.set_result(outcome)
        assert all(row.done() for row in rows)
        return rows

    assert [row.result() for row in fanned([b"a", b"b", b"c"])] == [b"a", b"b", b"c"]
    for row in fanned(OSError("the store is down")):
        with pytest.raises(OSError, match="the store is down"):
            row.result()
    for row in fanned([b"a", b"b"]):  # a request that lost a row is our bug, told to every row
        with pytest.raises(AssertionError, match="2 rows of 3"):
            row.result()
