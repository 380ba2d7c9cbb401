"""``ListingOptions``: each bad field refused by name, and the value lists a dataset exactly as today's
keywords do, through ``open_source``, ``Pipeline``, ``convert`` and the command line's flags."""

from __future__ import annotations

import argparse
import pathlib

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from image_factory import sample, write_shard

import raypipe
from raypipe.config import TrainAugment
from raypipe.pipeline import Pipeline
from raypipe.sources import ListingOptions, ShardListing, open_source
from raypipe.sources.indexes.indexer import index_shards
from raypipe.sources.writing.convert import convert

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kind", "zip"),
        ("image_column", ""),
        ("label_column", 3),
        ("path_column", None),
        ("root", ""),
        ("root", 7),
        ("filesystem", "s3://bucket"),
        ("class_order", "alphabetical"),
        ("class_map", 5),
        ("index", ""),
        ("index", []),
        ("index", ["a.idx", ""]),
        ("index", 3),
        ("by_shard", "yes"),
        ("block_rows", 0),
        ("block_rows", True),
        ("block_rows", 2.5),
        ("max_bytes", 0),
        ("max_bytes", "1GB"),
    ],
)
def test_each_bad_field_is_a_value_error_naming_it(field, value):
    with pytest.raises(ValueError, match=rf"^{field}="):
        ListingOptions(**{field: value})


def test_good_values_are_kept_or_normalised():
    fs = pafs.LocalFileSystem()
    o = ListingOptions(
        kind="manifest",
        root=pathlib.Path("/data"),
        filesystem=fs,
        class_order="sorted",
        class_map={"cat": 0},
        index=["a.idx", "b.idx"],
        by_shard=False,
        block_rows=8,
        max_bytes=1 << 20,
    )
    assert o.root == "/data" and o.index == ("a.idx", "b.idx") and o.filesystem is fs
    assert ListingOptions(class_map=pathlib.Path("map.txt")).class_map == pathlib.Path("map.txt")
    with pytest.raises(AttributeError):
        o.kind = "folder"  # frozen
    with pytest.raises(TypeError):
        ListingOptions("folder")  # keyword-only


def test_the_value_and_keywords_together_are_refused():
    assert ListingOptions.of(None, kind="folder") == ListingOptions(kind="folder")
    given = ListingOptions(kind="folder")
    assert ListingOptions.of(given) is given
    with pytest.raises(ValueError, match="not both"):
        ListingOptions.of(given, root="/data")
    with pytest.raises(ValueError, match="^options="):
        ListingOptions.of({"kind": "folder"})
    with pytest.raises(TypeError, match="kindd"):
        ListingOptions.of(kindd="folder")


def test_changed_names_the_fields_off_their_defaults():
    o = ListingOptions(index="dali", block_rows=256, max_bytes=10)
    assert o.changed("kind", "index", "block_rows", "max_bytes") == ["index", "max_bytes"]


def test_exported_from_the_package():
    assert "ListingOptions" in raypipe.__all__ and raypipe.ListingOptions is ListingOptions


def _same(a, b) -> None:
    assert type(a) is type(b) and a.kind == b.kind and len(a) == len(b)
    assert a.digest() == b.digest() and a.classes == b.classes
    if not isinstance(a, ShardListing):
        assert a.table.equals(b.table)


def test_a_folder_lists_the_same_with_keywords_or_the_value(sample_dir):
    keywords = dict(class_order="sorted", class_map={"00_astronaut": 3, "01_chelsea": 1})
    old = open_source(str(sample_dir), **keywords)
    _same(open_source(str(sample_dir), options=ListingOptions(**keywords)), old)
    _same(open_source(str(sample_dir), options=ListingOptions(kind="folder", **keywords)), old)
    assert (
        Pipeline(str(sample_dir), TrainAugment(input_size=16), listing=ListingOptions(**keywords)).rows.digest()
        == old.digest()
    )
    assert old.digest() != open_source(str(sample_dir)).digest()  # the options did change the listing


def test_a_manifest_lists_the_same_with_keywords_or_the_value(sample_dir, tmp_path):
    files = sorted(p.relative_to(sample_dir).as_posix() for p in sample_dir.rglob("*.jpg"))
    manifest = tmp_path / "list.csv"
    manifest.write_text("file,cls\n" + "".join(f"{p},{p.split('/')[0]}\n" for p in files), encoding="utf-8")
    keywords = dict(root=str(sample_dir), path_column="file", label_column="cls", class_order="sorted")
    old = open_source(str(manifest), **keywords)
    assert len(old) == len(files) and old.kind == "manifest"
    _same(open_source(str(manifest), options=ListingOptions(**keywords)), old)


def test_parquet_lists_the_same_with_keywords_or_the_value(sample_dir, tmp_path):
    files = sorted(sample_dir.rglob("*.jpg"))[:6]
    table = pa.table({"img": [p.read_bytes() for p in files], "y": list(range(6))})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=4)
    old = open_source(str(tmp_path / "d.parquet"), image_column="img", label_column="y")
    _same(open_source(str(tmp_path / "d.parquet"), options=ListingOptions(image_column="img", label_column="y")), old)


def test_an_indexed_webdataset_lists_the_same_with_keywords_or_the_value(tmp_path):
    d = tmp_path / "wds"
    for s in range(2):
        write_shard(d / f"shard-{s}.tar", [m for i in range(3) for m in sample(f"s{s}k{i}", i)])
    index_shards(str(d), out=str(tmp_path / "elsewhere.parquet"), use_ray=False)
    index = str(tmp_path / "elsewhere.parquet")
    for keywords in (dict(index=index), dict(index=index, by_shard=False), dict(kind="webdataset", by_shard=None)):
        _same(open_source(str(d), options=ListingOptions(**keywords)), open_source(str(d), **keywords))
    index_shards(str(d), use_ray=False)  # raypipe's own beside the shards: listed by shard on request
    by_shard = open_source(str(d), by_shard=True)
    assert isinstance(by_shard, ShardListing)
    _same(open_source(str(d), options=ListingOptions(by_shard=True)), by_shard)


def test_open_source_refuses_what_does_not_fit_the_data(sample_dir):
    rows = open_source(str(sample_dir))
    assert open_source(rows) is rows  # a listing is taken as it is
    with pytest.raises(ValueError, match="taken as it is"):
        open_source(rows, options=ListingOptions(kind="folder"))
    with pytest.raises(ValueError, match="not both"):
        open_source(str(sample_dir), options=ListingOptions(), kind="folder")
    with pytest.raises(ValueError, match="block_rows= .*Ray Dataset"):
        open_source(str(sample_dir), block_rows=16)
    with pytest.raises(ValueError, match="^class_order="):
        open_source(str(sample_dir), class_order="random")


def test_convert_takes_the_value_and_refuses_a_second_filesystem(sample_dir, tmp_path):
    with pytest.raises(ValueError, match="not both"):  # refused before any shard is written or Ray started
        convert(str(sample_dir), str(tmp_path / "out"), filesystem=pafs.LocalFileSystem(), options=ListingOptions())
    assert not (tmp_path / "out").exists()


def test_the_command_lines_source_flags_make_the_value():
    from raypipe.cli.common import listing_from_args
    from raypipe.flags import add_source_args

    parser = argparse.ArgumentParser()
    add_source_args(parser)
    args = parser.parse_args(["data.csv", "--kind", "manifest", "--path-column", "file", "--root", "/photos"])
    assert listing_from_args(args) == ListingOptions(kind="manifest", path_column="file", root="/photos")
    args = parser.parse_args(["shards", "--index", "dali"])
    assert listing_from_args(args) == ListingOptions(index="dali")
