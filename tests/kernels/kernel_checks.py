"""Reusable checkers every kernel transform goes through (torchvision-v2 style)."""

from __future__ import annotations

import pickle

import numpy as np

from raypipe.kernels import sample_rng


def mae(a: np.ndarray, b) -> float:
    return float(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).mean())


def check_transform(t, data: bytes, size: tuple[int, int], *, random_output: bool = True) -> np.ndarray:
    """Contract of ``t(data, rng, out=None)``; returns one output for further checks."""
    h, w = size
    original = bytes(data)
    arg = bytearray(data)  # a mutable copy: the transform must not write into its input
    img = t(bytes(arg), sample_rng(7, 0, 11))
    assert bytes(arg) == original
    assert img.dtype == np.uint8 and img.shape == (h, w, 3) and img.flags.c_contiguous
    # determinism: same (seed, epoch, sample_id) -> byte-identical
    again = t(original, sample_rng(7, 0, 11))
    assert np.array_equal(img, again)
    if random_output:
        others = [t(original, sample_rng(7, e, s)) for e, s in ((1, 11), (0, 12), (0, 13))]
        assert any(not np.array_equal(img, o) for o in others), "other epoch/sample_id, same output"
    # out= writes into a view of a batch buffer and returns it
    batch = np.zeros((3, h, w, 3), np.uint8)
    res = t(original, sample_rng(7, 0, 11), out=batch[1])
    assert res is batch[1] or np.shares_memory(res, batch[1])
    assert np.array_equal(batch[1], img) and not batch[0].any() and not batch[2].any()
    # picklable, and the copy computes the same
    t2 = pickle.loads(pickle.dumps(t))
    assert np.array_equal(t2(original, sample_rng(7, 0, 11)), img)
    return img
