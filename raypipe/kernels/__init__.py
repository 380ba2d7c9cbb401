"""Pure image kernels: bytes -> augmented HxWx3 uint8 RGB. Never imports ray.

Public API used by the pipeline::

    t = build_transform(aug, decode_cfg)        # TrainAugment | EvalAugment
    img = t(data, sample_rng(seed, epoch, sample_id), out=None)
    info = probe_image(data)                    # header only; raises SkipImage
"""

from raypipe.kernels.decode import ImageInfo, decode_for_crop, decode_rgb, open_image, probe_image
from raypipe.kernels.errors import (
    BAD_LABEL,
    DECODE_ERROR,
    EMPTY,
    MISSING,
    NOT_AN_IMAGE,
    NULL_IMAGE,
    OUTSIDE_ROOT,
    REASONS,
    TOO_LARGE,
    TRUNCATED,
    UNREADABLE,
    SkipImage,
)
from raypipe.kernels.geometry import crop_resize, eval_geometry, rrc_params
from raypipe.kernels.transform import EvalTransform, TrainTransform, build_transform, sample_rng

__all__ = [
    "BAD_LABEL",
    "DECODE_ERROR",
    "EMPTY",
    "MISSING",
    "NOT_AN_IMAGE",
    "NULL_IMAGE",
    "OUTSIDE_ROOT",
    "REASONS",
    "TOO_LARGE",
    "TRUNCATED",
    "UNREADABLE",
    "EvalTransform",
    "ImageInfo",
    "SkipImage",
    "TrainTransform",
    "build_transform",
    "crop_resize",
    "decode_for_crop",
    "decode_rgb",
    "eval_geometry",
    "open_image",
    "probe_image",
    "rrc_params",
    "sample_rng",
]
