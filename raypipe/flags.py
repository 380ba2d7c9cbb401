"""Command-line flags with timm train.py's names, merged over a strict YAML config.

Precedence: dataclass defaults < YAML (``--config``) < flags given on the command line. Flags
default to ``None`` so we can tell "not given" from "given the default".
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from raypipe.config import BACKENDS, CONFIG_SECTIONS, TRAIN_SECTION, config_sections, load_yaml, resolve_sections

__all__ = [
    "add_augment_args",
    "add_config_arg",
    "add_index_arg",
    "add_pipeline_args",
    "add_source_args",
    "add_mixture_args",
    "build_configs",
    "SECTIONS",
]

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
    "backend": ("execution", "backend"),
    "num_tasks": ("execution", "num_tasks"),
    "cpus_per_task": ("execution", "cpus_per_task"),
    "chunk_rows": ("execution", "chunk_rows"),
    "prefetch_chunks": ("execution", "prefetch_chunks"),
    "worker_nice": ("execution", "worker_nice"),
    "worker_sched_idle": ("execution", "worker_sched_idle"),
    "max_skip_ratio": ("pipeline", "max_skip_ratio"),
    "max_skips": ("pipeline", "max_skips"),
}
SECTIONS = CONFIG_SECTIONS


def _default(section: str, name: str) -> str:
    """'(default: X)' for a flag that overrides a config field: the flag itself defaults to None ("not
    given"), so the value shown is the field's own default."""
    field = {f.name: f for f in dataclasses.fields(SECTIONS[section])}[name]
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if isinstance(value, tuple) and len(value) == 2 and value[0] == value[1] and name == "input_size":
        value = value[0]
    if isinstance(value, tuple):
        value = " ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value)
    return f"(default: {value})"


def add_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "data",
        nargs="*",
        help="image folder, Parquet file/folder, CSV/JSONL manifest or WebDataset shards (local path or URI); "
        "several: a mixture (--weights)",
    )
    p.add_argument(
        "--data",
        dest="more_data",
        action="append",
        default=[],
        metavar="DATA",
        help="a dataset, as the positional one; given again for each dataset of a mixture",
    )
    add_mixture_args(p)
    p.add_argument(
        "--kind", choices=("folder", "parquet", "manifest", "webdataset"), help="dataset kind (detected if omitted)"
    )
    p.add_argument("--image-column", default="image", help="Parquet image-bytes column")
    p.add_argument("--label-column", default="label", help="Parquet/manifest label column")
    p.add_argument("--path-column", default="path", help="manifest path column")
    p.add_argument("--root", help="manifest dataset root (default: the manifest's folder)")
    p.add_argument(
        "--fields",
        nargs="+",
        metavar="NAME",
        default=(),
        help="per-sample data carried beside each image: WebDataset members by extension (txt json), "
        "Parquet/manifest columns by name; a sample without one is skipped as missing_field",
    )
    add_index_arg(p)


def add_mixture_args(p) -> None:
    """``--weights`` and ``--samples-per-epoch``: several datasets as one mixture (docs/sources.md)."""
    p.add_argument(
        "--weights",
        type=float,
        nargs="+",
        metavar="W",
        help="each dataset's weight in the mixture, in the order they are given (default: their rows, so an "
        "epoch takes every row of each once)",
    )
    p.add_argument(
        "--samples-per-epoch",
        type=int,
        metavar="N",
        help="rows a mixture's epoch takes of all its datasets together (default: their rows together)",
    )


def add_index_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--index",
        metavar="PATH",
        help="WebDataset shards: the index to list them from, when it is not raypipe-index.parquet "
        "beside them: a .parquet (`raypipe index --out`), 'dali' (DALI's SHARD.idx beside each "
        "shard) or a brace pattern of .idx paths",
    )


def add_augment_args(p: argparse.ArgumentParser) -> None:
    d = _default
    g = p.add_argument_group("augmentation (timm train.py names)")
    g.add_argument("--img-size", type=int, help=f"output image size (square) {d('augment', 'input_size')}")
    g.add_argument(
        "--input-size", type=int, nargs=3, metavar=("C", "H", "W"), help="timm-style input size (overrides --img-size)"
    )
    g.add_argument(
        "--scale",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help=f"RandomResizedCrop area range {d('augment', 'scale')}",
    )
    g.add_argument(
        "--ratio",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help=f"RandomResizedCrop aspect range {d('augment', 'ratio')}",
    )
    g.add_argument("--hflip", type=float, help=f"horizontal flip probability {d('augment', 'hflip')}")
    g.add_argument("--vflip", type=float, help=f"vertical flip probability {d('augment', 'vflip')}")
    g.add_argument(
        "--color-jitter", type=float, help=f"colour jitter strength, 0 disables {d('augment', 'color_jitter')}"
    )
    g.add_argument(
        "--color-jitter-prob", type=float, help="probability of applying colour jitter (default: always, when it is on)"
    )
    g.add_argument(
        "--grayscale-prob", type=float, help=f"random grayscale probability {d('augment', 'grayscale_prob')}"
    )
    g.add_argument(
        "--gaussian-blur-prob", type=float, help=f"gaussian blur probability {d('augment', 'gaussian_blur_prob')}"
    )
    g.add_argument("--aa", help="timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1 (default: none)")
    g.add_argument(
        "--interpolation",
        choices=("bilinear", "bicubic", "random"),
        help=f"crop interpolation {d('augment', 'interpolation')}",
    )
    g.add_argument("--crop-pct", type=float, help=f"eval: resize to size / crop_pct, then crop {d('eval', 'crop_pct')}")
    g.add_argument(
        "--crop-mode", choices=("center", "squash", "border"), help=f"eval crop mode {d('eval', 'crop_mode')}"
    )
    g.add_argument("--max-pixels", type=int, help=f"skip images with more pixels (bombs) {d('decode', 'max_pixels')}")


def add_pipeline_args(p: argparse.ArgumentParser) -> None:
    d = _default
    g = p.add_argument_group("pipeline")
    g.add_argument("-b", "--batch-size", type=int, help=f"images per packed batch {d('pipeline', 'batch_size')}")
    g.add_argument(
        "--seed", type=int, help=f"augmentation and shuffle seed; fixed, so runs agree {d('pipeline', 'seed')}"
    )
    g.add_argument("--drop-last", action="store_true", default=None, help="drop the last partial batch")
    g.add_argument(
        "--shuffle-window",
        type=int,
        help=f"sharded sources: rows shuffled together, whole shards {d('pipeline', 'shuffle_window')}",
    )
    g = p.add_argument_group("execution")
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        help="where the augmentation tasks run: ray (Ray tasks on the cluster), local (worker processes "
        "of this machine), nodes (raypipe's worker processes on the cluster's nodes, their images "
        "streamed to the trainer's node) or auto: on a cluster joined (RAY_ADDRESS), nodes with a width "
        "that follows the trainer's demand (ray where the nodes cannot connect to it); on this machine, local "
        f"{d('execution', 'backend')}",
    )
    g.add_argument("--num-tasks", type=int, help="augmentation tasks at once (default: this rank's share of the CPUs)")
    g.add_argument(
        "--cpus-per-task",
        type=float,
        help="CPUs each augmentation task asks for (default: 1; 0.5 for a folder or manifest in an object store)",
    )
    g.add_argument("--chunk-rows", type=int, help="rows per augmentation task (default: from the batch size)")
    g.add_argument(
        "--prefetch-chunks",
        type=int,
        help=f"finished chunks held ahead of the consumer {d('execution', 'prefetch_chunks')}",
    )
    g.add_argument(
        "--worker-nice", type=int, help=f"workers' niceness 0-19; 0: fair share {d('execution', 'worker_nice')}"
    )
    g.add_argument(
        "--worker-sched-idle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="workers' stage thread under Linux SCHED_IDLE, CPU nothing else wants (default: "
        "on when training on a GPU)",
    )
    g.add_argument(
        "--max-skip-ratio",
        type=float,
        help="fail the epoch if more than this fraction is skipped (default: the pipeline's)",
    )
    g.add_argument("--max-skips", type=int, help="fail the epoch after this many skips (default: no count limit)")
    add_config_arg(g)


def add_config_arg(p) -> None:
    p.add_argument(
        "-c",
        "--config",
        help=f"YAML config with sections {', '.join((*SECTIONS, TRAIN_SECTION))} (raypipe.config."
        f"load_config; only the training job reads {TRAIN_SECTION}); flags override it",
    )


def _flags_into(raw: dict[str, dict], values: Mapping[str, Any]) -> None:
    """Put flag values (by dest name; None = not given) into ``raw``'s sections."""
    for dest, (section, field) in {**_AUG_FLAGS, **_PIPE_FLAGS}.items():
        value = values.get(dest)
        if value is not None:
            raw[section][field] = list(value) if isinstance(value, (list, tuple)) else value
    if values.get("input_size"):
        raw["augment"]["input_size"] = list(values["input_size"])
    if values.get("color_jitter") == 0:
        raw["augment"]["color_jitter"] = None


def build_configs(
    args: argparse.Namespace, *, config: Mapping[str, Any] | None = None, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validated config objects keyed by section name (``raypipe.config.CONFIG_SECTIONS``).

    Precedence: the dataclasses' defaults < ``defaults`` (by flag dest name: a command's own defaults)
    < the config file's sections (``config``, else ``args.config`` loaded) < flags given. The file's
    ``train`` section is the training job's and is accepted without being read here."""
    if config is None:
        config = load_yaml(args.config) if getattr(args, "config", None) else {}
    sections = config_sections(config, where=getattr(args, "config", None) or "config")
    raw: dict[str, dict] = {name: {} for name in SECTIONS}
    _flags_into(raw, defaults or {})
    for name in SECTIONS:
        raw[name].update(sections.get(name, {}))
    _flags_into(raw, vars(args))
    return resolve_sections(raw)
