"""Reading an image folder and a Parquet file from s3:// served by a local moto server on 127.0.0.1."""

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from raypipe.config import PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline
from raypipe.sources import open_source

pytestmark = pytest.mark.timeout(240)

BUCKET = "raypipe-test"


@pytest.fixture(scope="module")
def s3(sample_dir):
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
        for path in sorted(sample_dir.rglob("*.jpg")):
            key = "folder/" + os.path.relpath(path, sample_dir)
            client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
        files = sorted(sample_dir.rglob("*.jpg"))[:12]
        table = pa.table({"image": [f.read_bytes() for f in files], "label": [i % 3 for i in range(12)]})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=5)
        client.put_object(Bucket=BUCKET, Key="pq/part-0.parquet", Body=sink.getvalue().to_pybytes())
        fs = pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            endpoint_override=f"{host}:{port}",
            scheme="http",
            region="us-east-1",
        )
        yield fs, files
    finally:
        server.stop()


def test_image_folder_from_s3_matches_local(ray_local, s3, sample_dir):
    fs, _ = s3
    aug = TrainAugment(input_size=32)
    remote = open_source(f"s3://{BUCKET}/folder", filesystem=fs)
    local = open_source(str(sample_dir))
    assert remote.kind == "folder" and remote.classes == local.classes
    assert remote.table.column("path").to_pylist() == local.table.column("path").to_pylist()
    digests = []
    for rows in (remote, local):
        run = Pipeline(rows, aug, config=PipelineConfig(batch_size=16), content_digest=True).epoch(0)
        for _ in run:
            pass
        assert run.report.emitted == len(local) and run.report.num_skipped == 0
        digests.append(run.report.content_sha256)
    assert digests[0] == digests[1]


def test_parquet_from_s3(ray_local, s3):
    fs, files = s3
    rows = open_source(f"s3://{BUCKET}/pq", filesystem=fs)
    assert rows.kind == "parquet" and len(rows) == 12
    run = Pipeline(rows, TrainAugment(input_size=24), config=PipelineConfig(batch_size=5)).epoch(0)
    labels = {}
    for b in run:
        labels.update(zip(b["sample_id"].tolist(), b["label"].tolist(), strict=True))
    assert run.report.emitted == 12
    assert labels == {i: i % 3 for i in range(12)}


def test_s3_escape_is_refused(s3):
    fs, _ = s3
    rows = open_source(f"s3://{BUCKET}/folder", filesystem=fs)
    with pytest.raises(Exception, match="outside"):
        rows.root.read_bytes("../pq/part-0.parquet")
