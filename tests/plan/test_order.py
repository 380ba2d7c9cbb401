"""The epoch order, a rank's slice and its chunks: pure functions, tested without Ray."""

import numpy as np
import pytest

from raypipe.plan.order import RankPlan, chunk_bounds, doubling_bounds, epoch_order, rank_slice


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("sharded", [False, True])
def test_every_row_once_per_epoch_across_ranks(world, sharded):
    n = 1000
    shards = np.repeat(np.arange(13), 80)[:n] if sharded else None
    for epoch in (0, 1, 5):
        parts = [
            RankPlan(
                n, seed=3, shuffle=True, chunk_rows=64, rank=r, world_size=world, shards=shards, window_rows=200
            ).rows(epoch)
            for r in range(world)
        ]
        every = np.concatenate(parts)
        assert len(every) == n and np.array_equal(np.sort(every), np.arange(n))
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1  # ranks run the same number of rows (±1)


def test_order_is_a_function_of_seed_and_epoch():
    a = epoch_order(500, seed=1, epoch=2, shuffle=True)[0]
    assert np.array_equal(a, epoch_order(500, seed=1, epoch=2, shuffle=True)[0])
    assert not np.array_equal(a, epoch_order(500, seed=1, epoch=3, shuffle=True)[0])
    assert not np.array_equal(a, epoch_order(500, seed=2, epoch=2, shuffle=True)[0])
    assert np.array_equal(epoch_order(500, seed=1, epoch=2, shuffle=False)[0], np.arange(500))


def test_sharded_rows_form_windows_of_whole_shards():
    shards = np.repeat(np.arange(20), 100)  # e.g. 20 Parquet row groups of 100 rows
    plan = RankPlan(2000, seed=0, shuffle=True, chunk_rows=128, shards=shards, window_rows=400)
    chunks = plan.chunks(0)
    owner = {}
    for i, c in enumerate(chunks):
        for s in np.unique(shards[c]):
            assert owner.setdefault(int(s), i) == i  # a shard is read by exactly one chunk
        assert 100 <= len(c) <= 600
    assert sorted(owner) == list(range(20))
    first = [int(s) for s in dict.fromkeys(shards[np.concatenate(chunks)])]
    assert first != sorted(first)  # the shards themselves are shuffled


def test_a_streams_first_window_is_cut_into_doubling_pieces_in_the_same_order():
    shards = np.repeat(np.arange(30), 100)  # 30 Parquet row groups of 100 rows, read whole
    plan = RankPlan(3000, seed=0, shuffle=True, chunk_rows=128, shards=shards, window_rows=2048)
    whole, ramped = plan.chunks(0), plan.chunks(0, ramp=True)
    assert np.array_equal(np.concatenate(ramped), np.concatenate(whole))  # the same order: the same batches
    first = len(whole[0])
    sizes = [len(c) for c in ramped[: len(ramped) - len(whole) + 1]]
    assert sizes[:-1] == [128 * 2**k for k in range(len(sizes) - 1)] and sum(sizes) == first
    assert [len(c) for c in ramped[len(sizes) :]] == [len(c) for c in whole[1:]]  # later windows stay whole
    assert doubling_bounds(10, 10, 4) == [] and doubling_bounds(0, 3, 4) == [(0, 3)]
    folder = RankPlan(3000, seed=0, shuffle=True, chunk_rows=128)  # ordinary chunks: nothing to cut
    assert [len(c) for c in folder.chunks(0, ramp=True)] == [len(c) for c in folder.chunks(0)]


def test_a_huge_shard_is_cut_into_chunks():
    shards = np.zeros(5000, dtype=np.int64)  # one tar shard of 5000 samples
    plan = RankPlan(5000, seed=0, shuffle=True, chunk_rows=128, shards=shards, window_rows=1024)
    assert max(len(c) for c in plan.chunks(0)) == 1536


def test_tar_like_shards_mix_by_window_but_run_in_ordinary_chunks():
    shards = np.repeat(np.arange(4), 1000)  # four big tar shards: samples read one by one
    plan = RankPlan(4000, seed=0, shuffle=True, chunk_rows=128, shards=shards, window_rows=2048, whole_windows=False)
    chunks = plan.chunks(0)
    assert max(len(c) for c in chunks) == 128 and len(chunks) >= 32  # every worker gets work
    assert sorted(np.concatenate(chunks).tolist()) == list(range(4000))
    assert len(np.unique(shards[chunks[0]])) >= 2  # a batch mixes the window's shards


def test_rows_without_a_shard_shuffle_globally():
    shards = np.full(300, -1)
    plan = RankPlan(300, seed=0, shuffle=True, chunk_rows=50, shards=shards)
    assert not plan.sharded and [len(c) for c in plan.chunks(0)] == [50] * 6


def test_class_sorted_parquet_mixes_batches_nearly_as_well_as_a_full_shuffle():
    """A file sorted by class (4 classes, 100-row row groups): mean per-batch label entropy of the
    shard-window shuffle (default window) against a global shuffle of the same rows."""
    labels = np.repeat(np.arange(4), 1000)
    shards = np.arange(4000) // 100

    def mean_entropy(order, batch=128):
        ent = []
        for s in range(0, len(order) - batch + 1, batch):
            p = np.bincount(labels[order[s : s + batch]], minlength=4) / batch
            p = p[p > 0]
            ent.append(-(p * np.log2(p)).sum())
        return float(np.mean(ent))

    full = np.mean([mean_entropy(epoch_order(4000, seed=0, epoch=e, shuffle=True)[0]) for e in range(5)])
    windowed = np.mean(
        [mean_entropy(RankPlan(4000, seed=0, shuffle=True, chunk_rows=128, shards=shards).rows(e)) for e in range(5)]
    )
    assert windowed >= 0.95 * full, (windowed, full)


def test_rank_slices_and_chunk_bounds():
    assert [rank_slice(10, r, 3) for r in range(3)] == [slice(0, 4), slice(4, 7), slice(7, 10)]
    with pytest.raises(ValueError, match="rank"):
        rank_slice(10, 3, 3)
    assert chunk_bounds(0, 10, np.array([0]), 4).tolist() == [[0, 4], [4, 8], [8, 10]]
    assert chunk_bounds(2, 10, np.array([0, 5]), 4).tolist() == [[2, 5], [5, 9], [9, 10]]
    assert chunk_bounds(3, 3, np.array([0]), 4).shape == (0, 2)
