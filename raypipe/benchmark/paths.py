"""The ways a trainer's batches can be made, measured alike: images/s, the machine's CPU per image, how
busy the machine was, and where that CPU went, by the role of each process.

Paths, each a trainer reading one rank's epochs through ``DeviceLoader`` on the CPU (fp32 normalised
NCHW batches), with raypipe's defaults (worker priorities included):

- ``local``: ``EpochSource`` on local worker processes (no Ray), as ``raypipe run`` and the timm
  drop-in without ``RAY_ADDRESS`` run;
- ``ray-node``: the README's Python API, ``raypipe.connect()`` (a private local Ray) and
  ``FeederSource``, as ``jobs/train.py`` runs each rank;
- ``ray-nodes``: Ray across simulated nodes (``ray.cluster_utils.Cluster``): the trainer's node runs
  the trainer and its feeder, and ``nodes`` CPU nodes of ``node_cpus`` each offer the ``preprocess``
  resource that every augmentation task asks for (cluster.yaml's shape: CPU nodes feeding a GPU node).
  The nodes share this machine's cores, so their CPUs are a scheduling limit, not cores of their own.
- ``nodes``: the same cluster and ``FeederSource`` with the default ``ExecutionConfig``, the process
  told the cluster's address as ``ray job submit`` tells a job (``RAY_ADDRESS``): what a rank on a
  cluster it joined runs (``raypipe.pipeline.backend``), raypipe's worker processes on the CPU nodes,
  their images streamed to the feeder over TCP (``raypipe.workers.node``) instead of Ray tasks'
  objects, their width following the trainer's demand (elastic).

``run_path`` measures one path in this process; ``bench/cluster_paths.py`` runs each in a process of its
own, in turn, and prints the table.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

import psutil

from raypipe.benchmark.measure import core_ticks, measure_epochs

__all__ = ["PATHS", "PathResult", "CpuAccount", "process_role", "run_path", "run_timm", "compression_cost"]

PATHS = ("local", "ray-node", "ray-nodes", "nodes")
# The resource the simulated CPU nodes offer and every augmentation task asks a sliver of (cluster.yaml's).
PREPROCESS = "preprocess"
_CLOCK = os.sysconf("SC_CLK_TCK")
# Ray titles a worker process by its task, and "ray::IDLE" between tasks: in these runs a worker that is
# no actor (the feeder, Ray's agents) runs raypipe's chunks only.
_AUGMENTATION_TITLES = ("ray::IDLE", "ray::_augment_chunk", "ray::_set_up_stage", "ray::Launcher")


def process_role(proc: psutil.Process, trainer_pid: int) -> str:
    """The part a process plays in a run, from its command line (Ray names its workers ``ray::<task>``)."""
    if proc.pid == trainer_pid:
        return "trainer"
    try:
        name, cmd = proc.name(), " ".join(proc.cmdline())
    except psutil.Error:
        return "other"
    if "_Feeder" in cmd:
        return "feeder"
    if "raypipe.workers.worker_process" in cmd or cmd.startswith(_AUGMENTATION_TITLES):
        return "augmentation"
    if name in ("raylet", "gcs_server") or cmd.startswith("ray::") or "/ray/" in cmd:
        return "ray daemons"  # the raylets, GCS, dashboard and its agents, log monitor
    try:
        if proc.ppid() == trainer_pid:
            return "augmentation"  # a DataLoader's worker processes (timm's loader)
    except psutil.Error:
        pass
    return "other"


class CpuAccount:
    """CPU seconds between ``start()`` and ``stop()``: the machine's, and each process's by role."""

    def __init__(self, trainer_pid: int | None = None):
        self.trainer_pid = trainer_pid or os.getpid()
        self._start: dict[int, float] = {}
        self._machine0 = (0, 0)
        self.machine_s = 0.0
        self.busy = 0.0
        self.roles: dict[str, float] = {}

    def _per_process(self) -> dict[int, tuple[str, float]]:
        out = {}
        for proc in psutil.process_iter():
            try:
                t = proc.cpu_times()
                out[proc.pid] = (process_role(proc, self.trainer_pid), t.user + t.system)
            except psutil.Error:
                continue
        return out

    def start(self) -> None:
        self._start = {pid: cpu for pid, (_, cpu) in self._per_process().items()}
        self._machine0 = core_ticks()

    def stop(self) -> None:
        busy, total = core_ticks()
        b0, t0 = self._machine0
        self.machine_s = (busy - b0) / _CLOCK
        self.busy = (busy - b0) / max(1, total - t0)
        roles: dict[str, float] = defaultdict(float)
        for pid, (role, cpu) in self._per_process().items():
            roles[role] += cpu - self._start.get(pid, 0.0)  # a process started meanwhile counts from 0
        self.roles = dict(roles)


@dataclass
class PathResult:
    path: str
    images: int
    seconds: float
    images_per_s: float
    cpu_ms_per_image: float  # the whole machine's busy CPU over the measured epochs, per image
    busy: float  # the share of the machine's cores that was busy then
    roles_ms_per_image: dict[str, float] = field(default_factory=dict)
    first_batch_s: float = 0.0
    note: str = ""

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "images": self.images,
            "seconds": round(self.seconds, 3),
            "images_per_s": round(self.images_per_s, 1),
            "cpu_ms_per_image": round(self.cpu_ms_per_image, 3),
            "busy": round(self.busy, 3),
            "first_batch_s": round(self.first_batch_s, 3),
            "note": self.note,
            "roles_ms_per_image": {k: round(v, 3) for k, v in sorted(self.roles_ms_per_image.items())},
        }


def _augment(img_size: int):
    from raypipe import TrainAugment

    return TrainAugment(input_size=img_size, color_jitter=None)  # RandomResizedCrop + flip


def _source(
    path: str,
    data: str,
    *,
    batch_size: int,
    img_size: int,
    epochs: int,
    chunk_rows: int | None,
    ray_tasks: bool = False,
):
    """The path's rank source, its Pipeline built as a user of that path would (see the module's doc)."""
    from raypipe import ExecutionConfig, FeederSource, Pipeline, PipelineConfig
    from raypipe.pipeline import EpochSource

    aug = _augment(img_size)
    config = PipelineConfig(batch_size=batch_size, seed=0)
    if path == "local":
        execution = ExecutionConfig(backend="local", chunk_rows=chunk_rows)
        return EpochSource(Pipeline(data, aug, config=config, execution=execution), end_epoch=epochs)
    resources = {PREPROCESS: 0.001} if path in ("ray-nodes", "nodes") else {}
    # the default backend, as the README's; ``ray_tasks``: Ray tasks, as ``--backend ray`` makes
    backend = "ray" if path == "ray-nodes" or (ray_tasks and path == "ray-node") else "auto"
    execution = ExecutionConfig(resources=resources, chunk_rows=chunk_rows, backend=backend)
    pipe = Pipeline(data, aug, config=config, execution=execution)
    source = FeederSource(pipe, end_epoch=epochs)
    if path == "nodes" and not source.runs_on_local_workers:  # the default made Ray tasks: not this path
        source.close()
        raise RuntimeError("the default backend on the simulated cluster did not run node workers")
    return source


def _start_nodes(nodes: int, node_cpus: int, trainer_cpus: int, store_mb: int):
    """A simulated cluster: the trainer's node (head) and ``nodes`` preprocessing nodes, each with an
    object store that holds its chunks in flight (``ray.cluster_utils`` gives 150 MB by default)."""
    import ray
    from ray.cluster_utils import Cluster

    from raypipe.runtime import worker_pool_env
    from raypipe.workers.node import HOST_ENV

    # the raylets read the worker settings raypipe's own clusters have (runtime.worker_pool_env)
    os.environ.update(worker_pool_env(trainer_cpus + nodes * node_cpus))
    # every simulated node is this machine: node workers connect over the loopback interface
    os.environ.setdefault(HOST_ENV, "127.0.0.1")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": trainer_cpus, "object_store_memory": store_mb << 20}
    )
    # connected before the CPU nodes start, so that the trainer's node is the head: with several raylets
    # on one address a driver may attach to any of them
    ray.init(address=cluster.address, logging_level="ERROR")
    os.environ["RAY_ADDRESS"] = cluster.address  # a cluster joined, as ``ray job submit`` tells a job
    for _ in range(nodes):
        cluster.add_node(num_cpus=node_cpus, resources={PREPROCESS: node_cpus}, object_store_memory=store_mb << 20)
    cluster.wait_for_nodes()
    return cluster


def _measure(name: str, loader, *, epochs: int, count, started: float, note: str) -> PathResult:
    """``loader``'s epochs (an unmeasured first one, then ``epochs``), with the machine's CPU over the
    measured ones."""
    account = CpuAccount()
    measured = [0, 0.0]  # images, seconds of the measured epochs

    def on_epoch(epoch: int, images: int, seconds: float) -> None:
        if epoch == 0:
            account.start()  # the measured epochs begin
        else:
            measured[0] += images
            measured[1] += seconds

    r = measure_epochs(name, lambda epoch: loader, epochs=epochs + 1, on_epoch=on_epoch, count=count, started=started)
    account.stop()  # before the caller ends the loader: a process gone takes its CPU times with it
    images, seconds = measured
    return PathResult(
        path=name,
        images=images,
        seconds=seconds,
        images_per_s=images / seconds if seconds else 0.0,
        cpu_ms_per_image=1000 * account.machine_s / max(1, images),
        busy=account.busy,
        roles_ms_per_image={k: 1000 * v / max(1, images) for k, v in account.roles.items()},
        first_batch_s=r.first_batch_s,
        note=note,
    )


def run_path(
    path: str,
    data: str,
    *,
    epochs: int = 4,
    batch_size: int = 128,
    img_size: int = 224,
    nodes: int = 1,
    node_cpus: int = 2,
    trainer_cpus: int = 1,
    store_mb: int = 1024,
    chunk_rows: int | None = None,
    ray_tasks: bool = False,
) -> PathResult:
    """Measure ``path`` in this process: an unmeasured first epoch (the workers' start), then ``epochs``
    measured ones. Starts and stops the path's Ray itself (none for ``local``). ``ray_tasks``: the Ray
    paths' augmentation as Ray tasks even on the private local Ray (``ExecutionConfig(backend="ray")``)."""
    if path not in PATHS:
        raise ValueError(f"path={path!r}: expected one of {', '.join(PATHS)}")
    import ray

    from raypipe import from_timm_args, runtime

    started = time.perf_counter()
    cluster = None
    if path == "ray-node":
        runtime.connect()
    elif path in ("ray-nodes", "nodes"):
        cluster = _start_nodes(nodes, node_cpus, trainer_cpus, store_mb)
    across = f"trainer node + {nodes} CPU node(s) of {node_cpus} CPUs"
    note = {
        "local": "local workers",
        "ray-node": "Ray, one node, FeederSource",
        "ray-nodes": f"Ray tasks, {across}",
        "nodes": f"node workers (the default, elastic), {across}",
    }[path]
    try:
        source = _source(
            path,
            data,
            batch_size=batch_size,
            img_size=img_size,
            epochs=epochs + 1,
            chunk_rows=chunk_rows,
            ray_tasks=ray_tasks,
        )
        with from_timm_args(source, device="cpu", img_dtype="float32") as loader:
            return _measure(
                path, loader, epochs=epochs, count=lambda b: int(b["image"].shape[0]), started=started, note=note
            )
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def run_timm(data: str, *, workers: int, epochs: int = 4, batch_size: int = 128, img_size: int = 224) -> PathResult:
    """timm's ``create_loader`` at its documented best on a CPU (``contenders.timm_loader``'s settings),
    measured as the paths are."""
    from raypipe.benchmark.contenders import timm_dataloader

    started = time.perf_counter()
    loader = timm_dataloader(data, _augment(img_size), batch_size=batch_size, workers=workers)
    return _measure(
        f"timm-{workers}",
        loader,
        epochs=epochs,
        count=lambda b: int(b[0].shape[0]),
        started=started,
        note=f"timm create_loader, {workers} workers",
    )


def compression_cost(data: str, *, img_size: int = 224, batch_size: int = 128) -> dict:
    """What shipping fewer bytes across the network would cost: one chunk of augmented images (local
    workers, RandomResizedCrop + flip) compressed losslessly as zlib level 1, plain and after a PNG-like
    "up" filter (each row minus the one above), with the ratio of bytes and the CPU per image to compress
    and decompress."""
    import zlib

    import numpy as np

    from raypipe import ExecutionConfig, Pipeline, PipelineConfig
    from raypipe.pipeline import EpochSource

    pipe = Pipeline(
        data,
        _augment(img_size),
        config=PipelineConfig(batch_size=batch_size, seed=0),
        execution=ExecutionConfig(backend="local", num_tasks=1),
    )
    source = EpochSource(pipe, end_epoch=1)
    try:
        images = np.array(next(iter(source))["image"])
    finally:
        source.close()
    up = images.copy()
    up[:, 1:] -= images[:, :-1]  # uint8 wraps: the filter is undone by a cumulative sum mod 256
    out = {}
    for name, array in (("zlib-1", images), ("up filter + zlib-1", up)):
        raw = array.tobytes()
        t0 = time.perf_counter()
        packed = zlib.compress(raw, 1)
        t1 = time.perf_counter()
        zlib.decompress(packed)
        t2 = time.perf_counter()
        n = len(images)
        out[name] = {
            "ratio": round(len(packed) / len(raw), 3),
            "compress_ms_per_image": round(1000 * (t1 - t0) / n, 3),
            "decompress_ms_per_image": round(1000 * (t2 - t1) / n, 3),
        }
    return out
