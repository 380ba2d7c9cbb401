"""The row table every source produces: one row per sample, nothing decoded yet.

Columns: ``sample_id`` int64 (the row's index in a deterministic listing order: the same listing gives
the same ids on every run and cluster size, but a file added to the dataset shifts the ids of every row
listed after it; ``split_keys`` is what does not move),
``label`` int64, ``path`` (relative to the root: the image file, the Parquet file or the tar shard),
``row`` int64 (row inside that Parquet file, -1 otherwise), ``error`` (a skip reason already known
when listing, e.g. a manifest line with no integer label; null for good rows), and where the bytes lie:

- ``shard`` int64: the unit that is read as a whole. Rows with the same ``shard`` are cheapest read
  together, in one block: a tar shard (its index among the sorted shards), a Parquet row group (its
  index across all row groups of all files, in file order), and for an image folder or a manifest each
  file on its own (``shard == sample_id``). Shard numbers are dense from 0 and ascend with
  ``sample_id``, so a shard is a contiguous run of ids. An execution layer that shuffles shards, then
  rows inside a window of shards, reads each shard once per epoch; for folders and manifests the same
  algorithm is a plain shuffle of rows.
- ``offset``, ``size`` int64: the byte range of a tar member's data inside its shard (-1 otherwise);
- ``member`` string: a tar member's name (null otherwise), for reports and the read's check of the
  member's header; ``header_crc`` int64: the CRC-32 of that header (-1 where not known), listings of
  tar shards only;
- ``object_size``, ``object_mtime_ns`` int64: the size and modification time (ns) of the object the
  row's bytes lie in (the image file, the tar shard or the Parquet file) as a remote listing saw them,
  -1 where the listing did not learn them (local roots, whose listings do not stat every file, and a
  manifest's paths, which are not listed). The reader's cache keys entries by them, so a cache hit needs
  no request to the store (``raypipe.sources.reader``). They describe the store, not the samples: the
  listing's digest leaves them out.

Rows that are known bad stay in the table so the epoch's accounting still sees every source row.

A listing holds only the columns its kind uses: ``sample_id``, ``label`` and ``path`` always, the others
where the kind can give them a value other than their default (``COLUMN_DEFAULTS``). A manifest's rows
are files read one by one that no store listed, so its table is ``sample_id``, ``label``, ``path`` and,
when a line's label is bad, ``error``: about 50 bytes a row for ImageNet's paths, where the eleven
columns took 98. Whatever reads a table treats a missing column as its default (``column_or_default``;
a chunk's columns as ``rows.get(name)``), and the digest and split keys are the same either way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyarrow.compute import max as pc_max

from raypipe.sources.transport.paths import DatasetRoot

__all__ = [
    "COLUMN_DEFAULTS",
    "ROW_SCHEMA",
    "SourceRows",
    "TableColumns",
    "column_array",
    "column_or_default",
    "int64_array",
    "listed_stamp",
    "make_file_rows",
    "make_rows",
    "string_array",
    "table_columns",
]

ROW_SCHEMA = pa.schema(
    [
        ("sample_id", pa.int64()),
        ("label", pa.int64()),
        ("path", pa.string()),
        ("row", pa.int64()),
        ("error", pa.string()),
        ("shard", pa.int64()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("member", pa.string()),
        ("object_size", pa.int64()),
        ("object_mtime_ns", pa.int64()),
        ("header_crc", pa.int64()),
    ]
)

_WITHOUT_CRC = pa.schema([f for f in ROW_SCHEMA if f.name != "header_crc"])

# What a column that a listing leaves out holds in every row (``shard``: each row its own shard).
COLUMN_DEFAULTS = {
    "row": -1,
    "error": None,
    "shard": "own",
    "offset": -1,
    "size": -1,
    "member": None,
    "object_size": -1,
    "object_mtime_ns": -1,
    "header_crc": -1,
}


def column_or_default(table: pa.Table, name: str) -> pa.ChunkedArray | pa.Array:
    """``table``'s column ``name``, or the column it stands for when the listing left it out."""
    if name in table.column_names:
        return table.column(name)
    if name not in COLUMN_DEFAULTS:
        raise KeyError(f"the row table has no column {name!r} (columns: {table.column_names})")
    n, default = table.num_rows, COLUMN_DEFAULTS[name]
    if default is None:
        return pa.nulls(n, ROW_SCHEMA.field(name).type)
    return int64_array(np.arange(n, dtype=np.int64) if default == "own" else np.full(n, default, np.int64))


@dataclass(frozen=True)
class SourceRows:
    """A listed dataset: the rows plus what a worker needs to read them. ``open_source`` makes one.

    Args:
        kind: the dataset's kind, as commented below.
        root: the ``DatasetRoot`` the rows' paths are under.
        table: the rows, a ``pyarrow.Table`` with (some of) ``ROW_SCHEMA``'s columns.
        classes: the class names in label order (empty: none).
        image_column: the column of image bytes (Parquet only).
        extra: what a lister adds (a Ray Dataset's ``blocks``, ``unmapped_classes``, …).

    Raises:
        Nothing: the fields are not checked.
    """

    kind: str  # "folder" | "parquet" | "manifest" | "webdataset" | "raydata" (bytes in Ray's object store)
    root: DatasetRoot
    table: pa.Table
    classes: tuple[str, ...] = ()
    image_column: str = ""  # Parquet only
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields its rows carry (``ListingOptions.fields``), in the order they were asked for."""
        return tuple(self.extra.get("fields", ()))

    @property
    def by_shard(self) -> bool:
        """False: a row per sample (``ShardListing`` is the listing by shard)."""
        return False

    def columns(self) -> TableColumns:
        """The columns a chunk's rows are taken from (``TableColumns``); a Ray Dataset's rows with their
        blocks' object refs, by which the workers read them (``raypipe.sources.formats.ray_blocks``)."""
        return TableColumns(self.table, blocks=self.extra["blocks"] if self.kind == "raydata" else None)

    def take(self, idx) -> SourceRows:
        """Rows ``idx`` (positions in the table) as a listing of their own, with what reading them needs:
        their rows, copied (a pickled slice would carry the whole table's buffers), and where the rows'
        bytes lie in objects by shard (``extra["blocks"]``: a Ray Dataset's), their own shards' only."""
        table = self.table.take(int64_array(idx))
        extra = dict(self.extra)
        blocks = extra.get("blocks")
        if blocks is not None:
            needed = set(column_array(table.column("shard")).tolist())
            extra["blocks"] = tuple(ref if k in needed else None for k, ref in enumerate(blocks))
        return replace(self, table=table, extra=extra)

    def numbered_like(self, classes: tuple[str, ...]) -> SourceRows:
        """These rows with their labels renumbered to ``classes`` (another split's class names), so the
        same name has the same label in both; a name ``classes`` lacks is a ``ValueError``. Rows
        without class names, or with the same ones, are returned as they are."""
        if not self.classes or not classes or tuple(self.classes) == tuple(classes):
            return self
        index = {name: i for i, name in enumerate(classes)}
        unknown = [name for name in self.classes if name not in index]
        if unknown:
            raise ValueError(
                f"{len(unknown)} class(es) are not among the {len(classes)} given, e.g. {unknown[:5]}: "
                "their labels would mean nothing to a model trained on those"
            )
        remap = np.array([index[name] for name in self.classes], dtype=np.int64)
        labels = column_array(self.table.column("label"))
        renumbered = np.where(labels >= 0, remap[np.clip(labels, 0, None)], labels)
        table = self.table.set_column(self.table.schema.get_field_index("label"), "label", int64_array(renumbered))
        return replace(self, table=table, classes=tuple(classes))

    def digest(self) -> str:
        """sha256 of the listing: the kind and the ``sample_id``, ``label``, ``path`` and ``row`` columns in
        row order. Two listings with the same digest read the same samples under the same ids and labels
        (the root is left out: one dataset may be mounted at different places on different nodes). Hashes
        the columns' buffers, not row by row: a million rows take a fraction of a second. ``object_size`` and
        ``object_mtime_ns`` are left out too: copies of one dataset on two nodes' disks differ in them."""
        h = hashlib.sha256(f"raypipe-listing-v1:{self.kind}:{len(self)}".encode())
        for name in ("sample_id", "label", "row"):
            col = column_or_default(self.table, name)
            h.update(np.ascontiguousarray(column_array(col), dtype="<i8").tobytes())
        chunks = [_string_buffers(chunk) for chunk in _chunks(self.table.column("path"))]
        for offsets, _ in chunks:  # lengths: "ab"+"c" != "a"+"bc"
            h.update(np.ascontiguousarray(np.diff(offsets), dtype="<i8").tobytes())
        for _, data in chunks:
            h.update(data)
        if self.multi_label:  # each row's set of labels, as its offsets and ids
            sets = self.table.column("labels").combine_chunks()
            h.update(np.ascontiguousarray(np.diff(sets.offsets.to_numpy()), dtype="<i8").tobytes())
            h.update(np.ascontiguousarray(sets.flatten().to_numpy(zero_copy_only=False), dtype="<i8").tobytes())
        return h.hexdigest()

    def split_keys(self) -> np.ndarray:
        """A well-mixed uint64 per row that depends on the row's own location only (its path, and its row
        inside a Parquet file), never on its position in the listing: a split made from it (train/val)
        keeps every image on its side when files are added to or removed from the dataset."""
        paths = self.table.column("path")
        rows = column_array(column_or_default(self.table, "row")).astype(np.uint64)
        keys = np.empty(len(self), dtype=np.uint64)
        for lo in range(0, len(self), _KEY_CHUNK):  # bounded temporaries: ~8 bytes per path byte
            hi = min(lo + _KEY_CHUNK, len(self))
            offsets, data = _string_buffers(paths.slice(lo, hi - lo).combine_chunks())
            keys[lo:hi] = _path_keys(offsets - offsets[0], np.frombuffer(data, np.uint8), rows[lo:hi])
        return keys

    def shard_ids(self) -> np.ndarray | None:
        """Each row's shard number (a read-only view where the column allows), or None where the
        listing has no ``shard`` column (each row its own shard)."""
        if "shard" not in self.table.column_names:
            return None
        return column_array(self.table.column("shard"))

    @property
    def num_shards(self) -> int:
        """Shards (units read as a whole, see the module docstring) in the listing."""
        if "shard" not in self.table.column_names:
            return len(self)  # each row its own shard
        shards = self.table.column("shard")
        return int(pc_max(shards).as_py()) + 1 if len(shards) else 0

    @property
    def multi_label(self) -> bool:
        """Whether each row holds a set of class ids (``raypipe.sources.label_sets``)."""
        return "labels" in self.table.column_names

    @property
    def num_classes(self) -> int:
        if self.classes:
            return len(self.classes)
        if self.multi_label:
            ids = pc_max(self.table.column("labels").combine_chunks().flatten()).as_py()
            return 0 if ids is None else int(ids) + 1
        labels = column_array(self.table.column("label"))
        return int(labels.max()) + 1 if len(labels) else 0


def make_rows(
    paths: list[str],
    labels,
    rows=None,
    errors=None,
    *,
    shards=None,
    offsets=None,
    sizes=None,
    members=None,
    object_sizes=None,
    object_mtimes=None,
    header_crcs=None,
) -> pa.Table:
    """The row table of a listing; ``shards`` defaults to one shard per row (files read one by one),
    ``object_sizes`` and ``object_mtimes`` (ns) to -1 (not known); ``header_crcs`` (tar members') is a
    column only where given."""
    n = len(paths)

    def ints(values, default):
        return int64_array(default if values is None else values)

    return pa.table(
        {
            "sample_id": int64_array(np.arange(n, dtype=np.int64)),
            "label": int64_array(labels),
            "path": string_array(paths),
            "row": ints(rows, np.full(n, -1, np.int64)),
            "error": string_array([None] * n if errors is None else errors),
            "shard": ints(shards, np.arange(n, dtype=np.int64)),
            "offset": ints(offsets, np.full(n, -1, np.int64)),
            "size": ints(sizes, np.full(n, -1, np.int64)),
            "member": string_array([None] * n if members is None else members),
            "object_size": ints(object_sizes, np.full(n, -1, np.int64)),
            "object_mtime_ns": ints(object_mtimes, np.full(n, -1, np.int64)),
            **({} if header_crcs is None else {"header_crc": int64_array(header_crcs)}),
        },
        schema=ROW_SCHEMA if header_crcs is not None else _WITHOUT_CRC,
    )


def make_file_rows(paths, labels, errors=None) -> pa.Table:
    """The row table of files read one by one that no store listed (a manifest's): ``sample_id``,
    ``label``, ``path`` (strings, an array or a chunked one), and ``error`` (strings, null for good rows)
    only when given and some row has one; every other column is its default."""
    n = len(paths)
    columns = {"sample_id": int64_array(np.arange(n, dtype=np.int64)), "label": int64_array(labels), "path": paths}
    if errors is not None and errors.null_count < len(errors):
        columns["error"] = errors
    schema = pa.schema([ROW_SCHEMA.field(name) for name in columns])
    return pa.Table.from_pydict(columns, schema=schema)


# Row tables go to and from numpy through their buffers: pyarrow's ``pa.array`` and ``to_numpy`` import
# pandas on their first call in a process (to check for pandas objects), a quarter of a second of CPU
# before a listing's first batch, in every process that lists or reads one.
def int64_array(values) -> pa.Array:
    """``values`` (any 1-D integer sequence) as an int64 arrow array."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    if data.ndim != 1:
        raise ValueError(f"expected a 1-D sequence of integers, got shape {data.shape}")
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def string_array(values) -> pa.Array:
    """A string array of ``values`` (str or None); all None is a null array of strings."""
    values = list(values)
    if all(v is None for v in values):
        return pa.nulls(len(values), pa.string())
    if any(v is None for v in values):
        return pa.array(values, type=pa.string())  # a validity bitmap: pyarrow's own builder
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(
        pa.large_string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    ).cast(pa.string())


def column_array(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column as numpy, as ``to_numpy(zero_copy_only=False)`` gives it: int64 without nulls as a
    read-only view of its buffer, strings as an object array (None for nulls)."""
    arr = column
    if isinstance(column, pa.ChunkedArray):  # combine_chunks copies even a single chunk
        arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if arr.type == pa.int64() and arr.null_count == 0:
        if len(arr) == 0:
            return np.empty(0, np.int64)
        view = np.frombuffer(arr.buffers()[1], np.int64, count=len(arr), offset=arr.offset * 8)
        view.flags.writeable = False  # the table's own memory
        return view
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        out = np.empty(len(arr), dtype=object)
        out[:] = arr.to_pylist()
        return out
    return arr.to_numpy(zero_copy_only=False)


def table_columns(table: pa.Table) -> dict[str, np.ndarray]:
    """Every column of ``table`` through :func:`column_array`."""
    return {name: column_array(table.column(name)) for name in table.column_names}


class TableColumns:
    """A listing's columns as a chunk's rows are taken from them, held at about the table's own bytes:
    int64 columns as views of the table's buffers (``column_array``), string columns (the path, a skip
    reason, a member name) as the table's Arrow arrays, turned into Python strings one chunk at a time.
    ``take(idx)`` is ``{name: column_array(column)[idx]}`` for every column: the same keys, dtypes and
    values, where ``table_columns`` would hold every path of the listing as a Python string (about 140
    bytes a row at ImageNet's paths: more than the table itself)."""

    def __init__(self, table: pa.Table, *, blocks=None):
        self.names = tuple(table.column_names)
        self._blocks = None  # a Ray Dataset's block refs by shard: ``take`` gives each row's as ``block``
        if blocks is not None:
            self._blocks = np.empty(len(blocks), dtype=object)
            for k, ref in enumerate(blocks):  # element by element: numpy would look inside sequences
                self._blocks[k] = ref
        self.num_rows = table.num_rows
        self._arrays: dict[str, np.ndarray] = {}
        self._strings: dict[str, tuple[list[pa.Array], np.ndarray]] = {}
        for name in self.names:
            column = table.column(name)
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                chunks = [c for c in _chunks(column) if len(c)] or [pa.nulls(0, column.type)]
                starts = np.cumsum([0] + [len(c) for c in chunks[:-1]])
                self._strings[name] = (chunks, starts)
            else:
                self._arrays[name] = column_array(column)

    def __len__(self) -> int:
        return self.num_rows

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Rows ``idx`` (row indices, any order) of every column, in the table's column order."""
        idx = np.asarray(idx)
        out = {}
        for name in self.names:
            if name in self._arrays:
                out[name] = self._arrays[name][idx]
            else:
                out[name] = _take_strings(*self._strings[name], idx)
        if self._blocks is not None:
            out["block"] = self._blocks[out["shard"]]
        return out


def _take_strings(chunks: list[pa.Array], starts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` of a string column kept in ``chunks`` (which begin at rows ``starts``) as an object
    array of Python strings (None for nulls), as ``column_array`` gives them."""
    out = np.empty(len(idx), dtype=object)
    if not len(idx):
        return out
    rows = int(starts[-1]) + len(chunks[-1])
    if idx.min() < 0 or idx.max() >= rows:
        bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
        raise IndexError(f"row {bad} is out of bounds for a column of {rows} rows")
    which = np.searchsorted(starts, idx, side="right") - 1
    by = np.argsort(which, kind="stable")  # the rows grouped by the Arrow chunk they lie in
    grouped = which[by]
    edges = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1], True])
    pieces = [
        chunks[c].take(int64_array(idx[by[a:b]] - starts[c]))
        for a, b, c in zip(edges[:-1], edges[1:], grouped[edges[:-1]], strict=True)
    ]
    out[by] = pa.concat_arrays(pieces).to_pylist()
    return out


def listed_stamp(info: pafs.FileInfo) -> tuple[int, int]:
    """``(object_size, object_mtime_ns)`` of a listed file as the row table records them (-1: not given)."""
    size, mtime = info.size, info.mtime_ns
    return (-1 if size is None else int(size)), (-1 if mtime is None else int(mtime))


def _chunks(column: pa.ChunkedArray | pa.Array) -> list[pa.Array]:
    return column.chunks if isinstance(column, pa.ChunkedArray) else [column]


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, memoryview]:
    """(offsets, bytes) of a string array's values, whatever its slice offset (no copy of the text)."""
    arr = arr.cast(pa.large_string())  # int64 offsets, the same for a string or large_string column
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype="<i8")[arr.offset : arr.offset + len(arr) + 1]
    if len(arr) == 0 or data_buf is None:
        return np.zeros(1, np.int64), memoryview(b"")
    return offsets, memoryview(data_buf)[int(offsets[0]) : int(offsets[-1])]


_KEY_CHUNK = 1 << 16


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised (wraps modulo 2**64 by design)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _path_keys(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One key per string ``data[offsets[i]:offsets[i+1]]`` and its ``rows[i]``: the sum of a mixed hash of
    every (position, byte) pair of the string (wrapping; a cumulative sum makes the per-string sums exact
    for empty strings too), mixed with the length and the row."""
    lengths = np.diff(offsets).astype(np.uint64)
    pos = np.arange(len(data), dtype=np.uint64) - np.repeat(offsets[:-1].astype(np.uint64), lengths.astype(np.int64))
    per_byte = _mix64(data.astype(np.uint64) | (pos << np.uint64(8)))
    cum = np.concatenate([np.zeros(1, np.uint64), np.cumsum(per_byte, dtype=np.uint64)])
    sums = cum[offsets[1:]] - cum[offsets[:-1]]
    return _mix64(sums ^ _mix64(lengths ^ (rows * np.uint64(0x9E3779B97F4A7C15))))
