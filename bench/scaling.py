"""Throughput on 1 vs 2 simulated nodes (ray.cluster_utils.Cluster) on this machine.

Each simulated node gets ``--cpus-per-node`` CPUs (default 1, so two nodes use this machine's two
cores). The driver reads raw packed batches (no DeviceLoader) so the figure is the preprocessing
capacity the nodes deliver. Usage: ``python bench/scaling.py DATA [--epochs 6]``.
"""

from __future__ import annotations

import argparse
import os
import time

import ray
from ray.cluster_utils import Cluster

from raypipe.config import PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline
from raypipe.runtime import worker_pool_env


def measure(
    data: str, nodes: int, cpus_per_node: int, epochs: int, batch_size: int, store_mb: int = 1024, verbose: bool = False
) -> float:
    # Workers at niceness 0 and a soft limit as raypipe's own clusters have them (runtime.connect,
    # cluster.yaml; Ray's defaults, 15 and the CPU count, starve and churn the workers): each node's
    # raylet reads them from the environment it inherits. And an object store per node that holds the
    # chunks in flight, as a real node's does (ray.cluster_utils gives its nodes 150 MB by default).
    os.environ.update(worker_pool_env(cpus_per_node * nodes))
    node = {"num_cpus": cpus_per_node, "object_store_memory": store_mb << 20}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        ray.init(address=cluster.address, logging_level="ERROR")
        cluster.wait_for_nodes()
        aug = TrainAugment(input_size=224, color_jitter=None)
        pipe = Pipeline(data, aug, config=PipelineConfig(batch_size=batch_size))
        source = EpochSource(pipe, end_epoch=epochs)
        # Aggregate over the epochs after the first (which starts the workers), as `raypipe bench`:
        # each epoch's execution starts while the previous one drains, so a single epoch's own rate
        # can be credited with work done during its predecessor (a median of those scattered 2x).
        images, seconds = 0, 0.0
        for epoch in range(epochs):
            t0, n = time.perf_counter(), 0
            last = t0
            for batch in source:
                n += len(batch["sample_id"])
                now = time.perf_counter()
                if verbose and now - last > 1.0:
                    print(f"  {nodes} node(s), epoch {epoch}: waited {now - last:.2f} s for rows up to {n}")
                last = now
            if verbose:
                print(f"  {nodes} node(s), epoch {epoch}: {n} rows in {time.perf_counter() - t0:.2f} s")
            if epoch > 0:
                images, seconds = images + n, seconds + time.perf_counter() - t0
        return images / seconds
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--store-mb", type=int, default=1024, help="object store per simulated node")
    p.add_argument("--verbose", action="store_true", help="each epoch's time and every wait over 1 s for a batch")
    args = p.parse_args()
    one = measure(args.data, 1, args.cpus_per_node, args.epochs, args.batch_size, args.store_mb, args.verbose)
    two = measure(args.data, 2, args.cpus_per_node, args.epochs, args.batch_size, args.store_mb, args.verbose)
    print(f"{'nodes':<6} {'img/s':>8}")
    print(f"{1:<6} {one:>8.0f}")
    print(f"{2:<6} {two:>8.0f}")
    print(f"scaling 2 nodes / 1 node: {two / one:.2f}x")


if __name__ == "__main__":
    main()
