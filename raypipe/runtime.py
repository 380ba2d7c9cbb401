"""Connecting to Ray: a running cluster when there is one, else a small local one."""

from __future__ import annotations

import logging
import os

import ray

__all__ = ["connect"]


def connect(*, num_cpus: int | None = None, object_store_memory: int | None = None, quiet: bool = True) -> None:
    """``ray.init`` once: joins ``RAY_ADDRESS`` (set by ``ray job submit``; ``RAY_ADDRESS=auto`` joins a
    cluster started with ``ray start`` on this machine), else starts a private local Ray with no
    dashboard. Never joins some other local cluster by accident (Ray's bare ``ray.init()`` would).
    Token auth is Ray's default in 2.60 and is left on."""
    if quiet:
        # Ray Data logs every execution plan at INFO; raypipe prints its own per-epoch summary.
        logging.getLogger("ray.data").setLevel(logging.WARNING)
    if ray.is_initialized():
        return
    kwargs: dict = {"logging_level": logging.WARNING if quiet else logging.INFO, "log_to_driver": True}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**kwargs)
        return
    ray.init(
        address="local",
        num_cpus=num_cpus,
        object_store_memory=object_store_memory,
        include_dashboard=False,
        **kwargs,
    )
