"""What carrying a caption and JSON metadata costs: the same WebDataset shards read with and without
``ListingOptions(fields=("txt", "json"))``, epochs in turn (A B A B …), on local worker processes
(``EpochSource``, the exact uint8 batches a GPU trainer receives)::

    python bench/fields.py /tmp/photos /tmp/captioned --rounds 3 --epochs 3

The first argument is an image folder (``raypipe sample-data``'s photos, or your own); the shards are
written to the second once (``KEY.jpg`` + ``KEY.cls`` + ``KEY.txt`` + ``KEY.json``: a caption of about 80
characters and 300 bytes of LAION-like metadata per image) and reused when they are there. Each round
times one run of each setting, its first epoch a warm-up; the ratio is with fields / without, per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tarfile
import time
from io import BytesIO
from pathlib import Path

WORDS = "a photo of the red old small dog cat tree house car near by on in with under bright dark wide".split()


def write_captioned(src: Path, dst: Path, per_shard: int = 200) -> int:
    """Shards of every image under ``src`` (class folders), each with a caption and JSON metadata."""
    files = sorted(p for p in src.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    classes = {c: i for i, c in enumerate(sorted({p.parent.name for p in files}))}
    dst.mkdir(parents=True, exist_ok=True)
    for s in range(0, len(files), per_shard):
        with tarfile.open(dst / f"captioned-{s // per_shard:05d}.tar", "w") as tar:
            for k, path in enumerate(files[s : s + per_shard], start=s):
                key = f"{k:08d}"
                caption = " ".join(WORDS[(k * 7 + j * 3) % len(WORDS)] for j in range(14))
                meta = {
                    "url": f"https://example.org/images/{key}.jpg",
                    "caption": caption,
                    "width": 500,
                    "height": 375,
                    "similarity": round(0.25 + (k % 50) / 200, 4),
                    "key": key,
                    "status": "success",
                    "error_message": None,
                    "original_width": 1024,
                    "original_height": 768,
                    "exif": "{}",
                    "sha256": f"{k:064x}",
                }
                for name, data in (
                    (f"{key}.jpg", path.read_bytes()),
                    (f"{key}.cls", str(classes[path.parent.name]).encode()),
                    (f"{key}.txt", caption.encode()),
                    (f"{key}.json", json.dumps(meta).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, BytesIO(data))
    return len(files)


def epochs_rate(data: str, fields: tuple[str, ...], a) -> float:
    """img/s over the epochs after the first, one stream (as a training run's), local workers."""
    from raypipe import EpochSource, ExecutionConfig, ListingOptions, Pipeline, PipelineConfig, TrainAugment

    pipe = Pipeline(
        data,
        TrainAugment(input_size=a.img_size),
        config=PipelineConfig(batch_size=a.batch_size),
        execution=ExecutionConfig(backend="local", worker_nice=0, worker_sched_idle=False),
        listing=ListingOptions(fields=fields),
    )
    source = EpochSource(pipe, end_epoch=a.epochs + 1)
    images, began = 0, None
    try:
        for epoch in range(a.epochs):
            for batch in source:
                if epoch > 0:
                    images += len(batch["sample_id"])
                if fields:
                    assert len(batch["txt"]) == len(batch["sample_id"])
            if epoch == 0:
                began = time.perf_counter()
    finally:
        source.close()
    return images / (time.perf_counter() - began)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("photos", type=Path, help="an image folder (class folders)")
    p.add_argument("shards", type=Path, help="where the captioned shards are (written once)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="per run, the first a warm-up")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    a = p.parse_args()
    if not any(a.shards.glob("*.tar")):
        n = write_captioned(a.photos, a.shards)
        print(f"wrote {n} captioned samples to {a.shards}")
    print(f"path: local workers (EpochSource), {os.cpu_count()} cores, batch {a.batch_size}, {a.img_size} px")
    ratios = []
    for r in range(a.rounds):
        plain = epochs_rate(str(a.shards), (), a)
        carried = epochs_rate(str(a.shards), ("txt", "json"), a)
        ratios.append(carried / plain)
        rates = f"without fields {plain:7.0f} img/s   with txt+json {carried:7.0f} img/s"
        print(f"round {r}: {rates}   ratio {ratios[-1]:.3f}")
    print(f"median ratio (with / without): {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
