"""Per-epoch metrics: combine the ranks' counts, print one plain line, keep ``metrics.json`` current.

Every rank measures its own epoch (``RankEpoch``); rank 0 gathers them and ``combine`` sums the
counts (never averages of averages). The run directory may be local or any pyarrow filesystem URI
(``s3://…``), the same place Ray Train keeps its checkpoints.
"""

from __future__ import annotations

import json
import posixpath
from collections import Counter
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

__all__ = ["RankEpoch", "combine", "format_line", "format_metric", "RunDir"]


@dataclass
class RankEpoch:
    """What one rank saw in one epoch."""

    rank: int
    steps: int = 0
    samples: int = 0  # images the model trained on (what the DeviceLoader delivered)
    loss_sum: float = 0.0  # sum over samples of the training loss
    train_s: float = 0.0  # wall time of the training pass, data waits included
    wait_s: float = 0.0  # time blocked on the DeviceLoader (data stall)
    checkpoint_s: float = 0.0  # time in checkpoints inside the epoch (not part of train_s)
    emitted: int = 0  # from the pipeline's accounting
    expected: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_paths: list[dict] = field(default_factory=list)
    eval_correct1: int = 0
    eval_correct5: int = 0
    eval_count: int = 0
    eval_loss_sum: float = 0.0
    eval_s: float = 0.0


def combine(
    epoch: int,
    ranks: list[RankEpoch],
    *,
    lr: float,
    resumed_from_epoch: int | None,
    resumed_from_step: int | None = None,
    repeated_batches: int | None = None,
) -> dict:
    """One epoch's metrics from all ranks' records. ``resumed_from_epoch``/``resumed_from_step``: where
    the attempt that ran it started (None: the run's start; a step: inside that epoch, after that step
    of it, which an earlier attempt trained: the counts of that epoch are then this attempt's part).
    ``repeated_batches``: batches of the epoch a dead attempt trained after the checkpoint this one
    resumed from, trained again (None: not known, ``--record-ids`` off)."""
    samples = sum(r.samples for r in ranks)
    train_s = max((r.train_s for r in ranks), default=0.0)
    skipped = Counter()
    for r in ranks:
        skipped.update(r.skipped)
    n_eval = sum(r.eval_count for r in ranks)
    paths = sorted((p for r in ranks for p in r.skipped_paths), key=lambda p: p["sample_id"])
    return {
        "epoch": epoch,
        "lr": lr,
        "resumed_from_epoch": resumed_from_epoch,
        "resumed_from_step": resumed_from_step,
        "repeated_batches": repeated_batches,
        "train_loss": sum(r.loss_sum for r in ranks) / samples if samples else float("nan"),
        "eval_top1": 100.0 * sum(r.eval_correct1 for r in ranks) / n_eval if n_eval else float("nan"),
        "eval_top5": 100.0 * sum(r.eval_correct5 for r in ranks) / n_eval if n_eval else float("nan"),
        "eval_loss": sum(r.eval_loss_sum for r in ranks) / n_eval if n_eval else float("nan"),
        "eval_samples": n_eval,
        "images_per_s": samples / train_s if train_s > 0 else 0.0,
        "images_per_s_per_worker": [r.samples / r.train_s if r.train_s > 0 else 0.0 for r in ranks],
        "data_stall_fraction": sum(r.wait_s for r in ranks) / sum(r.train_s for r in ranks) if train_s else 0.0,
        "data_stall_per_worker": [r.wait_s / r.train_s if r.train_s > 0 else 0.0 for r in ranks],
        "train_samples": samples,
        "steps_per_worker": [r.steps for r in ranks],
        "emitted": sum(r.emitted for r in ranks),
        "expected": sum(r.expected for r in ranks),
        "skipped": dict(sorted(skipped.items())),
        "skipped_paths": paths[:100],
        "epoch_s": train_s,
        "eval_s": max((r.eval_s for r in ranks), default=0.0),
        "checkpoint_s": max((r.checkpoint_s for r in ranks), default=0.0),
        "ranks": [{k: v for k, v in asdict(r).items() if k not in ("skipped_paths",)} for r in ranks],
    }


def format_metric(x: float | None, spec: str) -> str:
    """``x`` formatted, or "n/a" for a metric with nothing behind it (an epoch without eval samples:
    NaN in memory, null in metrics.json)."""
    return "n/a" if x is None or x != x else format(x, spec)


def _json_safe(obj):
    """NaN as null, so metrics.json is standard JSON (``NaN`` is a Python extension other parsers refuse)."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def format_line(m: dict, epochs: int) -> str:
    skipped = sum(m["skipped"].values())
    return (
        f"epoch {m['epoch'] + 1}/{epochs}  loss {format_metric(m['train_loss'], '.4f')}  "
        f"top1 {format_metric(m['eval_top1'], '.2f')}  "
        f"top5 {format_metric(m['eval_top5'], '.2f')}  lr {m['lr']:.2e}  {m['images_per_s']:.0f} img/s  "
        f"stall {100 * m['data_stall_fraction']:.0f}%  emitted {m['emitted']}/{m['expected']} skipped {skipped}  "
        f"({m['epoch_s']:.1f}s train, {m['eval_s']:.1f}s eval){_resume_note(m)}"
    )


def _resume_note(m: dict) -> str:
    """For the epoch an attempt resumed inside: after which step, and the batches it trained again."""
    if m["epoch"] != m.get("resumed_from_epoch"):
        return ""
    step, again = m.get("resumed_from_step"), m.get("repeated_batches")
    notes = ([f"resumed after step {step}"] if step is not None else []) + (
        [f"{again} batch(es) trained again"] if again else []
    )
    return "  " + ", ".join(notes) if notes else ""


class RunDir:
    """``<storage_path>/<name>``: a local directory or a pyarrow filesystem URI."""

    def __init__(self, storage_path: str, name: str):
        self.fs, base = (
            pafs.FileSystem.from_uri(storage_path) if "://" in storage_path else (pafs.LocalFileSystem(), storage_path)
        )
        self.path = posixpath.join(base, name)

    def _p(self, rel: str) -> str:
        return posixpath.join(self.path, rel)

    def write_json(self, rel: str, payload) -> None:
        self.fs.create_dir(posixpath.dirname(self._p(rel)), recursive=True)
        tmp = self._p(rel) + ".tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write((json.dumps(_json_safe(payload), indent=1, allow_nan=False) + "\n").encode("utf-8"))
        self.fs.move(tmp, self._p(rel))  # readers never see a half-written file

    def names(self, rel_dir: str) -> list[str]:
        """The names of the files in ``rel_dir`` (none when it does not exist)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self._p(rel_dir), allow_not_found=True))
        return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)

    def delete(self, rel: str) -> None:
        self.fs.delete_file(self._p(rel))

    def read_json(self, rel: str, default=None):
        if self.fs.get_file_info(self._p(rel)).type != pafs.FileType.File:
            return default
        with self.fs.open_input_stream(self._p(rel)) as f:
            return json.loads(f.read().decode("utf-8"))
