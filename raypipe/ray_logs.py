"""Ray's start-up messages, hidden unless asked for. Imports nothing heavy (the CLI's ``--help`` uses it)."""

from __future__ import annotations

import contextlib
import logging

__all__ = ["quiet_ray_startup"]


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
