"""WebDataset tar shards: listing (brace patterns, keys, labels, truncation), reading and the stage."""

import logging

import image_factory as f
import numpy as np
import pytest
from image_factory import sample, write_shard
from wrapped_fs import wrapped

from raypipe.config import DecodeConfig, EvalAugment
from raypipe.kernels.errors import BAD_LABEL, NULL_IMAGE, TRUNCATED
from raypipe.sources import BlockReader, detect_kind, open_source
from raypipe.sources.formats.shard_paths import expand_braces, has_braces, shard_paths
from raypipe.stages.augment import AugmentStage, StageSpec

pytestmark = pytest.mark.timeout(120)


def _batch(rows):
    return {k: rows.table.column(k).to_numpy(zero_copy_only=False) for k in rows.table.column_names}


def test_brace_patterns():
    assert expand_braces("s-{0000..0003}.tar") == [f"s-{i:04d}.tar" for i in range(4)]
    assert expand_braces("s-{8..11}.tar") == ["s-8.tar", "s-9.tar", "s-10.tar", "s-11.tar"]
    assert expand_braces("{train,val}-{0..1}.tar") == ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"] and expand_braces("a{b}.tar") == ["a{b}.tar"]
    assert has_braces("s3://b/s-{0..9}.tar") and not has_braces("dir/{x}/a.tar")


def test_listing_ids_keys_labels(tmp_path):
    d = tmp_path / "wds"
    write_shard(d / "b.tar", sample("x/k0", 3) + sample("x/k1", 1))
    write_shard(
        d / "a.tar",
        [
            *sample("dir.v2/img0", 0),  # a dotted folder; the key is dir.v2/img0
            ("dir.v2/img0.json", b"{}"),  # another member of the same sample
            ("__meta__.json", b"{}"),  # no image, no .cls: not a sample
            *sample("n/nolabel", None, ext="png"),  # no .cls: bad_label
            *sample("n/badlabel", "cat"),
            *sample("n/neg", -2),
            ("n/onlycls.cls", b"4"),  # a label, no image: null_image
            *sample("n/" + "long" * 40, 2),  # a name only pax headers can hold
            ("n/seg.seg.png", b"mask"),
            ("n/seg.jpg", b"img"),
            ("n/seg.cls", b" 5\n"),  # seg.png is no image
            ("n/x.0.jpg", b"?"),  # key n/x, extension "0.jpg": no image
        ],
    )
    assert detect_kind(str(d)) == "webdataset"
    rows = open_source(str(d))
    t = rows.table.to_pydict()
    assert rows.kind == "webdataset" and rows.extra["shards"] == ("a.tar", "b.tar")
    assert t["sample_id"] == list(range(9)) and t["path"] == ["a.tar"] * 7 + ["b.tar"] * 2
    assert t["member"] == [
        "dir.v2/img0.jpg",
        "n/nolabel.png",
        "n/badlabel.jpg",
        "n/neg.jpg",
        "n/onlycls.cls",
        f"n/{'long' * 40}.jpg",
        "n/seg.jpg",
        "x/k0.jpg",
        "x/k1.jpg",
    ]
    assert t["label"] == [0, -1, -1, -1, 4, 2, 5, 3, 1]
    assert t["shard"] == [0] * 7 + [1] * 2 and rows.num_shards == 2
    reasons = [e.split(":")[0] if e else None for e in t["error"]]
    assert reasons == [None, BAD_LABEL, BAD_LABEL, BAD_LABEL, NULL_IMAGE, None, None, None, None]
    out = BlockReader(rows.root, "webdataset").read_block(_batch(rows))
    good = [i for i, e in enumerate(t["error"]) if e is None]
    assert [out[i] for i in good] == [b"img:dir.v2/img0", b"img:n/" + b"long" * 40, b"img", b"img:x/k0", b"img:x/k1"]


def test_shard_paths_prefix_file_and_braces(tmp_path):
    for i in range(3):
        write_shard(tmp_path / f"train-{i:02d}.tar", sample(f"k{i}", i))
    write_shard(tmp_path / "val-00.tar", sample("v", 0))
    root, rels = shard_paths(str(tmp_path / "train-"))
    assert rels == ["train-00.tar", "train-01.tar", "train-02.tar"]
    assert detect_kind(str(tmp_path / "train-")) == "webdataset"
    assert shard_paths(str(tmp_path / "val-00.tar"))[1] == ["val-00.tar"]
    rows = open_source(str(tmp_path / "train-{00..02}.tar"))
    assert rows.table.column("label").to_pylist() == [0, 1, 2]
    assert open_source(str(tmp_path / "{val,train}-00.tar")).table.column("path").to_pylist() == [
        "train-00.tar",
        "val-00.tar",
    ]  # sorted by name, whatever the pattern's order
    with pytest.raises(ValueError, match="do not exist"):
        open_source(str(tmp_path / "train-{00..05}.tar"))


def test_truncated_shard_lists_what_it_can_and_says_so(tmp_path, caplog):
    whole = tmp_path / "whole.tar"
    write_shard(whole, sum((sample(f"k{i}", i, image=bytes(1000)) for i in range(6)), []))
    data = whole.read_bytes()
    d = tmp_path / "wds"
    d.mkdir()
    rows = open_source(str(whole))
    cut = int(rows.table.column("offset")[3].as_py()) + 500  # inside the 4th image
    (d / "s.tar").write_bytes(data[:cut])
    with caplog.at_level(logging.WARNING):
        rows = open_source(str(d))
    t = rows.table.to_pydict()
    assert t["member"] == ["k0.jpg", "k1.jpg", "k2.jpg", "k3.jpg"]  # k4, k5 were never seen
    assert t["error"][:3] == [None] * 3 and t["error"][3].startswith(TRUNCATED)
    (incomplete,) = rows.extra["incomplete_shards"]
    assert incomplete["listed_samples"] == 4 and incomplete["shard_bytes"] == cut
    assert "s.tar" in caplog.text and "not in the dataset" in caplog.text
    # cut between members, past the end marker's start: listed in full but reported as maybe incomplete
    end = int(rows.table.column("offset")[2].as_py()) + 1024 + 512 + 512  # k2.jpg, then k2.cls
    (d / "s.tar").write_bytes(data[:end])
    rows = open_source(str(d))
    assert len(rows) == 3 and rows.table.column("error").to_pylist()[2] is None
    assert "end-of-archive" in rows.extra["incomplete_shards"][0]["reason"]
    (d / "s.tar").write_bytes(data)
    assert open_source(str(d)).extra["incomplete_shards"] == []


def test_corrupt_member_is_a_counted_skip_in_the_stage(tmp_path):
    d = tmp_path / "wds"
    good = f.photo_jpeg(size=(64, 48))
    write_shard(d / "s-0.tar", sample("a", 0, good) + sample("b", 1, f.truncated_jpeg()) + sample("c", 2, b"junk"))
    write_shard(d / "s-1.tar", sample("d", 1, good) + sample("e", None, good))
    rows = open_source(str(d / "s-{0..1}.tar"))
    spec = StageSpec(
        kind=rows.kind, root=rows.root, augment=EvalAugment(input_size=16), decode=DecodeConfig(), seed=0, epoch=0
    )
    out = AugmentStage(spec)(_batch(rows))
    assert out["ok"].tolist() == [True, False, False, True, False]
    assert out["reason"][1] in ("truncated", "decode_error") and out["reason"][2] == "not_an_image"
    assert out["reason"][4] == BAD_LABEL
    assert out["path"][2].endswith("s-0.tar#c.jpg")
    assert np.array_equal(out["image"][0], out["image"][3])


def test_remote_listing_and_reads_match_local(tmp_path):
    d = tmp_path / "wds"
    for s in range(3):
        write_shard(
            d / f"s-{s}.tar", sum((sample(f"k{s}{i}", i, image=bytes([i]) * (700 * i + 1)) for i in range(5)), [])
        )
    local = open_source(str(d))
    fs, handler = wrapped(fail_first=1)  # every first open fails (connection reset): retried
    remote = open_source(str(d), kind="webdataset", filesystem=fs)
    assert not remote.root.is_local
    # the same rows; only the remote listing records each shard's size and time (for the reader's cache)
    store = ["object_size", "object_mtime_ns"]
    assert remote.table.drop_columns(store).equals(local.table.drop_columns(store))
    assert set(local.table.column("object_size").to_pylist()) == {-1}
    shards = remote.table.column("path").to_pylist()
    assert remote.table.column("object_size").to_pylist() == [(d / s).stat().st_size for s in shards]
    assert remote.table.column("object_mtime_ns").to_pylist() == [(d / s).stat().st_mtime_ns for s in shards]
    assert BlockReader(remote.root, "webdataset").read_block(_batch(remote)) == BlockReader(
        local.root, "webdataset"
    ).read_block(_batch(local))


def test_remote_members_close_together_share_a_request(tmp_path):
    d = tmp_path / "wds"
    write_shard(d / "s.tar", sum((sample(f"k{i}", i) for i in range(20)), []))
    fs, handler = wrapped()
    rows = open_source(str(d), kind="webdataset", filesystem=fs)
    handler.attempts.clear()
    reader = BlockReader(rows.root, "webdataset")
    out = reader.read_block(_batch(rows))
    assert out == [f"img:k{i}".encode() for i in range(20)]
    assert sum(handler.attempts.values()) == 1  # one handle, one ranged read for the whole run
