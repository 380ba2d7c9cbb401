"""The sharded epoch order against a reference written row by row from its definition, over many shard
layouts; and the same order from per-shard counts (an index) as from a per-row shard column."""

import numpy as np
import pytest

from raypipe.plan.order import EpochOrder, RankPlan, ShardRuns, epoch_order


def reference_order(n, *, seed, epoch, shuffle, shards=None, window_rows=1):
    """Row by row: shards permuted, grouped into windows by where each starts, a window's rows (its shards
    by number, each in listing order) permuted by the window's own generator."""
    rng = lambda *stream: np.random.default_rng([seed, epoch, *stream])  # noqa: E731
    if shards is None or n == 0 or not (shards >= 0).any():
        order = rng(0x5EED).permutation(n) if shuffle else np.arange(n)
        return order, np.zeros(1, dtype=np.int64)
    keys = np.where(shards >= 0, shards, -1 - np.arange(n))
    uniq, inverse = np.unique(keys, return_inverse=True)
    shard_order = rng(0x5A4D).permutation(len(uniq)) if shuffle else np.arange(len(uniq))
    window_of_shard, at = {}, 0
    for s in shard_order:
        window_of_shard[int(s)] = at // max(1, window_rows)
        at += int((inverse == s).sum())
    order, starts = [], []
    for w, number in enumerate(sorted(set(window_of_shard.values()))):
        rows = [
            r
            for s in sorted(u for u, v in window_of_shard.items() if v == number)
            for r in np.flatnonzero(inverse == s)
        ]
        rows = np.array(rows, dtype=np.int64)
        starts.append(len(order))
        order.extend(rows[rng(0x1A3E, w).permutation(len(rows))] if shuffle else rows)
    return np.array(order, dtype=np.int64), np.array(starts, dtype=np.int64)


def layouts(rng):
    """(name, shards) pairs: contiguous runs of random sizes (gaps in the numbers too), one shard, a shard
    per row, huge and tiny shards together, shuffled or interleaved shards, rows without a shard."""
    for n in (0, 1, 2, 7, 100, 700):
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
                    got = epoch_order(
                        n, seed=seed, epoch=epoch, shuffle=shuffle, shards=shards, window_rows=window_rows
                    )
                    want = reference_order(
                        n, seed=seed, epoch=epoch, shuffle=shuffle, shards=shards, window_rows=window_rows
                    )
                    where = f"{name}, n={n}, shuffle={shuffle}, seed={seed}, epoch={epoch}, window={window_rows}"
                    assert np.array_equal(got[0], want[0]), where
                    assert np.array_equal(got[1], want[1]), where
                    checked += 1
    assert checked > 1000


@pytest.mark.parametrize("window_rows", [1, 100, 2048])
def test_counts_from_an_index_give_the_order_of_the_rows_they_count(window_rows):
    rng = np.random.default_rng(window_rows)
    counts = rng.integers(0, 60, size=400)  # empty shards too: an index may list one
    shards = np.repeat(np.arange(400), counts)
    n = len(shards)
    for epoch in range(3):
        from_rows = EpochOrder(
            n, seed=5, epoch=epoch, shuffle=True, runs=ShardRuns.from_shards(shards), window_rows=window_rows
        )
        from_counts = EpochOrder(
            n, seed=5, epoch=epoch, shuffle=True, runs=ShardRuns.from_sizes(counts), window_rows=window_rows
        )
        assert np.array_equal(from_rows.all(), from_counts.all())
        assert np.array_equal(from_rows.starts, from_counts.starts)


def test_any_positions_are_taken_without_the_others():
    counts = np.full(50, 37)
    order = EpochOrder(1850, seed=2, epoch=1, shuffle=True, runs=ShardRuns.from_sizes(counts), window_rows=100)
    whole = order.all()
    rng = np.random.default_rng(0)
    for _ in range(200):
        lo, hi = sorted(rng.integers(0, 1851, size=2))
        assert np.array_equal(order.take(int(lo), int(hi)), whole[lo:hi])
    with pytest.raises(ValueError, match="outside"):
        order.take(0, 1851)


def test_a_billion_rows_in_shards_plan_with_arrays_of_shards():
    runs = ShardRuns.from_sizes(np.full(100_000, 10_000))
    plan = RankPlan(10**9, seed=0, shuffle=True, chunk_rows=256, runs=runs, window_rows=2048, rank=1, world_size=3)
    chunks = plan.chunks(4)
    assert chunks.bounds[0, 0] == 333_333_334 and chunks.bounds[-1, 1] == 666_666_667  # rank 0 takes the extra row
    first, last = chunks[0], chunks[len(chunks) - 1]
    assert len(np.unique(first // 10_000)) == 1  # one 10,000-sample shard is a window of its own
    assert 0 <= first.min() and last.max() < 10**9
    assert plan.order(4)._units.nbytes <= 8 * 100_000
