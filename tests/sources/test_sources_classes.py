"""Class indices: timm's natural order by default, torchvision's plain sort on request, class maps."""

from __future__ import annotations

import json
import os

import pytest

from raypipe.sources import open_source
from raypipe.sources.classes import load_class_map, natural_key, order_classes

NAMES = ["c1", "c10", "c2", "C3", "b", "c02x", "n01440764", "n01443537"]


def _folder(tmp_path, classes, per_class=2):
    for c in classes:
        os.makedirs(tmp_path / c)
        for i in range(per_class):
            (tmp_path / c / f"img{i}.jpg").write_bytes(b"x")
    return tmp_path


def _labels_by_class(rows) -> dict[str, int]:
    t = rows.table.to_pydict()
    return {p.split("/")[0]: lbl for p, lbl in zip(t["path"], t["label"], strict=True)}


def test_natural_key_equals_timms():
    from timm.utils.misc import natural_key as timm_key

    for name in NAMES + ["", "abc", "12", "a1b22c333", "Img_007.JPG"]:
        assert natural_key(name) == timm_key(name)
    assert order_classes(["c1", "c10", "c2"]) == ["c1", "c2", "c10"]
    assert order_classes(["c1", "c10", "c2"], "sorted") == ["c1", "c10", "c2"]
    assert order_classes(["a", "A", "c01", "c1"]) == ["A", "a", "c01", "c1"]  # ties: plain text, not set order
    with pytest.raises(ValueError, match="class_order"):
        order_classes([], "alphabetical")


def test_folder_indices_equal_timms_create_dataset(tmp_path):
    from timm.data import create_dataset

    root = _folder(tmp_path, ["c1", "c2", "c10"])
    rows = open_source(str(root))
    timm_ds = create_dataset("", root=str(root))
    assert rows.classes == ("c1", "c2", "c10")
    assert _labels_by_class(rows) == timm_ds.reader.class_to_idx == {"c1": 0, "c2": 1, "c10": 2}
    ours = sorted(zip(rows.table.column("path").to_pylist(), rows.table.column("label").to_pylist(), strict=True))
    theirs = sorted((os.path.relpath(p, root), t) for p, t in timm_ds.reader.samples)
    assert ours == theirs
    assert rows.table.column("sample_id").to_pylist() == list(range(len(rows)))


def test_more_names_equal_timms_and_sorted_equals_torchvision(tmp_path):
    from timm.data import ImageDataset
    from torchvision.datasets import ImageFolder

    root = _folder(tmp_path, NAMES, per_class=1)
    assert _labels_by_class(open_source(str(root))) == ImageDataset(str(root)).reader.class_to_idx
    plain = open_source(str(root), class_order="sorted")
    assert _labels_by_class(plain) == ImageFolder(str(root)).class_to_idx


@pytest.mark.parametrize("kind", ["dict", "txt", "json_list", "json_dict", "csv", "csv_header"])
def test_class_map_as_timm_reads_it(tmp_path, kind):
    from timm.data import ImageDataset

    data = _folder(tmp_path / "data", ["c1", "c2", "c10", "extra"])
    order = ["c10", "c1", "c2"]  # a map that differs from every sort
    txt = tmp_path / "map.txt"
    txt.write_text("\n".join(order) + "\n")
    files = {
        "txt": txt,
        "json_list": (tmp_path / "map.json", json.dumps(order)),
        "json_dict": (tmp_path / "mapd.json", json.dumps({c: i for i, c in enumerate(order)})),
        "csv": (tmp_path / "map.csv", "c10,0\nc1,1\nc2,2\n"),
        "csv_header": (tmp_path / "maph.csv", "class,index\nc10,0\nc1,1\nc2,2\n"),
    }
    if kind == "dict":
        class_map = {c: i for i, c in enumerate(order)}
    elif kind == "txt":
        class_map = str(txt)
    else:
        path, text = files[kind]
        path.write_text(text)
        class_map = str(path)
    rows = open_source(str(data), class_map=class_map)
    timm_ds = ImageDataset(str(data), class_map=str(txt))
    assert _labels_by_class(rows) == timm_ds.reader.class_to_idx == {"c10": 0, "c1": 1, "c2": 2}
    assert rows.classes == ("c10", "c1", "c2")
    assert rows.extra["unmapped_classes"] == ("extra",)  # not listed, as in timm; named, not forgotten
    assert len(rows) == len(timm_ds) == 6


def test_class_map_relative_to_the_root_and_bad_maps(tmp_path):
    root = _folder(tmp_path, ["a", "b"])
    (root / "classes.txt").write_text("b\na\n")
    assert _labels_by_class(open_source(str(root), class_map="classes.txt")) == {"b": 0, "a": 1}
    pkl = tmp_path / "map.pkl"
    pkl.write_bytes(b"\x80\x04.")
    with pytest.raises(ValueError, match="pickle"):
        open_source(str(root), class_map=str(pkl))
    bad = [({}, "empty"), ({"a": -1}, "index"), ({"a": 0, "b": 0}, "share index"), ({"a": True}, "index")]
    for mapping, message in bad:
        with pytest.raises(ValueError, match=message):
            load_class_map(mapping)
    dup = tmp_path / "dup.txt"
    dup.write_text("a\nb\na\n")
    with pytest.raises(ValueError, match="twice"):
        load_class_map(str(dup))
    with pytest.raises(ValueError, match="none of its class folders"):
        open_source(str(root), class_map={"zebra": 0})
    with pytest.raises(ValueError, match="cannot read"):
        load_class_map(str(tmp_path / "missing.txt"))


def test_manifest_class_names_follow_the_folder_order(tmp_path):
    m = tmp_path / "m.csv"
    m.write_text("path,label\na.jpg,c10\nb.jpg,c2\nc.jpg,c1\nd.jpg,zebra\n")
    assert open_source(str(m)).classes == ("c1", "c2", "c10", "zebra")
    assert open_source(str(m), class_order="sorted").classes == ("c1", "c10", "c2", "zebra")
    rows = open_source(str(m), class_map={"c10": 0, "c2": 1, "c1": 2})
    assert rows.table.column("label").to_pylist() == [0, 1, 2, -1]  # a name the map lacks: bad label
    assert rows.table.column("error").to_pylist()[3].startswith("bad_label")
