"""``raypipe bench``: raypipe vs the decode limit, timm's loader and naive Ray Data, in one run."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from raypipe.benchmark import contenders
from raypipe.benchmark.report import format_table, plot, ratios
from raypipe.cli.common import write_json
from raypipe.config import TrainAugment
from raypipe.runtime import connect

SUITES = {
    "RRC224 + hflip": dict(color_jitter=None),
    "RRC224 + hflip + rand-m9-mstd0.5-inc1": dict(color_jitter=None, auto_augment="rand-m9-mstd0.5-inc1"),
}
LOADERS = ("decode", "kernel", "raypipe", "packed", "timm", "naive")
# Loaders that start processes (Ray, DataLoader workers) each run in a fresh process: measured in one
# process, one loader's leftovers (a Ray Data execution's objects, a persistent worker pool) skewed the
# next one's figures by up to 35 %.
ISOLATED = ("raypipe", "packed", "timm", "naive")


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="compare raypipe with timm's loader and naive Ray Data on the same images")
    p.add_argument("data", help="an image folder of JPEGs (e.g. from `raypipe sample-data`)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader; the first is a warm-up")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--only", nargs="+", choices=LOADERS, default=list(LOADERS), help="run only these loaders")
    p.add_argument("--suites", nargs="+", choices=("plain", "aa"), default=["plain", "aa"])
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--plot", help="write a PNG bar chart here")
    p.set_defaults(func=main)


def _files(root: str, limit: int = 400) -> list[bytes]:
    paths = sorted(p for p in Path(root).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    return [p.read_bytes() for p in paths[:limit]]


def _run_one(name: str, aug: TrainAugment, args: argparse.Namespace, files: list[bytes], cores: int):
    b, e = args.batch_size, args.epochs
    if name == "decode":
        return contenders.decode_limit(files, cores)
    if name == "kernel":
        return contenders.kernel_per_core(files, aug)
    if name == "raypipe":
        return contenders.raypipe_pipeline(args.data, aug, batch_size=b, epochs=e)
    if name == "packed":
        return contenders.raypipe_pipeline(args.data, aug, batch_size=b, epochs=e, device_side=False)
    if name == "timm":
        return contenders.timm_loader(args.data, aug, batch_size=b, epochs=e, workers=cores)
    return contenders.naive_ray_data(args.data, aug, batch_size=b, epochs=e)


def _run_isolated(name: str, aug: TrainAugment, settings: dict, cores: int):
    """Body of the child process: its own Ray (or none, for timm), shut down before it exits."""
    import ray

    if name != "timm":
        connect()
    try:
        return _run_one(name, aug, argparse.Namespace(**settings), [], cores)
    except Exception as e:  # Ray's exception classes do not pickle back to the parent: send the text
        raise RuntimeError(f"{name} failed in its bench process:\n{traceback.format_exc()}") from e
    finally:
        if ray.is_initialized():
            ray.shutdown()


def _run_in_child(name: str, aug: TrainAugment, args: argparse.Namespace, cores: int):
    settings = {"data": args.data, "batch_size": args.batch_size, "epochs": args.epochs}
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_run_isolated, name, aug, settings, cores).result()


def main(args: argparse.Namespace) -> int:
    cores = os.cpu_count() or 1
    files = _files(args.data)
    if not files:
        raise ValueError(f"{args.data}: no JPEG files found")
    chosen = {"plain": list(SUITES)[0], "aa": list(SUITES)[1]}
    suites = {}
    for key in args.suites:
        title = chosen[key]
        aug = TrainAugment(input_size=args.img_size, **SUITES[title])
        print(f"== {title}: {args.data}, {cores} cores, batch {args.batch_size}, {args.epochs} epochs", flush=True)
        results = {}
        for name in LOADERS:
            if name in args.only:
                if name in ISOLATED:
                    res = _run_in_child(name, aug, args, cores)
                else:
                    res = _run_one(name, aug, args, files, cores)
                results[res.name] = res
                print(f"  {res.name:<16} {res.images_per_s:8.0f} img/s", flush=True)
        suites[title] = results
        print(format_table(title, results), flush=True)
    write_json(
        args.json,
        {
            "data": args.data,
            "cores": cores,
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "suites": {
                t: {"results": [r.as_dict() for r in res.values()], "ratios": ratios(res)} for t, res in suites.items()
            },
        },
    )
    if args.plot:
        plot(args.plot, suites)
    return 0
