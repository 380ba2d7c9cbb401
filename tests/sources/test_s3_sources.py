"""Remote reads against a local S3 (moto, on 127.0.0.1): concurrent folder reads, Parquet row groups,
WebDataset shards listed and read with ranged requests, missing objects. (Writing to this moto through
pyarrow fails: its multipart-upload completion is refused by pyarrow's S3 client; convert's remote
destination is tested over another non-local pyarrow filesystem in test_convert.py.)"""

import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from image_factory import tar_bytes

from raypipe.config import PipelineConfig, TrainAugment
from raypipe.kernels.errors import MISSING, SkipImage
from raypipe.pipeline import Pipeline
from raypipe.sources import BlockReader, ReadOptions, open_source

pytestmark = pytest.mark.timeout(240)

BUCKET = "raypipe-sources"


@pytest.fixture(scope="module")
def s3(sample_dir, tmp_path_factory):
    boto3 = pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        client = boto3.client(
            "s3",
            endpoint_url=f"http://{host}:{port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=BUCKET)
        files = sorted(sample_dir.rglob("*.jpg"))
        for path in files:
            client.put_object(Bucket=BUCKET, Key="folder/" + os.path.relpath(path, sample_dir), Body=path.read_bytes())
        local = tmp_path_factory.mktemp("s3-local")
        table = pa.table({"image": [p.read_bytes() for p in files[:20]], "label": [i % 4 for i in range(20)]})
        pq.write_table(table, local / "part.parquet", row_group_size=6)
        client.put_object(Bucket=BUCKET, Key="pq/part.parquet", Body=(local / "part.parquet").read_bytes())
        (local / "wds").mkdir()
        for s in range(2):
            members = []
            for i, p in enumerate(files[s * 10 : (s + 1) * 10]):
                members += [(f"k{s}{i:02d}.jpg", p.read_bytes()), (f"k{s}{i:02d}.cls", str(i % 4).encode())]
            data = tar_bytes(members)
            (local / "wds" / f"shard-{s}.tar").write_bytes(data)
            client.put_object(Bucket=BUCKET, Key=f"wds/shard-{s}.tar", Body=data)
        fs = pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            endpoint_override=f"{host}:{port}",
            scheme="http",
            region="us-east-1",
        )
        yield fs, local
    finally:
        server.stop()


def _batch(rows):
    return {k: rows.table.column(k).to_numpy(zero_copy_only=False) for k in rows.table.column_names}


def test_folder_block_from_s3_matches_local(s3, sample_dir):
    fs, _ = s3
    remote = open_source(f"s3://{BUCKET}/folder", filesystem=fs)
    local = open_source(str(sample_dir))
    reader = BlockReader(remote.root, "folder", options=ReadOptions(in_flight=8))
    assert reader.read_block(_batch(remote)) == BlockReader(local.root, "folder").read_block(_batch(local))
    batch = _batch(remote)
    batch["path"] = np.array(["c0/missing.jpg"], dtype=object)
    batch = {k: v[:1] if k != "path" else v for k, v in batch.items()}
    (skip,) = reader.read_block(batch)
    assert skip.reason == MISSING
    reader.close()


def test_a_remote_folder_block_read_without_waiting_gives_futures_of_the_same_bytes(s3, sample_dir):
    """read_block(wait=False): a remote folder's rows come back as Futures at once (the stage decodes the
    first while the later ones are in flight), each resolving to what read_block() returns; a missing
    object is still a skip, not an exception."""
    from concurrent.futures import Future

    fs, _ = s3
    remote = open_source(f"s3://{BUCKET}/folder", filesystem=fs)
    batch = _batch(remote)
    batch["path"] = batch["path"].copy()
    batch["path"][1] = "c0/missing.jpg"
    reader = BlockReader(remote.root, "folder", options=ReadOptions(in_flight=4))
    pending = reader.read_block(batch, wait=False)
    assert len(pending) == len(batch["path"]) and all(isinstance(x, Future) for x in pending)

    def shown(x):
        return x.reason if isinstance(x, SkipImage) else x

    assert [shown(x.result()) for x in pending] == [shown(x) for x in reader.read_block(batch)]
    assert pending[1].result().reason == MISSING
    local = open_source(str(sample_dir))  # a local root is read before it returns, as with wait=True
    here = BlockReader(local.root, "folder").read_block(_batch(local), wait=False)
    assert all(isinstance(x, bytes) for x in here)
    reader.close()


def test_parquet_and_shards_from_s3_match_local(s3):
    fs, local = s3
    for uri, path in ((f"s3://{BUCKET}/pq", local / "part.parquet"), (f"s3://{BUCKET}/wds", local / "wds")):
        remote, here = open_source(uri, filesystem=fs), open_source(str(path))
        assert remote.kind == here.kind
        store = ["object_size", "object_mtime_ns"]  # known to the remote listing only
        assert remote.table.drop_columns(["path", *store]).equals(here.table.drop_columns(["path", *store]))
        assert min(remote.table.column("object_size").to_pylist()) > 0
        got = BlockReader(remote.root, remote.kind, remote.image_column).read_block(_batch(remote))
        want = BlockReader(here.root, here.kind, here.image_column).read_block(_batch(here))
        assert got == want and all(isinstance(g, bytes) for g in got)


def test_shards_from_s3_through_the_pipeline(ray_local, s3):
    fs, _ = s3
    rows = open_source(f"s3://{BUCKET}/wds/shard-{{0..1}}.tar", filesystem=fs)
    assert rows.kind == "webdataset" and len(rows) == 20
    run = Pipeline(rows, TrainAugment(input_size=24), config=PipelineConfig(batch_size=8)).epoch(0)
    labels = {}
    for b in run:
        labels.update(zip(b["sample_id"].tolist(), b["label"].tolist(), strict=True))
    assert run.report.emitted == 20 and labels == {i: (i % 10) % 4 for i in range(20)}
