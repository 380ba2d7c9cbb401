"""Per-epoch Ray Data start-up, and how steady epoch rates are from one run of the bench contender to
the next. Reproduces the warm-up rows of bench/NOTES.md::

    python bench/epoch_startup.py /tmp/bench2k --block-sizes 8 32 128     # cold epochs: first batch, epoch time
    python bench/epoch_startup.py /tmp/bench2k --contender-runs 3 --aa     # back-to-back bench runs
    python bench/epoch_startup.py /tmp/bench2k --contender-runs 3 --aa --no-cap   # as before the cap
    python bench/epoch_startup.py /tmp/bench2k --warm-leads 0 1 0 1 [--aa] --epochs 6  # warm-up lead
    python bench/epoch_startup.py /tmp/bench2k --warm-leads 1 --consumer-rate 1000 --epochs 6  # a paced trainer
    python bench/epoch_startup.py /tmp/bench2k --timeline 0 --epochs 4 [--block-size 128]  # when each epoch starts
    python bench/epoch_startup.py /tmp/bench2k --build-rows 200000 1280000 --world-sizes 1 8  # dataset() at scale

The first mode runs one epoch at a time (nothing else running, no warm-up: every epoch starts cold) and
prints how long its first batch of ``--batch-size`` rows takes to arrive. The second runs ``raypipe
bench``'s raypipe contender (and its packed variant) several times in one process and prints each run's
per-epoch rates. The third reads packed batches through an ``EpochSource`` with each ``warm_lead_s`` in
turn and prints every epoch's first-batch time and rate, and the rate over the epochs after the first;
with ``--consumer-rate`` the reader sleeps as a trainer at that pace would, and the share of time it
waited for batches is printed too (a GPU trainer below the pipeline's capacity: do epoch starts stall it?).
The fourth does the same for one ``warm_lead_s`` and prints a timeline: when each epoch's execution was
started (``prestart``), its dataset built and its first two blocks ready, against when the consumer
began and ended each epoch, with the object store's use every ~4000 rows. The fifth repeats the
folder's listing up to each ``--build-rows`` count (an ImageNet-size epoch without the images) and
times ``Pipeline.dataset()`` for one rank of each world size, first on an idle cluster, then while an
epoch of the real images keeps every CPU busy (as when the next epoch warms up near the end of this one).
"""

from __future__ import annotations

import argparse
import time


def first_rows(args: argparse.Namespace) -> None:
    from raypipe.config import PipelineConfig, TrainAugment
    from raypipe.pipeline import Pipeline

    for bs in args.block_sizes:
        cfg = PipelineConfig(batch_size=args.batch_size, block_size=bs)
        pipe = Pipeline(args.data, TrainAugment(input_size=args.img_size, color_jitter=None), config=cfg)
        for epoch in range(args.epochs):
            t0 = time.perf_counter()
            rows, first = 0, None
            for batch in pipe.epoch(epoch):  # EpochRun: the consumer's own path (packed batches)
                rows += len(batch["sample_id"])
                if first is None:
                    first = time.perf_counter() - t0
            total = time.perf_counter() - t0
            print(f"block {bs:4d} rows, epoch {epoch}: first batch ({args.batch_size} rows) after {first:.2f} s, "
                  f"epoch {total:.2f} s")  # fmt: skip


def contender_runs(args: argparse.Namespace) -> None:
    from raypipe.benchmark import contenders
    from raypipe.config import TrainAugment

    extra = {"auto_augment": "rand-m9-mstd0.5-inc1"} if args.aa else {}
    aug = TrainAugment(input_size=args.img_size, color_jitter=None, **extra)
    for i in range(args.contender_runs):
        for device_side in (True, False):
            r = contenders.raypipe_pipeline(
                args.data, aug, batch_size=args.batch_size, epochs=args.epochs, device_side=device_side
            )
            rates = [round(x) for x in r.epoch_rates]
            print(f"run {i}: {r.name:15s} {r.images_per_s:6.0f} img/s, warm epochs {rates}, "
                  f"first batch {r.first_batch_s:.2f} s, store peak {r.peak_object_store_mb:.0f} MB")  # fmt: skip


def warm_leads(args: argparse.Namespace) -> None:
    from raypipe.config import PipelineConfig, TrainAugment
    from raypipe.pipeline import EpochSource, Pipeline

    extra = {"auto_augment": "rand-m9-mstd0.5-inc1"} if args.aa else {}
    aug = TrainAugment(input_size=args.img_size, color_jitter=None, **extra)
    step_s = (lambda n: n / args.consumer_rate) if args.consumer_rate else (lambda n: 0.0)
    for lead in args.warm_leads:
        pipe = Pipeline(args.data, aug, config=PipelineConfig(batch_size=args.batch_size))
        source = EpochSource(pipe, end_epoch=args.epochs, warm_lead_s=lead)
        firsts, rates, images, seconds, waited = [], [], 0, 0.0, 0.0
        for epoch in range(args.epochs):
            t0, first, n, wait = time.perf_counter(), None, 0, 0.0
            asked = t0
            for batch in source:
                got = time.perf_counter()
                first = got - t0 if first is None else first
                wait += got - asked
                n += len(batch["sample_id"])
                time.sleep(step_s(len(batch["sample_id"])))  # an emulated training step at a fixed pace
                asked = time.perf_counter()
            dt = time.perf_counter() - t0
            if epoch > 0:
                images, seconds, waited = images + n, seconds + dt, waited + wait
            firsts.append(round(first, 2))
            rates.append(round(n / dt))
        source.close()
        stall = f", waiting for batches {100 * waited / seconds:.1f} % of that time" if args.consumer_rate else ""
        print(f"warm lead {lead} s: first batch {firsts} s, epochs {rates} img/s, after the first "
              f"{images / seconds:.0f} img/s{stall}", flush=True)  # fmt: skip


def timeline(args: argparse.Namespace) -> None:
    from raypipe.benchmark.measure import plasma_used_mib
    from raypipe.config import PipelineConfig, TrainAugment
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.pipeline import pipeline as pl

    t_zero, events = time.perf_counter(), []

    def note(text: str) -> None:
        events.append((time.perf_counter() - t_zero, text))

    put, prestart, dataset = pl.EpochRun._put, pl.EpochRun.prestart, pl.Pipeline.dataset

    def timed_put(run, item):
        run._blocks_put = getattr(run, "_blocks_put", 0) + 1
        if run._blocks_put <= 2:
            note(f"epoch {run.epoch}: block {run._blocks_put} ready")
        return put(run, item)

    def timed_prestart(run):
        if run._thread is None:
            note(f"epoch {run.epoch}: execution started (prestart)")
        return prestart(run)

    def timed_dataset(pipe, epoch, **kw):
        out = dataset(pipe, epoch, **kw)
        note(f"epoch {epoch}: dataset built")
        return out

    pl.EpochRun._put, pl.EpochRun.prestart, pl.Pipeline.dataset = timed_put, timed_prestart, timed_dataset
    extra = {"auto_augment": "rand-m9-mstd0.5-inc1"} if args.aa else {}
    aug = TrainAugment(input_size=args.img_size, color_jitter=None, **extra)
    pipe = Pipeline(args.data, aug, config=PipelineConfig(batch_size=args.batch_size, block_size=args.block_size))
    source = EpochSource(pipe, end_epoch=args.epochs, warm_lead_s=args.timeline)
    every = max(1, 4000 // args.batch_size)  # batches between object-store readings
    for epoch in range(args.epochs):
        note(f"--- consumer begins epoch {epoch}")
        for i, _ in enumerate(source):
            if i == 0:
                note(f"epoch {epoch}: first batch consumed")
            elif i % every == 0:
                note(f"epoch {epoch}: {i} batches consumed, object store {plasma_used_mib()} MiB")
        note(f"--- consumer ends epoch {epoch}, object store {plasma_used_mib()} MiB")
    source.close()
    for t, text in sorted(events):
        print(f"{t:7.2f} s  {text}")


def build_times(args: argparse.Namespace) -> None:
    import threading

    import pyarrow as pa

    from raypipe.config import PipelineConfig, TrainAugment
    from raypipe.pipeline import Pipeline
    from raypipe.sources import SourceRows, open_source

    listed = open_source(args.data)
    aug = TrainAugment(input_size=args.img_size, color_jitter=None)
    cfg = PipelineConfig(batch_size=args.batch_size)
    busy_pipe = Pipeline(args.data, aug, config=cfg)
    for n in args.build_rows:
        reps = -(-n // len(listed))
        table = pa.concat_tables([listed.table] * reps).slice(0, n)
        table = table.set_column(0, "sample_id", pa.array(range(n), type=pa.int64()))
        rows = SourceRows(kind=listed.kind, root=listed.root, table=table, classes=listed.classes)
        pipe = Pipeline(rows, aug, config=cfg)
        for busy in (False, True):
            stop = threading.Event()
            reader = None
            if busy:  # an epoch of the real images, read as fast as it comes, on every worker

                def read(stop=stop):
                    epoch = 0
                    while not stop.is_set():
                        for _ in busy_pipe.epoch(epoch):
                            if stop.is_set():
                                break
                        epoch += 1

                reader = threading.Thread(target=read, daemon=True)
                reader.start()
                time.sleep(3.0)  # its tasks are running
            for world in args.world_sizes:
                t0 = time.perf_counter()
                _, shard, block = pipe.dataset(1, rank=0, world_size=world)
                print(f"{n:9,d} rows, world size {world}: dataset() {time.perf_counter() - t0:6.2f} s for "
                      f"{shard:,d} rows in {-(-shard // block)} blocks of {block}"
                      f"{', cluster busy' if busy else ''}", flush=True)  # fmt: skip
            stop.set()
            if reader is not None:
                reader.join()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--block-size", type=int, help="rows per block in --timeline (default: auto)")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--block-sizes", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--contender-runs", type=int, default=0, help="run the bench contender this many times")
    p.add_argument("--aa", action="store_true", help="with rand-m9-mstd0.5-inc1")
    p.add_argument("--no-cap", action="store_true", help="no Pipeline.run_ahead_bytes cap (the old behaviour)")
    p.add_argument("--warm-leads", type=float, nargs="+", help="compare EpochSource warm_lead_s values")
    p.add_argument("--consumer-rate", type=float, metavar="IMG_PER_S",
                   help="--warm-leads: the consumer sleeps n / rate per batch (a trainer at a fixed pace)")
    p.add_argument("--timeline", type=float, metavar="WARM_LEAD_S", help="print a start-up timeline")
    p.add_argument("--build-rows", type=int, nargs="+", help="time Pipeline.dataset() for epochs of these sizes")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 8], help="ranks for --build-rows")
    args = p.parse_args()
    if args.no_cap:
        from raypipe.pipeline import Pipeline

        Pipeline.run_ahead_bytes = lambda self, workers=None, *, block_size=None: float("inf")

    from raypipe.runtime import connect

    connect()
    if args.build_rows:
        build_times(args)
    elif args.timeline is not None:
        timeline(args)
    elif args.warm_leads:
        warm_leads(args)
    elif args.contender_runs:
        contender_runs(args)
    else:
        first_rows(args)


if __name__ == "__main__":
    main()
