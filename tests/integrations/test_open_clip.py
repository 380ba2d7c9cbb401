"""An image-text model fed by raypipe: open_clip's tokenizer as a field transform on the workers, a tiny
open_clip model (no download) trained with its contrastive loss on captioned shards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from image_factory import encode, sample, write_shard

from raypipe import DeviceLoader, EpochSource, EvalAugment, ExecutionConfig, ListingOptions, Pipeline, PipelineConfig
from raypipe.device import Normalize

open_clip = pytest.importorskip("open_clip")

pytestmark = pytest.mark.timeout(300)

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}
SHAPES = ("square", "stripe")


def _image(colour, shape) -> bytes:
    img = np.full((40, 40, 3), 128, np.uint8)
    if shape == "square":
        img[8:32, 8:32] = COLOURS[colour]
    else:
        img[:, 15:25] = COLOURS[colour]
    return encode(img)


@pytest.fixture(scope="module")
def captioned(tmp_path_factory):
    """Shards of images whose caption says what they show, and the tiny model's config."""
    root = tmp_path_factory.mktemp("clip")
    members, k = [], 0
    for colour in COLOURS:
        for shape in SHAPES:
            for _ in range(2):
                members += sample(f"s{k:03d}", 0, image=_image(colour, shape))
                members.append((f"s{k:03d}.txt", f"a {colour} {shape}".encode()))
                k += 1
    write_shard(root / "shards" / "clip-0000.tar", members)
    config = root / "raypipe-tiny-clip.json"
    config.write_text(json.dumps(TINY))
    return root / "shards", config


def test_clip_tokens_are_open_clips_ids_and_travel_small(captioned):
    import pickle

    from raypipe.integrations.clip import ClipTokens

    _, config = captioned
    tokens = ClipTokens("raypipe-tiny-clip", model_config=config)
    ids = tokens("a red square")
    assert ids.shape == (16,) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, open_clip.get_tokenizer("raypipe-tiny-clip")(["a red square"])[0].numpy())
    assert len(pickle.dumps(tokens)) < 1000  # the name travels, not the vocabulary
    with pytest.raises(ValueError, match="model_config"):
        ClipTokens("x", model_config="x.yaml")


def test_a_tiny_open_clip_model_learns_from_raypipes_captioned_batches(captioned):
    from raypipe.integrations.clip import ClipTokens

    shards, config = captioned
    torch.manual_seed(0)
    open_clip.add_model_config(str(config))
    model = open_clip.create_model("raypipe-tiny-clip")
    loss_fn = open_clip.loss.ClipLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    pipe = Pipeline(
        str(shards),
        EvalAugment(input_size=32, crop_pct=1.0),
        config=PipelineConfig(batch_size=16, seed=0),
        execution=ExecutionConfig(backend="local", num_tasks=1, chunk_rows=8),
        listing=ListingOptions(fields=("txt",)),
        field_transforms={"txt": ClipTokens("raypipe-tiny-clip", model_config=config)},
    )
    normalize = Normalize(mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD)
    source = EpochSource(pipe, end_epoch=15)
    losses = []
    with DeviceLoader(source, device="cpu", normalize=normalize) as loader:
        for _ in range(15):
            epoch = []
            for batch in loader:
                assert batch["txt"].shape == (len(batch["image"]), 16)  # ids packed, one tensor per batch
                image_features, text_features, scale = model(batch["image"], batch["txt"])
                loss = loss_fn(image_features, text_features, scale)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                epoch.append(loss.item())
            losses.append(float(np.mean(epoch)))
    source.close()
    assert losses[-1] < 0.7 * losses[0], losses
