"""The Ray Train recipe and the IterableDataset view, as the docs show them (docs/integrations.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from raypipe.integrations import RaypipeIterableDataset
from raypipe.sample_data import write_sample_data


def train_loop_per_worker(config: dict) -> None:
    """A user's own loop: the recipe's one call gives this rank's loaders."""
    import ray.train
    import ray.train.torch
    import timm

    from raypipe import ray_loader

    train = ray_loader(config["data"], input_size=32, batch_size=4, is_training=True, re_prob=0.25)
    evaluate = ray_loader(config["data"], input_size=32, batch_size=4, yield_ids=True)
    model = ray.train.torch.prepare_model(timm.create_model("test_resnet", pretrained=False, num_classes=3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = ray.train.get_context().get_world_rank()
    steps, eval_ids = 0, []
    try:
        for epoch in range(config["epochs"]):
            train.set_epoch(epoch)
            model.train()
            for input, target in train:
                loss = torch.nn.functional.cross_entropy(model(input), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
            model.eval()
            with torch.no_grad():
                for input, _, ids in evaluate:
                    model(input)
                    eval_ids.append(ids.tolist())
        out = {"steps": steps, "len": len(train), "eval_ids": eval_ids, "device": str(train.device)}
        Path(config["out"], f"rank{rank}.json").write_text(json.dumps(out))
        ray.train.report({"steps": steps})
    finally:
        train.close()
        evaluate.close()


@pytest.mark.isolated
@pytest.mark.timeout(600)
def test_ray_train_recipe_two_workers_one_epoch(tmp_path, monkeypatch):
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raypipe.runtime import connect

    data = tmp_path / "data"
    write_sample_data(data, classes=3, per_class=7, seed=3)  # 21 images: ranks of 11 and 10
    out = tmp_path / "out"
    out.mkdir()
    ray.shutdown()
    # Ray Train pickles the loop by reference to this module: its workers (children of the Ray this
    # process starts, so they inherit its environment) must be able to import it.
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    connect(num_cpus=4, dashboard=True)  # Ray Train's placement-group cleaner asks the dashboard
    try:
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"data": str(data), "epochs": 1, "out": str(out)},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name="recipe", storage_path=str(tmp_path / "runs")),
        )
        trainer.fit()
    finally:
        ray.shutdown()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    # 21 images, 2 ranks, batches of 4: 10 rows on the shorter rank -> 2 full batches on both
    assert [(r["steps"], r["len"]) for r in ranks] == [(2, 2), (2, 2)]
    assert {r["device"] for r in ranks} == {"cpu"}
    ids = [[i for b in r["eval_ids"] for i in b] for r in ranks]
    assert [len(x) for x in ids] == [11, 11]  # padded to the same count
    assert sorted(i for x in ids for i in x if i >= 0) == list(range(21))


@pytest.mark.timeout(600)
def test_iterable_dataset_view_through_a_dataloader(ray_local, tmp_path):
    from raypipe.config import PipelineConfig, TrainAugment
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.timm import create_loader

    data = tmp_path / "data"
    write_sample_data(data, classes=2, per_class=6, seed=5)
    loader = create_loader(str(data), (3, 32, 32), 4, is_training=True, device="cpu")
    try:
        dl = torch.utils.data.DataLoader(RaypipeIterableDataset(loader), batch_size=None, num_workers=0)
        assert len(dl) == 3
        got = [(tuple(x.shape), tuple(y.shape)) for x, y in dl]
        assert got == [((4, 3, 32, 32), (4,))] * 3
    finally:
        loader.close()
    # the host side: packed uint8 batches, the DataLoader turns numpy into tensors and changes nothing else
    pipe = Pipeline(str(data), TrainAugment(input_size=32), config=PipelineConfig(batch_size=5, seed=1))
    source = EpochSource(pipe, end_epoch=1)
    try:
        dl = torch.utils.data.DataLoader(RaypipeIterableDataset(source), batch_size=None, num_workers=0)
        batches = list(dl)
        assert [tuple(b["image"].shape) for b in batches] == [(5, 32, 32, 3), (5, 32, 32, 3), (2, 32, 32, 3)]
        assert batches[0]["image"].dtype == torch.uint8
        assert sorted(torch.cat([b["sample_id"] for b in batches]).tolist()) == list(range(12))
    finally:
        source.close()


def test_iterable_dataset_refuses_dataloader_workers():
    batches = [{"image": np.zeros((2, 4, 4, 3), np.uint8), "label": np.zeros(2, np.int64)}] * 2
    dl = torch.utils.data.DataLoader(RaypipeIterableDataset(batches), batch_size=None, num_workers=1)
    with pytest.raises((RuntimeError, TypeError), match="num_workers=0"):
        list(dl)
