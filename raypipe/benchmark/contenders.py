"""The loaders compared by ``raypipe bench``, each on the same images and the same augmentation.

The loaders that feed a trainer all deliver the same thing, normalised fp32 NCHW batches on the CPU, and
all their worker processes run at the same priority (niceness 0, the default):

1. decode limit — libjpeg-turbo full decode only (simplejpeg), one process, rate × cores;
2. raypipe kernel — our decode + augment in one process (per core);
3. raypipe — the timm drop-in, ``raypipe.timm.create_loader``, called with timm's row's arguments
   (CPU, fp32; it starts Ray in the background and makes the first chunks in its own process while
   Ray starts), workers at niceness 0 (``ExecutionConfig(worker_nice=0)``);
4. raypipe packed — ``EpochSource``: the uint8 batches a GPU trainer receives, before the device side;
5. timm — ``create_loader(is_training=True, use_prefetcher=True, num_workers=N, persistent_workers=True)``
   for each N asked (``raypipe bench`` tries 1x and 2x the cores);
6. naive Ray Data — ``read_binary_files`` + timm's transform in ``map_batches`` + ``iter_torch_batches``,
   normalised to fp32 in the loop as a user would;
7. raypipe on Ray Data — the same folder as a Dataset of its listing's rows (path, label, sample id),
   raypipe's augmentation as the transform (``RayDataAugment`` on an actor per core), the same
   ``iter_torch_batches`` and normalisation;
8. NVIDIA DALI's CPU pipeline and SPDL, optional, in ``raypipe.benchmark.peers``.
"""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable, Iterator

import numpy as np

from raypipe.benchmark.measure import Result, measure_epochs
from raypipe.config import IMAGENET_MEAN, IMAGENET_STD, PipelineConfig, TrainAugment

__all__ = [
    "decode_limit",
    "kernel_per_core",
    "raypipe_pipeline",
    "timm_dataloader",
    "timm_loader",
    "naive_ray_data",
    "raypipe_on_ray_data",
]


def _timed_pass(name: str, files: list[bytes], fn: Callable[[bytes, int], object], scale: float, note: str) -> Result:
    for i, data in enumerate(files[: min(20, len(files))]):  # warm caches and lazy imports
        fn(data, i)
    t0, c0 = time.perf_counter(), time.process_time()
    for i, data in enumerate(files):
        fn(data, i)
    rate = len(files) / (time.perf_counter() - t0)
    cpu_ms = 1000 * (time.process_time() - c0) / len(files)  # one process's CPU: this row's only work
    return Result(
        name=name,
        images_per_s=rate * scale,
        first_batch_s=0.0,
        epoch_rates=[rate * scale],
        note=note,
        cpu_ms_per_image=cpu_ms,
    )


def decode_limit(files: list[bytes], cores: int) -> Result:
    import simplejpeg

    def fn(data, _):
        return simplejpeg.decode_jpeg(data, colorspace="RGB")

    files = [f for f in files if f[:2] == b"\xff\xd8"]  # libjpeg-turbo's limit: the JPEGs among them
    if not files:
        return Result("decode limit", 0.0, 0.0, [], note="no JPEG in the data")
    return _timed_pass("decode limit", files, fn, cores, f"simplejpeg full decode, 1 process x {cores} cores")


def kernel_per_core(files: list[bytes], aug: TrainAugment) -> Result:
    from raypipe.config import DecodeConfig
    from raypipe.kernels import build_transform, sample_rng

    transform = build_transform(aug, DecodeConfig())
    h, w = aug.input_size
    out = np.empty((h, w, 3), np.uint8)

    def fn(data, i):
        return transform(data, sample_rng(0, 0, i), out=out)

    return _timed_pass("raypipe kernel", files, fn, 1, "decode+augment, 1 process, 1 core")


def raypipe_pipeline(
    data: str,
    aug: TrainAugment,
    *,
    batch_size: int,
    epochs: int,
    device_side: bool = True,
    started: float | None = None,
    backend: str = "auto",
    index: str | None = None,
    fields: tuple[str, ...] = (),
) -> Result:
    """The timm drop-in with the timm row's arguments, or (``device_side=False``) the packed uint8 batches
    as a GPU trainer receives them, before the device side (which a GPU machine runs on the GPU).
    ``index``: WebDataset shards' shard index (``open_source(…, index=)``), listed here as the loader would;
    ``fields``: what the rows carry beside the images (the timm drop-in's batches drop them at the end)."""
    import torch

    from raypipe.config import ExecutionConfig
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.sources import open_source
    from raypipe.timm import create_loader

    if index is not None or fields:
        data = open_source(data, index=index, fields=fields)

    # Workers at the default priority, as timm's and Ray Data's are.
    execution = ExecutionConfig(worker_nice=0, worker_sched_idle=False, backend=backend)
    # One stream for all epochs: each epoch's first chunks run while the previous one's last are packed,
    # as in a training run; the last measured epoch starts chunks of an epoch nobody reads (close()).
    if device_side:
        loader = create_loader(
            data,
            batch_size=batch_size,
            is_training=True,
            use_prefetcher=True,
            device=torch.device("cpu"),
            execution=execution,
            **_timm_kwargs(aug),
        )
    else:
        loader = EpochSource(
            Pipeline(data, aug, config=PipelineConfig(batch_size=batch_size), execution=execution), end_epoch=epochs + 1
        )

    try:
        return measure_epochs(
            "raypipe" if device_side else "raypipe packed",
            lambda epoch: loader,
            epochs=epochs,
            count=(lambda b: int(b[0].shape[0])) if device_side else (lambda b: int(b["image"].shape[0])),
            object_store=True,
            note=(
                "raypipe.timm.create_loader(timm's arguments, device=cpu), fp32, workers at niceness 0"
                if device_side
                else "EpochSource: exact uint8 batches, no device side"
            )
            + f", backend {backend}"
            + (f", fields {' '.join(fields)}" if fields else ""),
            started=started,
        )
    finally:
        loader.close()


def _patch_timm_posterize(transform) -> None:
    """timm's rand-augment asks Pillow >= 12 for 0-bit posterize, which raises; give timm the same fix
    raypipe's kernels use (black image, as older Pillow did) so both sides run the same policy."""
    from raypipe.kernels.autoaug import patch_posterize

    for t in getattr(transform, "transforms", [transform]):
        if hasattr(t, "ops") or hasattr(t, "policy"):
            patch_posterize(t)


def _timm_kwargs(aug: TrainAugment) -> dict:
    h, w = aug.input_size
    return dict(
        input_size=(3, h, w),
        scale=aug.scale,
        ratio=aug.ratio,
        hflip=aug.hflip,
        vflip=aug.vflip,
        color_jitter=None if aug.color_jitter is None else aug.color_jitter,
        auto_augment=aug.auto_augment,
        interpolation=aug.interpolation,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )


def timm_dataloader(data: str, aug: TrainAugment, *, batch_size: int, workers: int):
    """timm's loader at its documented best on a CPU: the prefetcher path (uint8 collate, normalise in
    the loop), persistent workers; batches are (image, target)."""
    import torch
    from timm.data import create_dataset, create_loader

    # 2x the cores is one of the settings the bench tries on purpose: torch's warning about it is noise here
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    dataset = create_dataset("", root=data, split="train", is_training=True)
    kw = _timm_kwargs(aug)
    loader = create_loader(
        dataset,
        batch_size=batch_size,
        is_training=True,
        use_prefetcher=True,
        num_workers=workers,
        device=torch.device("cpu"),
        pin_memory=False,
        persistent_workers=True,
        **{k: v for k, v in kw.items() if k != "mean" and k != "std"},
        mean=kw["mean"],
        std=kw["std"],
    )
    _patch_timm_posterize(dataset.transform)
    return loader


def timm_loader(
    data: str, aug: TrainAugment, *, batch_size: int, epochs: int, workers: int, started: float | None = None
) -> Result:
    loader = timm_dataloader(data, aug, batch_size=batch_size, workers=workers)
    return measure_epochs(
        f"timm ({workers} workers)",
        lambda epoch: loader,
        epochs=epochs,
        count=lambda b: int(b[0].shape[0]),
        note=f"create_loader(use_prefetcher=True, num_workers={workers}, persistent_workers=True), fp32",
        started=started,
    )


def _pil_batch(batch: dict, aug: TrainAugment) -> dict:
    """What a Ray Data user would write: PIL decode + timm's own train transform, per row."""
    from PIL import Image
    from timm.data import create_transform

    kw = _timm_kwargs(aug)
    tf = create_transform(
        kw["input_size"],
        is_training=True,
        scale=kw["scale"],
        ratio=kw["ratio"],
        hflip=kw["hflip"],
        vflip=kw["vflip"],
        color_jitter=kw["color_jitter"],
        auto_augment=kw["auto_augment"],
        interpolation=kw["interpolation"],
        use_prefetcher=True,  # uint8 tensors out, like timm's fast path
    )
    _patch_timm_posterize(tf)
    out = []
    for data in batch["bytes"]:
        with Image.open(io.BytesIO(data)) as im:
            out.append(np.asarray(tf(im.convert("RGB"))))
    return {"image": np.stack(out)}


def naive_ray_data(
    data: str, aug: TrainAugment, *, batch_size: int, epochs: int, started: float | None = None
) -> Result:
    import ray
    import torch

    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255

    def make_epoch(epoch: int) -> Iterator:
        from raypipe.sources import IMG_EXTENSIONS

        # the images the other loaders read (an ImageFolder's extensions), not every file under the root
        exts = [e.lstrip(".") for e in IMG_EXTENSIONS]
        ds = ray.data.read_binary_files(data, include_paths=False, file_extensions=exts).map_batches(
            _pil_batch, fn_kwargs={"aug": aug}, batch_size=32
        )
        ds.context.enable_progress_bars = False
        for batch in ds.iter_torch_batches(batch_size=batch_size):
            # timm's prefetcher transform gives uint8 CHW: normalised fp32, as the other loaders deliver
            yield {"image": batch["image"].float().sub_(mean).div_(std)}

    return measure_epochs(
        "naive Ray Data",
        make_epoch,
        epochs=epochs,
        count=lambda b: int(b["image"].shape[0]),
        object_store=True,
        note="read_binary_files + PIL map_batches (default tasks) + iter_torch_batches, fp32 in the loop",
        started=started,
    )


def raypipe_on_ray_data(
    folder: str, aug: TrainAugment, *, batch_size: int, epochs: int, started: float | None = None
) -> Result:
    """raypipe's transform inside Ray Data: the folder's rows as a Dataset of blocks of 32 rows (as the
    naive contender's ``map_batches``), ``RayDataAugment`` on ``cores`` actors of one CPU (the naive
    contender's tasks take as many), read by path; each epoch a new execution, as Ray Data runs one."""
    import os

    import ray
    import torch

    from raypipe.integrations.ray_data import RayDataAugment
    from raypipe.sources import open_source

    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    rows = open_source(folder)
    table = rows.table.select(["sample_id", "label", "path"])
    blocks = [table.take(np.arange(lo, min(lo + 32, len(rows)))) for lo in range(0, len(rows), 32)]
    cores = os.cpu_count() or 1

    def make_epoch(epoch: int) -> Iterator:
        ds = ray.data.from_arrow(blocks).map_batches(
            RayDataAugment,
            batch_size=32,
            compute=ray.data.ActorPoolStrategy(size=cores),
            batch_format="numpy",
            fn_constructor_kwargs=dict(augment=aug, seed=0, epoch=epoch, image_column="path", root=rows.root.root),
        )
        ds.context.enable_progress_bars = False
        for batch in ds.iter_torch_batches(batch_size=batch_size):
            yield {"image": batch["image"].permute(0, 3, 1, 2).float().sub_(mean).div_(std)}

    return measure_epochs(
        "raypipe on Ray Data",
        make_epoch,
        epochs=epochs,
        count=lambda b: int(b["image"].shape[0]),
        object_store=True,
        note=f"listing as a Dataset + RayDataAugment (map_batches, {cores} actors) + iter_torch_batches, fp32 in "
        "the loop",
        started=started,
    )
