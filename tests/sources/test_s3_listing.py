"""Listing a remote image folder: class prefixes listed concurrently give exactly what one recursive
listing gives (classes, files in walk order, size and mtime stamps, rows), over raypipe.testing.S3Server
on 127.0.0.1; a transiently failing prefix listing is retried."""

import os

import pyarrow.fs as pafs
import pytest
from wrapped_fs import WrappedFS

from raypipe.sources import ReadOptions, open_source
from raypipe.sources.formats.folder import list_remote
from raypipe.sources.transport.paths import open_root
from raypipe.testing import S3Server

pytestmark = pytest.mark.timeout(120)

FILES = {  # relative path: bytes (a function of the path, so sizes differ)
    "a/1.jpg": 1,
    "a/10.jpg": 2,
    "a/2.jpg": 3,
    "a/z.JPEG": 4,
    "a/notes.txt": 5,
    "a/sub/x.jpg": 6,
    "a/sub/deeper/y.png": 7,
    "a/sub/deeper/skip.json": 8,
    "a/aa/w.webp": 9,
    "b/only.txt": 10,  # a class folder without images
    "d10/p.jpg": 11,
    "d2/q.jpg": 12,
    "d2/r/s/t.bmp": 13,
    "root.jpg": 14,
    "readme.txt": 15,  # files at the root: not a class's
}


@pytest.fixture
def tree(tmp_path):
    folder = tmp_path / "bkt" / "tree"
    for rel, n in FILES.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\xff\xd8" + bytes(range(n)) * n)
    (folder / "c").mkdir()  # an empty class folder (on S3: the marker object ``c/``)
    return tmp_path


def test_concurrent_listing_equals_one_recursive_listing(tree, monkeypatch):
    with S3Server(tree, latency_ms=5) as server:
        fs = server.filesystem()
        root = open_root("s3://bkt/tree", filesystem=fs)
        flat = list_remote(root, ReadOptions(list_in_flight=1))
        server.reset_counts()
        concurrent = list_remote(root, ReadOptions(list_in_flight=3))
        # one delimited listing of the root, then one listing per class prefix (each a single page here)
        assert server.count("ListObjectsV2") == 1 + 5
        assert sorted(flat[0]) == sorted(concurrent[0]) == ["a", "b", "c", "d10", "d2"]
        assert flat[1] == concurrent[1]
        assert concurrent[1]["a"] == [
            "a/1.jpg",
            "a/10.jpg",
            "a/2.jpg",
            "a/z.JPEG",
            "a/aa/w.webp",
            "a/sub/x.jpg",
            "a/sub/deeper/y.png",
        ]
        assert flat[2] == concurrent[2]
        for rel, stamp in concurrent[2].items():
            assert stamp[0] == os.path.getsize(tree / "bkt" / "tree" / rel) and stamp[1] > 0

        rows = {}
        for n in (1, 4):
            monkeypatch.setenv("RAYPIPE_LIST_IN_FLIGHT", str(n))
            rows[n] = open_source("s3://bkt/tree", filesystem=fs)
        local = open_source(str(tree / "bkt" / "tree"))
    assert rows[1].classes == rows[4].classes == local.classes == ("a", "b", "c", "d2", "d10")
    assert rows[1].table.equals(rows[4].table)
    store = ["object_size", "object_mtime_ns"]  # known to the remote listing only
    assert rows[4].table.drop_columns(store).equals(local.table.drop_columns(store))


class _FlakyListing(WrappedFS):
    """Each selector listing fails with a connection reset the first time it is asked for."""

    def get_file_info_selector(self, selector):
        with self._lock:
            self.attempts[selector.base_dir] += 1
            first = self.attempts[selector.base_dir] == 1
        if first:
            raise ConnectionResetError("Connection reset by peer")
        return super().get_file_info_selector(selector)


def test_a_failing_prefix_listing_is_retried(tree):
    handler = _FlakyListing()
    fs = pafs.PyFileSystem(handler)
    root = open_root(str(tree / "bkt" / "tree"), filesystem=fs)
    assert not root.is_local
    options = ReadOptions(list_in_flight=2, backoff_s=0.001)
    classes, files, _ = list_remote(root, options)
    assert sorted(classes) == ["a", "b", "c", "d10", "d2"] and files["d2"] == ["d2/q.jpg", "d2/r/s/t.bmp"]
    assert all(n == 2 for n in handler.attempts.values()) and len(handler.attempts) == 1 + 5
    fresh = open_root(str(tree / "bkt" / "tree"), filesystem=pafs.PyFileSystem(_FlakyListing()))
    with pytest.raises(ConnectionResetError):
        list_remote(fresh, ReadOptions(list_in_flight=2, retries=0))
