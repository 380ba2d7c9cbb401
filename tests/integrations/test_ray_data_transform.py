"""``RayDataAugment``: raypipe's decode + augment as a Ray Data ``map_batches`` transform, seeded by
(seed, epoch, sample id): the same pixels whatever the batches, the same as raypipe's own stream."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.config import PipelineConfig, TrainAugment
from raypipe.integrations.ray_data import REASON_CODES, REASON_NAMES, RayDataAugment
from raypipe.kernels.errors import REASONS
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.sample_data import write_sample_data
from raypipe.sources import list_ray_dataset

pytestmark = pytest.mark.timeout(300)

AUG = TrainAugment(input_size=32)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    """10 photos, then a row of null bytes, one of empty bytes and one with a null label; ``id`` is the
    row's index (so the listing's sample ids and the id column agree)."""
    root = tmp_path_factory.mktemp("transform")
    files = write_sample_data(root / "folder", classes=2, per_class=5, seed=4)
    images = [p.read_bytes() for p in files] + [None, b"", files[0].read_bytes()]
    labels = [k % 2 for k in range(len(files))] + [0, 1, None]
    table = pa.table(
        {
            "image": pa.array(images, pa.binary()),
            "label": pa.array(labels, pa.int64()),
            "id": np.arange(len(images), dtype=np.int64),
        }
    )
    pq.write_table(table, root / "data.parquet")
    return {"path": str(root / "data.parquet"), "folder": root / "folder", "files": files, "good": len(files)}


def _transformed(ds, *, epoch: int, batch_size: int, batch_format: str = "numpy", **kwargs) -> dict:
    """``{id: (label, image)}`` of every row the transform gives, and the rows' reasons when kept."""
    import ray.data

    out = ds.map_batches(
        RayDataAugment,
        batch_size=batch_size,
        batch_format=batch_format,
        compute=ray.data.ActorPoolStrategy(size=1),
        fn_constructor_kwargs=dict(augment=AUG, seed=3, epoch=epoch, id_column="id", **kwargs),
    )
    got = {}
    for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
        for k, sid in enumerate(batch["sample_id"].tolist()):
            assert sid not in got
            reason = REASON_NAMES[int(batch["reason"][k])] if "reason" in batch else None
            got[sid] = (int(batch["label"][k]), np.array(batch["image"][k]), reason)
    return got


def test_same_seed_epoch_and_id_give_the_same_pixels_as_raypipes_stream(ray_local, parquet):
    import ray.data

    ds = ray.data.read_parquet(parquet["path"])
    small = _transformed(ds, epoch=1, batch_size=3)
    large = _transformed(ds, epoch=1, batch_size=5, batch_format="pyarrow")
    good = parquet["good"]
    assert sorted(small) == sorted(large) == list(range(good))  # the bad rows are dropped
    for sid in range(good):
        assert small[sid][0] == large[sid][0] == sid % 2
        np.testing.assert_array_equal(small[sid][1], large[sid][1], err_msg=f"sample {sid}")
        assert small[sid][1].shape == (32, 32, 3) and small[sid][1].dtype == np.uint8
    # raypipe's own stream, epoch 1 at seed 3: the listing numbers the rows as the id column does
    pipe = Pipeline(
        list_ray_dataset(ds, block_rows=4), AUG, config=PipelineConfig(batch_size=4, seed=3, max_skip_ratio=1.0)
    )
    source = EpochSource(pipe, start_epoch=1, end_epoch=2)
    try:
        stream = {
            sid: np.array(img) for b in source for sid, img in zip(b["sample_id"].tolist(), b["image"], strict=True)
        }
    finally:
        source.close()
    assert sorted(stream) == list(range(good))
    for sid in range(good):
        np.testing.assert_array_equal(small[sid][1], stream[sid], err_msg=f"sample {sid}")
    other = _transformed(ds, epoch=0, batch_size=5)
    assert any(not np.array_equal(other[sid][1], small[sid][1]) for sid in range(good))  # the epoch is in the seed


def test_bad_rows_are_kept_with_their_reasons_when_asked(ray_local, parquet):
    import ray.data

    ds = ray.data.read_parquet(parquet["path"])
    kept = _transformed(ds, epoch=0, batch_size=4, bad_rows="keep")
    good = parquet["good"]
    assert {sid: reason for sid, (_, _, reason) in kept.items() if reason} == {
        good: "null_image",
        good + 1: "empty",
        good + 2: "bad_label",
    }
    assert not kept[good][1].any() and kept[good + 2][0] == -1  # black, and no label
    with pytest.raises(ValueError, match="bad_rows='skip'"):
        RayDataAugment(AUG, seed=0, epoch=0, bad_rows="skip")
    with pytest.raises(ValueError, match="needs bad_rows"):
        RayDataAugment(AUG, seed=0, epoch=0, details=True)


def test_kept_bad_rows_go_into_iter_torch_batches(ray_local, parquet):
    """``bad_rows="keep"`` gives numbers only (``reason`` a code of ``REASON_CODES``), so the kept Dataset
    goes straight into ``iter_torch_batches``; the check before training (count the skips by reason)
    works on the same columns."""
    import ray.data
    import torch

    ds = ray.data.read_parquet(parquet["path"]).map_batches(
        RayDataAugment,
        batch_size=4,
        compute=ray.data.ActorPoolStrategy(size=1),
        fn_constructor_kwargs=dict(augment=AUG, seed=3, epoch=0, id_column="id", bad_rows="keep"),
    )
    good = parquet["good"]
    reasons = {}
    for batch in ds.iter_torch_batches(batch_size=5):
        assert batch["image"].dtype == torch.uint8 and batch["ok"].dtype == torch.bool
        for sid, ok, code in zip(
            batch["sample_id"].tolist(), batch["ok"].tolist(), batch["reason"].tolist(), strict=True
        ):
            assert ok == (code == 0)
            reasons[sid] = REASON_NAMES[code]
    assert reasons == {**dict.fromkeys(range(good), ""), good: "null_image", good + 1: "empty", good + 2: "bad_label"}
    counts = {REASON_NAMES[row["reason"]]: row["count()"] for row in ds.groupby("reason").count().take_all()}
    assert counts == {"": good, "null_image": 1, "empty": 1, "bad_label": 1}


def test_every_skip_reason_has_its_own_fixed_code():
    assert set(REASON_CODES) == {"", *REASONS} and len(set(REASON_CODES.values())) == len(REASON_CODES)
    assert REASON_CODES[""] == 0 and max(REASON_CODES.values()) < 128  # int8
    assert all(REASON_NAMES[code] == name for name, code in REASON_CODES.items())


def test_a_path_column_is_read_under_root(ray_local, parquet):
    import ray.data

    folder = parquet["folder"]
    rels = [str(p.relative_to(folder)) for p in parquet["files"]]
    ds = ray.data.from_items([{"path": rel, "label": k % 2, "id": k} for k, rel in enumerate(rels)])
    by_path = _transformed(ds, epoch=1, batch_size=4, image_column="path", root=str(folder))
    by_bytes = _transformed(ray.data.read_parquet(parquet["path"]), epoch=1, batch_size=4)
    assert sorted(by_path) == list(range(len(rels)))
    for sid in by_path:
        np.testing.assert_array_equal(by_path[sid][1], by_bytes[sid][1], err_msg=f"sample {sid}")
    with pytest.raises(ValueError, match="holds paths: pass root="):
        RayDataAugment(AUG, seed=0, epoch=0, image_column="path")(
            {
                "path": np.array(rels[:1], dtype=object),
                "label": np.zeros(1, np.int64),
                "sample_id": np.zeros(1, np.int64),
            }
        )


def test_ids_must_be_integers_and_class_names_need_classes():
    images = np.array([b"x", b"y"], dtype=object)
    transform = RayDataAugment(AUG, seed=0, epoch=0)
    with pytest.raises(ValueError, match="id column 'sample_id' holds float64"):
        transform({"image": images, "label": np.zeros(2, np.int64), "sample_id": np.array([0.0, np.nan])})
    with pytest.raises(ValueError, match="pass classes="):
        transform({"image": images, "label": np.array(["cat", "dog"], dtype=object), "sample_id": np.arange(2)})
    named = RayDataAugment(AUG, seed=0, epoch=0, classes=["cat", "dog"], bad_rows="keep", details=True)
    out = named({"image": images, "label": np.array(["dog", "cow"], dtype=object), "sample_id": np.arange(2)})
    assert out["label"].tolist() == [1, -1]
    assert [REASON_NAMES[c] for c in out["reason"]] == ["not_an_image", "bad_label"]
    assert out["detail"].tolist()[1] == "label 'cow'"
