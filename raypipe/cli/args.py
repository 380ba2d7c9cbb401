"""Command-line flags with timm train.py's names, merged over a strict YAML config.

Precedence: dataclass defaults < YAML (``--config``) < flags given on the command line. Flags
default to ``None`` so we can tell "not given" from "given the default".
"""

from __future__ import annotations

import argparse
from typing import Any

from raypipe.config import (
    DecodeConfig,
    EvalAugment,
    ExecutionConfig,
    PipelineConfig,
    TrainAugment,
    config_from_dict,
    load_yaml,
)

__all__ = ["add_augment_args", "add_pipeline_args", "add_source_args", "build_configs", "SECTIONS"]

# flag dest -> (section, field)
_AUG_FLAGS = {
    "img_size": ("augment", "input_size"),
    "scale": ("augment", "scale"),
    "ratio": ("augment", "ratio"),
    "hflip": ("augment", "hflip"),
    "vflip": ("augment", "vflip"),
    "color_jitter": ("augment", "color_jitter"),
    "color_jitter_prob": ("augment", "color_jitter_prob"),
    "grayscale_prob": ("augment", "grayscale_prob"),
    "gaussian_blur_prob": ("augment", "gaussian_blur_prob"),
    "aa": ("augment", "auto_augment"),
    "interpolation": ("augment", "interpolation"),
    "crop_pct": ("eval", "crop_pct"),
    "crop_mode": ("eval", "crop_mode"),
    "max_pixels": ("decode", "max_pixels"),
}
_PIPE_FLAGS = {
    "batch_size": ("pipeline", "batch_size"),
    "seed": ("pipeline", "seed"),
    "drop_last": ("pipeline", "drop_last"),
    "shuffle_window": ("pipeline", "shuffle_window"),
    "num_tasks": ("execution", "num_tasks"),
    "cpus_per_task": ("execution", "cpus_per_task"),
    "chunk_rows": ("execution", "chunk_rows"),
    "prefetch_chunks": ("execution", "prefetch_chunks"),
    "worker_nice": ("execution", "worker_nice"),
    "worker_sched_idle": ("execution", "worker_sched_idle"),
    "max_skip_ratio": ("pipeline", "max_skip_ratio"),
    "max_skips": ("pipeline", "max_skips"),
}
SECTIONS = {
    "augment": TrainAugment,
    "eval": EvalAugment,
    "pipeline": PipelineConfig,
    "execution": ExecutionConfig,
    "decode": DecodeConfig,
}


def add_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="image folder, Parquet file/folder, or CSV/JSONL manifest (local path or URI)")
    p.add_argument("--kind", choices=("folder", "parquet", "manifest", "webdataset"),
                   help="dataset kind (detected if omitted)")
    p.add_argument("--image-column", default="image", help="Parquet image-bytes column")
    p.add_argument("--label-column", default="label", help="Parquet/manifest label column")
    p.add_argument("--path-column", default="path", help="manifest path column")
    p.add_argument("--root", help="manifest dataset root (default: the manifest's folder)")


def add_augment_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("augmentation (timm train.py names)")
    g.add_argument("--img-size", type=int, help="output image size (square)")
    g.add_argument("--input-size", type=int, nargs=3, metavar=("C", "H", "W"), help="timm-style input size")
    g.add_argument("--scale", type=float, nargs=2, help="RandomResizedCrop area range")
    g.add_argument("--ratio", type=float, nargs=2, help="RandomResizedCrop aspect range")
    g.add_argument("--hflip", type=float, help="horizontal flip probability")
    g.add_argument("--vflip", type=float, help="vertical flip probability")
    g.add_argument("--color-jitter", type=float, help="colour jitter strength (0 disables)")
    g.add_argument("--color-jitter-prob", type=float, help="probability of applying colour jitter")
    g.add_argument("--grayscale-prob", type=float, help="random grayscale probability")
    g.add_argument("--gaussian-blur-prob", type=float, help="gaussian blur probability")
    g.add_argument("--aa", help="timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1")
    g.add_argument("--interpolation", choices=("bilinear", "bicubic", "random"), help="crop interpolation")
    g.add_argument("--crop-pct", type=float, help="eval: resize to size / crop_pct, then crop")
    g.add_argument("--crop-mode", choices=("center", "squash", "border"), help="eval crop mode")
    g.add_argument("--max-pixels", type=int, help="refuse images with more pixels (decompression bombs)")


def add_pipeline_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pipeline")
    g.add_argument("-b", "--batch-size", type=int, help="images per packed batch")
    g.add_argument("--seed", type=int, help="augmentation and shuffle seed (fixed default: runs agree)")
    g.add_argument("--drop-last", action="store_true", default=None, help="drop the last partial batch")
    g.add_argument("--shuffle-window", type=int, help="sharded sources: rows shuffled together (whole shards)")
    g = p.add_argument_group("execution")
    g.add_argument("--num-tasks", type=int, help="augmentation tasks at once (default: this rank's share of the CPUs)")
    g.add_argument("--cpus-per-task", type=float, help="CPUs each augmentation task asks Ray for (default 0.5)")
    g.add_argument("--chunk-rows", type=int, help="rows per augmentation task (default: from the batch size)")
    g.add_argument("--prefetch-chunks", type=int, help="finished chunks held ahead of the consumer (default 2)")
    g.add_argument("--worker-nice", type=int, help="workers' niceness 0-19 (default 10: consumer first; 0: fair share)")
    g.add_argument("--worker-sched-idle", action=argparse.BooleanOptionalAction, default=None,
                   help="workers' stage thread under Linux SCHED_IDLE, CPU nothing else wants (default: "
                        "on when training on a GPU)")  # fmt: skip
    g.add_argument("--max-skip-ratio", type=float, help="fail the epoch if more than this fraction is skipped")
    g.add_argument("--max-skips", type=int, help="fail the epoch after this many skips")
    g.add_argument("-c", "--config", help="YAML config with sections: " + ", ".join(SECTIONS))


def build_configs(args: argparse.Namespace, yaml_sections: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge YAML sections and flags into validated config objects keyed by section name."""
    raw: dict[str, dict] = {name: {} for name in SECTIONS}
    data = dict(yaml_sections or {})
    if getattr(args, "config", None):
        data.update(load_yaml(args.config))
    for name, value in data.items():
        if name not in SECTIONS:
            raise ValueError(f"config: unknown section {name!r}; known: {sorted(SECTIONS)}")
        if not isinstance(value, dict):
            raise ValueError(f"config: section {name!r} must be a mapping")
        raw[name].update(value)
    for dest, (section, field) in {**_AUG_FLAGS, **_PIPE_FLAGS}.items():
        value = getattr(args, dest, None)
        if value is not None:
            raw[section][field] = list(value) if isinstance(value, (list, tuple)) else value
    if getattr(args, "input_size", None):
        raw["augment"]["input_size"] = list(args.input_size)
    if getattr(args, "color_jitter", None) == 0:
        raw["augment"]["color_jitter"] = None
    # One output size for train and eval unless the config sets eval's own.
    if "input_size" in raw["augment"] and "input_size" not in raw["eval"]:
        raw["eval"]["input_size"] = raw["augment"]["input_size"]
    if raw["augment"].get("interpolation") in ("bilinear", "bicubic") and "interpolation" not in raw["eval"]:
        raw["eval"]["interpolation"] = raw["augment"]["interpolation"]
    return {name: config_from_dict(cls, raw[name], where=name) for name, cls in SECTIONS.items()}
