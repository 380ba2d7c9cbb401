"""Fields through an epoch without Ray: the packer, local worker processes, a mid-epoch resume, the
``DeviceLoader`` and the equal-steps wrapper. Each field's value is a function of its sample's id, so
every batch is checked row by row."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from image_factory import caption_ids, write_captioned_shards

from raypipe.config import EvalAugment, ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.device import DeviceLoader
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.pipeline.pack import BatchSpec, Packer
from raypipe.sources import ListingOptions
from raypipe.stages.field_values import FieldTransformError

pytestmark = pytest.mark.timeout(240)

AUG = TrainAugment(input_size=(24, 24))
LOCAL = dict(backend="local", chunk_rows=4, num_tasks=2)
N = 23


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("captioned")
    write_captioned_shards(out, n=N, per_shard=6, without_txt={9})
    return out


def _pipeline(shards, *, fields=("txt", "json"), transforms=None, batch_size=5, augment=AUG):
    return Pipeline(
        str(shards),
        augment,
        config=PipelineConfig(batch_size=batch_size, seed=3, max_skip_ratio=0.2),
        execution=ExecutionConfig(**LOCAL),
        listing=ListingOptions(fields=fields),
        field_transforms=transforms,
    )


def _check_rows(batch) -> None:
    for k, sid in enumerate(batch["sample_id"].tolist()):
        assert batch["txt"][k] == f"caption {sid}"
        assert batch["json"][k] == {"i": sid}


def _fields_block(ids, ok):
    from test_pack import block

    out = block(ids, ok=ok)
    out["fields"] = {
        "txt": [f"t{i}" if o else None for i, o in zip(ids, ok, strict=True)],
        "vec": np.array([[i, -i] for i in ids], np.int64),
    }
    return out


def test_the_packer_carries_fields_row_by_row_through_views_copies_and_the_partial_batch():
    p = Packer(BatchSpec(4, (2, 3, 3)))
    blocks = [_fields_block([0, 1, 2], [1, 0, 1]), _fields_block(list(range(3, 12)), [1] * 9)]
    blocks.append(_fields_block([12, 13], [1, 1]))
    out = [b for blk in blocks for b in p.add(blk)] + list(p.flush())
    assert [len(b["sample_id"]) for b in out] == [4, 4, 4, 1]
    for b in out:
        ids = b["sample_id"].tolist()
        assert b["txt"] == [f"t{i}" for i in ids]
        np.testing.assert_array_equal(b["vec"], [[i, -i] for i in ids])
        assert b["vec"].dtype == np.int64


def test_fields_arrive_beside_their_images_from_local_workers_and_change_no_batch(shards):
    with_fields = EpochSource(_pipeline(shards), end_epoch=1)
    plain = EpochSource(_pipeline(shards, fields=()), end_epoch=1)
    got, want = list(with_fields), list(plain)
    for b in got:
        _check_rows(b)
        assert isinstance(b["txt"], list) and all(isinstance(t, str) for t in b["txt"])
    seen = [i for b in got for i in b["sample_id"].tolist()]
    assert sorted(seen) == [i for i in range(N) if i != 9]  # 9 has no caption: skipped, counted
    assert with_fields.reports[0].skipped == {"missing_field": 1}
    # the sample without a caption is the only difference: every other image, label and place is the same
    plain_rows = [(i, b["image"][k].tobytes()) for b in want for k, i in enumerate(b["sample_id"].tolist()) if i != 9]
    field_rows = [(i, b["image"][k].tobytes()) for b in got for k, i in enumerate(b["sample_id"].tolist())]
    assert field_rows == plain_rows
    with_fields.close()
    plain.close()


def test_a_transformed_field_is_one_array_per_batch_and_resumes_mid_epoch_exactly(shards):
    whole = EpochSource(_pipeline(shards, transforms={"txt": caption_ids}), end_epoch=1)
    want = [(b["sample_id"].tolist(), b["txt"].copy(), b["json"]) for b in whole]
    whole.close()
    for _, ids, _ in [want[0]]:
        assert ids.shape == (5, 16) and ids.dtype == np.int64
    first = EpochSource(_pipeline(shards, transforms={"txt": caption_ids}), end_epoch=1)
    it = iter(first)
    seen = [(b["sample_id"].tolist(), b["txt"].copy(), b["json"]) for b in (next(it), next(it))]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    again = EpochSource(_pipeline(shards, transforms={"txt": caption_ids}), end_epoch=1)
    again.load_state_dict(state)
    rest = [(b["sample_id"].tolist(), b["txt"].copy(), b["json"]) for b in again]
    again.close()
    assert len(seen + rest) == len(want)
    for (ids_a, txt_a, js_a), (ids_b, txt_b, js_b) in zip(seen + rest, want, strict=True):
        assert ids_a == ids_b and js_a == js_b
        np.testing.assert_array_equal(txt_a, txt_b)
        for k, sid in enumerate(ids_a):
            np.testing.assert_array_equal(txt_a[k], caption_ids(f"caption {sid}"))


def _raises_on_twelve(text: str) -> str:
    if text == "caption 12":
        raise ZeroDivisionError("twelve")
    return text


def test_a_failing_transform_on_a_worker_fails_the_epoch_naming_sample_and_field(shards):
    source = EpochSource(_pipeline(shards, transforms={"txt": _raises_on_twelve}), end_epoch=1)
    with pytest.raises(FieldTransformError, match=r"'txt'.*sample 12.*ZeroDivisionError"):
        list(source)
    source.close()


def test_the_device_loader_moves_numeric_fields_with_the_image_and_passes_the_others(shards):
    source = EpochSource(_pipeline(shards, transforms={"txt": caption_ids}), end_epoch=1)
    for batch in DeviceLoader(source, device="cpu"):
        assert isinstance(batch["txt"], torch.Tensor) and batch["txt"].dtype == torch.int64
        for k, sid in enumerate(batch["sample_id"].tolist()):
            assert batch["txt"][k].tolist() == caption_ids(f"caption {sid}").tolist()
            assert batch["json"][k] == {"i": sid}
    source.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_device_loader_moves_numeric_fields_to_the_gpu(shards):
    source = EpochSource(_pipeline(shards, transforms={"txt": caption_ids}), end_epoch=1)
    for batch in DeviceLoader(source, device="cuda"):
        assert batch["txt"].is_cuda and batch["image"].is_cuda
        torch.cuda.current_stream().synchronize()
        for k, sid in enumerate(batch["sample_id"].tolist()):
            assert batch["txt"][k].tolist() == caption_ids(f"caption {sid}").tolist()
    source.close()


def test_an_eval_epoch_padded_to_equal_steps_pads_the_fields_too(shards):
    from raypipe.integrations.epochs import EqualBatches

    pipe = _pipeline(shards, augment=EvalAugment(input_size=(24, 24)), batch_size=4)
    source = EqualBatches(EpochSource(pipe, end_epoch=1), batch_size=4, num_batches=6, pad_to=24)
    batches = list(source)
    assert sum(len(b["sample_id"]) for b in batches) == 24
    for b in batches:
        assert len(b["txt"]) == len(b["json"]) == len(b["sample_id"])
        real = b["sample_id"] >= 0
        kept = {k: [v for v, r in zip(b[k], real, strict=True) if r] for k in ("txt", "json")}
        _check_rows({**kept, "sample_id": b["sample_id"][real]})
    padded = [t for b in batches for t, i in zip(b["txt"], b["sample_id"], strict=True) if i < 0]
    assert padded and all(t.startswith("caption ") for t in padded)  # padding rows repeat real ones


def test_a_rank_loader_yields_the_fields_last_as_a_dict(shards):
    from raypipe.integrations import RankLoader

    pipe = _pipeline(shards, augment=EvalAugment(input_size=(24, 24)), batch_size=4)
    with RankLoader(pipe, training=False, yield_ids=True) as loader:
        rows = 0
        for image, label, sample_id, fields in loader:
            real = sample_id >= 0
            rows += int(real.sum())
            kept = {k: [v for v, r in zip(fields[k], real.tolist(), strict=True) if r] for k in ("txt", "json")}
            _check_rows({**kept, "sample_id": sample_id[real]})
            assert image.shape[0] == len(fields["txt"]) == len(label)
    assert rows == N - 1  # every row but the one without a caption
