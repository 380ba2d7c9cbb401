"""Configuration: frozen, keyword-only dataclasses, validated on construction (``ValueError`` naming the
field). Field names follow timm's (``scale``, ``ratio``, ``hflip`` …) so a timm user can read a raypipe
config without a glossary. YAML loads strictly: unknown or duplicated keys are errors, never ignored."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raypipe._strict_yaml import load_yaml
from raypipe._values import check_prob, fail, is_int, is_number

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DecodeConfig",
    "TrainAugment",
    "EvalAugment",
    "PipelineConfig",
    "ExecutionConfig",
    "auto_chunk_rows",
    "config_from_dict",
    "load_yaml",
    "CONFIG_SECTIONS",
    "TRAIN_SECTION",
    "DATA_SECTION",
    "Config",
    "config_sections",
    "resolve_sections",
    "load_config",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "random")
CROP_MODES = ("center", "squash", "border")
# Pillow's own default decompression-bomb limit, so behaviour matches what users know.
DEFAULT_MAX_PIXELS = 89_478_485


def _size2(name: str, value: Any) -> tuple[int, int]:
    """Accept an int (square), a (H, W) pair or timm's (C, H, W) input_size."""
    if is_int(value):
        value = (value, value)
    elif isinstance(value, str) or not isinstance(value, Iterable):
        fail(name, value, "expected an int or (H, W)")
    value = tuple(value)
    if len(value) == 3:
        if value[0] != 3:
            fail(name, value, "only 3-channel input is supported")
        value = value[1:]
    if len(value) != 2 or not all(is_int(v) for v in value):
        fail(name, value, "expected an int, (H, W) or (3, H, W)")
    if min(value) < 1 or max(value) > 8192:
        fail(name, value, "sizes must be in 1..8192")
    return (int(value[0]), int(value[1]))


def _range2(name: str, value: Any, lo: float, hi: float) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        fail(name, value, "expected a (min, max) pair of numbers")
    if not (lo <= a <= b <= hi) or math.isnan(a) or math.isnan(b):
        fail(name, value, f"expected {lo} <= min <= max <= {hi}")
    return (a, b)


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """How bytes become pixels.

    Args:
        Keyword-only fields, each documented beside it below.

    Raises:
        ValueError: ``max_pixels`` not an int >= 1, or ``dct_scaling`` neither a bool nor None.
    """

    max_pixels: int = DEFAULT_MAX_PIXELS  # refuse larger images from the header (decompression bombs)
    # Let libjpeg-turbo decode JPEGs at 1/2, 1/4, 1/8 when the crop allows. None: on for training,
    # off for eval, whose pixels are then timm's byte for byte (a scaled decode is close, not equal).
    dct_scaling: bool | None = None

    def __post_init__(self) -> None:
        if not is_int(self.max_pixels) or self.max_pixels < 1:
            fail("max_pixels", self.max_pixels, "expected a positive int")
        _set(self, "max_pixels", int(self.max_pixels))
        if self.dct_scaling is not None and not isinstance(self.dct_scaling, bool):
            fail("dct_scaling", self.dct_scaling, "expected true, false or null (on for train, off for eval)")

    def dct_for(self, training: bool) -> bool:
        """Whether a transform decodes JPEGs DCT-scaled: ``dct_scaling``, or by default only in training."""
        return training if self.dct_scaling is None else self.dct_scaling


@dataclass(frozen=True, kw_only=True)
class TrainAugment:
    """timm's training transform (``transforms_imagenet_train``), minus tensor conversion.

    Normalisation, random erasing and mixup/cutmix run on the trainer's device (``DeviceLoader``).

    Args:
        Keyword-only fields, timm's names, some documented beside them below (``input_size``: an
            int, (H, W) or (3, H, W)).

    Raises:
        ValueError: an invalid field, named.
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
            fail("scale", self.scale, "max must be > 0")
        _set(self, "ratio", _range2("ratio", self.ratio, 1e-3, 1e3))
        if self.interpolation not in INTERPOLATIONS:
            fail("interpolation", self.interpolation, f"expected one of {INTERPOLATIONS}")
        for name in ("hflip", "vflip", "grayscale_prob", "gaussian_blur_prob"):
            _set(self, name, check_prob(name, getattr(self, name)))
        if self.color_jitter_prob is not None:
            _set(self, "color_jitter_prob", check_prob("color_jitter_prob", self.color_jitter_prob))
        cj = self.color_jitter
        if cj is not None:
            if is_number(cj):
                cj = (float(cj),) * 3
            try:
                cj = tuple(float(v) for v in cj)
            except (TypeError, ValueError):
                fail("color_jitter", self.color_jitter, "expected a number or a 3/4-tuple")
            if len(cj) not in (3, 4) or any(v < 0 for v in cj) or (len(cj) == 4 and cj[3] > 0.5):
                fail("color_jitter", self.color_jitter, "expected 3 or 4 values >= 0 (hue <= 0.5)")
            _set(self, "color_jitter", cj)
        if self.auto_augment is not None:
            if not isinstance(self.auto_augment, str) or not self.auto_augment:
                fail("auto_augment", self.auto_augment, "expected a timm policy string")
            head = self.auto_augment.split("-")[0]
            if head not in ("rand", "augmix", "original", "originalr", "v0", "v0r", "3a"):
                fail("auto_augment", self.auto_augment, "unknown policy (rand-, augmix-, original, v0, 3a)")
        _set(self, "mean", _range_mean("mean", self.mean))


def _range_mean(name: str, value: Any) -> tuple[float, float, float]:
    try:
        v = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        fail(name, value, "expected 3 numbers")
    if len(v) != 3 or not all(0.0 <= x <= 1.0 for x in v):
        fail(name, value, "expected 3 numbers in [0, 1]")
    return v  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class EvalAugment:
    """timm's eval transform: resize by ``crop_pct`` then crop (``transforms_imagenet_eval``).

    Args:
        Keyword-only fields, timm's names (``input_size``: an int, (H, W) or (3, H, W)).

    Raises:
        ValueError: an invalid field, named.
    """

    input_size: Any = (224, 224)
    crop_pct: float = 0.875
    crop_mode: str = "center"
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        _set(self, "input_size", _size2("input_size", self.input_size))
        if not is_number(self.crop_pct) or not (0.0 < self.crop_pct <= 1.0):
            fail("crop_pct", self.crop_pct, "expected 0 < crop_pct <= 1")
        if self.crop_mode not in CROP_MODES:
            fail("crop_mode", self.crop_mode, f"expected one of {CROP_MODES}")
        if self.interpolation not in ("bilinear", "bicubic"):
            fail("interpolation", self.interpolation, "expected bilinear or bicubic")


def auto_chunk_rows(batch_size: int) -> int:
    """Rows per chunk (one augmentation task) for a batch size: the smallest multiple of it that is
    >= 128 for batches up to 256, so each batch is a view of one chunk and the consumer packs it
    without a copy; for bigger batches the largest divisor in 128..256, else 256. Fewer rows pay
    Ray's per-task cost too often; more make each epoch's first batch wait longer."""
    if batch_size <= 256:
        return batch_size * -(-128 // batch_size)
    divisors = [d for d in range(256, 127, -1) if batch_size % d == 0]
    return divisors[0] if divisors else 256


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """What the batches are: their size, order and the skips an epoch may have. How they are made
    (workers, chunks, priorities) is ``ExecutionConfig``'s.

    Args:
        Keyword-only fields, each documented beside it below.

    Raises:
        ValueError: an invalid field, named.
    """

    batch_size: int = 256
    drop_last: bool = False
    shuffle: bool = True
    seed: int = 0
    # Sharded sources (Parquet row groups, tar shards): rows are shuffled inside windows of about this
    # many rows (whole shards), so each shard is read once per epoch; 2048 mixes a class-sorted file's
    # batches 0.97-1.0x as well as a global shuffle (raypipe.plan.order).
    shuffle_window: int = 2048
    # An epoch fails when more than this share of its rows is skipped (None: never). Real corruption is
    # rarer than 1 %; a broken mount, a wrong column or a bad export is far worse and must not train on.
    # Small epochs feel it first: 1 bad of 50 is 2 %. Raise it with --max-skip-ratio.
    max_skip_ratio: float | None = 0.01
    max_skips: int | None = None  # fail the epoch after this many skips (None: no count limit)

    def __post_init__(self) -> None:
        for name in ("batch_size", "shuffle_window"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                fail(name, v, "expected a positive int")
            _set(self, name, int(v))
        if not is_int(self.seed) or self.seed < 0:
            fail("seed", self.seed, "expected an int >= 0")
        _set(self, "seed", int(self.seed))
        if self.max_skip_ratio is not None:
            _set(self, "max_skip_ratio", check_prob("max_skip_ratio", self.max_skip_ratio))
        if self.max_skips is not None:
            if not is_int(self.max_skips) or self.max_skips < 0:
                fail("max_skips", self.max_skips, "expected an int >= 0 or None")
            _set(self, "max_skips", int(self.max_skips))


BACKENDS = ("auto", "ray", "local", "nodes")
# An elastic rank's ceiling where the user set none: a bound on a runaway, not a size (the autoscaler's
# max_workers is the cluster's).
MAX_ELASTIC_WORKERS = 64
# Tasks that read an object per row from a store ask for half a core each (ExecutionConfig.cpus_per_task_for).
STORE_CPUS_PER_TASK = 0.5


@dataclass(frozen=True, kw_only=True)
class ExecutionConfig:
    """How a rank's batches are made on the cluster: workers, chunks, priorities.

    Args:
        Keyword-only fields, each documented beside it below.

    Raises:
        ValueError: an invalid field, or fields that contradict each other (``elastic`` without
            ``backend="nodes"`` or with ``num_tasks``; ``min_cpus`` > ``max_cpus``), named.
    """

    # Augmentation tasks a rank keeps running at once; None: its share of the cluster (raypipe.pipeline.budget).
    num_tasks: int | None = None
    # CPUs a task is sized for; None: decided by the dataset (cpus_per_task_for). A rank's share runs the
    # nearest whole number of such tasks, each asking for an equal part of it (at most this), so a
    # fraction of a core held by a feeder or trainer idles no core (raypipe.pipeline.budget). One task
    # per core: a node runs no more worker processes than it has cores, each paying its own set-up.
    # Two per core where the tasks read an object per row from an object store: a task's first rows
    # wait a first-byte latency, and the core's other task decodes meanwhile.
    cpus_per_task: float | None = None
    # Rows per chunk (one task) of an unsharded source; None: auto_chunk_rows(batch_size).
    chunk_rows: int | None = None
    # Finished chunks a rank may hold beyond one per running task (the consumer's look-ahead); with
    # the workers it bounds the object store a rank fills: (workers + prefetch_chunks) chunks.
    prefetch_chunks: int = 2
    # Niceness of the thread that runs the augmentation on a worker (0..19): the consumer (trainer,
    # feeder, packing, DeviceLoader) is on the critical path and must win a core when it needs one.
    # 0 gives a fair share on a machine shared with other jobs. Per thread: later tasks on the worker
    # process keep their priority.
    worker_nice: int = 10
    # That thread under Linux SCHED_IDLE instead: it runs only when a core is otherwise idle, so a GPU
    # trainer waking after each step gets a core at once; it would starve beside a CPU trainer or other
    # busy jobs. None: decided by the consumer that knows its device (resolved_for): on in the training
    # job and the timm drop-in when they feed CUDA, off for a CPU trainer and in the plain Python API.
    worker_sched_idle: bool | None = None
    # Extra Ray resources each augmentation task asks for, to steer it to preprocessing nodes.
    resources: Mapping[str, float] = field(default_factory=dict)
    # Where the augmentation tasks run: "ray" (Ray tasks on the connected cluster's nodes), "local"
    # (worker processes of this machine, no Ray: raypipe.workers.local), "nodes" (raypipe's
    # worker processes on each node of the connected cluster that offers `resources`, their images
    # streamed to this process: raypipe.workers.node), or "auto": Ray when this process is
    # connected to it (or connecting, or RAY_ADDRESS names a cluster), else local.
    backend: str = "auto"
    # With backend "nodes": the rank's width follows its consumer's demand (raypipe.pipeline.elastic):
    # wider while it waits for chunks and the workers are busy, narrower once chunks sit ready; what
    # the cluster lacks is asked of its autoscaler as pending workers, withdrawn when no longer wanted.
    elastic: bool = False
    # An elastic rank's bounds in CPUs (whole workers of cpus_per_task: the floor rounded up, the
    # ceiling down); None: one worker, and MAX_ELASTIC_WORKERS workers.
    min_cpus: float | None = None
    max_cpus: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_tasks", "chunk_rows"):
            v = getattr(self, name)
            if v is not None:
                if not is_int(v) or v < 1:
                    fail(name, v, "expected a positive int or None")
                _set(self, name, int(v))
        c = self.cpus_per_task
        if c is not None and (not is_number(c) or not 0 < c <= 64):
            fail("cpus_per_task", c, "expected 0 < cpus_per_task <= 64, or null (auto)")
        p = self.prefetch_chunks
        if not is_int(p) or p < 0:
            fail("prefetch_chunks", p, "expected an int >= 0")
        _set(self, "prefetch_chunks", int(p))
        if self.worker_sched_idle is not None and not isinstance(self.worker_sched_idle, bool):
            fail("worker_sched_idle", self.worker_sched_idle, "expected true, false or null (auto)")
        nice = self.worker_nice
        if not is_int(nice) or not 0 <= nice <= 19:
            fail("worker_nice", self.worker_nice, "expected an int in 0..19")
        _set(self, "worker_nice", int(nice))
        if not isinstance(self.resources, Mapping) or not all(
            isinstance(k, str) and is_number(v) and v >= 0 for k, v in self.resources.items()
        ):
            fail("resources", self.resources, "expected a mapping of resource name -> amount >= 0")
        _set(self, "resources", types.MappingProxyType(dict(self.resources)))
        if self.backend not in BACKENDS:
            fail("backend", self.backend, f"expected one of {', '.join(BACKENDS)}")
        if not isinstance(self.elastic, bool):
            fail("elastic", self.elastic, "expected true or false")
        if self.elastic and self.backend != "nodes":
            fail("elastic", self.elastic, f"an elastic width needs backend='nodes', not {self.backend!r}")
        if self.elastic and self.num_tasks is not None:
            fail("elastic", self.elastic, f"num_tasks={self.num_tasks} fixes the width: set one of the two")
        for name in ("min_cpus", "max_cpus"):
            v = getattr(self, name)
            if v is not None and (not is_number(v) or not v > 0):
                fail(name, v, "expected a number > 0, or null")
        if self.min_cpus is not None and self.max_cpus is not None and self.min_cpus > self.max_cpus:
            fail("min_cpus", self.min_cpus, f"expected <= max_cpus ({self.max_cpus})")

    def chunk_rows_for(self, batch_size: int) -> int:
        return self.chunk_rows or auto_chunk_rows(batch_size)

    def cpus_per_task_for(self, *, store_objects: bool) -> float:
        """``cpus_per_task``, or where it was left to the dataset (None): 0.5 when the tasks read an
        object per row from an object store (``store_objects``: a remote folder or manifest without the
        local cache), each waiting a first-byte latency before its first rows decode, a sizable share
        of a chunk of ``chunk_rows`` rows (docs/performance.md, "Object stores and shard formats"); else
        1.0."""
        if self.cpus_per_task is not None:
            return float(self.cpus_per_task)
        return STORE_CPUS_PER_TASK if store_objects else 1.0

    def resolved_for(self, *, gpu_trainer: bool) -> ExecutionConfig:
        """This config with ``worker_sched_idle`` decided where it was left to the consumer (None):
        on when the batches feed a GPU trainer, which sleeps through most of each step and must get a
        core back at once; off for a CPU trainer, which would starve idle-policy workers."""
        if self.worker_sched_idle is not None:
            return self
        return dataclasses.replace(self, worker_sched_idle=bool(gpu_trainer))


# --------------------------------------------------------------------------------------------------
# Strict loading from dicts (YAML files: raypipe._strict_yaml)


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


# --------------------------------------------------------------------------------------------------
# The one config schema: `raypipe run -c`, `jobs/train.py -c` and ``load_config`` read the same file.

CONFIG_SECTIONS = {
    "augment": TrainAugment,
    "eval": EvalAugment,
    "pipeline": PipelineConfig,
    "execution": ExecutionConfig,
    "decode": DecodeConfig,
}
# The training job's own settings (``raypipe.train.TrainJobConfig``'s fields: model, epochs, lr …), which
# only jobs/train.py reads: one file serves the job and `raypipe run`'s dry run of its pipeline.
TRAIN_SECTION = "train"
DATA_SECTION = "data"  # the datasets, several mixed by weight (``raypipe.sources.data_parts``)


def config_sections(data: Mapping[str, Any], *, where: str = "config") -> dict[str, dict]:
    """The sections of a raypipe config mapping, each a dict. Any other top-level key is an error."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping of sections, got {type(data).__name__}")
    known = (*CONFIG_SECTIONS, TRAIN_SECTION, DATA_SECTION)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown section(s) {unknown}; sections are {', '.join(known)}")
    for name, value in data.items():  # data: a list or a mapping, kept as written (parse_data_section)
        if name != DATA_SECTION and value is not None and not isinstance(value, Mapping):
            raise ValueError(f"{where}: section {name!r} must be a mapping, got {type(value).__name__}")
    return {name: value if name == DATA_SECTION else dict(value or {}) for name, value in data.items()}


def resolve_sections(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Validated config objects for ``CONFIG_SECTIONS`` from their raw fields. Eval takes training's
    output size (and bilinear/bicubic interpolation) unless its own section sets one."""
    raw = {name: dict(raw.get(name) or {}) for name in CONFIG_SECTIONS}
    if "input_size" in raw["augment"] and "input_size" not in raw["eval"]:
        raw["eval"]["input_size"] = raw["augment"]["input_size"]
    if raw["augment"].get("interpolation") in ("bilinear", "bicubic") and "interpolation" not in raw["eval"]:
        raw["eval"]["interpolation"] = raw["augment"]["interpolation"]
    return {name: config_from_dict(cls, raw[name], where=name) for name, cls in CONFIG_SECTIONS.items()}


@dataclass(frozen=True, kw_only=True)
class Config:
    """A whole raypipe config file (``load_config`` reads one).

    Args:
        augment, eval, pipeline, execution, decode: the validated sections (left out: the defaults).
        train: the training job's section, kept as it was written (``jobs/train.py`` checks it).
        data: the ``data`` section's datasets (``raypipe.sources.data_parts.DataParts``), or None.

    Raises:
        TypeError, ValueError: a ``train`` that ``dict()`` refuses (the other fields are not checked).
    """

    augment: TrainAugment = field(default_factory=TrainAugment)
    eval: EvalAugment = field(default_factory=EvalAugment)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    train: Mapping[str, Any] = field(default_factory=dict)
    data: Any = None

    def __post_init__(self) -> None:
        _set(self, "train", types.MappingProxyType(dict(self.train)))


def load_config(source: str | Path | Mapping[str, Any]) -> Config:
    """Load a config file (or mapping) in the schema `raypipe run -c` and `jobs/train.py -c` read::

        augment:  {input_size: 160, auto_augment: rand-m9-mstd0.5-inc1}   # TrainAugment
        eval:     {crop_pct: 0.95}                                        # EvalAugment
        pipeline: {batch_size: 256}                                       # PipelineConfig
        execution: {cpus_per_task: 1.0}                                   # ExecutionConfig
        decode:   {max_pixels: 89478485}                                  # DecodeConfig
        train:    {model: resnet50, epochs: 100}                          # the training job only

    Every section is optional (``data``: the datasets, ``raypipe.sources.data_parts``); eval takes
    training's ``input_size`` (and bilinear/bicubic ``interpolation``) unless its own section sets one.

    Args:
        source: a YAML file's path, or the mapping it would hold.

    Returns:
        The validated ``Config``.

    Raises:
        ValueError: the file cannot be read or parsed, an unknown section or key, a duplicated key, or
            an invalid field (named); the ``train`` section's keys are the training job's to check.
    """
    where = "config" if isinstance(source, Mapping) else str(source)
    data = source if isinstance(source, Mapping) else load_yaml(source)
    sections = config_sections(data, where=where)
    datasets = None
    if sections.get(DATA_SECTION):
        from raypipe.sources.data_parts import parse_data_section

        datasets = parse_data_section(sections[DATA_SECTION], where=where)
    return Config(**resolve_sections(sections), train=sections.get(TRAIN_SECTION, {}), data=datasets)
