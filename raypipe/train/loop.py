"""The per-worker training loop Ray Train runs on every rank.

Each rank r of N reads its own slice of every epoch (``raypipe.plan.order``: the r-th of N
contiguous, equal (±1) slices of the epoch's seeded order), so each sample is trained on exactly once
per epoch across ranks (docs/training.md). Slices differ by at most one row and by their skipped
images, so ranks may take different numbers of steps: DDP's ``Join`` lets a rank that ran out shadow
the others' all-reduces instead of hanging, and nothing is padded or dropped.

Rank 0 checkpoints at every epoch's end and, with ``--checkpoint-steps``, inside it at steps every rank
reaches; a restarted attempt goes on from the latest one, inside its epoch too (``raypipe.train.resume``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from raypipe.device import DeviceLoader, from_timm_args
from raypipe.pipeline import EpochSource, FeederSource, Pipeline
from raypipe.pipeline.feeder import FEEDER_CPUS
from raypipe.plan.position import Position
from raypipe.plan.same_listing import check_same_listing
from raypipe.plan.span import RankSpan
from raypipe.settings import current
from raypipe.train.args import TrainJobConfig
from raypipe.train.metrics import RankEpoch, RunDir, combine, format_line
from raypipe.train.objective import evaluate, training_loss
from raypipe.train.resume import (
    ResumePoint,
    checkpoint_due,
    ids_after_resume,
    last_safe_step,
    repeated_batches,
    resume_point,
    rows_left,
    stale_ids_files,
)
from raypipe.train.storage import check_seen_here
from raypipe.train.tensorboard import Scalars, folder

__all__ = ["train_loop_per_worker", "STATE_FILE"]

STATE_FILE = "state.pt"
PROGRESS_DIR = "progress"  # with --record-ids: per rank, the last step it trained (``repeated_batches``)


def _say(line: str) -> None:
    """One line to this worker's stdout, which Ray forwards to the driver. Not ``print``: Ray Train
    patches it into the root logger, which reached the driver a second time (every epoch line twice)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _gather(obj):
    if not _distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _amp(job: TrainJobConfig, device: torch.device):
    if not job.amp:
        return contextlib.nullcontext, None
    if device.type == "cuda":
        scaler = torch.amp.GradScaler("cuda")
        return (lambda: torch.autocast("cuda", dtype=torch.float16)), scaler
    return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)), None


def _loader(source, job: TrainJobConfig, device, num_classes: int, *, train: bool, rank: int) -> DeviceLoader:
    kwargs = dict(
        device=device,
        img_dtype=torch.float16 if (device.type == "cuda" and job.amp) else torch.float32,
        channels_last=job.channels_last,
        seed=job.pipeline.seed,
        rank=rank,
        num_classes=num_classes,
    )
    if train:
        kwargs.update(re_prob=job.reprob, re_mode=job.remode, re_count=job.recount)
        if job.soft_targets:
            kwargs.update(mixup_alpha=job.mixup, cutmix_alpha=job.cutmix, label_smoothing=job.smoothing)
    return from_timm_args(source, **kwargs)


@dataclasses.dataclass
class _Trained:
    """What a checkpoint saves of the training itself (the model without its DDP wrapper)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler | None

    def state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }


def _load_state(trained: _Trained) -> ResumePoint:
    """Restore from Ray Train's latest checkpoint; return where to start (the run's start when none)."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return resume_point(None)
    with ckpt.as_directory() as d:
        # Our own file, written by rank 0 of this run; weights_only refuses anything but tensors/containers.
        state = torch.load(os.path.join(d, STATE_FILE), map_location="cpu", weights_only=True)
    trained.model.load_state_dict(state["model"])
    trained.optimizer.load_state_dict(state["optimizer"])
    trained.scheduler.load_state_dict(state["scheduler"])
    if trained.scaler is not None and state.get("scaler") is not None:
        trained.scaler.load_state_dict(state["scaler"])
    return resume_point(state)


def _save_and_report(
    trained: _Trained, metrics: dict, *, epoch: int, step: int | None, loader: DeviceLoader, ids: list | None, rank: int
) -> None:
    """Every rank: rank 0 writes the checkpoint, every rank reports it (a barrier for all ranks). One
    inside an epoch (``step``) also holds every rank's train-loader position and, with ``ids``, the
    ids each rank trained on so far in the epoch, as JSON strings (``raypipe.train.resume``)."""
    extra = {}
    if step is not None:
        mine = {"loader": loader.state_dict(), "ids": _ids_list(ids) if ids is not None else None}
        every = _gather(mine)
        extra["loaders"] = json.dumps([m["loader"] for m in every])
        extra["ids"] = json.dumps([m["ids"] for m in every]) if ids is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            torch.save({**trained.state(), "epoch": epoch, "step": step, **extra}, os.path.join(tmp, STATE_FILE))
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint)


def _ids_list(ids: list) -> list[int]:
    return np.concatenate(ids).tolist() if ids else []


def _previous_attempt(run_dir: RunDir, start: ResumePoint) -> dict[int, int]:
    """Rank 0, with ``--record-ids``, before any rank trains: per epoch, the batches the previous
    attempt trained after ``start`` (from its ranks' progress files, removed then for this attempt's
    own; none: no attempt ran before, or it trained nothing past ``start``). Its ids files of
    ``start``'s epoch and later are removed too: this attempt writes them again, on a number of ranks
    that may differ."""
    names = run_dir.names(PROGRESS_DIR)
    progress = [run_dir.read_json(f"{PROGRESS_DIR}/{n}") for n in names if n.endswith(".json")]
    for n in names:
        run_dir.delete(f"{PROGRESS_DIR}/{n}")
    for n in stale_ids_files(run_dir.names("ids"), epoch=start.epoch):
        run_dir.delete(f"ids/{n}")
    return repeated_batches([p for p in progress if p], start)


def _last_safe_step(job: TrainJobConfig, loader: DeviceLoader, first_step: int) -> int | None:
    """Every rank: the last step of the epoch about to run at which a mid-epoch checkpoint may be, from
    each rank's rows left in it (``last_safe_step``); call between passes."""
    rows = _gather(rows_left(Position.from_dict(loader.state_dict())))
    cfg = job.pipeline
    return last_safe_step(
        first_step, rows, batch_size=cfg.batch_size, max_skip_ratio=cfg.max_skip_ratio, max_skips=cfg.max_skips
    )


def _bar(total: int, desc: str):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", leave=False, dynamic_ncols=True)


@contextlib.contextmanager
def _frozen_batchnorm(model: torch.nn.Module, active: bool):
    """BatchNorm on running statistics for this step: batch statistics of ONE sample are undefined
    (torch raises), and the epoch's last batch may hold one sample — we train on it, not drop it."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]
    if active:
        for m in norms:
            m.eval()
    try:
        yield
    finally:
        if active:
            for m in norms:
                m.train()


def _train_epoch(
    model,
    loader,
    optimizer,
    loss_fn,
    autocast,
    scaler,
    rec: RankEpoch,
    ids: list | None,
    *,
    first_step: int = 0,
    after_step=None,
) -> None:
    """One pass of ``loader``, whose first batch is step ``first_step + 1`` of the epoch (a resumed epoch
    counts its earlier steps); ``after_step(step)`` runs after each optimizer step."""
    model.train()
    join = _distributed()
    ctx = contextlib.nullcontext()
    if join:
        from torch.distributed.algorithms.join import Join

        ctx = Join([model])  # a rank that ran out of batches shadows the others' all-reduces
    bar = _bar(len(loader.source) * loader.source.pipeline.config.batch_size, f"train {rec.rank}")
    t0 = time.perf_counter()
    with ctx:
        for batch in loader:
            x, y = batch["image"], batch["label"]
            with autocast(), _frozen_batchnorm(model, int(x.shape[0]) == 1):
                loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            n = int(x.shape[0])
            rec.steps += 1
            rec.samples += n
            rec.loss_sum += float(loss.detach()) * n
            if ids is not None:  # a mixture's: its takes (a row of a part may be taken twice an epoch)
                ids.append(batch.get("take", batch["sample_id"]).cpu().numpy())
            if bar is not None:
                bar.update(n)
            if after_step is not None:
                after_step(first_step + rec.steps)
    rec.train_s = time.perf_counter() - t0 - rec.checkpoint_s
    rec.wait_s = loader.stats.wait_s
    if bar is not None:
        bar.close()


@torch.no_grad()
def _sync_buffers(model: torch.nn.Module) -> None:
    """Rank 0's BatchNorm statistics everywhere: each rank's last step updated its own copy after DDP's
    last broadcast, and eval (and the checkpoint, from rank 0) should see one model."""
    if _distributed():
        for b in model.buffers():
            dist.broadcast(b, src=0)


def _account(rec: RankEpoch, source: EpochSource | FeederSource) -> None:
    rep = source.last_report
    rec.emitted, rec.expected = rep.emitted, rep.expected
    rec.skipped, rec.skipped_paths = dict(rep.skipped), list(rep.skipped_paths)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry point. ``config``: ``job`` (TrainJobConfig), ``train_rows``/``val_rows``
    (object refs to the driver's listed SourceRows), ``num_classes``, ``run_name``, ``storage_path``."""
    import timm
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2

    job: TrainJobConfig = config["job"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    num_classes = int(config["num_classes"])
    run_dir = RunDir(config["storage_path"], config["run_name"])
    train_rows, val_rows = ray.get([config["train_rows"], config["val_rows"]])
    # Every rank must read the same listing, or shards overlap and samples are lost without a word.
    check_same_listing(train_rows.digest(), rank=rank, world_size=world)
    # this node may have joined after the driver asked the nodes that were up (raypipe.train.storage)
    check_seen_here(config.get("storage_marker"), given=job.storage_path, node=ray.util.get_node_ip_address())

    torch.manual_seed(job.pipeline.seed)  # same initial weights on every rank (DDP also broadcasts them)
    model = timm.create_model(job.model, pretrained=False, num_classes=num_classes).to(device)
    if job.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = create_optimizer_v2(model, opt=job.opt, lr=job.lr, weight_decay=job.weight_decay, momentum=job.momentum)
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=job.sched,
        num_epochs=job.epochs,
        warmup_epochs=job.warmup_epochs,
        warmup_lr=job.warmup_lr,
        min_lr=job.min_lr,
    )
    autocast, scaler = _amp(job, device)
    trained = _Trained(model, optimizer, scheduler, scaler)
    start = _load_state(trained)
    resumed_from = start.epoch if start.from_checkpoint else None
    resumed_step = start.step if start.mid_epoch else None
    # The previous attempt's progress is read (and cleared) before any rank of this one trains a step.
    repeated = _previous_attempt(run_dir, start) if job.record_ids and rank == 0 else None
    if job.record_ids and _distributed():
        dist.barrier()
    scheduler.step(start.epoch)
    raw_model = model
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    loss_fn = training_loss(job, train_rows.multi_label)

    execution = job.execution.resolved_for(gpu_trainer=device.type == "cuda")  # SCHED_IDLE workers on GPUs
    # the run's name in each split's metrics (tag ``run``; eval's is NAME:eval, so its counts stay apart)
    named = {s: dataclasses.replace(current(), run_name=f"{config['run_name']}{s}"[-100:]) for s in ("", ":eval")}
    classes = {"num_classes": num_classes} if train_rows.multi_label else {}  # label sets: the model's width
    train_pipe = Pipeline(
        train_rows,
        job.augment,
        config=job.pipeline,
        execution=execution,
        decode=job.decode,
        settings=named[""],
        **classes,
    )
    eval_cfg = dataclasses.replace(job.pipeline, shuffle=False, drop_last=False, max_skip_ratio=None, max_skips=None)
    eval_pipe = Pipeline(
        val_rows, job.eval, config=eval_cfg, execution=execution, decode=job.decode, settings=named[":eval"], **classes
    )
    # Each split streams its epochs from one execution for the whole run; the trainers' CPUs are left
    # out of every rank's share of the cluster.
    # each source leaves out its own feeders (FeederSource); the other split's are held as the trainers are
    other_split = FEEDER_CPUS * job.num_workers if job.feeder == "process" else 0.0
    reserved = job.num_workers * job.cpus_per_worker + other_split
    span = RankSpan(rank=rank, world_size=world, start_epoch=start.epoch, end_epoch=job.epochs, reserved_cpus=reserved)
    # whose Ray this is, as the driver that connected told it (this worker, a Ray actor, cannot tell)
    told = config["connection"]
    if job.feeder == "process":
        train_src, eval_src = (FeederSource(p, span=span, connection=told) for p in (train_pipe, eval_pipe))
    else:
        train_src, eval_src = (
            EpochSource(p, span=span, decision=p.decide(told=told, needs_ray=True)) for p in (train_pipe, eval_pipe)
        )
    # One loader per split for the whole run: one side stream and one pinned ring, reused by every epoch.
    train_loader = _loader(train_src, job, device, num_classes, train=True, rank=rank)
    eval_loader = _loader(eval_src, job, device, num_classes, train=False, rank=rank)
    if start.mid_epoch:  # every rank's position: what no rank consumed is split over this attempt's ranks
        train_loader.load_state_dict(start.loaders)
    else:
        train_loader.set_epoch(start.epoch)
    eval_loader.set_epoch(start.epoch)
    history = run_dir.read_json("metrics.json", []) if rank == 0 else []
    # Entries past the checkpoint were written by an attempt that died before checkpointing: they run again.
    ran_before = {h["epoch"] for h in history if h["epoch"] >= start.epoch}
    history = [h for h in history if h["epoch"] < start.epoch]
    if rank == 0 and start.from_checkpoint:
        after = f", after step {start.step}" if start.mid_epoch else ""
        _say(f"resuming {config['run_name']} at epoch {start.epoch + 1}/{job.epochs}{after} from its checkpoint")
    ended: dict[str, int] = {}  # this attempt's finished epochs and their steps, for its progress file
    scalars = Scalars.open(folder(config["storage_path"], config["run_name"])) if rank == 0 else None
    try:
        for epoch in range(start.epoch, job.epochs):
            resumed_here = epoch == start.epoch and start.mid_epoch
            first_step = start.step if resumed_here else 0
            rec = RankEpoch(rank=rank)
            ids: list | None = None
            if job.record_ids:
                saved = ids_after_resume(start.ids, rank=rank, world_size=world) if resumed_here else []
                ids = [np.asarray(saved, dtype=np.int64)] if saved else []
            last_safe = _last_safe_step(job, train_loader, first_step) if job.checkpoint_steps else None
            if job.checkpoint_steps and last_safe is None and rank == 0 and epoch == start.epoch:
                _say(
                    f"checkpoint_steps={job.checkpoint_steps}: no checkpoint inside an epoch, since neither "
                    "max_skip_ratio nor max_skips limits its skips, so no step is sure to be reached by every "
                    "rank; checkpoints at epoch ends only"
                )

            def after_step(step: int, epoch=epoch, rec=rec, ids=ids, last_safe=last_safe) -> None:
                if scalars is not None:
                    run_step = epoch * len(train_loader.source) + step
                    scalars.step(run_step, samples=rec.samples, loss_sum=rec.loss_sum, wait_s=train_loader.stats.wait_s)
                if job.record_ids:
                    run_dir.write_json(
                        f"{PROGRESS_DIR}/rank{rank:03d}.json", {"epoch": epoch, "step": step, "ended": ended}
                    )
                if checkpoint_due(step, every=job.checkpoint_steps, last_safe=last_safe):
                    t0 = time.perf_counter()
                    _save_and_report(
                        trained,
                        {"epoch": epoch, "step": step},
                        epoch=epoch,
                        step=step,
                        loader=train_loader,
                        ids=ids,
                        rank=rank,
                    )
                    rec.checkpoint_s += time.perf_counter() - t0

            lr = optimizer.param_groups[0]["lr"]
            _train_epoch(
                model,
                train_loader,
                optimizer,
                loss_fn,
                autocast,
                scaler,
                rec,
                ids,
                first_step=first_step,
                after_step=after_step,
            )
            ended[str(epoch)] = first_step + rec.steps
            _account(rec, train_src)
            _sync_buffers(raw_model)
            evaluate(raw_model, eval_loader, autocast, num_classes, rec)
            scheduler.step(epoch + 1)
            if ids is not None:
                run_dir.write_json(f"ids/epoch{epoch:04d}_rank{rank:03d}.json", _ids_list(ids))
            records = _gather(rec)
            metrics = {}
            if rank == 0:
                metrics = combine(
                    epoch,
                    records,
                    lr=lr,
                    resumed_from_epoch=resumed_from,
                    resumed_from_step=resumed_step,
                    repeated_batches=repeated.get(epoch, 0) if repeated is not None else None,
                )
                _say(format_line(metrics, job.epochs))
                metrics["repeated"] = epoch in ran_before
                history.append(metrics)
                run_dir.write_json("metrics.json", history)
                if scalars is not None:
                    scalars.epoch(metrics)
            flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and v is not None}
            _save_and_report(trained, flat, epoch=epoch, step=None, loader=train_loader, ids=None, rank=rank)
    finally:
        train_loader.close()
        eval_loader.close()
        if scalars is not None:
            scalars.close()
