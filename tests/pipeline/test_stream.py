"""One execution per run: epochs follow each other in one stream, in order, bounded, stoppable."""

import io
import time

import pytest

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.pipeline.stream import ChunkStream

pytestmark = pytest.mark.timeout(240)

AUG = TrainAugment(input_size=32, color_jitter=None)


def _ids(batches):
    return [int(i) for b in batches for i in b["sample_id"]]


def test_epochs_come_from_one_stream_that_runs_ahead_across_the_boundary(ray_local, sample_dir, monkeypatch):
    made, submitted = [], []
    make = Pipeline.stream
    monkeypatch.setattr(
        Pipeline, "stream", lambda self, span, **kw: made.append(span.start_epoch) or make(self, span, **kw)
    )
    submit = ChunkStream._submit

    def recording_submit(self):
        before = len(self._pending)
        submit(self)
        submitted.extend(e for e, *_ in list(self._pending)[before:])

    monkeypatch.setattr(ChunkStream, "_submit", recording_submit)
    pipe = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=8),
        execution=ExecutionConfig(chunk_rows=8, num_tasks=2, prefetch_chunks=2),
    )
    source = EpochSource(pipe, end_epoch=3)
    per_epoch = []
    for _ in range(3):
        it = iter(source)
        first = next(it)
        seen_when_started = list(submitted)
        per_epoch.append(_ids([first, *it]))
        if len(per_epoch) > 1:
            # the epoch's first chunks were already submitted during the previous epoch
            assert seen_when_started.count(len(per_epoch) - 1) >= 1
    source.close()
    assert made == [0]  # one stream for the whole run
    assert all(sorted(ids) == list(range(48)) for ids in per_epoch)
    assert per_epoch[0] != per_epoch[1]  # a new order each epoch
    assert [r.epoch for r in source.reports] == [0, 1, 2]
    assert submitted.count(3) == 0  # end_epoch: nothing of an epoch nobody reads


def test_same_seed_same_batches_in_the_same_order(ray_local, sample_dir):
    def batches(seed):
        pipe = Pipeline(
            str(sample_dir),
            AUG,
            config=PipelineConfig(batch_size=5, seed=seed),
            execution=ExecutionConfig(chunk_rows=7, num_tasks=3),
        )
        source = EpochSource(pipe, end_epoch=2)
        out = [[(b["sample_id"].tolist(), b["image"].tobytes()) for b in source] for _ in range(2)]
        source.close()
        return out

    a = batches(1)
    assert a == batches(1)
    assert a != batches(2)


def test_chunks_in_flight_never_exceed_the_window(ray_local, sample_dir, monkeypatch):
    peak = []
    submit = ChunkStream._submit

    def recording_submit(self):
        submit(self)
        peak.append(len(self._pending))

    monkeypatch.setattr(ChunkStream, "_submit", recording_submit)
    pipe = Pipeline(
        str(sample_dir),
        AUG,
        config=PipelineConfig(batch_size=4),
        execution=ExecutionConfig(chunk_rows=4, num_tasks=2, prefetch_chunks=1),
    )
    source = EpochSource(pipe)  # open-ended: the window alone bounds the run-ahead
    for _ in source:
        time.sleep(0.01)  # a slow consumer
    source.close()
    assert max(peak) == 3


def test_stopping_mid_epoch_returns_at_once_and_the_next_epoch_is_whole(ray_local, sample_dir):
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=4), execution=ExecutionConfig(chunk_rows=4, num_tasks=2)
    )
    source = EpochSource(pipe, end_epoch=5)
    it = iter(source)
    next(it)
    t0 = time.perf_counter()
    it.close()
    assert time.perf_counter() - t0 < 2.0
    ids = _ids(source)  # epoch 1, from a new stream
    assert sorted(ids) == list(range(48)) and source.last_report.epoch == 1
    source.set_epoch(3)
    assert sorted(_ids(source)) == list(range(48)) and source.last_report.epoch == 3
    source.close()


def test_remote_shards_are_fetched_in_few_requests(ray_local, sample_dir, tmp_path):
    """A remote tar shard's window is one chunk: its neighbouring members come in one ranged request, not
    one request per image; every sample still comes once per epoch."""
    import tarfile

    from raypipe.sources import open_source
    from raypipe.testing import S3Server

    files = sorted(sample_dir.rglob("*.jpg"))
    folder = tmp_path / "buckets" / "bkt" / "wds"
    folder.mkdir(parents=True)
    for s in range(4):
        with tarfile.open(folder / f"shard-{s}.tar", "w") as tar:
            for i, path in enumerate(files[s * 12 : (s + 1) * 12]):
                tar.add(path, arcname=f"s{s}k{i:02d}.jpg")
                info = tarfile.TarInfo(f"s{s}k{i:02d}.cls")
                label = f"{i % 4}".encode()
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
    with S3Server(tmp_path / "buckets") as server:
        rows = open_source("s3://bkt/wds", filesystem=server.filesystem())
        pipe = Pipeline(
            rows,
            AUG,
            config=PipelineConfig(batch_size=4, shuffle_window=24),
            execution=ExecutionConfig(chunk_rows=4, num_tasks=2),
        )
        assert pipe.rows.kind == "webdataset" and len(pipe) == 48
        source = EpochSource(pipe, end_epoch=2)
        server.reset_counts()
        for _ in range(2):
            assert sorted(_ids(source)) == list(range(48))
        source.close()
        # 2 windows of 2 shards per epoch: a ranged GET per shard and window (and a handle's HEAD per
        # shard and worker). The run's first window is cut into 3 ramp pieces (4, 8, 12 rows), each
        # reading both its shards: 2 x 2 GETs more than one whole window. One request per image would
        # be 48 GETs per epoch.
        assert server.count("GetObject") <= 2 * 4 + 2 * 2, dict(server.requests)


def test_a_bug_in_a_task_fails_the_epoch_with_its_own_type(ray_local, sample_dir, monkeypatch):
    import ray

    from raypipe.workers import ray_tasks

    def broken(rows, spec):
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(ray_tasks, "_augment_chunk", ray.remote(max_retries=0)(broken))
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=4))
    with pytest.raises(ZeroDivisionError, match="a bug of ours"):
        list(pipe.epoch(0))


@pytest.mark.cluster
def test_two_ranks_on_a_two_node_cluster_share_it(sample_dir):
    """Each of N ranks sizes itself from its share: two ranks' workers add up to the cluster."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 150 * 2**20})
    try:
        cluster.add_node(num_cpus=2, object_store_memory=150 * 2**20)
        ray.init(address=cluster.address, logging_level="WARNING")
        cluster.wait_for_nodes()
        pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=8))
        alone = pipe.budget(world_size=1)
        ranks = [pipe.budget(world_size=2) for _ in range(2)]
        # one task per core: the 4 CPUs of both nodes
        assert alone.workers == 4 and sum(b.workers for b in ranks) == alone.workers
        store = 300 * 2**20 * 0.5  # STORE_SHARE of both nodes' stores
        assert sum(b.in_flight for b in ranks) * 8 * 32 * 32 * 3 <= store
        ids = []
        for rank in range(2):
            source = EpochSource(pipe, rank=rank, world_size=2, end_epoch=1)
            ids += _ids(source)
            source.close()
        assert sorted(ids) == list(range(48))
    finally:
        ray.shutdown()
        cluster.shutdown()


def _start_late(monkeypatch, starting_calls: int, setting_up_calls: int) -> None:
    """Ray "still starting" for its first ``starting_calls`` checks, then its workers' set-up tasks "not
    done yet" for the first ``setting_up_calls`` checks (their results are still taken)."""
    import raypipe.runtime
    from raypipe.pipeline.stream import ChunkStream

    calls, waits = [], []
    monkeypatch.setattr(raypipe.runtime, "starting", lambda: calls.append(1) or len(calls) <= starting_calls)
    ready = lambda self: waits.append(1) or len(waits) > setting_up_calls  # noqa: E731
    monkeypatch.setattr(ChunkStream, "_workers_ready", ready)


def _two_epochs_started_late(monkeypatch, pipe, starting_calls: int, setting_up_calls: int):
    """Two epochs of ``pipe()`` as ``_start_late`` has the cluster start: each batch's (ids, pixels),
    and the stream that made them."""
    _start_late(monkeypatch, starting_calls, setting_up_calls)
    source = EpochSource(pipe(), end_epoch=2)
    out = [[(b["sample_id"].tolist(), b["image"].tobytes()) for b in source] for _ in range(2)]
    stream = source._stream
    source.close()
    return out, stream


@pytest.mark.cluster
def test_trainers_cpus_are_not_taken_from_cpu_nodes_they_do_not_run_on(sample_dir):
    """Tasks steered to `preprocess` nodes: what the trainer and feeder hold on their own node (which
    offers no `preprocess`) leaves the CPU nodes' share whole; unsteered, it is taken from it."""
    import ray
    from ray.cluster_utils import Cluster

    from raypipe.config import ExecutionConfig

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 150 * 2**20})
    try:
        # the driver joins while the head is the only node: it runs there (nodes of one machine share an
        # address, and a driver joining later may land on any of them)
        ray.init(address=cluster.address, logging_level="WARNING")
        cluster.add_node(num_cpus=2, resources={"preprocess": 2}, object_store_memory=150 * 2**20)
        cluster.wait_for_nodes()
        steered = Pipeline(
            str(sample_dir),
            AUG,
            config=PipelineConfig(batch_size=8),
            execution=ExecutionConfig(resources={"preprocess": 0.001}),
        )
        b = steered.budget(world_size=1, reserved_cpus=1.25)
        assert (b.workers, b.task_cpus, b.cpus) == (2, 1.0, 2.0)
        anywhere = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=8))
        b = anywhere.budget(world_size=1, reserved_cpus=1.25)
        assert (b.workers, b.task_cpus, b.cpus) == (2, 0.875, 1.75)  # the 3 CPUs of both nodes, less 1.25
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_chunks_made_here_while_the_cluster_starts_are_the_tasks_chunks(ray_local, sample_dir, monkeypatch):
    """While the cluster starts, then until the workers' set-up tasks are done, the consumer makes the
    chunks itself: the same batches as Ray's tasks make."""

    def pipe() -> Pipeline:
        return Pipeline(
            str(sample_dir),
            AUG,
            config=PipelineConfig(batch_size=5, seed=3),
            execution=ExecutionConfig(chunk_rows=7, num_tasks=2),
        )

    reference, from_tasks = _two_epochs_started_late(monkeypatch, pipe, 0, 0)
    started_late, here = _two_epochs_started_late(monkeypatch, pipe, 3, 2)
    # 48 rows in chunks of 7: 7 chunks an epoch; 3 made while the cluster starts, 2 while workers set up
    assert (from_tasks.local_chunks, here.local_chunks) == (0, 5)
    assert from_tasks._setting_up is None  # a stream that began on a running cluster sends no set-up tasks
    assert here.workers_set_up and len(here._setting_up) == here.budget.workers == 2
    assert started_late == reference  # the same rows, order and pixels either way
    assert all(sorted(i for ids, _ in epoch for i in ids) == list(range(48)) for epoch in started_late)


def test_a_piece_longer_than_a_chunk_leaves_the_next_chunks_to_the_workers(
    ray_local, sample_dir, tmp_path, monkeypatch
):
    """A whole-window source's first pieces double from ``chunk_rows``: once the workers can take
    chunks (here: the cluster up, its set-up tasks not done), the consumer sends the chunks after a long
    piece to them before it makes that piece itself, instead of making the next ones too while the
    workers wait. The batches are the same either way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raypipe.sources import open_source

    files = sorted(sample_dir.rglob("*.jpg"))
    table = pa.table(
        {
            "image": pa.array([f.read_bytes() for f in files], pa.binary()),
            "label": pa.array([i % 3 for i in range(len(files))], pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=4)

    def pipe() -> Pipeline:
        return Pipeline(
            open_source(str(tmp_path)),
            AUG,
            config=PipelineConfig(batch_size=5, seed=3, shuffle_window=48),
            execution=ExecutionConfig(chunk_rows=3, num_tasks=2),
        )

    # one 48-row window (12 row groups) an epoch, cut in the first epoch into 3, 6, 12, 24, 3 rows
    assert [len(c) for c in pipe().plan(0, 1).chunks(0, ramp=True)] == [3, 6, 12, 24, 3]
    reference, _ = _two_epochs_started_late(monkeypatch, pipe, 0, 0)
    # the cluster starts for the first call: the 3-row piece is made here; then the workers set up for
    # many calls, which alone would keep the consumer making pieces: it makes the 6-row one and sends
    # the rest to the workers
    started_late, here = _two_epochs_started_late(monkeypatch, pipe, 1, 100)
    assert here.local_chunks == 2
    assert started_late == reference
