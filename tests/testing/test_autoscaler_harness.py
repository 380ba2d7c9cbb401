"""Ray's fake multi-node autoscaler (raypipe.testing.autoscaler): demand for the ``preprocess`` resource
brings CPU nodes, up to the node type's ``max_workers``, and they go after the idle timeout once the
demand ends. The two public ways to make that demand differ: pending actors (or tasks) add up over
their owners and go with them; ``request_resources`` is one target for the whole cluster, replaced by
whichever driver calls it last, and outlives the driver that set it. Ending the cluster leaves no
process behind."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import jsonschema
import pytest
import ray
from ray.autoscaler.sdk import request_resources

from raypipe.cluster_config import ray_schema_path
from raypipe.testing.autoscaler import PREPROCESS, WORKER_TYPE, FakeAutoscalingCluster, autoscaling_config
from raypipe.testing.process_tree import MARK_ENV, end_process_tree, marked_processes

log = logging.getLogger(__name__)

IDLE_S = 4.0  # the CPU nodes' idle timeout
SLACK_S = 30.0  # what the autoscaler may take beyond it (its loop, a node's start or end)
SHAPE = {"CPU": 1, PREPROCESS: 0.001}  # what one augmentation worker asks for
BUNDLE = {"CPU": 1, PREPROCESS: 1}  # the same node as a request_resources bundle (Ray 2.52 takes whole amounts)

# A second driver, in a process of its own: holds N actors of SHAPE until its stdin ends (or it is killed).
HOLDER = textwrap.dedent(f"""
    import sys, ray
    ray.init(logging_level="WARNING")
    Hold = ray.remote(num_cpus=1, resources={{"{PREPROCESS}": 0.001}})(type("Hold", (), {{"ping": lambda self: 1}}))
    holds = [Hold.remote() for _ in range(int(sys.argv[1]))]
    print("asked", flush=True)
    sys.stdin.read()
""")
# A second driver that sets the autoscaler's request to the bundles in argv[1] (JSON), then ends.
REQUESTER = textwrap.dedent("""
    import json, sys, ray
    from ray.autoscaler.sdk import request_resources
    ray.init(logging_level="WARNING")
    request_resources(bundles=json.loads(sys.argv[1]))
""")


@ray.remote(num_cpus=1, resources={PREPROCESS: 0.001})
class _Hold:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@contextlib.contextmanager
def _cluster():
    """The cluster of these tests: the trainer's node of 1 CPU, up to 3 CPU nodes of 1. Made in the test
    (an isolated test's fixtures run in the parent process too)."""
    with FakeAutoscalingCluster(head_cpus=1, worker_cpus=1, max_workers=3, idle_timeout_s=IDLE_S) as c:
        yield c
    assert marked_processes(c.mark) == []  # nothing of it is left


def _timeline(cluster: FakeAutoscalingCluster, start: float) -> str:
    return ", ".join(f"{t - start:.1f}s:{n}" for t, n in cluster.timeline)


# -- without a cluster -------------------------------------------------------------------------------


def test_config_is_a_valid_fake_multinode_cluster():
    cfg = autoscaling_config(
        gcs_address="127.0.0.1:40001",
        head_cpus=1,
        worker_cpus=2,
        worker_resources={PREPROCESS: 2.0},
        min_workers=0,
        max_workers=3,
        idle_timeout_s=6,
        worker_object_store_bytes=128 << 20,
    )
    jsonschema.validate(cfg, json.loads(ray_schema_path().read_text(encoding="utf-8")))
    assert cfg["provider"]["type"] == "fake_multinode"
    assert cfg["provider"]["gcs_address"] == "127.0.0.1:40001"
    assert cfg["idle_timeout_minutes"] == pytest.approx(0.1)
    worker = cfg["available_node_types"][WORKER_TYPE]
    assert worker["resources"]["CPU"] == 2 and worker["resources"][PREPROCESS] == 2.0
    assert (worker["min_workers"], worker["max_workers"]) == (0, 3)
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert head["resources"] == {"CPU": 1} and head["max_workers"] == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"head_cpus": 0}, "head_cpus"),
        ({"worker_cpus": 1.5}, "worker_cpus"),
        ({"max_workers": 0}, "max_workers"),
        ({"min_workers": 4, "max_workers": 3}, "min_workers"),
        ({"idle_timeout_s": 0}, "idle_timeout_s"),
        ({"worker_resources": {}}, "worker_resources"),
        ({"worker_resources": {"CPU": 1}}, "worker_resources"),
        ({"worker_object_store_mb": 10}, "worker_object_store_mb"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}="):
        FakeAutoscalingCluster(**kwargs)


def test_connect_and_counting_need_a_started_cluster():
    c = FakeAutoscalingCluster()
    with pytest.raises(RuntimeError, match="not started"):
        c.driver_env()
    with pytest.raises(RuntimeError, match="not started"):
        c.connect()


# A parent that starts a child and a grandchild, and one more process that leaves the tree (its parent,
# a short-lived intermediate, ends at once): every one sleeps until ended.
TREE = textwrap.dedent("""
    import subprocess, sys, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    child = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)",
             *sleeper]
    subprocess.Popen(child)
    # the stray: started by an intermediate that exits, so its parent becomes init
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:], "
                    "start_new_session=True)", *sleeper])
    print("up", flush=True)
    time.sleep(600)
""")


def test_end_process_tree_ends_the_tree_and_the_marked_stray():
    import psutil

    mark = f"test-{os.getpid()}-{time.monotonic_ns()}"
    root = subprocess.Popen(
        [sys.executable, "-c", TREE], env={**os.environ, MARK_ENV: mark}, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert root.stdout.readline().strip() == b"up"
        deadline = time.monotonic() + 30
        while len(marked_processes(mark)) < 4 and time.monotonic() < deadline:  # root, child, grandchild, stray
            time.sleep(0.1)
        everyone = marked_processes(mark)
        tree = psutil.Process(root.pid).children(recursive=True)
        assert len(everyone) == 4 and len(tree) == 2  # the stray is not under the root
        strays = end_process_tree(root.pid, mark, grace_s=5)
        assert len(strays) == 1  # the one found by its mark, not in the tree
        root.wait(timeout=10)
        assert marked_processes(mark) == []
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in everyone)
    finally:
        for proc in marked_processes(mark):
            proc.kill()
        if root.poll() is None:
            root.kill()
            root.wait()


# -- on the fake autoscaling cluster --------------------------------------------------------------------


def _driver(cluster: FakeAutoscalingCluster, script: str, *args: str, **kwargs) -> subprocess.Popen:
    """A driver of its own (another job on the cluster), in a process this test started."""
    env = {**os.environ, **cluster.driver_env()}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, **kwargs)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.isolated(env={"RAY_AUTH_MODE": "token"})
@pytest.mark.timeout(180)
def test_pending_actors_add_up_over_drivers_to_max_workers_and_go_with_their_owners():
    with _cluster() as cluster:
        cluster.connect()
        assert cluster.alive_workers() == 0
        start = time.monotonic()
        ours = [_Hold.remote() for _ in range(2)]
        other = _driver(cluster, HOLDER, "2", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert other.stdout.readline().strip() == b"asked"
            up = cluster.wait_for_workers(3, timeout_s=90)  # four asked for, by two drivers; three at most
            assert max(cluster.workers_during(3)) == 3
            # the other driver ends abruptly: its actors, and the demand its pending one made, go with it
            other.kill()
            other.wait(timeout=30)
            one_down = cluster.wait_for_workers(2, timeout_s=IDLE_S + SLACK_S)
            nodes = ray.get([h.node.remote() for h in ours], timeout=60)  # ours run, each on a CPU node of its own
            assert len(set(nodes)) == 2 and ray.get_runtime_context().get_node_id() not in nodes
            assert set(cluster.workers_during(IDLE_S + 2)) == {2}  # busy nodes are kept past the idle timeout
            for h in ours:
                ray.kill(h)
            all_down = cluster.wait_for_workers(0, timeout_s=IDLE_S + SLACK_S)
        finally:
            if other.poll() is None:
                other.kill()
                other.wait()
        assert cluster.most_workers_seen == 3
        log.info(
            "pending actors: 3 CPU nodes up in %.1f s; 1 released %.1f s after the other driver ended, the last 2 "
            "%.1f s after ours were killed (idle timeout %.0f s); nodes over time: %s",
            up,
            one_down,
            all_down,
            IDLE_S,
            _timeline(cluster, start),
        )


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.isolated(env={"RAY_AUTH_MODE": "token"})
@pytest.mark.timeout(180)
def test_request_resources_is_one_target_for_the_cluster_that_the_last_caller_sets():
    with _cluster() as cluster:
        cluster.connect()
        start = time.monotonic()
        request_resources(bundles=[BUNDLE] * 2)
        up = cluster.wait_for_workers(2, timeout_s=90)
        # another driver asks for one: its request replaces ours (the two do not add up) ...
        other = _driver(cluster, REQUESTER, json.dumps([BUNDLE]))
        assert other.wait(timeout=60) == 0
        one_down = cluster.wait_for_workers(1, timeout_s=IDLE_S + SLACK_S)
        # ... and outlives it: the node it asked for stays, idle, past the idle timeout
        assert set(cluster.workers_during(IDLE_S + 3)) == {1}
        request_resources(bundles=[])
        all_down = cluster.wait_for_workers(0, timeout_s=IDLE_S + SLACK_S)
        assert cluster.most_workers_seen == 2
        log.info(
            "request_resources: 2 CPU nodes up in %.1f s; 1 released %.1f s after another driver replaced the "
            "request, the last %.1f s after an empty one (idle timeout %.0f s); nodes over time: %s",
            up,
            one_down,
            all_down,
            IDLE_S,
            _timeline(cluster, start),
        )
