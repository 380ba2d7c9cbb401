"""Bound how far an epoch's Ray Data execution runs ahead of its consumer.

An epoch's execution keeps submitting augmentation tasks while its finished blocks wait for the
consumer. The next epoch's execution starts (warmed up) before the current one ends, and nothing reads
it until then: unbounded, it filled the object store (20,000-image epochs: 3 GB of blocks by the
current epoch's end, ``bench/epoch_startup.py --timeline``; more with longer epochs).

Ray Data 2.60 enforces ``ExecutionOptions.resource_limits.object_store_memory`` only through its
operator resource allocator, which also held raypipe's own epochs back (fewer img/s on 2 cores in a
scratch comparison with rand-m9). So the allocator stays off and this backpressure policy holds back
new tasks of a map operator while its live blocks (running tasks' outputs, finished blocks not yet
taken, and blocks the consumer still holds) plus one more task's output would exceed that limit.
"""

from __future__ import annotations

import logging

__all__ = ["bound_run_ahead"]

log = logging.getLogger(__name__)

try:  # Ray Data internals (pinned Ray): without them the allocator enforces the limit instead
    from ray.data._internal.execution.backpressure_policy import (
        ENABLED_BACKPRESSURE_POLICIES,
        ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY,
        BackpressurePolicy,
    )
    from ray.data._internal.execution.operators.map_operator import MapOperator
except ImportError as e:  # pragma: no cover - another Ray version
    BackpressurePolicy = None  # type: ignore[assignment,misc]
    _IMPORT_ERROR: ImportError | None = e
else:
    _IMPORT_ERROR = None

    class RunAheadCap(BackpressurePolicy):
        """No new task for a map operator whose live blocks would pass the execution's object-store
        limit (``resource_limits.object_store_memory``)."""

        @property
        def name(self) -> str:
            return "RaypipeRunAheadCap"

        def can_add_input(self, op) -> bool:
            if not isinstance(op, MapOperator):
                return True
            cap = self._data_context.execution_options.resource_limits.object_store_memory
            used = self._resource_manager.get_op_usage(op).object_store_memory
            next_task = op.metrics.obj_store_mem_max_pending_output_per_task or 0
            return used + next_task <= cap


def bound_run_ahead(ctx) -> None:
    """Make executions with DataContext ``ctx`` stop submitting tasks at its object-store limit."""
    if _IMPORT_ERROR is not None:  # pragma: no cover - another Ray version
        log.warning("Ray Data internals moved (%s): bounding run-ahead with its allocator", _IMPORT_ERROR)
        ctx.op_resource_reservation_enabled = True
        return
    # The allocator reserves half the CPUs per operator and throttled the single map operator.
    ctx.op_resource_reservation_enabled = False
    policies = list(ctx.get_config(ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY, ENABLED_BACKPRESSURE_POLICIES))
    if RunAheadCap not in policies:
        ctx.set_config(ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY, [*policies, RunAheadCap])
