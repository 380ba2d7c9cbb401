"""LocalWorkers: a run not connected to Ray makes its chunks in worker processes of this machine, with
the same batches as Ray's tasks, the same accounting, retries of a dead worker, and bugs raised loudly."""

from __future__ import annotations

import gc
import os
import shutil
import textwrap
import time

import numpy as np
import pytest

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.workers.local import LocalWorkerDiedError, LocalWorkers, WorkerTraceback, shared_memory_dir

AUG = TrainAugment(input_size=(32, 32))
LOCAL = ExecutionConfig(backend="local", chunk_rows=7, num_tasks=2)

# Faults for the workers only: Python imports ``sitecustomize`` from the path at start-up, and a local
# worker gets this process's path, so a test that puts this file on it breaks the workers it starts.
SITECUSTOMIZE = textwrap.dedent("""
    import os
    fault = os.environ.get("RAYPIPE_TEST_FAULT", "")
    if fault == "start":
        os._exit(3)  # a worker that cannot even start (its environment broken)
    if fault:
        from raypipe.kernels import transform

        def broken(self, data, rng=None, out=None):
            if fault == "bug":
                raise TypeError("simulated bug in a transform")
            if fault == "slow":
                import time
                time.sleep(120)  # still working when the pool is shut down
            if fault == "pause":
                import time
                time.sleep(0.02)  # each image: a chunk takes longer than its consumer's batches
                return original(self, data, rng, out)
            marker = os.environ["RAYPIPE_TEST_MARKER"]
            if fault == "die" or not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(9)  # as the kernel's OOM killer ends a process: no clean-up, no answer
            return original(self, data, rng, out)

        original = transform.TrainTransform.__call__
        transform.TrainTransform.__call__ = broken
    if fault == "stage":
        import time
        import raypipe.stages.augment

        def stage(rows, spec, out=None):
            time.sleep(float(rows["pause"][0]))
            out[:] = 1
            return {"image": out, "sample_id": rows["sample_id"]}

        raypipe.stages.augment.augment_block = stage
""")


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts its own workers (a fault test's path and environment are theirs)."""
    LocalWorkers.shutdown_shared()
    yield
    LocalWorkers.shutdown_shared()


def _epochs(pipe: Pipeline, epochs: int = 2) -> list[list[tuple[list[int], bytes]]]:
    source = EpochSource(pipe, end_epoch=epochs)
    try:
        return [[(b["sample_id"].tolist(), b["image"].tobytes()) for b in source] for _ in range(epochs)]
    finally:
        source.close()


def _own_files(directory: str) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(f"raypipe-{os.getpid()}-")]


def _open_slabs() -> int:
    """This process's descriptors of chunk slabs (Linux: their memfds; elsewhere they have no name)."""
    if not os.path.isdir("/proc/self/fd"):
        return 0
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:raypipe-chunk")
        except OSError:
            pass
    return count


def _pool_started(count: int = 2) -> LocalWorkers:
    """The process's pool, started and answering: a stream then sends every chunk to it at once (it
    would make its first ones itself while the workers start, and tiny images are done by then)."""
    import time

    pool = LocalWorkers.shared(count, shared_memory_dir(1 << 30)[0])
    pool.release_start()
    deadline = time.monotonic() + 60
    while pool.starting() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pool.starting()
    return pool


def _with_faults(tmp_path, monkeypatch, fault: str) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.syspath_prepend(str(hooks))
    monkeypatch.setenv("RAYPIPE_TEST_FAULT", fault)
    monkeypatch.setenv("RAYPIPE_TEST_MARKER", str(tmp_path / "died-once"))


def test_local_workers_make_the_same_batches_as_ray_tasks(ray_local, sample_dir):
    config = PipelineConfig(batch_size=5, seed=3)
    on_ray = Pipeline(
        str(sample_dir), AUG, config=config, execution=ExecutionConfig(backend="ray", chunk_rows=7, num_tasks=2)
    )
    local = Pipeline(str(sample_dir), AUG, config=config, execution=LOCAL)
    assert on_ray.uses_ray() and not local.uses_ray()
    want, got = _epochs(on_ray), _epochs(local)
    assert got == want  # same rows, order and pixels
    assert all(sorted(i for ids, _ in epoch for i in ids) == list(range(48)) for epoch in got)  # each row once
    assert want[0] != want[1]  # the epochs differ, so the comparison covers the order and the draws


def test_local_chunks_come_from_the_workers_and_leave_no_files(sample_dir):
    # chunks of two whole batches: the packer hands them on as views of the workers' memory
    execution = ExecutionConfig(backend="local", chunk_rows=16, num_tasks=2)
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=8), execution=execution)
    source = EpochSource(pipe)
    epochs = []
    # the first chunk is made here, the next ones while the workers start (tiny images: many epochs'
    # worth), then the workers make the rest
    while len(epochs) < 500 and not (source._stream and source._stream.workers_set_up):
        epochs.append([b["sample_id"] for b in source])
    stream = source._stream
    made_here = stream.local_chunks
    late = [[b for b in source] for _ in range(2)]
    pool = LocalWorkers._shared
    assert stream.workers_set_up and stream.local_chunks == made_here >= 1
    assert len(pool._workers) == 2 and all(w.ready for w in pool._workers)
    batches = [b for epoch in late for b in epoch]
    assert all(not b["image"].flags.writeable for b in batches)  # mapped read-only, as Ray's objects are
    for epoch in epochs + [[b["sample_id"] for b in e] for e in late]:
        assert sorted(i for ids in epoch for i in ids.tolist()) == list(range(48))
    source.close()
    del batches, late
    LocalWorkers.shutdown_shared()
    assert _own_files(pool.directory) == []
    assert _open_slabs() == 0  # closed with the pool, the viewed ones with their last view
    assert all(w.proc.poll() is not None for w in pool._workers) or not pool._workers


def test_batches_the_caller_keeps_keep_their_pixels_while_slabs_are_reused(sample_dir):
    config = PipelineConfig(batch_size=8, seed=5)
    execution = ExecutionConfig(backend="local", chunk_rows=16, num_tasks=2)
    want = _epochs(Pipeline(str(sample_dir), AUG, config=config, execution=execution), epochs=4)
    pool = _pool_started()
    made = pool.slabs.made
    source = EpochSource(Pipeline(str(sample_dir), AUG, config=config, execution=execution), end_epoch=4)
    kept = list(source)  # epoch 0's batches, held (views of their chunks' slabs) through the epochs after
    later = [[(b["sample_id"].tolist(), b["image"].tobytes()) for b in source] for _ in range(3)]
    source.close()
    assert [(b["sample_id"].tolist(), b["image"].tobytes()) for b in kept] == want[0]  # not overwritten
    assert later == want[1:]
    assert pool.slabs.made - made < 4 * 3  # the later epochs' 3 chunks each mostly reused slabs
    del kept
    gc.collect()
    assert pool.slabs.free_slabs() >= 1


def test_a_stream_of_whole_windows_has_one_windows_slab_in_use_besides_the_one_being_written(
    sample_dir, tmp_path, monkeypatch
):
    """A Parquet file's windows (one chunk each) on one worker: while the worker writes window k + 1,
    the consumer reads window k's batches and then waits, holding its last batch. When window k + 2 is
    sent out, window k's slab is back (its last batch a copy, nothing else of raypipe's holding it), so
    the stream cycles two slabs, not three."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raypipe.sources import open_source

    files = sorted(sample_dir.rglob("*.jpg"))
    assert len(files) == 48
    table = pa.table({"image": [f.read_bytes() for f in files], "label": [i % 4 for i in range(48)]})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=4)
    _with_faults(tmp_path, monkeypatch, "pause")
    pool = _pool_started(1)
    pipe = Pipeline(
        open_source(str(tmp_path / "d.parquet")),
        AUG,
        config=PipelineConfig(batch_size=2, seed=3, shuffle_window=16),  # 3 windows of 16 rows, 8 batches each
        execution=ExecutionConfig(backend="local", num_tasks=1),
    )
    source = EpochSource(pipe, end_epoch=2)
    try:
        ids = [[b["sample_id"] for b in source] for _ in range(2)]  # the loop holds each batch as a trainer's does
    finally:
        source.close()
    assert [sorted(np.concatenate(e).tolist()) for e in ids] == [list(range(48))] * 2
    assert pool.slabs.made == 2


def test_a_chunks_slab_is_back_once_its_consumer_drops_it_while_its_worker_works_on(tmp_path, monkeypatch):
    """Nothing of the pool's holds a chunk the consumer has let go of: its slab is free for the next
    chunk sent out, not only once the worker that made it answers again."""
    from types import SimpleNamespace

    _with_faults(tmp_path, monkeypatch, "stage")
    pool = LocalWorkers(1, str(tmp_path))
    spec = SimpleNamespace(image_shape=(4, 4, 3))
    try:
        first = pool.submit({"sample_id": np.arange(2), "pause": np.array([0.0])}, spec)
        block = pool.get(first)
        assert np.all(block["image"] == 1)
        second = pool.submit({"sample_id": np.arange(2), "pause": np.array([3.0])}, spec)  # the worker's next
        del block, first
        assert pool.slabs.free_slabs() == 1 and not second.done.is_set()
        assert np.all(pool.get(second)["image"] == 1)
    finally:
        pool.shutdown()


def test_local_bad_images_are_counted_skips(sample_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(sample_dir, data)
    victims = sorted((data / sorted(os.listdir(data))[1]).iterdir())[:2]
    victims[0].write_bytes(b"not an image")
    victims[1].write_bytes(victims[1].read_bytes()[:200])  # truncated
    pipe = Pipeline(
        str(data), AUG, config=PipelineConfig(batch_size=8, drop_last=False, max_skip_ratio=0.5), execution=LOCAL
    )
    source = EpochSource(pipe, end_epoch=1)
    ids = [i for b in source for i in b["sample_id"].tolist()]
    report = source.last_report
    source.close()
    assert len(ids) == len(set(ids)) == 46
    assert report.emitted == 46 and report.num_skipped == 2
    assert sorted(os.path.basename(s["path"]) for s in report.skipped_paths) == sorted(v.name for v in victims)


def test_a_worker_that_dies_is_replaced_and_its_chunk_made_again(sample_dir, tmp_path, monkeypatch):
    want = _epochs(Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5, seed=3), execution=LOCAL))
    LocalWorkers.shutdown_shared()
    _with_faults(tmp_path, monkeypatch, "die-once")
    _pool_started()
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5, seed=3), execution=LOCAL)
    got = _epochs(pipe)
    assert (tmp_path / "died-once").exists()  # a worker did die (the first to augment a row)
    assert LocalWorkers._shared.restarts >= 1
    assert got == want  # nothing lost, nothing twice, the same pixels


def test_a_chunk_whose_worker_always_dies_fails_the_epoch(sample_dir, tmp_path, monkeypatch):
    _with_faults(tmp_path, monkeypatch, "die")
    _pool_started(1)
    pipe = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=5),
        execution=ExecutionConfig(backend="local", chunk_rows=7, num_tasks=1),
    )
    source = EpochSource(pipe, end_epoch=1)
    with pytest.raises(LocalWorkerDiedError, match="died on each of 4 tries"):
        list(source)
    source.close()


def test_workers_that_cannot_start_fail_the_run_with_a_clear_error(sample_dir, tmp_path, monkeypatch):
    _with_faults(tmp_path, monkeypatch, "start")
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5), execution=LOCAL)
    source = EpochSource(pipe)
    with pytest.raises(LocalWorkerDiedError, match="end before they start"):
        for _ in range(10_000):  # the stream makes chunks itself until the pool gives up
            list(source)
    source.close()


def test_a_bug_in_a_worker_fails_with_its_own_type_and_traceback(sample_dir, tmp_path, monkeypatch):
    _with_faults(tmp_path, monkeypatch, "bug")
    _pool_started()
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5), execution=LOCAL)
    source = EpochSource(pipe, end_epoch=1)
    with pytest.raises(TypeError, match="simulated bug in a transform") as info:
        list(source)
    source.close()
    assert isinstance(info.value.__cause__, WorkerTraceback)
    assert "sitecustomize.py" in info.value.__cause__.text  # the worker's own frames


def test_the_timm_drop_in_without_ray_starts_no_cluster(sample_dir):
    import ray
    import torch

    from raypipe.timm import create_loader

    if ray.is_initialized():
        ray.shutdown()  # an earlier test's; the ray_local fixture starts it again when needed
    loader = create_loader(
        str(sample_dir),
        input_size=(3, 32, 32),
        batch_size=8,
        is_training=True,
        use_prefetcher=True,
        device=torch.device("cpu"),
    )
    try:
        seen = [int(i) for _ in range(2) for _, _, ids in _with_ids(loader) for i in ids]
    finally:
        loader.close()
    assert not ray.is_initialized()
    assert len(seen) == 2 * 48 and sorted(seen[:48]) == list(range(48))
    assert LocalWorkers._shared is not None and LocalWorkers._shared._started


def test_a_feeder_runs_on_ray_even_when_its_tasks_are_local_workers():
    from raypipe.integrations.timm_loader import _wants_ray

    assert _wants_ray(ExecutionConfig(backend="local"), world_size=1, feeder=True)  # the feeder is a Ray actor
    assert not _wants_ray(ExecutionConfig(backend="local"), world_size=1, feeder=False)


def _with_ids(loader):
    loader.yield_ids = True
    return iter(loader)


def test_shared_memory_dir_falls_back_to_the_temporary_directory(tmp_path):
    import tempfile

    assert shared_memory_dir(1, [str(tmp_path)])[0] == str(tmp_path)
    # too small (a container's 64 MB /dev/shm) or missing: the temporary directory
    assert shared_memory_dir(1 << 62, [str(tmp_path)])[0] == tempfile.gettempdir()
    assert shared_memory_dir(1, [str(tmp_path / "missing")])[0] == tempfile.gettempdir()


def _four_cores(monkeypatch) -> None:
    """This machine seen as 4 cores, this process on no Ray node (which would bound them)."""
    import raypipe.pipeline.execution as execution_module
    from raypipe import runtime

    monkeypatch.setattr(execution_module, "local_cpus", lambda: 4)
    monkeypatch.setattr(runtime, "node_cpus", lambda: None)


def test_local_budget_runs_a_task_per_core_as_a_private_ray_would(sample_dir, monkeypatch):
    _four_cores(monkeypatch)
    pipe = Pipeline(str(sample_dir), AUG, execution=ExecutionConfig(backend="local"))
    budget, count, _ = pipe.local_budget(reserved_cpus=1.0)
    assert (budget.workers, budget.in_flight, count) == (3, 5, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two trainers on this machine share its cores
    assert pipe.local_budget(world_size=2, reserved_cpus=2.0)[1] == 2
    assert np.isclose(pipe.local_budget(world_size=2, reserved_cpus=2.0)[0].cpus, 1.0)


def test_local_workers_in_a_process_on_ray_are_at_most_its_nodes_cpus(sample_dir, monkeypatch, ray_local):
    """``connect(num_cpus=N)`` on a larger machine: a feeder's (or training worker's) local workers
    stay within the N cores the node declares to Ray."""
    import raypipe.pipeline.execution as execution_module
    from raypipe import runtime

    assert runtime.node_cpus() == 2.0  # the test's Ray node
    monkeypatch.setattr(execution_module, "local_cpus", lambda: 16)
    pipe = Pipeline(str(sample_dir), AUG, execution=ExecutionConfig(backend="local"))
    assert pipe.local_budget()[1] == 2
    monkeypatch.setattr(runtime, "node_cpus", lambda: None)  # the same process on no Ray: the machine's
    assert pipe.local_budget()[1] == 16


@pytest.mark.ray
def test_a_dataset_in_an_object_store_runs_two_tasks_per_core(sample_dir, tmp_path, monkeypatch):
    """A task reading an object per row from a store waits a first-byte latency before its first row
    decodes: two per core, so the core's other task decodes meanwhile. An explicit cpus_per_task stands;
    a whole window of remote shards, and the local cache, keep one per core."""
    from raypipe.sources import open_source
    from raypipe.sources.writing.convert import convert
    from raypipe.testing import S3Server

    _four_cores(monkeypatch)
    shutil.copytree(sample_dir, tmp_path / "buckets" / "bkt" / "train")
    convert(str(sample_dir), str(tmp_path / "buckets" / "bkt" / "shards"), format="webdataset")
    with S3Server(tmp_path / "buckets") as server:
        rows = open_source("s3://bkt/train", filesystem=server.filesystem())
        remote = Pipeline(rows, AUG, execution=ExecutionConfig(backend="local"))
        chosen = Pipeline(rows, AUG, execution=ExecutionConfig(backend="local", cpus_per_task=1.0))
        shards = Pipeline(
            open_source("s3://bkt/shards", filesystem=server.filesystem()),
            AUG,
            execution=ExecutionConfig(backend="local"),
        )
    local = Pipeline(str(sample_dir), AUG, execution=ExecutionConfig(backend="local"))
    assert shards.rows.kind == "webdataset"
    assert [p.execution.cpus_per_task for p in (remote, chosen, shards, local)] == [0.5, 1.0, 1.0, 1.0]
    assert [p.local_budget()[1] for p in (remote, chosen, shards, local)] == [8, 4, 4, 4]
    # read through the local cache, its later epochs are local reads: a task per core
    monkeypatch.setenv("RAYPIPE_CACHE_DIR", str(tmp_path / "cache"))
    assert Pipeline(rows, AUG, execution=ExecutionConfig(backend="local")).execution.cpus_per_task == 1.0


def _ids(batches):
    return [int(i) for b in batches for i in b["sample_id"]]


def test_the_pool_runs_chunks_on_the_latest_streams_count_of_workers(sample_dir, tmp_path, monkeypatch):
    """The process's pool follows its latest stream: after a pipeline with four workers (two tasks per
    core over an object store), one with two runs its chunks on two, not on four."""
    import raypipe.workers.local as local_workers

    LocalWorkers.shutdown_shared()
    used: list[int] = []
    send = local_workers.send_with_fds

    def recording(sock, message, fds):
        if message[0] == "chunk":
            used.append(sock.fileno())
        return send(sock, message, fds)

    monkeypatch.setattr(local_workers, "send_with_fds", recording)
    four = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=4),
        execution=ExecutionConfig(backend="local", num_tasks=4, chunk_rows=4),
    )
    two = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=4),
        execution=ExecutionConfig(backend="local", num_tasks=2, chunk_rows=4),
    )
    try:
        _, count, directory = four.local_budget()
        pool = LocalWorkers.shared(count, directory)
        pool.release_start()
        while pool.starting():  # up first, so the workers make every chunk (none made here meanwhile)
            time.sleep(0.05)
        assert sorted(_ids(EpochSource(four, end_epoch=1))) == list(range(len(four)))
        assert len(set(used)) == 4 and LocalWorkers._shared.count == 4
        used.clear()
        assert sorted(_ids(EpochSource(two, end_epoch=1))) == list(range(len(two)))
        assert LocalWorkers._shared.count == 2 and len(LocalWorkers._shared._alive()) == 4  # two stay, idle
        assert len(set(used)) == 2, used
    finally:
        LocalWorkers.shutdown_shared()


def test_no_memory_for_a_chunk_fails_the_epoch_with_the_error_not_a_hang(sample_dir, monkeypatch):
    import errno

    pool = _pool_started()
    take, calls = pool.slabs.take, []

    def no_memory_after_two(nbytes):
        # the first two chunks go to the idle workers as they are submitted; the next ones are sent
        # from the thread that reads a worker's answer, where a failure must reach the chunk too
        calls.append(nbytes)
        if len(calls) > 2:
            raise OSError(errno.ENOMEM, "Cannot allocate memory", "memfd")
        return take(nbytes)

    monkeypatch.setattr(pool.slabs, "take", no_memory_after_two)
    source = EpochSource(
        Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5), execution=LOCAL), end_epoch=1
    )
    with pytest.raises(OSError, match="Cannot allocate memory"):
        list(source)
    source.close()
    assert len(calls) >= 3


def test_a_chunk_in_flight_when_the_pool_shuts_down_fails_instead_of_waiting(sample_dir, tmp_path, monkeypatch):
    import threading
    import time

    _with_faults(tmp_path, monkeypatch, "slow")
    pool = _pool_started()
    source = EpochSource(
        Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=5), execution=LOCAL), end_epoch=1
    )
    outcome = []

    def consume():
        try:
            next(iter(source))
            outcome.append("a batch")
        except Exception as e:  # noqa: BLE001 - what the consumer is told is what the test checks
            outcome.append(e)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    deadline = time.monotonic() + 60
    while not any(w.sent for w in pool._workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(w.sent for w in pool._workers), "no chunk reached a worker"
    LocalWorkers.shutdown_shared()
    consumer.join(timeout=30)
    assert not consumer.is_alive(), "the consumer still waits for a chunk of a pool that was shut down"
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError), outcome
    assert "shut down" in str(outcome[0])
    source.close()


def test_a_chunk_is_answered_while_another_thread_still_views_its_images(monkeypatch):
    """The stage's thread pool hands back a chunk's block before its worker thread drops the task that
    holds ``out``: the worker answers all the same, and the mapping goes with that last view."""
    import raypipe.stages.augment as augment
    from raypipe.workers import worker_process as _local_worker
    from raypipe.workers.slabs import SlabPool

    held = []

    def stage(rows, spec, out=None):
        out[:] = 7
        held.append(out)  # a view kept past the return, as the pool's task keeps its arguments
        return {"image": out, "sample_id": rows["sample_id"]}

    monkeypatch.setattr(augment, "augment_block", stage)

    class Spec:
        image_shape = (4, 4, 3)

    pool = SlabPool("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", keep=1)
    slab = pool.take(2 * 48)
    block = _local_worker.run_chunk({"sample_id": np.arange(2)}, Spec(), os.dup(slab.fd))
    assert block["image"] == ("shared", (2, 4, 4, 3))
    assert np.all(held[0] == 7)  # the view held elsewhere is still valid
    held.clear()
    view = pool.view(slab, (2, 4, 4, 3))
    assert np.all(view == 7)  # what the worker wrote, read through the parent's mapping
    del view
    pool.close()


def test_the_pool_keeps_a_slab_for_each_chunk_a_stream_holds(tmp_path):
    """A free slab for each worker, each finished chunk held ahead and the consumer's: a stream that
    has that many in use at once, as at every epoch's boundary, gets them all back again, not new pages."""
    pool = LocalWorkers(2, str(tmp_path), prefetch_chunks=2)
    try:
        held = [pool.slabs.take(1 << 20) for _ in range(5)]  # 2 workers' + 2 ahead + the consumer's
        for slab in held:
            pool.slabs.give_back(slab)
        made = pool.slabs.made
        again = [pool.slabs.take(1 << 20) for _ in range(5)]
        assert pool.slabs.made == made == 5  # every one reused
        for slab in again:
            pool.slabs.give_back(slab)
    finally:
        pool.shutdown()


def test_an_adopted_worker_ended_on_purpose_is_a_departure_and_one_that_drops_is_a_loss(tmp_path, caplog):
    import socket

    pool = LocalWorkers(2, str(tmp_path), processes=0)  # two workers of other nodes, none of this machine's
    try:
        retired, ours_retired = socket.socketpair()
        lost, ours_lost = socket.socketpair()
        assert pool.adopt(ours_retired) and pool.adopt(ours_lost)
        with caplog.at_level("INFO", logger="raypipe.workers.local"):
            pool.retire_remote()
            retired.close()  # a narrower width ended its launcher
            deadline = time.monotonic() + 10
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.01)
            lost.close()  # its node went
            while len(caplog.records) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records] == [
            ("INFO", "a raypipe worker on another node left (a narrower width)"),
            ("WARNING", "a raypipe worker on another node was lost"),
        ]
        assert pool.restarts == 1  # the loss only
    finally:
        pool.shutdown()
