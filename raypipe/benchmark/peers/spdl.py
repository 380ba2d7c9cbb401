"""SPDL as a ``raypipe bench`` row, in the shape its documentation recommends: ``spdl.dataloader.DataLoader``
(a thread pipeline, no worker processes) with a per-image preprocessor on every thread (``demux_image``,
then ``decode_packets`` with an FFmpeg filter that crops, resizes and flips) and a batch aggregator
(``convert_frames`` into one buffer, ``to_torch``, fp32 normalisation). One thread per core, a sink of 3
batches, full batches only, a new shuffle each epoch. The crop boxes and flips are drawn as raypipe
draws them (timm's algorithm, ``rrc_params``, from the sample's generator).
"""

from __future__ import annotations

import os

import numpy as np

from raypipe.benchmark.measure import Result, measure_epochs
from raypipe.config import IMAGENET_MEAN, IMAGENET_STD, TrainAugment

__all__ = ["DIFFERS", "load_library", "list_folder", "filter_desc", "build_loader", "run"]

DIFFERS = (
    "FFmpeg's JPEG decoder and YUV-to-RGB; crop offsets rounded to even on 4:2:0 JPEGs; swscale's resize, not Pillow's"
)


def load_library() -> None:
    """Import SPDL and load its FFmpeg extension (SPDL loads it at the first decode)."""
    import io

    import spdl.dataloader  # noqa: F401
    import spdl.io
    from PIL import Image

    tiny = io.BytesIO()
    Image.new("RGB", (8, 8)).save(tiny, format="JPEG")
    spdl.io.decode_packets(spdl.io.demux_image(tiny.getvalue()))


def list_folder(folder: str) -> list[tuple[str, int]]:
    """(path, label) of every image under ``folder``'s class folders, classes and files in sorted order,
    as an ImageFolder lists them."""
    from raypipe.sources.formats.folder import IMG_EXTENSIONS

    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir())
    items = []
    for label, name in enumerate(classes):
        for root, dirs, files in os.walk(os.path.join(folder, name)):
            dirs.sort()
            items += [(os.path.join(root, f), label) for f in sorted(files) if f.lower().endswith(IMG_EXTENSIONS)]
    return items


def filter_desc(box: tuple[int, int, int, int], size: tuple[int, int], interpolation: str, hflip: bool) -> str:
    """The FFmpeg filter for one image: crop ``box`` (top, left, h, w), resize to ``size`` (h, w), flip."""
    top, left, h, w = box
    parts = [f"crop=w={w}:h={h}:x={left}:y={top}", f"scale=w={size[1]}:h={size[0]}:flags={interpolation}"]
    if hflip:
        parts.append("hflip")
    return ",".join([*parts, "format=pix_fmts=rgb24"])


class _Epochs:
    """The source: each iteration is an epoch of ``(path, label, epoch, sample id)`` in a new order."""

    def __init__(self, items: list[tuple[str, int]], seed: int):
        self.items, self.seed, self.epoch = items, seed, 0

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        for i in np.random.default_rng([self.seed, epoch]).permutation(len(self.items)):
            path, label = self.items[i]
            yield path, label, epoch, int(i)


def build_loader(folder: str, aug: TrainAugment, *, batch_size: int, threads: int, seed: int = 0):
    """An iterable over epochs of ``{"image": (N, 3, H, W) fp32, "label": (N,)}`` batches on the CPU."""
    import spdl.io
    import torch
    from spdl.dataloader import DataLoader

    from raypipe.kernels import sample_rng
    from raypipe.kernels.geometry import rrc_params

    items = list_folder(folder)
    if not items:
        raise ValueError(f"{folder}: no images in its class folders")
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255

    def decode(item):
        path, label, epoch, sample_id = item
        packets = spdl.io.demux_image(path)
        rng = sample_rng(seed, epoch, sample_id)
        box = rrc_params(packets.width, packets.height, aug.scale, aug.ratio, rng)
        flip = aug.hflip > 0 and rng.random() < aug.hflip
        desc = filter_desc(box, aug.input_size, aug.interpolation, flip)
        return spdl.io.decode_packets(packets, filter_desc=desc), label

    def batchify(decoded):
        frames, labels = zip(*decoded, strict=True)
        hwc = spdl.io.to_torch(spdl.io.convert_frames(list(frames)))  # (N, H, W, 3) uint8, one buffer
        image = hwc.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        return {"image": image.sub_(mean).div_(std), "label": torch.tensor(labels)}

    return DataLoader(
        _Epochs(items, seed),
        preprocessor=decode,
        batch_size=batch_size,
        drop_last=True,
        aggregator=batchify,
        buffer_size=3,
        num_threads=threads,
    )


def run(folder: str, aug: TrainAugment, *, batch_size: int, epochs: int, started: float | None = None) -> Result:
    import importlib.metadata

    threads = os.cpu_count() or 1
    loader = build_loader(folder, aug, batch_size=batch_size, threads=threads)
    result = measure_epochs(
        "SPDL",
        lambda epoch: loader,
        epochs=epochs,
        count=lambda b: int(b["image"].shape[0]),
        note=f"SPDL {importlib.metadata.version('spdl')} DataLoader, {threads} threads: demux_image + decode_packets "
        "(crop, scale, hflip filter) per image, convert_frames + to_torch per batch, fp32",
        started=started,
    )
    result.differs = DIFFERS
    return result
