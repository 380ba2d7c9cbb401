"""A Ray Dataset as a source: one listing pass on the driver, then rows like any other listing's.

``list_ray_dataset(ds, image_column=…, label_column=…)`` iterates ``ds`` once, in its own order
(``preserve_order`` on for that pass), ``block_rows`` rows at a time, and numbers the rows 0 … n-1 in
that order: the same Dataset (the same inputs, read the same way) gives the same ``sample_id``s and the
same ``digest()`` on every listing. What a row holds decides what the listing is:

- **paths or URIs** (a string column, relative ones under ``root``): a manifest's listing (kind
  ``manifest``), read from the root by the workers as any manifest's files are; nothing but the paths
  and labels is kept.
- **image bytes** (a binary column, or Hugging Face's ``{bytes, path}`` struct): each listed block of
  ``block_rows`` rows puts its image bytes in Ray's object store as a one-column Arrow table
  (``ray.put``: owned by this process, spilled to disk by Ray when the store is full). The listing
  (kind ``raydata``) holds per row the block as ``shard`` (its path ``block{k}``, which keeps the digest
  stable) and the row inside it as ``row``; ``SourceRows.extra["blocks"]`` holds the blocks' object refs
  by shard, which keep the bytes alive as long as the rows live. Workers get a block by its ref
  (``raypipe.sources.formats.ray_blocks``), zero-copy on the node that holds it.

Labels are integers or class names (strings), numbered as a manifest's are (``class_order``,
``class_map``: ``raypipe.sources.formats.manifest``). A null or empty image cell, a null or empty path, a null,
negative or unknown label: the row stays, with its skip reason (``null_image``, ``empty``,
``bad_label``), so each epoch counts it. The bytes a listing may put are bounded (``max_bytes``, by
default half the object store of this node: the other half is the room the chunks in flight take);
past it, the listing stops with one line that says what to do instead: write the Dataset out
(``ds.write_parquet``, which Ray Data streams), then read that, or shards made of it (``raypipe
convert``).
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raypipe.kernels.errors import EMPTY, NULL_IMAGE
from raypipe.sources.fields import with_value_columns
from raypipe.sources.formats.manifest import class_labeller, number_labels
from raypipe.sources.options import ListingOptions
from raypipe.sources.table import ROW_SCHEMA, SourceRows, int64_array, make_file_rows
from raypipe.sources.transport.paths import DatasetRoot, open_root

__all__ = ["DATASET_ROOT", "is_ray_dataset", "list_ray_dataset"]

# The root of a listing whose bytes are in the object store: no filesystem is read; reports show a
# row as ``ray.data/block3#row=17``.
DATASET_ROOT = DatasetRoot(root="ray.data", filesystem=None, uri="ray.data")


def is_ray_dataset(data) -> bool:
    """Whether ``data`` is a ``ray.data.Dataset`` (without importing Ray Data: none exists before it is)."""
    module = sys.modules.get("ray.data")
    return module is not None and isinstance(data, module.Dataset)


def list_ray_dataset(ds, *, options: ListingOptions | None = None, **keywords) -> SourceRows:
    """List a Ray Dataset (see the module doc) with ``options`` (``ListingOptions``) or the same fields as
    keywords. The image column is ``image_column`` where the Dataset has it, else ``path_column``; bytes
    or paths by its type. ``root`` (a folder or URI) is required for paths. ``max_bytes``: the most image
    bytes put in the object store (None: half this node's store)."""
    o = ListingOptions.of(options, **keywords)
    if o.changed("kind", "index"):
        raise ValueError("kind= and index= are for datasets named by a path; a Ray Dataset's kind is its rows'")
    droot = open_root(o.root, filesystem=o.filesystem) if o.root is not None else None
    labelled = class_labeller(o.class_order, o.class_map, droot)  # a relative class_map file: under the root
    context = ds.context.execution_options
    kept = context.preserve_order
    context.preserve_order = True  # the Dataset's order, not its blocks' completion order: stable ids
    listing = _Listing(o, root_given=droot is not None)
    try:
        for batch in ds.iter_batches(batch_size=o.block_rows, batch_format="pyarrow"):
            listing.add(batch)
    finally:
        context.preserve_order = kept
    if listing.rows == 0:
        raise ValueError("the Ray Dataset has no rows")
    labels, errors, names = number_labels(listing.labels(), listing.rows, labelled)
    errors = _first_reason(errors, listing.image_errors())
    classes = tuple(names or ())
    fields = {"fields": o.fields} if o.fields else {}
    if listing.paths_given:
        table = make_file_rows(pa.chunked_array(listing.paths, pa.string()), labels, errors)
        table = with_value_columns(table, listing.fields, "the Ray Dataset")
        return SourceRows(kind="manifest", root=droot, table=table, classes=classes, extra=fields)
    return SourceRows(
        kind="raydata",
        root=DATASET_ROOT,
        table=with_value_columns(listing.table(labels, errors), listing.fields, "the Ray Dataset"),
        classes=classes,
        image_column=listing.column,
        extra={"blocks": tuple(listing.refs), **fields},
    )


class _Listing:
    """What the pass keeps of each batch: labels, and the paths or the blocks' refs."""

    def __init__(self, options: ListingOptions, *, root_given: bool):
        self.names = (options.image_column, options.path_column, options.label_column)
        self.root_given = root_given
        self.column = ""
        self.paths_given = False
        self.rows = 0
        self.limit = options.max_bytes
        self.put_bytes = 0
        self.label_chunks: list[pa.Array] = []
        self.paths: list[pa.Array] = []
        self.errors: list[pa.Array] = []
        self.refs: list = []
        self.block_sizes: list[int] = []
        self.fields: dict[str, list[pa.Array]] = {name: [] for name in options.fields}  # their values, kept

    def add(self, batch: pa.Table) -> None:
        image_column, path_column, label_column = self.names
        if not self.column:
            self._first(batch)
        for name in (self.column, label_column, *self.fields):
            if name not in batch.column_names:
                raise ValueError(f"the Ray Dataset has no column {name!r} (columns: {batch.column_names})")
        m = batch.num_rows
        if m == 0:
            return
        self.label_chunks.append(_label_chunk(batch.column(label_column).combine_chunks(), label_column))
        for name, chunks in self.fields.items():
            chunks.append(batch.column(name).combine_chunks())
        cells = batch.column(self.column).combine_chunks()
        if self.paths_given:
            if not (pa.types.is_string(cells.type) or pa.types.is_large_string(cells.type)):
                raise ValueError(f"column {self.column!r} holds {cells.type} in a later block, strings before")
            paths = cells.cast(pa.string())
            self.paths.append(pc.fill_null(paths, ""))
            self.errors.append(_missing(paths, pc.equal(paths, ""), NULL_IMAGE, "no path", NULL_IMAGE, "empty path"))
        else:
            images = _image_bytes(cells, self.column)
            self.errors.append(
                _missing(
                    images,
                    pc.equal(pc.binary_length(images), 0),
                    NULL_IMAGE,
                    f"null {self.column!r} cell",
                    EMPTY,
                    "zero bytes",
                )
            )
            self._put(images)
        self.rows += m

    def _first(self, batch: pa.Table) -> None:
        image_column, path_column, _ = self.names
        name = image_column if image_column in batch.column_names else path_column
        if name not in batch.column_names:
            raise ValueError(
                f"the Ray Dataset has neither an image column {image_column!r} nor a path column "
                f"{path_column!r} (columns: {batch.column_names})"
            )
        kind = batch.schema.field(name).type
        self.column = name
        self.paths_given = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        if self.paths_given and not self.root_given:
            raise ValueError(
                f"column {name!r} holds paths: pass root=, the folder or URI (s3://bucket/prefix) they lie in; "
                "relative paths are read under it, absolute ones and URIs must lie inside it"
            )

    def _put(self, images: pa.Array) -> None:
        import ray

        if self.limit is None:
            self.limit = _store_bytes() // 2
        self.put_bytes += images.nbytes
        if self.put_bytes > self.limit:
            raise ValueError(
                f"the Ray Dataset's image bytes pass {_gb(self.limit)} after {self.rows + len(images)} rows (the "
                "listing puts them in the object store: max_bytes, by default half of this node's): write them "
                "out instead, ds.write_parquet(DST) (streamed by Ray Data, nothing held), and train from DST, "
                "or make tar shards of it (`raypipe convert DST SHARDS --format webdataset`); or give max_bytes= "
                "to let Ray spill the rest to its disk"
            )
        self.refs.append(ray.put(pa.table({"image": images})))
        self.block_sizes.append(len(images))

    def labels(self) -> pa.ChunkedArray:
        """Every row's label as one column, integers or (where any block's are strings) strings."""
        chunks = self.label_chunks
        strings = any(pa.types.is_string(c.type) for c in chunks)
        kind = pa.string() if strings else pa.int64()
        return pa.chunked_array([c.cast(kind) for c in chunks], kind).combine_chunks()

    def image_errors(self) -> pa.Array:
        return pa.concat_arrays(self.errors) if self.errors else pa.nulls(0, pa.string())

    def table(self, labels: np.ndarray, errors: pa.Array | None) -> pa.Table:
        """The row table of a listing whose bytes were put: block ``k`` is shard ``k``, path ``block{k}``."""
        sizes = np.asarray(self.block_sizes, dtype=np.int64)
        shards = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        first = np.cumsum(sizes) - sizes
        rows = np.arange(self.rows, dtype=np.int64) - np.repeat(first, sizes)
        paths = pa.concat_arrays([pa.repeat(pa.scalar(f"block{k}"), int(m)) for k, m in enumerate(sizes)])
        columns = {
            "sample_id": int64_array(np.arange(self.rows, dtype=np.int64)),
            "label": int64_array(labels),
            "path": paths,
            "row": int64_array(rows),
            "shard": int64_array(shards),
        }
        if errors is not None:
            columns["error"] = errors
        schema = pa.schema([ROW_SCHEMA.field(name) for name in columns])
        return pa.Table.from_pydict(columns, schema=schema)


def _label_chunk(labels: pa.Array, name: str) -> pa.Array:
    """One block's labels as int64 or string (null-typed: all missing, as int64 nulls)."""
    if pa.types.is_dictionary(labels.type):
        labels = labels.dictionary_decode()
    kind = labels.type
    if pa.types.is_null(kind):
        return pa.nulls(len(labels), pa.int64())
    if pa.types.is_unsigned_integer(kind):  # no room for -1: a value past int64's range turns negative, bad
        return pc.cast(labels, pa.int64(), safe=False)
    if pa.types.is_integer(kind):
        return labels.cast(pa.int64())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return labels.cast(pa.string())
    raise ValueError(f"label column {name!r} holds {kind}: expected integers or class names (strings)")


def _image_bytes(cells: pa.Array, name: str) -> pa.Array:
    """A block's image cells as a binary array (Hugging Face's ``{bytes, path}`` struct: its bytes)."""
    if pa.types.is_struct(cells.type) and cells.type.get_field_index("bytes") >= 0:
        cells = pc.struct_field(cells, "bytes")
    if pa.types.is_binary(cells.type) or pa.types.is_large_binary(cells.type):
        return cells
    raise ValueError(f"column {name!r} holds {cells.type}: expected image bytes (binary) or paths (strings)")


def _missing(
    values: pa.Array, empty: pa.Array, null_reason: str, null_detail: str, empty_reason: str, empty_detail: str
) -> pa.Array:
    """Per row: ``null_reason: null_detail`` where the value is null, ``empty_reason: …`` where it is
    empty, else null."""
    null = pa.scalar(f"{null_reason}: {null_detail}")
    blank = pa.scalar(f"{empty_reason}: {empty_detail}")
    none = pa.scalar(None, pa.string())
    return pc.if_else(pc.is_null(values), null, pc.if_else(pc.fill_null(empty, False), blank, none))


def _first_reason(labels: pa.ChunkedArray | None, images: pa.Array) -> pa.Array | None:
    """Each row's skip reason: its label's, else its image's; None when no row has one."""
    if labels is not None:
        images = pc.coalesce(labels.combine_chunks(), images)
    return images if images.null_count < len(images) else None


def _store_bytes() -> int:
    """The object store of this process's node, in bytes."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == here:
            return int(node.get("Resources", {}).get("object_store_memory", 0))
    return int(ray.cluster_resources().get("object_store_memory", 0))


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
