"""DeviceLoader on the CPU device: values, structure, epochs, errors, shutdown (what CI runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from device_helpers import MEAN, STD, assert_normalized, loader_threads, packed_batches

from raypipe.device import DeviceLoader, Mixup, Normalize, RandomErasing, from_timm_args


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    before = set(loader_threads())
    yield
    leaked = set(loader_threads()) - before
    assert not leaked, f"leaked loader threads: {leaked}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [True, False])
def test_normalisation_matches_float64_reference(dtype, channels_last):
    src = packed_batches(2)
    norm = Normalize(mean=MEAN, std=STD, dtype=dtype, channels_last=channels_last)
    with DeviceLoader(src, normalize=norm) as loader:
        outs = list(loader)
    assert len(outs) == 2
    for out, batch in zip(outs, src, strict=True):
        assert_normalized(out["image"], batch["image"], dtype, channels_last)
        assert out["label"].dtype == torch.int64 and out["label"].tolist() == batch["label"].tolist()
        assert out["sample_id"].dtype == torch.int64
        assert out["sample_id"].tolist() == batch["sample_id"].tolist()
        assert out["path"] is batch["path"]  # untouched pass-through
        assert list(out) == list(batch)  # key order kept


# Ours is one fused multiply-add, timm's is sub then div: equal up to the dtype's rounding.
TIMM_TOL = {torch.float16: dict(atol=4e-3, rtol=2e-3), torch.float32: dict(atol=2e-6, rtol=1e-6)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matches_timm_prefetch_loader_on_nchw_tuples(dtype):
    from timm.data.loader import PrefetchLoader, fast_collate

    rng = np.random.default_rng(1)
    samples = [(rng.integers(0, 256, (3, 16, 16), dtype=np.uint8), int(i)) for i in range(12)]
    torch_loader = torch.utils.data.DataLoader(samples, batch_size=4, collate_fn=fast_collate)
    timm_out = list(PrefetchLoader(torch_loader, device=torch.device("cpu"), img_dtype=dtype))
    with DeviceLoader(torch_loader, normalize=Normalize(dtype=dtype, channels_last=False)) as loader:
        assert len(loader) == 3
        ours = list(loader)
    assert len(ours) == len(timm_out) == 3
    for (x, y), (tx, ty) in zip(ours, timm_out, strict=True):
        assert isinstance(x, torch.Tensor) and x.is_contiguous()
        assert x.dtype == tx.dtype == dtype
        torch.testing.assert_close(x, tx, **TIMM_TOL[dtype])
        assert torch.equal(y, ty)


def test_nchw_numpy_is_detected_and_declared_layout_checked():
    src = packed_batches(1, extra=False)
    nchw = [{**b, "image": np.ascontiguousarray(b["image"].transpose(0, 3, 1, 2))} for b in src]
    with DeviceLoader(nchw) as loader:
        (out,) = list(loader)
    assert_normalized(out["image"], src[0]["image"], torch.float32)
    with DeviceLoader(nchw, layout="NHWC") as loader, pytest.raises(ValueError, match="layout='NHWC'"):
        list(loader)


def test_ambiguous_layout_needs_declaration():
    src = [{"image": np.zeros((2, 3, 5, 3), np.uint8)}]
    with DeviceLoader(src) as loader, pytest.raises(ValueError, match="ambiguous"):
        list(loader)
    with DeviceLoader(src, layout="NCHW") as loader:
        (out,) = list(loader)
    assert tuple(out["image"].shape) == (2, 3, 5, 3)


def test_shape_change_within_epoch_is_an_error_naming_the_key():
    src = packed_batches(1) + packed_batches(1, h=16)
    with DeviceLoader(src) as loader, pytest.raises(ValueError, match="'image' batch shape"):
        list(loader)


def test_determinism_under_seed_and_epochs_differ():
    kw = dict(
        re_prob=0.7,
        re_mode="pixel",
        re_count=2,
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        num_classes=10,
        mixup_mode="elem",
        label_smoothing=0.1,
    )
    src = packed_batches(3)

    def run(seed, epochs=2):
        with from_timm_args(src, seed=seed, **kw) as loader:
            return [[(b["image"].clone(), b["label"].clone()) for b in loader] for _ in range(epochs)]

    a, b, c = run(0), run(0), run(1)
    for ea, eb in zip(a, b, strict=True):
        for (xa, ya), (xb, yb) in zip(ea, eb, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a[0][0][0], a[1][0][0]), "epoch 1 must draw new parameters"
    assert not torch.equal(a[0][0][0], c[0][0][0]), "another seed must draw new parameters"
    with from_timm_args(src, seed=0, **kw) as loader:
        loader.set_epoch(1)
        again = [bt["image"] for bt in loader]
    assert torch.equal(again[0], a[1][0][0])


def test_reiteration_len_stats_and_ring_reuse():
    src = packed_batches(4, n=8) + [packed_batches(1, n=5)[0]]  # short last batch
    loader = DeviceLoader(src, prefetch=2)
    assert len(loader) == 5
    for epoch in range(3):
        ids = [b["sample_id"].tolist() for b in loader]
        assert len(ids) == 5 and len(ids[-1]) == 5
        assert loader.stats.epoch == epoch and loader.stats.batches == 5 and loader.stats.samples == 37
        assert loader.stats.wait_s >= loader.last_wait_s >= 0.0
        if epoch == 0:
            allocations = loader._staging.allocations
    assert loader._staging.allocations == allocations <= 3 * 3, "ring buffers must be reused, not per batch"
    loader.close()


def test_cpu_outputs_are_recycled_once_released_and_never_while_held():
    src = packed_batches(12, n=8, seed=3)
    loader = DeviceLoader(src, prefetch=2)
    pool = loader._staging.outputs
    for batch in loader:  # each batch is dropped before the next: the pool recycles
        del batch
    assert 0 < pool.allocations <= pool.capacity < 12
    before = pool.allocations
    kept = list(loader)  # the consumer holds every batch: nothing may be overwritten
    assert pool.allocations - before >= 12 - pool.capacity
    for out, batch in zip(kept, src, strict=True):
        assert_normalized(out["image"], batch["image"], torch.float32)
    views = [b["image"][:, :1] for b in kept]  # a view alone keeps its buffer busy too
    del kept
    again = list(loader)
    for out, view, batch in zip(again, views, src, strict=True):
        assert_normalized(out["image"], batch["image"], torch.float32)
        assert torch.equal(view, out["image"][:, :1])
    loader.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_cpu_two_pass_normalise_equals_the_one_pass_kernel_bit_for_bit(dtype, channels_last, layout):
    from raypipe.device.normalize import _affine, nchw_view, normalize

    x = torch.from_numpy(packed_batches(1, n=4, h=9, w=7)[0]["image"])
    if layout == "NCHW":
        x = x.permute(0, 3, 1, 2).contiguous()
    mul, add = _affine(MEAN, STD, 255.0, dtype, x.device)
    one_pass = torch.addcmul(add, nchw_view(x, layout), mul)  # what the GPU path runs
    got = normalize(x, mean=MEAN, std=STD, dtype=dtype, layout=layout, channels_last=channels_last)
    assert torch.equal(got, one_pass.to(dtype))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt)


def test_normalise_out_must_match():
    from raypipe.device.normalize import normalize

    x = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    ok = torch.empty(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    assert normalize(x, mean=MEAN, std=STD, dtype=torch.float32, out=ok) is ok
    for bad in (torch.empty(2, 3, 4, 4), ok.half(), torch.empty(1, 3, 4, 4)):
        with pytest.raises(ValueError, match="out is"):
            normalize(x, mean=MEAN, std=STD, dtype=torch.float32, out=bad)


def test_unsized_source_has_no_len():
    loader = DeviceLoader(iter(packed_batches(1)))
    with pytest.raises(TypeError):
        len(loader)
    loader.close()


def test_empty_source_ends_cleanly():
    with DeviceLoader([]) as loader:
        assert list(loader) == [] and list(loader) == []
        assert loader.stats.batches == 0


def _failing_source(good):
    yield from packed_batches(good)
    raise OSError("disk on fire")


def test_source_exception_reaches_consumer_with_traceback():
    import traceback

    class Source:
        def __iter__(self):
            return _failing_source(2)

    seen = 0
    with DeviceLoader(Source()) as loader:
        with pytest.raises(OSError, match="disk on fire") as info:
            for _ in loader:
                seen += 1
        assert seen == 2
        text = "".join(traceback.format_exception(info.value))
        assert "_failing_source" in text
        with pytest.raises(OSError, match="disk on fire"):  # another pass starts afresh and fails again
            list(loader)


def test_break_mid_epoch_then_close_leaks_nothing():
    src = packed_batches(10, n=4, h=8, w=8)
    loader = DeviceLoader(src, prefetch=1)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert not loader_threads()
    it = iter(loader)
    next(it)
    loader.close()
    assert not loader_threads()
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    unstarted = iter(DeviceLoader(src))  # never advanced: no thread to leak
    assert not loader_threads()
    del unstarted
    loader.close()  # idempotent


@pytest.mark.timeout(60)
def test_an_iterator_whose_pass_was_ended_raises_instead_of_waiting():
    """A new pass or close() ends the old pass's producer: advancing the old iterator is an error, not a
    wait for a batch that never comes (it waited forever) nor a leftover batch of the stopped pass."""
    src = packed_batches(6, n=2, h=8, w=8)
    loader = DeviceLoader(src, prefetch=1)
    old = iter(loader)
    next(old)
    new = iter(loader)
    assert next(new)["sample_id"].tolist() == [0, 1]  # the new pass starts at the beginning
    with pytest.raises(RuntimeError, match="a new pass"):
        next(old)
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        next(new)
    assert not loader_threads()


def test_generator_source_is_closed_on_break():
    closed = []

    def gen():
        try:
            yield from packed_batches(10, n=2, h=8, w=8)
        finally:
            closed.append(True)

    class Source:
        def __iter__(self):
            return gen()

    with DeviceLoader(Source(), prefetch=1) as loader:
        for _ in loader:
            break
    assert closed == [True]


def test_tuple_with_labels_only_and_soft_targets():
    src = [(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.tensor([0, 1, 2, 3]))]
    mixup = Mixup(mixup_alpha=1.0, label_smoothing=0.1, num_classes=4)
    with DeviceLoader(src, normalize=Normalize(dtype="bf16"), mixup=mixup) as loader:
        ((x, y),) = list(loader)
    assert x.dtype == torch.bfloat16 and y.dtype == torch.float32 and tuple(y.shape) == (4, 4)
    torch.testing.assert_close(y.sum(1), torch.ones(4))


def test_label_smoothing_alone_keeps_class_indices_as_timm():
    """timm builds no Mixup without mixup/cutmix: targets stay indices, the loss smooths them."""
    src = packed_batches(2, n=4)
    with from_timm_args(src, label_smoothing=0.1, num_classes=10) as loader:
        assert loader.mixup is None and not loader.mixup_enabled
        labels = [b["label"] for b in loader]
    assert all(y.dtype == torch.int64 and y.tolist() == b["label"].tolist() for y, b in zip(labels, src, strict=True))


def test_mixup_enabled_switch_stops_mixing_and_keeps_smoothed_targets():
    src = packed_batches(2, n=8)
    ref = [b["image"] for b in DeviceLoader(src)]
    with from_timm_args(src, mixup_alpha=1.0, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10) as loader:
        assert loader.mixup_enabled
        mixed = [b["image"] for b in loader]
        assert any(not torch.equal(a, b) for a, b in zip(mixed, ref, strict=True))
        loader.mixup_enabled = False  # timm's train.py at --mixup-off-epoch
        outs = list(loader)
    for out, want, batch in zip(outs, ref, src, strict=True):
        assert torch.equal(out["image"], want)
        y = out["label"]  # timm's Mixup with mixup_enabled=False: smoothed one-hot, lam = 1
        assert y.dtype == torch.float32 and tuple(y.shape) == (8, 10)
        on = y[torch.arange(8), torch.from_numpy(batch["label"])]
        torch.testing.assert_close(on, torch.full((8,), 0.9 + 0.01))
    plain = DeviceLoader([])
    plain.mixup_enabled = True  # no Mixup: stays off, as timm's PrefetchLoader without FastCollateMixup
    assert not plain.mixup_enabled
    plain.close()


def test_cpu_default_dtype_is_float32():
    with DeviceLoader(packed_batches(1)) as loader:
        assert loader.img_dtype == torch.float32
        assert next(iter(loader))["image"].dtype == torch.float32


def _draws(rank, seed=0, epoch=0):
    src = packed_batches(2, n=8)
    loader = from_timm_args(
        src,
        seed=seed,
        rank=rank,
        re_prob=0.5,
        re_mode="pixel",
        re_count=2,
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        mixup_mode="elem",
        num_classes=10,
    )
    with loader:
        loader.set_epoch(epoch)
        return [(b["image"].clone(), b["label"].clone()) for b in loader]


def test_ranks_draw_differently_and_each_rank_repeats_itself():
    r0, r1, r0_again, r1_again = _draws(0), _draws(1), _draws(0), _draws(1)
    for a, b in ((r0, r0_again), (r1, r1_again)):
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    for (x0, y0), (x1, y1) in zip(r0, r1, strict=True):
        assert not torch.equal(x0, x1) and not torch.equal(y0, y1)
    # (seed, rank) are separate words, unlike timm's seed + rank sum: seed 1 rank 0 is not seed 0 rank 1
    assert not torch.equal(_draws(0, seed=1)[0][0], r1[0][0])


def test_rank_defaults_to_torch_distributed_rank_else_zero():
    loader = DeviceLoader([])
    assert loader.rank == 0
    loader.close()


def test_labels_out_of_range_are_rejected():
    src = packed_batches(1, num_classes=10)
    with DeviceLoader(src, mixup=Mixup(num_classes=3)) as loader:
        with pytest.raises(ValueError, match="num_classes"):
            list(loader)


# The keywords DeviceLoader took before it composed objects: the factory covers each, by name or timm's.
OLD_KEYWORDS = (
    "device",
    "mean",
    "std",
    "img_dtype",
    "channels_last",
    "layout",
    "prefetch",
    "re_prob",
    "re_mode",
    "re_count",
    "re_min_area",
    "re_max_area",
    "re_min_aspect",
    "re_max_aspect",
    "re_num_splits",
    "mixup_alpha",
    "cutmix_alpha",
    "cutmix_minmax",
    "mix_prob",
    "switch_prob",
    "mixup_mode",
    "label_smoothing",
    "correct_lam",
    "num_classes",
    "seed",
    "close_timeout_s",
)
TIMM_NAMES = {"mix_prob": "mixup_prob", "switch_prob": "mixup_switch_prob"}


def test_factory_accepts_every_old_keyword_or_its_timm_name():
    import inspect

    params = inspect.signature(from_timm_args).parameters
    missing = [k for k in OLD_KEYWORDS if TIMM_NAMES.get(k, k) not in params]
    assert not missing
    values = dict(
        device="cpu",
        mean=MEAN,
        std=STD,
        img_dtype="bf16",
        channels_last=False,
        layout="NHWC",
        prefetch=3,
        re_prob=0.5,
        re_mode="rand",
        re_count=3,
        re_min_area=0.05,
        re_max_area=0.2,
        re_min_aspect=0.5,
        re_max_aspect=1.5,
        re_num_splits=2,
        mixup_alpha=0.2,
        cutmix_alpha=0.5,
        cutmix_minmax=None,
        mix_prob=0.7,
        switch_prob=0.3,
        mixup_mode="pair",
        label_smoothing=0.05,
        correct_lam=False,
        num_classes=10,
        seed=4,
        close_timeout_s=5.0,
    )
    assert set(values) == set(OLD_KEYWORDS)
    loader = from_timm_args([], **{TIMM_NAMES.get(k, k): v for k, v in values.items()})
    n, e, m = loader.normalize, loader.erasing, loader.mixup
    assert (n.mean, n.std, n.dtype, n.channels_last) == (MEAN, STD, torch.bfloat16, False)
    assert (loader.layout, loader.prefetch, loader.seed, loader.close_timeout_s) == ("NHWC", 3, 4, 5.0)
    assert (e.probability, e.mode, e.max_count, e.num_splits) == (0.5, "rand", 3, 2)
    assert (e.min_area, e.max_area, e.min_aspect, e.max_aspect) == (0.05, 0.2, 0.5, 1.5)
    assert (m.mixup_alpha, m.cutmix_alpha, m.prob, m.switch_prob, m.mode) == (0.2, 0.5, 0.7, 0.3, "pair")
    assert (m.label_smoothing, m.correct_lam, m.num_classes) == (0.05, False, 10)
    loader.close()


def test_none_probabilities_mean_timm_defaults():
    loader = from_timm_args(
        [], re_prob=None, mixup_alpha=0.5, mixup_prob=None, mixup_switch_prob=None, label_smoothing=None, num_classes=5
    )
    assert loader.erasing is None and (loader.mixup.prob, loader.mixup.switch_prob) == (1.0, 0.5)
    assert loader.mixup.label_smoothing == 0.0
    loader.close()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"re_mode": "foo"}, "re_mode"),
        ({"img_dtype": "int8"}, "img_dtype"),
        ({"mean": (0.5, 0.5)}, "std"),
        ({"std": (0.5, 0.0, 0.5)}, "std"),
        ({"re_prob": 1.5}, "re_prob"),
        ({"mixup_prob": -0.1}, "mixup_prob"),
        ({"mixup_alpha": 1.0, "mixup_prob": -0.1, "num_classes": 3}, "mixup_prob"),
        ({"mixup_switch_prob": 2}, "mixup_switch_prob"),
        ({"re_count": 0}, "re_count"),
        ({"prefetch": 0}, "prefetch"),
        ({"mixup_mode": "rows"}, "mixup_mode"),
        ({"mixup_alpha": 1.0, "mixup_mode": "rows", "num_classes": 3}, "mixup_mode"),
        ({"mixup_alpha": 1.0}, "num_classes"),
        ({"cutmix_alpha": 1.0, "num_classes": 0}, "num_classes"),
        ({"label_smoothing": 1.1}, "label_smoothing"),
        ({"mixup_alpha": -1.0}, "mixup_alpha"),
        ({"cutmix_minmax": (0.9, 0.1)}, "cutmix_minmax"),
        ({"re_min_aspect": 0}, "re_min_aspect"),
        ({"re_num_splits": -1}, "re_num_splits"),
        ({"layout": "HWC"}, "layout"),
        ({"device": "tpu"}, "device"),
        ({"seed": -1}, "seed"),
        ({"rank": -1}, "rank"),
    ],
)
def test_factory_bad_keywords_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}="):
        from_timm_args([], **kwargs)


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: Normalize(dtype="int8"), "dtype"),
        (lambda: Normalize(channels_last=1), "channels_last"),
        (lambda: RandomErasing(probability=2), "probability"),
        (lambda: RandomErasing(min_count=2, max_count=1), "max_count"),
        (lambda: RandomErasing(mode="x"), "mode"),
        (lambda: Mixup(prob=-1), "prob"),
        (lambda: Mixup(mode="rows"), "mode"),
        (lambda: Mixup(mixup_alpha=0.0), "mixup_alpha"),
        (lambda: DeviceLoader([], erasing=Mixup()), "erasing"),
        (lambda: DeviceLoader([], normalize=None, mixup=RandomErasing()), "mixup"),
    ],
)
def test_objects_name_their_own_fields(build, name):
    with pytest.raises(ValueError, match=f"^{name}="):
        build()


def _imported_modules(path) -> set[str]:
    """Every module a source file imports, at any depth (a lazy import in a method counts), as absolute
    names: ``from raypipe.device import factory`` and ``from .factory import x`` both give
    ``raypipe.device.factory``."""
    import ast

    package = "raypipe.device"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_loader_knows_nothing_of_its_factory():
    """The factory sits above the class it builds (as timm's ``create_*`` functions): ``factory``
    imports ``loader``, and ``loader`` imports nothing from ``factory``, not even lazily."""
    from pathlib import Path

    import raypipe.device.factory as factory
    import raypipe.device.loader as loader

    assert "raypipe.device.loader" in _imported_modules(Path(factory.__file__))
    assert not {m for m in _imported_modules(Path(loader.__file__)) if m.startswith("raypipe.device.factory")}
    assert not hasattr(DeviceLoader, "from_timm")


def test_cuda_device_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="device"):
        DeviceLoader([], device="cuda")


def test_a_process_that_exits_with_a_pass_unfinished_exits_cleanly():
    """A script that takes a few batches and exits without close(): the producer thread is stopped at
    exit rather than left inside torch's code while Python finalises (which aborted the process)."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from raypipe.device import from_timm_args\n"
        "src = [{'image': np.zeros((64, 96, 96, 3), np.uint8), 'label': np.arange(64), 'sample_id': np.arange(64)}"
        " for _ in range(6)]\n"
        "it = iter(from_timm_args(src, device='cpu', img_dtype='float32', channels_last=False))\n"
        "next(it); next(it)\n"
        "print('taken')\n"
    )
    for _ in range(3):  # the abort depended on where the producer was when the process ended
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "taken", (proc.returncode, proc.stderr[-500:])
        assert "terminate called" not in proc.stderr
