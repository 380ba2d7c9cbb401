"""Every wait on something outside this process that raypipe bounds, in one place, with why.

A missing credential, a wrong endpoint or a cluster that is not there must end in seconds with a
one-line error that says what to fix, not in minutes of retries. The values are generous for a working
setup (each is many times what a healthy answer takes) and short for a broken one.
``RAYPIPE_<NAME>`` in the environment overrides each (seconds), e.g. ``RAYPIPE_LISTING_S=1800``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn, TypeVar

__all__ = [
    "RAY_CONNECT_S",
    "STORE_CONNECT_S",
    "STORE_REQUEST_S",
    "STORE_ATTEMPTS",
    "GCS_RETRY_S",
    "FIRST_ANSWER_S",
    "LISTING_S",
    "call_with_deadline",
    "exit_process",
    "threads_left_behind",
]

T = TypeVar("T")
_LEFT_BEHIND: list[threading.Thread] = []  # threads of calls that timed out (see call_with_deadline)


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(f"RAYPIPE_{name}")
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"RAYPIPE_{name}={value!r}: expected a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"RAYPIPE_{name}={value!r}: expected a number of seconds > 0")
    return seconds


# TCP connect to RAY_ADDRESS before ray.init, and its first gRPC answer: a live Ray head accepts and
# answers in milliseconds, even across regions; without the probe an address with nothing behind it,
# or with something else behind it (a dashboard's port), costs ray.init 20 s or more of gRPC retries.
RAY_CONNECT_S = _seconds("RAY_CONNECT_S", 5.0)
# S3: opening a connection; an endpoint that does not accept in this long is not there.
STORE_CONNECT_S = _seconds("STORE_CONNECT_S", 5.0)
# S3: the longest silence within one request (a read that stalls, an endpoint that accepts and never
# answers); a healthy store starts answering in well under a second.
STORE_REQUEST_S = _seconds("STORE_REQUEST_S", 10.0)
# S3: attempts per request (the SDK's default is 3 with backoff), so a request fails within about
# STORE_ATTEMPTS x STORE_REQUEST_S.
STORE_ATTEMPTS = int(_seconds("STORE_ATTEMPTS", 3))
# GCS: how long the client keeps retrying one operation (pyarrow's default is 15 minutes): a missing
# credential is retried like a transient error until then.
GCS_RETRY_S = _seconds("GCS_RETRY_S", 10.0)
# A remote dataset's root must answer its first request within this: a missing credential, a wrong
# endpoint or a bucket without access ends here, with a message naming them.
FIRST_ANSWER_S = _seconds("FIRST_ANSWER_S", 20.0)
# The whole listing of a remote dataset: a store lists ~1000 keys per request, so a million objects
# take a few minutes; past this the listing is treated as hung.
LISTING_S = _seconds("LISTING_S", 900.0)


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
