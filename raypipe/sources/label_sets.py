"""Several labels per image: a label column of lists of class ids (a multi-label set, e.g. a Parquet
``list<int64>`` column).

The listing keeps each row's set as column ``labels`` (``list<int64>``) beside ``label``, which then
holds 0 for a good row and -1 for a bad one (a null set, or an id that is null or negative: skipped as
``bad_label``, as a bad single label is). The workers turn a set into a multi-hot row of
``num_classes`` (``multi_hot``), which the batch carries as its ``label``; the ``DeviceLoader``'s
mixup, cutmix and label smoothing mix such targets as timm mixes soft ones.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["LABELS", "is_label_sets", "label_sets", "label_width", "multi_hot"]

LABELS = "labels"  # the row table's column of label sets


def is_label_sets(kind: pa.DataType) -> bool:
    """Whether a label column of this type holds sets of class ids (lists of integers)."""
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)


def label_sets(column: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """(a label column: 0 where the row's set is good, null where it is bad; the sets as ``list<int64>``,
    a bad row's empty)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    arr = arr.cast(pa.list_(pa.int64()))
    values = arr.flatten()
    bad_value = pc.or_(pc.is_null(values), pc.less(pc.fill_null(values, 0), 0)).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(arr).to_numpy()
    bad = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool).copy()
    bad[parents[bad_value]] = True
    label = pa.array(np.zeros(len(arr), np.int64), mask=bad)
    sets = pa.array([[] if b else s for b, s in zip(bad, arr.to_pylist(), strict=True)], pa.list_(pa.int64()))
    return label, sets


def label_width(rows, num_classes: int | None) -> int:
    """The multi-hot label's width for ``rows`` (0: its rows have one label each).

    Raises:
        ValueError: ``num_classes`` below the listing's own count of classes, or not an int >= 1.
    """
    if not getattr(rows, "multi_label", False):
        return 0
    own = rows.num_classes
    if num_classes is None:
        return own
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < max(own, 1):
        raise ValueError(f"num_classes={num_classes!r}: the listing's label sets hold ids up to {own - 1}")
    return num_classes


def multi_hot(sets, num_classes: int) -> np.ndarray:
    """``(len(sets), num_classes)`` uint8: 1 where a row's set holds the class (ids past ``num_classes``
    are a bug of the listing's count, raised as ``IndexError``)."""
    out = np.zeros((len(sets), num_classes), np.uint8)
    for i, ids in enumerate(sets):
        if ids is not None and len(ids):
            out[i, np.asarray(ids, dtype=np.int64)] = 1
    return out
