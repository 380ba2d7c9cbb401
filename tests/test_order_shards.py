"""The sharded epoch order against a reference: the sort of every row by (window, random key, listing
index) that defines it, kept here as it was first written, over many shard layouts."""

import numpy as np
import pytest

from raypipe.pipeline import order as order_module
from raypipe.pipeline.order import epoch_order


def reference_order(n, *, seed, epoch, shuffle, shards=None, window_rows=1):
    rng = lambda stream: np.random.default_rng([seed, epoch, stream])  # noqa: E731
    if shards is None or n == 0 or not (shards >= 0).any():
        order = rng(0x5EED).permutation(n) if shuffle else np.arange(n)
        return order, np.zeros(1, dtype=np.int64)
    keys = np.where(shards >= 0, shards, -1 - np.arange(n))
    uniq, inverse = np.unique(keys, return_inverse=True)
    shard_order = rng(0x5A4D).permutation(len(uniq)) if shuffle else np.arange(len(uniq))
    sizes = np.bincount(inverse, minlength=len(uniq))[shard_order]
    first_row = np.cumsum(sizes) - sizes
    window_of_shard = np.empty(len(uniq), dtype=np.int64)
    window_of_shard[shard_order] = first_row // max(1, window_rows)
    win = window_of_shard[inverse]
    inner = rng(0x1A3E).random(n) if shuffle else np.arange(n, dtype=np.float64)
    order = np.lexsort((inner, win))
    sorted_win = win[order]
    starts = np.flatnonzero(np.r_[True, sorted_win[1:] != sorted_win[:-1]])
    return order, starts


def layouts(rng):
    """(name, shards) pairs: contiguous runs of random sizes (gaps in the numbers too), one shard, a shard
    per row, huge and tiny shards together, shuffled or interleaved shards, rows without a shard."""
    for n in (0, 1, 2, 7, 100, 1000, 5000):
        if n == 0:
            yield "empty", np.empty(0, np.int64)
            continue
        sizes = rng.integers(1, max(2, n // 5), size=n)
        runs = np.repeat(np.arange(n), sizes)[:n]
        yield "contiguous", runs
        yield "numbers with gaps", runs * 3 + 5
        yield "one shard", np.zeros(n, np.int64)
        yield "a shard per row", np.arange(n, dtype=np.int64)
        yield "huge and tiny", np.repeat(np.arange(3), [1, max(0, n - 2), 1])[:n]
        yield "shuffled", rng.permutation(runs)
        yield "interleaved", np.arange(n, dtype=np.int64) % 3
        yield "decreasing", runs[::-1].copy()
        with_missing = runs.copy()
        with_missing[rng.random(n) < 0.2] = -1
        yield "some without a shard", with_missing
        yield "first without a shard", np.r_[-1, runs[1:]]
        yield "none with a shard", np.full(n, -1, np.int64)


def test_sharded_order_matches_the_reference_over_many_layouts():
    rng = np.random.default_rng(7)
    checked = 0
    for name, shards in layouts(rng):
        n = len(shards)
        for shuffle in (True, False):
            for seed, epoch in ((0, 0), (3, 1), (11, 7)):
                for window_rows in (1, 2, 64, 2048):
                    got = epoch_order(n, seed=seed, epoch=epoch, shuffle=shuffle, shards=shards,
                                      window_rows=window_rows)  # fmt: skip
                    want = reference_order(n, seed=seed, epoch=epoch, shuffle=shuffle, shards=shards,
                                           window_rows=window_rows)  # fmt: skip
                    where = f"{name}, n={n}, shuffle={shuffle}, seed={seed}, epoch={epoch}, window={window_rows}"
                    assert np.array_equal(got[0], want[0]), where
                    assert np.array_equal(got[1], want[1]), where
                    checked += 1
    assert checked > 1000


@pytest.mark.parametrize("window_rows", [1, 100, 2048, 10**6])
def test_windows_sorted_in_several_batches_match_the_reference(monkeypatch, window_rows):
    monkeypatch.setattr(order_module, "_SORT_ROWS", 256)  # many batches of windows, some windows alone
    rng = np.random.default_rng(window_rows)
    shards = np.repeat(np.arange(400), rng.integers(1, 60, size=400))
    n = len(shards)
    for epoch in range(3):
        got = epoch_order(n, seed=5, epoch=epoch, shuffle=True, shards=shards, window_rows=window_rows)
        want = reference_order(n, seed=5, epoch=epoch, shuffle=True, shards=shards, window_rows=window_rows)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_ties_between_random_keys_break_by_listing_index(monkeypatch):
    # few distinct keys: ties everywhere, each broken as the reference's stable sort breaks it
    class FewKeys:
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def random(self, n):
            return self.rng.integers(0, 3, size=n) / 4

        def permutation(self, n):
            return self.rng.permutation(n)

    monkeypatch.setattr(order_module, "_rng", lambda seed, epoch, stream: FewKeys([seed, epoch, stream]))
    shards = np.repeat(np.arange(50), 20)
    got = epoch_order(1000, seed=1, epoch=0, shuffle=True, shards=shards, window_rows=100)
    inner = FewKeys([1, 0, 0x1A3E]).random(1000)
    shard_order = FewKeys([1, 0, 0x5A4D]).permutation(50)
    first = np.empty(50, np.int64)
    first[shard_order] = np.arange(50) * 20
    win = (first // 100)[shards]
    assert np.array_equal(got[0], np.lexsort((np.arange(1000), inner, win)))
