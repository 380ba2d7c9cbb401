"""raypipe.timm.create_loader: timm's arguments, timm's classes and eval bytes, timm's training loop."""

from __future__ import annotations

import io
import math
from pathlib import Path

import image_factory as f
import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import FastCollateMixup, create_dataset, create_transform
from timm_loop import Args, set_loader_epoch, train_one_epoch, validate

from raypipe.config import EvalAugment, ExecutionConfig
from raypipe.integrations.timm_loader import augment_of, execution_for, rows_of
from raypipe.kernels import build_transform, geometry
from raypipe.timm import create_loader


def _folder(root: Path, classes: dict[str, int], size=(48, 40)) -> Path:
    for c, count in classes.items():
        (root / c).mkdir(parents=True)
        for i in range(count):
            img = np.roll(f.photo("chelsea", size), 7 * i + 3 * len(c), axis=1)
            (root / c / f"img{i}.jpg").write_bytes(f.encode(img))
    return root


@pytest.fixture(scope="module")
def folder33(tmp_path_factory):
    return _folder(tmp_path_factory.mktemp("f33"), {"c1": 11, "c2": 11, "c10": 11})


# -- arguments -------------------------------------------------------------------------------------


def test_signature_mirrors_timms():
    import inspect

    import timm.data

    theirs = list(inspect.signature(timm.data.create_loader).parameters)
    ours = inspect.signature(create_loader).parameters
    assert list(ours)[: len(theirs)] == theirs  # same names, same order: positional calls work too
    assert all(p.kind is p.KEYWORD_ONLY for p in list(ours.values())[len(theirs) :])


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_aug_splits": 2}, "num_aug_splits"),
        ({"num_aug_repeats": 3}, "num_aug_repeats"),
        ({"tf_preprocessing": True}, "tf_preprocessing"),
        ({"crop_border_pixels": 4}, "crop_border_pixels"),
        ({"train_crop_mode": "rkrr"}, "train_crop_mode"),
        ({"input_size_choices": [32, 48]}, "input_size_choices"),
        ({"batch_size_choices": [8]}, "batch_size_choices"),
        ({"num_batches": 10}, "num_batches"),
        ({"collate_fn": lambda batch: batch}, "collate_fn"),
        ({"mean": (0.5,), "std": (0.5,)}, "mean"),
    ],
)
def test_refuses_what_it_cannot_honour(folder33, kwargs, name):
    with pytest.raises(ValueError, match=name):
        create_loader(str(folder33), (3, 32, 32), 8, is_training=True, device="cpu", **kwargs)


@pytest.mark.parametrize(
    "given, device, sched_idle",
    [
        (None, "cuda", True),
        (None, torch.device("cuda:0"), True),
        (None, "cpu", False),
        (ExecutionConfig(worker_sched_idle=False, worker_nice=3), "cuda", False),
        (ExecutionConfig(worker_sched_idle=True), "cpu", True),
    ],
)
def test_workers_idle_policy_follows_the_device_unless_given(given, device, sched_idle):
    # as the training job decides it: SCHED_IDLE augmentation beside a CUDA trainer, never beside a CPU one
    resolved = execution_for(given, device)
    assert resolved.worker_sched_idle is sched_idle
    assert resolved.worker_nice == (given or ExecutionConfig()).worker_nice


def test_cpu_loader_runs_its_workers_at_normal_policy(folder33):
    loader = create_loader(
        str(folder33),
        input_size=32,
        batch_size=4,
        is_training=True,
        device=torch.device("cpu"),
        execution=ExecutionConfig(backend="local"),
    )
    try:
        assert loader.pipeline.execution.worker_sched_idle is False
    finally:
        loader.close()


@pytest.mark.needs_cuda
def test_cuda_loader_runs_its_workers_idle_policy(folder33):
    loader = create_loader(
        str(folder33),
        input_size=32,
        batch_size=4,
        is_training=True,
        device=torch.device("cuda"),
        execution=ExecutionConfig(backend="local"),
    )
    try:
        assert loader.pipeline.execution.worker_sched_idle is True
        x, y = next(iter(loader))
        assert x.device.type == "cuda" and tuple(x.shape) == (4, 3, 32, 32)
    finally:
        loader.close()


def test_refuses_timm_datasets_it_cannot_read_and_lone_distributed():
    with pytest.raises(ValueError, match="image folders"):
        create_loader(object(), 32, 8, device="cpu")
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        create_loader("/nonexistent", 32, 8, device="cpu", distributed=True)


def test_timm_dataset_gives_timms_class_indices(folder33, tmp_path):
    ds = create_dataset("", root=str(folder33))
    rows, shown = rows_of(ds)
    assert shown is ds
    assert ds.reader.class_to_idx == {"c1": 0, "c2": 1, "c10": 2}  # natural order, timm's
    by_path = dict(zip(rows.table.column("path").to_pylist(), rows.table.column("label").to_pylist(), strict=True))
    assert by_path == {str(Path(p).relative_to(folder33)): t for p, t in ds.reader.samples}
    # a class map given to timm's create_dataset carries over
    (tmp_path / "map.txt").write_text("c10\nc2\nc1\n")
    mapped = create_dataset("", root=str(folder33), class_map=str(tmp_path / "map.txt"))
    rows, _ = rows_of(mapped)
    assert set(rows.table.column("label").to_pylist()) == {0, 1, 2}
    labels = dict(zip(rows.table.column("path").to_pylist(), rows.table.column("label").to_pylist(), strict=True))
    assert {p: t for p, t in labels.items() if p.startswith("c10/")} == {p: 0 for p in by_path if p.startswith("c10/")}


def test_timm_dataset_with_files_raypipe_does_not_list_is_refused(folder33, tmp_path):
    nested = _folder(tmp_path / "nested", {"a/x": 2, "b": 2})  # timm names leaf folders, raypipe top-level ones
    with pytest.raises(ValueError, match="differ"):
        rows_of(create_dataset("", root=str(nested)))


def test_transforms_are_timms_defaults():
    assert augment_of((3, 32, 32), is_training=False) == EvalAugment(input_size=32, crop_pct=0.875)
    train = augment_of((3, 32, 32), is_training=True, grayscale_prob=None, gaussian_blur_prob=None)
    assert train.scale == (0.08, 1.0) and train.grayscale_prob == 0.0 and train.color_jitter == (0.4,) * 3
    with pytest.raises(ValueError, match="interpolation"):  # timm's eval has no 'random' either
        augment_of(32, is_training=False, interpolation="random")


@pytest.mark.skipif(geometry._resample is None, reason="the _resample C extension is not built")
@pytest.mark.parametrize("input_size", [(3, 40, 56), 48])
def test_no_aug_training_is_timms_bytes(input_size):
    ours = build_transform(augment_of(input_size, is_training=True, no_aug=True, interpolation="random"))
    theirs = create_transform(input_size, is_training=True, no_aug=True, interpolation="random", use_prefetcher=True)
    for name in f.PHOTOS:
        data = f.photo_jpeg(name, (300, 220))
        ref = theirs(Image.open(io.BytesIO(data)).convert("RGB")).permute(1, 2, 0).numpy()
        assert np.array_equal(ours(data), ref), name


# -- with Ray --------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_timm_train_loop_runs_an_epoch(ray_local, folder33):
    """The loop of timm's train.py (tests/integrations/timm_loop.py), fed by the drop-in as train.py would build it."""
    import timm
    from timm.loss import SoftTargetCrossEntropy

    ds_train = create_dataset("", root=str(folder33), is_training=True)
    ds_eval = create_dataset("", root=str(folder33))
    mixup = FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=3)
    common = dict(
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        pin_memory=False,
        img_dtype=torch.float32,
        device=torch.device("cpu"),
        distributed=False,
        use_prefetcher=True,
    )
    train = create_loader(
        ds_train,
        input_size=(3, 32, 32),
        batch_size=8,
        is_training=True,
        re_prob=0.25,
        re_mode="pixel",
        re_count=1,
        re_split=False,
        scale=None,
        ratio=None,
        hflip=0.5,
        vflip=0.0,
        color_jitter=0.4,
        color_jitter_prob=None,
        grayscale_prob=None,
        gaussian_blur_prob=None,
        auto_augment="rand-m9-mstd0.5-inc1",
        num_aug_repeats=0,
        num_aug_splits=0,
        interpolation="random",
        num_workers=4,
        worker_seeding="all",
        collate_fn=mixup,
        use_multi_epochs_loader=False,
        input_size_choices=None,
        batch_size_choices=None,
        batch_choice_seed=42,
        num_batches=None,
        **common,
    )
    evaluate = create_loader(
        ds_eval,
        input_size=(3, 32, 32),
        batch_size=16,
        is_training=False,
        interpolation="bicubic",
        num_workers=4,
        crop_pct=0.9,
        **common,
    )
    try:
        assert len(train) == 33 // 8 and len(evaluate) == math.ceil(33 / 16)
        assert train.mixup_enabled and train.dataset is ds_train and train.batch_sampler is None
        torch.manual_seed(0)
        model = timm.create_model("resnet10t", pretrained=False, num_classes=3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        args = Args(mixup_off_epoch=3, channels_last=True, grad_accum_steps=2)
        set_loader_epoch(train, 3)  # e.g. a resume at epoch 3: the source must be there too
        out = train_one_epoch(3, model, train, optimizer, SoftTargetCrossEntropy(), args)
        assert out["batches"] == len(train) and np.isfinite(out["loss"])
        assert train.last_report.epoch == 3 and train.last_report.emitted == 32 and train.last_report.dropped_last == 1
        assert not train.mixup_enabled  # --mixup-off-epoch reached
        metrics = validate(model, evaluate, torch.nn.CrossEntropyLoss(), args)
        assert metrics["batches"] == len(evaluate) and 0 <= metrics["top1"] <= 100
        assert evaluate.last_report.emitted == 33 and evaluate.sampler.num_valid_samples == 33
    finally:
        train.close()
        evaluate.close()


@pytest.mark.timeout(600)
def test_eval_batches_equal_timms_loader(ray_local, folder33):
    """Eval through the drop-in gives the tensors timm's own create_loader gives (same image, same
    label, normalised), for every image."""
    import timm.data

    ds = create_dataset("", root=str(folder33))
    kwargs = dict(
        input_size=(3, 40, 40),
        batch_size=16,
        is_training=False,
        interpolation="bicubic",
        crop_pct=0.9,
        device=torch.device("cpu"),
        num_workers=0,
    )
    ours = create_loader(ds, yield_ids=True, **kwargs)
    try:
        got = {}
        for x, y, ids in ours:
            for i, sid in enumerate(ids.tolist()):
                got[sid] = (x[i], int(y[i]))
    finally:
        ours.close()
    rows, _ = rows_of(ds)
    path_of = dict(zip(rows.table.column("sample_id").to_pylist(), rows.table.column("path").to_pylist(), strict=True))
    theirs = timm.data.create_loader(create_dataset("", root=str(folder33)), **kwargs)
    ref = {}
    k = 0
    for x, y in theirs:
        for i in range(x.shape[0]):
            path = str(Path(ds.reader.samples[k][0]).relative_to(folder33))
            ref[path] = (x[i], int(y[i]))
            k += 1
    assert len(got) == len(ref) == 33
    for sid, (img, label) in got.items():
        ref_img, ref_label = ref[path_of[sid]]
        assert label == ref_label
        torch.testing.assert_close(img, ref_img, rtol=0, atol=1e-5)


@pytest.mark.timeout(600)
def test_eval_across_two_ranks_every_image_once(ray_local, folder33):
    loaders = [
        create_loader(str(folder33), (3, 32, 32), 8, device="cpu", rank=r, world_size=2, yield_ids=True) for r in (0, 1)
    ]
    try:
        seen, counts = [], []
        for ld in loaders:
            batches = [ids.tolist() for _, _, ids in ld]
            counts.append(len(batches))
            ids = [i for b in batches for i in b]
            assert len(ids) == len(ld.sampler) == 17
            seen.append([i for i in ids if i >= 0])
            assert len(seen[-1]) == ld.sampler.num_valid_samples
        assert counts == [len(loaders[0])] * 2 == [3, 3]
        assert sorted(seen[0] + seen[1]) == list(range(33))
    finally:
        for ld in loaders:
            ld.close()
