"""DeviceLoader: packed host batches in, normalised / erased / mixed device batches out.

A producer thread runs steps 1-5 for batch ``k+prefetch`` while the consumer trains on batch ``k``.
The host-side work (fetch, memcpy into the ring) releases the GIL in numpy/torch; the device work is
only *issued* by the producer and runs on the loader's side stream, behind whatever the consumer's
stream is doing. Timeline with ``prefetch=2`` (ring of 3 slots), consumer at batch 0::

    host, producer thread   1 fetch b3 | 2 stage b3 -> slot 0 | 3 issue H2D | 4 issue transform | 5 put
                            (step 2 first waits slot 0's copy event: b0's H2D, long finished)
    side stream (GPU)       ... b2: H2D, normalise, erase, mix [ready b2] | b3: H2D ...
    queue (<= prefetch)     [b1 ready-event] [b2 ready-event]
    consumer thread         6 get b0 (time blocked = data stall) | 7 wait b0's event on its stream,
                            record_stream its tensors | 8 yield b0 -> model forward/backward

The steps are small generators chained in ``_produce``; each numbered comment below is a step above.
On a CPU device the same chain runs with no stream, no pinning and no events: values are identical
to the CUDA path's up to kernel rounding (pixel-mode noise aside, which is drawn on the device).

Randomness: erasing and mixup parameters come from a ``numpy.random.Generator`` seeded by
``(seed, epoch)`` on the producer thread, which handles batches in order - so a run is reproducible,
the parameters need no device sync, and CPU and CUDA draw the same boxes and lams. Pixel-mode noise
comes from a ``torch.Generator`` on the device, seeded the same way. Global RNG is never touched.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from raypipe._handoff import put_unless_stopped
from raypipe.device._checks import check_int, fail
from raypipe.device.batch import LAYOUTS, BatchSpec, Parts, check_parts, join_batch, make_spec, split_batch
from raypipe.device.erasing import Erasing, apply_erasing_, draw_erasing
from raypipe.device.mixup import Mixing, apply_mixing_, draw_mixing, plan_target
from raypipe.device.normalize import nchw_shape, normalize, parse_img_dtype, reads_host_directly
from raypipe.device.staging import Staging

__all__ = ["DeviceLoader", "LoaderStats"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_END = object()


@dataclass
class LoaderStats:
    """Per-epoch counters (reset when an epoch starts). ``wait_s``: time the consumer was blocked."""

    epoch: int = 0
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Failure:
    exc: BaseException


class _Epoch:
    """The producer thread of one pass over the source and its hand-over queue."""

    def __init__(self, prefetch: int) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def put(self, item: Any) -> bool:
        """Blocking put that gives up (False) once the epoch is being stopped."""
        return put_unless_stopped(self.queue, item, self.stop)


class DeviceLoader:
    """Wrap an iterable of packed batches; yield them on ``device`` with images normalised.

    Batches are dicts (``image`` uint8 NHWC/NCHW numpy or torch, ``label`` int, ``sample_id`` int,
    other keys passed through) or ``(image, label, ...)`` tuples such as a torch DataLoader with timm's
    ``fast_collate`` yields. Output has the same structure: ``image`` NCHW ``img_dtype``
    (channels_last unless ``channels_last=False``), ``label`` int64 or, with mixup/cutmix/label
    smoothing, float32 soft targets (N, num_classes); ``sample_id`` int64 on the device.

    >>> src = [{"image": np.zeros((2, 4, 4, 3), np.uint8), "label": np.array([0, 1])}]
    >>> with DeviceLoader(src, img_dtype="float32") as loader:
    ...     [tuple(b["image"].shape) for b in loader]
    [(2, 3, 4, 4)]
    """

    def __init__(
        self,
        source: Iterable,
        *,
        device: str | torch.device = "cpu",
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        img_dtype: str | torch.dtype = torch.float16,
        channels_last: bool = True,
        layout: str = "auto",
        prefetch: int = 2,
        re_prob: float = 0.0,
        re_mode: str = "const",
        re_count: int = 1,
        re_min_area: float = 0.02,
        re_max_area: float = 1 / 3,
        re_min_aspect: float = 0.3,
        re_max_aspect: float | None = None,
        re_num_splits: int = 0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        cutmix_minmax: Sequence[float] | None = None,
        mix_prob: float = 1.0,
        switch_prob: float = 0.5,
        mixup_mode: str = "batch",
        label_smoothing: float = 0.0,
        correct_lam: bool = True,
        num_classes: int | None = None,
        seed: int = 0,
        close_timeout_s: float = 30.0,
    ) -> None:
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={device!r}: {exc}") from None
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                fail("device", device, "CUDA is not available on this machine")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
        elif self.device.type != "cpu":
            fail("device", device, "expected a 'cpu' or 'cuda[:n]' device")
        self.img_dtype = parse_img_dtype(img_dtype)
        self.mean, self.std = _channel_values("mean", mean), _channel_values("std", std)
        if len(self.mean) != len(self.std):
            fail("std", std, f"has {len(self.std)} values but mean has {len(self.mean)}")
        if any(s <= 0 for s in self.std):
            fail("std", std, "values must be > 0")
        if layout not in LAYOUTS:
            fail("layout", layout, f"expected one of {LAYOUTS}")
        self.layout = layout
        self.channels_last = bool(channels_last)
        self.prefetch = check_int("prefetch", prefetch, 1)
        self.seed = check_int("seed", seed, 0)
        self.erasing = Erasing(
            prob=re_prob, mode=re_mode, count=re_count, min_area=re_min_area, max_area=re_max_area,
            min_aspect=re_min_aspect, max_aspect=re_max_aspect, num_splits=re_num_splits,
        )  # fmt: skip
        self.mixing = Mixing(
            mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, cutmix_minmax=cutmix_minmax, prob=mix_prob,
            switch_prob=switch_prob, mode=mixup_mode, correct_lam=bool(correct_lam),
            label_smoothing=label_smoothing, num_classes=num_classes,
        )  # fmt: skip
        self.source = source
        self.close_timeout_s = float(close_timeout_s)
        self.stats = LoaderStats()
        self.last_wait_s = 0.0
        self._next_epoch = 0
        self._staging = Staging(self.device, self.prefetch + 1)
        self._active: _Epoch | None = None
        self._closed = False

    # -- public surface ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.source)  # TypeError when the source has no length, like any unsized iterable

    def set_epoch(self, epoch: int) -> None:
        """Seed the next pass with ``epoch`` (passes count up from 0 otherwise); e.g. after a resume."""
        self._next_epoch = check_int("epoch", epoch, 0)

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("DeviceLoader is closed")
        self._stop(self._active)  # a new pass ends an unfinished previous one
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        self.stats, self.last_wait_s = LoaderStats(epoch=epoch), 0.0
        return self._consume(epoch)

    def close(self) -> None:
        """Stop the producer thread, wait for pending copies, free the ring, and close the source if it
        has a ``close()`` (e.g. an ``EpochSource`` with a warmed-up next epoch). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop(self._active)
        self._staging.close()
        close_source = getattr(self.source, "close", None)
        if callable(close_source):
            close_source()

    def __enter__(self) -> DeviceLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- consumer side ----------------------------------------------------------------------------

    def _consume(self, epoch: int) -> Iterator[Any]:
        # The thread starts with the first next(): an iterator never advanced holds no thread.
        self._stop(self._active)
        ep = self._active = _Epoch(self.prefetch)
        ep.thread = threading.Thread(
            target=self._produce, args=(ep, epoch), name=f"raypipe-device-loader-{id(self):x}", daemon=True
        )
        ep.thread.start()
        try:
            while True:
                # 6. take the next ready batch; the time blocked here is the data stall
                start = time.perf_counter()
                item = self._take(ep)
                self.last_wait_s = time.perf_counter() - start
                self.stats.wait_s += self.last_wait_s
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc  # carries the producer-side traceback (source frames included)
                out, event, tensors, n = item
                # 7. the consumer's stream waits for the batch; its memory is protected until used
                self._staging.hand_over(event, tensors)
                self.stats.batches += 1
                self.stats.samples += n
                # 8. hand it to the training step
                yield out
        finally:
            self._stop(ep)

    def _take(self, ep: _Epoch) -> Any:
        """The pass's next item; a pass ended from outside (a new pass, ``close()``) raises instead of
        waiting forever for a producer that has gone."""
        while True:
            if ep.stop.is_set():
                why = "the loader was closed" if self._closed else "a new pass (iter(loader)) ended it"
                raise RuntimeError(f"this DeviceLoader pass cannot continue: {why}")
            try:
                return ep.queue.get(timeout=0.2)
            except queue.Empty:
                continue

    def _stop(self, ep: _Epoch | None) -> None:
        if ep is None or ep.thread is None:
            return
        ep.stop.set()
        while True:  # unblock a producer waiting on a full queue; drop what it made
            try:
                ep.queue.get_nowait()
            except queue.Empty:
                break
        if ep.thread is not threading.current_thread():
            ep.thread.join(self.close_timeout_s)
            if ep.thread.is_alive():
                warnings.warn(
                    f"DeviceLoader producer did not stop within {self.close_timeout_s}s "
                    "(source blocked in next()?); it is a daemon thread and will not keep the process alive",
                    RuntimeWarning,
                    stacklevel=3,
                )
        if self._active is ep:
            self._active = None

    # -- producer side ----------------------------------------------------------------------------

    def _produce(self, ep: _Epoch, epoch: int) -> None:
        rng = np.random.default_rng([self.seed, epoch])
        noise = torch.Generator(device=self.device)
        noise.manual_seed(int(np.random.SeedSequence([self.seed, epoch, 1]).generate_state(1)[0]))
        source_iter = None
        try:
            source_iter = iter(self.source)
            with self._staging.context():
                steps = self._transform(self._transfer(self._stage(self._fetch(source_iter, ep))), rng, noise)
                for item in steps:
                    if not ep.put(item):
                        return
            ep.put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            ep.put(_Failure(exc))
        finally:
            close = getattr(source_iter, "close", None)
            if callable(close):
                close()

    def _fetch(self, source_iter: Iterator, ep: _Epoch) -> Iterator[tuple[Parts, BatchSpec]]:
        # 1. next packed batch from the source; split it, fix the epoch's spec on the first one
        spec = None
        for batch in source_iter:
            if ep.stop.is_set():
                return
            parts = split_batch(batch)
            spec = spec or make_spec(parts, len(self.mean), self.layout)
            check_parts(parts, spec)
            if self.mixing.soft_targets:
                _check_labels(parts.label, self.mixing.num_classes)
            yield parts, spec

    def _stage(self, batches: Iterator) -> Iterator:
        # 2. copy into the next ring slot (waits until that slot's previous copy has finished)
        for parts, spec in batches:
            slot = self._staging.acquire()
            values = {"image": parts.image, "label": parts.label, "sample_id": parts.sample_id}
            # On a CPU device normalise can read the source batch where it lies (read-only object-store
            # memory included) and writes its own output: the ring copy would be pure cost (~20 µs/img).
            direct = not self._staging.cuda and reads_host_directly(self.img_dtype, spec.layout, self.channels_last)
            host = {
                k: v if direct and k == "image" else self._staging.stage(slot, k, v)
                for k, v in values.items()
                if v is not None
            }
            yield parts, spec, slot, host

    def _transfer(self, staged: Iterator) -> Iterator:
        # 3. host -> device, non_blocking on the side stream; the slot's event marks the copies' end
        for parts, spec, slot, host in staged:
            dev = {key: self._staging.to_device(t, owned=key != "image") for key, t in host.items()}
            self._staging.copies_issued(slot)
            yield parts, spec, dev

    def _transform(self, moved: Iterator, rng: np.random.Generator, noise: torch.Generator) -> Iterator:
        # 4. normalise, erase, mix on the side stream; 5. record the batch's ready event
        for parts, spec, dev in moved:
            img = dev["image"]
            shape = nchw_shape(img.shape, spec.layout)
            x = normalize(
                img, mean=self.mean, std=self.std, dtype=self.img_dtype, layout=spec.layout,
                channels_last=self.channels_last, out=self._staging.output(shape, self.img_dtype, self.channels_last),
            )  # fmt: skip
            n, c, h, w = x.shape
            if self.erasing.enabled:
                plan = draw_erasing(rng, self.erasing, n, c, h, w)
                apply_erasing_(x, plan, mode=self.erasing.mode, generator=noise)
            label = dev.get("label")
            if label is not None:
                label = label.long()
                if self.mixing.soft_targets:
                    mplan = draw_mixing(rng, self.mixing, n, h, w)
                    apply_mixing_(x, mplan)
                    label = plan_target(label, mplan, self.mixing)
            sid = dev.get("sample_id")
            sid = sid.long() if sid is not None else None
            fmt = torch.channels_last if self.channels_last else torch.contiguous_format
            if not x.is_contiguous(memory_format=fmt):
                x = x.contiguous(memory_format=fmt)
            tensors = [t for t in (x, label, sid) if t is not None]
            yield join_batch(parts, x, label, sid), self._staging.ready(), tensors, n


def _channel_values(name: str, values: Any) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        fail(name, values, "expected a sequence of numbers (0-1 scale, one per channel)")
    if not out or any(v != v for v in out):
        fail(name, values, "expected a non-empty sequence of numbers")
    return out


def _check_labels(label: Any, num_classes: int) -> None:
    if label is None:
        raise ValueError("soft targets (mixup/cutmix/label_smoothing) need a 'label' in every batch")
    arr = label.numpy() if isinstance(label, torch.Tensor) else np.asarray(label)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"'label' must be a 1-D integer array for soft targets, got {arr.dtype} {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
        raise ValueError(
            f"'label' values must be in [0, num_classes={num_classes}), got {arr.min()}..{arr.max()}"
        )
