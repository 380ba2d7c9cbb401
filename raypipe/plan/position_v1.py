"""The positions raypipe 0.1.0 saved, rewritten as this release's value (``raypipe.plan.position``).

Pure: one rank's saved dict in, a version-2 dict out. Three shapes were saved: a bare version-1
position (``EpochSource``, ``FeederSource``); a ``DeviceLoader``'s envelope ``{"format":
"raypipe-device-loader", "epoch", "batches", "source": …}`` around one (or around nothing: a source
without a position); and ``RankLoader``'s, whose ``source`` is ``EqualBatches``' own envelope
``{"batches", "source": <version 1>}``. Each envelope counted the batches its trainer took, and an inner
count is never above an outer one (a repeated batch is past the source's last), so the trainer's count
is the largest of them.
"""

from __future__ import annotations

__all__ = ["DEVICE_LOADER_FORMAT", "is_earlier_shape", "rewrite"]

DEVICE_LOADER_FORMAT = "raypipe-device-loader"
_FORMAT = "raypipe-position"


def is_earlier_shape(state) -> bool:
    """Whether ``state`` is one of the shapes 0.1.0 saved (not this release's value)."""
    if not isinstance(state, dict):
        return False
    if state.get("format") == _FORMAT:
        return state.get("version") == 1
    return state.get("format") == DEVICE_LOADER_FORMAT or _is_equal_batches(state)


def rewrite(state: dict) -> dict:
    """The version-2 dict of one rank's 0.1.0 ``state`` (``is_earlier_shape``); a bad one raises
    ``ValueError`` naming the part that is wrong."""
    counts, epoch, inner = [], None, state
    if inner.get("format") == DEVICE_LOADER_FORMAT:
        counts.append(_count(inner, "batches", "the DeviceLoader state's"))
        epoch = _count(inner, "epoch", "the DeviceLoader state's")
        inner = inner.get("source")
    if _is_equal_batches(inner):
        counts.append(_count(inner, "batches", "the EqualBatches state's"))
        inner = inner["source"]
    if inner is None:  # a DeviceLoader over a source with no position: its epoch and count only
        if epoch is None:
            raise ValueError("the saved state holds no position")
        return {
            "format": _FORMAT,
            "version": 2,
            "epoch": epoch,
            "batches": max(counts),
            "rank": None,
            "world_size": None,
            "remaining": None,
            "plan": None,
        }
    if not isinstance(inner, dict) or inner.get("format") != _FORMAT or inner.get("version") != 1:
        raise ValueError(f"the saved state's source is not a raypipe position of version 1: {str(inner)[:80]}")
    counts.append(_count(inner, "batches", "the position's"))
    if epoch is not None and _count(inner, "epoch", "the position's") != epoch:
        raise ValueError(
            f"the saved DeviceLoader state is of epoch {epoch} and its source's position of epoch {inner['epoch']}"
        )
    return {**inner, "version": 2, "batches": max(counts)}


def _is_equal_batches(state) -> bool:
    return isinstance(state, dict) and "format" not in state and set(state) == {"batches", "source"}


def _count(state: dict, key: str, whose: str) -> int:
    value = state.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{whose} {key!r} is {value!r}: expected a count >= 0")
    return value
