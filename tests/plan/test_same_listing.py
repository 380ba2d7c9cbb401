"""Identity: the listing digest, the ranks' check of it, and what adding files does to ids and splits.

``sample_id`` is a row's position in the (sorted) listing, so a file added to a dataset shifts the ids of
every row listed after it; rows listed before it keep theirs. The train/val split is made from each
row's path (and Parquet row) instead, so no image moves between splits when the dataset grows.
"""

import multiprocessing
import socket
from datetime import timedelta

import image_factory as f
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.plan.same_listing import ListingMismatchError, check_same_listing
from raypipe.sources import SourceRows, open_source
from raypipe.sources.table import column_or_default, make_rows
from raypipe.sources.transport.paths import DatasetRoot
from raypipe.train.data import held_out_mask, split_rows

pytestmark = pytest.mark.timeout(180)


def _rows(paths, labels, kind="folder", root="/data") -> SourceRows:
    return SourceRows(kind=kind, root=DatasetRoot(root), table=make_rows(list(paths), labels))


def test_digest_is_the_listing():
    paths = [f"c{i % 3}/img{i}.jpg" for i in range(50)]
    base = _rows(paths, np.arange(50) % 3)
    assert base.digest() == _rows(paths, np.arange(50) % 3, root="/mnt/elsewhere").digest()  # not the mount
    chunked = SourceRows(
        kind="folder", root=base.root, table=pa.concat_tables([base.table.slice(0, 7), base.table.slice(7)])
    )
    assert chunked.digest() == base.digest()  # not how Arrow happens to chunk the columns
    stamped = SourceRows(
        kind="folder",
        root=base.root,
        table=make_rows(paths, np.arange(50) % 3, object_sizes=np.arange(50) + 100, object_mtimes=np.full(50, 10**18)),
    )
    assert stamped.digest() == base.digest()  # not the sizes and times a store gives (a copy on disk differs)
    changed = [
        _rows(paths, (np.arange(50) + 1) % 3),  # labels
        _rows(paths[:-1], np.arange(49) % 3),  # a row fewer
        _rows(paths[1:] + paths[:1], np.arange(50) % 3),  # order
        _rows(["c0/img0.jp", "gc0/img1.jpg"] + paths[2:], np.arange(50) % 3),  # same bytes, other boundaries
        _rows(paths, np.arange(50) % 3, kind="manifest"),
    ]
    digests = {base.digest()} | {r.digest() for r in changed}
    assert len(digests) == 1 + len(changed)


def test_no_process_group_or_one_rank_is_no_check():
    check_same_listing("a", rank=0, world_size=1)
    check_same_listing("a", rank=0, world_size=2)  # torch.distributed is not initialised here


def _rank_main(rank: int, port: int, digests: list[str], results) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        check_same_listing(digests[0], rank=rank, world_size=2)  # the same listing: passes
        try:
            check_same_listing(digests[rank], rank=rank, world_size=2)
            results.put((rank, "no error"))
        except ListingMismatchError as e:
            results.put((rank, str(e)))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_with_different_listings_fail_naming_both_digests():
    a = _rows([f"c/{i}.jpg" for i in range(20)], np.zeros(20)).digest()
    b = _rows([f"c/{i}.jpg" for i in range(21)], np.zeros(21)).digest()  # rank 1 sees one file more
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, [a, b], results), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for rank in (0, 1):
        assert a in got[rank] and b in got[rank] and "rank 1" in got[rank], got[rank]


# ---- sample_id and the split when files are added, per source kind ----


def _folder(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f.photo_jpeg(size=(16, 12)))


def _manifest(root, names):
    (root / "m.csv").write_text("path,label\n" + "".join(f"{n},{i % 3}\n" for i, n in enumerate(names)))


def _parquet(root, files):
    for name, n in files:
        pq.write_table(pa.table({"image": [b"x"] * n, "label": list(range(n))}), root / name)


def _keys(rows: SourceRows) -> list[tuple[str, int]]:
    rows_in_files = column_or_default(rows.table, "row").to_pylist()  # a manifest has no "row" column: -1
    return list(zip(rows.table.column("path").to_pylist(), rows_in_files, strict=True))


def _check_growth(before: SourceRows, after: SourceRows, first_new: int, added: int) -> None:
    """Rows listed before position ``first_new`` keep their ids, later ones move by ``added``; no row
    changes split."""
    old_ids = dict(zip(_keys(before), before.table.column("sample_id").to_pylist(), strict=True))
    new_ids = dict(zip(_keys(after), after.table.column("sample_id").to_pylist(), strict=True))
    for key, sid in old_ids.items():
        assert new_ids[key] == (sid if sid < first_new else sid + added), key
    for fraction in (0.1, 0.5):
        old_val = set(_keys(split_rows(before, fraction)[1]))
        new_train, new_val = (set(_keys(r)) for r in split_rows(after, fraction))
        assert old_val <= new_val and not (old_val & new_train)
        assert not (set(old_ids) - old_val) & new_val  # nothing moved from train to val either


def test_folder_ids_shift_after_an_added_file_the_split_does_not(tmp_path):
    names = [f"{c}/img{i:03d}.jpg" for c in ("a", "b") for i in range(0, 120, 2)]
    _folder(tmp_path, names)
    before = open_source(str(tmp_path))
    _folder(tmp_path, ["a/img051.jpg", "b/img999.jpg"])  # one in the middle of class a, one at the end of b
    after = open_source(str(tmp_path))
    _check_growth(before, after, first_new=names.index("a/img052.jpg"), added=1)
    # the appended b/img999.jpg sorts last: ids before it moved by the one inserted file only
    assert after.table.column("sample_id").to_pylist()[-1] == len(names) + 1


def test_manifest_ids_shift_after_an_added_line_the_split_does_not(tmp_path):
    names = [f"img{i:03d}.jpg" for i in range(150)]
    _manifest(tmp_path, names)
    before = open_source(str(tmp_path / "m.csv"))
    _manifest(tmp_path, names[:40] + ["new.jpg"] + names[40:])
    after = open_source(str(tmp_path / "m.csv"))
    _check_growth(before, after, first_new=40, added=1)


def test_parquet_ids_shift_after_an_added_file_the_split_does_not(tmp_path):
    _parquet(tmp_path, [("part-0.parquet", 60), ("part-2.parquet", 60)])
    before = open_source(str(tmp_path))
    _parquet(tmp_path, [("part-1.parquet", 25)])
    after = open_source(str(tmp_path))
    _check_growth(before, after, first_new=60, added=25)


def test_held_out_mask_is_a_function_of_each_key():
    keys = np.arange(20_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    mask = held_out_mask(keys, 0.1)
    assert abs(mask.mean() - 0.1) < 0.01
    assert np.array_equal(mask[:5000], held_out_mask(keys[:5000], 0.1))


def test_split_keys_tell_paths_and_rows_apart():
    rows = _rows(["a.jpg", "a.jpg", "b.jpg", "", "ab.jpg"], np.zeros(5))
    table = rows.table.set_column(3, "row", pa.array([0, 1, 0, -1, -1], pa.int64()))
    keys = SourceRows(kind="parquet", root=rows.root, table=table).split_keys()
    assert len(set(keys.tolist())) == 5
