"""Several labels per image: a Parquet ``list<int64>`` label column listed as label sets, made into
multi-hot rows on the workers, packed, mixed and smoothed as timm mixes soft targets."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from image_factory import captioned_jpeg

from raypipe.config import EvalAugment, ExecutionConfig, PipelineConfig
from raypipe.device import DeviceLoader
from raypipe.device.mixup import Mixup, mixup_target
from raypipe.device.producer import check_labels
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.pipeline.pack import BatchSpec, Packer
from raypipe.sources import open_source
from raypipe.sources.label_sets import LABELS, multi_hot

SETS = [[0, 3], [1], [], [2, 4, 1], None, [5, -1], [4], [0, 1, 2, 3, 4]]  # None, -1: bad rows


def sets_of(i: int) -> list[int]:
    return SETS[i % len(SETS)]


def _parquet(path, n=16):
    table = pa.table(
        {
            "image": [captioned_jpeg(i) for i in range(n)],
            "label": pa.array([sets_of(i) for i in range(n)], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, path, row_group_size=5)
    return path


def _bad(i: int) -> bool:
    s = sets_of(i)
    return s is None or any(v < 0 for v in s)


def test_a_list_label_column_is_listed_as_label_sets_and_bad_sets_are_bad_labels(tmp_path):
    rows = open_source(str(_parquet(tmp_path / "d.parquet")))
    assert rows.multi_label and rows.num_classes == 5  # the good sets hold ids 0..4; [5, -1] is a bad row
    errors = rows.table.column("error").to_pylist()
    assert [bool(e) for e in errors] == [_bad(i) for i in range(16)]
    assert all(e.startswith("bad_label") for e in errors if e)
    good = rows.table.column(LABELS).to_pylist()
    assert [s for i, s in enumerate(good) if not _bad(i)] == [sets_of(i) for i in range(16) if not _bad(i)]


def test_the_digest_sees_the_label_sets(tmp_path):
    a = open_source(str(_parquet(tmp_path / "a.parquet")))
    pq.write_table(
        pa.table(
            {"image": [captioned_jpeg(i) for i in range(16)], "label": pa.array([[0]] * 16, pa.list_(pa.int64()))}
        ),
        tmp_path / "b.parquet",
        row_group_size=5,
    )
    b = open_source(str(tmp_path / "b.parquet"))
    assert a.digest() != b.digest()
    assert a.digest() == open_source(str(tmp_path / "a.parquet")).digest()


def test_batches_carry_each_images_multi_hot_row(tmp_path):
    rows = open_source(str(_parquet(tmp_path / "d.parquet")))
    pipe = Pipeline(
        rows,
        EvalAugment(input_size=(16, 16)),
        config=PipelineConfig(batch_size=4, max_skip_ratio=0.5),
        execution=ExecutionConfig(backend="local", num_tasks=1, chunk_rows=6),
        num_classes=8,
    )
    source = EpochSource(pipe, end_epoch=1)
    seen = []
    for batch in source:
        assert batch["label"].shape == (len(batch["sample_id"]), 8) and batch["label"].dtype == np.uint8
        for k, sid in enumerate(batch["sample_id"].tolist()):
            np.testing.assert_array_equal(batch["label"][k], multi_hot([sets_of(sid)], 8)[0])
            seen.append(sid)
    source.close()
    assert sorted(seen) == [i for i in range(16) if not _bad(i)]
    assert source.reports[0].skipped == {"bad_label": sum(_bad(i) for i in range(16))}
    with pytest.raises(ValueError, match="num_classes"):
        Pipeline(rows, EvalAugment(input_size=(16, 16)), num_classes=3)  # narrower than the ids


def test_the_packer_packs_multi_hot_rows_through_views_and_copies():
    def block(ids, ok):
        n = len(ids)
        return {
            "image": np.zeros((n, 2, 2, 3), np.uint8),
            "label": multi_hot([[i % 5] for i in ids], 5),
            "sample_id": np.asarray(ids, np.int64),
            "ok": np.asarray(ok, bool),
            "reason": np.full(n, "", object),
            "detail": np.full(n, "", object),
            "path": np.full(n, "", object),
        }

    p = Packer(BatchSpec(3, (2, 2, 3)))
    out = [b for blk in (block([0, 1], [1, 0]), block(list(range(2, 9)), [1] * 7)) for b in p.add(blk)]
    out += list(p.flush())
    assert [len(b["sample_id"]) for b in out] == [3, 3, 2]
    for b in out:
        np.testing.assert_array_equal(b["label"], multi_hot([[i % 5] for i in b["sample_id"].tolist()], 5))


def test_multi_hot_targets_are_smoothed_and_mixed_as_timms_soft_targets():
    y = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0]])
    smoothed = mixup_target(y, 4, 1.0, smoothing=0.2)
    off, on = 0.2 / 4, 1 - 0.2 + 0.2 / 4
    torch.testing.assert_close(smoothed, torch.where(y.bool(), on, off).float())
    mixed = mixup_target(y, 4, 0.7, smoothing=0.0)
    torch.testing.assert_close(mixed, 0.7 * y.float() + 0.3 * y.flip(0).float())
    # one-label targets unchanged: the one-hot case is the multi-hot case of a single id
    torch.testing.assert_close(
        mixup_target(torch.tensor([2, 0]), 4, 0.6, 0.1), mixup_target(multi_hot_t([2, 0], 4), 4, 0.6, 0.1)
    )
    check_labels(y, 4)
    with pytest.raises(ValueError, match="multi-hot"):
        check_labels(y, 5)
    with pytest.raises(ValueError, match="multi-hot"):
        check_labels(y * 2, 4)


def multi_hot_t(ids, c):
    return torch.from_numpy(multi_hot([[i] for i in ids], c))


def test_the_device_loader_mixes_multi_hot_labels(tmp_path):
    rows = open_source(str(_parquet(tmp_path / "d.parquet")))
    pipe = Pipeline(
        rows,
        EvalAugment(input_size=(16, 16)),
        config=PipelineConfig(batch_size=4, max_skip_ratio=0.5),
        execution=ExecutionConfig(backend="local", num_tasks=1),
    )
    source = EpochSource(pipe, end_epoch=1)
    mix = Mixup(mixup_alpha=0.4, num_classes=5, label_smoothing=0.0, mode="batch")
    for batch in DeviceLoader(source, device="cpu", mixup=mix, seed=1):
        y = batch["label"]
        assert y.shape == (len(batch["sample_id"]), 5) and y.dtype == torch.float32
        hot = torch.from_numpy(multi_hot([sets_of(i) for i in batch["sample_id"].tolist()], 5)).float()
        differ = hot != hot.flip(0)
        if differ.any():  # y = lam * hot + (1 - lam) * flipped, one lam for the batch ("batch" mode)
            lam = (y - hot.flip(0))[differ] / (hot - hot.flip(0))[differ]
            torch.testing.assert_close(lam, torch.full_like(lam, float(lam[0])))
        torch.testing.assert_close(y[~differ], hot[~differ])
    source.close()


def test_preview_shows_each_images_set_of_labels(tmp_path, capsys):
    from raypipe.cli.main import main as cli
    from raypipe.cli.preview import _label_text

    assert _label_text(np.array([0, 1, 0, 1, 1], np.uint8), ()) == "1+3+4"
    assert _label_text(np.zeros(3, np.uint8), ()) == "-"
    assert _label_text(np.int64(2), ("a", "b", "c")) == "2:c"
    data = _parquet(tmp_path / "d.parquet")
    assert cli(["preview", str(data), "--out", str(tmp_path / "g.png"), "--count", "4", "--eval"]) == 0
    assert "wrote 4 samples" in capsys.readouterr().out


def test_a_jsonl_manifest_of_label_lists_is_listed_as_label_sets(tmp_path):
    import json

    for i in range(4):
        (tmp_path / f"{i}.jpg").write_bytes(captioned_jpeg(i))
    sets = [[0, 2], [1], [-1], []]
    lines = [json.dumps({"path": f"{i}.jpg", "label": s}) for i, s in enumerate(sets)]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    rows = open_source(str(tmp_path / "m.jsonl"))
    assert rows.multi_label and rows.num_classes == 3
    assert [bool(e) for e in rows.table.column("error").to_pylist()] == [False, False, True, False]
    assert rows.table.column(LABELS).to_pylist() == [[0, 2], [1], [], []]


CLS = ["3 17", "5", "2,x", "-1 2", "1, 4", "", "0"]  # "2,x", "-1 2", "": bad labels


def _cls_shards(root):
    from image_factory import write_shard

    members = []
    for i, text in enumerate(CLS):
        members += [(f"{i:04d}.jpg", captioned_jpeg(i)), (f"{i:04d}.cls", text.encode())]
    write_shard(root / "multi-000.tar", members)
    write_shard(root / "multi-001.tar", [("long.jpg", captioned_jpeg(9)), ("long.cls", b" ".join([b"1"] * 3000))])
    return root


def test_a_webdataset_cls_of_several_ids_is_listed_as_label_sets(tmp_path):
    rows = open_source(str(_cls_shards(tmp_path / "shards")))
    assert rows.multi_label and rows.num_classes == 18
    assert rows.table.column(LABELS).to_pylist() == [[3, 17], [5], [], [], [1, 4], [], [0], []]
    errors = rows.table.column("error").to_pylist()
    assert [e is not None for e in errors] == [False, False, True, True, False, True, False, True]
    assert "'2,x'" in errors[2] and "holds -1" in errors[3] and "<5999 bytes>" in errors[7]
    pipe = Pipeline(
        rows,
        EvalAugment(input_size=16),
        config=PipelineConfig(batch_size=8, shuffle=False, max_skip_ratio=None),
        execution=ExecutionConfig(backend="local", num_tasks=1),
    )
    (batch,) = list(pipe.epoch(0))
    assert batch["label"].shape == (4, 18)
    assert [np.flatnonzero(r).tolist() for r in batch["label"]] == [[3, 17], [5], [1, 4], [0]]


def test_an_index_of_cls_sets_is_refused_in_one_line(tmp_path):
    from raypipe.sources.indexes.indexer import index_shards

    root = _cls_shards(tmp_path / "shards")
    with pytest.raises(ValueError, match="several class ids; an index holds one label a sample"):
        index_shards(str(root), use_ray=False)
