"""Simulated bugs for tests, installed in Ray workers through ``runtime_env={"worker_process_setup_hook":
"fault_hooks.break_transforms"}`` (the tests folder must be on the workers' PYTHONPATH)."""

from __future__ import annotations

BUG = "simulated bug in raypipe's transform"


def _raise(self, data, rng=None, out=None):
    raise TypeError(BUG)


def break_transforms() -> None:
    """Every call of the train and eval transforms raises TypeError, as a bug of ours would."""
    from raypipe.kernels import transform

    transform.TrainTransform.__call__ = _raise
    transform.EvalTransform.__call__ = _raise
