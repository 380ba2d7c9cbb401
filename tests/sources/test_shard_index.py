"""Shard indexes: raypipe's own (written by `raypipe index` and by convert), DALI's wds2idx files and wids
shard lists; a listing from an index equals the listing from the tar headers, shards of another size
are listed again from their headers, and an indexed listing over S3 reads a small part of the dataset's
bytes (copies and uploads: tests/sources/test_shard_copies.py)."""

import dataclasses
import json
import logging
import os
import tarfile

import pyarrow.parquet as pq
import pytest
from image_factory import sample, write_shard

from raypipe.cli.main import main as cli_main
from raypipe.sources import open_source
from raypipe.sources.formats.shard_listing import read_footer
from raypipe.sources.indexes.indexer import index_shards
from raypipe.sources.indexes.shard_index import INDEX_NAME, read_index, write_index
from raypipe.sources.transport.paths import open_root
from raypipe.testing import S3Server

pytestmark = pytest.mark.timeout(180)


def _shards(d, n=3, per=6, image_bytes=2000):
    """``n`` shards of ``per`` samples, with the cases listing must keep: a sample without a label, one
    whose label is not a number, a member that is no sample, a name only pax headers hold."""
    for s in range(n):
        members = []
        for i in range(per):
            key = f"s{s}/k{i:03d}" if i != 2 else f"s{s}/" + "long" * 40
            label = None if i == 3 else ("cat" if i == 4 else (s * per + i) % 5)
            members += sample(key, label, image=bytes([i % 256]) * image_bytes)
        members.append(("__meta__.json", b"{}"))
        members += [(f"s{s}/onlycls.cls", b"1")]
        write_shard(d / f"shard-{s:04d}.tar", members)
    return d


def _same(a, b, *, digests=True):
    """The same listing; ``digests=False``: ``a``'s index holds no header digests (a DALI index), the rest
    is the same."""
    if not digests:
        assert set(a.table.column("header_crc").to_pylist()) == {-1}
        a, b = (dataclasses.replace(x, table=x.table.drop(["header_crc"])) for x in (a, b))
    assert a.table.equals(b.table), (a.table.slice(0, 3).to_pydict(), b.table.slice(0, 3).to_pydict())
    assert a.digest() == b.digest() and a.extra == b.extra


def _no_scan(monkeypatch):
    """Listing a shard from its tar headers fails the test from here on."""

    def refuse(*args, **kwargs):
        raise AssertionError("a shard was listed from its tar headers")

    monkeypatch.setattr("raypipe.sources.formats.webdataset._list_shard", refuse)


def test_listing_from_the_index_equals_the_scan(tmp_path, monkeypatch):
    d = _shards(tmp_path / "wds")
    write_shard(d / "shard-0003.tar", sample("t/a", 1) + sample("t/b", 2))
    with open(d / "shard-0003.tar", "r+b") as f:  # cut inside the last member: truncated, listed so far
        f.truncate(512 * 4)
    scanned = open_source(str(d))
    assert scanned.extra["incomplete_shards"] and len(scanned) == 3 * 7 + 1
    some = _scan_only(str(d / "shard-{0001..0002}.tar"))
    report = index_shards(str(d), use_ray=False)
    assert report.shards == 4 and report.samples == len(scanned) and os.path.isfile(d / INDEX_NAME)
    _no_scan(monkeypatch)
    _same(open_source(str(d)), scanned)  # the truncated shard's report too
    _same(open_source(str(d / "shard-{0001..0002}.tar")), some)  # the shards a pattern names


def _scan_only(data):
    from raypipe.sources.formats.webdataset import list_webdataset

    return list_webdataset(data, index=False)  # every shard from its headers


def test_an_index_elsewhere_is_found_by_path(tmp_path, monkeypatch):
    d = _shards(tmp_path / "wds", n=2)
    index_shards(str(d), str(tmp_path / "elsewhere" / "i.parquet"), use_ray=False)
    assert not os.path.exists(d / INDEX_NAME)
    scanned = open_source(str(d))
    _no_scan(monkeypatch)
    _same(open_source(str(d), index=str(tmp_path / "elsewhere" / "i.parquet")), scanned)


def test_a_changed_shard_is_listed_again_from_its_headers(tmp_path, caplog, monkeypatch):
    d = _shards(tmp_path / "wds", n=3)
    index_shards(str(d), use_ray=False)
    write_shard(d / "shard-0001.tar", sample("new/a", 4) + sample("new/b", 0))  # another size, another time
    with caplog.at_level(logging.WARNING, logger="raypipe"):
        rows = open_source(str(d))
    lines = [r.getMessage() for r in caplog.records if "changed since" in r.getMessage()]
    assert len(lines) == 1 and "1 of the 3 shards" in lines[0] and "shard-0001.tar" in lines[0]
    _same(rows, _scan_only(str(d)))
    assert "new/a.jpg" in rows.table.column("member").to_pylist()
    # the same size, another time (a copy's): taken from the index, whose rows each read checks
    # (tests/sources/test_shard_copies.py)
    index_shards(str(d), use_ray=False)
    st = os.stat(d / "shard-0002.tar")
    os.utime(d / "shard-0002.tar", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    caplog.clear()
    with monkeypatch.context() as m, caplog.at_level(logging.INFO, logger="raypipe"):
        _no_scan(m)
        rows = open_source(str(d))
    assert not any("changed since" in r.getMessage() for r in caplog.records)
    assert any("1 of the 3 shards have other times" in r.getMessage() for r in caplog.records)
    _same(rows, _scan_only(str(d)))


def test_index_file_layout(tmp_path):
    d = _shards(tmp_path / "wds", n=2)
    index_shards(str(d), use_ray=False)
    root, records = read_index(str(d / INDEX_NAME))
    assert root == os.path.realpath(d) and sorted(records) == ["shard-0000.tar", "shard-0001.tar"]
    rec = records["shard-0000.tar"]
    st = os.stat(d / "shard-0000.tar")
    assert (rec.size, rec.mtime_ns) == (st.st_size, st.st_mtime_ns) and len(rec) == 7 and rec.keys == 8
    with tarfile.open(d / "shard-0000.tar") as tar:
        first = tar.getmember("s0/k000.jpg")
    assert (rec.offsets[0], rec.sizes[0], rec.members[0]) == (first.offset_data, 2000, "s0/k000.jpg")
    (tmp_path / "other.parquet").write_bytes((d / INDEX_NAME).read_bytes()[:-8] + b"garbage!")
    with pytest.raises(Exception):  # noqa: B017 - pyarrow's own error for a cut Parquet file
        open_source(str(d), index=str(tmp_path / "other.parquet"))


def test_an_index_without_member_rows_has_the_same_footer(tmp_path):
    """``member_rows=False`` writes the footer of the full index and no rows: a listing by shard reads the
    same shards and samples from it."""
    d = _shards(tmp_path / "wds", n=3)
    index_shards(str(d), use_ray=False)
    root, records = read_index(str(d / INDEX_NAME))
    bare = str(tmp_path / "footer.parquet")
    write_index(list(records.values()), bare, root=open_root(root), member_rows=False)
    assert read_footer(None, bare) == read_footer(None, str(d / INDEX_NAME))
    assert pq.read_metadata(bare).num_rows == 0
    full, footer = open_source(str(d), by_shard=True), open_source(str(d), index=bare, by_shard=True)
    assert footer.shard_counts.tolist() == full.shard_counts.tolist() == [7, 7, 7]
    assert footer.digest() == full.digest()


# ---- DALI and wids ---------------------------------------------------------------------------------------


def _dali_index(shard, version="v1.2"):
    """A wds2idx index file for ``shard``, in the published layout: ``VERSION N``, then one line per sample,
    its members as ``ext offset size [name]`` (runs of consecutive members with one key)."""
    groups = []
    with tarfile.open(shard) as tar:
        for m in tar.getmembers():
            if not m.isreg():
                continue
            base = m.name.rpartition("/")[2]
            dot = m.name.find(".", m.name.rfind("/") + 1)
            key, ext = m.name[:dot], m.name[dot + 1 :]
            if not base or base.startswith("."):
                continue
            member = (ext, m.offset_data, m.size) + ((m.name,) if version == "v1.2" else ())
            if groups and groups[-1][0] == key:
                groups[-1][1].append(member)
            else:
                groups.append((key, [member]))
    lines = [f"{version} {len(groups)}"] + [" ".join(" ".join(map(str, c)) for c in g) for _, g in groups]
    idx = shard.with_suffix(".idx")
    idx.write_text("\n".join(lines) + "\n")
    return idx


def test_dali_index_files_give_the_same_listing(tmp_path, monkeypatch):
    d = tmp_path / "wds"
    for s in range(2):  # names without spaces: DALI's format separates fields by spaces
        write_shard(
            d / f"shard-{s}.tar",
            [m for i in range(5) for m in sample(f"s{s}/k{i}", None if i == 1 else i)] + [("__meta__.json", b"{}")],
        )
    scanned = open_source(str(d))
    for s in range(2):
        _dali_index(d / f"shard-{s}.tar", "v1.2")
    _no_scan(monkeypatch)
    _same(open_source(str(d), index="dali"), scanned, digests=False)
    _same(open_source(str(d), index=str(d / "shard-{0..1}.idx")), scanned, digests=False)
    for s in range(2):
        _dali_index(d / f"shard-{s}.tar", "v1.1")  # no member names: the same samples, ids and labels
    v11 = open_source(str(d), index="dali")
    assert v11.digest() == scanned.digest()  # ids, labels, shards (the reasons name no key: none is known)
    assert [e and e.split(":")[0] for e in v11.table.column("error").to_pylist()] == [
        e and e.split(":")[0] for e in scanned.table.column("error").to_pylist()
    ]
    (d / "shard-0.idx").write_text("v1.2 3\njpg 512 10 a.jpg\n")
    with pytest.raises(ValueError, match="says 3 samples"):
        open_source(str(d), index="dali")


def test_a_shard_newer_than_its_dali_index_is_listed_from_its_headers(tmp_path, caplog):
    d = tmp_path / "wds"
    write_shard(d / "shard-0.tar", sample("a", 1) + sample("b", 2))
    idx = _dali_index(d / "shard-0.tar")
    st = os.stat(idx)
    os.utime(idx, ns=(st.st_atime_ns, st.st_mtime_ns - 5 * 10**9))
    with caplog.at_level(logging.WARNING, logger="raypipe"):
        rows = open_source(str(d), index="dali")
    assert any("changed since" in r.getMessage() for r in caplog.records)
    _same(rows, _scan_only(str(d)))


def test_a_wids_shard_list_names_the_shards(tmp_path, caplog):
    d = _shards(tmp_path / "wds", n=3)
    shards = sorted(p.name for p in d.glob("*.tar"))
    desc = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "test",
        "shardlist": [{"url": n, "nsamples": 8, "filesize": os.path.getsize(d / n), "md5sum": "x"} for n in shards[:2]],
    }
    (d / "train.json").write_text(json.dumps(desc))
    rows = open_source(str(d / "train.json"))
    assert rows.kind == "webdataset" and rows.digest() == _scan_only(str(d / "shard-{0000..0001}.tar")).digest()
    desc["shardlist"][1]["nsamples"] = 7
    desc["base"] = "."
    (d / "train.json").write_text(json.dumps(desc))
    with caplog.at_level(logging.WARNING, logger="raypipe"):
        open_source(str(d / "train.json"))
    assert any("wids index" in r.getMessage() and "7 said, 8 found" in r.getMessage() for r in caplog.records)
    desc["shardlist"][0]["url"] = "../outside.tar"
    (d / "train.json").write_text(json.dumps(desc))
    with pytest.raises(ValueError, match="outside"):
        open_source(str(d / "train.json"))
    (d / "bad.json").write_text(json.dumps({"shardlist": []}))
    with pytest.raises(ValueError, match="not a wids shard index"):
        open_source(str(d / "bad.json"))


# ---- over S3, and the command ----------------------------------------------------------------------------


def test_over_s3_the_index_is_all_the_listing_reads(tmp_path, caplog, monkeypatch):
    buckets = tmp_path / "buckets"
    d = _shards(buckets / "data" / "wds", n=4, per=20, image_bytes=60_000)
    total = sum(os.path.getsize(p) for p in d.glob("*.tar"))
    with S3Server(buckets, latency_ms=2) as server:
        fs = server.filesystem()
        with caplog.at_level(logging.WARNING, logger="raypipe"):
            scanned = open_source("s3://data/wds", filesystem=fs)
        said = [r.getMessage() for r in caplog.records if "without an index" in r.getMessage()]
        assert len(said) == 1 and "raypipe index s3://data/wds" in said[0] and f"{total / 1e6:.1f} MB" in said[0]
        scan_bytes = server.bytes_sent
        assert scan_bytes > total / 2  # 4 MB windows over small members: most of the dataset
        index_shards("s3://data/wds", filesystem=fs, use_ray=False)
        server.reset_counts()
        caplog.clear()
        with monkeypatch.context() as m:
            _no_scan(m)
            with caplog.at_level(logging.WARNING, logger="raypipe"):
                indexed = open_source("s3://data/wds", filesystem=fs)
        assert not caplog.records
        assert server.bytes_sent <= 0.01 * total, (server.bytes_sent, total)
        _same(indexed, scanned)
        assert indexed.table.column("object_size").to_pylist() == scanned.table.column("object_size").to_pylist()
        # the shards rewritten: a listing from the old index lists them again
        write_shard(d / "shard-0000.tar", sample("z/a", 1))
        rows = open_source("s3://data/wds", filesystem=fs)
        assert "z/a.jpg" in rows.table.column("member").to_pylist()


def test_cli_index_with_ray_tasks(ray_local, tmp_path, capsys):
    d = _shards(tmp_path / "wds", n=3)
    scanned = open_source(str(d))
    rc = cli_main(["index", str(d / "shard-{0000..0002}.tar"), "--json", str(tmp_path / "r.json")])
    assert rc == 0 and "indexed into" in capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["shards"] == 3 and report["samples"] == len(scanned)
    assert sorted(os.listdir(d)) == sorted([INDEX_NAME, *(f"shard-{s:04d}.tar" for s in range(3))])  # no temporaries
    _, records = read_index(str(d / INDEX_NAME))
    assert sorted(records) == [f"shard-{s:04d}.tar" for s in range(3)]
