"""The Ray Train recipe: this rank's loader inside a user's own ``train_loop_per_worker``.

::

    def train_loop_per_worker(config):
        loader = raypipe.ray_loader(config["data"], input_size=224, batch_size=128, is_training=True)
        model = ray.train.torch.prepare_model(timm.create_model("resnet50", num_classes=1000))
        for epoch in range(config["epochs"]):
            loader.set_epoch(epoch)
            for input, target in loader:
                ...

    TorchTrainer(train_loop_per_worker, train_loop_config={"data": "s3://bucket/train", "epochs": 90},
                 scaling_config=ScalingConfig(num_workers=8, use_gpu=True)).fit()

Rank and world size come from ``ray.train.get_context()``, the device from
``ray.train.torch.get_device()``. Do not give the dataset to the trainer (``datasets=``): raypipe
splits the epoch itself, every sample exactly once per epoch across ranks, and every rank takes the
same number of steps (docs/integrations.md).
"""

from __future__ import annotations

from typing import Any

from raypipe.integrations.loader import RankLoader

__all__ = ["ray_loader"]


def ray_loader(data: Any, *, input_size: Any, batch_size: int, is_training: bool = False, **kwargs: Any) -> RankLoader:
    """This Ray Train worker's :class:`RankLoader` over ``data``; rank and world size are Ray Train's.

    Args:
        data: a path/URI, or ``SourceRows`` listed once on the driver and passed in
            ``train_loop_config`` (which saves each worker a listing).
        input_size, batch_size, is_training: as :func:`raypipe.timm.create_loader` takes them.
        **kwargs: the other arguments of :func:`raypipe.timm.create_loader` (timm's names: ``re_prob``,
            ``auto_augment``, ``crop_pct``, ``collate_fn=FastCollateMixup(...)``, ``img_dtype`` …, and
            raypipe's ``seed``, ``mixup``, ``execution``, ``channels_last``, ``feeder`` …). ``device``
            defaults to Ray Train's; ``reserved_cpus`` to the CPUs the trainers hold (this worker's,
            times the world size).

    Returns:
        The :class:`RankLoader`.

    Raises:
        ValueError: ``rank``, ``world_size`` or ``distributed`` given.
        Exception: what :func:`raypipe.timm.create_loader` raises.
    """
    import ray
    import ray.train
    import ray.train.torch

    from raypipe.integrations.timm_loader import create_loader

    for name in ("rank", "world_size", "distributed"):
        if name in kwargs:
            raise ValueError(f"{name}=: ray_loader takes rank and world size from Ray Train's context")
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if kwargs.get("device") is None:
        kwargs["device"] = ray.train.torch.get_device()
    if kwargs.get("reserved_cpus") is None:
        kwargs["reserved_cpus"] = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0) * world
    return create_loader(data, input_size, batch_size, is_training=is_training, rank=rank, world_size=world, **kwargs)
