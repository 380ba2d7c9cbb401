"""Shared bits of the training-job tests: a tiny dataset with corrupt files, tiny job settings."""

from __future__ import annotations

from pathlib import Path

from raypipe.sample_data import write_sample_data
from raypipe.train.args import parse_job

REPO = Path(__file__).resolve().parent.parent


def tiny_dataset(root: Path, *, classes: int = 4, per_class: int = 10, corrupt: int = 3) -> Path:
    """An image folder of real-photo JPEGs plus ``corrupt`` files that cannot be decoded."""
    write_sample_data(root, classes=classes, per_class=per_class, seed=2)
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    for i in range(corrupt):
        (class_dirs[i % len(class_dirs)] / f"zz_corrupt_{i}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg" * (i + 1))
    return root


def tiny_args(data: Path, storage: Path, name: str, *extra: str) -> list[str]:
    return [
        "--data",
        str(data),
        "--model",
        "resnet10t",
        "--img-size",
        "32",
        "-b",
        "8",
        "--epochs",
        "1",
        "--val-split",
        "0.2",
        "--lr",
        "0.01",
        "--warmup-epochs",
        "0",
        "--chunk-rows",
        "16",
        "--storage-path",
        str(storage),
        "--name",
        name,
        "--max-skip-ratio",
        "0.3",  # the corrupt files are on purpose: a few of a tiny rank's shard
        *extra,
    ]


def tiny_job(data: Path, storage: Path, name: str, *extra: str):
    return parse_job(tiny_args(data, storage, name, *extra))
