"""A stream's first window read once for all its pieces (``raypipe.pipeline.window_read``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.kernels.errors import NULL_IMAGE, SkipImage
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.pipeline.window_read import WindowRead
from raypipe.sources import open_source
from raypipe.sources.reader import BlockReader

AUG = TrainAugment(input_size=32, color_jitter=None)


def _parquet(folder, images: list[bytes | None], group_rows: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"image": pa.array(images, pa.binary()), "label": pa.array([i % 3 for i in range(len(images))])})
    pq.write_table(table, folder / "part-0.parquet", row_group_size=group_rows)


def test_pieces_get_the_bytes_they_would_read_and_each_row_group_is_read_once(tmp_path, row_group_reads):
    n = 60
    cells: list[bytes | None] = [b"cell%d" % i for i in range(n)]
    cells[17] = None  # a null cell: a skip, carried to the piece as the reader would give it
    _parquet(tmp_path / "data", cells, group_rows=6)
    rows = open_source(str(tmp_path / "data"))
    plan = Pipeline(
        rows, AUG, config=PipelineConfig(batch_size=4, shuffle_window=60), execution=ExecutionConfig(chunk_rows=4)
    ).plan(0, 1)
    chunks = plan.chunks(0, ramp=True)
    assert [len(c) for c in chunks] == [4, 8, 16, 32] and chunks.ramp == 4  # one window of 10 row groups
    columns = rows.columns()
    reader = BlockReader(rows.root, "parquet", "image")
    alone = [reader.read_block(columns.take(idx)) for idx in chunks]  # each piece reading its own rows

    reads = row_group_reads
    reads.clear()  # the reads of the shared window from here on
    lo, hi = int(chunks.bounds[0, 0]), int(chunks.bounds[-1, 1])
    shared = BlockReader(rows.root, "parquet", "image")
    window = WindowRead(lo, lambda: columns.take(chunks.order.take(lo, hi)), shared.read_block)
    for (a, b), expected in zip(chunks.bounds, alone, strict=True):
        assert window.ready(int(a), int(b))  # a local file: read before the first piece is asked for
        piece = window.piece(int(a), int(b))
        assert np.array_equal(piece["sample_id"], columns.take(chunks.order.take(int(a), int(b)))["sample_id"])
        got = BlockReader(rows.root, "parquet", "image").read_block(piece)
        for mine, theirs in zip(got, expected, strict=True):
            if isinstance(theirs, SkipImage):
                assert isinstance(mine, SkipImage) and mine.reason == theirs.reason == NULL_IMAGE
            else:
                assert mine == theirs
    assert sorted(reads) == list(range(10))  # the window's 10 row groups, each read once for all 4 pieces


def test_the_first_epoch_of_a_remote_parquet_file_reads_each_row_group_once(sample_dir, tmp_path):
    """Over an object store, the bytes of a run's first epoch are the file's once (the footer aside),
    though its first window goes out as several pieces; the samples are each there once."""
    from raypipe.testing import S3Server

    files = sorted(sample_dir.rglob("*.jpg"))
    _parquet(tmp_path / "buckets" / "bkt" / "pq", [f.read_bytes() for f in files], group_rows=4)
    size = (tmp_path / "buckets" / "bkt" / "pq" / "part-0.parquet").stat().st_size
    with S3Server(tmp_path / "buckets") as server:
        rows = open_source("s3://bkt/pq", filesystem=server.filesystem())
        pipe = Pipeline(
            rows,
            AUG,
            config=PipelineConfig(batch_size=5, shuffle_window=48),
            execution=ExecutionConfig(chunk_rows=3, num_tasks=2, backend="local"),
        )
        assert [len(c) for c in pipe.plan(0, 1).chunks(0, ramp=True)] == [3, 6, 12, 24, 3]
        server.reset_counts()
        source = EpochSource(pipe, end_epoch=1)
        try:
            ids = [int(i) for batch in source for i in batch["sample_id"]]
        finally:
            source.close()
        assert sorted(ids) == list(range(48))
        # every piece reading the window's 12 row groups itself would be 4-5 times the file
        assert server.bytes_sent <= 1.2 * size, (server.bytes_sent, size)


def test_a_failed_read_goes_to_its_piece_as_a_skip():
    """A row the shared read could not read reaches its piece in the ``error`` column, as the reader's
    skip would have been; a bug of ours in the read is not turned into one."""
    from concurrent.futures import Future

    rows = {
        "sample_id": np.arange(4),
        "path": np.array(["a", "b", "c", "d"], dtype=object),
        "error": np.array([None, "missing: listed so", None, None], dtype=object),
    }
    failed: Future = Future()
    failed.set_result(SkipImage("unreadable", "connection reset"))

    def read(got, wait):
        assert not wait
        return [b"A", SkipImage("missing", "listed so"), failed, b"D"]

    piece = WindowRead(10, lambda: rows, read).piece(10, 14)
    assert list(piece["bytes"]) == [b"A", None, None, b"D"]
    assert list(piece["error"]) == [None, "missing: listed so", "unreadable: connection reset", None]

    def broken(got, wait):
        raise ZeroDivisionError("a bug of ours")

    with pytest.raises(ZeroDivisionError):
        WindowRead(0, lambda: rows, broken).piece(0, 4)
