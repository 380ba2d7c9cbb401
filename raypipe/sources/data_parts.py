"""The data a command or a config names: one dataset, or several mixed by weight.

``raypipe run``/``scan``/``preview`` and ``jobs/train.py`` take several datasets as a mixture
(``raypipe.sources.mixture``): ``--data A --data B --weights 0.7 0.3 [--samples-per-epoch N]``, or the
config file's ``data:`` list::

    data:
      - {path: s3://bucket/laion/, weight: 0.7, fields: [txt]}
      - {path: /data/imagenet.parquet, weight: 0.3, label_column: cls}

or, to set the epoch's rows too, ``data: {parts: [...], samples_per_epoch: 1000000}``. A part is a path,
or a mapping of ``path``, ``weight`` and the ``ListingOptions`` of ``PART_OPTIONS``, which a part sets over
the command's own (``--kind``, ``--fields`` …). Weights are given for every part or for none; none: each
part weighs its rows, so an epoch takes every row of every part once (the datasets concatenated and
shuffled together). One part without a weight or ``samples_per_epoch`` is that dataset, not a mixture.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raypipe._values import is_int, is_number
from raypipe.sources.options import ListingOptions

__all__ = ["PART_OPTIONS", "DataPart", "DataParts", "data_parts", "parse_data_section"]

# The listing options a part of a command's data may set for itself (the others are the command's).
PART_OPTIONS = ("kind", "image_column", "label_column", "path_column", "root", "index", "fields")


@dataclass(frozen=True)
class DataPart:
    """One dataset of a command's data: its ``path`` (or URI), ``weight`` (None: its rows) and the
    ``ListingOptions`` it sets over the command's (``options``: ``(name, value)`` pairs)."""

    path: str
    weight: float | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def listing(self, base: ListingOptions) -> ListingOptions:
        """``base`` with this part's own options."""
        return dataclasses.replace(base, **dict(self.options)) if self.options else base


@dataclass(frozen=True)
class DataParts:
    """A command's data: ``parts`` and the mixture's ``samples_per_epoch`` (see the module doc).

    Raises:
        ValueError: no part, weights given for some parts only, a weight that is not a finite number
            >= 0 or all of them 0, or ``samples_per_epoch`` < 1.
    """

    parts: tuple[DataPart, ...]
    samples_per_epoch: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))
        if not self.parts:
            raise ValueError("data: no dataset given")
        given = [p.weight is not None for p in self.parts]
        if any(given) and not all(given):
            raise ValueError("weights: give a weight for every dataset or for none (none: each weighs its rows)")
        for p in self.parts:
            if p.weight is not None and (not is_number(p.weight) or not math.isfinite(p.weight) or p.weight < 0):
                raise ValueError(f"weight {p.weight!r} of {p.path}: expected a finite number >= 0")
        if all(given) and not sum(p.weight for p in self.parts) > 0:
            raise ValueError("weights: every weight is 0; at least one dataset must be taken")
        spe = self.samples_per_epoch
        if spe is not None and (not is_int(spe) or spe < 1):
            raise ValueError(f"samples_per_epoch {spe!r}: expected an int >= 1")

    @property
    def is_mixture(self) -> bool:
        only = self.parts[0]
        return len(self.parts) > 1 or only.weight is not None or self.samples_per_epoch is not None

    def describe(self) -> str:
        """``A``, or ``A (0.7) + B (0.3)`` for a mixture (its weights, where given)."""
        if not self.is_mixture:
            return self.parts[0].path
        return " + ".join(p.path if p.weight is None else f"{p.path} ({p.weight:g})" for p in self.parts)

    def listed(self, base: ListingOptions | None = None) -> list:
        """Each part listed (``open_source``) with ``base`` and its own options."""
        from raypipe.sources import open_source

        base = base or ListingOptions()
        return [open_source(p.path, options=p.listing(base)) for p in self.parts]

    def mix(self, listed: Sequence) -> Any:
        """The data of the listed parts: the only one, or their ``MixtureListing``."""
        if not self.is_mixture:
            return listed[0]
        from raypipe.sources import open_source
        from raypipe.sources.mixture import Mixture, list_mixture

        weights = [p.weight if p.weight is not None else len(rows) for p, rows in zip(self.parts, listed, strict=True)]
        if not sum(weights) > 0:
            raise ValueError(f"data {self.describe()}: no dataset has a row")
        return list_mixture(Mixture(list(zip(listed, weights, strict=True)), self.samples_per_epoch), open_source)

    def open(self, base: ListingOptions | None = None) -> Any:
        """The listing the command reads: ``mix(listed(base))``."""
        return self.mix(self.listed(base))


def data_parts(
    paths: Sequence[str], weights: Sequence[float] | None = None, samples_per_epoch: int | None = None
) -> DataParts:
    """The command line's data: ``--data`` paths in order, ``--weights`` one per path.

    Raises:
        ValueError: as ``DataParts``, and a count of weights other than the paths'.
    """
    if weights is not None and len(weights) != len(paths):
        raise ValueError(f"--weights: {len(weights)} weight(s) for {len(paths)} dataset(s); give one per --data")
    ws = list(weights) if weights is not None else [None] * len(paths)
    return DataParts(tuple(DataPart(str(p), w) for p, w in zip(paths, ws, strict=True)), samples_per_epoch)


def parse_data_section(value: Any, *, where: str = "config") -> DataParts:
    """A config file's ``data:`` section (see the module doc).

    Raises:
        ValueError: a section of another shape, a part without a path, an unknown key (named), and what
            ``DataParts`` and ``ListingOptions`` refuse.
    """
    spe = None
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"parts", "samples_per_epoch"})
        if unknown or "parts" not in value:
            raise ValueError(f"{where}: data: expected a list of datasets, or a mapping of parts and samples_per_epoch")
        value, spe = value["parts"], value.get("samples_per_epoch")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise ValueError(f"{where}: data: expected a non-empty list of datasets (paths, or mappings with a path)")
    parts = []
    for k, item in enumerate(value):
        at = f"{where}: data[{k}]"
        if isinstance(item, str) and item:
            parts.append(DataPart(item))
            continue
        if not isinstance(item, Mapping) or not isinstance(item.get("path"), str) or not item.get("path"):
            raise ValueError(f"{at}: expected a path, or a mapping with a path")
        unknown = sorted(set(item) - {"path", "weight", *PART_OPTIONS})
        if unknown:
            raise ValueError(f"{at}: unknown key(s) {unknown}; a part takes path, weight and {', '.join(PART_OPTIONS)}")
        options = {name: item[name] for name in PART_OPTIONS if name in item}
        if isinstance(options.get("fields"), str):
            options["fields"] = (options["fields"],)
        try:
            ListingOptions(**options)  # checked here, where the file and the part can be named
        except ValueError as e:
            raise ValueError(f"{at}: {e}") from None
        parts.append(DataPart(item["path"], item.get("weight"), tuple(options.items())))
    try:
        return DataParts(tuple(parts), spe)
    except ValueError as e:
        raise ValueError(f"{where}: data: {e}") from None
