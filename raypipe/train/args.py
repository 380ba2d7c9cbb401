"""The training job's flags (timm train.py names) and strict YAML, merged into a frozen ``TrainJobConfig``.

Precedence: the embedded default job (``TrainJobConfig``'s defaults and ``DEFAULTS``) < ``-c/--config``
YAML < flags given on the command line. The YAML is raypipe's one config schema (``raypipe.config.
load_config``): sections ``augment``, ``eval``, ``pipeline``, ``execution`` and ``decode``, which
`raypipe run -c` reads too, and ``train``, this job's own settings (``TrainJobConfig``'s fields:
``model``, ``epochs``, ``lr`` …), which `raypipe run` accepts and ignores. What the file leaves out the
job takes from its embedded default job (``DEFAULTS``, e.g. 64 px images), `raypipe run` from the
library's defaults: a file meant for both sets those keys. An unknown section or key, or a duplicated key, is an error.
The augmentation and pipeline flags are raypipe's shared ones (``raypipe.flags``), so their names and
checks match ``raypipe run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from raypipe._values import fail, is_int, is_number
from raypipe.config import (
    DATA_SECTION,
    TRAIN_SECTION,
    DecodeConfig,
    EvalAugment,
    ExecutionConfig,
    PipelineConfig,
    TrainAugment,
    config_sections,
    load_yaml,
)
from raypipe.flags import add_augment_args, add_index_arg, add_mixture_args, add_pipeline_args, build_configs

__all__ = ["TrainJobConfig", "build_parser", "parse_job", "parse_job_args", "job_from_namespace", "DEFAULTS"]

# The embedded default job: sample data, a small model, a few minutes on 2 CPU cores. Keyed by flag
# dest name; below the config file and the flags.
DEFAULTS: dict[str, Any] = {
    "img_size": 64,
    "batch_size": 32,
    "scale": (0.35, 1.0),
}


@dataclass(frozen=True, kw_only=True)
class TrainJobConfig:
    """Everything a training run needs; validated on construction, picklable for Ray workers."""

    # a path or URI; several datasets mixed by weight (``raypipe.sources.data_parts.DataParts``); None:
    # generate the sample dataset into sample_dir
    data: Any = None
    val_data: str | None = None
    val_split: float = 0.1
    kind: str | None = None
    index: str | None = None  # --data's shard index, where it is not beside the shards
    sample_dir: str = "sample_data"
    sample_per_class: int = 100
    model: str = "resnet10t"
    num_classes: int | None = None  # None: from the dataset
    epochs: int = 8
    lr: float = 2e-3
    opt: str = "adamw"
    momentum: float = 0.9
    sched: str = "cosine"
    warmup_epochs: int = 1
    warmup_lr: float = 1e-5
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    reprob: float = 0.0
    remode: str = "pixel"
    recount: int = 1
    mixup: float = 0.0
    cutmix: float = 0.0
    smoothing: float = 0.0
    amp: bool = False
    channels_last: bool = False
    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 0.5
    storage_path: str = "runs"
    name: str | None = None
    max_failures: int = 0
    # a checkpoint after every N optimizer steps of an epoch as well as at its end (None: at its end only)
    checkpoint_steps: int | None = None
    preprocess_resource: str | None = None
    record_ids: bool = False  # each rank writes the sample ids it trained on (tests, audits)
    # "process": each rank's epochs run in a feeder process beside it (FeederSource), so the consumer's
    # Python (fetching, packing) does not take the GIL from the training loop; "thread": in the rank's process.
    feeder: str = "process"
    augment: TrainAugment = field(default_factory=TrainAugment)
    eval: EvalAugment = field(default_factory=EvalAugment)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        def refuse(name: str, why: str) -> None:
            fail(name, getattr(self, name), why)

        def is_num(v: Any) -> bool:
            return is_number(v) and math.isfinite(v)

        for name in ("epochs", "num_workers", "recount", "sample_per_class"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                refuse(name, "expected a positive int")
        if not is_int(self.warmup_epochs) or self.warmup_epochs < 0:
            refuse("warmup_epochs", "expected an int >= 0")
        if not is_int(self.max_failures) or self.max_failures < -1:
            refuse("max_failures", "expected an int >= 0, or -1 to retry forever")
        if self.checkpoint_steps is not None and (not is_int(self.checkpoint_steps) or self.checkpoint_steps < 1):
            refuse("checkpoint_steps", "expected a positive int, or None for epoch-end checkpoints only")
        for name in ("lr", "warmup_lr", "min_lr", "weight_decay", "momentum", "mixup", "cutmix"):
            if not is_num(getattr(self, name)) or getattr(self, name) < 0:
                refuse(name, "expected a number >= 0")
        if not self.lr > 0:
            refuse("lr", "expected > 0")
        for name in ("reprob", "smoothing"):
            if not is_num(getattr(self, name)) or not 0 <= getattr(self, name) <= 1:
                refuse(name, "expected a number in [0, 1]")
        if not is_num(self.val_split) or not 0 <= self.val_split < 1:
            refuse("val_split", "expected 0 <= val_split < 1")
        if self.remode not in ("const", "rand", "pixel"):
            refuse("remode", "expected const, rand or pixel")
        if self.feeder not in ("process", "thread"):
            refuse("feeder", "expected process or thread")
        if not is_num(self.cpus_per_worker) or not 0 <= self.cpus_per_worker <= 256:
            refuse("cpus_per_worker", "expected 0 <= cpus_per_worker <= 256 (fractions allowed)")
        if self.num_classes is not None and (not is_int(self.num_classes) or self.num_classes < 1):
            refuse("num_classes", "expected a positive int or None")
        if not isinstance(self.model, str) or not self.model:
            refuse("model", "expected a timm model name")
        if self.name is not None and (not self.name or "/" in self.name or self.name.startswith(".")):
            refuse("name", "expected a plain directory name")
        if self.preprocess_resource is not None and not self.preprocess_resource:
            refuse("preprocess_resource", "expected a Ray resource name")
        if self.data is not None and not (self.data and isinstance(self.data, str)):
            from raypipe.sources.data_parts import DataParts

            if not isinstance(self.data, DataParts):
                refuse("data", "expected a dataset's path or URI, or several (a data: list)")
        for name in ("amp", "channels_last", "use_gpu", "record_ids"):
            if not isinstance(getattr(self, name), bool):
                refuse(name, "expected true or false")

    @property
    def listing(self):
        """How ``data`` is listed (``raypipe.sources.ListingOptions``): ``kind`` and ``index``."""
        from raypipe.sources import ListingOptions

        return ListingOptions(kind=self.kind, index=self.index)

    @property
    def soft_targets(self) -> bool:
        """Mixup/cutmix on: the DeviceLoader makes soft targets (smoothing folded in)."""
        return self.mixup > 0 or self.cutmix > 0

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["execution"]["resources"] = dict(self.execution.resources)
        return out


# dest -> TrainJobConfig field, for the job's own flags
_JOB_FIELDS = (
    "data",
    "val_data",
    "val_split",
    "kind",
    "index",
    "sample_dir",
    "sample_per_class",
    "model",
    "num_classes",
    "epochs",
    "lr",
    "opt",
    "momentum",
    "sched",
    "warmup_epochs",
    "warmup_lr",
    "min_lr",
    "weight_decay",
    "reprob",
    "remode",
    "recount",
    "mixup",
    "cutmix",
    "smoothing",
    "amp",
    "channels_last",
    "num_workers",
    "use_gpu",
    "cpus_per_worker",
    "storage_path",
    "name",
    "max_failures",
    "checkpoint_steps",
    "preprocess_resource",
    "record_ids",
    "feeder",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jobs/train.py",
        description="Train a timm model on Ray: augmentation on the cluster, one DDP worker per GPU.",
    )
    g = p.add_argument_group("data and model")
    g.add_argument(
        "--data",
        action="append",
        help="image folder, Parquet, CSV/JSONL manifest or WebDataset shards, local or a URI; given again "
        "for each dataset of a mixture (--weights) (default: generated sample data)",
    )
    add_mixture_args(g)
    g.add_argument("--val-data", help="evaluation dataset (default: a held-out --val-split of --data)")
    g.add_argument("--val-split", type=float, help="fraction held out for eval, chosen by a hash of each image's path")
    g.add_argument(
        "--kind", choices=("folder", "parquet", "manifest", "webdataset"), help="dataset kind (detected if omitted)"
    )
    add_index_arg(g)
    g.add_argument("--sample-dir", help="where the sample dataset is generated when --data is not given")
    g.add_argument("--sample-per-class", type=int, help="sample dataset images per class (10 classes)")
    g.add_argument("--model", help="timm model name (pretrained=False)")
    g.add_argument("--num-classes", type=int, help="classifier outputs (default: from the dataset)")
    g = p.add_argument_group("optimisation (timm train.py names)")
    g.add_argument("--epochs", type=int)
    g.add_argument("--lr", type=float, help="learning rate")
    g.add_argument("--opt", help="timm optimizer name (sgd, adamw, lamb, …)")
    g.add_argument("--momentum", type=float)
    g.add_argument("--sched", help="timm scheduler name (cosine, step, …)")
    g.add_argument("--warmup-epochs", type=int)
    g.add_argument("--warmup-lr", type=float)
    g.add_argument("--min-lr", type=float)
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--reprob", type=float, help="random erasing probability (on the trainer's device)")
    g.add_argument("--remode", choices=("const", "rand", "pixel"), help="random erasing mode")
    g.add_argument("--recount", type=int, help="random erasing count")
    g.add_argument("--mixup", type=float, help="mixup alpha (0: off)")
    g.add_argument("--cutmix", type=float, help="cutmix alpha (0: off)")
    g.add_argument("--smoothing", type=float, help="label smoothing")
    g.add_argument("--amp", action="store_true", default=None, help="mixed precision (fp16 on CUDA, bf16 on CPU)")
    g.add_argument("--channels-last", action="store_true", default=None, help="channels_last model and input")
    g = p.add_argument_group("Ray")
    g.add_argument("--num-workers", type=int, help="training workers (one per GPU with --use-gpu)")
    g.add_argument("--use-gpu", action="store_true", default=None, help="one GPU per training worker")
    g.add_argument("--cpus-per-worker", type=float, help="CPUs each training worker reserves (fractions allowed)")
    g.add_argument(
        "--storage-path",
        help="where checkpoints and metrics.json go: a URI (s3://…) or a path every node reads (checked at "
        "the start); a relative path is from the current directory, and refused under ray job submit (default: runs)",
    )
    g.add_argument("--name", help="run name; re-running with the same name resumes from its last checkpoint")
    g.add_argument("--max-failures", type=int, help="restarts from the last checkpoint after a worker dies")
    g.add_argument(
        "--checkpoint-steps",
        type=int,
        metavar="N",
        help="also checkpoint inside an epoch, after every N optimizer steps (default: at epoch ends only)",
    )
    g.add_argument("--preprocess-resource", help="Ray resource augmentation workers ask 0.001 of (cluster.yaml)")
    g.add_argument("--record-ids", action="store_true", default=None, help="write the sample ids each rank trained on")
    g.add_argument(
        "--feeder",
        choices=("process", "thread"),
        help="where each rank's batch consumer runs: a process beside it, or a thread",
    )
    g = p.add_argument_group("output")
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show Ray's own lines: its start-up warnings and Ray Train's INFO lines (resources, "
        "worker group, each report and checkpoint)",
    )
    add_augment_args(p)
    add_pipeline_args(p)  # also -b/--batch-size, --seed and -c/--config
    for action in p._actions:  # the shared flags' help shows the library's defaults: show this job's
        if action.dest in DEFAULTS and action.help:
            value = DEFAULTS[action.dest]
            shown = " ".join(map(str, value)) if isinstance(value, (tuple, list)) else value
            action.help = re.sub(r"\(default: [^)]*\)", f"(default: {shown})", action.help)
    return p


def job_from_namespace(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> TrainJobConfig:
    """Merge defaults < YAML (``args.config``) < given flags into a validated ``TrainJobConfig``.

    ``parser`` is accepted for callers that pass theirs; the merge needs only ``args``."""
    config = load_yaml(args.config) if getattr(args, "config", None) else {}
    where = getattr(args, "config", None) or "config"
    train = config_sections(config, where=where).get(TRAIN_SECTION, {})
    unknown = sorted(set(train) - set(_JOB_FIELDS))
    if unknown:
        raise ValueError(f"{where}: {TRAIN_SECTION}: unknown key(s) {unknown}; known: {sorted(_JOB_FIELDS)}")
    sections = build_configs(args, config=config, defaults=DEFAULTS)
    job = {k: v for k, v in train.items() if v is not None}
    job |= {k: getattr(args, k) for k in _JOB_FIELDS if getattr(args, k, None) is not None}
    job["data"] = _job_data(args, config, job.get("data"), where)
    execution = sections["execution"]
    if job.get("preprocess_resource"):
        execution = dataclasses.replace(execution, resources={job["preprocess_resource"]: 0.001})
    return TrainJobConfig(
        **job,
        augment=sections["augment"],
        eval=sections["eval"],
        pipeline=sections["pipeline"],
        execution=execution,
        decode=sections["decode"],
    )


def _job_data(args: argparse.Namespace, config: dict, named: Any, where: str) -> Any:
    """The job's data: ``--data`` (several, or with ``--weights``/``--samples-per-epoch``: a mixture),
    else the config's ``data:`` section, else its ``train: {data: PATH}`` (both: an error)."""
    weights, spe = getattr(args, "weights", None), getattr(args, "samples_per_epoch", None)
    if isinstance(named, list):  # --data, given once or more
        if len(named) == 1 and weights is None and spe is None:
            return named[0]
        from raypipe.sources.data_parts import data_parts

        parts = data_parts(named, weights, spe)
        return parts if parts.is_mixture else named[0]
    section = config.get(DATA_SECTION) if isinstance(config, dict) else None
    if section:
        if named is not None:
            raise ValueError(f"{where}: data is named twice, in the data section and in train: keep one")
        if weights is not None:
            raise ValueError(f"--weights: {where} names the datasets; their weights are set there")
        from raypipe.sources.data_parts import parse_data_section

        parts = parse_data_section(section, where=where)
        parts = dataclasses.replace(parts, samples_per_epoch=spe) if spe is not None else parts
        return parts if parts.is_mixture or parts.parts[0].options else parts.parts[0].path
    if weights is not None or spe is not None:
        raise ValueError("--weights and --samples-per-epoch are for the --data datasets of a mixture")
    return named


def parse_job(argv: list[str] | None = None) -> TrainJobConfig:
    return parse_job_args(argv)[0]


def parse_job_args(argv: list[str] | None = None) -> tuple[TrainJobConfig, argparse.Namespace]:
    """The job and the parsed flags (``verbose`` is how the job shows, not part of the job). Imports
    no Ray: ``jobs/train.py`` acts on ``-v`` before Ray is imported."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return job_from_namespace(args, parser), args
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
