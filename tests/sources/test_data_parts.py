"""A command's or a config's datasets (``raypipe.sources.data_parts``): one dataset is itself, several a
mixture whose weights default to their rows; the config's ``data:`` section in both shapes; each bad
input a ``ValueError`` naming it."""

from __future__ import annotations

import pytest
from image_factory import write_captioned_shards

from raypipe.config import load_config
from raypipe.sample_data import write_sample_data
from raypipe.sources import ListingOptions, SourceRows
from raypipe.sources.data_parts import DataPart, DataParts, data_parts, parse_data_section
from raypipe.sources.mixture import MixtureListing


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    write_sample_data(str(root / "a"), classes=2, per_class=6, workers=1)
    write_sample_data(str(root / "b"), classes=3, per_class=3, workers=1)
    write_captioned_shards(root / "shards", n=10, per_shard=5)
    return root


def test_one_dataset_is_that_dataset_not_a_mixture(folders):
    parts = data_parts([str(folders / "a")])
    assert not parts.is_mixture and parts.describe() == str(folders / "a")
    rows = parts.open()
    assert isinstance(rows, SourceRows) and len(rows) == 12


def test_several_datasets_without_weights_take_every_row_of_each_once_an_epoch(folders):
    rows = data_parts([str(folders / "a"), str(folders / "b")]).open()
    assert isinstance(rows, MixtureListing)
    assert rows.sizes == (12, 9) and rows.takes == (12, 9) and len(rows) == 21


def test_weights_and_samples_per_epoch_set_the_takes(folders):
    parts = data_parts([str(folders / "a"), str(folders / "b")], [3, 1], 8)
    assert parts.describe() == f"{folders / 'a'} (3) + {folders / 'b'} (1)"
    assert parts.open().takes == (6, 2)
    one = data_parts([str(folders / "a")], None, 30)  # one dataset with its epoch's rows: a mixture of one
    assert one.is_mixture and one.open().takes == (30,)


def test_a_parts_own_options_are_set_over_the_commands(folders):
    section = [
        {"path": str(folders / "shards"), "weight": 1, "fields": "txt"},
        {"path": str(folders / "a"), "weight": 1},
    ]
    parts = parse_data_section(section)
    assert parts.parts[0].options == (("fields", ("txt",)),)
    listed = parts.listed(ListingOptions(label_column="label"))
    assert listed[0].fields == ("txt",) and listed[1].fields == ()


def test_the_config_files_data_section_in_both_shapes(folders, tmp_path):
    a, b = str(folders / "a"), str(folders / "b")
    listed = load_config({"data": [{"path": a, "weight": 0.7}, {"path": b, "weight": 0.3}]}).data
    assert listed == DataParts((DataPart(a, 0.7), DataPart(b, 0.3)))
    mapped = load_config({"data": {"parts": [a, b], "samples_per_epoch": 5}}).data
    assert mapped == DataParts((DataPart(a), DataPart(b)), 5)
    assert load_config({"data": a}).data == DataParts((DataPart(a),))
    assert load_config({"pipeline": {"batch_size": 8}}).data is None


@pytest.mark.parametrize(
    "section, words",
    [
        ([], "non-empty list"),
        ([{"weight": 1}], "with a path"),
        ([{"path": "a", "weight": 1, "colour": "red"}], "unknown key(s) ['colour']"),
        ([{"path": "a", "weight": 1}, "b"], "every dataset or for none"),
        ([{"path": "a", "weight": -1}], "finite number >= 0"),
        ([{"path": "a", "weight": float("nan")}], "finite number >= 0"),
        ([{"path": "a", "weight": 0}, {"path": "b", "weight": 0}], "every weight is 0"),
        ({"parts": ["a"], "samples_per_epoch": 0}, "samples_per_epoch 0"),
        ({"datasets": ["a"]}, "mapping of parts"),
        ([{"path": "a", "kind": "zip"}], "data[0]: kind"),
    ],
)
def test_a_bad_data_section_names_what_is_wrong(section, words):
    with pytest.raises(ValueError) as e:
        parse_data_section(section, where="job.yaml")
    assert "job.yaml: data" in str(e.value) and words in str(e.value)


def test_a_weight_for_each_dataset_on_the_command_line():
    with pytest.raises(ValueError, match="1 weight.*for 2 dataset"):
        data_parts(["a", "b"], [1.0])
    with pytest.raises(ValueError, match="samples_per_epoch"):
        data_parts(["a", "b"], None, 0)
