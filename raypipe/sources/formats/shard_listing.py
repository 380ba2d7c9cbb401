"""An indexed WebDataset listed by shard: what a billion samples need.

A listing of rows holds about 50 bytes per sample in every process that plans epochs: 50 GB at a
billion. Listed by shard (``ShardListing``), an indexed WebDataset holds a few numbers per shard
(its path, size, time, samples, where its rows start in the index), read from raypipe's index footer;
each shard's sample rows (member offsets and sizes, labels, known skips) are read from the index file
when a chunk of that shard is planned (``ShardColumns.take``: the row groups that hold them, the last
few shards' rows kept). An epoch's plan needs only the samples per shard (``raypipe.plan.order``).

Chosen by ``list_webdataset(by_shard=…)``: True, or None with more than ``Settings.by_shard_rows`` samples in
the index. It needs every shard in raypipe's index at its indexed size (the listing by row re-reads
other shards' headers instead; a listing by shard cannot, and says so); the reads check each member's
header. Sample ids, the order and so every batch are those of the listing by row of the same shards.
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypipe.sources.indexes.shard_index import index_meta, relative_paths, size_matches
from raypipe.sources.table import column_array
from raypipe.sources.transport.paths import DatasetRoot

__all__ = ["ShardColumns", "ShardListing"]

_MEMBER_COLUMNS = ("shard", "label", "error", "offset", "size", "member")
_DIGESTS = "header_crc"  # the members' header digests: absent from an index written before them
_KEPT_SHARDS = 16  # shards whose rows stay read: a window is cut into several chunks, planned in turn


class ShardListing:
    """The listing of an indexed WebDataset by shard (see the module doc); used where ``SourceRows`` is:
    ``len()`` its samples, ``digest()``, ``columns()`` (a chunk's rows), ``by_shard`` (True here),
    ``shard_counts``."""

    kind = "webdataset"
    image_column = ""
    classes: tuple[str, ...] = ()

    def __init__(
        self,
        root: DatasetRoot,
        index: tuple[pafs.FileSystem | None, str],
        paths: list[str],
        counts: np.ndarray,
        index_starts: np.ndarray,
        stamps: np.ndarray,
        incomplete: list[dict],
    ):
        self.root, self.index = root, index
        self.paths = tuple(paths)
        self.shard_counts = np.asarray(counts, dtype=np.int64)
        self.index_starts = np.asarray(index_starts, dtype=np.int64)  # each shard's first row in the index file
        self.stamps = np.asarray(stamps, dtype=np.int64).reshape(-1, 2)  # (size, mtime_ns) per shard
        self.first = np.cumsum(self.shard_counts) - self.shard_counts  # each shard's first sample id
        self.extra = {"shards": self.paths, "incomplete_shards": incomplete}

    def __len__(self) -> int:
        return int(self.shard_counts.sum())

    @property
    def by_shard(self) -> bool:
        """True: samples per shard, no row per sample (``SourceRows.by_shard`` is False)."""
        return True

    @property
    def num_shards(self) -> int:
        return len(self.paths)

    @property
    def table(self):
        raise ValueError(
            f"{self.root.display('')}: listed by shard ({len(self):,} samples in {len(self.paths):,} "
            "shards), this has no row per sample; list it by row (by_shard=False: about 50 bytes a "
            "sample in memory) for what reads every row"
        )

    @property
    def fields(self) -> tuple[str, ...]:
        """None: a listing by shard carries no fields (its index records the images' members only)."""
        return ()

    @property
    def num_classes(self) -> int:
        raise ValueError(
            "a WebDataset listed by shard does not know its classes without reading every label: "
            "give the number of classes (--num-classes, num_classes=…)"
        )

    def numbered_like(self, classes: tuple[str, ...]) -> ShardListing:
        return self  # labels are the shards' integers: no class names to renumber

    def digest(self) -> str:
        """sha256 of what the listing is: its shards (paths, samples, sizes) in order. The same shards
        indexed alike give the same digest on every node."""
        h = hashlib.sha256(f"raypipe-shard-listing-v1:{self.kind}:{len(self)}:{len(self.paths)}".encode())
        h.update("\0".join(self.paths).encode())
        h.update(np.ascontiguousarray(self.shard_counts, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.stamps[:, 0], dtype="<i8").tobytes())
        return h.hexdigest()

    def columns(self) -> ShardColumns:
        return ShardColumns(self)


class ShardColumns:
    """A ``ShardListing``'s rows as ``TableColumns`` gives a listing's: ``take(idx)`` the columns of rows
    ``idx``, each shard's sample rows read from the index when first needed."""

    def __init__(self, listing: ShardListing):
        self.listing = listing
        self.num_rows = len(listing)
        self._file: pq.ParquetFile | None = None
        self._group_starts: np.ndarray | None = None
        self._kept: collections.OrderedDict[int, dict[str, np.ndarray]] = collections.OrderedDict()

    def __len__(self) -> int:
        return self.num_rows

    def __getstate__(self) -> dict:  # the open index file stays with the process that opened it
        return {
            "listing": self.listing,
            "num_rows": self.num_rows,
            "_file": None,
            "_group_starts": None,
            "_kept": collections.OrderedDict(),
        }

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        lst = self.listing
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.num_rows):
            raise IndexError(f"rows {int(idx.min())}…{int(idx.max())} outside the listing's {self.num_rows}")
        shard = np.searchsorted(lst.first, idx, side="right") - 1
        # a shard with no samples has the same first id as the next: searchsorted(…, "right") skips it
        within = idx - lst.first[shard]
        paths = np.array(lst.paths, dtype=object)
        out = {
            "sample_id": idx.copy(),
            "label": np.empty(len(idx), np.int64),
            "path": paths[shard],
            "row": np.full(len(idx), -1, np.int64),
            "error": np.empty(len(idx), object),
            "shard": shard,
            "offset": np.empty(len(idx), np.int64),
            "size": np.empty(len(idx), np.int64),
            "member": np.empty(len(idx), object),
            "object_size": lst.stamps[shard, 0].copy(),
            "object_mtime_ns": lst.stamps[shard, 1].copy(),
            "header_crc": np.full(len(idx), -1, np.int64),
        }
        for s in np.unique(shard):
            where = shard == s
            rows = self._rows_of(int(s))
            for name in ("label", "error", "offset", "size", "member", *((_DIGESTS,) if _DIGESTS in rows else ())):
                out[name][where] = rows[name][within[where]]
        return out

    def _rows_of(self, s: int) -> dict[str, np.ndarray]:
        """Shard ``s``'s sample rows from the index: the row groups that hold them."""
        rows = self._kept.get(s)
        if rows is not None:
            self._kept.move_to_end(s)
            return rows
        lst = self.listing
        lo = int(lst.index_starts[s])
        hi = lo + int(lst.shard_counts[s])
        parquet = self._parquet()
        starts = self._group_starts
        first, last = (int(np.searchsorted(starts, r, side="right")) - 1 for r in (lo, max(lo, hi - 1)))
        names = [*_MEMBER_COLUMNS, *((_DIGESTS,) if _DIGESTS in parquet.schema_arrow.names else ())]
        table = parquet.read_row_groups(list(range(first, last + 1)), columns=names)
        table = table.slice(lo - int(starts[first]), hi - lo)
        rows = {name: column_array(table.column(name)) for name in names}
        if len(rows["shard"]) != hi - lo or (len(rows["shard"]) and (rows["shard"] != rows["shard"][0]).any()):
            raise RuntimeError(
                f"the index {lst.index[1]} does not hold shard {lst.paths[s]}'s rows where its footer "
                "says: write it again with `raypipe index`"
            )
        self._kept[s] = rows
        if len(self._kept) > _KEPT_SHARDS:
            self._kept.popitem(last=False)
        return rows

    def _parquet(self) -> pq.ParquetFile:
        if self._file is None:
            fs, where = self.listing.index
            self._file = pq.ParquetFile(where if fs is None else fs.open_input_file(where))
            sizes = [self._file.metadata.row_group(g).num_rows for g in range(self._file.metadata.num_row_groups)]
            self._group_starts = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        return self._file


def read_footer(fs: pafs.FileSystem | None, where: str) -> dict:
    """The ``raypipe.index`` JSON of an index file, read from its footer alone."""
    if fs is None:
        return index_meta(pq.read_schema(where).metadata, where)
    with fs.open_input_file(where) as f:
        return index_meta(pq.ParquetFile(f).schema_arrow.metadata, where)


def footer_rows(meta: dict) -> int | None:
    """The samples an index holds, from its footer (None: an index written without per-shard counts)."""
    shards = meta["shards"]
    return sum(int(s["rows"]) for s in shards) if all("rows" in s for s in shards) else None


def listing_by_shard(
    root: DatasetRoot,
    rels: list[str],
    current: dict[str, tuple[int, int]],
    index: tuple[pafs.FileSystem | None, str],
    meta: dict,
    shown: str,
    *,
    beside: bool = False,
) -> ShardListing:
    """``rels`` (sorted, with their current stamps) listed by shard from the index footer ``meta``
    (``beside``: the index found beside the shards, whose paths are relative to its own folder)."""
    if footer_rows(meta) is None:
        raise ValueError(f"the index {shown} holds no per-shard sample counts: write it again with `raypipe index`")
    shards = meta["shards"]
    counts = np.array([int(s["rows"]) for s in shards], dtype=np.int64)
    starts = np.cumsum(counts) - counts  # the index's rows are its shards' in its own order
    names = relative_paths(meta.get("root") or root.root, [s["path"] for s in shards], root, beside=beside)
    at = {name: k for k, name in enumerate(names) if name is not None}
    missing = [r for r in rels if r not in at]
    if missing:
        raise ValueError(
            f"{len(missing)} of the {len(rels)} shards are not in the index {shown}, e.g. "
            f"{root.display(missing[0])}: listed by shard, every shard must be indexed; "
            "`raypipe index` writes the index again"
        )
    order = np.array([at[r] for r in rels], dtype=np.int64)
    changed = [r for r, k in zip(rels, order, strict=True) if not size_matches(int(shards[k]["size"]), current[r])]
    if changed:
        raise ValueError(
            f"{len(changed)} of the {len(rels)} shards changed since {shown} indexed them (another "
            f"size), e.g. {root.display(changed[0])}: listed by shard, their rows cannot be trusted; "
            "`raypipe index` writes the index again"
        )
    stamps = np.array([current[r] for r in rels], dtype=np.int64).reshape(-1, 2)
    incomplete = [
        {
            "shard": root.display(r),
            "listed_samples": int(shards[k]["keys"]),
            "stopped_at": shards[k]["stopped_at"],
            "shard_bytes": int(shards[k]["size"]),
            "reason": shards[k]["reason"],
        }
        for r, k in zip(rels, order, strict=True)
        if shards[k]["stopped_at"] is not None
    ]
    return ShardListing(root, index, rels, counts[order], starts[order], stamps, incomplete)
