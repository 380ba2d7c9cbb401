"""raypipe.testing.S3Server: what pyarrow (and boto3) send is answered as S3 would, with latency, and
raypipe reads an s3:// folder, Parquet file and shards through it exactly as it reads them locally."""

import http.client
import os
import shutil

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from image_factory import tar_bytes

from raypipe.config import PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline
from raypipe.sources import BlockReader, ReadOptions, open_source
from raypipe.testing import S3Server

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def data(sample_dir, tmp_path_factory):
    """``root/bkt`` holding ``folder/`` (the sample images), ``pq/part.parquet`` and ``wds/shard-*.tar``;
    the same files are the local copies."""
    root = tmp_path_factory.mktemp("buckets")
    bucket = root / "bkt"
    shutil.copytree(sample_dir, bucket / "folder")
    files = sorted(sample_dir.rglob("*.jpg"))
    (bucket / "pq").mkdir()
    table = pa.table({"image": [p.read_bytes() for p in files[:20]], "label": [i % 4 for i in range(20)]})
    pq.write_table(table, bucket / "pq" / "part.parquet", row_group_size=6)
    (bucket / "wds").mkdir()
    for s in range(2):
        members = []
        for i, p in enumerate(files[s * 10 : (s + 1) * 10]):
            members += [(f"k{s}{i:02d}.jpg", p.read_bytes()), (f"k{s}{i:02d}.cls", str(i % 4).encode())]
        (bucket / "wds" / f"shard-{s}.tar").write_bytes(tar_bytes(members))
    return root


@pytest.fixture
def server(data):
    with S3Server(data, latency_ms=20) as s:
        yield s


def _batch(rows):
    return {k: rows.table.column(k).to_numpy(zero_copy_only=False) for k in rows.table.column_names}


@pytest.mark.parametrize("where", ["folder", "pq", "wds"])
def test_listing_and_reads_match_local_with_latency(server, data, where):
    fs = server.filesystem()
    remote, local = open_source(f"s3://bkt/{where}", filesystem=fs), open_source(str(data / "bkt" / where))
    assert remote.kind == local.kind
    store = ["object_size", "object_mtime_ns"]  # known to the remote listing only (the reader's cache uses them)
    if where == "folder":
        assert remote.classes == local.classes
        assert remote.table.drop_columns(store).equals(local.table.drop_columns(store))
    else:
        assert remote.table.drop_columns(["path", *store]).equals(local.table.drop_columns(["path", *store]))
    sizes = [os.path.getsize(data / "bkt" / where / p) for p in remote.table.column("path").to_pylist()]
    assert remote.table.column("object_size").to_pylist() == sizes
    assert min(remote.table.column("object_mtime_ns").to_pylist()) > 0
    server.reset_counts()
    reader = BlockReader(remote.root, remote.kind, remote.image_column, options=ReadOptions(in_flight=8, cache=None))
    got = reader.read_block(_batch(remote))
    reader.close()
    want = BlockReader(local.root, local.kind, local.image_column).read_block(_batch(local))
    assert got == want and all(isinstance(g, bytes) for g in got)
    if where != "pq":  # one file: its row groups are read one after another by one reader thread
        assert server.max_active > 1, "requests did not overlap"


def test_the_added_latency_is_all_a_request_waits(data):
    """One client reading objects one after another on one connection waits ``latency_ms`` per request and
    no more: a GET's body must not wait for the client's delayed ACK of its headers (Nagle's algorithm
    on the server's socket would add ~40 ms to every GET, far more than the latency it models)."""
    import time

    with S3Server(data, latency_ms=5) as s:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        keys = sorted(p.relative_to(data / "bkt").as_posix() for p in (data / "bkt" / "folder").rglob("*.jpg"))[:10]
        t0 = time.perf_counter()
        for key in keys:
            conn.request("GET", f"/bkt/{key}")
            response = conn.getresponse()
            assert response.status == 200 and response.read() == (data / "bkt" / key).read_bytes()
        per_request = (time.perf_counter() - t0) / len(keys)
        conn.close()
    assert per_request < 0.030, f"{per_request * 1e3:.1f} ms per GET with 5 ms of added latency"


def test_pipeline_epoch_from_s3_matches_local(ray_local, server, data):
    fs = server.filesystem()
    aug = TrainAugment(input_size=24)
    for where in ("folder", "wds"):
        digests = []
        for rows in (open_source(f"s3://bkt/{where}", filesystem=fs), open_source(str(data / "bkt" / where))):
            run = Pipeline(rows, aug, config=PipelineConfig(batch_size=8), content_digest=True).epoch(0)
            for _ in run:
                pass
            assert run.report.num_skipped == 0
            digests.append(run.report.content_sha256)
        assert digests[0] == digests[1], where


def test_pagination_and_delimiter(server):
    boto3 = pytest.importorskip("boto3")
    from botocore import UNSIGNED
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=server.endpoint, region_name="us-east-1", config=Config(signature_version=UNSIGNED)
    )
    keys, token = [], None
    while True:
        kwargs = {"ContinuationToken": token} if token else {}
        page = client.list_objects_v2(Bucket="bkt", Prefix="folder/", MaxKeys=5, **kwargs)
        keys += [c["Key"] for c in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert len(keys) == 48 and keys == sorted(keys)
    top = client.list_objects_v2(Bucket="bkt", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["folder/", "pq/", "wds/"] and "Contents" not in top
    body = client.get_object(Bucket="bkt", Key=keys[0], Range="bytes=-10")["Body"].read()
    assert len(body) == 10


def test_writes_through_pyarrow(server, data):
    fs = server.filesystem()
    small, big = b"x" * 1000, os.urandom(11 * 1024 * 1024)  # big: pyarrow uploads it in parts
    with fs.open_output_stream("bkt/out/small.bin") as f:
        f.write(small)
    with fs.open_output_stream("bkt/out/big.bin") as f:
        f.write(big)
    fs.move("bkt/out/small.bin", "bkt/out/moved.bin")
    assert (data / "bkt" / "out" / "moved.bin").read_bytes() == small
    assert (data / "bkt" / "out" / "big.bin").read_bytes() == big
    assert fs.get_file_info("bkt/out/small.bin").type == pafs.FileType.NotFound
    assert not (data / "bkt" / ".s3server-uploads").exists() or not os.listdir(data / "bkt" / ".s3server-uploads")
    shutil.rmtree(data / "bkt" / "out")


def test_never_serves_outside_its_root(server, data, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for you")
    link = data / "bkt" / "link.txt"
    link.symlink_to(secret)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        for path in (
            "/bkt/link.txt",
            "/bkt/../bkt/folder",
            "/bkt/%2E%2E/%2E%2E" + str(secret),
            "/bkt/folder/../../" + os.path.relpath(secret, data),
        ):
            conn.request("GET", path)
            resp = conn.getresponse()
            assert resp.status == 404 and b"not for you" not in resp.read(), path
        conn.close()
    finally:
        link.unlink()


def test_the_same_prefix_through_another_filesystem_reads_through_that_one(data, tmp_path):
    """A worker keeps its augmentation stage between tasks; a later pipeline naming the same bucket and
    prefix through another filesystem (another endpoint here) must read through its own, not the first
    one's (which, here, is gone)."""
    from raypipe.config import DecodeConfig
    from raypipe.stages.augment import StageSpec, augment_block

    def spec_and_rows(server):
        rows = open_source("s3://bkt/folder", filesystem=server.filesystem())
        spec = StageSpec(
            kind=rows.kind, root=rows.root, augment=TrainAugment(input_size=24), decode=DecodeConfig(), seed=0, epoch=0
        )
        return spec, {k: v[:8] for k, v in _batch(rows).items()}

    with S3Server(data) as first:
        spec, rows = spec_and_rows(first)
        assert augment_block(rows, spec)["ok"].all()
    with S3Server(data) as second:  # another port; the first server has stopped
        spec, rows = spec_and_rows(second)
        second.reset_counts()
        out = augment_block(rows, spec)
        assert out["ok"].all(), list(out["detail"])
        assert second.count("GetObject") == 8


def test_a_chunked_body_and_an_unknown_method(tmp_path):
    """A body sent with ``Transfer-Encoding: chunked`` is stored as its data; a method S3 does not have is
    a 501 on a connection that goes on serving."""
    (tmp_path / "bkt").mkdir()
    with S3Server(tmp_path) as s:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        conn.request("PUT", "/bkt/a.bin", body=iter([b"hello ", b"chunked ", b"world"]), encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 200
        response.read()
        conn.request("OPTIONS", "/bkt/a.bin")
        response = conn.getresponse()
        assert response.status == 501 and b"NotImplemented" in response.read()
        conn.request("GET", "/bkt/a.bin")
        assert conn.getresponse().read() == b"hello chunked world"
        conn.close()
        assert s.count("Unsupported") == 1
    assert (tmp_path / "bkt" / "a.bin").read_bytes() == b"hello chunked world"


def test_cached_listings_page_as_walked_ones_and_writes_clear_them(data, tmp_path):
    """cache_listings=True: every page is what an uncached server answers; a write through the server is
    seen by the next listing; an empty folder lists as its marker object, as S3 lists ``folder/``."""
    cls = sorted(p.name for p in (data / "bkt" / "folder").iterdir())[0]  # a class folder that stays
    (data / "bkt" / "folder" / "empty").mkdir()
    try:
        pages = {}
        for cached in (False, True):
            with S3Server(data, cache_listings=cached) as s:
                fs = s.filesystem()
                infos = fs.get_file_info(pafs.FileSelector("bkt/folder", recursive=True))
                pages[cached] = sorted((i.path, i.type, i.size) for i in infos)
                with fs.open_output_stream(f"bkt/folder/{cls}/new.jpg") as f:
                    f.write(b"x")
                after = fs.get_file_info(pafs.FileSelector(f"bkt/folder/{cls}", recursive=True))
                assert f"bkt/folder/{cls}/new.jpg" in [i.path for i in after]
                fs.delete_file(f"bkt/folder/{cls}/new.jpg")
        assert pages[False] == pages[True]
        assert ("bkt/folder/empty", pafs.FileType.Directory, None) in pages[True]
    finally:
        (data / "bkt" / "folder" / "empty").rmdir()
