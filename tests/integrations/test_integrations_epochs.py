"""EqualBatches: the same batch count on every rank; eval padded like timm's OrderedDistributedSampler."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from raypipe.integrations.epochs import EqualBatches, eval_rows_per_rank, train_batches_per_rank
from raypipe.plan.order import rank_slice


class FakeSource:
    """An EpochSource stand-in: this rank's slice of ``n`` ids (minus ``skip``), packed as the Packer
    packs (full batches, then a partial one unless ``drop_last``); pixels encode the id."""

    def __init__(self, n, rank, world, b, *, drop_last=False, skip=()):
        span = rank_slice(n, rank, world)
        self.ids = [i for i in range(span.start, span.stop) if i not in set(skip)]
        self.b, self.drop_last = b, drop_last
        self.epochs, self.closed, self.iters_closed = [], False, 0
        self.next_epoch = 0

    def set_epoch(self, epoch):
        self.next_epoch = epoch

    def close(self):
        self.closed = True

    def __iter__(self):
        self.epochs.append(self.next_epoch)
        self.next_epoch += 1
        return self._gen()

    def _gen(self):
        try:
            ids = np.array(self.ids, np.int64)
            for s in range(0, len(ids), self.b):
                chunk = ids[s : s + self.b]
                if len(chunk) < self.b and self.drop_last:
                    return
                img = np.broadcast_to((chunk % 251).astype(np.uint8)[:, None, None, None], (len(chunk), 2, 2, 3))
                yield {"image": np.ascontiguousarray(img), "label": chunk % 3, "sample_id": chunk}
        finally:
            self.iters_closed += 1


@pytest.mark.parametrize(("n", "world", "b"), [(33, 2, 8), (33, 2, 4), (32, 2, 8), (10, 4, 4), (3, 4, 2), (33, 3, 5)])
def test_eval_every_sample_once_and_equal_batch_counts(n, world, b):
    pad_to = eval_rows_per_rank(n, world)
    per_rank = []
    for r in range(world):
        view = EqualBatches(
            FakeSource(n, r, world, b), batch_size=b, num_batches=-(-pad_to // b), pad_to=pad_to, image_shape=(2, 2, 3)
        )
        batches = list(view)
        assert len(batches) == len(view) == -(-pad_to // b)
        ids = np.concatenate([x["sample_id"] for x in batches])
        assert len(ids) == pad_to
        assert all(len(x["sample_id"]) == b for x in batches[:-1])
        real = ids[ids >= 0]
        # padding only at the end (timm's evaluator trims trailing predictions)
        assert (ids[: len(real)] >= 0).all() and (ids[len(real) :] == -1).all()
        span = rank_slice(n, r, world)
        assert len(real) == span.stop - span.start and view.padded_rows == pad_to - len(real)
        for x in batches:  # a padded row repeats a real image of this rank, label with it
            assert x["image"].shape[1:] == (2, 2, 3) and x["image"].flags.c_contiguous
        per_rank.append(real)
    counts = Counter(np.concatenate(per_rank).tolist())
    assert sorted(counts) == list(range(n)) and set(counts.values()) == {1}


def test_eval_padding_repeats_this_ranks_first_rows():
    # rank 1 of 33 over 2 has ids 17..32: batches of 5, 5, 5, then 32 and one padded row
    view = EqualBatches(FakeSource(33, 1, 2, 5), batch_size=5, num_batches=4, pad_to=17)
    last = list(view)[-1]
    assert last["sample_id"].tolist() == [32, -1]
    assert last["image"][1, 0, 0, 0] == 17 and last["label"][1] == 17 % 3  # rank 1's first id is 17


def test_eval_skips_are_padded_to_the_same_count():
    # rank 1 of 33 over 2 (16 rows) loses 3 images: it still yields 17 rows in 3 batches, like rank 0
    view = EqualBatches(FakeSource(33, 1, 2, 8, skip={20, 21, 22}), batch_size=8, num_batches=3, pad_to=17)
    batches = list(view)
    assert [len(x["sample_id"]) for x in batches] == [8, 8, 1]
    assert view.padded_rows == 4


def test_train_equal_batch_counts_hold_back_and_repeat():
    # 35 rows over 2 ranks: 18 and 17; batches of 9: rank 0 has 2 full batches, rank 1 one
    assert train_batches_per_rank(35, 2, 9) == 1
    src0 = FakeSource(35, 0, 2, 9, drop_last=True)
    view0 = EqualBatches(src0, batch_size=9, num_batches=1)
    out0 = list(view0)
    assert len(out0) == 1 and view0.held_back_rows == 9
    assert src0.iters_closed == 1  # read to its end: the source's epoch finished
    # a rank short of batches (skipped images) repeats its last batch
    src = FakeSource(40, 0, 1, 8, drop_last=True, skip=set(range(30, 40)))
    view = EqualBatches(src, batch_size=8, num_batches=5)
    out = list(view)
    assert len(out) == 5 and view.repeated_batches == 2 and out[-1] is out[2]


def test_epoch_moves_and_stopping_early_closes_the_source_epoch():
    src = FakeSource(33, 0, 1, 8)
    view = EqualBatches(src, batch_size=8, num_batches=5, pad_to=33)
    view.set_epoch(4)
    it = iter(view)
    next(it)
    it.close()
    assert src.epochs == [4] and src.iters_closed == 1
    view.close()
    assert src.closed


def test_checks_pad_to_against_batches():
    with pytest.raises(ValueError, match="pad_to"):
        EqualBatches([], batch_size=8, num_batches=2, pad_to=17)
