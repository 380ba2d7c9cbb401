"""Throughput on 1 vs 2 simulated nodes (ray.cluster_utils.Cluster) on this machine.

Each simulated node gets ``--cpus-per-node`` CPUs (default 1, so two nodes use this machine's two
cores). The driver reads raw packed batches (no DeviceLoader) so the figure is the preprocessing
capacity the nodes deliver. Usage: ``python bench/scaling.py DATA [--epochs 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
from ray.cluster_utils import Cluster

from raypipe.config import PipelineConfig, TrainAugment
from raypipe.pipeline import EpochSource, Pipeline


def measure(data: str, nodes: int, cpus_per_node: int, epochs: int, batch_size: int) -> float:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=cpus_per_node)
        ray.init(address=cluster.address, logging_level="ERROR")
        cluster.wait_for_nodes()
        aug = TrainAugment(input_size=224, color_jitter=None)
        pipe = Pipeline(data, aug, config=PipelineConfig(batch_size=batch_size))
        source = EpochSource(pipe, end_epoch=epochs)
        rates = []
        for epoch in range(epochs):
            t0, n = time.perf_counter(), 0
            for batch in source:
                n += len(batch["sample_id"])
            if epoch > 0:
                rates.append(n / (time.perf_counter() - t0))
        return statistics.median(rates)
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument("-b", "--batch-size", type=int, default=128)
    args = p.parse_args()
    one = measure(args.data, 1, args.cpus_per_node, args.epochs, args.batch_size)
    two = measure(args.data, 2, args.cpus_per_node, args.epochs, args.batch_size)
    print(f"{'nodes':<6} {'img/s':>8}")
    print(f"{1:<6} {one:>8.0f}")
    print(f"{2:<6} {two:>8.0f}")
    print(f"scaling 2 nodes / 1 node: {two / one:.2f}x")


if __name__ == "__main__":
    main()
