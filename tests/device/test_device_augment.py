"""Random erasing and mixup/cutmix: timm's statistics, exact structure, vectorised on the batch."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from device_helpers import constant_images

from raypipe.device import Mixup, RandomErasing, mixup_target
from raypipe.device.erasing import draw_erasing
from raypipe.device.mixup import draw_mixing

# ---------------------------------------------------------------------------------------------------
# Random erasing


def _box_stats(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample of a ones-batch erased with const 0: erased?, area fraction, log(h/w) of the box."""
    erased = x[:, 0] == 0
    any_ = erased.flatten(1).any(1).numpy()
    frac = erased.flatten(1).float().mean(1).numpy()
    rows = erased.any(2).sum(1).numpy().astype(float)
    cols = erased.any(1).sum(1).numpy().astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_aspect = np.log(rows / cols)
    return any_, frac, log_aspect


def _timm_erase(n, prob, count, h=32, w=32, mode="const", num_splits=0):
    from timm.data.random_erasing import RandomErasing

    random.seed(0)
    torch.manual_seed(0)
    x = torch.ones(n, 3, h, w)
    return RandomErasing(prob, mode=mode, max_count=count, num_splits=num_splits, device="cpu")(x)


def _ours_erase(n, prob, count, h=32, w=32, mode="const", num_splits=0, seed=0):
    x = torch.ones(n, 3, h, w)
    g = torch.Generator().manual_seed(seed)
    erase = RandomErasing(probability=prob, mode=mode, max_count=count, num_splits=num_splits)
    return erase(x, rng=np.random.default_rng(seed), generator=g)


@pytest.mark.parametrize("prob", [0.25, 0.8])
def test_erasing_single_box_matches_timm_distribution(prob):
    n = 3000
    t_any, t_frac, t_asp = _box_stats(_timm_erase(n, prob, 1))
    o_any, o_frac, o_asp = _box_stats(_ours_erase(n, prob, 1))
    assert abs(o_any.mean() - prob) < 0.03 and abs(t_any.mean() - prob) < 0.03
    # area fraction of erased samples: same mean and quartiles as timm (U(0.02, 1/3) after rounding)
    for q in (25, 50, 75):
        assert abs(np.percentile(o_frac[o_any], q) - np.percentile(t_frac[t_any], q)) < 0.025
    assert abs(o_frac[o_any].mean() - t_frac[t_any].mean()) < 0.01
    # log aspect is symmetric around 0 and spans +-log(1/0.3) in both
    assert abs(o_asp[o_any].mean()) < 0.05 and abs(t_asp[t_any].mean()) < 0.05
    assert abs(o_asp[o_any].std() - t_asp[t_any].std()) < 0.05
    assert np.abs(o_asp[o_any]).max() <= math.log(1 / 0.3) + 0.25


def test_erasing_count_and_num_splits_match_timm():
    n = 2000
    t = _timm_erase(n, 1.0, 3, num_splits=2)
    o = _ours_erase(n, 1.0, 3, num_splits=2)
    assert (o[: n // 2] == 1).all() and (t[: n // 2] == 1).all(), "clean split must not be erased"
    t_frac = (t[n // 2 :, 0] == 0).flatten(1).float().mean(1)
    o_frac = (o[n // 2 :, 0] == 0).flatten(1).float().mean(1)
    assert abs(o_frac.mean().item() - t_frac.mean().item()) < 0.01
    plan = draw_erasing(np.random.default_rng(0), RandomErasing(probability=1.0, max_count=3), n, 3, 32, 32)
    boxes_per_sample = plan.boxes[..., 4].sum(1)
    assert set(np.unique(boxes_per_sample)) <= {0, 1, 2, 3}
    assert abs(boxes_per_sample.mean() - 2.0) < 0.1  # uniform on 1..3 (a failed 10-try box is rare)


def test_erasing_modes_fill_values():
    o = _ours_erase(64, 1.0, 1, mode="rand")
    for i in range(64):
        box = o[i][:, o[i, 0] != 1]
        if box.numel():
            assert torch.equal(box, box[:, :1].expand_as(box)), "rand: one value per channel per box"
    o = _ours_erase(256, 1.0, 1, mode="pixel", h=64, w=64)
    vals = o[o != 1]
    assert vals.numel() > 10000 and abs(vals.mean().item()) < 0.05 and abs(vals.std().item() - 1) < 0.05


def test_erasing_min_count_as_timm():
    plan = RandomErasing(probability=1.0, min_count=2, max_count=4).draw(np.random.default_rng(0), 3000, 3, 32, 32)
    per_sample = plan.boxes[..., 4].sum(1)
    assert per_sample.min() >= 1 and per_sample.max() <= 4
    assert abs(per_sample.mean() - 3.0) < 0.1  # uniform on 2..4 (a failed 10-try box is rare)
    assert RandomErasing(max_count=None, min_count=2).max_count == 2  # timm: max_count or min_count


def test_erasing_is_seeded_not_global():
    torch.manual_seed(123)
    random.seed(5)
    a = _ours_erase(32, 0.5, 2, mode="pixel", seed=7)
    torch.manual_seed(999)
    random.seed(6)
    b = _ours_erase(32, 0.5, 2, mode="pixel", seed=7)
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------
# Mixup / CutMix


def _own_fraction(x: torch.Tensor) -> torch.Tensor:
    """For constant_images input: the share of sample i that is still its own value (cutmix)."""
    n = x.shape[0]
    own = (torch.arange(n, dtype=x.dtype) + 1).view(n, 1, 1, 1)
    return (x == own).flatten(1).float().mean(1)


def _mix_weight(x: torch.Tensor) -> torch.Tensor:
    """For constant_images input mixed by mixup: lam_i from x_i = lam*(i+1) + (1-lam)*(n-i)."""
    n = x.shape[0]
    a = torch.arange(n, dtype=torch.float64) + 1
    b = a.flip(0)
    return (x[:, 0, 0, 0].double() - b) / (a - b)


def _labels(n, num_classes=1000):
    return torch.arange(n) * 7 % num_classes  # distinct labels for i and N-1-i


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_cutmix_lam_correction_equals_pixel_share(mode):
    n, nc = 16, 1000
    rng = np.random.default_rng(0)
    for _ in range(20):
        mix = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, mode=mode, num_classes=nc, label_smoothing=0.0)
        x, y = mix(constant_images(n), _labels(n), rng=rng)
        lam_t = y[torch.arange(n), _labels(n)]
        torch.testing.assert_close(lam_t, _own_fraction(x), atol=1e-6, rtol=0)
        torch.testing.assert_close(y.sum(1), torch.ones(n))
        if mode == "pair":
            torch.testing.assert_close(lam_t, lam_t.flip(0))
        if mode == "batch":
            assert torch.all(lam_t == lam_t[0])


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_mixup_targets_match_pixels_and_timm_target(mode):
    n, nc, smoothing = 8, 1000, 0.1
    rng = np.random.default_rng(1)
    for _ in range(10):
        mix = Mixup(mixup_alpha=0.4, mode=mode, num_classes=nc, label_smoothing=smoothing)
        x, y = mix(constant_images(n), _labels(n), rng=rng)
        lam = _mix_weight(x)
        from timm.data.mixup import mixup_target as timm_target

        want = timm_target(_labels(n), nc, lam.float().view(-1, 1), smoothing)
        torch.testing.assert_close(y, want, atol=2e-6, rtol=0)
        torch.testing.assert_close(y.sum(1), torch.ones(n))


def _timm_params(mode, n, trials, **kw):
    from timm.data.mixup import Mixup

    np.random.seed(0)
    m = Mixup(mode=mode, num_classes=1000, **kw)
    lams = []
    for _ in range(trials):
        _, y = m(constant_images(n), _labels(n))
        lams.append(y[torch.arange(n), _labels(n)])
    return torch.cat(lams).numpy()


def _our_params(mode, n, trials, **kw):
    cfg = Mixup(mode=mode, num_classes=1000, **kw)
    rng = np.random.default_rng(0)
    lams, cuts = [], []
    for _ in range(trials):
        plan = draw_mixing(rng, cfg, n, 16, 16)
        lams.append(plan.lam)
        cuts.append(plan.cut)
    return np.concatenate(lams), np.concatenate(cuts)


@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_mixup_cutmix_parameter_statistics_match_timm(mode):
    kw = dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.7, switch_prob=0.5, label_smoothing=0.0)
    trials = 400 if mode == "batch" else 60
    t_lam = _timm_params(mode, 16, trials, **kw)
    o_lam, o_cut = _our_params(mode, 16, trials, **kw)
    # P(unmixed) = 1 - prob; mean and spread of lam agree with timm's
    assert abs((o_lam == 1).mean() - 0.3) < 0.05 and abs((t_lam == 1).mean() - 0.3) < 0.05
    mixed_o, mixed_t = o_lam[o_lam < 1], t_lam[t_lam < 1]
    assert abs(mixed_o.mean() - mixed_t.mean()) < 0.05
    assert abs(mixed_o.std() - mixed_t.std()) < 0.05
    assert abs(o_cut.mean() - 0.35) < 0.06  # prob * switch_prob


def test_cutmix_minmax_box_sizes_and_forced_lam():
    rng = np.random.default_rng(3)
    cfg = Mixup(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8), mode="elem", num_classes=10, correct_lam=False)
    assert cfg.cutmix_alpha == 1.0
    plan = draw_mixing(rng, cfg, 4000, 20, 20)
    hs, ws = plan.boxes[plan.cut, 2], plan.boxes[plan.cut, 3]
    assert hs.min() >= 4 and hs.max() <= 15 and ws.min() >= 4 and ws.max() <= 15  # randint(4, 16)
    np.testing.assert_allclose(plan.lam[plan.cut], 1 - hs * ws / 400, atol=1e-6)  # always corrected


def test_no_lam_correction_keeps_beta_lam():
    rng = np.random.default_rng(4)
    cfg = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem", correct_lam=False, num_classes=10)
    plan = draw_mixing(rng, cfg, 4000, 9, 9)
    area = 1 - plan.boxes[:, 2] * plan.boxes[:, 3] / 81
    assert not np.allclose(plan.lam[plan.cut], area[plan.cut], atol=1e-3)
    assert abs(plan.lam.mean() - 0.5) < 0.03  # Beta(1, 1)


def test_odd_batch_middle_sample_is_untouched():
    n = 7
    for mode in ("batch", "pair", "elem"):
        x0 = constant_images(n)
        mix = Mixup(mixup_alpha=1.0, cutmix_alpha=1.0, mode=mode, num_classes=10, label_smoothing=0.0)
        x, y = mix(x0.clone(), _labels(n, 10), rng=np.random.default_rng(0))
        torch.testing.assert_close(x[3], x0[3])
        assert y[3, _labels(n, 10)[3]].item() == pytest.approx(1.0)
        torch.testing.assert_close(y.sum(1), torch.ones(n))


def test_mixup_target_matches_timm_exactly():
    from timm.data.mixup import mixup_target as timm_target

    y = torch.tensor([0, 3, 1, 2])
    for lam in (1.0, 0.3):
        torch.testing.assert_close(mixup_target(y, 5, lam, 0.1), timm_target(y, 5, lam, 0.1), atol=0, rtol=0)


def test_batch_mixup_matches_timm_arithmetic_exactly():
    from timm.data.mixup import Mixup

    x = torch.randn(8, 3, 16, 16)
    y = torch.arange(8)
    np.random.seed(0)
    tx, ty = Mixup(mixup_alpha=1.0, cutmix_alpha=0.0, num_classes=8, label_smoothing=0.0)(x.clone(), y)
    np.random.seed(0)  # replay timm's _params_per_batch draws: rand() < prob, then beta(alpha, alpha)
    np.random.rand()
    lam = float(np.random.beta(1.0, 1.0))
    assert ty[0, 0].item() == pytest.approx(lam)
    from raypipe.device.mixup import MixPlan, apply_mixing_

    no_cut, boxes = np.zeros(8, bool), np.zeros((8, 4), np.int64)
    plan = MixPlan(np.full(8, lam), no_cut, np.ones(8, bool), boxes, batch=True)
    assert torch.equal(apply_mixing_(x.clone(), plan), tx)


def test_loader_mixes_after_erasing_with_soft_targets():
    from device_helpers import packed_batches

    from raypipe.device import DeviceLoader, Normalize

    src = packed_batches(4, n=8, num_classes=10)
    mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, mode="pair", num_classes=10, label_smoothing=0.1)
    with DeviceLoader(
        src, normalize=Normalize(dtype="float16"), erasing=RandomErasing(probability=0.5), mixup=mixup
    ) as loader:
        for b in loader:
            assert b["label"].dtype == torch.float32 and tuple(b["label"].shape) == (8, 10)
            torch.testing.assert_close(b["label"].sum(1), torch.ones(8))
            assert b["image"].is_contiguous(memory_format=torch.channels_last)
            assert torch.isfinite(b["image"]).all()
