"""DeviceLoader on CUDA: async == sync, memory safety under a reallocating consumer, no reserved growth.

Skipped without a GPU (CI); run by hand or by ``bench/gpu_check.py``'s machine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from device_helpers import loader_threads, packed_batches

from raypipe.device import DeviceLoader, from_timm_args

pytestmark = [
    pytest.mark.needs_cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

AUG = dict(
    re_prob=0.5,
    re_mode="rand",
    re_count=2,
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
    mixup_mode="elem",
    label_smoothing=0.1,
    num_classes=10,
)


def _collect(loader):
    return [{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in loader]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_async_output_equals_synchronous_reference(dtype):
    src = packed_batches(6, n=8, h=32, w=32)
    with from_timm_args(src, device="cuda", img_dtype=dtype, prefetch=3, seed=3, **AUG) as loader:
        async_out = _collect(loader)
    # synchronous reference: same loader semantics, one batch in flight, a sync after each batch
    with from_timm_args(src, device="cuda", img_dtype=dtype, prefetch=1, seed=3, **AUG) as loader:
        sync_out = []
        for b in loader:
            torch.cuda.synchronize()
            sync_out.append({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in b.items()})
    for a, s in zip(async_out, sync_out, strict=True):
        assert torch.equal(a["image"], s["image"]) and torch.equal(a["label"], s["label"])


def test_cuda_matches_cpu_reference_without_pixel_noise():
    src = packed_batches(4, n=8)
    kw = dict(img_dtype="float32", seed=5, **AUG)
    with from_timm_args(src, device="cuda", **kw) as loader:
        gpu = _collect(loader)
    with from_timm_args(src, device="cpu", **kw) as loader:
        cpu = _collect(loader)
    for g, c in zip(gpu, cpu, strict=True):
        torch.testing.assert_close(g["image"], c["image"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(g["label"], c["label"], atol=1e-6, rtol=0)


def test_consumer_that_frees_and_reallocates_still_sees_correct_data():
    src = packed_batches(12, n=16, h=64, w=64)
    with DeviceLoader(src, device="cpu") as loader:
        want = [b["image"].double().sum().item() for b in loader]
    big = torch.randn(2048, 2048, device="cuda")
    got = []
    with from_timm_args(src, device="cuda", img_dtype="float32", prefetch=4) as loader:
        for b in loader:
            for _ in range(8):  # keep the consumer's stream busy so the batch is read late
                big = (big @ big).tanh_()
            got.append(b["image"].double().sum())  # queued behind the matmuls
            del b
            junk = [torch.full((16, 3, 64, 64), 1e6, device="cuda") for _ in range(4)]  # reuse freed blocks
            del junk
    torch.cuda.synchronize()
    np.testing.assert_allclose([g.item() for g in got], want, rtol=1e-9)


def test_reserved_memory_does_not_grow_over_50_epochs():
    src = packed_batches(3, n=8, h=32, w=32)
    with from_timm_args(src, device="cuda", **AUG) as loader:
        for epoch in range(50):
            for b in loader:
                b["image"].float().mean().item()
            if epoch == 1:
                reserved = torch.cuda.memory_reserved()
                allocations = loader._staging.allocations
        assert torch.cuda.memory_reserved() <= reserved
        assert loader._staging.allocations == allocations
    assert not loader_threads()


def test_pinned_ring_and_single_stream():
    src = packed_batches(3)
    with DeviceLoader(src, device="cuda") as loader:
        stream = loader._staging.stream
        for _ in range(3):
            list(loader)
        assert loader._staging.stream is stream
        assert all(buf.is_pinned() for slot in loader._staging.slots for buf in slot.buffers.values())
    with DeviceLoader(src, device="cuda", pin_memory=False) as loader:
        list(loader)
        assert not any(buf.is_pinned() for slot in loader._staging.slots for buf in slot.buffers.values())


def test_default_dtype_on_cuda_is_float16_and_ranks_differ_on_the_device():
    src = packed_batches(2, n=8)
    with DeviceLoader(src, device="cuda") as loader:
        assert next(iter(loader))["image"].dtype == torch.float16
    kw = dict(re_prob=1.0, re_mode="pixel", img_dtype="float32", seed=2)
    outs = []
    for rank in (0, 1, 0):
        with from_timm_args(src, device="cuda", rank=rank, **kw) as loader:
            outs.append([b["image"].cpu() for b in loader])
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[2], strict=True))
    assert not torch.equal(outs[0][0], outs[1][0])
