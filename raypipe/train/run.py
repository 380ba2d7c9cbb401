"""Driver side of the training job: list the data once, build the ``TorchTrainer``, run it.

Resuming: Ray Train V2 (the default in every Ray that raypipe supports) keeps a checkpoint-manager
snapshot in ``<storage_path>/<name>/`` and reloads it when a trainer starts with the same
``RunConfig(name, storage_path)``, so
``ray.train.get_checkpoint()`` in the loop returns the previous run's latest checkpoint. Re-running
a job with the same ``--name`` therefore continues where it stopped; within one run,
``--max-failures`` restarts the workers from the latest checkpoint the same way.
"""

from __future__ import annotations

import time

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raypipe import runtime
from raypipe.pipeline.accounting import SkipLimitError
from raypipe.pipeline.backend import Decision, decide_here
from raypipe.pipeline.feeder import FEEDER_CPUS
from raypipe.plan.same_listing import ListingMismatchError
from raypipe.sources import ShardChangedError, SourceRows
from raypipe.train import tensorboard
from raypipe.train.args import TrainJobConfig
from raypipe.train.data import job_rows
from raypipe.train.loop import train_loop_per_worker
from raypipe.train.metrics import RunDir, format_metric
from raypipe.train.storage import StorageError, checked_storage, resolve_storage

__all__ = ["run_training", "resolve_storage", "data_failure"]


# Feeder processes per training worker: one for the training split's epochs, one for the eval split's.
SPLITS = 2


def feeder_cpus(job: TrainJobConfig) -> float:
    """Pure: the CPUs one training worker's feeders hold (none with ``--feeder thread``)."""
    return SPLITS * FEEDER_CPUS if job.feeder == "process" else 0.0


def augmentation_cpus(job: TrainJobConfig, total_cpus: float) -> float:
    """Pure: the CPUs of ``total_cpus`` that the training workers and their feeders leave to augmentation."""
    return total_cpus - job.num_workers * (job.cpus_per_worker + feeder_cpus(job))


def workers_decision(job: TrainJobConfig, source_kind: str, connection: str) -> Decision:
    """Where the training workers' tasks run, as this process, which connected (``connection``), sees
    it: the workers are told the connection and decide the same (the other nodes' reach is theirs to
    ask, on their nodes; here it is taken as reachable)."""
    return decide_here(job.execution, source_kind, told=connection, needs_ray=True, probe=False)


def _check_cpus(job: TrainJobConfig, backend: str) -> None:
    """Warn when the trainers and feeders hold every CPU: no augmentation task could start, and the job
    would wait (on an autoscaling cluster more nodes may still come, so this is not an error). Any CPU
    left is enough: the rank's tasks then ask for their share of it (``raypipe.pipeline.budget``).
    ``backend``: where the workers' tasks run (``workers_decision``)."""
    if job.preprocess_resource:
        return  # augmentation has its own nodes
    from raypipe.runtime import private_cluster

    total = ray.cluster_resources().get("CPU", 0.0)
    left = augmentation_cpus(job, total)
    holders = (
        f"{job.num_workers} worker(s) x cpus_per_worker={job.cpus_per_worker} and their feeders "
        f"({feeder_cpus(job):g} CPU each)"
    )
    if backend == "local":  # augmentation in local worker processes, outside Ray's CPUs
        if left < 0:
            raise ValueError(
                f"{holders} ask for more than the cluster's {total:g} CPUs: lower --cpus-per-worker or --num-workers"
            )
        return
    if left <= 0:
        held = f"{holders} hold all {total:g} CPUs, leaving none for augmentation"
        if private_cluster():  # nothing will join a cluster this job started: it would wait forever
            raise ValueError(f"{held}: lower --cpus-per-worker or --num-workers, or give --feeder thread")
        print(f"warning: {held}; the job waits until the cluster grows", flush=True)


def _num_classes(job: TrainJobConfig, train_rows: SourceRows, val_rows: SourceRows) -> int:
    """The model's classes: ``--num-classes``, else the data's (both splits: a label held out for eval
    alone still needs its logit). Fewer than the data has is an error here, not a crash mid-epoch. A
    listing by shard cannot count its classes without reading every row: it takes ``--num-classes``."""
    if job.num_classes is not None and (train_rows.by_shard or val_rows.by_shard):
        return job.num_classes
    data_classes = max(train_rows.num_classes, val_rows.num_classes)
    if job.num_classes is not None and job.num_classes < data_classes:
        raise ValueError(
            f"num_classes={job.num_classes} but the data has {data_classes} classes (labels 0..{data_classes - 1})"
        )
    return job.num_classes or data_classes


def _check_batches(job: TrainJobConfig, train_samples: int) -> None:
    """With drop_last, a rank whose shard is smaller than a batch would train on nothing, every epoch."""
    per_rank = train_samples // job.num_workers  # the smallest shard
    if job.pipeline.drop_last and per_rank < job.pipeline.batch_size:
        raise ValueError(
            f"batch_size={job.pipeline.batch_size} with drop_last: a rank's shard of the {train_samples} training "
            f"samples over {job.num_workers} worker(s) has {per_rank}, so no batch would be trained; lower the "
            "batch size or leave --drop-last off"
        )


# Failures that are about the data or the storage path, not the code: the user needs their message, not
# a traceback.
_DATA_ERRORS = (SkipLimitError, ListingMismatchError, ShardChangedError, StorageError)


def data_failure(error: ray.train.WorkerGroupError) -> Exception | None:
    """The first rank's data error (too many skips, a listing mismatch, a storage path its node does not
    see) among the workers' failures, as
    the same exception type with the rank named; None when a worker failed for any other reason."""
    for rank, failure in sorted(error.worker_failures.items()):
        seen, depth = failure, 0
        while seen is not None and depth < 8:  # the worker's exception, or a wrapper of it
            if isinstance(seen, _DATA_ERRORS):
                return type(seen)(f"rank {rank}: {seen}")
            seen, depth = seen.__cause__ or getattr(seen, "cause", None), depth + 1
    return None


def _ray_train_logging(verbose: bool) -> dict:
    """``RunConfig`` keywords for the level of Ray Train's own console lines: INFO (resources, worker
    group, each checkpoint) with ``verbose``, else WARNING, so its warnings and errors still show; its
    system log files under the session's ``logs/train/`` keep every level. ``ray.train.LoggingConfig``
    is newer than Ray 2.52: there, and for the lines it does not reach, the job's driver leaves them
    out instead (``raypipe.ray_logs.hide_worker_lines``)."""
    logging_config = getattr(ray.train, "LoggingConfig", None)
    if logging_config is None:
        return {}
    return {"logging_config": logging_config(log_level="INFO" if verbose else "WARNING")}


def run_training(job: TrainJobConfig, *, verbose: bool = False) -> dict:
    """Run the job on the connected Ray cluster; return a summary (run dir, last epoch's metrics).
    ``verbose``: show Ray Train's own INFO lines (``_ray_train_logging``). The storage path is checked
    first (``raypipe.train.storage.checked_storage``): a ``StorageError`` (a ``ValueError``) before any
    data is listed or step taken."""
    name = job.name or f"{job.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    # before anything else: a path some training worker cannot reach would fail at the first checkpoint
    with checked_storage(job.storage_path, cpus=job.cpus_per_worker, gpu=job.use_gpu) as (storage, marker):
        print(f"raypipe train: checkpoints and metrics.json go to {storage}/{name}", flush=True)
        return _run(job, name, storage, marker, verbose)


def _run(job: TrainJobConfig, name: str, storage: str, marker: str | None, verbose: bool) -> dict:
    """``run_training`` once the storage is known: ``marker`` is the driver's file that each training
    worker looks for before its first step (``raypipe.train.storage.check_seen_here``)."""
    connection = runtime.connection()
    train_rows, val_rows, data = job_rows(job)
    # the workers cannot tell whose cluster they are on: this process tells them (``workers_decision``)
    _check_cpus(job, workers_decision(job, train_rows.kind, connection).backend)
    num_classes = _num_classes(job, train_rows, val_rows)
    _check_batches(job, len(train_rows))
    print(
        f"raypipe train: {job.model} on {data}: {len(train_rows)} train / {len(val_rows)} eval samples, "
        f"{num_classes} classes, {job.num_workers} worker(s), run {storage}/{name}",
        flush=True,
    )
    if tensorboard.available():
        where = tensorboard.folder(storage, name)
        print(f"raypipe train: TensorBoard scalars in {where} (tensorboard --logdir {where})", flush=True)
    config = {
        "job": job,
        # Listed once here; every worker reads the same rows from the object store.
        "train_rows": ray.put(train_rows),
        "val_rows": ray.put(val_rows),
        "num_classes": num_classes,
        "connection": connection,
        "run_name": name,
        "storage_path": storage,
        "storage_marker": marker,
    }
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=job.num_workers,
            use_gpu=job.use_gpu,
            resources_per_worker={"CPU": job.cpus_per_worker, **({"GPU": 1} if job.use_gpu else {})},
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=job.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            **_ray_train_logging(verbose),
        ),
    )
    try:
        result = trainer.fit()
    except ray.train.WorkerGroupError as e:
        data_error = data_failure(e)
        if data_error is None:
            raise
        raise data_error from None
    history = RunDir(storage, name).read_json("metrics.json", [])
    summary = {
        "run_dir": f"{storage}/{name}",
        "metrics_json": f"{storage}/{name}/metrics.json",
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        "epochs": len(history),
        "last": history[-1] if history else None,
    }
    if history:
        last = history[-1]
        print(
            f"done: {len(history)} epoch(s); eval top-1 {format_metric(last['eval_top1'], '.2f')}%, "
            f"top-5 {format_metric(last['eval_top5'], '.2f')}%; "
            f"metrics {summary['metrics_json']}",
            flush=True,
        )
    return summary
