"""Whole objects of an s3:// folder read with one GET each (obstore), pyarrow's HEAD + GET as the fallback."""

import shutil

import pyarrow.fs as pafs
import pytest

from raypipe.kernels.errors import MISSING
from raypipe.sources import BlockReader, ReadOptions, open_source
from raypipe.sources.transport import single_get as single_get_module
from raypipe.sources.transport.single_get import GIVE_UP_AFTER, single_get_for
from raypipe.testing import S3Server

pytestmark = pytest.mark.timeout(120)

obstore = pytest.importorskip("obstore")


@pytest.fixture
def served(sample_dir, tmp_path):
    root = tmp_path / "buckets"
    shutil.copytree(sample_dir, root / "bkt" / "folder")
    with S3Server(root, latency_ms=2) as server:
        yield server, root / "bkt" / "folder"


def _batch(rows):
    return {k: rows.table.column(k).to_numpy(zero_copy_only=False) for k in rows.table.column_names}


def _no_cache() -> ReadOptions:
    return ReadOptions(in_flight=8, cache=None)


def _unreachable_by_obstore(monkeypatch) -> None:
    """Readers' single-GET clients made to point at a closed port (in life: a store reached only with
    credentials pyarrow finds)."""
    real = single_get_for

    def unreachable(filesystem):
        getter = real(filesystem)
        if getter is not None:
            getter._options["config"]["endpoint"] = "http://127.0.0.1:9"  # discard port: nothing listens
        return getter

    monkeypatch.setattr("raypipe.sources.reader.single_get_for", unreachable)


def test_a_folder_is_read_with_one_get_per_image(served):
    server, folder = served
    rows = open_source("s3://bkt/folder", filesystem=server.filesystem())
    reader = BlockReader(rows.root, rows.kind, options=_no_cache())
    server.reset_counts()
    got = reader.read_block(_batch(rows))
    reader.close()
    assert dict(server.requests) == {("GET", "GetObject"): len(rows)}  # no HEAD
    local = open_source(str(folder))
    assert got == BlockReader(local.root, local.kind).read_block(_batch(local))


def test_a_failing_single_get_is_read_through_pyarrow_and_then_given_up(served, monkeypatch):
    """A store obstore cannot reach (here: a closed port; in life, credentials only pyarrow finds): every
    image still comes, through pyarrow's HEAD + GET, and after a few failures the reader stops trying."""
    server, folder = served
    _unreachable_by_obstore(monkeypatch)
    rows = open_source("s3://bkt/folder", filesystem=server.filesystem())
    reader = BlockReader(rows.root, rows.kind, options=ReadOptions(in_flight=1, cache=None))
    server.reset_counts()
    got = reader.read_block(_batch(rows))
    local = open_source(str(folder))
    assert got == BlockReader(local.root, local.kind).read_block(_batch(local))
    assert server.count("HeadObject") == server.count("GetObject") == len(rows)
    assert reader._single_get.failures == GIVE_UP_AFTER and not reader._single_get.usable
    reader.close()


def test_a_missing_object_is_still_a_missing_skip(served):
    server, _ = served
    rows = open_source("s3://bkt/folder", filesystem=server.filesystem())
    batch = {k: v[:2] for k, v in _batch(rows).items()}
    batch["path"] = batch["path"].copy()
    batch["path"][0] = "class_0/not-there.jpg"
    reader = BlockReader(rows.root, rows.kind, options=_no_cache())
    missing, present = reader.read_block(batch)
    reader.close()
    assert missing.reason == MISSING and isinstance(present, bytes)


def test_what_the_store_is_built_from(monkeypatch, tmp_path):
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    keyed = pafs.S3FileSystem(
        access_key="AK", secret_key="SK", session_token="T", region="eu-west-1", connect_timeout=5, request_timeout=30
    )
    config = single_get_for(keyed)._options
    assert config["config"] == {
        "region": "eu-west-1",
        "access_key_id": "AK",
        "secret_access_key": "SK",
        "session_token": "T",
    }
    assert config["client_options"] == {"connect_timeout": "5s", "timeout": "30s"}
    assert config["retry_config"] == {"max_retries": 0}  # a failure goes to pyarrow, with raypipe's retries
    # credentials from the environment or the instance: obstore's chain finds them too
    plain = pafs.S3FileSystem(region="us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert single_get_for(plain)._options["config"]["endpoint"] == "http://127.0.0.1:9000"
    # a profile: pyarrow's alone
    (tmp_path / "credentials").write_text("[default]\naws_access_key_id = x\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    assert single_get_for(plain) is None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SK")
    assert single_get_for(plain) is not None  # the environment comes first in both chains
    monkeypatch.setenv("AWS_PROFILE", "other")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert single_get_for(plain) is None
    # not S3, or no obstore: pyarrow
    assert single_get_for(None) is None and single_get_for(pafs.LocalFileSystem()) is None
    monkeypatch.setattr(single_get_module, "_obstore_installed", lambda: False)
    assert single_get_for(keyed) is None


def _shards(root, count: int = 2, per_shard: int = 6) -> dict[str, bytes]:
    """Tar shards under ``root`` of distinct-sized members; returns each member's bytes by key."""
    import io
    import tarfile

    root.mkdir(parents=True)
    members = {}
    for s in range(count):
        with tarfile.open(root / f"shard-{s}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for i in range(per_shard):
                key = f"{s}{i:02d}"
                members[key] = bytes([s * 16 + i]) * (1500 * i + 7)
                for name, data in ((f"{key}.jpg", members[key]), (f"{key}.cls", str(i).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return members


def _read_shards(buckets, latency_ms: float = 0.0):
    """Every member of ``s3://bkt/wds`` through one block: (results, their member names, the requests
    made by method and action, the server's log of them)."""
    with S3Server(buckets, latency_ms=latency_ms) as server:
        rows = open_source("s3://bkt/wds", kind="webdataset", filesystem=server.filesystem())
        reader = BlockReader(rows.root, rows.kind, options=_no_cache())
        server.reset_counts()
        got = reader.read_block(_batch(rows))
        reader.close()
        return got, rows.table.column("member").to_pylist(), dict(server.requests), list(server.log)


def test_shard_members_are_read_with_ranged_gets_and_no_head(tmp_path):
    members = _shards(tmp_path / "buckets" / "bkt" / "wds")
    got, names, requests, log = _read_shards(tmp_path / "buckets", latency_ms=2)
    # the members of a shard lie side by side: one ranged GET per shard, no HEAD to open it
    assert requests == {("GET", "GetObject"): 2}
    assert all(rng.startswith("bytes=") for *_, rng in log)
    assert [bytes(g) for g in got] == [members[m.split(".")[0]] for m in names]
    assert all(isinstance(g, bytes) for g in got)


def test_a_shard_cut_short_after_listing_is_a_truncated_skip_over_one_get(tmp_path):
    from raypipe.kernels.errors import TRUNCATED

    shards = tmp_path / "buckets" / "bkt" / "wds"
    _shards(shards, count=1)
    with S3Server(tmp_path / "buckets", latency_ms=0) as server:
        rows = open_source("s3://bkt/wds", kind="webdataset", filesystem=server.filesystem())
        shard = shards / "shard-0.tar"
        offsets = rows.table.column("offset").to_pylist()
        with open(shard, "r+b") as f:
            f.truncate(offsets[-1] + 10)  # the last member loses all but its first 10 bytes
        reader = BlockReader(rows.root, rows.kind, options=_no_cache())
        got = reader.read_block(_batch(rows))
        reader.close()
    assert all(isinstance(g, bytes) for g in got[:-1])
    assert got[-1].reason == TRUNCATED, got[-1]


def test_shards_are_read_through_pyarrow_where_obstore_cannot_reach(tmp_path, monkeypatch):
    members = _shards(tmp_path / "buckets" / "bkt" / "wds")
    _unreachable_by_obstore(monkeypatch)
    got, names, requests, _ = _read_shards(tmp_path / "buckets")
    assert requests == {("HEAD", "HeadObject"): 2, ("GET", "GetObject"): 2}  # pyarrow: open, then read
    assert got == [members[m.split(".")[0]] for m in names]
