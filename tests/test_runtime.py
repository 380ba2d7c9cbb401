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
