"""Run by tests/integrations/test_timm_torchrun.py under ``torchrun --nproc_per_node=2``: timm's loop
(tests/integrations/timm_loop.py) on CPU with gloo, the drop-in loaders, DDP; each rank writes what it saw
to OUT/rank{r}.json.

Usage: torchrun ... tests/integrations/torchrun_timm.py DATA_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import timm
import torch
import torch.distributed as dist
from timm.data import create_dataset
from timm_loop import Args, set_loader_epoch, train_one_epoch, validate

from raypipe.timm import create_loader


class RecordIds:
    """The eval loader as validate() sees it ((input, target) and len()), keeping each batch's ids."""

    def __init__(self, loader):
        self.loader, self.ids = loader, []

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for x, y, ids in self.loader:
            self.ids.append(ids.tolist())
            yield x, y


def main(data: str, out: str) -> None:
    import ray  # RAY_AUTH_MODE=token comes from the launch (see docs/timm.md)

    from raypipe.runtime import private_cluster

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    ds_train = create_dataset("", root=data, is_training=True)
    ds_eval = create_dataset("", root=data)
    common = dict(input_size=(3, 32, 32), batch_size=8, device=device, distributed=True, num_workers=2)
    train = create_loader(ds_train, is_training=True, batch_choice_seed=42, **common)
    evaluate = create_loader(ds_eval, is_training=False, yield_ids=True, **common)
    record = RecordIds(evaluate)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(timm.create_model("test_resnet", pretrained=False, num_classes=3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    args = Args(distributed=True, world_size=world)
    set_loader_epoch(train, 0)
    trained = train_one_epoch(0, model, train, optimizer, torch.nn.CrossEntropyLoss(), args)
    metrics = validate(model.module, record, torch.nn.CrossEntropyLoss(), args)
    report = {
        "rank": rank,
        "gcs_address": ray.get_runtime_context().gcs_address,
        "ray_nodes": len([n for n in ray.nodes() if n.get("Alive")]),
        "private_cluster": private_cluster(),
        "train_batches": trained["batches"],
        "train_len": trained["len"],
        "eval_batches": metrics["batches"],
        "eval_len": len(evaluate),
        "eval_ids": record.ids,
        "num_valid_samples": evaluate.sampler.num_valid_samples,
        "top1": metrics["top1"],
    }
    train.close()
    evaluate.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()  # rank 0's process holds the node's Ray: the others finish with it first
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
