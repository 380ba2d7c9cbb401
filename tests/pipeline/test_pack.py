import numpy as np
import pytest

from raypipe.pipeline.accounting import EpochLedger, SkipLimitError
from raypipe.pipeline.pack import BatchSpec, Packer


def block(ids, ok=None, shape=(2, 3, 3)):
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    img = np.zeros((n, *shape), np.uint8)
    img[:] = (ids % 251).astype(np.uint8)[:, None, None, None]  # pixels encode the sample id
    ok = np.ones(n, bool) if ok is None else np.asarray(ok, dtype=bool)
    return {
        "image": img,
        "label": ids % 7,
        "sample_id": ids,
        "ok": ok,
        "reason": np.array(["" if o else "truncated" for o in ok], dtype=object),
        "detail": np.array([""] * n, dtype=object),
        "path": np.array(["" if o else f"p{i}" for i, o in zip(ids, ok, strict=True)], dtype=object),
    }


def run(packer, blocks):
    out = [b for blk in blocks for b in packer.add(blk)]
    return out + list(packer.flush())


def test_exact_batches_skip_bad_rows_and_keep_order_of_content():
    p = Packer(BatchSpec(4, (2, 3, 3)))
    out = run(p, [block([0, 1, 2], ok=[1, 0, 1]), block([3, 4, 5, 6, 7]), block([8])])
    assert [len(b["sample_id"]) for b in out] == [4, 4]
    ids = np.concatenate([b["sample_id"] for b in out])
    assert sorted(ids) == [0, 2, 3, 4, 5, 6, 7, 8]
    for b in out:
        assert b["image"].flags.c_contiguous and b["image"].dtype == np.uint8
        assert b["label"].dtype == np.int64 and b["sample_id"].dtype == np.int64
        assert np.all(b["image"][:, 0, 0, 0] == b["sample_id"] % 251)
        assert np.array_equal(b["label"], b["sample_id"] % 7)


def test_drop_last_records_dropped_ids():
    p = Packer(BatchSpec(4, (2, 3, 3)), drop_last=True)
    out = run(p, [block(range(10))])
    assert [len(b["sample_id"]) for b in out] == [4, 4]
    assert np.concatenate(p.dropped_ids).tolist() == [8, 9]


def test_clean_full_block_passes_through_without_copy():
    p = Packer(BatchSpec(4, (2, 3, 3)))
    blk = block([1, 2, 3, 4])
    (out,) = list(p.add(blk))
    assert np.shares_memory(out["image"], blk["image"]) and out["image"].shape == blk["image"].shape


def test_whole_batches_of_a_big_block_are_views_and_the_rest_is_packed():
    p = Packer(BatchSpec(4, (2, 3, 3)))
    big = block(range(10))  # two whole batches, then two rows that wait for the next block
    out = run(p, [big, block([10, 11, 12], ok=[1, 0, 1]), block(range(13, 17))])
    assert [b["sample_id"].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 12], [13, 14, 15, 16]]
    assert np.shares_memory(out[0]["image"], big["image"]) and np.shares_memory(out[1]["image"], big["image"])
    assert not np.shares_memory(out[2]["image"], big["image"])  # rows 8, 9 were copied into a new batch
    for b in out:
        assert b["image"].flags.c_contiguous and np.all(b["image"][:, 0, 0, 0] == b["sample_id"] % 251)
        assert b["label"].dtype == np.int64 and np.array_equal(b["label"], b["sample_id"] % 7)


def test_the_last_whole_batch_of_a_window_sized_block_is_a_copy():
    """A consumer holds its last batch while it waits for the next block: a view would keep the whole
    block's slab (a window of images) in use that long, so a block of eight batches or more ends in a
    copy, whether rows are left over for the next batch or not; shorter blocks stay views throughout."""
    for rows, left in ((34, 2), (32, 0)):
        p = Packer(BatchSpec(4, (2, 3, 3)))
        big = block(range(rows))
        out = run(p, [big, block(range(rows, rows + 4 - left))])
        assert [b["sample_id"].tolist() for b in out] == [list(range(s, s + 4)) for s in range(0, rows + 4 - left, 4)]
        views = [np.shares_memory(b["image"], big["image"]) for b in out[:8]]
        assert views == [True] * 7 + [False]
        assert np.all(out[7]["image"][:, 0, 0, 0] == out[7]["sample_id"] % 251)
    p = Packer(BatchSpec(4, (2, 3, 3)))
    short = block(range(28))  # seven batches
    out = run(p, [short])
    assert all(np.shares_memory(b["image"], short["image"]) for b in out)


def test_batches_are_the_good_rows_in_order_however_the_blocks_are_cut():
    """A short or partly bad block costs one copied batch; the clean blocks after it are views again (at
    an offset), and every batch is the next good rows of the order whatever the blocks' lengths."""
    p = Packer(BatchSpec(4, (2, 3, 3)))
    clean = [block(range(10 + 4 * k, 14 + 4 * k)) for k in range(3)]
    out = run(p, [block([0, 1, 2], ok=[1, 0, 1]), *clean, block([30, 31])])
    want = [[0, 2, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19], [20, 21, 30, 31]]
    assert [b["sample_id"].tolist() for b in out] == want
    assert np.shares_memory(out[1]["image"], clean[0]["image"]) is False  # rows 12, 13 then 14, 15: two blocks
    rng = np.random.default_rng(0)
    ids = np.arange(500)
    ok = rng.random(500) > 0.1
    expected = ids[ok]
    for _ in range(20):
        cuts = np.sort(rng.choice(np.arange(1, 500), size=rng.integers(1, 40), replace=False))
        packer = Packer(BatchSpec(8, (2, 3, 3)))
        got = run(packer, [block(i, ok=o) for i, o in zip(np.split(ids, cuts), np.split(ok, cuts), strict=True)])
        flat = np.concatenate([b["sample_id"] for b in got])
        assert np.array_equal(flat, expected) and all(len(b["sample_id"]) == 8 for b in got[:-1])
        for b in got:
            assert np.all(b["image"][:, 0, 0, 0] == b["sample_id"] % 251)


def test_clean_blocks_after_a_short_one_are_views_at_an_offset():
    p = Packer(BatchSpec(4, (2, 3, 3)))
    big = block(range(3, 15))
    out = run(p, [block([0, 1, 2]), big])
    assert [b["sample_id"].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14]]
    assert not np.shares_memory(out[0]["image"], big["image"])
    assert np.shares_memory(out[1]["image"], big["image"]) and np.shares_memory(out[2]["image"], big["image"])


def test_batches_do_not_share_buffers():
    p = Packer(BatchSpec(2, (2, 3, 3)))
    out = run(p, [block([0, 1, 2], ok=[1, 1, 1]), block([3, 4, 5], ok=[1, 0, 1])])
    assert not np.shares_memory(out[0]["image"], out[1]["image"])
    assert out[0]["image"][0, 0, 0, 0] == 0


def test_wrong_shape_is_a_clear_error():
    p = Packer(BatchSpec(2, (4, 4, 3)))
    with pytest.raises(ValueError, match="expected uint8"):
        list(p.add(block([0, 1])))


def test_ledger_counts_every_row_once():
    led = EpochLedger(epoch=0, expected=5, with_content=True)
    blk = block([0, 1, 2, 3, 4], ok=[1, 1, 0, 1, 1])
    led.record_block(blk)
    for b in run(Packer(BatchSpec(2, (2, 3, 3))), [blk]):
        led.record_batch(b)
    rep = led.finish(1.0, 0.1)
    assert rep.emitted == 4 and rep.skipped == {"truncated": 1}
    assert rep.skipped_paths[0]["path"] == "p2"
    assert len(rep.content_sha256) == 64


def test_ledger_detects_loss_and_duplicates():
    led = EpochLedger(epoch=0, expected=3)
    led.record_batch({"sample_id": np.array([0, 1]), "image": None})
    with pytest.raises(RuntimeError, match="lost"):
        led.finish(1.0, 0.1)
    led = EpochLedger(epoch=0, expected=2)
    led.record_batch({"sample_id": np.array([0, 0]), "image": None})
    with pytest.raises(RuntimeError, match="twice"):
        led.finish(1.0, 0.1)


def test_content_digest_is_order_independent_and_content_sensitive():
    def digest(blocks):
        led = EpochLedger(epoch=0, expected=4, with_content=True)
        for b in blocks:
            led.record_block(b)
            led.record_batch(b)
        return led.finish(1, 1).content_sha256

    a, b = block([0, 1]), block([2, 3])
    assert digest([a, b]) == digest([b, a])
    c = block([2, 3])
    c["image"][0, 0, 0, 0] ^= 1
    assert digest([a, b]) != digest([a, c])


def test_skip_limits_list_paths():
    led = EpochLedger(epoch=3, expected=4, max_skip_ratio=0.25)
    blk = block([0, 1, 2, 3], ok=[0, 0, 1, 1])
    with pytest.raises(SkipLimitError, match="p0") as e:
        led.record_block(blk)  # 2 of 4 can only grow: the epoch fails at once, not at its end
    assert "p1" in str(e.value) and "epoch 3" in str(e.value) and "--max-skip-ratio" in str(e.value)
    led = EpochLedger(epoch=0, expected=4, max_skips=1)
    with pytest.raises(SkipLimitError, match="max_skips=1"):
        led.record_block(blk)


def test_skip_ratio_of_exactly_the_limit_passes():
    led = EpochLedger(epoch=0, expected=100, max_skip_ratio=0.01)
    led.record_block(block(np.arange(100), ok=[0] + [1] * 99))  # 1 of 100 = 1 %: at the limit, not over
    led.record_batch({"sample_id": np.arange(1, 100), "image": None})
    assert led.finish(1, 1).skipped == {"truncated": 1}
    led = EpochLedger(epoch=0, expected=50, max_skip_ratio=0.01)  # a small epoch: 1 of 50 is 2 %
    with pytest.raises(SkipLimitError):
        led.record_block(block(np.arange(50), ok=[0] + [1] * 49))


def test_skip_limit_message_is_short():
    led = EpochLedger(epoch=2, expected=100, max_skip_ratio=0.01)
    ok = [0] * 30 + [1] * 70
    blk = block(np.arange(100), ok=ok)
    blk["reason"][:10] = "not_an_image"
    with pytest.raises(SkipLimitError) as e:
        led.record_block(blk)
    msg = str(e.value)
    lines = msg.splitlines()
    assert lines[0].startswith("epoch 2: 30 of 100 samples skipped") and "30.0 %" in lines[0]
    assert "max_skip_ratio=0.01" in lines[0]
    assert lines[1] == "  top reasons: truncated 20, not_an_image 10"
    assert sum(1 for line in lines if "/p" in line or line.strip().startswith(("truncated:", "not_an_image:"))) == 5
    assert "… and 25 more" in msg
    assert "--max-skip-ratio" in lines[-1] and "max_skip_ratio" in lines[-1]
    assert len(lines) <= 9
