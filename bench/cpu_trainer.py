"""A CPU trainer end to end: timm's ``test_resnet`` trained at 96 px on this machine's cores, fed by timm's
``create_loader`` or by raypipe's drop-in (``raypipe.timm.create_loader``, same arguments)::

    python bench/cpu_trainer.py /tmp/photo4k --loader timm --epochs 3
    python bench/cpu_trainer.py /tmp/photo4k --loader raypipe --epochs 3

Each epoch is timed from the start of its loop to its last optimiser step (epoch starts included); the
first includes the loader's start (Ray's, for raypipe). Prints each epoch's seconds and images/s.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="an image folder")
    p.add_argument("--loader", choices=("timm", "raypipe"), required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--img-size", type=int, default=96)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="create_loader's num_workers")
    a = p.parse_args()

    import timm
    import torch
    from timm.data import create_dataset

    if a.loader == "timm":
        from timm.data import create_loader
    else:
        from raypipe.timm import create_loader

    torch.manual_seed(0)
    dataset = create_dataset("", root=a.data, split="train", is_training=True)
    classes = len({t for _, t in dataset.reader.samples})
    model = timm.create_model("test_resnet", pretrained=False, num_classes=classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    t_start = time.perf_counter()
    loader = create_loader(
        dataset,
        input_size=(3, a.img_size, a.img_size),
        batch_size=a.batch_size,
        is_training=True,
        use_prefetcher=True,
        num_workers=a.workers,
        color_jitter=None,
        device=torch.device("cpu"),
        persistent_workers=True,
    )
    model.train()
    for epoch in range(a.epochs):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        t0, n = time.perf_counter(), 0
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            n += int(x.shape[0])
        dt = time.perf_counter() - t0
        extra = f" ({time.perf_counter() - t_start:.1f} s since the loader was made)" if epoch == 0 else ""
        print(f"{a.loader}: epoch {epoch}: {n} images in {dt:.1f} s = {n / dt:.0f} img/s{extra}", flush=True)


if __name__ == "__main__":
    main()
