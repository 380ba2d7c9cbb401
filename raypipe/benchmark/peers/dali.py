"""NVIDIA DALI's CPU pipeline as a ``raypipe bench`` row, the shape of DALI's own ResNet-50 example:
``fn.readers.file`` → ``fn.decoders.image_random_crop`` (libjpeg-turbo decodes only the crop's region)
→ ``fn.resize`` → ``fn.crop_mirror_normalize`` (random mirror, fp32, CHW), read through
``DALIGenericIterator``. CPU only (``device_id=None``), one thread per core, DALI's defaults otherwise
(prefetch queue of 2); a full shuffle each epoch (``shuffle_after_epoch``), full batches only.
"""

from __future__ import annotations

import os

from raypipe.benchmark.measure import Result, measure_epochs
from raypipe.config import IMAGENET_MEAN, IMAGENET_STD, TrainAugment

__all__ = ["DIFFERS", "load_library", "build_loader", "run"]

DIFFERS = (
    "DALI draws the crops (same scale, ratio, 10 tries, its own fallback); libjpeg-turbo region "
    "decode; DALI's antialiased resize, not Pillow's"
)


def load_library() -> None:
    import nvidia.dali.fn  # noqa: F401
    import nvidia.dali.plugin.pytorch  # noqa: F401


def build_loader(folder: str, aug: TrainAugment, *, batch_size: int, threads: int, seed: int = 0):
    """An iterator over epochs of ``{"image": (N, 3, H, W) fp32, "label": (N, 1)}`` batches on the CPU;
    each ``for`` over it is one epoch (it resets itself at the end)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    h, w = aug.input_size
    interp = types.INTERP_CUBIC if aug.interpolation == "bicubic" else types.INTERP_LINEAR

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=seed)
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=folder, shuffle_after_epoch=True, name="Reader")
        images = fn.decoders.image_random_crop(
            jpegs,
            device="cpu",
            output_type=types.RGB,
            random_area=list(aug.scale),
            random_aspect_ratio=list(aug.ratio),
            num_attempts=10,
        )
        images = fn.resize(images, resize_x=w, resize_y=h, interp_type=interp, antialias=True)
        mirror = fn.random.coin_flip(probability=aug.hflip)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mirror=mirror,
            mean=[255 * m for m in IMAGENET_MEAN],
            std=[255 * s for s in IMAGENET_STD],
        )
        return images, labels

    return DALIGenericIterator(
        [pipeline()], ["image", "label"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True
    )


def run(folder: str, aug: TrainAugment, *, batch_size: int, epochs: int, started: float | None = None) -> Result:
    threads = os.cpu_count() or 1
    loader = build_loader(folder, aug, batch_size=batch_size, threads=threads)

    def batches(epoch: int):
        for (out,) in loader:  # one pipeline: a list of one dict per batch
            yield out

    result = measure_epochs(
        "DALI (CPU)",
        batches,
        epochs=epochs,
        count=lambda b: int(b["image"].shape[0]),
        note=f"DALI {_version()} CPU pipeline, {threads} threads: readers.file + decoders.image_random_crop + "
        "resize + crop_mirror_normalize, DALIGenericIterator, fp32",
        started=started,
    )
    result.differs = DIFFERS
    return result


def _version() -> str:
    import nvidia.dali

    return nvidia.dali.__version__
