"""A trainer's process that read from an object store ends with its own status: pyarrow's and obstore's
S3 clients, kept by raypipe's per-process caches, and reads still in flight when the script ends, must
not crash the interpreter's shutdown (a crash there turns a finished job into exit 139)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from raypipe.sources.writing.convert import convert
from raypipe.testing import S3Server

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SCRIPT = """
import sys
import pyarrow.fs as pafs
from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sources import BlockReader, open_source

fs = pafs.S3FileSystem(anonymous=True, endpoint_override=sys.argv[1], scheme="http", region="us-east-1")
folder = open_source("s3://bkt/folder", filesystem=fs)
# in this process: whole objects with single GETs, the reader (and its clients) left open
reader = BlockReader(folder.root, folder.kind)
columns = ("path", "object_size", "object_mtime_ns")
batch = {name: folder.table.column(name).to_numpy(zero_copy_only=False) for name in columns}
assert all(isinstance(data, bytes) and data for data in reader.read_block(batch))
aug = TrainAugment(input_size=(32, 32))
local = ExecutionConfig(backend="local", chunk_rows=8, num_tasks=2)
taken = 0
for rows in (folder, open_source("s3://bkt/shards", filesystem=fs)):
    # on worker processes of this machine: two batches of an epoch, never closed
    epoch = iter(EpochSource(Pipeline(rows, aug, config=PipelineConfig(batch_size=8), execution=local), end_epoch=1))
    taken += len(next(epoch)["label"]) + len(next(epoch)["label"])
pending = BlockReader(folder.root, folder.kind).read_block(batch, wait=False)  # in flight at the end
print("taken", taken, flush=True)
"""


def test_a_script_that_read_an_object_store_exits_with_its_status(sample_dir, tmp_path):
    buckets = tmp_path / "buckets"
    shutil.copytree(sample_dir, buckets / "bkt" / "folder")
    convert(str(sample_dir), str(buckets / "bkt" / "shards"), format="webdataset", shard_size=100_000)
    with S3Server(buckets, latency_ms=5) as server:
        for _ in range(3):  # a crash at shutdown depends on what was in flight when the script ended
            proc = subprocess.run(
                [sys.executable, "-c", SCRIPT, f"127.0.0.1:{server.port}"],
                capture_output=True,
                text=True,
                timeout=240,
                cwd=tmp_path,
            )
            assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
            assert proc.stdout.split() == ["taken", "32"]
