"""``raypipe run``: the training pipeline up to the trainer side, without a model (a dry run)."""

from __future__ import annotations

import argparse
from collections import Counter

from raypipe.cli.common import (
    check_json_path,
    connect_quietly,
    data_from_args,
    part_shares,
    print_shares,
    print_skips,
    progress,
    rows_from_args,
    write_json,
)
from raypipe.flags import add_augment_args, add_pipeline_args, add_source_args, build_configs


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run the augmentation pipeline for some epochs and report what came out")
    add_source_args(p)
    add_augment_args(p)
    add_pipeline_args(p)
    p.add_argument("--epochs", type=int, default=1, help="epochs to run")
    p.add_argument("--eval", action="store_true", help="use the eval transform instead of training augmentation")
    p.add_argument("--no-shuffle", action="store_true", help="read the dataset in its listing order every epoch")
    p.add_argument("--device", default="cpu", help="trainer-side device for the DeviceLoader: cpu, cuda or cuda:N")
    p.add_argument(
        "--object-store-mb",
        type=int,
        help="cap the object store of a Ray started here (ignored with RAY_ADDRESS or local workers; default: Ray's)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve the run's metrics for Prometheus on 127.0.0.1:PORT/metrics, under the names Ray exports "
        "(docs/cluster.md, 'Watching a run'); a port already taken: one line, and the run goes on without them",
    )
    p.add_argument("--json", help="write a machine-readable report here")
    p.set_defaults(func=main)


def check_device(device: str) -> None:
    """A device the DeviceLoader can use on this machine, checked before Ray starts."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device!r}: {e}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: expected cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def main(args: argparse.Namespace) -> int:
    # Every argument is checked before Ray starts.
    if args.epochs < 1:
        raise ValueError(f"--epochs {args.epochs}: expected >= 1")
    if args.object_store_mb is not None and args.object_store_mb < 1:
        raise ValueError(f"--object-store-mb {args.object_store_mb}: expected >= 1")
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port {args.metrics_port}: expected a TCP port, 1 to 65535")
    cfg = build_configs(args)
    if args.no_shuffle:
        from dataclasses import replace

        cfg["pipeline"] = replace(cfg["pipeline"], shuffle=False)
    check_device(args.device)
    check_json_path(args.json)
    parts = data_from_args(args)
    rows = rows_from_args(args, parts)
    from raypipe.device import DeviceLoader
    from raypipe.pipeline.epoch_source import EpochSource
    from raypipe.pipeline.pipeline import Pipeline
    from raypipe.runtime import process_memory_mb, tune_consumer_process

    augment = cfg["eval"] if args.eval else cfg["augment"]
    pipe = Pipeline(
        rows, augment, config=cfg["pipeline"], execution=cfg["execution"], decode=cfg["decode"], content_digest=True
    )
    if pipe.uses_ray():
        # In the background: the first chunks are made here while Ray starts (raypipe.pipeline.stream).
        connect_quietly(
            args, object_store_memory=args.object_store_mb * 2**20 if args.object_store_mb else None, wait=False
        )
    tune_consumer_process()

    print(f"raypipe run: {len(rows)} samples ({rows.kind}) from {parts.describe()}, batch {cfg['pipeline'].batch_size}")
    shares = part_shares(parts, rows)
    print_shares(shares)
    if args.metrics_port is not None:
        from raypipe.pipeline.metrics import serve

        if serve(args.metrics_port):
            print(f"raypipe run: metrics on http://127.0.0.1:{args.metrics_port}/metrics")
    epochs = []
    source = EpochSource(pipe, end_epoch=args.epochs)
    with DeviceLoader(source, device=args.device) as loader:  # one loader (one side stream) for the run
        for epoch in range(args.epochs):
            by_source = Counter()  # a mixture's rows of each source
            with progress(len(rows), f"epoch {epoch}") as bar:
                for batch in loader:
                    bar.update(int(batch["sample_id"].shape[0]))
                    if "source" in batch:
                        by_source.update(batch["source"].tolist())
            rep = source.last_report
            mem = process_memory_mb()
            extra = {f"driver_{k}_mb": v for k, v in mem.items()} | {"data_stall_s": round(loader.stats.wait_s, 3)}
            counts = {str(k): n for k, n in sorted(by_source.items())}
            epochs.append(rep.as_dict() | extra | ({"by_source": counts} if counts else {}))
            print(
                f"epoch {epoch}: emitted {rep.emitted}/{rep.expected}, skipped {rep.num_skipped}, "
                f"{rep.images_per_s:.0f} img/s, first batch {rep.first_batch_s:.2f}s, driver RSS {_memory_line(mem)}"
            )
            if counts:
                print("  by source: " + ", ".join(f"{k}={n}" for k, n in counts.items()))
            print_skips(rep.skipped, rep.skipped_paths)
            print(f"  ids_sha256     {rep.ids_sha256}\n  content_sha256 {rep.content_sha256}")
    report = {"data": parts.describe(), "samples": len(rows), "epochs": epochs}
    write_json(args.json, report | ({"parts": shares} if shares else {}))
    return 0


def _memory_line(mem: dict[str, float]) -> str:
    """'1062 MB (own 580, object store 410)': the store's pages are shared and bounded by its cap."""
    if "anon" not in mem:
        return f"{mem['rss']:.0f} MB"
    return f"{mem['rss']:.0f} MB (own {mem['anon']:.0f}, object store {mem.get('shmem', 0):.0f})"
