import dataclasses
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.kernels.errors import OUTSIDE_ROOT, SkipImage
from raypipe.sources import detect_kind, open_root, open_source
from raypipe.sources.transport.paths import DatasetRoot


def _touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_folder_listing_matches_torchvision_imagefolder(sample_dir, tmp_path):
    from torchvision.datasets import ImageFolder

    rows = open_source(str(sample_dir), class_order="sorted")  # torchvision's plain sort
    tv = ImageFolder(str(sample_dir))
    assert list(rows.classes) == tv.classes
    ours = [
        (os.path.join(str(sample_dir), p), lbl)
        for p, lbl in zip(rows.table.column("path").to_pylist(), rows.table.column("label").to_pylist(), strict=True)
    ]
    assert ours == [(os.path.realpath(p), lbl) for p, lbl in tv.samples]
    assert rows.table.column("sample_id").to_pylist() == list(range(len(tv.samples)))


def test_a_pathlib_path_lists_what_its_string_lists_and_other_types_are_refused(sample_dir, tmp_path):
    pq.write_table(pa.table({"image": [b"x"], "label": [0]}), tmp_path / "t.parquet")
    for data in (sample_dir, tmp_path / "t.parquet"):
        assert open_source(data).digest() == open_source(str(data)).digest()
    with pytest.raises(TypeError, match="expected a path or URI.*not int"):
        open_source(3)


def test_folder_extensions_case_insensitive_and_nested(tmp_path):
    for name in ["b/x.JPG", "b/sub/y.png", "b/z.txt", "a/w.WebP", "a/notes.md", "a/q.TIFF"]:
        _touch(tmp_path / name)
    rows = open_source(str(tmp_path))
    assert rows.classes == ("a", "b")
    assert rows.table.column("path").to_pylist() == ["a/q.TIFF", "a/w.WebP", "b/x.JPG", "b/sub/y.png"]
    assert rows.table.column("label").to_pylist() == [0, 0, 1, 1]


def test_non_utf8_names_are_listed_and_read(tmp_path):
    from torchvision.datasets import ImageFolder

    try:
        for name, data in [(b"a/ok.jpg", b"1"), (b"a/bad\xff.jpg", b"2"), (b"b\xfe/x.jpg", b"3"), (b"c/y.jpg", b"4")]:
            _touch(tmp_path / os.fsdecode(name), data)
    except OSError:
        pytest.skip("this filesystem only takes UTF-8 file names")
    rows = open_source(str(tmp_path))
    tv = ImageFolder(str(tmp_path), loader=lambda p: p, is_valid_file=lambda p: True)
    # the same rows and label indices as torchvision; the class folder's name is shown escaped
    assert rows.table.column("label").to_pylist() == [lbl for _, lbl in tv.samples] == [0, 0, 1, 2]
    assert rows.classes == ("a", "b\\xfe", "c")
    assert rows.table.column("error").to_pylist() == [None] * 4
    values = rows.table.column("path").to_pylist()
    # each row reads its own file (a name that is not UTF-8 travels as its bytes), and reports show it escaped
    assert [rows.root.read_bytes(v) for v in values] == [b"2", b"1", b"3", b"4"]
    assert rows.root.display(values[0]) == os.path.join(rows.root.root, "a/bad\\xff.jpg")
    assert values[1] == "a/ok.jpg" and rows.root.display(values[1]) == os.path.join(rows.root.root, "a/ok.jpg")


def test_sample_ids_are_stable(sample_dir):
    a = open_source(str(sample_dir)).table
    b = open_source(str(sample_dir)).table
    assert a.equals(b)


def test_symlink_escape_is_listed_then_refused_before_open(tmp_path):
    outside = tmp_path / "outside"
    _touch(outside / "secret.jpg")
    root = tmp_path / "data"
    _touch(root / "c" / "ok.jpg")
    os.symlink(outside / "secret.jpg", root / "c" / "link.jpg")
    os.symlink(outside, root / "c" / "dirlink")  # directory links out of the root are not walked
    rows = open_source(str(root))
    assert sorted(rows.table.column("path").to_pylist()) == ["c/link.jpg", "c/ok.jpg"]
    with pytest.raises(SkipImage) as e:
        rows.root.read_bytes("c/link.jpg")
    assert e.value.reason == OUTSIDE_ROOT
    for bad in ["../outside/secret.jpg", str(outside / "secret.jpg")]:
        with pytest.raises(SkipImage) as e:
            rows.root.resolve(bad)
        assert e.value.reason == OUTSIDE_ROOT


@pytest.mark.parametrize("fast", [True, False], ids=["cached-dir-nofollow", "full-resolve"])
def test_local_reads_stay_inside_the_root_on_both_read_paths(tmp_path, monkeypatch, fast):
    from raypipe.sources.transport import paths

    if not fast:
        monkeypatch.setattr(paths, "_NOFOLLOW", None)  # every read resolves the whole path (the fallback)
    monkeypatch.setattr(paths, "_REAL_DIRS", {})
    outside = tmp_path / "outside"
    _touch(outside / "secret.jpg", b"secret")
    root_dir = tmp_path / "data"
    _touch(root_dir / "c" / "ok.jpg", b"ok")
    _touch(root_dir / "d" / "target.jpg", b"target")
    os.symlink(outside / "secret.jpg", root_dir / "c" / "out.jpg")
    os.symlink(root_dir / "d" / "target.jpg", root_dir / "c" / "in.jpg")  # a link that stays inside
    os.symlink(outside, root_dir / "c" / "dirlink")
    os.symlink(root_dir / "d", root_dir / "dlink")
    (root_dir / "c" / "sub").mkdir()
    root = open_root(str(root_dir))
    for _ in range(2):  # the second pass reads through the cached directories
        assert root.read_bytes("c/ok.jpg") == b"ok"
        assert root.read_bytes("c/in.jpg") == b"target"
        assert root.read_bytes("dlink/target.jpg") == b"target"
        assert root.read_bytes(str(root_dir / "c" / "ok.jpg")) == b"ok"
        assert root.read_bytes("c/sub/../ok.jpg") == b"ok"
        for bad in [
            "c/out.jpg",
            "c/dirlink/secret.jpg",
            "../outside/secret.jpg",
            "c/../../outside/secret.jpg",
            str(outside / "secret.jpg"),
            "..",
            "c/../..",
        ]:
            with pytest.raises(SkipImage) as e:
                root.read_bytes(bad)
            assert e.value.reason == OUTSIDE_ROOT, bad
        for name, reason in [
            ("c/missing.jpg", "missing"),
            ("nodir/x.jpg", "missing"),
            ("c/sub", "unreadable"),
            ("c/..", "unreadable"),
        ]:
            with pytest.raises(SkipImage) as e:
                root.read_bytes(name)
            assert e.value.reason == reason, name


def test_a_directory_swapped_for_an_outside_link_after_a_read_is_refused(tmp_path, monkeypatch):
    """The read path caches each directory's realpath; a class folder replaced afterwards by a symlink
    out of the root must not lead that cached path outside (O_NOFOLLOW guards the last component only)."""
    import shutil

    from raypipe.sources.transport import paths

    monkeypatch.setattr(paths, "_REAL_DIRS", {})
    _touch(tmp_path / "outside" / "x.jpg", b"secret")
    _touch(tmp_path / "data" / "c" / "x.jpg", b"ok")
    root = open_root(str(tmp_path / "data"))
    assert root.read_bytes("c/x.jpg") == b"ok"  # the directory is resolved and cached
    shutil.rmtree(tmp_path / "data" / "c")
    os.symlink(tmp_path / "outside", tmp_path / "data" / "c")
    with pytest.raises(SkipImage) as e:
        root.read_bytes("c/x.jpg")
    assert e.value.reason == OUTSIDE_ROOT


def test_remote_root_refuses_dotdot():
    root = DatasetRoot(root="bucket/data", filesystem=pa.fs.LocalFileSystem(), uri="s3://bucket/data")
    assert root.resolve("c/x.jpg") == "bucket/data/c/x.jpg"
    with pytest.raises(SkipImage, match="outside"):
        root.resolve("../other/x.jpg")
    with pytest.raises(SkipImage, match="outside"):
        root.resolve("c/../../other/x.jpg")


def test_manifest_csv_and_jsonl_with_bad_labels(tmp_path):
    (tmp_path / "img").mkdir()
    csv = tmp_path / "m.csv"
    csv.write_text("path,label\nimg/a.jpg,3\nimg/b.jpg,\nimg/c.jpg,cat\n../x.jpg,1\n")
    rows = open_source(str(csv))
    assert rows.kind == "manifest"
    t = rows.table.to_pydict()
    assert t["label"] == [3, -1, -1, 1]
    assert t["error"][0] is None and t["error"][3] is None
    assert t["error"][1].startswith("bad_label") and t["error"][2].startswith("bad_label")
    with pytest.raises(SkipImage):
        rows.root.resolve(t["path"][3])
    jl = tmp_path / "m.jsonl"
    jl.write_text('{"path": "img/a.jpg", "label": 2}\n\n{"path": "img/b.jpg", "label": 2.5}\n{"path": "img/c.jpg"}\n')
    t = open_source(str(jl)).table.to_pydict()
    assert t["label"] == [2, -1, -1] and t["sample_id"] == [0, 1, 2]


def test_manifest_table_holds_only_its_columns(tmp_path):
    """A manifest's rows are files no store listed: sample_id, label, path, and error only when a line
    is bad; every other column reads as its default, and the digest is the one the full table had."""
    from raypipe.sources.table import COLUMN_DEFAULTS, column_or_default, make_rows

    m = tmp_path / "m.csv"
    m.write_text("path,label\nc1/a.jpg,c1\nc2/b.jpg,c2\nc10/c.jpg,c10\n")
    rows = open_source(str(m))
    assert rows.table.schema == pa.schema([("sample_id", pa.int64()), ("label", pa.int64()), ("path", pa.string())])
    assert rows.table.column("label").to_pylist() == [0, 1, 2] and rows.num_shards == 3
    assert column_or_default(rows.table, "error").to_pylist() == [None] * 3
    assert column_or_default(rows.table, "shard").to_pylist() == [0, 1, 2]
    full = make_rows(["c1/a.jpg", "c2/b.jpg", "c10/c.jpg"], [0, 1, 2], header_crcs=[-1] * 3)
    for name in COLUMN_DEFAULTS:
        assert column_or_default(rows.table, name).to_pylist() == full.column(name).to_pylist(), name
    assert rows.digest() == dataclasses.replace(rows, table=full).digest()
    np.testing.assert_array_equal(rows.split_keys(), dataclasses.replace(rows, table=full).split_keys())
    m.write_text("path,label\na.jpg,1\nb.jpg,x\n")
    assert open_source(str(m)).table.column_names == ["sample_id", "label", "path", "error"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_manifest_read_by_arrow_gives_the_rows_of_the_line_by_line_read(tmp_path, fmt):
    """The Arrow readers and the line-by-line read (kept for files those readers refuse) list the same
    rows: paths, labels, errors, classes."""
    from raypipe.sources.formats import manifest

    lines = [(f"n{c:08d}/n{c:08d}_{i}.JPEG", f"n{c:08d}") for i in range(40) for c in (7, 1, 30)]
    lines += [("x/bad.jpg", ""), ("x/cat.jpg", "cat"), (" spaced .jpg", " n00000001 ")]
    m = tmp_path / f"m.{fmt}"
    if fmt == "csv":
        m.write_text("path,label\n" + "".join(f"{p},{lbl}\n" for p, lbl in lines))
    else:
        m.write_text("".join(f'{{"path": "{p}", "label": "{lbl}"}}\n' for p, lbl in lines))
    droot = open_root(str(tmp_path))

    def labelled(values):
        return manifest._label_values(values, "natural", None, droot)

    args = (str(m), fmt, None, ("path", "label"), labelled)
    paths, labels, errors, names, sets = manifest._rows_by_arrow(*args)
    assert sets is None  # one label per row
    want_paths, want_labels, want_errors, want_names = manifest._rows_by_line(*args)
    assert paths.to_pylist() == want_paths.to_pylist() == [p for p, _ in lines]
    assert labels.tolist() == want_labels.tolist() and errors.to_pylist() == want_errors.to_pylist()
    assert names == want_names
    assert labels.dtype == np.int64 and pa.types.is_string(paths.type)


def test_manifest_missing_path_column_is_an_error(tmp_path):
    m = tmp_path / "m.csv"
    m.write_text("file,label\na.jpg,1\n")
    with pytest.raises(ValueError, match="'path'"):
        open_source(str(m))


def test_manifest_class_names_are_numbered_in_sorted_order(tmp_path):
    """Labels given as class names (none an integer) are numbered as the folder source numbers folders."""
    m = tmp_path / "m.csv"
    m.write_text("path,label\na.jpg,dog\nb.jpg, cat\nc.jpg,\nd.jpg,n01440764\ne.jpg,dog\n")
    rows = open_source(str(m))
    assert rows.classes == ("cat", "dog", "n01440764") and rows.num_classes == 3
    t = rows.table.to_pydict()
    assert t["label"] == [1, 0, -1, 2, 1]
    assert [e is None for e in t["error"]] == [True, True, False, True, True]  # the empty one is a bad label
    jl = tmp_path / "m.jsonl"
    jl.write_text('{"path": "a.jpg", "label": "zebra"}\n{"path": "b.jpg", "label": "ant"}\n{"path": "c.jpg"}\n')
    rows = open_source(str(jl))
    assert rows.classes == ("ant", "zebra") and rows.table.column("label").to_pylist() == [1, 0, -1]


def test_manifest_numbers_stay_numbers(tmp_path):
    """Numeric labels are never names: "3.0" (a float column as pandas writes it) is 3; "-1", "2.5" and a
    digit Python cannot convert ("²", which str.isdigit accepts) are bad labels, not classes or a crash."""
    m = tmp_path / "m.csv"
    m.write_text("path,label\na.jpg,3.0\nb.jpg,-1\nc.jpg,2.5\nd.jpg,\u00b2\n", encoding="utf-8")
    rows = open_source(str(m))
    assert rows.classes == ()
    assert rows.table.column("label").to_pylist() == [3, -1, -1, -1]
    m.write_text("path,label\na.jpg,-1\nb.jpg,2.5\n")
    assert open_source(str(m)).classes == ()


def test_manifest_header_bom_spaces_and_missing_label_column(tmp_path):
    m = tmp_path / "m.csv"
    m.write_bytes("\ufeffpath, label\na.jpg,1\n".encode("utf-8"))  # as a spreadsheet exports it
    assert open_source(str(m)).table.to_pydict()["label"] == [1]
    m.write_text("path,class\na.jpg,1\n")
    with pytest.raises(ValueError, match="no column 'label'"):
        open_source(str(m))
    jl = tmp_path / "m.jsonl"
    jl.write_text('{"path": "a.jpg", "class": 1}\n')
    with pytest.raises(ValueError, match="no record has a 'label'"):
        open_source(str(jl))


def test_eval_rows_are_numbered_like_the_training_rows(tmp_path):
    """An eval folder missing a class would shift every later label: its names are renumbered."""
    for split, classes in (("train", ["ant", "bee", "cat"]), ("val", ["ant", "cat"])):
        for c in classes:
            _touch(tmp_path / split / c / "x.jpg")
    train, val = open_source(str(tmp_path / "train")), open_source(str(tmp_path / "val"))
    assert val.table.column("label").to_pylist() == [0, 1]
    aligned = val.numbered_like(train.classes)
    assert aligned.classes == train.classes and aligned.table.column("label").to_pylist() == [0, 2]
    assert aligned.table.column("path").to_pylist() == val.table.column("path").to_pylist()
    assert train.numbered_like(train.classes) is train
    with pytest.raises(ValueError, match="bee"):
        train.numbered_like(val.classes)


def _write_parquet(path, n, start_label=0, null_at=()):
    labels = [None if i in null_at else (start_label + i) % 3 for i in range(n)]
    table = pa.table({"image": [b"img%d" % i for i in range(n)], "label": pa.array(labels, pa.int64())})
    pq.write_table(table, path, row_group_size=4)


def test_parquet_folder_ids_follow_sorted_files(tmp_path):
    d = tmp_path / "pq"
    d.mkdir()
    _write_parquet(d / "b.parquet", 5)
    _write_parquet(d / "a.parquet", 3, null_at=(1,))
    assert detect_kind(str(d)) == "parquet"
    rows = open_source(str(d))
    t = rows.table.to_pydict()
    assert t["path"] == ["a.parquet"] * 3 + ["b.parquet"] * 5
    assert t["row"] == [0, 1, 2, 0, 1, 2, 3, 4]
    assert t["sample_id"] == list(range(8))
    assert t["error"][1].startswith("bad_label") and t["label"][1] == -1


def test_parquet_missing_column_names_it(tmp_path):
    f = tmp_path / "x.parquet"
    pq.write_table(pa.table({"img": [b"a"], "label": [1]}), f)
    with pytest.raises(ValueError, match="'image'"):
        open_source(str(f))
    rows = open_source(str(f), image_column="img")
    assert len(rows) == 1


def test_detect_kind(tmp_path, sample_dir):
    assert detect_kind(str(sample_dir)) == "folder"
    assert detect_kind(str(tmp_path / "m.csv")) == "manifest"
    assert detect_kind(str(tmp_path / "m.jsonl")) == "manifest"
    with pytest.raises(ValueError, match="does not exist"):
        detect_kind(str(tmp_path / "nope"))


def test_open_root_local_uri(tmp_path):
    r = open_root(f"file://{tmp_path}")
    assert r.is_local and r.root == os.path.realpath(tmp_path)
    assert np.array_equal(1, 1)


def test_unsigned_and_out_of_range_labels(tmp_path):
    """A uint8 label column lists (it had no room for a bad row's -1); a label past int64 in a manifest
    is a bad label for that row, not an OverflowError for the whole listing."""
    u8 = pa.table({"image": [b"a", b"b", b"c"], "label": pa.array([0, 255, 2], pa.uint8())})
    pq.write_table(u8, tmp_path / "u.parquet")
    assert open_source(str(tmp_path / "u.parquet")).table.column("label").to_pylist() == [0, 255, 2]
    u64 = pa.table({"image": [b"a", b"b"], "label": pa.array([1, 2**64 - 1], pa.uint64())})
    pq.write_table(u64, tmp_path / "big.parquet")
    t = open_source(str(tmp_path / "big.parquet")).table.to_pydict()
    assert t["label"] == [1, -1] and t["error"][1].startswith("bad_label")
    m = tmp_path / "m.csv"
    m.write_text("path,label\na.jpg,0\nb.jpg,99999999999999999999\n")
    t = open_source(str(m)).table.to_pydict()
    assert t["label"] == [0, -1] and t["error"][1].startswith("bad_label")


def test_hints_for_a_parquet_tree_and_a_single_files_rows(tmp_path):
    """A Hugging Face layout (root/data/<split>-*.parquet) read as an image folder names the Parquet
    files; a single Parquet file's rows are shown as the file itself, with no stray slash."""
    (tmp_path / "hf" / "data").mkdir(parents=True)
    _write_parquet(tmp_path / "hf" / "data" / "train-00000-of-00001.parquet", 3)
    with pytest.raises(ValueError, match=r"Parquet files in \['data'\]"):
        open_source(str(tmp_path / "hf"))
    single = open_source(str(tmp_path / "hf" / "data" / "train-00000-of-00001.parquet"))
    assert single.root.display("") == str(tmp_path / "hf" / "data" / "train-00000-of-00001.parquet")


def test_table_columns_equal_pyarrows_own_conversion():
    """``column_array`` reads int64 and string columns through their buffers; it must give what
    ``to_numpy(zero_copy_only=False)`` gives, for sliced and multi-chunk columns and nulls too."""
    from raypipe.sources.table import column_array, int64_array, make_rows, table_columns

    table = make_rows(
        [f"c{i % 3}/é{i}.jpg" for i in range(10)],
        [i % 3 for i in range(10)],
        errors=[None, "bad"] * 5,
        members=[f"m{i}" for i in range(10)],
    )
    two_chunks = pa.concat_tables([table.slice(0, 4), table.slice(4)])
    for t in (table, table.slice(3, 5), two_chunks, table.slice(0, 0)):
        got = table_columns(t)
        for name in t.column_names:
            want = t.column(name).to_numpy(zero_copy_only=False)
            assert got[name].dtype == want.dtype and list(got[name]) == list(want), name
    with_null = pa.chunked_array([pa.array([1, None, 3], type=pa.int64())])
    np.testing.assert_array_equal(column_array(with_null), with_null.to_numpy(zero_copy_only=False))  # NaN for null
    view = column_array(table.column("sample_id"))
    assert not view.flags.writeable  # the table's own memory
    assert int64_array(np.arange(3)).equals(pa.array([0, 1, 2], type=pa.int64()))
    with pytest.raises(ValueError, match="1-D"):
        int64_array(np.zeros((2, 2)))


def test_a_chunks_rows_from_table_columns_equal_a_take_of_the_numpy_columns():
    """``TableColumns.take`` (strings kept in Arrow, converted per chunk) gives exactly what indexing the
    numpy columns gives: keys in order, dtypes, values, nulls, for sliced and many-chunk tables."""
    from raypipe.sources.table import TableColumns, make_file_rows, make_rows, string_array, table_columns

    n = 50
    table = make_rows(
        [f"c{i % 3}/é{i}.jpg" for i in range(n)],
        [i % 3 for i in range(n)],
        errors=[None, "bad"] * (n // 2),
        members=[f"m{i}" if i % 4 else None for i in range(n)],
        shards=np.arange(n) // 7,
    )
    many = pa.concat_tables([table.slice(a, 9) for a in range(0, n, 9)])
    manifest = make_file_rows(pa.chunked_array([string_array(["a.jpg", "b.jpg"]), string_array(["c.jpg"])]), [0, 1, 2])
    rng = np.random.default_rng(0)
    for t in (table, table.slice(3, 40), many, manifest, table.slice(0, 0)):
        columns, want_all = TableColumns(t), table_columns(t)
        assert len(columns) == t.num_rows
        picks = [np.arange(t.num_rows), np.arange(t.num_rows)[::-1], np.empty(0, np.int64)]
        if t.num_rows:
            picks += [rng.integers(0, t.num_rows, size=k) for k in (1, 5, 30)]
            picks += [np.array([t.num_rows - 1, 0], np.int32)]
        for idx in picks:
            got = columns.take(idx)
            want = {name: col[idx] for name, col in want_all.items()}
            assert list(got) == list(want)
            for name in want:
                assert got[name].dtype == want[name].dtype and got[name].tolist() == want[name].tolist(), name
    with pytest.raises(IndexError):
        TableColumns(table).take(np.array([n]))


def test_the_table_of_formats_has_a_row_for_every_kind_listing_options_take():
    from raypipe.sources import KINDS
    from raypipe.sources.formats.registry import FORMATS

    assert sorted(FORMATS) == sorted(KINDS)
    assert all(kind == f.kind for kind, f in FORMATS.items())


@pytest.mark.parametrize(
    "name, kind",
    [
        ("a/b.csv", "manifest"),
        ("x.JSONL", "manifest"),
        ("s3://b/t.parquet", "parquet"),
        ("shards/train-0001.tar", "webdataset"),
        ("train-{0000..0009}.tar", "webdataset"),
        ("wids.json", "webdataset"),
        ("photos/", None),
    ],
)
def test_a_paths_own_name_says_its_kind_through_the_table(name, kind):
    from raypipe.sources.formats.registry import kind_by_name

    assert kind_by_name(name) == kind


def test_a_folders_files_say_its_kind_and_raypipes_shard_index_is_no_parquet_dataset():
    from raypipe.sources.formats.registry import kind_by_files
    from raypipe.sources.indexes.shard_index import INDEX_NAME

    assert kind_by_files(["a.parquet", "b.tar"]) == "parquet"
    assert kind_by_files(["x/a.tar", INDEX_NAME]) == "webdataset"
    assert kind_by_files([INDEX_NAME, "notes.txt"]) is None
