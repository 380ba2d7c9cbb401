"""A Ray Dataset as a source: listed once (stable ids and digest), through ``Pipeline`` + ``EpochSource``
on two ranks (every row emitted or skipped once per epoch, the pixels of the same file read from a folder
under the same sample id), bad rows as counted skips, ``convert`` from a Dataset."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.config import DecodeConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sample_data import write_sample_data
from raypipe.sources import ListingOptions, list_ray_dataset, open_source
from raypipe.sources.reader import BlockReader
from raypipe.sources.transport.paths import open_root
from raypipe.stages.augment import StageSpec, augment_block

pytestmark = pytest.mark.timeout(300)

AUG = TrainAugment(input_size=32)
SEED = 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A folder of 12 photos (3 classes) and a Parquet file of the same bytes: a train row per photo in
    the folder's order, a val row after every third (filtered out), and three bad train rows (null bytes,
    a null label, a negative label). ``train``: per train row, (file relative to the folder or None, its
    label as listed, its skip reason or None)."""
    root = tmp_path_factory.mktemp("raydata")
    folder = root / "folder"
    files = write_sample_data(folder, classes=3, per_class=4, seed=2)
    rels = [str(p.relative_to(folder)) for p in files]
    labels = [sorted({r.split("/")[0] for r in rels}).index(r.split("/")[0]) for r in rels]
    images, label_col, split, train = [], [], [], []
    for k, (rel, label) in enumerate(zip(rels, labels, strict=True)):
        images.append((folder / rel).read_bytes())
        label_col.append(label)
        split.append("train")
        train.append((rel, label, None))
        if k % 3 == 2:
            images.append((folder / rels[0]).read_bytes())
            label_col.append(0)
            split.append("val")
    for cell, label, reason in ((None, 1, "null_image"), (images[0], None, "bad_label"), (images[1], -3, "bad_label")):
        images.append(cell)
        label_col.append(label)
        split.append("train")
        train.append((None, -1 if reason == "bad_label" else label, reason))
    table = pa.table(
        {
            "image": pa.array(images, pa.binary()),
            "label": pa.array(label_col, pa.int64()),
            "split": split,
            "id": np.arange(len(images)),
        }
    )
    pq.write_table(table, root / "data.parquet", row_group_size=5)
    return {"folder": folder, "parquet": str(root / "data.parquet"), "train": train, "n_all": len(images)}


def _train_dataset(parquet: str):
    """The train rows, through a predicate expression Ray Data pushes into the Parquet scan: ``read_parquet``'s
    own ``filter=`` (a pyarrow expression) is deprecated in Ray 2.52 and refused in 2.60."""
    import ray.data
    from ray.data.expressions import col

    return ray.data.read_parquet(parquet).filter(expr=col("split") == "train")


def _epoch_on_ranks(pipe: Pipeline, epoch: int, world: int = 2):
    """``{sample_id: image}`` emitted and ``{sample_id: reason}`` skipped by every rank of one epoch,
    each id checked to come out of one rank once."""
    images, skipped, seen = {}, {}, []
    for rank in range(world):
        source = EpochSource(pipe, rank=rank, world_size=world, start_epoch=epoch, end_epoch=epoch + 1)
        try:
            for batch in source:
                for sid, img in zip(batch["sample_id"].tolist(), batch["image"], strict=True):
                    images[sid] = np.array(img)
                    seen.append(sid)
            for skip in source.last_report.skipped_paths:
                skipped[skip["sample_id"]] = skip["reason"]
                seen.append(skip["sample_id"])
        finally:
            source.close()
    assert len(seen) == len(set(seen)), "a row came out twice"
    return images, skipped


def _folder_images(folder, ids_files: dict[int, str], epoch: int) -> dict[int, np.ndarray]:
    """The stage's images of ``folder/<file>`` under each sample id (the folder source's reading)."""
    ids = sorted(ids_files)
    rows = {
        "sample_id": np.array(ids, np.int64),
        "label": np.zeros(len(ids), np.int64),
        "path": np.array([ids_files[i] for i in ids], dtype=object),
    }
    spec = StageSpec(
        kind="folder", root=open_root(str(folder)), augment=AUG, decode=DecodeConfig(), seed=SEED, epoch=epoch
    )
    out = augment_block(rows, spec)
    assert out["ok"].all()
    return dict(zip(ids, out["image"], strict=True))


def test_a_filtered_parquet_dataset_runs_exactly_once_on_two_ranks_with_the_folders_pixels(ray_local, data):
    ds = _train_dataset(data["parquet"])
    rows = list_ray_dataset(ds, block_rows=4)
    train = data["train"]
    assert rows.kind == "raydata" and len(rows) == len(train) and rows.num_shards == -(-len(train) // 4)
    assert rows.table.column("path").to_pylist()[:5] == ["block0"] * 4 + ["block1"]
    assert rows.table.column("label").to_pylist() == [lbl for _, lbl, _ in train]
    assert list_ray_dataset(ds, block_rows=4).digest() == rows.digest()  # a second listing: the same ids
    assert open_source(ds, options=ListingOptions(block_rows=4)).digest() == rows.digest()  # the value: the same
    pipe = Pipeline(rows, AUG, config=PipelineConfig(batch_size=4, seed=SEED, max_skip_ratio=1.0))
    for epoch in (0, 1):
        images, skipped = _epoch_on_ranks(pipe, epoch)
        good = {sid: f for sid, (f, _, _) in enumerate(train) if f is not None}
        assert sorted(images) == sorted(good)
        assert skipped == {sid: reason for sid, (_, _, reason) in enumerate(train) if reason is not None}
        want = _folder_images(data["folder"], good, epoch)
        for sid in good:
            np.testing.assert_array_equal(images[sid], want[sid], err_msg=f"sample {sid}, epoch {epoch}")


def test_a_dataset_of_paths_and_class_names_runs_exactly_once_on_two_ranks(ray_local, data):
    import ray.data

    train = [(f, lbl) for f, lbl, _ in data["train"] if f is not None]
    names = ["zebra", "ant", "moth"]  # numbered in sorted order: ant 0, moth 1, zebra 2
    items = [{"path": f, "label": names[lbl]} for f, lbl in train]
    items += [
        {"path": "missing.jpg", "label": "ant"},
        {"path": train[0][0], "label": None},
        {"path": None, "label": "ant"},
    ]
    ds = ray.data.from_items(items)
    with pytest.raises(ValueError, match="holds paths: pass root="):
        open_source(ds)
    rows = open_source(ds, root=str(data["folder"]))
    assert rows.kind == "manifest" and rows.classes == ("ant", "moth", "zebra")
    assert rows.table.column("label").to_pylist() == [sorted(names).index(names[lbl]) for _, lbl in train] + [0, -1, 0]
    pipe = Pipeline(rows, AUG, config=PipelineConfig(batch_size=4, seed=SEED, max_skip_ratio=1.0))
    images, skipped = _epoch_on_ranks(pipe, 0)
    n = len(train)
    assert sorted(images) == list(range(n))
    assert skipped == {n: "missing", n + 1: "bad_label", n + 2: "null_image"}
    want = _folder_images(data["folder"], {sid: f for sid, (f, _) in enumerate(train)}, 0)
    for sid in range(n):
        np.testing.assert_array_equal(images[sid], want[sid], err_msg=f"sample {sid}")


def test_pipeline_takes_a_dataset_and_bad_inputs_are_one_line_errors(ray_local, data, tmp_path):
    import ray.data

    ds = ray.data.read_parquet(data["parquet"])
    pipe = Pipeline(ds, AUG, config=PipelineConfig(batch_size=4))
    assert pipe.rows.kind == "raydata" and len(pipe) == data["n_all"] and pipe.rows.num_shards == 1
    assert pipe.rows.extra["blocks"][0] is not None
    with pytest.raises(ValueError, match="backend='local'") as err:
        from raypipe.config import ExecutionConfig

        Pipeline(pipe.rows, AUG, execution=ExecutionConfig(backend="local"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"ds.write_parquet\(DST\)") as err:
        list_ray_dataset(ds, block_rows=4, max_bytes=50_000)
    assert "\n" not in str(err.value)
    ds.write_parquet(str(tmp_path / "written"))  # what the message says to do: a source raypipe reads
    written = open_source(str(tmp_path / "written"))
    assert written.kind == "parquet" and sorted(written.table.column("label").to_pylist()) == sorted(
        pipe.rows.table.column("label").to_pylist()
    )
    from raypipe.timm import create_loader

    with pytest.raises(ValueError, match=r"Ray Dataset: list it once, rows = raypipe.open_source\(ds\)"):
        create_loader(ds, 32, 4)
    with pytest.raises(ValueError, match="no column 'target'"):
        open_source(ds, label_column="target")
    with pytest.raises(ValueError, match="neither an image column 'pixels' nor a path column 'path'"):
        open_source(ds, image_column="pixels")
    with pytest.raises(ValueError, match="label column 'x' holds double"):
        open_source(ray.data.from_items([{"image": b"x", "x": 1.5}]), label_column="x")


def test_convert_takes_a_dataset(ray_local, data, tmp_path):
    from raypipe.sources.writing.convert import convert

    ds = _train_dataset(data["parquet"])
    report = convert(ds, str(tmp_path / "wds"), format="webdataset", samples_per_shard=5)
    train = data["train"]
    assert [s["reason"] for s in report.skipped] == ["null_image"]  # bad labels are written without one
    written = [(f, lbl) for f, lbl, reason in train if reason != "null_image"]
    assert report.samples == len(written)
    shards = open_source(str(tmp_path / "wds"))
    rows = shards.table.to_pydict()
    assert rows["label"] == [lbl for _, lbl in written]
    read = BlockReader(shards.root, shards.kind).read_block({k: np.asarray(v, dtype=object) for k, v in rows.items()})
    assert [read[k] for k, (f, _) in enumerate(written) if f] == [
        (data["folder"] / f).read_bytes() for f, _ in written if f
    ]
