"""A block's fields on the worker: each row's value read, decoded, transformed, then packed per field.

The augmentation stage asks ``FieldRows.value(i)`` for row ``i``'s values before it decodes the image
(a row without a field is skipped without that cost), and ``FieldRows.finish(ok)`` once for the
block's ``fields``: per field, one array of ``(rows, *shape)`` where every good row's value is a
number or an array of one shape and dtype (a tokenizer's ids), else a list (text, parsed JSON, bytes).
A user's field transform that raises is a bug of that transform, never a skip: ``FieldTransformError``
fails the epoch naming the sample and the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future

import numpy as np

from raypipe.kernels.errors import SkipImage
from raypipe.sources.fields import cells, decode_member

__all__ = ["FieldRows", "FieldTransformError", "check_field_transforms", "field_array"]


def check_field_transforms(transforms, fields: tuple[str, ...]) -> tuple[tuple[str, Callable], ...]:
    """``{field: fn}`` (or None) as the ``StageSpec``'s pairs, in the listing's field order.

    Raises:
        ValueError: a field the listing does not carry, or a transform that is not callable.
    """
    if transforms is None:
        return ()
    if not isinstance(transforms, Mapping):
        raise ValueError(f"field_transforms={transforms!r}: expected a {{field: callable}} mapping or None")
    for name, fn in transforms.items():
        if name not in fields:
            raise ValueError(
                f"field_transforms: {name!r} is not a field of the listing (its fields: {list(fields)}; "
                "ListingOptions(fields=...) names them)"
            )
        if not callable(fn):
            raise ValueError(f"field_transforms[{name!r}]={fn!r}: expected a callable")
    return tuple((name, transforms[name]) for name in fields if name in transforms)


class FieldTransformError(RuntimeError):
    """A field transform (``Pipeline(field_transforms=…)``) raised on a sample's value: a bug of that
    transform, which fails the epoch. The message names the field, the transform, the sample id and its
    place; the transform's own exception is its ``__cause__`` (where it survived the trip between
    processes)."""


class FieldRows:
    """The fields of one block: raw values (member bytes, maybe still in flight, or column cells) in,
    each good row's transformed values out."""

    def __init__(
        self,
        rows: Mapping[str, np.ndarray],
        names: tuple[str, ...],
        members: Mapping[str, list],
        transforms: Mapping[str, Callable],
    ):
        self.rows, self.names, self.transforms = rows, names, transforms
        self.members = members  # a WebDataset's: each field's member bytes (or Future, or skip) per row
        self.raw = {name: members[name] if name in members else cells(rows, name) for name in names}
        n = len(rows["sample_id"])
        self.values: dict[str, list] = {name: [None] * n for name in names}

    def value(self, i: int) -> None:
        """Read and decode row ``i``'s fields; raise its ``SkipImage`` where one is missing or bad."""
        for name in self.names:
            v = self.raw[name][i]
            if isinstance(v, Future):
                v = v.result()
            if isinstance(v, SkipImage):
                raise v
            self.values[name][i] = decode_member(name, v) if name in self.members else v

    def transform(self, i: int, where: str) -> None:
        """Run the field transforms on row ``i``'s values (a good row's: its image was made)."""
        for name, fn in self.transforms.items():
            try:
                self.values[name][i] = _numpy(fn(self.values[name][i]))
            except Exception as exc:  # noqa: BLE001 - any exception of the user's code is that code's
                sid = int(self.rows["sample_id"][i])
                raise FieldTransformError(
                    f"the field transform of {name!r} ({_name(fn)}) raised on sample {sid} ({where}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

    def finish(self, ok: np.ndarray) -> dict[str, np.ndarray | list]:
        """Each field's values for the block: an array where the good rows' values allow, else a list
        (a skipped row's entry: zeros, or None)."""
        return {name: field_array(self.values[name], ok) for name in self.names}


def field_array(values: list, ok: np.ndarray) -> np.ndarray | list:
    """``values`` (one per row) as one ``(rows, *shape)`` array where every good row's value is a number
    or an array of one shape and dtype (skipped rows zero), else the list itself (skipped rows None)."""
    good = [values[i] for i in np.flatnonzero(ok)]
    if not good or not all(_numeric(v) for v in good):
        return [v if k else None for v, k in zip(values, ok, strict=True)]
    first = np.asarray(good[0])
    if not all(np.shape(v) == first.shape and np.asarray(v).dtype == first.dtype for v in good):
        return [v if k else None for v, k in zip(values, ok, strict=True)]
    out = np.zeros((len(values), *first.shape), dtype=first.dtype)
    for i in np.flatnonzero(ok):
        out[i] = values[i]
    return out


def _numeric(v) -> bool:
    if isinstance(v, bool | int | float | np.number | np.bool_):
        return True
    return isinstance(v, np.ndarray) and v.dtype.kind in "biuf"


def _numpy(value):
    """A torch tensor as a NumPy array (blocks are NumPy only; ``DeviceLoader`` makes it a tensor again)."""
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        return value.detach().cpu().numpy()
    return value


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
