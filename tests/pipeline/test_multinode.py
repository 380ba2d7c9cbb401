"""The same content on one node and on a simulated two-node cluster."""

import pytest
import ray

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline

pytestmark = [pytest.mark.isolated, pytest.mark.timeout(300)]


def _digest(data, batch_size, chunk_rows):
    pipe = Pipeline(
        str(data),
        TrainAugment(input_size=48),
        config=PipelineConfig(batch_size=batch_size),
        execution=ExecutionConfig(chunk_rows=chunk_rows),
        content_digest=True,
    )
    run = pipe.epoch(0)
    for _ in run:
        pass
    return run.report, None


@pytest.mark.cluster
def test_two_nodes_give_the_single_node_digest(ray_local, sample_dir):
    single, _ = _digest(sample_dir, batch_size=8, chunk_rows=6)
    ray.shutdown()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, logging_level="WARNING")
        cluster.wait_for_nodes()
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        multi, _ = _digest(sample_dir, batch_size=8, chunk_rows=6)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert multi.emitted == single.emitted == 48
    assert multi.ids_sha256 == single.ids_sha256
    assert multi.content_sha256 == single.content_sha256
