"""``raypipe bench``: raypipe vs the decode limit, timm's loader, naive Ray Data, raypipe's own
augmentation inside Ray Data, NVIDIA DALI's CPU pipeline and SPDL, in one run.

The loaders that feed a trainer deliver the same batches (normalised fp32 on the CPU) with their workers
at the same priority; timm runs at each ``--timm-workers`` setting (1x and 2x the cores by default) and
the ratios take its fastest. Each epoch is timed as a training loop sees it, from the start of its loop
to its last batch; the first batch is timed from the contender's start (its Ray, its workers). DALI and
SPDL are optional: where one is not installed its row says so, with the command that installs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from raypipe.cli.common import check_index, check_json_path, quiet_ray_startup, write_json
from raypipe.config import BACKENDS, TrainAugment
from raypipe.flags import add_index_arg

SUITES = {
    "RRC224 + hflip": dict(color_jitter=None),
    "RRC224 + hflip + rand-m9-mstd0.5-inc1": dict(color_jitter=None, auto_augment="rand-m9-mstd0.5-inc1"),
}
LOADERS = ("decode", "kernel", "raypipe", "packed", "timm", "naive", "raydata", "dali", "spdl")
# Loaders that read a local image folder (a copy of any other source)
FOLDER_LOADERS = ("timm", "naive", "raydata", "dali", "spdl")
# Loaders that start processes (Ray, DataLoader workers) each run in a fresh process: measured in one
# process, one loader's leftovers (a Ray Data execution's objects, a persistent worker pool) skew the
# next one's figures.
ISOLATED = ("raypipe", "packed", "timm", "naive", "raydata", "dali", "spdl")
# Loaders of other projects, optional (raypipe.benchmark.peers)
PEER_LOADERS = ("dali", "spdl")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="compare raypipe with timm's loader, naive Ray Data, DALI and SPDL on the same images"
    )
    p.add_argument(
        "data",
        help="any source raypipe reads (an image folder, Parquet, WebDataset shards, a URI); "
        "timm, the Ray Data contenders, DALI and SPDL read a local folder copy of a "
        "non-folder source",
    )
    add_index_arg(p)
    p.add_argument(
        "--fields",
        nargs="+",
        metavar="NAME",
        default=(),
        help="raypipe's rows carry these fields (WebDataset members, columns): read, decoded and packed "
        "beside each image; the others read the images only",
    )
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader; the first is a warm-up")
    p.add_argument(
        "-b", "--batch-size", type=int, default=128, help="images per batch; the data must hold at least one batch"
    )
    p.add_argument("--img-size", type=int, default=224, help="output image size (square)")
    p.add_argument(
        "--only",
        nargs="+",
        choices=LOADERS,
        default=list(LOADERS),
        help="run only these loaders (dali: NVIDIA DALI's CPU pipeline, spdl: SPDL; rows for those not "
        "installed say how to install them)",
    )
    p.add_argument(
        "--suites",
        nargs="+",
        choices=("plain", "aa"),
        default=["plain", "aa"],
        help="plain: RandomResizedCrop + flip; aa: also rand-m9-mstd0.5-inc1",
    )
    p.add_argument(
        "--timm-workers",
        type=int,
        nargs="+",
        metavar="N",
        help="timm's num_workers settings to try (default: 1x and 2x the cores)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="where raypipe's tasks run (ExecutionConfig.backend); auto, as a training script that "
        "has not connected to Ray: local worker processes",
    )
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--plot", help="write a PNG bar chart here (needs matplotlib: pip install raypipe[bench])")
    p.set_defaults(func=main)


def check_args(args: argparse.Namespace):
    """Reject what cannot give a figure, before anything runs; the data as the contenders read it."""
    from raypipe.benchmark.data import open_bench_data

    for name in ("epochs", "batch_size", "img_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected >= 1")
    if any(n < 1 for n in args.timm_workers or ()):
        # timm's loader runs with persistent workers, which a DataLoader refuses without any
        raise ValueError(f"--timm-workers {args.timm_workers}: expected numbers >= 1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'raypipe[bench]'")
    if "://" not in args.data and not Path(args.data).exists():
        raise ValueError(f"{args.data}: does not exist")
    check_index(args.data, None, args.index)
    data = open_bench_data(args.data, index=args.index)
    if data.images == 0:
        raise ValueError(f"{args.data}: no images found")
    batched = {"raypipe", "packed", "timm", "naive", "raydata", *PEER_LOADERS} & set(args.only)
    if batched and data.images < args.batch_size:
        # timm's training loader drops the last partial batch: with fewer images than one batch it
        # delivers none and would be shown at 0 img/s.
        raise ValueError(
            f"{args.data} has {data.images} images, fewer than one batch of {args.batch_size} (-b): the loaders "
            f"({', '.join(sorted(batched))}) need at least one full batch; use -b {data.images} or less, or more images"
        )
    return data


def _run_one(
    name: str, aug: TrainAugment, args: argparse.Namespace, files: list[bytes], cores: int, started: float | None = None
):
    """One contender; ``args.data`` is what raypipe reads, ``args.folder`` the folder timm and naive Ray
    Data read, ``args.workers`` timm's num_workers."""
    from raypipe.benchmark import contenders

    b, e = args.batch_size, args.epochs
    if name == "decode":
        return contenders.decode_limit(files, cores)
    if name == "kernel":
        return contenders.kernel_per_core(files, aug)
    backend, index = getattr(args, "backend", "auto"), getattr(args, "index", None)
    listed = {"backend": backend, "index": index, "fields": tuple(getattr(args, "fields", ()))}
    if name == "raypipe":
        return contenders.raypipe_pipeline(args.data, aug, batch_size=b, epochs=e, started=started, **listed)
    if name == "packed":
        return contenders.raypipe_pipeline(
            args.data, aug, batch_size=b, epochs=e, device_side=False, started=started, **listed
        )
    if name == "timm":
        return contenders.timm_loader(args.folder, aug, batch_size=b, epochs=e, workers=args.workers, started=started)
    if name == "raydata":
        return contenders.raypipe_on_ray_data(args.folder, aug, batch_size=b, epochs=e, started=started)
    if name in PEER_LOADERS:
        from raypipe.benchmark.peers import run_peer

        return run_peer(name, args.folder, aug, batch_size=b, epochs=e, started=started)
    return contenders.naive_ray_data(args.folder, aug, batch_size=b, epochs=e, started=started)


def _run_isolated(name: str, aug: TrainAugment, settings: dict, cores: int):
    """Body of the child process: its own Ray (or none, for timm), shut down before it exits."""
    import time

    import ray
    import torch  # noqa: F401 - imported before the clock starts, as in a training script

    from raypipe.benchmark import contenders  # noqa: F401 - the same: module imports are not the loader's
    from raypipe.integrations import timm_loader as _timm_dropin  # noqa: F401
    from raypipe.pipeline import feeder, pipeline  # noqa: F401

    if name in ("timm", "naive"):
        import timm.data  # noqa: F401
    if name in ("naive", "raydata"):
        import ray.data  # noqa: F401
    if name in PEER_LOADERS:
        from raypipe.benchmark.peers import load_library

        load_library(name)

    # This process was spawned, and spawn's set-up makes spawn its start method too: give it back the
    # platform's default, as a training script has it (a DataLoader's workers are forked on Linux).
    multiprocessing.set_start_method(None, force=True)
    # The first batch is timed from here: what a run pays after its imports, Ray's start included.
    started = time.perf_counter()
    if name in ("naive", "raydata") or (name in ("raypipe", "packed") and settings.get("backend") == "ray"):
        from raypipe.runtime import connect

        # raypipe's own rows start Ray in the background and make their first chunks here meanwhile, as
        # the timm drop-in does by itself; Ray Data needs its cluster before anything else. Otherwise
        # raypipe runs as a training script that has not connected to Ray: on local worker processes.
        with quiet_ray_startup(settings.get("verbose", False)):
            connect(quiet=not settings.get("verbose", False), wait=name in ("naive", "raydata"))
    try:
        return _run_one(name, aug, argparse.Namespace(**settings), [], cores, started=started)
    except Exception as e:  # Ray's exception classes do not pickle back to the parent: send the text
        inner = e.cause if isinstance(e, ray.exceptions.RayTaskError) and e.cause is not None else e
        first = (str(inner).splitlines() or [""])[0]
        raise RuntimeError(
            f"{name} failed in its bench process: {type(inner).__name__}: {first}\n{traceback.format_exc()}"
        ) from None
    finally:
        if ray.is_initialized():
            ray.shutdown()


def _run_in_child(
    name: str, aug: TrainAugment, args: argparse.Namespace, cores: int, *, folder: str | None, workers: int = 0
):
    settings = {
        "data": args.data,
        "folder": folder,
        "workers": workers,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "verbose": bool(getattr(args, "verbose", False)),
        "backend": getattr(args, "backend", "auto"),
        "index": getattr(args, "index", None),
        "fields": tuple(getattr(args, "fields", ())),
    }
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_run_isolated, name, aug, settings, cores).result()


def main(args: argparse.Namespace) -> int:
    data = check_args(args)
    check_json_path(args.json)
    check_json_path(args.plot)
    from raypipe.benchmark import peers
    from raypipe.benchmark.report import caption, format_table, machine, plot, ratios

    cores = os.cpu_count() or 1
    timm_workers = args.timm_workers or sorted({cores, 2 * cores})
    # a peer that is not installed reads nothing: no copy for it alone
    readers = [n for n in FOLDER_LOADERS if n in args.only and not (n in PEER_LOADERS and peers.missing(n))]
    if readers and data.folder is None:
        print(f"making a local folder copy of {args.data} for the folder readers ({', '.join(readers)})", flush=True)
        data = data.with_folder()
    try:
        files = data.sample_bytes() if {"decode", "kernel"} & set(args.only) else []
        chosen = {"plain": list(SUITES)[0], "aa": list(SUITES)[1]}
        suites = {}
        for key in args.suites:
            title = chosen[key]
            aug = TrainAugment(input_size=args.img_size, **SUITES[title])
            print(f"== {title}: {args.data}, {cores} cores, batch {args.batch_size}, {args.epochs} epochs", flush=True)
            results = {}
            for name in LOADERS:
                if name not in args.only:
                    continue
                if name in PEER_LOADERS and (why := peers.unavailable(name, aug)):
                    results[peers.PEERS[name].label] = peers.skipped_row(name, why)
                    print(f"  {peers.PEERS[name].label:<18}        - {why}", flush=True)
                    continue
                runs = [dict(workers=w) for w in timm_workers] if name == "timm" else [{}]
                for extra in runs:
                    if name in ISOLATED:
                        res = _run_in_child(name, aug, args, cores, folder=data.folder, **extra)
                    else:
                        res = _run_one(name, aug, args, files, cores)
                    results[res.name] = res
                    if res.images_per_s > 0:
                        print(
                            f"  {res.name:<18} {res.images_per_s:8.0f} img/s {res.cpu_ms_per_image:6.2f} CPU ms/image",
                            flush=True,
                        )
                    else:
                        print(f"  {res.name:<18}        - (no batch came out: nothing to time)", flush=True)
            suites[title] = results
            print(format_table(title, results), flush=True)
    finally:
        data.close()
    write_json(
        args.json,
        {
            "data": args.data,
            "images": data.images,
            "cores": cores,
            "machine": machine(),
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "suites": {
                t: {"results": [r.as_dict() for r in res.values()], "ratios": ratios(res)} for t, res in suites.items()
            },
        },
    )
    if args.plot:
        text = caption(
            data=args.data, images=data.images, batch_size=args.batch_size, epochs=args.epochs, host=machine()
        )
        plot(args.plot, suites, text)
    return 0
