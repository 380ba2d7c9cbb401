"""Ray's own messages, hidden unless asked for. Imports nothing heavy (the CLI's ``--help`` uses it)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

__all__ = ["quiet_ray_startup", "hide_worker_lines", "WORKER_LINES_HIDDEN"]

# Lines that Ray's worker processes print and a driver forwards (``log_to_driver``), hidden from a
# training job's output unless -v: they are Ray's bookkeeping, not the user's, and they outnumber
# the job's own lines two to one. Each names its source.
WORKER_LINES_HIDDEN = (
    # Ray Train's INFO lines, on the controller and on each worker. Where Ray Train has
    # ``ray.train.LoggingConfig`` (2.60; not 2.52), ``raypipe.train.run`` sets its level to WARNING and
    # these never reach the driver, but for the report line: Ray 2.60 logs it through a logger named
    # after its source file's path, not under "ray.train", so no Ray Train setting reaches it.
    r"Requesting resources: \{",
    r"Attempting to start training worker group of size \d+",
    r"Started training worker group of size \d+",
    r"^- \(ip=\S+, pid=\d+\) world_rank=\d+",
    r"Setting up process group for: \S+ \[rank=\d+",
    r"Reporting training result \d+: TrainingReport\(",
    r"Checkpoint successfully created at: Checkpoint\(",
    # A C++ log line at ERROR level from the Train controller's core worker: Ray Train starts its own
    # PreemptionWatcher actor with actor handles as constructor arguments and max_restarts=-1, and Ray
    # core warns about that pattern (ray-project/ray#53727). Nothing a user can act on; only this exact
    # line is hidden, so every other error a worker writes still shows.
    r"core_worker\.cc:\d+: Actor with class name: 'PreemptionWatcher' and ID: '\w+' has constructor "
    r"arguments in the object store",
)
_SKIP_REGEX = "RAY_DEDUP_LOGS_SKIP_REGEX"


def hide_worker_lines(verbose: bool = False) -> bool:
    """Keep ``WORKER_LINES_HIDDEN`` out of this driver's output, unless ``verbose``; True when set.

    Uses Ray's documented ``RAY_DEDUP_LOGS_SKIP_REGEX`` (lines matching it are not printed by the
    driver; they stay in the workers' log files under the session's ``logs/``), joined to any pattern
    already set. Ray reads it once, at ``import ray``: called after that, this changes nothing and
    returns False. ``RAY_DEDUP_LOGS=0`` turns Ray's filter off, and every line shows.
    """
    if verbose or "ray" in sys.modules:
        return False
    ours = "|".join(f"(?:{pattern})" for pattern in WORKER_LINES_HIDDEN)
    theirs = os.environ.get(_SKIP_REGEX)
    os.environ[_SKIP_REGEX] = f"(?:{theirs})|{ours}" if theirs else ours
    return True


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


@contextlib.contextmanager
def quiet_ray_startup(verbose: bool = False):
    """Hide what Ray logs below ERROR while it starts, unless ``verbose``.

    Starting a local Ray logs warnings meant for whoever administers it (that token authentication
    is on, Ray's default for a local cluster, and how to opt out); in a raypipe command's output they
    read as if something were wrong. The filter sits on the handlers of Ray's public ``ray`` logger
    (set up by ``import ray``) only while this block runs, so Ray's warnings after start-up still show.
    """
    if verbose:
        yield
        return
    import ray  # noqa: F401 - sets up the "ray" logger's handlers

    handlers = list(logging.getLogger("ray").handlers)
    quiet = _BelowError()
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)
