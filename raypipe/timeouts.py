"""Every wait on something outside this process that raypipe bounds, in one place, with why.

A missing credential, a wrong endpoint or a cluster that is not there must end in seconds with a
one-line error that says what to fix, not in minutes of retries. The bounds are settings
(``raypipe.settings.Settings``: ``ray_connect_s``, ``store_connect_s``, ``store_request_s``,
``store_attempts``, ``gcs_retry_s``, ``first_answer_s``, ``listing_s``, each with why), generous for a
working setup (each many times what a healthy answer takes) and short for a broken one; the
environment overrides each, e.g. ``RAYPIPE_LISTING_S=1800``. Here: how a wait is bounded.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn, TypeVar

__all__ = [
    "call_with_deadline",
    "exit_process",
    "threads_left_behind",
]

T = TypeVar("T")
_LEFT_BEHIND: list[threading.Thread] = []  # threads of calls that timed out (see call_with_deadline)


def call_with_deadline(fn: Callable[[], T], seconds: float, on_timeout: Callable[[], str]) -> T:
    """``fn()``, or ``TimeoutError(on_timeout())`` when it has not returned after ``seconds``.

    ``fn`` runs on a daemon thread, which is left behind on a timeout (a blocked network call cannot be
    interrupted from Python); being a daemon it does not hold the process open at exit.
    """
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread as it is
            box["error"] = e

    thread = threading.Thread(target=run, name="raypipe-deadline", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _LEFT_BEHIND.append(thread)
        raise TimeoutError(on_timeout())
    if "error" in box:
        raise box["error"]
    return box["value"]


def threads_left_behind() -> bool:
    """Whether a call that timed out is still running on its thread: blocked in a network client's
    native code, where the interpreter's shutdown can crash the process (:func:`exit_process`)."""
    return any(t.is_alive() for t in _LEFT_BEHIND)


def exit_process(status: int) -> NoReturn:
    """End a command (the ``raypipe`` console script, ``jobs/train.py``) with ``status``. Where a wait
    timed out and left its thread in a network client's native code, the interpreter's shutdown can
    crash under it (seen: signal 11 after a GCS listing's one-line error) or wait for that client's
    request to end (an S3 endpoint that never answers): the process then shuts down the Ray it is
    connected to (what that shutdown would have done: a local Ray's agents outlive a process that ends
    without it), flushes its output and ends at once, with the same status."""
    if threads_left_behind():
        ray = sys.modules.get("ray")  # imported only if the command used it
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
