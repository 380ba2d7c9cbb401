"""RayTasks: a rank's chunks as Ray tasks on any node of the cluster that offers their resources."""

from __future__ import annotations

import numpy as np
import ray

from raypipe import runtime
from raypipe.stages.augment import StageSpec, augment_block

__all__ = ["RayTasks"]


@ray.remote(max_retries=3)  # a worker that died (OOM, node lost) is retried; same output: per-sample seeds
def _augment_chunk(rows: dict[str, np.ndarray], spec: StageSpec) -> dict[str, np.ndarray]:
    return augment_block(rows, spec)


@ray.remote(max_retries=3)
def _set_up_stage(spec: StageSpec) -> None:
    spec.prepare()  # cached in the worker process: its first chunk finds it made


class RayTasks:
    """The stream's chunks as Ray tasks (``task_options``: their resources); a ``Workers``."""

    queues_while_starting = False  # no task can be sent before Ray is up

    def __init__(self, task_options: dict):
        self._options = dict(task_options)
        self.size_tasks(self._options.get("num_cpus", 1.0))

    def size_tasks(self, cpus: float) -> None:
        """Each task from now on asks for ``cpus`` (the rank's ``RankBudget.task_cpus``)."""
        options = {**self._options, "num_cpus": cpus}
        self._task = _augment_chunk.options(**options)  # a wrapper: needs no cluster yet
        self._set_up_task = _set_up_stage.options(**options)

    @staticmethod
    def starting() -> bool:
        return runtime.starting()

    @staticmethod
    def release_start() -> None:
        runtime.release_start()

    def set_up(self, spec: StageSpec, count: int) -> list:
        return [self._set_up_task.remote(spec) for _ in range(count)]

    def submit(self, rows: dict[str, np.ndarray], spec: StageSpec):
        return self._task.remote(rows, spec)

    @staticmethod
    def all_done(refs: list) -> bool:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(ready) == len(refs)

    @staticmethod
    def wait(ref, timeout: float) -> bool:
        ready, _ = ray.wait([ref], timeout=timeout)
        return bool(ready)

    @staticmethod
    def get(ref):
        return ray.get(ref)

    @staticmethod
    def cancel(ref) -> None:
        # Not ray.cancel: a cancel that races with the task's reply fails a check in Ray's core worker
        # and ends the whole process ("Tried to complete task that was not pending", seen on Ray 2.60;
        # ray-project/ray#54846). A chunk is seconds of work: dropping its reference lets it finish and
        # its result go, within the window of chunks in flight.
        del ref

    @staticmethod
    def shared_ref(ref):
        return ref  # a Ray object: a feeder's trainer on the node reads it zero-copy
