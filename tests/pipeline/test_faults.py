"""Faults: a killed augmentation worker, a lost node, a consumer that stops early.

After each fault the epoch must complete with exactly the expected sample ids (no loss, no
duplicate) and the same content digest as an undisturbed run.
"""

import os
import signal
import threading
import time

import psutil
import pytest
import ray

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AUG = TrainAugment(input_size=96, color_jitter=None)


@pytest.fixture(scope="module")
def faults_dir(tmp_path_factory):
    from raypipe.sample_data import write_sample_data

    out = tmp_path_factory.mktemp("faults")
    write_sample_data(out, classes=4, per_class=60, seed=2)
    return out


def _ray_workers() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []).startswith("ray::")]


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class _WorkerKiller(threading.Thread):
    """SIGKILLs the first Ray worker seen running the augmentation stage.

    It polls while the consumer keeps iterating: a task-pool worker only carries the stage's name
    in its process title while a task runs, so waiting for it with the consumer blocked could wait
    on a pipeline that backpressure has paused.
    """

    def __init__(self):
        super().__init__(daemon=True)
        self.killed: list[int] = []
        self.stop = threading.Event()

    def run(self):
        pids = _ray_workers()
        last_scan = time.monotonic()
        while not self.stop.is_set():
            for pid in pids:
                title = _title(pid)
                if title.startswith("ray::_augment_chunk"):  # the task's name (raypipe/workers/ray_tasks.py)
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                    return
            if time.monotonic() - last_scan > 0.2:  # new workers may have started
                pids, last_scan = _ray_workers(), time.monotonic()
            time.sleep(0.001)


def _run(pipe, epoch=0, on_first_batch=None):
    run = pipe.epoch(epoch)
    ids = []
    for i, batch in enumerate(run):
        ids.extend(batch["sample_id"].tolist())
        if i == 0 and on_first_batch is not None:
            on_first_batch()
    return ids, run.report


def test_killed_worker_mid_epoch_loses_nothing(ray_local, faults_dir):
    ex = ExecutionConfig(chunk_rows=8, prefetch_chunks=1, num_tasks=2)
    pipe = Pipeline(str(faults_dir), AUG, config=PipelineConfig(batch_size=16), execution=ex, content_digest=True)
    clean_ids, clean = _run(pipe)
    killer = _WorkerKiller()
    ids, rep = _run(pipe, on_first_batch=killer.start)
    killer.stop.set()
    killer.join()
    assert killer.killed, "the fault was not injected: no stage worker was seen running after the first batch"
    assert len(ids) == len(set(ids)) == 240
    assert sorted(ids) == sorted(clean_ids)
    assert rep.content_sha256 == clean.content_sha256
    assert rep.num_skipped == 0


def test_consumer_stops_early_then_next_epoch_is_clean(ray_local, faults_dir):
    ex = ExecutionConfig(chunk_rows=16)
    pipe = Pipeline(str(faults_dir), AUG, config=PipelineConfig(batch_size=16), execution=ex)
    threads_before = {t.name for t in threading.enumerate()}
    run = pipe.epoch(0)
    for _ in run:
        break
    del run
    ids, rep = _run(pipe, epoch=1)
    assert sorted(ids) == list(range(240)) and rep.emitted == 240
    from raypipe.device import DeviceLoader
    from raypipe.pipeline import EpochSource

    loader = DeviceLoader(EpochSource(pipe, start_epoch=2), device="cpu")
    for _ in loader:
        break
    n = sum(int(b["image"].shape[0]) for b in loader)  # the next pass starts cleanly and is complete
    loader.close()
    assert n == 240
    time.sleep(0.5)
    leaked = {t.name for t in threading.enumerate()} - threads_before
    assert not [t for t in leaked if t.startswith("raypipe")], leaked


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.parametrize("replace", [False, True])
def test_node_removed_mid_epoch(faults_dir, replace):
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 200 * 2**20})
    try:
        # The driver joins while the head is the only node, so it attaches to the head's raylet (on one
        # machine every node has the same IP, and a driver may attach to any of them): removing the
        # driver's own raylet would end the driver.
        ray.init(address=cluster.address, logging_level="WARNING")
        victim = cluster.add_node(num_cpus=1, object_store_memory=150 * 2**20)
        cluster.wait_for_nodes()
        ex = ExecutionConfig(chunk_rows=8, prefetch_chunks=1, num_tasks=2)
        pipe = Pipeline(str(faults_dir), AUG, config=PipelineConfig(batch_size=16), execution=ex, content_digest=True)
        clean_ids, clean = _run(pipe)

        def remove():
            cluster.remove_node(victim, allow_graceful=False)
            if replace:
                cluster.add_node(num_cpus=1, object_store_memory=150 * 2**20)

        ids, rep = _run(pipe, on_first_batch=remove)
        assert len(ids) == len(set(ids)) == 240
        assert sorted(ids) == sorted(clean_ids)
        assert rep.content_sha256 == clean.content_sha256
    finally:
        ray.shutdown()
        cluster.shutdown()
