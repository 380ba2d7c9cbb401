"""``create_loader`` with timm's signature (timm 1.0.31), batches made on a Ray cluster.

timm's ``train.py`` switches to raypipe by importing this ``create_loader`` after timm's (docs/timm.md).
Every argument of timm's function is accepted; each is honoured, has no effect by design (said
below), or raises ``ValueError`` naming it:

- honoured: ``input_size``, ``batch_size``, ``is_training``, ``no_aug``, ``re_prob``, ``re_mode``,
  ``re_count``, ``re_split``, ``scale``, ``ratio``, ``hflip``, ``vflip``, ``color_jitter``,
  ``color_jitter_prob``, ``grayscale_prob``, ``gaussian_blur_prob``, ``auto_augment``,
  ``interpolation``, ``mean``, ``std``, ``distributed``, ``crop_pct``, ``crop_mode``,
  ``collate_fn`` (None, timm's ``fast_collate``, or a timm ``Mixup`` / ``FastCollateMixup``, whose
  settings become raypipe's device ``Mixup``), ``pin_memory``, ``fp16``, ``img_dtype``, ``device``,
  ``use_prefetcher`` (either way batches arrive normalised on ``device``), ``train_crop_mode``
  (None or "rrc"), ``batch_choice_seed`` (the seed when ``seed`` is not given: timm's ``train.py``
  passes its ``--seed`` there).
- no effect: ``num_workers``, ``persistent_workers``, ``use_multi_epochs_loader``, ``worker_seeding``
  (raypipe sizes its workers from the cluster, keeps one stream for the whole run and seeds every
  sample by ``(seed, epoch, sample_id)``), and the ``batch_*`` schedule settings when
  ``input_size_choices`` is None (as in timm).
- ``ValueError``: ``num_aug_splits > 0``, ``num_aug_repeats > 0``, ``tf_preprocessing=True``,
  ``crop_border_pixels``, ``train_crop_mode`` other than "rrc", ``input_size_choices``,
  ``batch_size_choices``, ``num_batches``, any other ``collate_fn``, a timm dataset that is not an
  image folder.

Keyword-only extras (raypipe's own): ``seed``, ``rank`` / ``world_size`` (instead of
``torch.distributed``'s), ``channels_last``, ``yield_ids``, ``feeder``, ``execution``, ``decode``,
``reserved_cpus``, ``class_map``, ``mixup`` (a raypipe ``Mixup``). An ``execution`` whose
``worker_sched_idle`` is None (the default) gets it on for a CUDA ``device``, off otherwise, as the
training job does: a GPU trainer sleeps through most of each step and must get a core back at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from raypipe.config import DecodeConfig, EvalAugment, ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.device import Mixup
from raypipe.integrations.loader import RankLoader
from raypipe.sources import ShardListing, SourceRows, open_source
from raypipe.sources.formats.raydata import is_ray_dataset

__all__ = ["create_loader", "rows_of", "mixup_of", "augment_of", "execution_for"]

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875  # timm.data.constants


def _refuse(name: str, value: Any, why: str) -> None:
    raise ValueError(f"{name}={value!r} is not supported by raypipe.timm.create_loader: {why}")


def create_loader(
    dataset: Any,
    input_size: int | tuple[int, int] | tuple[int, int, int],
    batch_size: int,
    is_training: bool = False,
    no_aug: bool = False,
    re_prob: float = 0.0,
    re_mode: str = "const",
    re_count: int = 1,
    re_split: bool = False,
    train_crop_mode: str | None = None,
    scale: tuple[float, float] | None = None,
    ratio: tuple[float, float] | None = None,
    hflip: float = 0.5,
    vflip: float = 0.0,
    color_jitter: float = 0.4,
    color_jitter_prob: float | None = None,
    grayscale_prob: float = 0.0,
    gaussian_blur_prob: float = 0.0,
    auto_augment: str | None = None,
    num_aug_repeats: int = 0,
    num_aug_splits: int = 0,
    interpolation: str = "bilinear",
    mean: tuple[float, ...] = IMAGENET_DEFAULT_MEAN,
    std: tuple[float, ...] = IMAGENET_DEFAULT_STD,
    num_workers: int = 1,
    distributed: bool = False,
    crop_pct: float | None = None,
    crop_mode: str | None = None,
    crop_border_pixels: int | None = None,
    collate_fn: Callable | None = None,
    pin_memory: bool = False,
    fp16: bool = False,
    img_dtype: torch.dtype = torch.float32,
    device: torch.device = torch.device("cuda"),
    use_prefetcher: bool = True,
    use_multi_epochs_loader: bool = False,
    persistent_workers: bool = True,
    worker_seeding: str = "all",
    tf_preprocessing: bool = False,
    input_size_choices: Sequence | None = None,
    batch_size_choices: Sequence[int] | None = None,
    batch_choice_weights: Sequence[float] | None = None,
    batch_choice_seed: int = 0,
    batch_choice_schedule: str = "constant",
    batch_schedule_epochs: int | None = None,
    batch_schedule_spread: float = 0.65,
    batch_schedule_random_mix: float = 0.1,
    num_batches: int | None = None,
    *,
    seed: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    channels_last: bool = False,
    yield_ids: bool = False,
    feeder: bool = False,
    execution: ExecutionConfig | None = None,
    decode: DecodeConfig | None = None,
    reserved_cpus: float | None = None,
    class_map: Any = None,
    mixup: Mixup | None = None,
) -> RankLoader:
    """timm's ``create_loader``, its batches made by raypipe.

    Train batches: shuffled, full (timm's ``drop_last``), the same count on every rank. Eval:
    unshuffled, every image once across ranks, padded at the end of the shorter ranks to the same count
    (timm's ``OrderedDistributedSampler``). The ranks of a node share one Ray
    (``raypipe.integrations.connect_node``).

    Args:
        dataset: a path or URI (any source raypipe lists), a listing (``SourceRows``, ``ShardListing``),
            or timm's ``create_dataset(...)`` result for an image folder (its root and its
            ``class_to_idx`` are used, so class indices are timm's).
        input_size … num_batches: timm's arguments: honoured, of no effect, or refused, as the module
            doc lists them. ``distributed=True`` takes rank and world size from the initialised
            ``torch.distributed`` (torchrun), as timm's samplers do.
        seed: default ``batch_choice_seed``; must be the same on every rank: it fixes the epoch order.
        rank, world_size: instead of ``torch.distributed``'s (both or neither).
        reserved_cpus: left out of the cluster's CPUs when sizing each rank's share of augmentation
            tasks (default: one per trainer process of the world).
        channels_last, yield_ids, feeder, execution, decode, class_map, mixup: raypipe's own (module
            doc; ``RankLoader``, ``ListingOptions``).

    Returns:
        The rank's :class:`RankLoader`.

    Raises:
        ValueError: a refused argument or value (named; the module doc lists them), ``rank`` without
            ``world_size``, ``distributed=True`` without ``torch.distributed``, a Ray Dataset or a timm
            dataset raypipe cannot read as ``dataset``; ``ListingMismatchError`` when ranks listed
            different data.
        Exception: what ``open_source``, ``raypipe.connect`` and ``RankLoader`` raise.
    """
    for name, value, why in (
        ("num_aug_splits", num_aug_splits, "AugMix splits need timm's AugMixDataset"),
        (
            "num_aug_repeats",
            num_aug_repeats,
            "repeated augmentation would draw the same augmentation for "
            "each repeat (raypipe seeds by sample and epoch)",
        ),
        ("input_size_choices", input_size_choices, "scheduled input sizes are not supported"),
        ("batch_size_choices", batch_size_choices, "scheduled batch sizes are not supported"),
        ("num_batches", num_batches, "the batches per epoch follow from the dataset and batch_size"),
        ("crop_border_pixels", crop_border_pixels, "eval crops by crop_pct and crop_mode only"),
    ):
        if value:
            _refuse(name, value, why)
    if tf_preprocessing:
        _refuse("tf_preprocessing", tf_preprocessing, "TF-style inference preprocessing is not implemented")
    if train_crop_mode not in (None, "rrc"):
        _refuse("train_crop_mode", train_crop_mode, "only RandomResizedCrop ('rrc') is implemented")
    if len(mean) != 3 or len(std) != 3:
        _refuse("mean", mean, "3-channel (RGB) images only")
    if isinstance(input_size, (tuple, list)) and len(input_size) == 3 and input_size[0] != 3:
        _refuse("input_size", input_size, "3-channel (RGB) images only")
    if mixup is not None and collate_fn is not None:
        raise ValueError("give mixup through collate_fn (timm's FastCollateMixup) or mixup=, not both")
    mix_kwargs = mixup_of(collate_fn) if mixup is None else _mix_kwargs(mixup)

    rank, world_size = _world(distributed, rank, world_size)
    execution = execution_for(execution, device)
    rows, shown = rows_of(dataset, class_map=class_map)
    from raypipe.plan.same_listing import check_same_listing

    check_same_listing(rows.digest(), rank=rank, world_size=world_size)  # each rank listed on its own
    augment = augment_of(
        input_size,
        is_training=is_training,
        no_aug=no_aug,
        scale=scale,
        ratio=ratio,
        hflip=hflip,
        vflip=vflip,
        color_jitter=color_jitter,
        color_jitter_prob=color_jitter_prob,
        grayscale_prob=grayscale_prob,
        gaussian_blur_prob=gaussian_blur_prob,
        auto_augment=auto_augment,
        interpolation=interpolation,
        mean=mean,
        crop_pct=crop_pct,
        crop_mode=crop_mode,
    )
    seed = batch_choice_seed if seed is None else seed
    config = PipelineConfig(batch_size=batch_size, shuffle=is_training, drop_last=is_training, seed=seed)

    from raypipe.integrations.node_ray import connect_node
    from raypipe.pipeline import Pipeline

    if _wants_ray(execution, world_size=world_size, feeder=feeder):
        # The first chunks are made here while a local Ray starts in the background
        # (raypipe.pipeline.stream), so the first batch does not wait for a cluster, as timm's does not.
        connect_node(wait=world_size > 1)
    erasing = is_training and not no_aug  # timm's PrefetchLoader erases only then
    device_kwargs = dict(
        device=device,
        img_dtype=torch.float16 if fp16 else img_dtype,
        mean=tuple(mean),
        std=tuple(std),
        channels_last=channels_last,
        pin_memory=bool(pin_memory),
        re_prob=re_prob if erasing else 0.0,
        re_mode=re_mode,
        re_count=re_count,
        re_num_splits=2 if (re_split and erasing) else 0,
        **mix_kwargs,
    )
    if reserved_cpus is None:
        reserved_cpus = float(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    pipeline = Pipeline(rows, augment, config=config, execution=execution, decode=decode)
    return RankLoader(
        pipeline,
        training=is_training,
        rank=rank,
        world_size=world_size,
        device_kwargs=device_kwargs,
        dataset=shown,
        yield_ids=yield_ids,
        feeder=feeder,
        reserved_cpus=reserved_cpus,
    )


def execution_for(execution: ExecutionConfig | None, device: Any) -> ExecutionConfig:
    """``execution`` (default: ``ExecutionConfig()``) with ``worker_sched_idle`` left to the consumer
    decided for ``device``, as the training job decides it: on when the batches feed a CUDA device."""
    return (execution or ExecutionConfig()).resolved_for(gpu_trainer=torch.device(device).type == "cuda")


def _wants_ray(execution: ExecutionConfig | None, *, world_size: int, feeder: bool) -> bool:
    """Whether the loader runs on Ray: asked for, or needed (ranks to share a node's cluster, a feeder
    actor, even one whose tasks are local worker processes), or there to join (connected,
    ``RAY_ADDRESS``). Else one trainer on one machine: its tasks run in local worker processes
    (``ExecutionConfig.backend``), with no cluster to start."""
    from raypipe.pipeline.backend import decide_here

    if feeder:
        return True
    return decide_here(execution or ExecutionConfig(), None, needs_ray=world_size > 1, probe=False).on_ray


def _world(distributed: bool, rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError(f"rank={rank!r}, world_size={world_size!r}: give both or neither")
        return int(rank), int(world_size)
    if not distributed:
        return 0, 1  # as timm: a non-distributed loader reads the whole dataset
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("distributed=True but torch.distributed is not initialised (start it before the loader)")
    return dist.get_rank(), dist.get_world_size()


def rows_of(dataset: Any, *, class_map: Any = None) -> tuple[SourceRows | ShardListing, Any]:
    """``(rows, what loader.dataset shows)`` for a path/URI, a listing (``SourceRows``, or ``ShardListing``:
    an indexed WebDataset listed by shard) or a timm image-folder dataset."""
    if isinstance(dataset, (SourceRows, ShardListing)):
        return dataset, dataset
    if isinstance(dataset, (str, os.PathLike)):
        rows = open_source(os.fspath(dataset), class_map=class_map)
        return rows, rows
    if is_ray_dataset(dataset):  # each rank's listing would put its own copy of the bytes in the store
        raise ValueError(
            "dataset is a Ray Dataset: list it once, rows = raypipe.open_source(ds) (on the driver), "
            "and give the rows; every rank's loader reads them"
        )
    reader = getattr(dataset, "reader", None)
    root, class_to_idx = getattr(reader, "root", None), getattr(reader, "class_to_idx", None)
    samples = getattr(reader, "samples", None)
    if root is None or class_to_idx is None or samples is None:
        raise ValueError(
            f"dataset={type(dataset).__name__} (reader {type(reader).__name__}): raypipe reads timm datasets of "
            "image folders (timm's folder reader); give the data's path or URI instead"
        )
    if class_map is not None:
        raise ValueError("class_map: the timm dataset already numbers its classes; give class_map to create_dataset")
    rows = open_source(os.fspath(root), kind="folder", class_map=dict(class_to_idx))
    _check_same_images(rows, samples, root)
    return rows, dataset


def _check_same_images(rows: SourceRows, samples: Sequence, root: str) -> None:
    """The raypipe listing must be timm's: the same files with the same labels, or an epoch (and an
    eval) would cover other images than the user's dataset object says."""
    theirs = {(os.path.relpath(path, root).replace(os.sep, "/"), int(label)) for path, label in samples}
    paths = rows.table.column("path").to_pylist()
    ours = set(zip(paths, rows.table.column("label").to_pylist(), strict=True))
    if theirs != ours:
        only_timm, only_ours = sorted(theirs - ours)[:3], sorted(ours - theirs)[:3]
        raise ValueError(
            f"dataset: raypipe lists {len(ours)} images of {root!r}, timm's dataset {len(theirs)}, and they differ "
            f"(only timm's: {only_timm}; only raypipe's: {only_ours}). Nested class folders or image types "
            "one of them skips? Give the folder's path to use raypipe's listing."
        )


def mixup_of(collate_fn: Callable | None) -> dict[str, Any]:
    """``raypipe.device.from_timm_args`` keywords for timm's ``collate_fn``: nothing for None or
    ``fast_collate``; the mixup settings of a timm ``Mixup`` / ``FastCollateMixup``."""
    if collate_fn is None:
        return {}
    from timm.data import Mixup as TimmMixup
    from timm.data.loader import fast_collate

    if collate_fn is fast_collate:
        return {}
    if not isinstance(collate_fn, TimmMixup):
        _refuse(
            "collate_fn",
            collate_fn,
            "only timm's fast_collate, Mixup or FastCollateMixup (mixup moves to the "
            "device); batches are collated by raypipe",
        )
    if getattr(collate_fn, "multi_label", False):
        _refuse("collate_fn", collate_fn, "multi_label mixup is not implemented")
    return dict(
        mixup_alpha=collate_fn.mixup_alpha,
        cutmix_alpha=collate_fn.cutmix_alpha,
        cutmix_minmax=collate_fn.cutmix_minmax,
        mixup_prob=collate_fn.mix_prob,
        mixup_switch_prob=collate_fn.switch_prob,
        mixup_mode=collate_fn.mode,
        correct_lam=collate_fn.correct_lam,
        label_smoothing=collate_fn.label_smoothing,
        num_classes=collate_fn.num_classes,
    )


def _mix_kwargs(mixup: Mixup) -> dict[str, Any]:
    if not isinstance(mixup, Mixup):
        raise ValueError(f"mixup={mixup!r}: expected a raypipe.device.Mixup")
    return dict(
        mixup_alpha=mixup.mixup_alpha,
        cutmix_alpha=mixup.cutmix_alpha,
        cutmix_minmax=mixup.cutmix_minmax,
        mixup_prob=mixup.prob,
        mixup_switch_prob=mixup.switch_prob,
        mixup_mode=mixup.mode,
        correct_lam=mixup.correct_lam,
        label_smoothing=mixup.label_smoothing,
        num_classes=mixup.num_classes,
    )


def augment_of(
    input_size: Any,
    *,
    is_training: bool,
    no_aug: bool = False,
    scale: tuple[float, float] | None = None,
    ratio: tuple[float, float] | None = None,
    hflip: float = 0.5,
    vflip: float = 0.0,
    color_jitter: Any = 0.4,
    color_jitter_prob: float | None = None,
    grayscale_prob: float | None = 0.0,
    gaussian_blur_prob: float | None = 0.0,
    auto_augment: str | None = None,
    interpolation: str = "bilinear",
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    crop_pct: float | None = None,
    crop_mode: str | None = None,
) -> TrainAugment | EvalAugment:
    """The raypipe transform timm's ``create_transform`` would build from these arguments."""
    if is_training and no_aug:
        # timm's transforms_noaug_train: Resize(img_size) + CenterCrop(img_size). A (H, W) size (what
        # train.py passes) resizes to exactly that, i.e. squashes; an int resizes the shorter side.
        squash = isinstance(input_size, (tuple, list))
        interp = "bilinear" if interpolation == "random" else interpolation
        return EvalAugment(
            input_size=input_size, crop_pct=1.0, crop_mode="squash" if squash else "center", interpolation=interp
        )
    if is_training:
        return TrainAugment(
            input_size=input_size,
            scale=tuple(scale or (0.08, 1.0)),
            ratio=tuple(ratio or (3 / 4, 4 / 3)),
            interpolation=interpolation,
            hflip=hflip,
            vflip=vflip,
            color_jitter=color_jitter,
            color_jitter_prob=color_jitter_prob,
            grayscale_prob=grayscale_prob or 0.0,
            gaussian_blur_prob=gaussian_blur_prob or 0.0,
            auto_augment=auto_augment or None,
            mean=tuple(mean),
        )
    return EvalAugment(
        input_size=input_size,
        crop_pct=crop_pct or DEFAULT_CROP_PCT,
        crop_mode=crop_mode or "center",
        interpolation=interpolation,
    )
