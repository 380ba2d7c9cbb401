"""The loaders compared by ``raypipe bench``, each on the same files and the same augmentation.

1. decode limit — libjpeg-turbo full decode only (simplejpeg), one process, rate × cores;
2. raypipe kernel — our decode + augment in one process (per core);
3. raypipe — the full pipeline through Ray into the trainer-side DeviceLoader (CPU device);
4. timm — ``create_loader(is_training=True, use_prefetcher=True, num_workers=cores)``;
5. naive Ray Data — ``read_binary_files`` + a PIL ``map_batches`` + ``iter_torch_batches``.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator

import numpy as np

from raypipe.benchmark.measure import Result, measure_epochs
from raypipe.config import IMAGENET_MEAN, IMAGENET_STD, PipelineConfig, TrainAugment

__all__ = ["decode_limit", "kernel_per_core", "raypipe_pipeline", "timm_loader", "naive_ray_data"]


def _timed_pass(name: str, files: list[bytes], fn: Callable[[bytes, int], object], scale: float, note: str) -> Result:
    for i, data in enumerate(files[: min(20, len(files))]):  # warm caches and lazy imports
        fn(data, i)
    t0 = time.perf_counter()
    for i, data in enumerate(files):
        fn(data, i)
    rate = len(files) / (time.perf_counter() - t0)
    return Result(name=name, images_per_s=rate * scale, first_batch_s=0.0, epoch_rates=[rate], note=note)


def decode_limit(files: list[bytes], cores: int) -> Result:
    import simplejpeg

    def fn(data, _):
        return simplejpeg.decode_jpeg(data, colorspace="RGB")

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


def raypipe_pipeline(data: str, aug: TrainAugment, *, batch_size: int, epochs: int, device_side: bool = True) -> Result:
    """The full pipeline into a CPU DeviceLoader, or (``device_side=False``) the packed uint8 batches
    as a GPU trainer receives them, before the device side (which a GPU machine runs on the GPU)."""
    from raypipe.device import DeviceLoader
    from raypipe.pipeline import EpochSource, Pipeline

    # One stream for all epochs: each epoch's first chunks run while the previous one's last are packed,
    # as in a training run; the last measured epoch starts chunks of an epoch nobody reads (close()).
    source = EpochSource(Pipeline(data, aug, config=PipelineConfig(batch_size=batch_size)), end_epoch=epochs + 1)
    loader = DeviceLoader.from_timm(source, device="cpu", img_dtype="float32") if device_side else source

    def make_epoch(epoch: int):
        return loader

    try:
        return measure_epochs(
            "raypipe" if device_side else "raypipe packed",
            make_epoch,
            epochs=epochs,
            count=lambda b: int(b["image"].shape[0]),
            object_store=True,
            note="Ray tasks -> exact batches -> DeviceLoader(cpu, fp32)" if device_side
            else "Ray tasks -> exact uint8 batches, no device side",
        )
    finally:
        loader.close()


def _patch_timm_posterize(transform) -> None:
    """timm's rand-augment asks Pillow >= 12 for 0-bit posterize, which raises; give timm the same fix
    raypipe's kernels use (black image, as older Pillow did) so both sides run the same policy."""
    from raypipe.kernels.autoaug import _patch_posterize

    for t in getattr(transform, "transforms", [transform]):
        if hasattr(t, "ops") or hasattr(t, "policy"):
            _patch_posterize(t)


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


def timm_loader(data: str, aug: TrainAugment, *, batch_size: int, epochs: int, workers: int) -> Result:
    import torch
    from timm.data import create_dataset, create_loader

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
    return measure_epochs(
        "timm",
        lambda epoch: loader,
        epochs=epochs,
        count=lambda b: int(b[0].shape[0]),
        note=f"create_loader(use_prefetcher=True, num_workers={workers}) on CPU",
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


def naive_ray_data(data: str, aug: TrainAugment, *, batch_size: int, epochs: int) -> Result:
    import ray

    def make_epoch(epoch: int) -> Iterator:
        from raypipe.sources import IMG_EXTENSIONS

        # the images the other loaders read (an ImageFolder's extensions), not every file under the root
        exts = [e.lstrip(".") for e in IMG_EXTENSIONS]
        ds = ray.data.read_binary_files(data, include_paths=False, file_extensions=exts).map_batches(
            _pil_batch, fn_kwargs={"aug": aug}, batch_size=32
        )
        ds.context.enable_progress_bars = False
        return ds.iter_torch_batches(batch_size=batch_size)

    return measure_epochs(
        "naive Ray Data",
        make_epoch,
        epochs=epochs,
        count=lambda b: int(b["image"].shape[0]),
        object_store=True,
        note="read_binary_files + PIL map_batches (default tasks) + iter_torch_batches",
    )
