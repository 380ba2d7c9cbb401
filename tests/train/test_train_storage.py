"""The training job's storage check (raypipe.train.storage): the rules as tables, without Ray; the probe
on a simulated two-node cluster."""

from __future__ import annotations

import os

import pytest

from raypipe.train.storage import (
    MARKER_PREFIX,
    WHAT_TO_GIVE,
    StorageError,
    check_seen_here,
    check_storage,
    checked_storage,
    decide,
    in_submitted_job,
    is_uri,
    resolve_storage,
    training_nodes,
)


@pytest.mark.parametrize(
    ("given", "in_job", "expected"),
    [
        ("s3://bucket/runs", False, "s3://bucket/runs"),
        ("s3://bucket/runs", True, "s3://bucket/runs"),
        ("gs://b/r", True, "gs://b/r"),
        ("/mnt/shared/runs", True, "/mnt/shared/runs"),
        ("/mnt/shared/../runs/", False, "/mnt/runs"),
        ("file:///mnt/shared/runs", True, "/mnt/shared/runs"),  # a file:// URI is a local path
        ("runs", False, "/home/me/work/runs"),  # where the command ran
        ("./a/b", False, "/home/me/work/a/b"),
        ("~/runs", True, os.path.join(os.path.expanduser("~"), "runs")),  # the head's home: absolute
        ("runs", True, StorageError),  # the job's cwd is Ray's unpacked working dir
        ("../runs", True, StorageError),
        ("", False, StorageError),
    ],
)
def test_a_storage_path_resolves_where_the_user_ran_the_command_never_in_a_jobs_working_dir(given, in_job, expected):
    if expected is StorageError:
        with pytest.raises(StorageError) as err:
            resolve_storage(given, cwd="/home/me/work", in_job=in_job)
        message = str(err.value)
        assert message.startswith("--storage-path") and WHAT_TO_GIVE in message and "\n" not in message
        if given:
            assert repr(given) in message and "ray job submit" in message
    else:
        assert resolve_storage(given, cwd="/home/me/work", in_job=in_job) == expected


def test_a_submitted_job_is_known_by_the_variable_rays_job_supervisor_sets():
    assert in_submitted_job({"RAY_JOB_CONFIG_JSON_ENV_VAR": '{"runtime_env": {}}'})
    assert not in_submitted_job({"RAY_ADDRESS": "127.0.0.1:6379"})  # a driver that joined from a shell


def test_uris():
    assert is_uri("s3://b") and is_uri("gs://b/x") and is_uri("hdfs://nn:8020/x") and is_uri("abfss://c@a/x")
    assert not is_uri("/x") and not is_uri("runs") and not is_uri("file:///x") and not is_uri("c:/x")


NODES = [
    {"NodeID": "head0000aa", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 0.0}},
    {"NodeID": "gpu00000bb", "Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 8.0, "GPU": 1.0}},
    {"NodeID": "cpu00000cc", "Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 4.0, "x": 1.0}},
    {"NodeID": "gone0000dd", "Alive": False, "NodeManagerAddress": "10.0.0.4", "Resources": {"CPU": 8.0, "GPU": 1}},
    {"NodeID": "tiny0000ee", "Alive": True, "NodeManagerAddress": "10.0.0.5", "Resources": {"CPU": 0.25}},
]


@pytest.mark.parametrize(
    ("here", "cpus", "gpu", "expected"),
    [
        ("head0000aa", 8, True, ["gpu00000bb"]),  # only a node with a GPU runs a GPU worker
        ("head0000aa", 0.5, False, ["gpu00000bb", "cpu00000cc"]),  # a CPU worker runs on any node with its CPUs
        ("gpu00000bb", 0, False, ["head0000aa", "cpu00000cc", "tiny0000ee"]),  # never the driver's own node
        (None, 0.5, False, ["gpu00000bb", "cpu00000cc"]),  # a driver on no node: every node counts
    ],
)
def test_the_nodes_asked_are_the_other_alive_ones_that_could_run_a_training_worker(here, cpus, gpu, expected):
    nodes = training_nodes(NODES, here=here, cpus=cpus, gpu=gpu)
    assert list(nodes) == expected
    assert nodes.get("gpu00000bb", "10.0.0.2 (gpu00000)") == "10.0.0.2 (gpu00000)"


A, B = "10.0.0.2 (gpu00000)", "10.0.0.3 (cpu00000)"


@pytest.mark.parametrize(
    ("given", "resolved", "seen", "error", "warning"),
    [
        # a URI is read by every node: nothing to ask
        ("s3://b/runs", "s3://b/runs", {}, None, None),
        # no other node up (a local Ray, one node, an autoscaling cluster's head alone): today's `runs`
        # default holds; the training workers look for the marker themselves (check_seen_here)
        ("runs", "/home/me/runs", {}, None, None),
        # every other node sees the driver's file: a shared mount
        ("/mnt/nfs/runs", "/mnt/nfs/runs", {A: True, B: True}, None, None),
        # one node does not: the path is not shared, whatever the others saw
        ("/data/runs", "/data/runs", {A: True, B: False}, "0.0.3 (cpu00000)", None),
        ("runs", "/home/me/runs", {A: False, B: False}, "'runs' (/home/me/runs) is not shared: 2 node(s)", None),
        # a node that did not answer: not known, said, not refused
        ("/data/runs", "/data/runs", {A: True, B: None}, None, "did not answer"),
    ],
)
def test_the_decision_over_what_the_nodes_saw(given, resolved, seen, error, warning):
    got_error, got_warning = decide(given, resolved, seen)
    if error is None:
        assert got_error is None
    else:
        assert got_error.startswith("--storage-path") and error in got_error and WHAT_TO_GIVE in got_error
        assert "\n" not in got_error
    if warning is None:
        assert got_warning is None
    else:
        assert warning in got_warning and "--storage-path" in got_warning and "\n" not in got_warning


def test_without_ray_a_local_path_is_made_and_taken_and_no_marker_stays(tmp_path, capsys):
    storage = tmp_path / "deep" / "runs"
    assert check_storage(str(storage), cpus=1, gpu=False) == str(storage)
    assert storage.is_dir() and list(storage.iterdir()) == []
    assert capsys.readouterr().out == ""


def test_a_path_that_cannot_be_written_is_an_error_that_names_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StorageError, match=r"^--storage-path '.*file/runs': cannot write in"):
        check_storage(str(blocker / "runs"), cpus=1, gpu=False)


def test_a_training_worker_whose_node_does_not_see_the_marker_stops_the_job_with_one_line(tmp_path):
    marker = tmp_path / f"{MARKER_PREFIX}x"
    check_seen_here(None, given="s3://b/runs", node="10.0.0.9")  # a URI: nothing to look for
    with pytest.raises(StorageError) as err:
        check_seen_here(str(marker), given="/data/runs", node="10.0.0.9")
    message = str(err.value)
    assert message.startswith("--storage-path '/data/runs' is not shared: node 10.0.0.9") and "\n" not in message
    marker.write_text("")
    check_seen_here(str(marker), given="/data/runs", node="10.0.0.9")
    # raised in a worker, it reaches the driver as its own one line with the rank named (train.py: exit 2)
    import ray.train

    from raypipe.train.run import data_failure

    got = data_failure(ray.train.WorkerGroupError("workers failed", {1: err.value}))
    assert isinstance(got, StorageError) and str(got) == f"rank 1: {message}"


def test_the_marker_stays_while_the_run_does_and_goes_after(tmp_path):
    storage = tmp_path / "runs"
    with checked_storage(str(storage), cpus=1, gpu=False) as (resolved, marker):
        assert resolved == str(storage) and os.path.dirname(marker) == resolved and os.path.exists(marker)
    assert not os.path.exists(marker)
    with checked_storage("s3://b/runs", cpus=1, gpu=False) as (resolved, marker):
        assert (resolved, marker) == ("s3://b/runs", None)
    assert not (tmp_path / "s3:").exists()


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(180)
def test_the_probe_asks_each_other_node_what_it_sees(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    from raypipe.train.storage import probe_nodes

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        ray.init(address=cluster.address, logging_level="WARNING")  # this process's node is the head
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        here = ray.get_runtime_context().get_node_id()
        nodes = training_nodes(ray.nodes(), here=here, cpus=1, gpu=False)
        assert len(nodes) == 1  # the other node, not the driver's
        # both simulated nodes are this machine: a file here is a file there, and one missing here is missing there
        present = tmp_path / "present"
        present.write_text("")
        assert probe_nodes(str(present), nodes) == dict.fromkeys(nodes.values(), True)
        assert probe_nodes(str(tmp_path / "absent"), nodes) == dict.fromkeys(nodes.values(), False)
        # the whole check: the other node sees the driver's marker; no marker is left behind
        storage = tmp_path / "runs"
        assert check_storage(str(storage), cpus=1, gpu=False) == str(storage)
        assert not [p for p in storage.iterdir() if p.name.startswith(MARKER_PREFIX)]
    finally:
        ray.shutdown()
        cluster.shutdown()
