"""raypipe behind other people's training loops.

- ``raypipe.timm.create_loader``: timm's ``create_loader`` arguments in, an object that behaves as
  timm's loader does in timm's ``train.py`` out (docs/timm.md).
- ``ray_loader``: this rank's loader inside a Ray Train ``train_loop_per_worker`` (docs/integrations.md).
- ``RaypipeIterableDataset``: a ``torch.utils.data.IterableDataset`` view for code that needs a
  ``DataLoader``.
- ``RayDataAugment``: raypipe's decode + augment as a Ray Data ``map_batches`` transform.

All but the last build a :class:`RankLoader`: one rank's ``EpochSource`` (or ``FeederSource``), cut or
padded to the same number of batches on every rank (:class:`EqualBatches`), through a
``DeviceLoader``. Under torchrun the ranks of a node share one Ray (``connect_node``).

Names are imported lazily (PEP 562), as the package's own: a Ray Data actor that runs
``RayDataAugment`` imports ``raypipe.integrations.ray_data`` without torch and the device side.
"""

from __future__ import annotations

from raypipe._lazy import lazy_exports

_EXPORTS = {
    "EqualBatches": "raypipe.integrations.epochs",
    "RankLoader": "raypipe.integrations.loader",
    "RayDataAugment": "raypipe.integrations.ray_data",
    "RaypipeIterableDataset": "raypipe.integrations.torch_data",
    "connect_node": "raypipe.integrations.node_ray",
    "create_loader": "raypipe.integrations.timm_loader",
    "ray_loader": "raypipe.integrations.ray_train",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("raypipe.integrations", _EXPORTS, globals())
