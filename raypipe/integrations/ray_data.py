"""raypipe's decode + augment as a Ray Data transform.

::

    ds = ray.data.read_parquet("s3://bucket/train")          # columns: image (bytes), label, sample_id
    train = ds.map_batches(
        raypipe.RayDataAugment,
        fn_constructor_kwargs=dict(augment=raypipe.TrainAugment(input_size=224), seed=0, epoch=epoch),
        compute=ray.data.ActorPoolStrategy(size=8), batch_size=64,
    )
    for batch in train.iter_torch_batches(batch_size=128):   # image uint8 NHWC, label, sample_id
        ...

Each row goes through the stage raypipe's own tasks run (``raypipe.stages.augment``), seeded by
``(seed, epoch, sample id)``: a row's pixels are those raypipe's stream gives the same sample id at the
same seed and epoch, whatever the batch it lands in, the actor that runs it, or the run. The image
column holds bytes (binary, or Hugging Face's ``{bytes, path}`` struct) or paths (strings, read under
``root``); labels are integers (or class names, with ``classes``); the id column holds each row's
sample id (integers: a column of the data, or the ``sample_id`` of ``raypipe.open_source(ds)``).

Out: ``image`` (uint8, N x H x W x 3), ``label`` (int64) and ``sample_id`` (int64). A row that cannot
become an image (null or empty bytes, a corrupt file, a missing path, a null or negative label) is
dropped (``bad_rows="drop"``); ``bad_rows="keep"`` keeps it with a black image and adds ``ok`` (bool)
and ``reason`` (int8: 0, or the skip reason's code, ``REASON_NAMES[code]`` its name), columns that
``iter_torch_batches`` takes; ``details=True`` adds ``detail`` (strings, for a check before training,
not for torch). What Ray Data gives and does not is in docs/integrations.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from raypipe.config import DecodeConfig, EvalAugment, TrainAugment
from raypipe.kernels.errors import BAD_LABEL, REASON_CODES, REASON_NAMES
from raypipe.sources.fields import check_fields, value_column
from raypipe.sources.formats.raydata import DATASET_ROOT
from raypipe.sources.transport.paths import open_root
from raypipe.stages.augment import AugmentStage, StageSpec
from raypipe.stages.field_values import check_field_transforms

__all__ = ["BAD_ROWS", "REASON_CODES", "REASON_NAMES", "RayDataAugment"]

BAD_ROWS = ("drop", "keep")


class RayDataAugment:
    """A callable class for ``Dataset.map_batches`` (any ``batch_format``: numpy, pyarrow or pandas):
    decodes and augments each row with raypipe's stage, seeded by ``(seed, epoch, row[id_column])``
    (see the module doc).

    Args:
        augment: the transform, ``TrainAugment`` or ``EvalAugment``.
        seed, epoch: with each row's id, what its random draws are seeded by.
        image_column, label_column, id_column: the batch's columns.
        decode: a ``DecodeConfig`` (None: the default).
        root, filesystem: where a path column's files lie (a folder or URI; None: the column holds
            bytes).
        classes: class names in label order, for a label column of names.
        bad_rows: "drop", or "keep": bad rows stay, with ``ok`` and ``reason`` (a code of
            ``REASON_CODES``).
        details: with ``bad_rows="keep"``, add ``detail`` too.
        fields: columns carried beside each image into the output (``ListingOptions.fields``): a row
            whose field is null is skipped as ``missing_field``.
        field_transforms: ``{field: fn}`` run on each good row's value (``Pipeline(field_transforms=…)``);
            the output column is an array of the values where they are numbers or arrays of one shape,
            else an object array.

    Raises:
        TypeError: ``augment`` is neither a ``TrainAugment`` nor an ``EvalAugment``.
        ValueError: ``bad_rows`` not one of ``BAD_ROWS``, ``details`` without ``bad_rows="keep"``, a
            field name that is reserved or repeated, a transform of a field not named.
    """

    def __init__(
        self,
        augment: TrainAugment | EvalAugment,
        *,
        seed: int,
        epoch: int,
        image_column: str = "image",
        label_column: str = "label",
        id_column: str = "sample_id",
        decode: DecodeConfig | None = None,
        root: str | None = None,
        filesystem=None,
        classes: Sequence[str] | None = None,
        bad_rows: str = "drop",
        details: bool = False,
        fields: Sequence[str] = (),
        field_transforms: Mapping | None = None,
    ):
        if not isinstance(augment, (TrainAugment, EvalAugment)):
            raise TypeError(f"augment: expected a TrainAugment or EvalAugment, got {type(augment).__name__}")
        if bad_rows not in BAD_ROWS:
            raise ValueError(f"bad_rows={bad_rows!r}: expected one of {BAD_ROWS}")
        self.columns = (image_column, label_column, id_column)
        if details and bad_rows != "keep":
            raise ValueError('details=True adds the kept bad rows\' detail: it needs bad_rows="keep"')
        self.bad_rows, self.details = bad_rows, details
        self._class_index = {name: i for i, name in enumerate(classes)} if classes is not None else None
        self.fields = check_fields(tuple(fields))
        base = StageSpec(
            kind="raydata",
            root=DATASET_ROOT,
            augment=augment,
            decode=decode or DecodeConfig(),
            seed=int(seed),
            epoch=int(epoch),
            fields=self.fields,
            field_transforms=check_field_transforms(field_transforms, self.fields),
        )
        self._specs = {"bytes": base}
        if root is not None:
            self._specs["paths"] = dataclasses.replace(
                base, kind="manifest", root=open_root(root, filesystem=filesystem)
            )
        self._stages: dict[str, AugmentStage] = {}

    def __call__(self, batch) -> dict[str, np.ndarray]:
        image_column, label_column, id_column = self.columns
        cells = _column(batch, image_column)
        ids = _column(batch, id_column)
        if ids.dtype.kind not in "iu":
            raise ValueError(
                f"id column {id_column!r} holds {ids.dtype} values: every row needs an integer sample "
                "id (a null one makes the column float)"
            )
        labels, errors = _labels(_column(batch, label_column), label_column, self._class_index)
        rows = {"sample_id": ids.astype(np.int64), "label": labels, "error": errors}
        for name in self.fields:
            rows[value_column(name)] = _column(batch, name)
        if any(isinstance(c, str) for c in cells):
            if "paths" not in self._specs:
                raise ValueError(f"column {image_column!r} holds paths: pass root=, the folder or URI they lie in")
            kind, rows["path"] = "paths", np.array(["" if c is None else c for c in cells], dtype=object)
        else:
            kind, rows["bytes"] = "bytes", np.empty(len(cells), dtype=object)
            rows["bytes"][:] = [_bytes(c) for c in cells]
        out = self._stage(kind)(rows)
        ok = out["ok"]
        columns = {"image": out["image"], "label": out["label"], "sample_id": out["sample_id"]}
        columns.update((name, _as_column(values)) for name, values in out.get("fields", {}).items())
        if self.bad_rows == "keep":
            columns["ok"] = ok
            columns["reason"] = np.array([REASON_CODES[r] for r in out["reason"]], dtype=np.int8)
            if self.details:
                columns["detail"] = out["detail"].astype(str)
            return columns
        return columns if ok.all() else {name: values[ok] for name, values in columns.items()}

    def _stage(self, kind: str) -> AugmentStage:
        stage = self._stages.get(kind)
        if stage is None:  # made on first use: once per actor, which runs many batches
            stage = self._stages[kind] = AugmentStage(self._specs[kind])
        return stage


def _as_column(values) -> np.ndarray:
    """A field's values as a batch column: its array, or an object array of a list's values."""
    if isinstance(values, np.ndarray):
        return values
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _column(batch, name: str) -> np.ndarray:
    """Column ``name`` of a numpy (dict), pandas or pyarrow batch as numpy (strings and bytes as objects)."""
    if hasattr(batch, "column_names"):  # a pyarrow Table
        if name not in batch.column_names:
            raise ValueError(f"the batch has no column {name!r} (columns: {batch.column_names})")
        return batch.column(name).to_numpy(zero_copy_only=False)
    if isinstance(batch, Mapping) or hasattr(batch, "columns"):
        names = list(batch.keys()) if isinstance(batch, Mapping) else list(batch.columns)
        if name not in names:
            raise ValueError(f"the batch has no column {name!r} (columns: {names})")
        return np.asarray(batch[name])
    raise TypeError(f"expected a numpy, pandas or pyarrow batch, got {type(batch).__name__}")


def _bytes(cell):
    """An image cell as bytes, or None (a null cell: the reader's ``null_image`` skip)."""
    if isinstance(cell, Mapping):  # Hugging Face's image struct {bytes, path}
        cell = cell.get("bytes")
    return None if cell is None else bytes(cell)


def _labels(values: np.ndarray, name: str, class_index: dict[str, int] | None) -> tuple[np.ndarray, np.ndarray]:
    """Labels as int64 (-1 where bad) and each row's error (None, or ``bad_label: …``)."""
    n = len(values)
    labels = np.full(n, -1, dtype=np.int64)
    errors = np.full(n, None, dtype=object)
    if values.dtype.kind in "iu":
        good = values >= 0 if values.dtype.kind == "i" else values <= np.iinfo(np.int64).max
        labels[good] = values[good]
    elif values.dtype.kind == "f":  # integers with nulls, as numpy gives them: NaN where null
        good = np.isfinite(values) & (values >= 0) & (np.floor(values) == values)
        labels[good] = values[good].astype(np.int64)
    elif values.dtype.kind == "O":
        good = np.zeros(n, dtype=bool)
        for i, v in enumerate(values):
            label = _one_label(v, name, class_index)
            if label is not None:
                labels[i], good[i] = label, True
    else:
        raise ValueError(f"label column {name!r} holds {values.dtype}: expected integers or class names")
    for i in np.flatnonzero(~good):
        value = values[i].item() if isinstance(values[i], np.generic) else values[i]
        errors[i] = f"{BAD_LABEL}: label {value!r}"
    return labels, errors


def _one_label(value, name: str, class_index: dict[str, int] | None) -> int | None:
    if isinstance(value, str):
        if class_index is None:
            raise ValueError(f"label column {name!r} holds class names: pass classes=, the names in label order")
        return class_index.get(value.strip())
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value) if 0 <= value < 2**63 else None
    return None
