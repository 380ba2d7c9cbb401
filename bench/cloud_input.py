"""Cloud-scale input side by side: the same photo-like JPEGs as a local folder, one Parquet file with
100-row row groups, WebDataset shards, and over S3 with first-byte latency (folder, shards, the
Parquet file), each run as ``raypipe run`` runs them, in one process::

    python bench/cloud_input.py --images 3000 --epochs 5 --rounds 3     # the figures
    python bench/cloud_input.py --images 200 --epochs 2                 # a smoke run
    python bench/cloud_input.py --only parquet "s3 parquet"             # those two and the folder

Each contender is ``Pipeline`` + ``EpochSource`` (RandomResizedCrop 224 + flip, no colour jitter, batch
128) over ``--epochs`` epochs, on workers started for it and an unmeasured epoch: local worker
processes, as ``raypipe run`` has without ``RAY_ADDRESS`` (``--backend auto``), or Ray tasks on a local
Ray started first (``--backend ray``). Its
rate is the images of all epochs over their seconds, each epoch from the start of its loop to its last
batch: one stream runs ahead across epoch boundaries by up to its window of chunks, and a Parquet chunk
is a whole window of row groups (about 2048 rows), so with small data a later epoch can find all its
batches ready and any rate over some of the epochs credits them with work done before they began. The
ratio is that rate over the local folder's.
On a small machine one contender's rate moves by a fifth from one run to the next, so ``--rounds R``
runs the contenders R times in turn (folder, Parquet, …, folder, Parquet, …), each ratio against the
folder of its own round, and the table shows the median round's figures and the ratios' range.
``s3 folder`` runs as a user's does, with nothing configured: its images are kept in the local cache
(``RAYPIPE_CACHE_DIR`` unset; here a new folder under the work folder's ``xdg-cache`` for each of its
runs), so its first epoch fetches them and the later ones read them from the disk. ``s3 folder, no
cache`` runs with ``RAYPIPE_CACHE_DIR=off``: a request per image every epoch. After the rounds, the
warm cache runs once on workers started again (a later run, which finds the cache filled: its
processes know of the entries only from the folder, and every read is a hit), then the folder once
more as its reference.
The S3 server is ``raypipe.testing.s3server`` in a process of its own (so its threads do not
share the consumer's interpreter lock), adding ``--latency-ms`` before every response's first byte.
It shares the machine's cores with the contenders, and its CPU is then taken from the readers of
``s3://``, which a real store's is not; ``--server-cores N`` gives it N cores of its own and every
contender (the local folder included) the rest, so the ratios compare the readers alone.
Workers read the cache's settings where they start, and keep what earlier contenders left them (slabs
grown to a window's chunks): each contender runs on workers started for it, after an unmeasured epoch
of the folder that starts them. The Parquet file is
sorted by class (4 classes), as a file written class by class is; the per-batch label entropy of its
epochs, through the pipeline's real order, is printed against a global shuffle's. The markdown table
is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from raypipe.benchmark.s3 import S3Process, keep_to, split_cores

WARM = "s3 folder, warm cache"  # a later run over the cache "s3 folder" filled (``--only "s3 folder"`` runs both)
TARGETS = {"parquet": 0.9, "webdataset": 0.9, "s3 folder": 0.9, "s3 shards": 0.9, WARM: 0.9}
CONTENDERS = ("folder", "parquet", "webdataset", "s3 shards", "s3 parquet", "s3 folder", "s3 folder, no cache")
NO_CACHE = {"RAYPIPE_CACHE_DIR": "off"}  # every contender but the default s3 folder: what it reads, every epoch


def make_data(work: Path, images: int, classes: int) -> dict[str, Path]:
    """The folder (photo-like JPEGs), the class-sorted Parquet file and the shards, under ``work/buckets/bench``
    so the S3 server serves the very same files."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pyarrow as pa
    import pyarrow.parquet as pq
    from photolike import write_photolike

    from raypipe.sources import open_source
    from raypipe.sources.writing.convert import convert

    base = work / "buckets" / "bench"
    folder, parquet, shards = base / "folder", base / "parquet" / "train.parquet", base / "shards"
    if not folder.exists():
        write_photolike(
            str(folder),
            classes=classes,
            per_class=images // classes,
            sizes=[(500, 375), (640, 480)],
            quality=(80, 95),
            workers=os.cpu_count() or 1,
        )
    if not parquet.exists():
        rows = open_source(str(folder))  # listing order: class by class
        cells = [(folder / str(p)).read_bytes() for p in rows.table.column("path").to_pylist()]
        parquet.parent.mkdir(parents=True, exist_ok=True)
        table = pa.table({"image": pa.array(cells, pa.binary()), "label": rows.table.column("label")})
        pq.write_table(table, parquet, row_group_size=100, compression="none")
    if not shards.exists():
        convert(str(folder), str(shards), format="webdataset", samples_per_shard=100)
    return {"folder": folder, "parquet": parquet, "shards": shards}


def run_epochs(name: str, source, epochs: int, batch_size: int, backend: str) -> dict:
    """One contender: each epoch's images and seconds, and each full batch's labels."""
    from raypipe import ExecutionConfig, Pipeline, PipelineConfig, TrainAugment
    from raypipe.benchmark.measure import measure_epochs
    from raypipe.pipeline import EpochSource

    pipe = Pipeline(
        source,
        TrainAugment(input_size=224, color_jitter=None),
        config=PipelineConfig(batch_size=batch_size, seed=0),
        execution=ExecutionConfig(backend=backend),
    )
    src = EpochSource(pipe, end_epoch=epochs)
    images, seconds, labels = [], [], []

    def count(batch) -> int:
        if len(batch["label"]) == batch_size:
            labels.append(np.asarray(batch["label"]).copy())
        return len(batch["label"])

    def on_epoch(epoch: int, n: int, dt: float) -> None:
        images.append(n)
        seconds.append(dt)
        print(f"{name}: epoch {epoch}: {n} images in {dt:.2f} s = {n / dt:.0f} img/s", flush=True)

    try:
        r = measure_epochs(name, lambda epoch: src, epochs=epochs, count=count, on_epoch=on_epoch)
    finally:
        src.close()
    later = slice(1, None) if epochs > 1 else slice(None)
    return {
        "images": images,
        "seconds": seconds,
        "rate": sum(images) / sum(seconds),
        "spread": r.spread,
        "later": sum(images[later]) / sum(seconds[later]),
        "first": images[0] / seconds[0],
        "labels": labels,
    }


def figures(run: dict) -> dict:
    """A contender's figures without its batches' labels (kept for the entropy only)."""
    return {k: v for k, v in run.items() if k != "labels"}


def mean_entropy(batches: list[np.ndarray], classes: int) -> float:
    """Mean over batches of the label distribution's entropy (bits), as tests/plan/test_order.py computes it."""
    ent = []
    for labels in batches:
        p = np.bincount(labels, minlength=classes) / len(labels)
        p = p[p > 0]
        ent.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(ent)) if ent else float("nan")


def shuffled_entropy(labels: np.ndarray, epochs: int, batch_size: int, classes: int) -> float:
    """The same mean for a global shuffle of the same labels (the order a folder gets)."""
    from raypipe.plan.order import epoch_order

    batches = []
    for e in range(epochs):
        order = epoch_order(len(labels), seed=0, epoch=e, shuffle=True)[0]
        batches += [labels[order[s : s + batch_size]] for s in range(0, len(order) - batch_size + 1, batch_size)]
    return mean_entropy(batches, classes)


def connect_again(tries: int = 3) -> None:
    """Start the local Ray (again): on a loaded machine its start, or a restart right after a shutdown, can
    time out."""
    import raypipe.runtime

    for attempt in range(tries):
        try:
            raypipe.runtime.connect()
            return
        except Exception as e:  # noqa: BLE001 - Ray's start-up timeout is a bare Exception
            if attempt == tries - 1:
                raise
            print(f"Ray did not start ({e}); again in 10 s", flush=True)
            time.sleep(10)


def start_workers_again(on_ray: bool) -> None:
    """Stop this process's workers, so that the next contender's start with its own environment."""
    if on_ray:
        import ray

        ray.shutdown()
        connect_again()
    else:
        from raypipe.workers.local import LocalWorkers

        LocalWorkers.shutdown_shared()


def set_env(env: dict[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def ratios(rounds: list[dict[str, dict]], warm: dict | None) -> dict[str, list[float]]:
    """Each contender's ratios to the local folder, one per round (the warm cache's: its run against the
    folder's run right after it)."""
    out = {name: [r[name]["rate"] / r["folder"]["rate"] for r in rounds] for name in rounds[0]}
    if warm is not None:
        out[WARM] = [warm["rate"] / warm["folder after"]["rate"]]
    return out


def median_round(runs: list[dict], ratio: list[float]) -> dict:
    """The run whose ratio is the median one (the lower middle of an even count)."""
    return runs[sorted(range(len(ratio)), key=ratio.__getitem__)[(len(ratio) - 1) // 2]]


def table(rounds: list[dict[str, dict]], warm: dict | None, latency_ms: float) -> str:
    lines = [
        "| source | img/s, all epochs | × local folder | range over rounds | target | img/s, epoch 1 | "
        "img/s, epochs 2..N |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for name, ratio in ratios(rounds, warm).items():
        runs = [r[name] for r in rounds] if name in rounds[0] else [warm]
        r = median_round(runs, ratio)
        shown = name.replace("s3 ", f"s3 ({latency_ms:g} ms) ")
        target = f"≥ {TARGETS[name]:.2f}" if name in TARGETS else ""
        spread = f"{min(ratio):.2f}-{max(ratio):.2f}" if len(ratio) > 1 else ""
        lines.append(
            f"| {shown} | {r['rate']:.0f} | {float(np.median(ratio)):.2f} | {spread} | {target} | "
            f"{r['first']:.0f} | {r['later']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3000, help="photo-like JPEGs (4 classes)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--latency-ms", type=float, default=20.0, help="added before every S3 response's first byte")
    p.add_argument(
        "--workdir",
        help="where the data are made (kept, and reused by a later run); default: a "
        "temporary folder, removed at the end",
    )
    p.add_argument("--rounds", type=int, default=1, help="times the contenders run, in turn")
    p.add_argument(
        "--backend",
        choices=("auto", "ray", "local"),
        default="auto",
        help="where the tasks run (ExecutionConfig.backend); auto: as raypipe run, Ray only with RAY_ADDRESS",
    )
    p.add_argument(
        "--server-cores",
        type=int,
        default=0,
        help="run the S3 server on this many of the machine's cores and every contender on the "
        "others, as a real store runs off the reader's machine (default 0: all share all)",
    )
    p.add_argument(
        "--only",
        nargs="+",
        choices=CONTENDERS[1:],
        metavar="NAME",
        help="run these contenders and the folder (their baseline) only: " + ", ".join(repr(c) for c in CONTENDERS[1:]),
    )
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    classes = 4
    if a.images < classes * 2 or a.epochs < 1 or a.rounds < 1:
        p.error("--images must be at least 8, --epochs and --rounds at least 1")
    try:
        contender_cores, server_cores = split_cores(a.server_cores)
    except ValueError as e:
        p.error(str(e))
    if a.server_cores and a.backend == "ray":
        p.error("--server-cores runs the contenders on local workers (a Ray started first keeps every core)")

    import pyarrow.parquet as pq
    import ray

    from raypipe.sources import open_source

    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="raypipe-cloud-"))
    work.mkdir(parents=True, exist_ok=True)
    # The default cache's folder is $XDG_CACHE_HOME/raypipe: a new one for each round, so that no process
    # (the consumer reads a stream's first chunks) still knows of entries an earlier round made.
    shutil.rmtree(work / "xdg-cache", ignore_errors=True)
    default_cache = {"RAYPIPE_CACHE_DIR": None, "RAYPIPE_CACHE_MAX_BYTES": None, "XDG_CACHE_HOME": None}
    saved = {key: os.environ.get(key) for key in {**NO_CACHE, **default_cache}}
    set_env(NO_CACHE)
    server = None
    rounds: list[dict[str, dict]] = []
    warm = None
    on_ray = a.backend == "ray" or (a.backend == "auto" and bool(os.environ.get("RAY_ADDRESS")))
    try:
        if on_ray:
            connect_again()
        data = make_data(work, a.images, classes)
        if not on_ray and ray.is_initialized():
            ray.shutdown()  # the Ray that raypipe convert made the shards on: local workers run the rest
        # read before the work folder goes (a run without --workdir removes it at the end)
        sorted_labels = pq.read_table(data["parquet"], columns=["label"]).column("label").to_numpy()
        if server_cores:
            keep_to(contender_cores)
        server = S3Process(work / "buckets", a.latency_ms, server_cores)
        fs = server.filesystem()
        contenders = {
            "folder": lambda: str(data["folder"]),
            "parquet": lambda: str(data["parquet"]),
            "webdataset": lambda: str(data["shards"]),
            "s3 shards": lambda: open_source("s3://bench/shards", filesystem=fs),
            "s3 parquet": lambda: open_source("s3://bench/parquet", filesystem=fs),
            "s3 folder": lambda: open_source("s3://bench/folder", filesystem=fs),
            "s3 folder, no cache": lambda: open_source("s3://bench/folder", filesystem=fs),
        }
        if a.only:
            contenders = {name: make for name, make in contenders.items() if name == "folder" or name in a.only}

        def on_workers_with(env: dict) -> None:
            """Workers that read ``env`` where they start, after an unmeasured epoch that starts them,
            so that no contender (the first is the baseline) pays for it."""
            set_env(env)
            start_workers_again(on_ray)
            run_epochs("warm-up", str(data["folder"]), 1, a.batch_size, a.backend)

        for k in range(a.rounds):
            tag = f" (round {k + 1})" if a.rounds > 1 else ""
            rounds.append({})
            for name, make in contenders.items():
                if name == "s3 folder":  # over an empty cache, each round
                    default_cache["XDG_CACHE_HOME"] = str(work / "xdg-cache" / f"round-{k + 1}")
                on_workers_with(default_cache if name == "s3 folder" else NO_CACHE)
                rounds[-1][name] = run_epochs(name + tag, make(), a.epochs, a.batch_size, a.backend)
        if "s3 folder" in contenders:
            # A later run: processes that find the cache filled by others, then its reference next to it
            # in time (this machine's speed drifts by a fifth within minutes).
            on_workers_with(default_cache)
            warm = figures(run_epochs(WARM, contenders["s3 folder"](), a.epochs, a.batch_size, a.backend))
            on_workers_with(NO_CACHE)
            after = run_epochs("folder (after the warm cache)", str(data["folder"]), a.epochs, a.batch_size, a.backend)
            warm["folder after"] = figures(after)
    finally:
        set_env(saved)
        if server is not None:
            server.stop()
        if ray.is_initialized():
            ray.shutdown()
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)

    got = full = float("nan")
    if "parquet" in rounds[0]:
        got = mean_entropy(rounds[0]["parquet"]["labels"], classes)
        full = shuffled_entropy(sorted_labels, a.epochs, a.batch_size, classes)
        print(
            f"\nclass-sorted Parquet ({classes} classes, 100-row groups): mean per-batch label entropy {got:.3f} "
            f"bits through the pipeline, {full:.3f} for a global shuffle: {got / full:.3f}x (target >= 0.95)"
        )
    report = table(rounds, warm, a.latency_ms)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {
                    "images": a.images,
                    "epochs": a.epochs,
                    "latency_ms": a.latency_ms,
                    "server_cores": sorted(server_cores or ()),
                    "entropy": {"pipeline": got, "global": full, "ratio": got / full},
                    "ratios": ratios(rounds, warm),
                    "rounds": [{k: figures(v) for k, v in r.items()} for r in rounds],
                    "warm cache": warm,
                },
                fh,
                indent=1,
            )
    print()
    print(report)


if __name__ == "__main__":
    main()
