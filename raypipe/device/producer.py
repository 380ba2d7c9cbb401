"""The DeviceLoader's producer side: steps 1-5 of ``raypipe.device.loader`` (fetch, stage, transfer,
transform, hand over) for each batch of a pass, on a thread of their own, and the queue the consumer
takes the batches from.

The device work is only *issued* here, on the side stream that ``Staging`` holds; the consumer waits
on each batch's ready event. Per batch, the random draws come from a generator seeded by ``(seed,
rank, epoch, batch)``, so they are the same on any device and after a resume.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raypipe.device.batch import BatchSpec, Parts, check_parts, join_batch, make_spec, split_batch
from raypipe.device.erasing import RandomErasing
from raypipe.device.mixup import Mixup
from raypipe.device.normalize import Normalize, nchw_shape, reads_host_directly
from raypipe.device.staging import Staging

__all__ = ["END", "BatchProducer", "Failure", "ProducerPass", "check_labels"]

END = object()  # the last item of a pass's queue: the source is exhausted


@dataclass
class Failure:
    """What ended a pass's production: raised again by the consumer, with its traceback."""

    exc: BaseException


class ProducerPass:
    """The producer thread of one pass over the source and its hand-over queue."""

    def __init__(self, prefetch: int) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def put(self, item: Any, poll_s: float = 0.05) -> bool:
        """Blocking put that gives up (False) once the epoch is being stopped, so a producer blocked on a
        full queue notices that its consumer went away."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=poll_s)
                return True
            except queue.Full:
                continue
        return False


@dataclass(frozen=True, eq=False)
class BatchProducer:
    """What the producer does to each batch of a pass, as the loader is configured when the pass starts;
    ``mixup_on()`` is asked per batch, so a switch from the trainer lands mid-pass."""

    normalize: Normalize
    erasing: RandomErasing | None
    mixup: Mixup | None
    layout: str
    img_dtype: torch.dtype
    seed: int
    rank: int
    staging: Staging
    noise: torch.Generator
    mixup_on: Callable[[], bool]

    def run(self, source: Iterable, ep: ProducerPass, epoch: int, first: int) -> None:
        """Steps 1-5 for every batch of one pass over ``source``, each handed over on ``ep``'s queue, then
        the end (or the failure, for the consumer to raise); the producer thread's target."""
        source_iter = None
        try:
            source_iter = iter(source)
            with self.staging.context():
                steps = self._transform(self._transfer(self._stage(self._fetch(source_iter, ep))), epoch, first)
                for item in steps:
                    if not ep.put(item):
                        return
            ep.put(END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            ep.put(Failure(exc))
        finally:
            close = getattr(source_iter, "close", None)
            if callable(close):
                close()

    def _fetch(self, source_iter: Iterator, ep: ProducerPass) -> Iterator[tuple[Parts, BatchSpec]]:
        # 1. next packed batch from the source; split it, fix the epoch's spec on the first one
        spec = None
        for batch in source_iter:
            if ep.stop.is_set():
                return
            parts = split_batch(batch)
            spec = spec or make_spec(parts, len(self.normalize.mean), self.layout)
            check_parts(parts, spec)
            if self.mixup is not None:
                check_labels(parts.label, self.mixup.num_classes)
            yield parts, spec

    def _stage(self, batches: Iterator) -> Iterator:
        # 2. copy into the next ring slot (waits until that slot's previous copy has finished)
        for parts, spec in batches:
            slot = self.staging.acquire()
            values = {"image": parts.image, "label": parts.label, "sample_id": parts.sample_id, **(parts.fields or {})}
            # On a CPU device normalise can read the source batch where it lies (read-only object-store
            # memory included) and writes its own output: the ring copy would be pure cost (~20 µs/img).
            direct = not self.staging.cuda and reads_host_directly(
                self.img_dtype, spec.layout, self.normalize.channels_last
            )
            host = {
                k: v if direct and k == "image" else self.staging.stage(slot, k, v)
                for k, v in values.items()
                if v is not None
            }
            yield parts, spec, slot, host

    def _transfer(self, staged: Iterator) -> Iterator:
        # 3. host -> device, non_blocking on the side stream; the slot's event marks the copies' end
        for parts, spec, slot, host in staged:
            dev = {key: self.staging.to_device(t, owned=key != "image") for key, t in host.items()}
            self.staging.copies_issued(slot)
            yield parts, spec, dev

    def _transform(self, moved: Iterator, epoch: int, first: int) -> Iterator:
        # 4. normalise, erase, mix on the side stream; 5. record the batch's ready event
        channels_last = self.normalize.channels_last
        for number, (parts, spec, dev) in enumerate(moved, start=first):
            words = [self.seed, self.rank, epoch, number]
            rng = np.random.default_rng(words)
            if self.erasing is not None:
                self.noise.manual_seed(int(np.random.SeedSequence([*words, 1]).generate_state(1)[0]))
            img = dev["image"]
            out = self.staging.output(nchw_shape(img.shape, spec.layout), self.img_dtype, channels_last)
            x = self.normalize(img, layout=spec.layout, out=out)
            n, c, h, w = x.shape
            if self.erasing is not None:
                self.erasing.apply_(x, self.erasing.draw(rng, n, c, h, w), self.noise)
            label = dev.get("label")
            if label is not None:
                label = label.long()
                if self.mixup is not None:
                    plan = None
                    if self.mixup_on():  # read per batch: a switch from the trainer lands mid-pass
                        plan = self.mixup.draw(rng, n, h, w)
                        self.mixup.apply_(x, plan)
                    label = self.mixup.target(label, plan)
            sid = dev.get("sample_id")
            sid = sid.long() if sid is not None else None
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            if not x.is_contiguous(memory_format=fmt):
                x = x.contiguous(memory_format=fmt)
            fields = {key: dev[key] for key in parts.fields or ()}
            tensors = [t for t in (x, label, sid, *fields.values()) if t is not None]
            yield join_batch(parts, x, label, sid, fields), self.staging.ready(), tensors, n


def check_labels(label: Any, num_classes: int) -> None:
    """Labels mixup can make targets of: one integer in [0, num_classes) per image, or a multi-hot row
    of ``num_classes`` 0s and 1s per image (several labels)."""
    if label is None:
        raise ValueError("mixup/cutmix needs a 'label' in every batch")
    arr = label.numpy() if isinstance(label, torch.Tensor) else np.asarray(label)
    if arr.ndim == 2 and arr.dtype.kind in "iub":
        if arr.shape[1] != num_classes or (arr.size and (arr.min() < 0 or arr.max() > 1)):
            raise ValueError(
                f"a multi-hot 'label' must be (N, num_classes={num_classes}) of 0 and 1, got {arr.dtype} {arr.shape}"
            )
        return
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"'label' must be a 1-D integer array for mixup/cutmix, got {arr.dtype} {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
        raise ValueError(f"'label' values must be in [0, num_classes={num_classes}), got {arr.min()}..{arr.max()}")
