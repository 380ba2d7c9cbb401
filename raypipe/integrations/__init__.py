"""raypipe behind other people's training loops.

- ``raypipe.timm.create_loader``: timm's ``create_loader`` arguments in, an object that behaves as
  timm's loader does in timm's ``train.py`` out (docs/timm.md).
- ``ray_loader``: this rank's loader inside a Ray Train ``train_loop_per_worker`` (docs/integrations.md).
- ``RaypipeIterableDataset``: a ``torch.utils.data.IterableDataset`` view for code that needs a
  ``DataLoader``.

All of them build a :class:`RankLoader`: one rank's ``EpochSource`` (or ``FeederSource``), cut or
padded to the same number of batches on every rank (:class:`EqualBatches`), through a
``DeviceLoader``. Under torchrun the ranks of a node share one Ray (``connect_node``).
"""

from raypipe.integrations.epochs import EqualBatches
from raypipe.integrations.loader import RankLoader
from raypipe.integrations.node_ray import connect_node
from raypipe.integrations.ray_train import ray_loader
from raypipe.integrations.timm import create_loader
from raypipe.integrations.torch_data import RaypipeIterableDataset

__all__ = ["EqualBatches", "RankLoader", "RaypipeIterableDataset", "connect_node", "create_loader", "ray_loader"]
