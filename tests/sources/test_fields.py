"""Fields (``ListingOptions(fields=…)``): named, listed where they lie, read and decoded on the worker.

The data's values are functions of the sample's index (``caption i``, ``{"i": i}``), so each check is
exact: a field arrives beside its own image, whatever the kind.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from image_factory import caption_ids, captioned_jpeg, write_captioned_shards

from raypipe.config import DecodeConfig, EvalAugment
from raypipe.kernels.errors import BAD_FIELD, MISSING_FIELD, REASON_CODES, REASONS, SkipImage
from raypipe.sources import ListingOptions, open_source
from raypipe.sources.fields import check_fields, decode_member, member_columns, value_column
from raypipe.stages.augment import AugmentStage, StageSpec
from raypipe.stages.field_values import FieldTransformError, check_field_transforms, field_array


def _stage(rows, transforms=None) -> AugmentStage:
    spec = StageSpec(
        kind=rows.kind,
        root=rows.root,
        augment=EvalAugment(input_size=(16, 16)),
        decode=DecodeConfig(),
        seed=0,
        epoch=0,
        image_column=rows.image_column,
        fields=rows.fields,
        field_transforms=check_field_transforms(transforms, rows.fields),
    )
    return AugmentStage(spec)


def _block(rows, transforms=None) -> dict:
    return _stage(rows, transforms)(rows.columns().take(np.arange(len(rows))))


# -- names -----------------------------------------------------------------------------------------------


def test_field_names_are_checked_and_a_leading_dot_names_the_same_member():
    assert check_fields(("txt", ".json")) == ("txt", "json")
    assert check_fields("caption") == ("caption",)
    assert ListingOptions(fields=["txt"]).fields == ("txt",)
    for bad in (("image",), ("label",), ("sample_id",), ("source",), ("txt", "txt"), ("",), (3,), 7):
        with pytest.raises(ValueError, match="fields"):
            ListingOptions(fields=bad)


def test_the_field_reasons_are_skip_reasons_with_codes_of_their_own():
    assert {MISSING_FIELD, BAD_FIELD} <= set(REASONS)
    assert REASON_CODES[MISSING_FIELD] != REASON_CODES[BAD_FIELD]
    assert len(set(REASON_CODES.values())) == len(REASON_CODES)


@pytest.mark.parametrize(
    ("name", "data", "value"),
    [
        ("txt", "a dog é".encode(), "a dog é"),
        ("json", b'{"a": [1, 2]}', {"a": [1, 2]}),
        ("cls", b" 7\n", 7),
        ("seg.png", b"\x89PNG", b"\x89PNG"),
        ("npy", b"\x00\x01", b"\x00\x01"),
    ],
)
def test_a_member_is_decoded_by_its_extension(name, data, value):
    assert decode_member(name, data) == value


@pytest.mark.parametrize(("name", "data"), [("json", b"{oops"), ("txt", b"\xff\xfe"), ("cls", b"seven")])
def test_a_member_that_is_not_what_its_extension_says_is_a_bad_field(name, data):
    with pytest.raises(SkipImage) as e:
        decode_member(name, data)
    assert e.value.reason == BAD_FIELD and name in e.value.detail


# -- WebDataset members -------------------------------------------------------------------------------------


def test_webdataset_members_are_listed_by_place_and_read_beside_their_image(tmp_path):
    write_captioned_shards(tmp_path, without_txt={4})
    rows = open_source(str(tmp_path), fields=("txt", "json"))
    assert rows.fields == ("txt", "json")
    offsets = np.asarray(rows.table.column(member_columns("txt")[0]))
    assert (offsets < 0).tolist() == [i == 4 for i in range(12)]
    block = _block(rows)
    ok = block["ok"]
    assert ok.tolist() == [i != 4 for i in range(12)]
    assert block["reason"][4] == MISSING_FIELD
    assert block["fields"]["txt"] == [None if i == 4 else f"caption {i}" for i in range(12)]
    assert block["fields"]["json"] == [None if i == 4 else {"i": i} for i in range(12)]


def test_fields_change_no_pixel_id_or_label(tmp_path):
    write_captioned_shards(tmp_path)
    plain, with_fields = open_source(str(tmp_path)), open_source(str(tmp_path), fields=("txt",))
    assert plain.digest() == with_fields.digest()
    a, b = _block(plain), _block(with_fields)
    for key in ("image", "label", "sample_id", "ok"):
        np.testing.assert_array_equal(a[key], b[key])
    assert "fields" not in a


def test_a_json_member_that_does_not_parse_skips_its_sample_with_the_reason(tmp_path):
    write_captioned_shards(tmp_path, bad_json={2})
    block = _block(open_source(str(tmp_path), fields=("json",)))
    assert block["ok"].tolist() == [i != 2 for i in range(12)]
    assert block["reason"][2] == BAD_FIELD and "not JSON" in block["detail"][2]


def test_a_listing_by_shard_refuses_fields_and_an_index_is_passed_over_for_the_headers(tmp_path):
    from raypipe.sources.indexes.indexer import index_shards

    write_captioned_shards(tmp_path)
    index_shards(str(tmp_path), use_ray=False)
    with pytest.raises(ValueError, match="by_shard=True with fields"):
        open_source(str(tmp_path), fields=("txt",), by_shard=True)
    rows = open_source(str(tmp_path), fields=("txt",))
    assert _block(rows)["fields"]["txt"] == [f"caption {i}" for i in range(12)]


def test_a_folder_of_images_has_no_fields(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(captioned_jpeg(1))
    with pytest.raises(ValueError, match="folder of image files"):
        open_source(str(tmp_path), fields=("txt",))


# -- columns ---------------------------------------------------------------------------------------------


def _parquet(path, n=10, *, null_at=()):
    captions = [None if i in null_at else f"caption {i}" for i in range(n)]
    table = pa.table(
        {
            "image": [captioned_jpeg(i) for i in range(n)],
            "label": list(range(n)),
            "caption": captions,
            "score": [i / 10 for i in range(n)],
        }
    )
    pq.write_table(table, path, row_group_size=4)


def test_parquet_columns_are_carried_and_a_null_cell_is_a_missing_field(tmp_path):
    _parquet(tmp_path / "d.parquet", null_at={3})
    rows = open_source(str(tmp_path / "d.parquet"), fields=("caption", "score"))
    assert value_column("caption") in rows.table.column_names
    block = _block(rows)
    assert block["ok"].tolist() == [i != 3 for i in range(10)]
    assert block["reason"][3] == MISSING_FIELD
    assert block["fields"]["caption"] == [None if i == 3 else f"caption {i}" for i in range(10)]
    want = np.array([0.0 if i == 3 else i / 10 for i in range(10)])
    np.testing.assert_allclose(block["fields"]["score"], want)  # numbers: one array


def test_a_field_column_the_file_lacks_is_named(tmp_path):
    _parquet(tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="no column 'nope'"):
        open_source(str(tmp_path / "d.parquet"), fields=("nope",))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_manifest_columns_are_carried(tmp_path, fmt):
    for i in range(6):
        (tmp_path / f"{i}.jpg").write_bytes(captioned_jpeg(i))
    if fmt == "csv":
        lines = ["path,label,caption"] + [f"{i}.jpg,{i % 2},caption {i}" for i in range(6)]
    else:
        lines = [json.dumps({"path": f"{i}.jpg", "label": i % 2, "caption": f"caption {i}"}) for i in range(6)]
    (tmp_path / f"m.{fmt}").write_text("\n".join(lines) + "\n")
    rows = open_source(str(tmp_path / f"m.{fmt}"), fields=("caption",))
    assert _block(rows)["fields"]["caption"] == [f"caption {i}" for i in range(6)]
    with pytest.raises(ValueError, match="nope"):
        open_source(str(tmp_path / f"m.{fmt}"), fields=("nope",))


# -- transforms on the worker ------------------------------------------------------------------------------


def _fails_on_seven(text: str) -> str:
    if text.endswith(" 7"):
        raise KeyError("seven")
    return text


def test_a_transform_runs_on_each_good_value_and_fixed_shapes_come_out_as_one_array(tmp_path):
    write_captioned_shards(tmp_path, without_txt={5})
    block = _block(open_source(str(tmp_path), fields=("txt",)), {"txt": caption_ids})
    ids = block["fields"]["txt"]
    assert ids.shape == (12, 16) and ids.dtype == np.int64
    for i in range(12):
        np.testing.assert_array_equal(ids[i], 0 if i == 5 else caption_ids(f"caption {i}"))


def test_an_exception_in_a_transform_fails_naming_the_sample_and_the_field(tmp_path):
    write_captioned_shards(tmp_path)
    with pytest.raises(FieldTransformError, match=r"'txt'.*_fails_on_seven.*sample 7.*KeyError"):
        _block(open_source(str(tmp_path), fields=("txt",)), {"txt": _fails_on_seven})


def test_a_transform_must_name_a_listed_field_and_be_callable():
    with pytest.raises(ValueError, match="not a field"):
        check_field_transforms({"txt": caption_ids}, ("json",))
    with pytest.raises(ValueError, match="callable"):
        check_field_transforms({"txt": 3}, ("txt",))


def test_field_values_are_one_array_only_where_every_good_value_has_one_shape():
    ok = np.array([True, False, True])
    np.testing.assert_array_equal(field_array([1, None, 3], ok), [1, 0, 3])
    assert field_array(["a", None, "b"], ok) == ["a", None, "b"]
    assert field_array([np.zeros(2), None, np.zeros(3)], ok)[1] is None  # shapes differ: a list


def test_a_remote_samples_members_come_in_the_same_ranged_requests_as_its_image(tmp_path):
    """Members of a sample lie next to each other in its shard: reading the captions and the JSON with
    the images takes no request more than the images alone."""
    from raypipe.sources.reader import BlockReader
    from raypipe.sources.transport.remote import ReadOptions
    from raypipe.testing import S3Server

    write_captioned_shards(tmp_path / "bkt" / "wds", n=12, per_shard=5)
    with S3Server(tmp_path) as server:
        fs = server.filesystem()
        plain = open_source("s3://bkt/wds", filesystem=fs)
        rows = open_source("s3://bkt/wds", filesystem=fs, fields=("txt", "json"))
        counts = []
        for listing in (plain, rows):
            stage = _stage(listing)
            stage.reader = BlockReader(listing.root, listing.kind, options=ReadOptions(in_flight=8, cache=None))
            server.reset_counts()
            block = stage(listing.columns().take(np.arange(len(listing))))
            counts.append(server.count("GetObject"))
            stage.reader.close()
        assert block["fields"]["txt"] == [f"caption {i}" for i in range(12)]
        assert block["fields"]["json"] == [{"i": i} for i in range(12)]
        assert counts[1] == counts[0] >= 1
