"""raypipe.runtime and the worker-side priority helper: small pure pieces, tested without Ray."""

import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import pytest

from raypipe.runtime import worker_pool_env
from raypipe.stages.augment import call_at_niceness, lower_priority


def test_worker_pool_keeps_two_workers_per_cpu_idle_at_normal_priority():
    assert worker_pool_env(16) == {"RAY_num_workers_soft_limit": "36", "RAY_worker_niceness": "0"}


def _nice_after(target, queue):
    lower_priority(target)
    first = os.nice(0)
    lower_priority(target)  # idempotent: not raised twice
    lower_priority(0)  # never lowered
    queue.put((first, os.nice(0)))


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no os.nice on this platform")
def test_lower_priority_raises_niceness_once_and_never_lowers_it():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = os.nice(0)
    target = min(19, start + 3)
    proc = ctx.Process(target=_nice_after, args=(target, queue))
    proc.start()
    first, last = queue.get(timeout=60)
    proc.join(60)
    assert first == target and last == target
    assert os.nice(0) == start  # this process untouched


_PROBE = """
import warnings, ray
import os
from raypipe.runtime import check_worker_priority, worker_pool_env
if {config}:
    os.environ.update(worker_pool_env(1))
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    nice = check_worker_priority()
print(nice, [str(w.message)[:40] for w in caught])
"""


@pytest.mark.ray
@pytest.mark.skipif(not hasattr(os, "nice"), reason="no os.nice on this platform")
@pytest.mark.parametrize(
    ("config", "expected"),
    [("False", "15 ['Ray workers on this cluster run at nicen']"), ("True", "0 []")],
    ids=["ray-default", "raypipe-config"],
)
def test_worker_priority_probe_warns_about_rays_default(config, expected):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(config=config)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == expected


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no os.nice on this platform")
def test_call_at_niceness_runs_on_a_lowered_thread_and_leaves_the_caller_alone():
    start = os.nice(0)
    target = min(19, start + 2)
    assert call_at_niceness(target, os.nice, 0) == target  # fn ran on a thread at that niceness
    assert call_at_niceness(target, os.nice, 0) == target  # the same thread, not raised twice
    assert os.nice(0) == start
    assert call_at_niceness(0, os.nice, 0) == start  # 0: inline, on the caller's thread
    with pytest.raises(ZeroDivisionError):  # errors reach the caller with their type
        call_at_niceness(target, lambda: 1 // 0)


_DASHBOARD_PROBE = """
import ray
from raypipe.runtime import connect
connect(dashboard={on})
# ray.init on a connected process returns the running Ray's context (dashboard_url is "" without one)
print(ray.init(ignore_reinit_error=True).dashboard_url or "none")
ray.shutdown()
"""


@pytest.mark.ray
@pytest.mark.parametrize("on", [False, True])
def test_local_cluster_dashboard_only_on_request_and_on_loopback(on):
    # Ray Train's placement-group cleaner needs the dashboard's State API; nothing else here does
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", _DASHBOARD_PROBE.format(on=on)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    ).stdout.split()[-1]
    if on:
        assert out.startswith("127.0.0.1:"), out
    else:
        assert out == "none", out


_STATE_API_PROBE = """
import ray
from raypipe.runtime import connect
connect(dashboard=True)

@ray.remote(num_cpus=0)
def ask():  # as Ray Train's placement-group cleaner asks, in a worker, with no address
    from ray.util.state import list_nodes
    return len(list_nodes())

import os
print("nodes", ray.get(ask.remote()), ray.init(ignore_reinit_error=True).dashboard_url,
      os.environ.get("RAY_API_SERVER_ADDRESS"))
ray.shutdown()
"""


@pytest.mark.timeout(180)
def test_a_private_rays_state_api_is_found_beside_another_ray(ray_local):
    """With another Ray on the machine (the test's own), the State API called with no address in a
    worker of the private Ray finds that Ray's, where Ray's search of the machine finds two and fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    proc = subprocess.run(
        [sys.executable, "-c", _STATE_API_PROBE], capture_output=True, text=True, env=env, timeout=150
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, nodes, url, named = proc.stdout.split()[-4:]
    assert nodes == "1" and url.startswith("127.0.0.1:"), proc.stdout
    assert named == "None", proc.stdout  # named for the raylet's start only: nothing started later inherits it


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_call_at_niceness_with_sched_idle_runs_on_an_idle_policy_thread(monkeypatch):
    import raypipe.stages.augment as augment

    monkeypatch.setattr(augment, "_NICE_THREADS", {})  # this test's threads only
    assert call_at_niceness(0, os.sched_getscheduler, 0, sched_idle=True) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller keeps its policy
    assert call_at_niceness(0, os.sched_getscheduler, 0) == os.sched_getscheduler(0)  # neither: inline


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_refused_priority_change_warns_and_the_stage_still_runs(monkeypatch):
    import raypipe.stages.augment as augment

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(augment, "_NICE_THREADS", {})
    monkeypatch.setattr(os, "sched_setscheduler", refuse)  # as a seccomp profile might
    with pytest.warns(RuntimeWarning, match="could not take niceness 0 and SCHED_IDLE"):
        assert call_at_niceness(0, lambda x: x * 2, 21, sched_idle=True) == 42
    assert call_at_niceness(0, lambda x: x + 1, 1, sched_idle=True) == 2  # the pool stays usable


_FIRST_EPOCH_BEFORE_RAY = """
import threading, sys
import numpy as np, ray, torch
from raypipe import runtime
from raypipe.config import ExecutionConfig
from raypipe.timm import create_loader

gate, connect_now = threading.Event(), runtime._connect_now
runtime._connect_now = lambda **kw: (gate.wait(), connect_now(**kw))  # the cluster starts when the test says
data = sys.argv[1]
ray_tasks = ExecutionConfig(backend="ray")  # the drop-in starts a local Ray in the background for them
loader = create_loader(data, (3, 32, 32), 6, is_training=True, device=torch.device("cpu"), color_jitter=None,
                       execution=ray_tasks)
assert runtime.starting() and not ray.is_initialized()
first = [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]  # epoch 0, all of it before Ray is up
assert runtime.starting() and not ray.is_initialized()
made_here = loader.source._stream.local_chunks
gate.set()
runtime.wait_connected(120)
second = [y.numpy().copy() for _, y in loader]  # epoch 1: made here until the workers are set up, then by tasks
assert loader.source._stream._setting_up is not None  # the workers' set-up was sent once Ray was up
loader.close()
again = create_loader(data, (3, 32, 32), 6, is_training=True, device=torch.device("cpu"), color_jitter=None,
                      execution=ray_tasks)
same = [(x.numpy(), y.numpy()) for x, y in again]  # epoch 0 again, now made by Ray's tasks
again.close()
assert len(first) == len(same) == len(second) == 3
assert all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(first, same))
print("made here", made_here)
ray.shutdown()
"""


@pytest.mark.ray
def test_a_loader_has_its_first_epoch_before_ray_is_up_and_the_same_batches(tmp_path):
    from raypipe.sample_data import write_sample_data

    write_sample_data(tmp_path, classes=2, per_class=9, seed=2)  # 18 images: 3 full batches of 6
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_EPOCH_BEFORE_RAY, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) >= 1


def test_a_failed_background_start_is_raised_where_the_cluster_is_needed(monkeypatch):
    import raypipe.runtime as runtime

    def refuse(**kwargs):
        raise ConnectionError("no such cluster")

    monkeypatch.setattr(runtime, "_START", None)
    monkeypatch.setattr(runtime, "_connect_now", refuse)
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)  # whatever Ray this test session has
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(ConnectionError, match="no such cluster"):
        runtime.connect(wait=False)  # joining a cluster is done at once: its address is checked here
    monkeypatch.delenv("RAY_ADDRESS")
    runtime.connect(wait=False)
    with pytest.raises(ConnectionError, match="no such cluster"):  # its own type, as connect() raises it
        runtime.wait_connected(30)
    with pytest.raises(ConnectionError, match="no such cluster"):
        runtime.starting()  # what a stream asks before each chunk
    tried = []
    monkeypatch.setattr(runtime, "_connect_now", lambda **kwargs: tried.append(kwargs))
    runtime.connect()  # a later call tries again, and the failed start is no longer reported
    assert len(tried) == 1 and runtime.starting() is False


_END_WHILE_RAY_STARTS = """
import sys, time
from raypipe import runtime
runtime.connect(wait=False)
runtime.release_start()  # as a stream does once it has made its first chunk
time.sleep(float(sys.argv[1]))  # the trainer's set-up fails while Ray is still starting
raise SystemExit("bad data path")
"""


@pytest.mark.ray
@pytest.mark.parametrize("after_s", [0.0, 3.0])
def test_a_process_that_ends_while_ray_starts_leaves_no_ray_process_behind(after_s):
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _END_WHILE_RAY_STARTS, str(after_s)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1 and "bad data path" in err
    # Ray's session directory ends with the driver's pid; its processes keep their logs there open
    # (their command lines are renamed, so the files are what shows whose they are).
    tag = f"_{proc.pid}/"

    def of_the_script() -> list[int]:
        found = []
        for other in psutil.process_iter():
            try:
                if any("/session_" in f.path and tag in f.path for f in other.open_files()):
                    found.append(other.pid)
            except (psutil.Error, OSError):
                pass
        return found

    deadline = time.monotonic() + 15  # processes told to stop may take a moment to go
    while (left := of_the_script()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # do not leave them to the rest of the run, then fail
        psutil.Process(pid).kill()
    assert not left


def test_a_background_start_begins_once_a_chunk_is_made_or_the_cluster_is_awaited(monkeypatch):
    import raypipe.runtime as runtime

    started = threading.Event()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_START", None)
    monkeypatch.setattr(runtime, "_connect_now", lambda **kwargs: started.set())
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    runtime.connect(wait=False)
    assert not started.wait(0.5) and runtime.starting()  # held: the first batch has the cores
    runtime.release_start()
    assert started.wait(30)
    runtime.wait_connected(30)
    assert runtime.starting() is False

    started.clear()
    monkeypatch.setattr(runtime, "_START", None)
    runtime.connect(wait=False)
    runtime.wait_connected(30)  # waiting for the cluster lets the start begin too
    assert started.is_set()
