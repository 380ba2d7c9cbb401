"""``BlockRngs`` gives every sample of a block the numbers of ``sample_rng(seed, epoch, sid)``, and the
augmentation stage, which uses it, makes the images the transform makes with ``sample_rng``."""

from __future__ import annotations

import os

import numpy as np
import pytest

from raypipe.config import DecodeConfig, TrainAugment
from raypipe.kernels import build_transform, sample_rng
from raypipe.kernels.seeding import BlockRngs, pcg64_state, seed_words
from raypipe.sources.transport.paths import DatasetRoot
from raypipe.stages.augment import AugmentStage, StageSpec


def test_seed_words_and_pcg64_state_are_numpys():
    rng = np.random.default_rng(1)
    for trial in range(60):
        seed = int(rng.integers(0, 2**32)) if trial % 2 else trial
        epoch = int(rng.integers(0, 2**32)) if trial % 3 == 0 else int(rng.integers(0, 100))
        ids = rng.integers(0, 2**32, 20)
        ids[:3] = (0, 1, 2**32 - 1)
        words = seed_words(seed, epoch, ids)
        for k, sid in enumerate(ids):
            ss = np.random.SeedSequence([seed, epoch, int(sid)])
            assert np.array_equal(words[k], ss.generate_state(4, np.uint64)), (seed, epoch, sid)
            state = np.random.PCG64(ss).state["state"]
            assert pcg64_state(words[k]) == (state["state"], state["inc"])


@pytest.mark.parametrize(
    "seed, epoch, ids",
    [(0, 0, range(64)), (7, 3, [5, 2**32 - 1, 0, 99]), (2**33, 1, [1, 2]), (3, 2**40, [4]), (1, 2, [2**35, 6])],
    ids=["small", "edges", "big-seed", "big-epoch", "big-id"],
)
def test_each_generator_draws_sample_rngs_numbers(seed, epoch, ids):
    # values beyond 32 bits take sample_rng itself; the rest come from the vectorised seeding
    ids = list(ids)
    rngs = BlockRngs(seed, epoch, ids)
    for i, sid in enumerate(ids):
        g, ref = rngs.get(i), sample_rng(seed, epoch, sid)
        assert np.array_equal(g.random(4), ref.random(4))
        assert g.integers(0, 1000) == ref.integers(0, 1000) and g.uniform(0.1, 2.0) == ref.uniform(0.1, 2.0)


def test_the_stage_makes_the_transforms_images_with_sample_rng(sample_dir):
    aug = TrainAugment(input_size=48, color_jitter=0.4, auto_augment="rand-m9-mstd0.5-inc1")
    root = DatasetRoot(os.path.realpath(sample_dir))
    spec = StageSpec(kind="folder", root=root, augment=aug, decode=DecodeConfig(), seed=11, epoch=2)
    paths = sorted(os.path.relpath(os.path.join(d, f), sample_dir) for d, _, fs in os.walk(sample_dir) for f in fs)[:10]
    ids = np.arange(100, 100 + len(paths), dtype=np.int64)[::-1].copy()
    batch = {
        "sample_id": ids,
        "path": np.array(paths, dtype=object),
        "label": np.zeros(len(paths), np.int64),
        "row": np.zeros(len(paths), np.int64),
    }
    out = AugmentStage(spec)(batch)
    assert out["ok"].all()
    transform = build_transform(aug, DecodeConfig())
    for i, path in enumerate(paths):
        want = transform(root.read_bytes(path), sample_rng(11, 2, int(ids[i])))
        assert np.array_equal(out["image"][i], want), path
