"""RankLoader: one rank's batches, shaped the way timm's training script reads a loader.

    Pipeline ─▶ EpochSource / FeederSource ─▶ EqualBatches ─▶ DeviceLoader ─▶ (input, target)
               this rank's slice, one          same batch count    normalise, erase,
               stream for the whole run        on every rank       mix on the device

What timm's ``train.py`` touches, and what answers it here:

- ``len(loader)``: batches per rank per epoch, the same on every rank.
- ``for input, target in loader``: each ``iter()`` is the next epoch; ``input`` normalised NCHW on
  the device, ``target`` class indices (soft targets with mixup).
- ``loader.mixup_enabled``: read and set, as on timm's ``PrefetchLoader`` (``--mixup-off-epoch``).
- ``loader.sampler.set_epoch(e)`` (timm's ``_set_loader_epoch``): the next ``iter()`` is epoch ``e``:
  its order, its augmentation draws and its erasing/mixup draws.
- ``loader.dataset`` and ``loader.batch_sampler`` (None) exist, so ``_set_loader_epoch`` finds them.
- ``loader.sampler.num_valid_samples`` (eval): the rank's real rows before the padding, which timm's
  evaluator uses to drop the padding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from raypipe.device import from_timm_args
from raypipe.integrations.epochs import EqualBatches, eval_rows_per_rank, train_batches_per_rank
from raypipe.pipeline import EpochSource, FeederSource, Pipeline
from raypipe.plan.order import rank_slice
from raypipe.plan.span import RankSpan

__all__ = ["RankLoader", "EpochSampler"]


class EpochSampler:
    """What timm's loop finds at ``loader.sampler``: ``set_epoch`` moves the raypipe source (and the
    device draws) to that epoch. ``len()`` is this rank's rows per epoch, as a sampler's is."""

    def __init__(self, loader: RankLoader, num_samples: int, num_valid_samples: int | None):
        self._loader = loader
        self.num_samples = num_samples
        self.epoch = 0
        self._valid = num_valid_samples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._loader.set_epoch(epoch)

    @property
    def num_valid_samples(self) -> int | None:
        """Eval: this rank's rows of the dataset (the rest of its ``num_samples`` is padding). None in
        training, where nothing is padded. Rows skipped as unreadable are replaced by padding too, so
        with skips this counts some padding as real."""
        return self._valid

    def __len__(self) -> int:
        return self.num_samples


class RankLoader:
    """One rank's loader over ``pipeline`` (see the module doc); each ``iter()`` yields the next epoch's
    ``(input, target)`` on the device.

    Args:
        pipeline: the ``Pipeline``.
        training: batches full (``pipeline.config.drop_last`` must be set) and the same count on every
            rank; else eval: padded like timm's ``OrderedDistributedSampler``.
        rank, world_size, start_epoch, reserved_cpus: the rank's ``RankSpan``.
        device_kwargs: keywords of ``raypipe.device.from_timm_args`` (timm's names); ``seed`` defaults
            to the pipeline's, ``rank`` to this one.
        dataset: what ``loader.dataset`` shows (default: the pipeline's rows).
        yield_ids: yield ``(input, target, sample_id)`` (padding rows have ``sample_id == -1``).
            A pipeline whose listing carries fields yields them last, as a ``{name: values}`` dict.
        feeder: run the rank's source in a feeder process (``FeederSource``).

    Raises:
        ValueError: ``training`` without ``drop_last``, or with less than a batch per rank; an invalid
            span field or ``device_kwargs`` value (named).
        TypeError: a key of ``device_kwargs`` that ``from_timm_args`` does not take.
        Exception: with ``feeder``, what ``FeederSource`` raises.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        training: bool,
        rank: int = 0,
        world_size: int = 1,
        device_kwargs: dict[str, Any] | None = None,
        dataset: Any = None,
        yield_ids: bool = False,
        feeder: bool = False,
        start_epoch: int = 0,
        reserved_cpus: float = 0.0,
    ):
        cfg = pipeline.config
        n, b = len(pipeline.rows), cfg.batch_size
        if training and not cfg.drop_last:
            raise ValueError("a training RankLoader needs PipelineConfig(drop_last=True): every rank steps together")
        if training:
            num_batches, pad_to, valid = train_batches_per_rank(n, world_size, b), None, None
            if num_batches == 0:
                raise ValueError(
                    f"batch_size={b}: a rank gets {n // world_size} of the {n} images per epoch, less than "
                    "one full batch"
                )
        else:
            pad_to = eval_rows_per_rank(n, world_size)
            num_batches = -(-pad_to // b)
            span = rank_slice(n, rank, world_size)
            valid = span.stop - span.start
        cls = FeederSource if feeder else EpochSource
        span = RankSpan(rank=rank, world_size=world_size, start_epoch=start_epoch, reserved_cpus=reserved_cpus)
        self.source = cls(pipeline, span=span)
        self.pipeline = pipeline
        self.rank, self.world_size = rank, world_size
        self.training = training
        self.batches = EqualBatches(
            self.source,
            batch_size=b,
            num_batches=num_batches,
            pad_to=pad_to,
            image_shape=pipeline.batch_spec.image_shape,
        )
        kwargs = dict(device_kwargs or {})
        kwargs.setdefault("seed", cfg.seed)
        kwargs.setdefault("rank", rank)
        self.device_loader = from_timm_args(self.batches, **kwargs)
        self.device_loader.set_epoch(start_epoch)
        self.dataset = pipeline.rows if dataset is None else dataset
        self.batch_size = b
        self.batch_sampler = None  # timm's _set_loader_epoch asks for it before the sampler
        self.sampler = EpochSampler(self, pad_to if pad_to is not None else num_batches * b, valid)
        self.yield_ids = yield_ids

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def mixup_enabled(self) -> bool:
        return self.device_loader.mixup_enabled

    @mixup_enabled.setter
    def mixup_enabled(self, value: bool) -> None:
        self.device_loader.mixup_enabled = value

    @property
    def device(self):
        return self.device_loader.device

    @property
    def last_report(self):
        """The raypipe accounting of this rank's last finished epoch (emitted, skipped, dropped)."""
        return self.source.last_report

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` is epoch ``epoch``."""
        self.sampler.epoch = int(epoch)
        self.device_loader.set_epoch(epoch)

    def state_dict(self) -> dict:
        """This rank's position (``raypipe.plan.position.Position.as_dict()``), the same value a
        ``DeviceLoader`` over an ``EpochSource`` saves: the epoch, the batches the trainer took (repeated
        ones included), where the source is after them."""
        return self.device_loader.state_dict()

    def load_state_dict(self, state) -> None:
        """Go on from ``state`` at the next ``iter()``: this rank's own position, or the list of every
        rank's (a run resumed on another number of ranks), as any raypipe loader saved it."""
        self.device_loader.load_state_dict(state)
        self.sampler.epoch = self.device_loader.next_epoch

    def __iter__(self) -> Iterator[tuple]:
        fields = self.pipeline.rows.fields
        for batch in self.device_loader:
            out = (
                (batch["image"], batch["label"], batch["sample_id"])
                if self.yield_ids
                else (batch["image"], batch["label"])
            )
            yield (*out, {name: batch[name] for name in fields}) if fields else out

    def close(self) -> None:
        """Stop the device loader and the source's stream (and feeder). Idempotent."""
        self.device_loader.close()

    def __enter__(self) -> RankLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
