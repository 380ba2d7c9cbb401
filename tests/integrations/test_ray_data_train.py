"""The Ray Train example with ``datasets=`` (docs/integrations.md): a Ray Dataset through
``RayDataAugment`` into a ``TorchTrainer`` of two CPU workers, a tiny timm model for one epoch, and
pixels equal to those raypipe's stream gives the same sample ids at the same seed and epoch."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.sample_data import write_sample_data

SEED, EPOCH = 11, 0


class _Kept:
    """The batches as Ray Data delivers them (uint8 NHWC), passed on unchanged; each image kept by id."""

    def __init__(self, batches):
        self.batches, self.images = batches, {}

    def __iter__(self):
        for batch in self.batches:
            for sid, img in zip(batch["sample_id"].tolist(), batch["image"].numpy(), strict=True):
                self.images[sid] = img.copy()
            yield batch


def train_loop_per_worker(config: dict) -> None:
    """The docs' loop, plus what the test checks: each rank's images by sample id, written out."""
    import ray.train
    import ray.train.torch
    import timm
    import torch

    from raypipe import from_timm_args

    kept = _Kept(ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=4))
    loader = from_timm_args(kept, device=ray.train.torch.get_device())
    model = ray.train.torch.prepare_model(timm.create_model("resnet10t", pretrained=False, num_classes=3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    with loader:
        for _ in range(config["epochs"]):
            model.train()
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
    rank = ray.train.get_context().get_world_rank()
    ids = sorted(kept.images)
    np.savez(
        Path(config["out"], f"rank{rank}.npz"),
        ids=np.array(ids, np.int64),
        images=np.stack([kept.images[i] for i in ids]),
        steps=steps,
    )
    ray.train.report({"steps": steps})


@pytest.mark.isolated
@pytest.mark.timeout(600)
def test_torch_trainer_with_datasets_gives_raypipes_pixels(tmp_path, monkeypatch):
    import ray
    import ray.data
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raypipe import RayDataAugment, TrainAugment
    from raypipe.config import PipelineConfig
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.runtime import connect

    files = write_sample_data(tmp_path / "data", classes=3, per_class=7, seed=3)  # 21 images
    table = pa.table(
        {
            "image": [p.read_bytes() for p in files],
            "label": [k % 3 for k in range(len(files))],
            "sample_id": np.arange(len(files), dtype=np.int64),
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    out = tmp_path / "out"
    out.mkdir()
    ray.shutdown()
    # Ray Train pickles the loop by reference to this module: its workers must be able to import it
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    connect(num_cpus=4, dashboard=True)  # Ray Train's placement-group cleaner asks the dashboard
    augment = TrainAugment(input_size=32)
    try:
        ds = ray.data.read_parquet(str(tmp_path / "train.parquet"))
        train = ds.map_batches(
            RayDataAugment,
            batch_size=8,
            compute=ray.data.ActorPoolStrategy(size=1),
            fn_constructor_kwargs=dict(augment=augment, seed=SEED, epoch=EPOCH),
        )
        TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"epochs": 1, "out": str(out)},
            datasets={"train": train},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name="raydata", storage_path=str(tmp_path / "runs")),
        ).fit()
        # raypipe's own stream of the same Dataset, same seed and epoch (its ids: the Parquet's row order)
        pipe = Pipeline(ds, augment, config=PipelineConfig(batch_size=4, seed=SEED))
        source = EpochSource(pipe, start_epoch=EPOCH, end_epoch=EPOCH + 1)
        try:
            stream = {
                sid: np.array(img) for b in source for sid, img in zip(b["sample_id"].tolist(), b["image"], strict=True)
            }
        finally:
            source.close()
    finally:
        ray.shutdown()
    ranks = [np.load(out / f"rank{r}.npz") for r in (0, 1)]
    ids = [r["ids"].tolist() for r in ranks]
    assert all(int(r["steps"]) >= 2 for r in ranks)  # each rank trained on its share
    assert not set(ids[0]) & set(ids[1])  # no row on both ranks
    # streaming_split(equal=True) may leave rows out so the ranks get equal counts: at most one here
    assert len(ids[0]) == len(ids[1]) and len(files) - 1 <= len(ids[0]) + len(ids[1]) <= len(files)
    assert sorted(stream) == list(range(len(files)))
    for rank in ranks:
        for sid, image in zip(rank["ids"].tolist(), rank["images"], strict=True):
            np.testing.assert_array_equal(image, stream[sid], err_msg=f"sample {sid}")
