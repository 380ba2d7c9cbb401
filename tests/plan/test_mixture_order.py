"""A mixture's epoch order (``raypipe.plan.mixture``): exact takes, cycles across epochs, repeats told
apart, shares in every run of positions, and chunks computed alone equal to the whole epoch's order."""

from __future__ import annotations

import numpy as np
import pytest

from raypipe.plan.mixture import MixtureOrder, part_takes
from raypipe.plan.order import ShardRuns


@pytest.mark.parametrize(
    ("weights", "n", "want"),
    [
        ([1, 1], 10, [5, 5]),
        ([0.7, 0.3], 10, [7, 3]),
        ([1, 1, 1], 10, [4, 3, 3]),  # one left over: the remainders tie, the lower part takes it
        ([2, 1], 10, [7, 3]),  # 6.67 and 3.33: the larger remainder takes the row left over
        ([1, 0, 3], 9, [2, 0, 7]),
        ([5], 3, [3]),
    ],
)
def test_the_takes_round_by_largest_remainder_and_add_up(weights, n, want):
    takes = part_takes(weights, n)
    assert takes.tolist() == want and takes.sum() == n


@pytest.mark.parametrize(
    ("weights", "n"),
    [([], 10), ([-1, 2], 10), ([0, 0], 10), ([np.nan, 1], 10), ([np.inf, 1], 10), ([1, 1], 0), ([1], True)],
)
def test_bad_weights_and_sizes_are_value_errors(weights, n):
    with pytest.raises(ValueError):
        part_takes(weights, n)


SIZES = [37, 11, 120]


def _epochs(order_of, epochs):
    return [order_of(e).takes_at(0, order_of(e).n) for e in range(epochs)]


def _order(e, takes=(30, 25, 45), sizes=SIZES, **kw):
    return MixtureOrder(sizes, takes, seed=7, epoch=e, **kw)


def test_each_epoch_takes_exactly_its_rows_of_each_part():
    for e in range(3):
        part, row, _ = _order(e).takes_at(0, 100)
        assert np.bincount(part, minlength=3).tolist() == [30, 25, 45]
        for i, size in enumerate(SIZES):
            assert np.all((row[part == i] >= 0) & (row[part == i] < size))


def test_no_row_of_a_part_repeats_before_the_whole_part_was_taken_counting_across_epochs():
    epochs = _epochs(_order, 6)
    for i, size in enumerate(SIZES):
        stream = np.concatenate([row[part == i] for part, row, _ in epochs])
        cycles = np.concatenate([cycle[part == i] for part, _, cycle in epochs])
        for c in range(len(stream) // size):  # each whole cycle is a permutation of the part's rows
            assert sorted(stream[c * size : (c + 1) * size].tolist()) == list(range(size))
            assert np.all(cycles[c * size : (c + 1) * size] == c)


def test_an_up_weighted_part_repeats_in_one_epoch_with_another_cycle():
    part, row, cycle = _order(0, takes=(30, 25, 45)).takes_at(0, 100)
    small = part == 1  # 25 takes of an 11-row part: cycles 0, 1 and 2
    pairs = set(zip(row[small].tolist(), cycle[small].tolist(), strict=True))
    assert len(pairs) == 25 and sorted(set(cycle[small].tolist())) == [0, 1, 2]


@pytest.mark.parametrize("run", [8, 32, 100])
def test_every_run_of_positions_holds_each_part_within_two_rows_of_its_share(run):
    order = _order(0, takes=(300, 250, 450), sizes=[370, 110, 1200])
    part, _, _ = order.takes_at(0, order.n)
    for lo in range(0, order.n - run + 1, max(1, run // 2)):
        counts = np.bincount(part[lo : lo + run], minlength=3)
        assert np.all(np.abs(counts - run * order.takes / order.n) < 2), (lo, counts)


def test_chunks_computed_alone_are_the_epochs_order():
    order = _order(2, runs=[ShardRuns.from_shards(np.repeat(np.arange(4), [10, 9, 9, 9])), None, None], window_rows=16)
    whole = order.takes_at(0, order.n)
    bounds = [0, 1, 7, 33, 34, 64, 99, 100]
    fresh = _order(2, runs=[ShardRuns.from_shards(np.repeat(np.arange(4), [10, 9, 9, 9])), None, None], window_rows=16)
    pieces = [fresh.takes_at(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([p[k] for p in pieces]), whole[k])


def test_the_order_is_a_function_of_seed_epoch_sizes_and_takes_only():
    a, b = _order(1).takes_at(0, 100), _order(1).takes_at(0, 100)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    other_seed = MixtureOrder(SIZES, (30, 25, 45), seed=8, epoch=1).takes_at(0, 100)
    assert not np.array_equal(a[1], other_seed[1])


def test_a_parts_cycles_do_not_depend_on_the_other_parts():
    alone = MixtureOrder([37], [37], seed=7, epoch=0).takes_at(0, 37)[1]
    mixed_part, mixed_row, mixed_cycle = MixtureOrder([37, 11], [37, 11], seed=7, epoch=0).takes_at(0, 48)
    np.testing.assert_array_equal(mixed_row[mixed_part == 0], alone)


def test_a_part_with_no_takes_is_never_read_and_a_taken_empty_part_is_refused():
    part, _, _ = MixtureOrder([5, 0], [4, 0], seed=0, epoch=0).takes_at(0, 4)
    assert part.tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="rows in each part taken"):
        MixtureOrder([5, 0], [3, 1], seed=0, epoch=0)


def test_takes_whose_keys_tie_are_split_between_chunks_lower_part_first():
    order = MixtureOrder([4, 4], [4, 4], seed=0, epoch=0)
    order.offsets = np.array([0.5, 0.5])  # every take of part 0 ties with one of part 1
    whole = order.takes_at(0, 8)
    assert whole[0].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    pieces = [order.takes_at(p, p + 1) for p in range(8)]
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([p[k] for p in pieces]), whole[k])


def test_a_billion_takes_split_anywhere_even_where_two_parts_keys_are_closer_than_a_float_tells():
    """Two parts of half a billion takes: some keys of one part lie within 1e-16 of the other's, closer
    than a key in [0, 1) can be told apart by bisection; every position still splits the epoch, as the
    whole run of positions orders it."""
    t0, t1 = 500_000_001, 500_000_000
    runs = [ShardRuns.from_sizes([10_000] * 50_000 + [1]), ShardRuns.from_sizes([10_000] * 50_000)]
    order = MixtureOrder([t0, t1], [t0, t1], seed=0, epoch=0, runs=runs)
    u0, u1 = order.offsets
    # key0(k) - key1(m) = (k * t1 - m * t0 + c) / (t0 * t1): the closest pairs have k * t1 - m * t0 near -c
    c = u0 * t1 - u1 * t0
    k = (round(-c) * pow(t1, -1, t0)) % t0
    m = (k * t1 - round(-c)) // t0
    assert abs((k + u0) / t0 - (m + u1) / t1) < 1e-16
    lo, hi = k + m - 100, k + m + 100
    whole = order.takes_at(lo, hi)
    before = order.counts_before(lo)
    for p in range(lo, hi + 1):
        counts = order.counts_before(p)
        assert counts.sum() == p and np.all(counts >= before)
        before = counts
    pieces = [order.takes_at(p, p + 1) for p in range(lo, hi)]
    for j in range(3):
        np.testing.assert_array_equal(np.concatenate([piece[j] for piece in pieces]), whole[j])
