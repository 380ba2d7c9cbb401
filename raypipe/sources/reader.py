"""Read the bytes of a whole block of source rows, whatever the source kind.

``BlockReader(root, kind, image_column).read_block(rows)`` returns one entry per row: the image's bytes,
or a :class:`~raypipe.kernels.errors.SkipImage` saying why there are none (``missing``, ``unreadable``,
``outside_root``, ``null_image``, ``truncated``, or a reason the listing already knew). Only data and
I/O failures become skips; anything else (a bug, a failed import, memory) propagates, so it fails the
epoch with its own type.

How a block is read depends on where it lies:

- a local root is read sequentially: a file read costs microseconds, and threads would only add
  overhead to the decoding that follows;
- a remote root keeps up to ``ReadOptions.in_flight`` requests in flight (see ``raypipe.sources.transport.remote``
  for why, and for the retries), holding one block's bytes at a time; a whole image on S3 is one GET
  (``raypipe.sources.transport.single_get``), pyarrow's HEAD + GET the fallback;
- Parquet rows are grouped by (file, row group): each row group a block touches is read once;
- tar members are grouped by shard: a local shard is opened once per block and its members read with
  ``pread``; remote members that lie close together in a shard are fetched with one ranged request
  (one GET on S3, ``raypipe.sources.transport.single_get``). Each read takes the member's tar header too and
  checks it is the one listed: a shard changed since its listing raises ``ShardChangedError``;
- with a cache (``ReadOptions.cache``, see ``raypipe.sources.transport.cache``) a remote object, tar shard or
  Parquet file is fetched whole the first time it is read and read from local disk afterwards. Where
  the rows carry the object's size and time from the listing (``object_size``, ``object_mtime_ns``),
  the entry is keyed by them and a hit makes no request at all; a fetch that does not bring the listed
  size means the object changed since the listing, and it is read as the store has it now (below).
  Without them (a manifest's paths) each read asks the store for the size and time first (a ``HEAD``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from raypipe.kernels.errors import NULL_IMAGE, TRUNCATED, UNREADABLE, SkipImage
from raypipe.sources.formats import ray_blocks
from raypipe.sources.formats.parquet import ParquetGroups
from raypipe.sources.formats.tar_members import BLOCK, MemberHeaders
from raypipe.sources.transport.cached_objects import UNLISTED, CachedObjects
from raypipe.sources.transport.paths import DatasetRoot
from raypipe.sources.transport.remote import ReadOptions, read_skip, with_retries
from raypipe.sources.transport.request_pool import RequestPool
from raypipe.sources.transport.single_get import SingleGet, single_get_for

__all__ = ["BlockReader"]

log = logging.getLogger(__name__)

Result = bytes | SkipImage

# Remote tar members whose data are at most this far apart are fetched with one request (the gap is
# read and dropped: small next to what a request's latency costs in bandwidth, 20 ms at 100 MB/s is
# 2 MB). A merged request stays under _MAX_RANGE (a larger member is one request of its own): a task's
# rows are shuffled across its window's shards, and ranges of about a megabyte, sent in the order the
# rows need them, come back one after another in that order, so the task decodes while the rest
# arrive; a window of whole-shard ranges comes back all at once, at the end, and its large buffers
# cost the workers fresh pages (kernel time) for every window (docs/performance.md).
_MAX_GAP = 256 * 1024
_MAX_RANGE = 1024 * 1024


class BlockReader:
    """Reads the image bytes of blocks of rows of one listed dataset (picklable; threads made lazily)."""

    def __init__(self, root: DatasetRoot, kind: str, image_column: str = "", *, options: ReadOptions | None = None):
        if kind not in ("folder", "manifest", "parquet", "webdataset", "raydata"):
            raise ValueError(f"kind={kind!r}: expected folder, manifest, parquet, webdataset or raydata")
        self.root, self.kind, self.image_column = root, kind, image_column
        self.options = options or ReadOptions()
        self._objects = CachedObjects(root, self.options, self._get_whole)
        self._parquet = (
            ParquetGroups(root, image_column, opener=self._objects.open if self.cached else None)
            if kind == "parquet"
            else None
        )
        # a local root's reads run one after another; a remote root's, on threads
        self._requests = RequestPool(self.options.in_flight, concurrent=not root.is_local)
        self._handles: dict[str, object] = {}
        # Whole image objects of an s3:// root with one GET each instead of pyarrow's HEAD + GET
        self._single_get = single_get_for(root.filesystem) if kind not in ("parquet", "raydata") else None
        self._enter_failed = False  # a fetched object could not be cached: said once

    def __getstate__(self):
        return {"root": self.root, "kind": self.kind, "image_column": self.image_column, "options": self.options}

    def __setstate__(self, state):
        self.__init__(state["root"], state["kind"], state["image_column"], options=state["options"])

    def close(self) -> None:
        """Stop this reader's threads (a reader is usable again afterwards: they restart on demand)."""
        self._requests.close()

    @property
    def cached(self) -> bool:
        """Whether remote objects are read through the local cache (one that applies to this kind)."""
        cache = self.options.cache
        return cache is not None and not self.root.is_local and cache.applies_to(self.kind)

    def read_block(self, rows: Mapping[str, np.ndarray], *, wait: bool = True) -> list[Result | Future]:
        """Bytes (or the skip) of each row of a block: ``rows`` has the block's ``path`` column, and
        ``row`` (Parquet), ``offset``/``size`` (tar shards) and ``error`` columns where the kind has them;
        ``object_size``/``object_mtime_ns`` key the cache where present (without them, as for -1). A Ray
        Dataset's rows have ``shard``, ``row`` and ``block`` (``sources.formats.ray_blocks``). Rows with a ``bytes``
        column come with their bytes, read before (a Ray Data batch's cells, the pieces of a window read
        once: ``raypipe.pipeline.window_read``): those are not read again, and a null cell is a skip.

        ``wait=False`` returns once the requests are sent where the rows come from a store (a remote
        root, not read through the cache): those rows are then ``Future``s, the requests sent in the
        order of the rows that need them (an object per row for a folder or manifest, a ranged request
        per run of tar members, a row group per group of Parquet rows), so a caller decodes the first
        rows while the later ones are still in flight, and one task keeps its core busy through the
        store's latency. Other rows are read before it returns, as with ``wait=True``."""
        paths = rows["path"] if "path" in rows else rows["sample_id"]  # rows with their bytes may have no path
        out: list[Result | None] = [None] * len(paths)
        todo = []
        errors = rows.get("error")
        for i in range(len(paths)):
            if errors is not None and errors[i]:  # known bad when listed: nothing to read
                why, _, more = str(errors[i]).partition(": ")
                out[i] = SkipImage(why, more)
            else:
                todo.append(i)
        # what the listing said of each row's object: only the cache uses it
        sizes, mtimes = (rows.get("object_size"), rows.get("object_mtime_ns")) if self.cached else (None, None)

        def listed(i: int) -> tuple[int, int]:
            return UNLISTED if sizes is None or mtimes is None else (int(sizes[i]), int(mtimes[i]))

        cells = rows.get("bytes")
        if cells is not None:  # rows that come with their bytes: a Ray Data batch's, a window's pieces
            for i in todo:
                out[i] = SkipImage(NULL_IMAGE, "a null image cell") if cells[i] is None else bytes(cells[i])
        elif self.kind == "raydata":
            ray_blocks.read_rows(rows, todo, out)
        elif self.kind == "parquet":
            self._read_parquet(paths, rows["row"], todo, out, listed, wait)
        elif self.kind == "webdataset":
            self._read_members(paths, MemberHeaders(rows), todo, out, listed, wait)
        else:
            if self.cached:
                # A hit is a local file read of tens of microseconds: read here. Handing it to the
                # thread pool would cost several times that (hand-offs, the interpreter lock). Only
                # the misses go to the store, with requests in flight.
                misses = []
                for i in todo:
                    out[i] = self._objects.hit(str(paths[i]), listed(i))
                    if out[i] is None:
                        misses.append(i)
                todo = misses

            def one(i: int) -> Result:
                return self._read_file(str(paths[i]), listed(i))

            if not wait and not self.root.is_local and len(todo) > 1:
                pool = self._requests.executor()
                for i in todo:
                    out[i] = pool.submit(one, i)
            else:
                for i, data in zip(todo, self._requests.map(one, todo), strict=True):
                    out[i] = data
        return out  # type: ignore[return-value]

    def describe(self, rows: Mapping[str, np.ndarray], i: int) -> str:
        """Where row ``i``'s image is, as reports show it."""
        if self.kind == "raydata":
            return ray_blocks.describe_row(rows, i)
        shown = self.root.display(str(rows["path"][i]))
        if self.kind == "parquet":
            return f"{shown}#row={int(rows['row'][i])}"
        if self.kind == "webdataset":
            member = rows["member"][i] if "member" in rows else None
            return f"{shown}#{member}" if member else f"{shown}#offset={int(rows['offset'][i])}"
        return shown

    # -- one file per row -------------------------------------------------------------------------

    def _read_file(self, path: str, listed: tuple[int, int] = UNLISTED) -> Result:
        if self.root.is_local:
            try:
                return self.root.read_bytes(path)
            except SkipImage as e:
                return e
        try:
            where = self.root.resolve(path)
        except SkipImage as e:
            return e
        try:
            key = self._objects.listed_key(where, listed) if self.cached else None
            if self.cached and key is None:  # not as listed: the store is asked what it holds now (a HEAD)
                with self._objects.open(where, listed) as f:
                    return f.read()
            data = self._get_whole(where)
            if data is None:
                data = with_retries(lambda: _read_stream(self.root, where), self.options)
            if key is not None:
                if len(data) == listed[0]:
                    self._enter(key, data)
                else:  # changed since the listing: read again as the store has it now, and cached so
                    self._objects.forget(key)
                    with self._objects.open(where, listed) as f:
                        return f.read()
            return data
        except OSError as e:
            return read_skip(e, path)

    def _enter(self, key: str, data: bytes | memoryview) -> None:
        """A fetched object into the cache, which only saves later requests: where it cannot be
        written (a full or read-only disk), the read goes on without it."""
        try:
            self._objects.local_cache().add(key, data)
        except OSError as e:
            if not self._enter_failed:
                self._enter_failed = True
                log.warning(
                    "the cache in %s keeps no more objects (%s): they are read from the store",
                    self._objects.local_cache().dir,
                    e,
                )

    def _get_whole(self, where: str) -> bytes | None:
        """The object's bytes with a single GET (``raypipe.sources.transport.single_get``), or None: no such path
        here, or it failed, and the caller reads through pyarrow (with the retries and the skips)."""
        return self._single(lambda getter: getter.read(where))

    def _single(self, read: Callable[[SingleGet], bytes | memoryview]) -> bytes | memoryview | None:
        """``read(getter)`` where this root has a usable single-GET reader, or None: none here, or the
        read failed."""
        getter = self._single_get
        if getter is None or not getter.usable:
            return None
        try:
            return read(getter)
        except Exception:  # noqa: BLE001 - read again through pyarrow, which reports what is wrong
            return None

    # -- Parquet: each row group once per block ---------------------------------------------------

    def _read_parquet(
        self, paths, rows, todo: list[int], out: list, listed: Callable[[int], tuple[int, int]], wait: bool = True
    ) -> None:
        reader = self._parquet
        assert reader is not None
        groups: dict[tuple[str, int], list[int]] = {}
        # each file's (size, mtime_ns) as listed, from a row of it (all its rows carry the same)
        stamps = {str(paths[i]): listed(i) for i in todo}
        for rel in stamps:
            try:
                with_retries(lambda rel=rel: reader.group_starts(rel, stamps[rel]), self.options)
            except SkipImage as e:
                for i in todo:
                    if str(paths[i]) == rel:
                        out[i] = e
            except (OSError, pa.ArrowInvalid) as e:  # a missing, unreadable or corrupt file: all its rows
                skip = read_skip(e, rel) if isinstance(e, OSError) else SkipImage(UNREADABLE, f"{rel}: {e}")
                for i in todo:
                    if str(paths[i]) == rel:
                        out[i] = skip
        for i in todo:
            if out[i] is not None:
                continue
            rel, row = str(paths[i]), int(rows[i])
            starts = reader.group_starts(rel)
            group = int(np.searchsorted(starts, row, side="right") - 1)
            groups.setdefault((rel, group), []).append(i)

        def one(item):
            (rel, group), idx = item
            first = int(reader.group_starts(rel)[group])
            offsets = [int(rows[i]) - first for i in idx]
            try:
                return with_retries(lambda: reader.read_group(rel, group, offsets, stamps[rel]), self.options)
            except SkipImage as e:
                return [e] * len(idx)
            except (OSError, pa.ArrowInvalid) as e:
                what = f"{rel} row group {group}"
                skip = read_skip(e, what) if isinstance(e, OSError) else SkipImage(UNREADABLE, f"{what}: {e}")
                return [skip] * len(idx)

        self._requests.map_rows(one, list(groups.items()), out, wait)

    # -- tar members: ranged reads ----------------------------------------------------------------

    def _read_members(
        self,
        paths,
        members: MemberHeaders,
        todo: list[int],
        out: list,
        listed: Callable[[int], tuple[int, int]],
        wait: bool = True,
    ) -> None:
        offsets, sizes = members.offsets, members.sizes
        by_shard: dict[str, list[int]] = {}
        for i in todo:
            by_shard.setdefault(str(paths[i]), []).append(i)
        if self.root.is_local or self.cached:
            # a local shard, or a remote one cached whole: one descriptor per shard, members by pread
            items = list(by_shard)
            read = self._requests.map(
                lambda rel: self._pread(rel, by_shard[rel], members, listed(by_shard[rel][0])), items
            )
            for rel, results in zip(items, read, strict=True):
                for i, data in zip(by_shard[rel], results, strict=True):
                    out[i] = data
            return
        ranges = []  # (shard, [row indices]) fetched with one request each
        for rel, idx in by_shard.items():
            idx = sorted(idx, key=lambda i: int(offsets[i]))
            run = [idx[0]]
            for i in idx[1:]:  # a range starts at its first member's header
                start, end = int(offsets[run[0]]) - BLOCK, int(offsets[run[-1]]) + int(sizes[run[-1]])
                if int(offsets[i]) - end <= _MAX_GAP and int(offsets[i]) + int(sizes[i]) - start <= _MAX_RANGE:
                    run.append(i)
                else:
                    ranges.append((rel, run))
                    run = [i]
            ranges.append((rel, run))

        def one(item):
            rel, run = item
            start = max(0, int(offsets[run[0]]) - BLOCK)  # from the first member's header: the read confirms it
            length = max(int(offsets[i]) + int(sizes[i]) for i in run) - start
            try:
                where = self.root.resolve(rel)
                data = with_retries(lambda: self._read_range(where, start, length), self.options)
            except SkipImage as e:
                return [e] * len(run)
            except OSError as e:
                return [read_skip(e, rel)] * len(run)
            for i in run:  # each member's header lies in the range: the run's first, and between members
                at = int(offsets[i]) - start
                members.check(self.root, rel, i, data[max(0, at - BLOCK) : at])
            return [_cut(data, int(offsets[i]) - start, int(sizes[i]), rel) for i in run]

        self._requests.map_rows(one, ranges, out, wait)

    def _pread(
        self, rel: str, idx: list[int], members: MemberHeaders, listed: tuple[int, int] = UNLISTED
    ) -> list[Result]:
        try:
            where = self.root.resolve(rel)
            if self.cached:
                fd = self._objects.fd(where, listed)
            else:
                fd = os.open(where, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except SkipImage as e:
            return [e] * len(idx)
        except OSError as e:
            return [read_skip(e, rel)] * len(idx)
        try:
            results: list[Result] = []
            for i in idx:
                offset, size = int(members.offsets[i]), int(members.sizes[i])
                try:
                    header = os.pread(fd, BLOCK, offset - BLOCK) if offset >= BLOCK else b""
                    members.check(self.root, rel, i, header)  # before the data: a changed shard reads nothing
                    results.append(_cut(os.pread(fd, size, offset), 0, size, rel))
                except OSError as e:
                    results.append(read_skip(e, rel))
            return results
        finally:
            os.close(fd)

    def _read_range(self, where: str, start: int, length: int) -> bytes | memoryview:
        data = self._single(lambda getter: getter.read_range(where, start, length))
        if data is not None:
            return data
        # One handle per shard per reader: opening costs a request (the object's size), reading a range
        # another; handles are shared by the threads (ranged reads on one handle are independent).
        handle = self._handles.get(where)
        if handle is None:
            if len(self._handles) > 256:
                self._handles.clear()
            handle = self._handles[where] = self.root.filesystem.open_input_file(where)
        return handle.read_at(length, start)


def _read_stream(root: DatasetRoot, where: str) -> bytes:
    with root.filesystem.open_input_stream(where) as f:
        return f.read()


def _cut(data: bytes, start: int, size: int, rel: str) -> Result:
    if start + size > len(data):
        return SkipImage(TRUNCATED, f"{rel}: the shard ends {start + size - len(data)} bytes before the member does")
    return bytes(data[start : start + size])
