"""Host staging ring, side stream and events: the memory/stream half of the DeviceLoader.

One ``Staging`` lives as long as its loader: one side stream (CUDA), and a ring of slots each holding
one reusable host buffer per batch key. A buffer is a flat byte array, grown only when a batch needs
more (so the short last batch of an epoch reuses it); pinned on CUDA so ``non_blocking`` copies are
truly asynchronous. Two kinds of event keep memory safe:

- ``slot.copied``: recorded on the side stream after the slot's host->device copies; the host waits
  on it before writing into the slot again (a pinned buffer is never refilled mid-copy);
- the *ready* event: recorded after the device work of a batch; the consumer's stream waits on it,
  and every tensor handed over is ``record_stream``-ed on the consumer's stream, so the caching
  allocator does not give its memory to the side stream while the consumer may still read it.

On a CPU device the same calls run with no stream, no pinning and no events (copies are synchronous;
the loader skips the image's copy when normalise reads the source in place, see
``normalize.reads_host_directly``), and the normalised outputs come from an ``OutputPool``: a fresh
77 MB fp32 batch costs more in page faults (~200-240 µs/img at 224 px, ``bench/pipeline_profile.py
--normalise``) than the normalisation.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

__all__ = ["OutputPool", "Slot", "Staging", "torch_dtype"]


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class Slot:
    """One ring position: a flat host buffer per key and the event of its last copy."""

    __slots__ = ("buffers", "copied")

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.copied: Any = None


class Staging:
    """Ring of ``depth`` host slots plus the side stream, for ``device``; slots pinned on CUDA unless
    ``pin_memory=False`` (pageable slots: each copy then waits for the host side)."""

    def __init__(self, device: torch.device, depth: int, *, pin_memory: bool = True) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pinned = self.cuda and pin_memory
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self.slots = [Slot() for _ in range(depth)]
        self._next = 0
        self.allocations = 0  # host buffers allocated so far (tests check the ring is reused)
        self.outputs = None if self.cuda else OutputPool(depth + 2)  # queued + consumer's + one spare

    def context(self) -> contextlib.AbstractContextManager:
        """Make the side stream (and device) current for the calling thread."""
        if not self.cuda:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        stack.enter_context(torch.cuda.stream(self.stream))
        return stack

    def acquire(self) -> Slot:
        """Next slot of the ring, once its previous copies have finished."""
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        if slot.copied is not None:
            slot.copied.synchronize()
            slot.copied = None
        return slot

    def stage(self, slot: Slot, key: str, value: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Copy ``value`` into ``slot``'s buffer for ``key``; return the host tensor viewing it."""
        if isinstance(value, torch.Tensor):
            dtype, shape, nbytes = value.dtype, tuple(value.shape), value.numel() * value.element_size()
        else:
            value = np.asarray(value)
            dtype, shape, nbytes = torch_dtype(value.dtype), value.shape, value.nbytes
        buf = slot.buffers.get(key)
        if buf is None or buf.numel() < nbytes:
            slot.buffers[key] = buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pinned)
            self.allocations += 1
        view = buf[:nbytes].view(dtype).view(shape)
        if isinstance(value, torch.Tensor):
            view.copy_(value)
        else:
            np.copyto(view.numpy(), value, casting="no")
        return view

    def to_device(self, host: torch.Tensor, *, owned: bool) -> torch.Tensor:
        """Issue the copy to the device (on the current, i.e. side, stream).

        ``owned``: the result goes to the consumer as is, so on CPU it must not alias the ring.
        """
        if self.cuda:
            return host.to(self.device, non_blocking=True)
        return host.clone() if owned else host

    def output(self, shape: tuple[int, ...], dtype: torch.dtype, channels_last: bool) -> torch.Tensor | None:
        """An output tensor to write the batch into, or None to let the device's allocator decide (CUDA)."""
        return None if self.outputs is None else self.outputs.empty(shape, dtype, channels_last)

    def copies_issued(self, slot: Slot) -> None:
        if self.cuda:
            slot.copied = torch.cuda.Event()
            slot.copied.record(self.stream)

    def ready(self) -> Any:
        """Event marking the end of the device work issued so far on the side stream (None on CPU)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def hand_over(self, event: Any, tensors: Iterable[torch.Tensor]) -> None:
        """Called on the consumer's thread: order its stream after ``event``, protect the memory."""
        if event is None:
            return
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for t in tensors:
            if t.device.type == "cuda":
                t.record_stream(consumer)

    def close(self) -> None:
        """Wait for pending copies, then drop the host buffers (pinned blocks return to torch's cache)."""
        for slot in self.slots:
            if slot.copied is not None:
                slot.copied.synchronize()
        self.slots = []
        self.outputs = None
        if self.stream is not None:
            self.stream.synchronize()
        self.stream = None


_ALIGN = 64


class OutputPool:
    """Recycled CPU output buffers, reused only once nothing handed out still refers to them.

    Each buffer is a numpy byte array wrapped with ``torch.from_numpy``; the tensor storage holds one
    reference to the array for as long as any tensor or view on it lives, so ``sys.getrefcount`` tells
    whether the consumer (or anything it passed the batch to) still has it. A consumer that keeps every
    batch simply makes the pool allocate, never overwrite. At most ``capacity`` buffers are kept.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buffers: list[np.ndarray] = []
        self.allocations = 0

    def _free(self, i: int) -> bool:
        # references: the list's and getrefcount's argument; a live tensor storage adds one
        return sys.getrefcount(self._buffers[i]) <= 2

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
        """An uninitialised NCHW tensor of ``shape`` (channels_last memory if asked), 64-byte aligned (the
        normalise's streaming stores need 32)."""
        n, c, h, w = shape
        nbytes = n * c * h * w * dtype.itemsize
        room = (i for i in range(len(self._buffers)) if self._buffers[i].nbytes >= nbytes + _ALIGN and self._free(i))
        found = next(room, None)
        if found is None:
            buf = np.empty(max(nbytes, 1) + _ALIGN, dtype=np.uint8)
            self.allocations += 1
            if len(self._buffers) < self.capacity:
                self._buffers.append(buf)
        else:
            buf = self._buffers[found]
        start = -buf.ctypes.data % _ALIGN
        flat = torch.from_numpy(buf)[start : start + nbytes].view(dtype)
        if channels_last:
            return flat.view(n, h, w, c).permute(0, 3, 1, 2)
        return flat.view(n, c, h, w)
