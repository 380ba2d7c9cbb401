"""``raypipe convert``: folder → WebDataset / Parquet shards and back, deterministic and atomic."""

import hashlib
import os

import numpy as np
import pyarrow as pa
import pytest

from raypipe.cli.main import main as cli_main
from raypipe.config import DecodeConfig, TrainAugment
from raypipe.sources import open_source
from raypipe.sources.formats.webdataset import list_webdataset
from raypipe.sources.indexes.shard_index import INDEX_NAME
from raypipe.sources.reader import BlockReader
from raypipe.sources.transport.paths import open_root
from raypipe.sources.writing.convert import _ShardJob, _write_shard, convert, parse_size
from raypipe.stages.augment import AugmentStage, StageSpec

pytestmark = pytest.mark.timeout(240)


def _digests(rows) -> dict[int, tuple[int, str]]:
    """sample_id -> (label, digest of the augmented image) for every emitted sample, through the stage."""
    spec = StageSpec(
        kind=rows.kind,
        root=rows.root,
        augment=TrainAugment(input_size=32),
        decode=DecodeConfig(),
        seed=7,
        epoch=1,
        image_column=rows.image_column,
    )
    batch = {k: rows.table.column(k).to_numpy(zero_copy_only=False) for k in rows.table.column_names}
    out = AugmentStage(spec)(batch)
    assert out["ok"].all(), out["reason"]
    return {
        int(s): (int(lbl), hashlib.sha256(img.tobytes()).hexdigest())
        for s, lbl, img in zip(out["sample_id"], out["label"], out["image"], strict=True)
    }


def _files(d) -> dict[str, bytes]:
    """The shards under ``d`` (raypipe's index beside them records their times, so it differs per run)."""
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d)) if n != INDEX_NAME}


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_round_trip_gives_the_same_samples(ray_local, sample_dir, tmp_path, fmt):
    folder = open_source(str(sample_dir))
    report = convert(str(sample_dir), str(tmp_path / "out"), format=fmt, samples_per_shard=10)
    assert report.samples == len(folder) == 48 and report.skipped == () and len(report.shards) == 5
    ext = ".tar" if fmt == "webdataset" else ".parquet"
    assert sorted(set(os.listdir(tmp_path / "out")) - {INDEX_NAME}) == [
        f"{'shard' if ext == '.tar' else 'part'}-{k:05d}{ext}" for k in range(5)
    ]
    assert os.path.exists(tmp_path / "out" / INDEX_NAME) == (fmt == "webdataset")
    shards = open_source(str(tmp_path / "out"))
    assert shards.kind == fmt and shards.num_shards == 5 if fmt == "webdataset" else shards.kind == fmt
    assert shards.table.column("sample_id").to_pylist() == folder.table.column("sample_id").to_pylist()
    assert _digests(shards) == _digests(folder)
    again = convert(folder, str(tmp_path / "again"), format=fmt, samples_per_shard=10)
    assert again.shards == report.shards and _files(tmp_path / "again") == _files(tmp_path / "out")  # byte-identical
    if fmt == "webdataset":
        assert open_source(str(tmp_path / "out" / report.pattern)).table.equals(shards.table)
        scanned = list_webdataset(str(tmp_path / "out"), index=False)  # from the tar headers
        assert shards.table.equals(scanned.table) and shards.extra == scanned.extra


def test_max_side_shrinks_and_keeps_keys_and_labels(ray_local, sample_dir, tmp_path):
    from PIL import Image

    from raypipe.kernels.decode import probe_image

    folder = open_source(str(sample_dir))
    report = convert(folder, str(tmp_path / "small"), format="webdataset", max_side=40, shard_size="64kB")
    assert report.resized == len(folder) and report.undecodable == 0 and len(report.shards) > 1
    rows = open_source(str(tmp_path / "small"))
    assert rows.table.column("label").to_pylist() == folder.table.column("label").to_pylist()
    keys = [m.split(".")[0] for m in rows.table.column("member").to_pylist()]
    assert keys == [f"{i:06d}" for i in range(len(folder))]
    data = BlockReader(rows.root, rows.kind).read_block(
        {k: rows.table.column(k).to_numpy(zero_copy_only=False) for k in rows.table.column_names}
    )
    sizes = [probe_image(d) for d in data]
    assert max(max(s.width, s.height) for s in sizes) == 40
    assert Image.open(__import__("io").BytesIO(data[0])).format == "JPEG"


def test_unreadable_samples_are_left_out_and_bad_labels_stay_bad(ray_local, sample_dir, tmp_path):
    files = sorted(p for p in sample_dir.rglob("*.jpg"))[:4]
    manifest = tmp_path / "m.csv"
    lines = ["path,label", f"{files[0]},1", f"{files[1]},", f"{tmp_path}/gone.jpg,2", f"{files[3]},0"]
    manifest.write_text("\n".join(lines) + "\n")
    report = convert(str(manifest), str(tmp_path / "out"), format="webdataset", root=str(sample_dir.parent.parent))
    assert report.samples == 3 and [s["reason"] for s in report.skipped] == ["missing"]
    rows = open_source(str(tmp_path / "out"))
    t = rows.table.to_pydict()
    assert t["label"] == [1, -1, 0] and t["error"][1].startswith("bad_label")
    assert rows.table.equals(list_webdataset(str(tmp_path / "out"), index=False).table)  # the index: as the headers


def test_a_failed_shard_leaves_nothing_that_looks_complete(sample_dir, tmp_path, monkeypatch):
    rows = open_source(str(sample_dir))
    calls = []
    real = BlockReader.read_block

    def failing(self, batch):
        calls.append(1)
        if len(calls) == 2:  # the writer's second chunk of samples
            raise RuntimeError("worker lost")
        return real(self, batch)

    monkeypatch.setattr(BlockReader, "read_block", failing)
    monkeypatch.setattr("raypipe.sources.writing.convert._CHUNK", 16)
    (tmp_path / "out").mkdir()
    for fmt in ("webdataset", "parquet"):
        calls.clear()
        job = _ShardJob(rows, open_root(str(tmp_path / "out")), f"shard-00000.{fmt}", fmt, None, 6, 256)
        with pytest.raises(RuntimeError, match="worker lost"):
            _write_shard(job)
        assert os.listdir(tmp_path / "out") == []  # neither the shard nor its temporary file


def test_convert_refuses_a_folder_with_shards_and_parses_sizes(sample_dir, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "shard-00000.tar").write_bytes(b"")
    with pytest.raises(ValueError, match="already holds"):
        convert(str(sample_dir), str(tmp_path / "out"), format="webdataset")
    with pytest.raises(ValueError, match="format"):
        convert(str(sample_dir), str(tmp_path / "x"), format="zip")
    assert parse_size("256MB") == 256 * 10**6 and parse_size("1GiB") == 2**30 and parse_size("500k") == 500_000
    with pytest.raises(ValueError, match="shard size"):
        parse_size("lots")


def test_cli_convert(ray_local, sample_dir, tmp_path, capsys):
    import json

    out = tmp_path / "wds"
    rc = cli_main(
        [
            "convert",
            str(sample_dir),
            str(out),
            "--format",
            "webdataset",
            "--shard-size",
            "200kB",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["samples"] == 48 and len(report["shards"]) == len(os.listdir(out)) - 1 > 1  # and the index
    assert "48 samples" in capsys.readouterr().out
    rows = open_source(str(out / report["pattern"]))
    assert len(rows) == 48 and np.array_equal(
        rows.table.column("label").to_numpy(), open_source(str(sample_dir)).table.column("label").to_numpy()
    )
    assert pa.types.is_int64(rows.table.schema.field("shard").type)


def test_convert_into_a_remote_filesystem(ray_local, sample_dir, tmp_path):
    """A destination on a non-local pyarrow filesystem: written through output streams, then moved."""
    (tmp_path / "remote").mkdir()
    fs = pa.fs.SubTreeFileSystem(str(tmp_path / "remote"), pa.fs.LocalFileSystem())
    report = convert(str(sample_dir), "bucket/converted", format="webdataset", samples_per_shard=16, dst_filesystem=fs)
    assert len(report.shards) == 3
    written = sorted(os.listdir(tmp_path / "remote" / "bucket" / "converted"))
    assert written == sorted([*report.shards, INDEX_NAME])  # no temporaries
    rows = open_source("bucket/converted", filesystem=fs, kind="webdataset")
    assert not rows.root.is_local and len(rows) == 48
    assert _digests(rows) == _digests(open_source(str(sample_dir)))
    assert rows.table.equals(list_webdataset("bucket/converted", filesystem=fs, index=False).table)


def test_a_failed_shard_is_raised_after_the_other_shards_have_ended(ray_local, tmp_path):
    import time

    import ray

    from raypipe.sources.writing.convert import _gather

    @ray.remote(num_cpus=0)
    def shard(name: str, fail: bool, seconds: float) -> dict:
        time.sleep(seconds)
        if fail:
            raise OSError(f"{name}: the store refused the upload")
        (tmp_path / name).write_text("written")
        return {"name": name, "samples": 1}

    pending = {shard.remote("a", True, 0.0): "a", shard.remote("b", False, 3.0): "b"}
    with pytest.raises(OSError, match="the store refused the upload"):
        _gather(pending, None)
    # raised only once the slower shard had ended: nothing is still writing into the destination
    assert (tmp_path / "b").read_text() == "written"

    seen = []
    pending = {shard.remote(n, False, 0.0): n for n in "cd"}
    assert sorted(_gather(pending, lambda done: seen.append(len(done)))) == ["c", "d"]
    assert seen[-1] == 2
