"""A ``torch.utils.data.IterableDataset`` view, for code that insists on a ``DataLoader``.

raypipe's batches are already batches: made by Ray workers, packed to ``batch_size``, and (through a
``RankLoader`` or ``DeviceLoader``) on the device. The ``DataLoader`` must pass them on untouched:

    DataLoader(RaypipeIterableDataset(loader), batch_size=None, num_workers=0)

``batch_size=None`` turns off the ``DataLoader``'s own batching (with a batch size it would stack
whole batches into a batch of batches); ``num_workers=0`` keeps iteration in this process (a worker
process would run its own copy of the stream and every batch would arrive once per worker). A
``DataLoader`` worker that iterates this view raises. Tuples come out as lists (the ``DataLoader``'s
``default_convert``), numpy arrays as tensors; host batches from an ``EpochSource`` are read-only
views of Ray's object store, so torch warns once that their tensors are not writable (do not write
to them; copy first).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch.utils.data

__all__ = ["RaypipeIterableDataset"]


class RaypipeIterableDataset(torch.utils.data.IterableDataset):
    """A ``DataLoader``'s view of a raypipe source (see the module doc). Each ``iter()`` is the source's
    next epoch (in a ``DataLoader`` worker it raises ``RuntimeError``); ``set_epoch`` and ``len()`` are
    the source's.

    Args:
        source: a ``RankLoader`` (yields ``(input, target)`` on the device), a ``DeviceLoader``, or an
            ``EpochSource`` / ``FeederSource`` (yields the packed host batches: dicts of uint8 NHWC
            ``image``, int64 ``label`` and ``sample_id``).

    Raises:
        Nothing: ``source`` is not checked.
    """

    def __init__(self, source: Iterable):
        super().__init__()
        self.source = source

    def __iter__(self) -> Iterator[Any]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "RaypipeIterableDataset runs in a DataLoader worker: give the DataLoader num_workers=0 (raypipe's "
                "Ray workers do the loading; a DataLoader worker would repeat the whole stream)"
            )
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)

    def set_epoch(self, epoch: int) -> None:
        self.source.set_epoch(epoch)

    def __getstate__(self):
        raise TypeError("RaypipeIterableDataset cannot be sent to DataLoader worker processes: use num_workers=0")
