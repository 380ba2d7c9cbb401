"""raypipe.runtime and the worker-side priority helper: small pure pieces, tested without Ray."""

import multiprocessing as mp
import os

import pytest

from raypipe.runtime import worker_pool_config
from raypipe.stages.augment import lower_priority


def test_worker_pool_keeps_two_workers_per_cpu_idle(monkeypatch):
    monkeypatch.delenv("RAY_num_workers_soft_limit", raising=False)
    assert worker_pool_config(16) == {"num_workers_soft_limit": 36}
    monkeypatch.setenv("RAY_num_workers_soft_limit", "100")  # the operator's own setting wins
    assert worker_pool_config(16) == {}


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


def test_ray_data_console_is_quiet_and_its_log_file_is_not():
    import logging

    from raypipe.runtime import quiet_ray_data_console

    quiet_ray_data_console()
    handlers = logging.getLogger("ray.data").handlers
    console = [h for h in handlers if "File" not in type(h).__name__]
    files = [h for h in handlers if "File" in type(h).__name__]
    assert console and all(h.level >= logging.WARNING for h in console)
    assert files and all(h.level < logging.WARNING for h in files)  # ray-data.log keeps the INFO lines
