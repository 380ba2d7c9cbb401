"""The Ray pipeline in local Ray: exact accounting, determinism, sharding, bad inputs."""

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.config import EvalAugment, ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline, SkipLimitError

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
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=10), execution=ExecutionConfig(chunk_rows=7))
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
    labels = dict(
        zip(pipe.rows.table.column("sample_id").to_pylist(), pipe.rows.table.column("label").to_pylist(), strict=True)
    )
    for b in batches:
        assert [labels[int(s)] for s in b["sample_id"]] == b["label"].tolist()


def test_drop_last_is_accounted(ray_local, sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=20, drop_last=True))
    batches, rep = run_epoch(pipe)
    assert [len(b["sample_id"]) for b in batches] == [20, 20]
    assert rep.emitted == 40 and rep.dropped_last == 8


def test_content_is_deterministic_whatever_the_workers(ray_local, sample_dir):
    digests = []
    for cfg, ex in (
        (PipelineConfig(batch_size=16), ExecutionConfig(num_tasks=1, chunk_rows=5)),
        (PipelineConfig(batch_size=7), ExecutionConfig(num_tasks=2, chunk_rows=16)),
        (PipelineConfig(batch_size=16), ExecutionConfig(num_tasks=3, prefetch_chunks=0)),
    ):
        pipe = Pipeline(str(sample_dir), AUG, config=cfg, execution=ex, content_digest=True)
        digests.append(run_epoch(pipe)[1].content_sha256)
    assert len(set(digests)) == 1
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16), content_digest=True)
    assert run_epoch(pipe, epoch=1)[1].content_sha256 != digests[0]
    other_seed = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16, seed=7), content_digest=True)
    assert run_epoch(other_seed)[1].content_sha256 != digests[0]


def test_ranks_are_disjoint_and_cover(ray_local, sample_dir):
    pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=8))
    seen = []
    for rank in range(2):
        batches, rep = run_epoch(pipe, rank=rank, world_size=2)
        assert rep.expected == 24
        seen += np.concatenate([b["sample_id"] for b in batches]).tolist()
    assert sorted(seen) == list(range(48))


def test_bad_files_are_skipped_with_reasons_neighbours_survive(ray_local, bad_dir):
    pipe = Pipeline(
        str(bad_dir),
        AUG,
        config=PipelineConfig(batch_size=16, max_skip_ratio=0.1),
        execution=ExecutionConfig(chunk_rows=64),
    )
    batches, rep = run_epoch(pipe)
    assert rep.expected == 52
    assert rep.emitted == 48  # all good images, including the ones sharing a block with bad ones
    assert rep.emitted + rep.num_skipped == rep.expected
    by_path = {os.path.basename(s["path"]): s["reason"] for s in rep.skipped_paths}
    assert by_path == {
        "trunc.jpg": "truncated",
        "empty.jpg": "empty",
        "noise.jpg": "not_an_image",
        "text.png": "not_an_image",
    }


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


def test_a_task_no_node_can_hold_is_an_error_on_a_private_cluster(ray_local, sample_dir, monkeypatch, caplog):
    """cpus_per_task above every node's CPUs (or a resource no node has) left the epoch waiting without a
    word. raypipe's own local cluster never grows: an error; another cluster may autoscale: a warning."""
    import logging

    import raypipe.runtime
    from raypipe.pipeline.budget import check_task_fits

    big = ExecutionConfig(cpus_per_task=64)
    # another cluster (an earlier test may have left raypipe's private one connected)
    monkeypatch.setattr(raypipe.runtime, "_PRIVATE_CLUSTER", False)
    with caplog.at_level(logging.WARNING, logger="raypipe.pipeline.pipeline"):
        check_task_fits(big)
        check_task_fits(ExecutionConfig(resources={"preprocess": 0.001}))
    warned = [r.getMessage() for r in caplog.records if "no node of the cluster" in r.getMessage()]
    assert len(warned) == 2 and "cpus_per_task=64" in warned[0] and "preprocess" in warned[1]
    check_task_fits(ExecutionConfig(cpus_per_task=2))  # fits the 2-CPU node: silent
    assert len([r for r in caplog.records if "no node" in r.getMessage()]) == 2
    monkeypatch.setattr(raypipe.runtime, "_PRIVATE_CLUSTER", True)
    with pytest.raises(ValueError, match="largest node has 2 CPUs"):
        list(Pipeline(str(sample_dir), AUG, execution=big).epoch(0))


def test_a_stalled_chunk_says_so(ray_local, sample_dir, monkeypatch, caplog):
    """A chunk that does not come (a read hung on a network mount) must not stall the epoch without a word."""
    import logging
    import threading

    import ray

    from raypipe.pipeline import stream as stream_module

    monkeypatch.setattr(stream_module, "STALL_WARN_S", 0.2)
    gate = threading.Event()
    original = ray.wait

    def slow_wait(refs, timeout=None):  # the first chunk "hangs" until the gate opens
        if not gate.is_set():
            threading.Timer(0.7, gate.set).start()
            gate.wait(timeout)
            return [], refs
        return original(refs, timeout=timeout)

    monkeypatch.setattr(ray, "wait", slow_wait)
    with caplog.at_level(logging.WARNING, logger="raypipe.pipeline.stream"):
        _, rep = run_epoch(Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=16)), epoch=3)
    assert rep.emitted == 48  # still waited for it after the warning
    assert any("epoch 3, chunk 0: not done after" in r.getMessage() for r in caplog.records)


def test_worker_niceness_travels_in_the_stage_spec(ray_local, sample_dir):
    assert Pipeline(str(sample_dir), AUG).stage_spec(0).nice == 10  # default: the consumer before its workers
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=16), execution=ExecutionConfig(worker_nice=5)
    )
    assert pipe.stage_spec(3).nice == 5
    batches, rep = run_epoch(pipe)  # the stage lowers its worker's priority and still delivers everything
    assert rep.emitted == 48 and sum(len(b["sample_id"]) for b in batches) == 48


def _thread_stat(pid: int, field: int) -> dict[int, int]:
    """tid -> field ``field`` (1-based, as proc(5) numbers them) of every thread of ``pid``'s Linux
    /proc stat: 19 is the niceness, 41 the scheduling policy."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out  # the process ended meanwhile
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:  # fields after "(comm)" start at field 3
                out[int(tid)] = int(fh.read().rsplit(")", 1)[1].split()[field - 3])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return out


def _ray_worker_pids() -> list[int]:
    """The local Ray's worker processes: our descendants whose title starts with ``ray::``."""
    import psutil

    pids = []
    for proc in psutil.Process().children(recursive=True):
        try:
            title = proc.cmdline()[:1]
        except psutil.NoSuchProcess:  # ended since it was listed (an idle worker Ray let go)
            continue
        if title and title[0].startswith("ray::"):
            pids.append(proc.pid)
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread niceness is read from Linux /proc")
def test_worker_nice_applies_to_the_stage_thread_only(ray_local, sample_dir):
    @ray_local.remote(num_cpus=0.5)
    def niceness():
        return os.nice(0)

    # raypipe's local clusters start workers at 0, not Ray's default 15 (starved beside any busy process)
    assert set(ray_local.get([niceness.remote() for _ in range(4)])) == {0}
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=16), execution=ExecutionConfig(worker_nice=7)
    )
    _, rep = run_epoch(pipe)
    assert rep.emitted == 48
    threads = {pid: _thread_stat(pid, 19) for pid in _ray_worker_pids()}  # niceness per thread
    assert any(7 in t.values() for t in threads.values())  # the stage's thread in the workers that ran it
    assert all(t.get(pid, 0) == 0 for pid, t in threads.items())  # every worker's main thread untouched
    # ... so the workers Ray hands to later tasks of the job run them at normal priority
    assert set(ray_local.get([niceness.remote() for _ in range(8)])) == {0}


@pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"),
    reason="SCHED_IDLE and per-thread policies are Linux's",
)
def test_worker_sched_idle_applies_to_the_stage_thread_only(ray_local, sample_dir):
    assert Pipeline(str(sample_dir), AUG).stage_spec(0).sched_idle is False  # off by default
    pipe = Pipeline(
        str(sample_dir), AUG, config=PipelineConfig(batch_size=16), execution=ExecutionConfig(worker_sched_idle=True)
    )
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
    """An epoch's first chunk reaches the consumer while the later chunks are still running. Chunks 1-3
    read named pipes that only get their bytes once the first batch has arrived, so a consumer waiting
    for them would never see it."""
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
    cfg = PipelineConfig(batch_size=4, shuffle=False)
    ex = ExecutionConfig(chunk_rows=4, prefetch_chunks=4, num_tasks=4)
    run = Pipeline(str(tmp_path / "m.csv"), AUG, config=cfg, execution=ex).epoch(0)
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
