"""Listing a mixture (``raypipe.sources.mixture``): its arguments checked, its parts listed, one class
space by name, its takes and its identity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from image_factory import captioned_jpeg

from raypipe.sources import ListingOptions, open_source
from raypipe.sources.mixture import Mixture


def _folder(root, classes, per_class=3):
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            (root / name / f"{i}.jpg").write_bytes(captioned_jpeg(i))
    return root


@pytest.mark.parametrize(
    "parts",
    [
        (),
        [("a",)],
        [("a", -1.0)],
        [("a", math.nan)],
        [("a", math.inf)],
        [("a", 0), ("b", 0.0)],
        [("a", "1")],
        [("a", True)],
        [("a", 1, "not options")],
        "a",
    ],
)
def test_bad_parts_and_weights_are_value_errors_naming_them(parts):
    with pytest.raises(ValueError, match="parts|weight"):
        Mixture(parts)


@pytest.mark.parametrize("spe", [0, -3, 2.5, True])
def test_samples_per_epoch_below_one_or_not_an_int_is_refused(spe):
    with pytest.raises(ValueError, match="samples_per_epoch"):
        Mixture([("a", 1)], samples_per_epoch=spe)


def test_named_classes_become_one_space_by_name_and_each_part_is_renumbered(tmp_path):
    a = _folder(tmp_path / "a", ["cat", "dog"])
    b = _folder(tmp_path / "b", ["dog", "emu"])
    listing = open_source(Mixture([(str(a), 1), (str(b), 3)]))
    assert listing.classes == ("cat", "dog", "emu") and listing.num_classes == 3
    b_labels = np.asarray(listing.parts[1].table.column("label"))
    assert sorted(set(b_labels.tolist())) == [1, 2]  # dog keeps the first part's number, emu is new
    assert listing.sizes == (6, 6) and len(listing) == 12  # samples_per_epoch: the parts' rows together
    assert listing.takes == (3, 9)


def test_named_and_unnamed_parts_cannot_be_mixed(tmp_path):
    import json

    a = _folder(tmp_path / "a", ["cat"])
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(captioned_jpeg(i))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps({"path": f"{i}.jpg", "label": i}) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match="unnamed integer labels"):
        open_source(Mixture([(str(a), 1), (str(tmp_path / "m.jsonl"), 1)]))


def test_each_part_is_listed_with_its_own_options_and_the_digest_is_the_mixtures(tmp_path):
    a = _folder(tmp_path / "a", ["cat", "dog"])
    b = _folder(tmp_path / "b", ["dog", "emu"])
    sorted_b = ListingOptions(class_order="sorted")
    one = open_source(Mixture([(str(a), 1), (str(b), 1, sorted_b)], samples_per_epoch=8))
    assert one.takes == (4, 4) and len(one) == 8
    same = open_source(Mixture([(str(a), 1), (str(b), 1, sorted_b)], samples_per_epoch=8))
    reweighted = open_source(Mixture([(str(a), 1), (str(b), 2, sorted_b)], samples_per_epoch=8))
    assert one.digest() == same.digest() != reweighted.digest()
