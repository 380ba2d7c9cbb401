"""Configuration: frozen, keyword-only dataclasses validated on construction.

Field names follow timm's (``scale``, ``ratio``, ``hflip`` …) so a timm user can read a raypipe
config without a glossary. Every check raises ``ValueError`` naming the field. YAML files load
strictly (``load_yaml``): unknown or duplicated keys are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DecodeConfig",
    "TrainAugment",
    "EvalAugment",
    "PipelineConfig",
    "auto_block_size",
    "long_epoch_block_size",
    "config_from_dict",
    "load_yaml",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "random")
CROP_MODES = ("center", "squash", "border")
# Pillow's own default decompression-bomb limit, so behaviour matches what users know.
DEFAULT_MAX_PIXELS = 89_478_485


def _fail(name: str, value: Any, why: str) -> None:
    raise ValueError(f"{name}={value!r}: {why}")


def _size2(name: str, value: Any) -> tuple[int, int]:
    """Accept an int (square), a (H, W) pair or timm's (C, H, W) input_size."""
    if isinstance(value, bool):
        _fail(name, value, "expected an int or (H, W)")
    if isinstance(value, int):
        value = (value, value)
    value = tuple(value)
    if len(value) == 3:
        if value[0] != 3:
            _fail(name, value, "only 3-channel input is supported")
        value = value[1:]
    if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        _fail(name, value, "expected an int, (H, W) or (3, H, W)")
    if min(value) < 1 or max(value) > 8192:
        _fail(name, value, "sizes must be in 1..8192")
    return value  # type: ignore[return-value]


def _range2(name: str, value: Any, lo: float, hi: float) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        _fail(name, value, "expected a (min, max) pair of numbers")
    if not (lo <= a <= b <= hi) or math.isnan(a) or math.isnan(b):
        _fail(name, value, f"expected {lo} <= min <= max <= {hi}")
    return (a, b)


def _prob(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        _fail(name, value, "expected a probability in [0, 1]")
    return float(value)


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """How bytes become pixels."""

    max_pixels: int = DEFAULT_MAX_PIXELS  # refuse larger images from the header (decompression bombs)
    dct_scaling: bool = True  # let libjpeg-turbo decode JPEGs at 1/2, 1/4, 1/8 when the crop allows

    def __post_init__(self) -> None:
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            _fail("max_pixels", self.max_pixels, "expected a positive int")


@dataclass(frozen=True, kw_only=True)
class TrainAugment:
    """timm's training transform (``transforms_imagenet_train``), minus tensor conversion.

    Normalisation, random erasing and mixup/cutmix run on the trainer's device (``DeviceLoader``).
    """

    input_size: Any = (224, 224)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: str = "bilinear"
    hflip: float = 0.5
    vflip: float = 0.0
    color_jitter: Any = 0.4  # float (brightness=contrast=saturation) or 3/4-tuple; None disables
    color_jitter_prob: float | None = None
    grayscale_prob: float = 0.0
    gaussian_blur_prob: float = 0.0
    auto_augment: str | None = None  # timm policy string: "rand-m9-mstd0.5-inc1", "augmix-…", "v0", …
    mean: tuple[float, float, float] = IMAGENET_MEAN  # fill colour for auto-augment, as in timm

    def __post_init__(self) -> None:
        _set(self, "input_size", _size2("input_size", self.input_size))
        _set(self, "scale", _range2("scale", self.scale, 0.0, 1.0))
        if self.scale[1] <= 0:
            _fail("scale", self.scale, "max must be > 0")
        _set(self, "ratio", _range2("ratio", self.ratio, 1e-3, 1e3))
        if self.interpolation not in INTERPOLATIONS:
            _fail("interpolation", self.interpolation, f"expected one of {INTERPOLATIONS}")
        for name in ("hflip", "vflip", "grayscale_prob", "gaussian_blur_prob"):
            _set(self, name, _prob(name, getattr(self, name)))
        if self.color_jitter_prob is not None:
            _set(self, "color_jitter_prob", _prob("color_jitter_prob", self.color_jitter_prob))
        cj = self.color_jitter
        if cj is not None:
            if isinstance(cj, (int, float)) and not isinstance(cj, bool):
                cj = (float(cj),) * 3
            try:
                cj = tuple(float(v) for v in cj)
            except (TypeError, ValueError):
                _fail("color_jitter", self.color_jitter, "expected a number or a 3/4-tuple")
            if len(cj) not in (3, 4) or any(v < 0 for v in cj) or (len(cj) == 4 and cj[3] > 0.5):
                _fail("color_jitter", self.color_jitter, "expected 3 or 4 values >= 0 (hue <= 0.5)")
            _set(self, "color_jitter", cj)
        if self.auto_augment is not None:
            if not isinstance(self.auto_augment, str) or not self.auto_augment:
                _fail("auto_augment", self.auto_augment, "expected a timm policy string")
            head = self.auto_augment.split("-")[0]
            if head not in ("rand", "augmix", "original", "originalr", "v0", "v0r", "3a"):
                _fail("auto_augment", self.auto_augment, "unknown policy (rand-, augmix-, original, v0, 3a)")
        _set(self, "mean", _range_mean("mean", self.mean))


def _range_mean(name: str, value: Any) -> tuple[float, float, float]:
    try:
        v = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        _fail(name, value, "expected 3 numbers")
    if len(v) != 3 or not all(0.0 <= x <= 1.0 for x in v):
        _fail(name, value, "expected 3 numbers in [0, 1]")
    return v  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class EvalAugment:
    """timm's eval transform: resize by ``crop_pct`` then crop (``transforms_imagenet_eval``)."""

    input_size: Any = (224, 224)
    crop_pct: float = 0.875
    crop_mode: str = "center"
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        _set(self, "input_size", _size2("input_size", self.input_size))
        if isinstance(self.crop_pct, bool) or not isinstance(self.crop_pct, (int, float)) or not (
            0.0 < self.crop_pct <= 1.0
        ):
            _fail("crop_pct", self.crop_pct, "expected 0 < crop_pct <= 1")
        if self.crop_mode not in CROP_MODES:
            _fail("crop_mode", self.crop_mode, f"expected one of {CROP_MODES}")
        if self.interpolation not in ("bilinear", "bicubic"):
            _fail("interpolation", self.interpolation, "expected bilinear or bicubic")


def auto_block_size(batch_size: int) -> int:
    """Rows per Ray block for a batch size: the smallest multiple of it that is >= 128 for batches up
    to 256 (each batch is then a view of one block: no packing copy in the trainer process, measured
    -60 % of its CPU at batch 256), else the largest divisor in 128..256, else 256. Blocks stay within
    128-256 rows: fewer pay Ray's per-task cost (~23-27 ms of CPU per block across its processes,
    ``bench/micro_profile.py ray-null``) too often, more delay the first batch at every epoch start:
    256-row blocks at batch 128 ran 20,000-image epochs ~10 % faster on 2 cores, but with 2000-image
    epochs a warmed epoch's first batch waited up to ~0.5 s instead of ~0.01 (bench/NOTES.md, tenth
    session): long epochs use ``long_epoch_block_size`` (``Pipeline.epoch_block_size``)."""
    if batch_size <= 256:
        return batch_size * -(-128 // batch_size)
    divisors = [d for d in range(256, 127, -1) if batch_size % d == 0]
    return divisors[0] if divisors else 256


def long_epoch_block_size(batch_size: int) -> int:
    """Rows per Ray block in a long epoch: the largest multiple of the batch size up to 256 (so batches
    stay views of a block), or ``auto_block_size`` for batches over 256."""
    if batch_size <= 256:
        return batch_size * (256 // batch_size)
    return auto_block_size(batch_size)


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """How the Ray Data pipeline runs and packs batches."""

    batch_size: int = 256
    drop_last: bool = False
    shuffle: bool = True
    seed: int = 0
    # None: the cluster's CPUs / cpus_per_actor workers.
    num_actors: int | None = None
    # Two workers per core: one decodes while the other waits on Ray (task hand-off, object store
    # writes). Measured on 2 cores, 64-row blocks: 1 CPU each 780 img/s at 65 % CPU; 0.5 CPU 970 at 90 %.
    cpus_per_actor: float = 0.5
    compute: str = "tasks"  # "tasks": stateless Ray tasks on warm workers; "actors": ActorPoolStrategy
    # Rows per Ray block, i.e. per augmentation task. Ray's per-task cost is ~23-27 ms of CPU: 32-row
    # blocks ran at 550 img/s, 64 at 970, 128 at 1100-1200 (2 cores, 224 px). None: ``auto_block_size``
    # (a multiple of the batch size where it can be, so the consumer packs batches without copying).
    block_size: int | None = None
    # Rows per block in a long epoch (see Pipeline.epoch_block_size): bigger blocks pay Ray's per-task
    # cost less often (256 vs 128 rows: 20,000-image epochs ~10 % faster on 2 cores), but in a short
    # epoch the blocks in flight would be the whole epoch and its first batch waited (up to 0.48 s vs
    # 0.01, 2000-image epochs). None: ``long_epoch_block_size(batch_size)`` when ``block_size`` is
    # automatic, else ``block_size`` (a block size the user set is used for every epoch).
    long_block_size: int | None = None
    # Finished blocks fetched ahead of the consumer (the epoch's pump thread queues them; Ray Data's own
    # prefetch window is off, as it held an epoch's first block back until w + 1 blocks were done).
    # Also sizes each epoch's object-store run-ahead (Pipeline.run_ahead_bytes).
    prefetch_blocks: int = 4
    # Niceness of augmentation worker processes (0..19). The consumer (trainer, feeder, the Packer and
    # DeviceLoader) is on the critical path: beside workers at its own priority it got too little CPU
    # (2 cores, CPU DeviceLoader: 757-832 img/s at 0, 818-866 at 5, 957-1049 at 10, 1007-1029 at
    # Ray's 15). Against other busy processes (nice 0) the workers then get a smaller share: two busy
    # loops beside, ~400 img/s at 0 or 5, ~200 at 10, 72-87 at 15; set 0 on a shared machine. Only the
    # stage's own thread is lowered (niceness is per thread), so no later task on the worker inherits it.
    worker_nice: int = 10
    # Run that thread under Linux SCHED_IDLE instead: it gets only CPU time nothing else wants, so a
    # GPU trainer waking after each step takes a core at once rather than waiting out a worker's time
    # slice (H200, 16 cores, ResNet-50: the training thread waited for a core 9-10 % of the time beside
    # workers at nice 10, 4-5 % under SCHED_IDLE; 88-92 % of the on-GPU-data ceiling became 92-96 %).
    # It would starve the workers beside a CPU trainer or other busy jobs. None (the default): off in
    # the library, on in the training job when it trains on CUDA (``resolved_for``).
    worker_sched_idle: bool | None = None
    # An epoch fails when more than this share of its rows is skipped (None: never). Real corruption is
    # rarer than 1 %; a broken mount, a wrong column or a bad export is far worse and must not train on.
    # Small epochs feel it first: 1 bad of 50 is 2 %. Raise it with --max-skip-ratio.
    max_skip_ratio: float | None = 0.01
    max_skips: int | None = None  # fail the epoch after this many skips (None: no count limit)
    # Extra Ray resources each augmentation worker asks for, to steer it to preprocessing nodes.
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, int) and not isinstance(self.batch_size, bool):
            if self.long_block_size is None:
                auto = self.block_size is None
                long = long_epoch_block_size(max(1, self.batch_size)) if auto else self.block_size
                _set(self, "long_block_size", long)
            if self.block_size is None:
                _set(self, "block_size", auto_block_size(max(1, self.batch_size)))
        for name in ("batch_size", "block_size", "long_block_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                _fail(name, v, "expected a positive int")
        if isinstance(self.prefetch_blocks, bool) or not isinstance(self.prefetch_blocks, int) or (
            self.prefetch_blocks < 0
        ):
            _fail("prefetch_blocks", self.prefetch_blocks, "expected an int >= 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            _fail("seed", self.seed, "expected an int >= 0")
        if self.worker_sched_idle is not None and not isinstance(self.worker_sched_idle, bool):
            _fail("worker_sched_idle", self.worker_sched_idle, "expected true, false or null (auto)")
        nice = self.worker_nice
        if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
            _fail("worker_nice", self.worker_nice, "expected an int in 0..19")
        if self.num_actors is not None and (
            isinstance(self.num_actors, bool) or not isinstance(self.num_actors, int) or self.num_actors < 1
        ):
            _fail("num_actors", self.num_actors, "expected a positive int or None")
        if not isinstance(self.cpus_per_actor, (int, float)) or not 0 < self.cpus_per_actor <= 64:
            _fail("cpus_per_actor", self.cpus_per_actor, "expected 0 < cpus_per_actor <= 64")
        if self.compute not in ("tasks", "actors"):
            _fail("compute", self.compute, "expected 'tasks' or 'actors'")
        if self.max_skip_ratio is not None:
            _set(self, "max_skip_ratio", _prob("max_skip_ratio", self.max_skip_ratio))
        if self.max_skips is not None and (
            isinstance(self.max_skips, bool) or not isinstance(self.max_skips, int) or self.max_skips < 0
        ):
            _fail("max_skips", self.max_skips, "expected an int >= 0 or None")
        if not isinstance(self.resources, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and v >= 0 for k, v in self.resources.items()
        ):
            _fail("resources", self.resources, "expected a mapping of resource name -> amount >= 0")
        _set(self, "resources", types.MappingProxyType(dict(self.resources)))

    def resolved_for(self, *, gpu_trainer: bool) -> PipelineConfig:
        """This config with ``worker_sched_idle`` decided where it was left to the consumer (None):
        on when the batches feed a GPU trainer, which sleeps through most of each step and must get a
        core back at once; off for a CPU trainer, which would starve idle-policy workers."""
        if self.worker_sched_idle is not None:
            return self
        return dataclasses.replace(self, worker_sched_idle=bool(gpu_trainer))


# --------------------------------------------------------------------------------------------------
# Strict loading from dicts / YAML


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicated mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ValueError(f"duplicated key {key!r} in YAML (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path) -> dict:
    """Load a YAML mapping safely (no object construction) and strictly (no duplicated keys)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"config {str(path)!r}: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def config_from_dict(cls: type, data: Mapping[str, Any], *, where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys are errors; nested dataclasses recurse."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where or cls.__name__}: unknown key(s) {unknown}; known: {sorted(fields)}")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            value = config_from_dict(hint, value, where=f"{where}.{key}" if where else key)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)
