"""The Ray pipeline in local Ray: exact accounting, determinism, sharding, bad inputs."""

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.config import EvalAugment, PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline, SkipLimitError, shard_indices

pytestmark = pytest.mark.timeout(240)

AUG = TrainAugment(input_size=32, color_jitter=None)


def run_epoch(pipe, epoch=0, **kw):
    run = pipe.epoch(epoch, **kw)
    batches = list(run)
    return batches, run.report


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory, sample_dir):
    """The sample data plus one class of broken files mixed with good ones."""
    root = tmp_path_factory.mktemp("bad")
    shutil.copytree(sample_dir, root, dirs_exist_ok=True)
    cls = sorted(os.listdir(root))[0]
    good = sorted((root / cls).iterdir())[0].read_bytes()
    (root / cls / "trunc.jpg").write_bytes(good[: len(good) // 3])
    (root / cls / "empty.jpg").write_bytes(b"")
    (root / cls / "noise.jpg").write_bytes(np.random.default_rng(0).bytes(5000))
    (root / cls / "text.png").write_bytes(b"hello, I am not a picture\n" * 20)
    return root


def test_every_sample_once_exact_batches(ray_local, sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=10, block_size=7))
    batches, rep = run_epoch(pipe)
    sizes = [len(b["sample_id"]) for b in batches]
    assert sizes[:-1] == [10] * (len(sizes) - 1) and sizes[-1] == 48 - 10 * (len(sizes) - 1)
    ids = np.concatenate([b["sample_id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(48))
    assert rep.emitted == 48 and rep.num_skipped == 0 and rep.expected == 48
    for b in batches:
        assert b["image"].dtype == np.uint8 and b["image"].shape[1:] == (32, 32, 3)
        assert b["image"].flags.c_contiguous
        assert b["label"].dtype == np.int64
    labels = dict(zip(pipe.rows.table.column("sample_id").to_pylist(), pipe.rows.table.column("label").to_pylist(),
                      strict=True))
    for b in batches:
        assert [labels[int(s)] for s in b["sample_id"]] == b["label"].tolist()


def test_drop_last_is_accounted(ray_local, sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=20, drop_last=True))
    batches, rep = run_epoch(pipe)
    assert [len(b["sample_id"]) for b in batches] == [20, 20]
    assert rep.emitted == 40 and rep.dropped_last == 8


def test_content_is_deterministic_whatever_the_workers(ray_local, sample_dir):
    digests = []
    for cfg in (
        PipelineConfig(batch_size=16, num_actors=1, block_size=5),
        PipelineConfig(batch_size=7, num_actors=2, block_size=16),
        PipelineConfig(batch_size=16, num_actors=2, compute="actors"),
    ):
        pipe = Pipeline(str(sample_dir), AUG, config=cfg, content_digest=True)
        digests.append(run_epoch(pipe)[1].content_sha256)
    assert len(set(digests)) == 1
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16), content_digest=True)
    assert run_epoch(pipe, epoch=1)[1].content_sha256 != digests[0]
    other_seed = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16, seed=7), content_digest=True)
    assert run_epoch(other_seed)[1].content_sha256 != digests[0]


def test_shards_are_disjoint_and_cover(ray_local, sample_dir):
    for epoch in (0, 1):
        parts = [shard_indices(48, seed=3, epoch=epoch, shuffle=True, rank=r, world_size=3) for r in range(3)]
        allidx = np.concatenate(parts)
        assert sorted(allidx.tolist()) == list(range(48))
    assert not np.array_equal(
        shard_indices(48, seed=3, epoch=0, shuffle=True), shard_indices(48, seed=3, epoch=1, shuffle=True)
    )
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=8))
    seen = []
    for rank in range(2):
        batches, rep = run_epoch(pipe, rank=rank, world_size=2)
        assert rep.expected == 24
        seen += np.concatenate([b["sample_id"] for b in batches]).tolist()
    assert sorted(seen) == list(range(48))


def test_bad_files_are_skipped_with_reasons_neighbours_survive(ray_local, bad_dir):
    pipe = Pipeline(str(bad_dir), AUG, config=PipelineConfig(batch_size=16, block_size=64, max_skip_ratio=0.1))
    batches, rep = run_epoch(pipe)
    assert rep.expected == 52
    assert rep.emitted == 48  # all good images, including the ones sharing a block with bad ones
    assert rep.emitted + rep.num_skipped == rep.expected
    by_path = {os.path.basename(s["path"]): s["reason"] for s in rep.skipped_paths}
    assert by_path == {"trunc.jpg": "truncated", "empty.jpg": "empty", "noise.jpg": "not_an_image",
                       "text.png": "not_an_image"}


def test_skip_limit_lists_paths(ray_local, bad_dir):
    pipe = Pipeline(str(bad_dir), AUG, config=PipelineConfig(batch_size=16, max_skip_ratio=0.01))
    with pytest.raises(SkipLimitError) as e:
        run_epoch(pipe)
    for name in ("trunc.jpg", "empty.jpg", "noise.jpg", "text.png"):
        assert name in str(e.value)


def test_parquet_pipeline_with_null_cell(ray_local, sample_dir, tmp_path):
    files = sorted(p for p in sample_dir.rglob("*.jpg"))[:10]
    images = [f.read_bytes() for f in files]
    images[3] = None
    table = pa.table({"img": pa.array(images, pa.binary()), "y": pa.array([i % 2 for i in range(10)], pa.int64())})
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=4)
    pipe = Pipeline(
        __import__("raypipe.sources", fromlist=["x"]).open_source(str(tmp_path), image_column="img", label_column="y"),
        EvalAugment(input_size=24),
        config=PipelineConfig(batch_size=4, shuffle=False, max_skip_ratio=0.1),
    )
    batches, rep = run_epoch(pipe)
    assert rep.emitted == 9 and rep.skipped == {"null_image": 1}
    ids = np.concatenate([b["sample_id"] for b in batches]).tolist()
    assert sorted(ids) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    labels = np.concatenate([b["label"] for b in batches]).tolist()
    assert labels == [i % 2 for i in ids]


def test_manifest_escape_and_bad_label_counted(ray_local, sample_dir, tmp_path):
    files = sorted(p for p in sample_dir.rglob("*.jpg"))[:4]
    lines = ["path,label"] + [f"{os.path.relpath(f, sample_dir)},1" for f in files]
    lines += [f"{os.path.relpath(files[0], sample_dir)},notanint", "../escape.jpg,0", "missing.jpg,2"]
    (tmp_path / "escape.jpg").write_bytes(files[0].read_bytes())
    man = sample_dir / "m.csv"
    man.write_text("\n".join(lines) + "\n")
    try:
        pipe = Pipeline(str(man), AUG, config=PipelineConfig(batch_size=4, max_skip_ratio=0.5))
        _, rep = run_epoch(pipe)
    finally:
        man.unlink()
    assert rep.emitted == 4
    assert rep.skipped == {"bad_label": 1, "missing": 1, "outside_root": 1}


def _warm_probe(sample_dir, monkeypatch, warm_lead_s):
    """An EpochSource whose warm-ups are only recorded (epoch numbers in the returned list), set to
    warm epoch 1; 8-row blocks, one prefetch slot, one worker: a block margin of 16 rows."""
    from raypipe.pipeline import EpochSource

    cfg = PipelineConfig(batch_size=8, block_size=8, prefetch_blocks=1, num_actors=1)
    source = EpochSource(Pipeline(str(sample_dir), TrainAugment(input_size=32), config=cfg), warm_lead_s=warm_lead_s)
    started = []

    class Run:
        def __init__(self, epoch):
            self.epoch = epoch

        def prestart(self):
            started.append(self.epoch)

    monkeypatch.setattr(source, "_make", Run)
    source.next_epoch = 1
    return source, started


def test_next_epoch_warms_up_when_the_last_blocks_are_in_flight(ray_local, sample_dir, monkeypatch):
    source, started = _warm_probe(sample_dir, monkeypatch, warm_lead_s=0)
    margin = 8 * (1 + 1)  # a block per prefetch slot and per worker
    source._maybe_warm_next(seen=10_000 - margin - 1, expected=10_000)
    assert started == []
    source._maybe_warm_next(seen=10_000 - margin, expected=10_000)
    assert started == [1]
    source._maybe_warm_next(seen=10_000 - 1, expected=10_000)  # once per epoch
    assert started == [1]
    source._upcoming = None
    source.end_epoch = 1  # nothing warms past the last epoch
    source._maybe_warm_next(seen=10_000 - 1, expected=10_000)
    assert started == [1]


def test_next_epoch_warms_up_a_lead_time_ahead_at_the_current_pace(ray_local, sample_dir, monkeypatch):
    source, started = _warm_probe(sample_dir, monkeypatch, warm_lead_s=2.0)
    for t in range(10):  # 500 rows/s: 4500 rows after 9 s
        source._maybe_warm_next(seen=500 * t, expected=6100, now=100.0 + t)
    assert started == []  # 1600 rows left; the block margin (16 rows) + 2 s at 500 rows/s is 1016
    source._maybe_warm_next(seen=5090, expected=6100, now=110.18)  # 1010 left
    assert started == [1]


def test_next_epoch_warms_up_earlier_by_the_time_its_dataset_took_to_build(ray_local, sample_dir, monkeypatch):
    """An ImageNet-size shard takes seconds to cut into blocks before its execution starts: the next
    epoch's will take as long as this one's did, so the lead covers that too."""
    from types import SimpleNamespace

    source, started = _warm_probe(sample_dir, monkeypatch, warm_lead_s=2.0)
    source.current = SimpleNamespace(block_rows=8, build_s=3.0)
    for t in range(10):  # 500 rows/s: 4500 rows after 9 s
        source._maybe_warm_next(seen=500 * t, expected=7100, now=100.0 + t)
    assert started == []  # 2600 rows left; the block margin (16 rows) + (2 + 3) s at 500 rows/s is 2516
    source._maybe_warm_next(seen=4590, expected=7100, now=109.18)  # 2510 left
    assert started == [1]


def test_an_epoch_records_how_long_its_dataset_took_to_build(ray_local, sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=10, block_size=7))
    run = pipe.epoch(0)
    assert run.build_s == 0.0
    list(run)
    assert 0.0 < run.build_s < run.report.seconds


def test_building_an_epochs_dataset_needs_no_free_cpu(ray_local, sample_dir, tmp_path):
    """The next epoch's dataset is built while the current epoch's tasks hold every CPU: building it
    must not wait for a CPU (Ray Data's from_arrow_refs ran a 1-CPU task per block to read metadata)."""
    import threading

    import ray

    started, release = tmp_path / "started", tmp_path / "release"

    @ray.remote(num_cpus=ray.cluster_resources()["CPU"])
    def hold_every_cpu(started: str, release: str) -> None:
        import pathlib
        import time

        pathlib.Path(started).touch()
        deadline = time.monotonic() + 120
        while not pathlib.Path(release).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    holder = hold_every_cpu.remote(str(started), str(release))
    try:
        while not started.exists():
            ready, _ = ray.wait([holder], timeout=0.1)
            assert not ready, "the CPU holder ended before it started"
        pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=4, block_size=4, num_actors=2))
        built = []
        builder = threading.Thread(target=lambda: built.append(pipe.dataset(0)), daemon=True)
        builder.start()
        builder.join(timeout=60)
        assert built, "Pipeline.dataset() waited for a free CPU"
        _, rows, block = built[0]
        assert (rows, block) == (len(pipe), 4)
    finally:
        release.touch()
        ray.get(holder)


def test_a_warmed_epochs_first_blocks_do_not_warm_the_next_one(ray_local, sample_dir, monkeypatch):
    """A warmed-up epoch starts with blocks already done: the consumer takes them in a burst. That
    burst is not the epoch's pace (the average over it once warmed the next epoch at the first block,
    and the two executions then shared the cores for the whole epoch)."""
    source, started = _warm_probe(sample_dir, monkeypatch, warm_lead_s=1.0)
    for i in range(1, 13):  # twelve 128-row blocks in 12 ms
        source._maybe_warm_next(seen=128 * i, expected=20_000, now=50.0 + i / 1000)
    assert started == []
    seen, now = 1536, 50.012
    while seen < 20_000 - 16 - 1500 - 128:  # then 1500 rows/s: no warm-up until 1516 rows are left
        seen, now = seen + 128, now + 128 / 1500
        source._maybe_warm_next(seen=seen, expected=20_000, now=now)
        assert started == [], seen
    source._maybe_warm_next(seen=seen + 256, expected=20_000, now=now + 256 / 1500)
    assert started == [1]


def test_pace_is_the_rate_over_the_last_window():
    from raypipe.pipeline.pipeline import Pace

    pace = Pace(window_s=1.0)
    assert pace.update(10.0, 0) is None  # not a window yet
    assert pace.update(10.5, 5000) is None
    assert pace.update(11.0, 5100) == pytest.approx(5100)  # 10.0 .. 11.0
    for i in range(1, 5):
        rate = pace.update(11.0 + i * 0.5, 5100 + i * 100)  # 200 rows/s from 11.0 on
    assert rate == pytest.approx(200)  # the burst at 10.5 has left the window


def test_an_epochs_execution_may_not_run_far_ahead(ray_local, sample_dir):
    import ray

    cfg = PipelineConfig(batch_size=8, block_size=8, prefetch_blocks=2, num_actors=3)
    pipe = Pipeline(str(sample_dir), TrainAugment(input_size=32), config=cfg)
    assert pipe.run_ahead_bytes() == 8 * 32 * 32 * 3 * (2 + 2 * 3)
    ds, _, _ = pipe.dataset(0)
    assert ds.context.execution_options.resource_limits.object_store_memory == pipe.run_ahead_bytes()
    ctx = ray.data.DataContext.get_current()
    saved = ctx.execution_options.resource_limits
    try:  # a tighter limit the user set on the current context is kept
        ctx.execution_options.resource_limits = saved.copy(object_store_memory=1000)
        ds, _, _ = pipe.dataset(0)
        assert ds.context.execution_options.resource_limits.object_store_memory == 1000
    finally:
        ctx.execution_options.resource_limits = saved


def _noise_jpegs(root, *, classes: int, per_class: int) -> None:
    """An image folder of small random-pixel JPEGs (quick to write, decode and augment)."""
    import simplejpeg

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir()
        for i in range(per_class):
            img = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
            (root / f"c{c}" / f"{i}.jpg").write_bytes(simplejpeg.encode_jpeg(img))


def test_long_epochs_use_bigger_blocks(ray_local, tmp_path):
    """Bigger blocks only where the blocks in flight at that size are at most a quarter of the epoch
    (here 8-row blocks x (1 prefetched + 1 worker) x 4 = 64 rows)."""
    _noise_jpegs(tmp_path, classes=2, per_class=33)  # 66 rows
    cfg = PipelineConfig(batch_size=4, block_size=4, long_block_size=8, prefetch_blocks=1, num_actors=1)
    pipe = Pipeline(str(tmp_path), AUG, config=cfg)
    assert pipe.epoch_block_size(63) == 4 and pipe.epoch_block_size(64) == 8
    ds, n, size = pipe.dataset(0)
    assert n == 66 and size == 8
    assert ds.context.execution_options.resource_limits.object_store_memory == pipe.run_ahead_bytes(1, block_size=8)
    run = pipe.epoch(0)
    batches = list(run)
    assert run.block_rows == 8 and run.report.emitted == 66
    assert [len(b["sample_id"]) for b in batches] == [4] * 16 + [2]
    sharded = pipe.epoch(0, rank=0, world_size=2)  # 33 rows per rank: a short epoch
    assert sum(len(b["sample_id"]) for b in sharded) == 33 and sharded.block_rows == 4


def _plasma_mib() -> int:
    from raypipe.benchmark.measure import plasma_used_mib

    mib = plasma_used_mib()
    assert mib is not None, "no plasma usage line in Ray's memory summary"
    return mib


def test_an_unread_execution_stops_at_its_run_ahead_cap(ray_local, tmp_path):
    """The cap is enforced, not only set: an epoch whose blocks nobody reads stops computing near it.
    (Switched off, Ray Data's allocator bounded nothing: a warmed-up next epoch filled the store.)"""
    import time

    _noise_jpegs(tmp_path, classes=4, per_class=50)
    cfg = PipelineConfig(batch_size=4, block_size=4, prefetch_blocks=1, num_actors=1)
    pipe = Pipeline(str(tmp_path), TrainAugment(input_size=448, color_jitter=None), config=cfg)
    cap_mib = pipe.run_ahead_bytes() / 2**20  # 3 blocks of 2.3 MB; all 200 rows would be 115 MiB
    base = _plasma_mib()
    run = pipe.epoch(0)
    run.prestart()
    try:
        readings, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:  # until the store stops filling for 2 s
            time.sleep(0.5)
            readings.append(_plasma_mib() - base)
            if len(readings) >= 6 and readings[-1] > 0 and len(set(readings[-4:])) == 1:
                break
        print("object store MiB while unread:", readings, "cap", round(cap_mib, 1))
        assert 0 < readings[-1] <= 3 * cap_mib, (readings, cap_mib)
    finally:
        run.cancel()


def test_a_task_no_node_can_hold_is_an_error_on_a_private_cluster(ray_local, sample_dir, monkeypatch, caplog):
    """cpus_per_actor above every node's CPUs (or a resource no node has) left the epoch waiting without a
    word. raypipe's own local cluster never grows: an error; another cluster may autoscale: a warning."""
    import logging

    import raypipe.runtime
    from raypipe.pipeline.pipeline import check_task_fits

    big = PipelineConfig(batch_size=4, cpus_per_actor=64)
    with caplog.at_level(logging.WARNING, logger="raypipe.pipeline.pipeline"):
        check_task_fits(big)
        check_task_fits(PipelineConfig(batch_size=4, resources={"preprocess": 0.001}))
    warned = [r.getMessage() for r in caplog.records if "no node of the cluster" in r.getMessage()]
    assert len(warned) == 2 and "cpus_per_actor=64" in warned[0] and "preprocess" in warned[1]
    check_task_fits(PipelineConfig(batch_size=4, cpus_per_actor=2))  # fits the 2-CPU node: silent
    assert len([r for r in caplog.records if "no node" in r.getMessage()]) == 2
    monkeypatch.setattr(raypipe.runtime, "_PRIVATE_CLUSTER", True)
    with pytest.raises(ValueError, match="largest node has 2 CPUs"):
        list(Pipeline(str(sample_dir), AUG, config=big).epoch(0))


def test_a_stalled_epoch_says_so(sample_dir, monkeypatch, caplog):
    """A block that never comes (a read hung on a network mount) stalled the epoch without a word."""
    import logging
    import threading

    from raypipe.pipeline import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "STALL_WARN_S", 0.1)
    run = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=4)).epoch(3)
    late = threading.Timer(0.5, run._queue.put, args=("block",))
    late.start()
    with caplog.at_level(logging.WARNING, logger="raypipe.pipeline.pipeline"):
        assert run._next_item() == "block"  # still waits for it after the warning
    late.join()
    assert any("epoch 3: no block for" in r.getMessage() for r in caplog.records)


def _prefetch_threads() -> int:
    import threading

    return sum(t.name == "Prefetcher" and t.is_alive() for t in threading.enumerate())


def test_epochs_leave_no_prefetch_threads_behind(ray_local, sample_dir):
    """Ray Data 2.60 starts a prefetch thread per iter_batches(prefetch_batches=0) and never stops it:
    one idle thread per epoch piled up in the consumer's process."""
    import time

    from raypipe.pipeline import EpochSource

    before = _prefetch_threads()
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16))
    source = EpochSource(pipe)
    for _ in range(5):
        assert sum(len(b["sample_id"]) for b in source) == len(pipe)
    source.close()
    for e in range(3):
        list(pipe.epoch(10 + e))
    deadline = time.monotonic() + 10
    while _prefetch_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)  # a stopped prefetcher's thread ends on its next wake-up
    assert _prefetch_threads() <= before


def test_worker_niceness_travels_in_the_stage_spec(ray_local, sample_dir):
    assert Pipeline(str(sample_dir), AUG).stage_spec(0).nice == 10  # default: the consumer before its workers
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16, worker_nice=5))
    assert pipe.stage_spec(3).nice == 5
    batches, rep = run_epoch(pipe)  # the stage lowers its worker's priority and still delivers everything
    assert rep.emitted == 48 and sum(len(b["sample_id"]) for b in batches) == 48


def _thread_stat(pid: int, field: int) -> dict[int, int]:
    """tid -> field ``field`` (1-based, as proc(5) numbers them) of every thread of ``pid``'s Linux
    /proc stat: 19 is the niceness, 41 the scheduling policy."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:  # fields after "(comm)" start at field 3
                out[int(tid)] = int(fh.read().rsplit(")", 1)[1].split()[field - 3])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return out


def _ray_worker_pids() -> list[int]:
    """The local Ray's worker processes: our descendants whose title starts with ``ray::``."""
    import psutil

    procs = psutil.Process().children(recursive=True)
    return [p.pid for p in procs if p.cmdline()[:1] and p.cmdline()[0].startswith("ray::")]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread niceness is read from Linux /proc")
def test_worker_nice_applies_to_the_stage_thread_only(ray_local, sample_dir):
    @ray_local.remote(num_cpus=0.5)
    def niceness():
        return os.nice(0)

    # raypipe's local clusters start workers at 0, not Ray's default 15 (starved beside any busy process)
    assert set(ray_local.get([niceness.remote() for _ in range(4)])) == {0}
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16, worker_nice=7))
    _, rep = run_epoch(pipe)
    assert rep.emitted == 48
    threads = {pid: _thread_stat(pid, 19) for pid in _ray_worker_pids()}  # niceness per thread
    assert any(7 in t.values() for t in threads.values())  # the stage's thread in the workers that ran it
    assert all(t.get(pid, 0) == 0 for pid, t in threads.items())  # every worker's main thread untouched
    # ... so the workers Ray hands to later tasks of the job run them at normal priority
    assert set(ray_local.get([niceness.remote() for _ in range(8)])) == {0}


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"),
                    reason="SCHED_IDLE and per-thread policies are Linux's")  # fmt: skip
def test_worker_sched_idle_applies_to_the_stage_thread_only(ray_local, sample_dir):
    assert Pipeline(str(sample_dir), AUG).stage_spec(0).sched_idle is False  # off by default
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16, worker_sched_idle=True))
    assert pipe.stage_spec(0).sched_idle is True
    _, rep = run_epoch(pipe)
    assert rep.emitted == 48  # the stage still delivers every image from its idle-policy thread
    policies = {pid: _thread_stat(pid, 41) for pid in _ray_worker_pids()}  # scheduling policy per thread
    assert any(os.SCHED_IDLE in t.values() for t in policies.values())  # the stage's thread
    assert all(t.get(pid) == os.SCHED_OTHER for pid, t in policies.items())  # every worker's main thread

    @ray_local.remote(num_cpus=0.5)
    def policy():
        return os.sched_getscheduler(0)

    # the workers Ray hands to later tasks run them under the normal policy
    assert set(ray_local.get([policy.remote() for _ in range(8)])) == {os.SCHED_OTHER}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes hold the later blocks back")
def test_first_block_is_handed_out_before_later_blocks_finish(ray_local, sample_dir, tmp_path):
    """An epoch's first block reaches the consumer while the other blocks are still running (Ray Data
    fills a prefetch window of w blocks and fetches one more before handing out the first: with w=4, a
    cold epoch's first batch waited for five blocks). Blocks 1-3 read named pipes that only get their bytes
    once the first batch has arrived, so a consumer waiting for them would never see it."""
    import threading

    jpegs = sorted(sample_dir.rglob("*.jpg"))[:4]
    lines = ["path,label"]
    for i, f in enumerate(jpegs):
        shutil.copy(f, tmp_path / f"good{i}.jpg")
        lines.append(f"good{i}.jpg,0")
    pipes = [tmp_path / f"held{i}.jpg" for i in range(12)]
    for p in pipes:
        os.mkfifo(p)
        lines.append(f"{p.name},1")
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    cfg = PipelineConfig(batch_size=4, block_size=4, shuffle=False, prefetch_blocks=4, num_actors=4)
    run = Pipeline(str(tmp_path / "m.csv"), AUG, config=cfg).epoch(0)
    batches, first_seen, failed = [], threading.Event(), []

    def consume():
        try:
            for b in run:
                batches.append(b)
                first_seen.set()
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            failed.append(e)
            first_seen.set()

    def release(p):
        with open(p, "wb") as f:  # blocks until a task opens the pipe to read it
            f.write(jpegs[0].read_bytes())

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        arrived = first_seen.wait(60)
        assert arrived and not failed, failed
        assert [int(i) for i in batches[0]["sample_id"]] == [0, 1, 2, 3]
    finally:
        writers = [threading.Thread(target=release, args=(p,), daemon=True) for p in pipes]
        for w in writers:
            w.start()
        consumer.join(120)
    assert not failed, failed
    assert run.report.emitted == 16 and sorted(np.concatenate([b["sample_id"] for b in batches])) == list(range(16))
