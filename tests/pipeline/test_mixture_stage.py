"""A mixture's chunk on the worker (``raypipe.stages.mixture_stage``): each part's rows through its own
stage, in the chunk's order, with ``source`` and ``cycle`` carried, and a repeat augmented anew."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from image_factory import captioned_jpeg, write_captioned_shards

from raypipe.config import DecodeConfig, TrainAugment
from raypipe.sources import open_source
from raypipe.stages.augment import StageSpec, stage_for
from raypipe.stages.mixture_stage import MixtureSpec, augment_mixture, mixture_epoch

AUG = TrainAugment(input_size=(16, 16))


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    for name in ("cat", "dog"):
        (root / "folder" / name).mkdir(parents=True)
        for i in range(4):
            (root / "folder" / name / f"{i}.jpg").write_bytes(captioned_jpeg(i + (10 if name == "dog" else 0)))
    write_captioned_shards(root / "shards", n=6, per_shard=3)
    return open_source(str(root / "folder")), open_source(str(root / "shards"), fields=("txt",))


def _spec(rows, epoch=2):
    return StageSpec(
        kind=rows.kind,
        root=rows.root,
        augment=AUG,
        decode=DecodeConfig(),
        seed=5,
        epoch=epoch,
        image_column=rows.image_column,
        fields=rows.fields,
    )


def test_each_row_is_its_parts_stage_with_the_cycles_epoch_word(parts):
    folder, shards = parts
    source = np.array([1, 0, 0, 1, 1, 0])
    cycle = np.array([0, 0, 1, 0, 1, 0])
    picks = {0: np.array([3, 5, 6]), 1: np.array([2, 4, 2])}  # part 1's row 2 taken in cycles 0 and 1
    rows = {
        "source": source,
        "cycle": cycle,
        "take": np.arange(6),
        "parts": (folder.columns().take(picks[0]), shards.columns().take(picks[1])),
    }
    spec = MixtureSpec((_spec(folder), _spec(shards)))
    block = augment_mixture(rows, spec)
    assert block["fields"]["source"].tolist() == source.tolist()
    assert block["cycle"].tolist() == cycle.tolist()
    assert block["fields"]["take"].tolist() == list(range(6))
    for part, listing in enumerate(parts):
        mine = np.flatnonzero(source == part)
        for j, at in enumerate(mine):
            one = listing.columns().take(picks[part][j : j + 1])
            want = stage_for(dataclasses.replace(_spec(listing), epoch=mixture_epoch(2, part, int(cycle[at]))))(one)
            np.testing.assert_array_equal(block["image"][at], want["image"][0])
            assert block["sample_id"][at] == want["sample_id"][0] and block["label"][at] == want["label"][0]
    # the text field of the shards' rows, None for the folder's (it has none)
    assert [block["fields"]["txt"][i] for i in np.flatnonzero(source == 1)] == ["caption 2", "caption 4", "caption 2"]
    # the row taken twice is augmented anew in its next cycle
    again = np.flatnonzero(source == 1)
    assert not np.array_equal(block["image"][again[0]], block["image"][again[2]])


def test_parts_of_other_shapes_or_seeds_are_refused(parts):
    folder, shards = parts
    with pytest.raises(ValueError, match="image shape, seed and epoch"):
        MixtureSpec((_spec(folder), dataclasses.replace(_spec(shards), seed=6)))


def test_rows_written_by_group_are_put_in_the_chunks_order_in_place():
    from raypipe.stages.mixture_stage import _put_in_order

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 64):
        images = rng.integers(0, 256, (n, 4, 5, 3), dtype=np.uint8)
        held = rng.permutation(n)
        want = images[held].copy()
        _put_in_order(images, held)
        assert np.array_equal(images, want)
