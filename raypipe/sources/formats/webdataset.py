"""WebDataset tar shards: ``KEY.jpg`` (or any image extension) with ``KEY.cls`` holding the label as text.

The data is a folder (or prefix) of ``*.tar`` files, one ``.tar``, a brace pattern (``shards-{0000..0099}.tar``)
or a wids shard list, on local disk or any pyarrow filesystem (``sources.formats.shard_paths`` finds the shards).
Listing reads each shard's tar headers (``sources.formats.tar_members``) and its ``.cls`` members: locally a
``pread`` per header, remotely ranged reads of a few MB. ``sample_id`` numbers the samples in (shards
sorted by path, samples in tar order); a bad label is kept as a ``bad_label`` row, a key without an
image as ``null_image``; a truncated shard is listed up to its last readable header and reported in
``extra["incomplete_shards"]`` (docs/sources.md). A shard in
raypipe's index (``sources.indexes.shard_index``) at its indexed size, or in a DALI ``wds2idx`` file, is listed
from it; without an index the listing says in one line what it is about to scan and how to write one.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from raypipe import settings
from raypipe.kernels.errors import SkipImage
from raypipe.sources.fields import member_columns
from raypipe.sources.formats.shard_listing import ShardListing, footer_rows, listing_by_shard, read_footer
from raypipe.sources.formats.shard_paths import expand_braces, find_shards, has_braces
from raypipe.sources.formats.tar_members import (
    Member,
    Ranges,
    TarListing,
    cls_text,
    member_ext,
    shard_record,
    walk,
)
from raypipe.sources.indexes.foreign_index import DaliMember, dali_index_for, parse_dali_index
from raypipe.sources.indexes.shard_index import (
    INDEX_NAME,
    ShardRecord,
    index_location,
    local_stamp,
    read_index,
    relative_paths,
    size_matches,
    time_matches,
)
from raypipe.sources.label_sets import LABELS, label_sets
from raypipe.sources.table import SourceRows, int64_array, listed_stamp, make_rows
from raypipe.sources.transport.paths import DatasetRoot
from raypipe.sources.transport.remote import ReadOptions, with_retries

__all__ = ["list_webdataset", "scan_shards"]

log = logging.getLogger(__name__)

_WINDOW = 4 * 1024 * 1024  # remote listing: bytes per ranged read


def _open_shard(root: DatasetRoot, rel: str, options: ReadOptions) -> tuple[Callable[[int, int], bytes], int, Callable]:
    """(read_at(pos, n), the shard's size, close) for a shard inside the root."""
    try:
        where = root.resolve(rel)
    except SkipImage as e:  # a shard that is a link out of the root
        raise ValueError(f"shard {root.display(rel)}: {e}") from None
    if root.is_local:
        fd = os.open(where, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return (lambda pos, n: os.pread(fd, n, pos)), os.fstat(fd).st_size, (lambda: os.close(fd))
    handle = with_retries(lambda: root.filesystem.open_input_file(where), options)
    return (lambda pos, n: with_retries(lambda: handle.read_at(n, pos), options)), handle.size(), handle.close


def _list_shard(root: DatasetRoot, rel: str, options: ReadOptions) -> TarListing:
    read_at, size, close = _open_shard(root, rel, options)
    try:
        return walk(Ranges(read_at, size, 0 if root.is_local else _WINDOW))
    finally:
        close()


def _scan(
    root: DatasetRoot, rel: str, stamp: tuple[int, int], options: ReadOptions, fields: tuple[str, ...] = ()
) -> ShardRecord:
    """One shard's record, from its tar headers (and ``.cls`` members), with its ``fields``' members."""
    if root.is_local:  # before reading: a shard rewritten meanwhile then no longer matches the record
        stamp = local_stamp(root, rel)
    return shard_record(rel, stamp, _list_shard(root, rel, options), fields)


def scan_shards(
    root: DatasetRoot,
    stamps: dict[str, tuple[int, int]],
    options: ReadOptions | None = None,
    fields: tuple[str, ...] = (),
) -> list[ShardRecord]:
    """The records of the shards ``stamps`` names, from their tar headers: locally one after another
    (a ``pread`` per header), remotely ``options.in_flight`` shards at a time."""
    options = options or ReadOptions()
    rels = list(stamps)
    if root.is_local or len(rels) < 2:
        return [_scan(root, rel, stamps[rel], options, fields) for rel in rels]
    with ThreadPoolExecutor(min(options.in_flight, len(rels)), thread_name_prefix="raypipe-list") as pool:
        return list(pool.map(lambda rel: _scan(root, rel, stamps[rel], options, fields), rels))


def _dali_record(
    root: DatasetRoot, rel: str, stamp: tuple[int, int], samples: list[list[DaliMember]], options: ReadOptions
) -> ShardRecord:
    """A shard's record from its DALI index: members as the index says, each ``.cls`` member read (a
    ``pread`` locally, a small ranged read remotely), no tar header."""
    read_at, size, close = _open_shard(root, rel, options)
    try:
        members, labels = [], {}
        for number, sample in enumerate(samples):
            for m in sample:
                name = m.name if m.name is not None else f"#{number}.{m.ext}"  # v1.1 names no member
                if member_ext(name) == "cls" and m.offset + m.size <= size:
                    labels[len(members)] = cls_text(read_at, m.offset, m.size)
                members.append(Member(name, m.offset, m.size))
        return shard_record(rel, stamp, TarListing(members=members, labels=labels, file_size=size))
    finally:
        close()


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _given_index(
    root: DatasetRoot, index, rels: list[str], filesystem: pafs.FileSystem | None, options: ReadOptions
) -> tuple[dict[str, ShardRecord], dict[str, list], str]:
    """(raypipe index records by shard, DALI samples by shard, where the index came from)."""
    if index is False:
        return {}, {}, ""
    if index is None:  # raypipe's own beside the shards, when there is one
        where = os.path.join(root.root, INDEX_NAME) if root.is_local else posixpath.join(root.root, INDEX_NAME)
        exists = (
            os.path.isfile(where) if root.is_local else root.filesystem.get_file_info(where).type == pafs.FileType.File
        )
        if not exists:
            return {}, {}, ""
        _, records = read_index(where, root.filesystem)
        return records, {}, root.display(INDEX_NAME)
    paths = [index] if isinstance(index, str) else list(index)
    if len(paths) == 1 and paths[0].endswith(".parquet"):
        fs, where = index_location(paths[0], root, filesystem)
        index_root, records = read_index(where, fs)
        rebased = relative_paths(index_root, list(records), root, beside=False)
        records = {rel: r for rel, r in zip(rebased, records.values(), strict=True) if rel is not None}
        return records, {}, paths[0]
    if paths == ["dali"]:  # wds2idx's default: SHARD.idx beside each shard
        paths = [posixpath.join(posixpath.dirname(rel), dali_index_for(rel.rpartition("/")[2])) for rel in rels]
        paths = [root.display(p) for p in paths]
    elif any(not p.endswith(".idx") for p in paths):
        raise ValueError(
            f"index={index!r}: expected a raypipe index (.parquet), DALI index files (.idx, a list "
            "or a brace pattern) or 'dali' (SHARD.idx beside each shard)"
        )
    if len(paths) == 1 and has_braces(paths[0]):
        paths = expand_braces(paths[0])
    by_stem = {dali_index_for(rel.rpartition("/")[2]): rel for rel in rels}
    dali = {}
    for p in paths:
        rel = by_stem.get(p.rpartition("/")[2])
        if rel is None:
            raise ValueError(f"DALI index {p!r} names no shard of this dataset (SHARD.idx for SHARD.tar)")
        fs, where = index_location(p, root, filesystem)
        if fs is None:
            with open(where, encoding="utf-8") as f:
                text = f.read()
        else:
            with fs.open_input_stream(where) as f:
                text = f.read().decode("utf-8")
        dali[rel] = (parse_dali_index(text, p), fs, where)
    return {}, dali, ", ".join(paths[:2]) + (" …" if len(paths) > 2 else "")


def _raypipe_index(
    root: DatasetRoot, index, filesystem: pafs.FileSystem | None
) -> tuple[pafs.FileSystem | None, str, str] | None:
    """(filesystem, path, as shown) of the raypipe index ``index`` names (None: the one beside the shards,
    when there is one), or None where there is none."""
    if index is None:
        where = os.path.join(root.root, INDEX_NAME) if root.is_local else posixpath.join(root.root, INDEX_NAME)
        exists = (
            os.path.isfile(where) if root.is_local else root.filesystem.get_file_info(where).type == pafs.FileType.File
        )
        return (root.filesystem, where, root.display(INDEX_NAME)) if exists else None
    if isinstance(index, str) and index.endswith(".parquet"):
        fs, where = index_location(index, root, filesystem)
        return fs, where, index
    return None


def list_webdataset(
    data: str,
    *,
    filesystem: pafs.FileSystem | None = None,
    options: ReadOptions | None = None,
    index=None,
    by_shard: bool | None = None,
    fields: tuple[str, ...] = (),
) -> SourceRows | ShardListing:
    """List WebDataset tar shards (a folder, a prefix, a ``.tar`` file, a brace pattern or a wids shard-list
    ``.json``) into SourceRows.

    ``index``: None reads raypipe's index beside the shards (``raypipe-index.parquet``) when there is one;
    a ``.parquet`` path (or URI) names one elsewhere; ``.idx`` paths (a list or a brace pattern) are DALI
    index files (``SHARD.idx`` for ``SHARD.tar``), and ``"dali"`` takes each shard's from beside it.
    A shard the index lacks, or that changed since it was indexed, is listed from its tar headers.
    ``by_shard``: listed by shard from raypipe's index (``shard_listing``): True, or None when the index
    holds more than ``Settings.by_shard_rows`` samples; every shard must then be indexed and unchanged.
    ``fields``: members by extension whose places the rows carry (``raypipe.sources.fields``): an index
    records the images' members only, so the shards are listed from their tar headers.
    """
    options = options or ReadOptions()
    root, stamps, expected = find_shards(data, filesystem)
    rels = list(stamps)
    if fields:
        if by_shard:
            raise ValueError(
                f"by_shard=True with fields={list(fields)}: a listing by shard reads raypipe's index, which "
                "records the images' members only; list by sample (by_shard=None or False)"
            )
        log.info(
            "raypipe: fields %s: listing the %d shard(s) of %s from their tar headers (an index records the "
            "images' members only)",
            list(fields),
            len(rels),
            data,
        )
        records = {rec.path: rec for rec in scan_shards(root, stamps, options, fields)}
        return _rows(data, root, rels, stamps, records, expected, fields)
    if by_shard is not False:
        located = _raypipe_index(root, index, filesystem)
        if located is not None:
            fs, where, shown = located
            meta = read_footer(fs, where)
            total = footer_rows(meta)
            if by_shard or (total is not None and total > settings.current().by_shard_rows):
                current = {rel: local_stamp(root, rel) for rel in rels} if root.is_local else stamps
                return listing_by_shard(root, rels, current, (fs, where), meta, shown, beside=index is None)
        if by_shard:
            raise ValueError(
                f"{data!r}: by_shard=True needs raypipe's shard index (`raypipe index {data}` writes "
                f"{INDEX_NAME} beside the shards, or give index=PATH.parquet)"
            )
    indexed, dali, source = _given_index(root, index, rels, filesystem, options)
    current = {rel: local_stamp(root, rel) for rel in rels} if root.is_local else stamps
    records: dict[str, ShardRecord] = {}
    stale, moved = [], 0
    for rel in rels:
        rec = indexed.get(rel)
        if rec is not None and size_matches(rec.size, current[rel]):
            records[rel] = rec
            moved += not time_matches(rec.mtime_ns, current[rel][1])
        elif rec is not None:
            stale.append(rel)
    if moved:
        log.info(
            "raypipe: %d of the %d shards have other times than %s recorded (copied or uploaded with it): "
            "listed from it, as their sizes are the indexed ones; each read checks its member's tar header",
            moved,
            len(rels),
            source,
        )
    if dali:
        fresh = _dali_fresh(dali, current)
        stale += [rel for rel in dali if not fresh[rel]]
        todo = [rel for rel in dali if fresh[rel]]
        with ThreadPoolExecutor(max(1, min(options.in_flight, len(todo))), thread_name_prefix="raypipe-list") as pool:
            done = pool.map(lambda r: _dali_record(root, r, current[r], dali[r][0], options), todo)
            records.update(zip(todo, done, strict=True))
    if stale:
        why = "modified after its index file, or shorter" if dali else "another size"
        log.warning(
            "raypipe: %d of the %d shards changed since %s indexed them (%s), e.g. %s: listing them "
            "from their tar headers; `raypipe index` writes the index again",
            len(stale),
            len(rels),
            source,
            why,
            root.display(stale[0]),
        )
    to_scan = {rel: stamps[rel] for rel in rels if rel not in records}
    if to_scan and len(to_scan) > len(stale):
        total = sum(current[rel][0] for rel in to_scan if current[rel][0] > 0)
        (log.info if root.is_local else log.warning)(
            "raypipe: listing %d shard(s) of %s without an index: reading the tar headers of up to %s; "
            "`raypipe index %s` writes an index, and the listing then reads that file alone",
            len(to_scan),
            data,
            _human(total),
            data,
        )
    for rec in scan_shards(root, to_scan, options):
        records[rec.path] = rec
    return _rows(data, root, rels, stamps, records, expected)


def _dali_fresh(dali: dict, current: dict) -> dict[str, bool]:
    """Per shard with a DALI index: whether the index may still describe it. A DALI index holds no shard
    size or time, so a shard modified after its index file was written, or shorter than the end of the
    index's last member, is taken as changed."""
    out = {}
    for rel, (samples, fs, where) in dali.items():
        end = max((m.offset + m.size for s in samples for m in s), default=0)
        if fs is None:
            written = os.stat(where).st_mtime_ns
        else:
            info = fs.get_file_info(where)
            written = listed_stamp(info)[1]
        shard_time = current[rel][1]
        fresh = end <= current[rel][0]
        if written >= 0 and shard_time >= 0:  # to the second: stores state whole seconds in some answers
            fresh = fresh and written // 10**9 >= shard_time // 10**9
        out[rel] = fresh
    return out


def _rows(
    data: str,
    root: DatasetRoot,
    rels: list[str],
    stamps: dict,
    records: dict[str, ShardRecord],
    expected: dict[str, int],
    fields: tuple[str, ...] = (),
) -> SourceRows:
    cols: dict[str, list] = {
        k: []
        for k in (
            "path",
            "label",
            "error",
            "shard",
            "offset",
            "size",
            "member",
            "object_size",
            "object_mtime_ns",
            "header_crc",
        )
    }
    incomplete, miscounted = [], []
    for shard, rel in enumerate(rels):
        rec = records[rel]
        n = len(rec)
        cols["path"] += [rel] * n
        cols["shard"] += [shard] * n
        cols["object_size"] += [stamps[rel][0]] * n
        cols["object_mtime_ns"] += [stamps[rel][1]] * n
        cols["label"] += rec.labels
        cols["error"] += rec.errors
        cols["offset"] += rec.offsets
        cols["size"] += rec.sizes
        cols["member"] += rec.members
        cols["header_crc"] += rec.header_digests()
        for name in fields:
            cols.setdefault(("field", name), []).extend(rec.fields.get(name, ()))
        if rel in expected and expected[rel] != rec.keys:
            miscounted.append((rel, expected[rel], rec.keys))
        if rec.stopped_at is not None:
            incomplete.append(
                {
                    "shard": root.display(rel),
                    "listed_samples": rec.keys,
                    "stopped_at": rec.stopped_at,
                    "shard_bytes": rec.size,
                    "reason": rec.reason,
                }
            )
            log.warning(
                "raypipe: %s: %s; listed %d samples up to byte %d of %d, any after it are not in the dataset",
                root.display(rel),
                rec.reason,
                rec.keys,
                rec.stopped_at,
                rec.size,
            )
    if miscounted:
        rel, said, found = miscounted[0]
        log.warning(
            "raypipe: %d shard(s) hold another number of samples than the wids index %s says, e.g. %s: "
            "%d said, %d found",
            len(miscounted),
            data,
            root.display(rel),
            said,
            found,
        )
    if not cols["path"]:
        raise ValueError(f"the {len(rels)} shard(s) of {data!r} hold no samples (KEY.jpg with KEY.cls)")
    labels, sets = _label_sets(cols["label"])
    table = make_rows(
        cols["path"],
        labels,
        errors=cols["error"],
        shards=cols["shard"],
        offsets=cols["offset"],
        sizes=cols["size"],
        members=cols["member"],
        object_sizes=cols["object_size"],
        object_mtimes=cols["object_mtime_ns"],
        header_crcs=cols["header_crc"],
    )
    for name in fields:
        places = np.array(cols["field", name], dtype=np.int64).reshape(-1, 3)
        for j, column in enumerate(member_columns(name)):
            table = table.append_column(column, int64_array(places[:, j]))
    if sets is not None:
        table = table.append_column(LABELS, sets)
    extra = {"shards": tuple(rels), "incomplete_shards": incomplete, "fields": tuple(fields)}
    return SourceRows(kind="webdataset", root=root, table=table, extra=extra)


def _label_sets(labels: list) -> tuple[list, pa.Array | None]:
    """The rows' labels, and their sets where any ``.cls`` holds several ids (``raypipe.sources.label_sets``:
    each row's set, a single id a set of one; ``label`` 0, or -1 for a bad row); None: one id each."""
    if not any(isinstance(v, tuple) for v in labels):
        return labels, None
    sets = [list(v) if isinstance(v, tuple) else ([v] if v >= 0 else None) for v in labels]
    good, sets = label_sets(pa.array(sets, pa.list_(pa.int64())))
    return pc.fill_null(good, -1).to_pylist(), sets
