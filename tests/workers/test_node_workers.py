"""``backend="nodes"``: raypipe's worker processes on the cluster's nodes, their images streamed over TCP.

The placement is a pure function (``node_slots``); the handshake refuses a peer without the secret
before anything of it is read; on a simulated cluster (``ray.cluster_utils``) the batches are those of
the local path, the images come from the other nodes' workers, and a node lost mid-epoch loses no
sample.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.workers.node import HOST_ENV, EligibleNode, node_slots
from raypipe.workers.peer_auth import SECRET_ENV, PeerAuthError, new_secret, prove_client, prove_server


def _nodes(*cpus: float) -> list[EligibleNode]:
    return [EligibleNode(f"n{i}", c) for i, c in enumerate(cpus)]


# -- placement ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cpus", [(2,), (3, 3), (16, 16, 16, 16), (48,), (96, 32, 32)])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_ranks_share_the_slots_without_taking_one_twice(cpus, world_size):
    nodes = _nodes(*cpus)
    shares = [
        node_slots(nodes, here="elsewhere", reserved_cpus=0, cpus_per_task=1.0, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    for i, node in enumerate(nodes):
        on_node = [s[node.node_id].workers for s in shares if node.node_id in s]
        if sum(cpus) >= world_size:  # a slot for every rank: none is shared, none left over
            assert sum(on_node) == cpus[i]
        for s in shares:
            if node.node_id in s:  # each worker asks for at most its slot
                assert s[node.node_id].cpus <= s[node.node_id].workers * 1.0 + 1e-9
    assert all(sum(share.workers for share in s.values()) >= 1 for s in shares)  # every rank progresses
    totals = [sum(share.workers for share in s.values()) for s in shares]
    assert max(totals) - min(totals) <= 1  # the deal is even


def test_slots_alternate_over_nodes_so_one_rank_uses_every_node():
    shares = node_slots(_nodes(4, 4), here="x", reserved_cpus=0, cpus_per_task=1.0, rank=0, world_size=2)
    assert {k: v.workers for k, v in shares.items()} == {"n0": 2, "n1": 2}


def test_what_the_consumer_holds_is_taken_from_its_own_node_only():
    nodes = _nodes(2, 2)
    shares = node_slots(nodes, here="n0", reserved_cpus=1.25, cpus_per_task=1.0, rank=0, world_size=1)
    # n0 has 0.75 CPUs left: one worker of 0.75; n1 both of its
    assert shares["n0"].workers == 1 and shares["n0"].cpus == pytest.approx(0.75)
    assert shares["n1"].workers == 2 and shares["n1"].cpus == pytest.approx(2.0)


def test_a_share_that_does_not_divide_asks_for_what_is_there():
    shares = node_slots(_nodes(3), here="x", reserved_cpus=0, cpus_per_task=2.0, rank=0, world_size=1)
    # 3 CPUs hold 1.5 tasks of 2: two workers (halves round up) of 1.5 CPUs, never more than the node has
    assert shares["n0"].workers == 2 and shares["n0"].cpus == pytest.approx(3.0)


def test_num_tasks_goes_round_the_deal_again():
    shares = node_slots(_nodes(1, 1), here="x", reserved_cpus=0, cpus_per_task=1.0, rank=0, world_size=1, workers=5)
    assert sum(s.workers for s in shares.values()) == 5


def test_no_slot_anywhere_still_runs_one_worker():
    shares = node_slots(_nodes(1, 2), here="n1", reserved_cpus=2.0, cpus_per_task=4.0, rank=3, world_size=4)
    assert sum(s.workers for s in shares.values()) == 1
    assert node_slots([], here="x", reserved_cpus=0, cpus_per_task=1.0, rank=0, world_size=1) == {}


# -- the handshake --------------------------------------------------------------------------------------


def _outcome(prove, sock: socket.socket, secret: bytes) -> object:
    """ "ok", or the ``PeerAuthError`` one end's proof raised; the socket is closed either way."""
    try:
        prove(sock, secret, timeout_s=5)
        return "ok"
    except PeerAuthError as exc:
        return exc
    finally:
        sock.close()


def _handshake(server_secret: bytes, client_secret: bytes) -> tuple[object, object]:
    listener = socket.create_server(("127.0.0.1", 0))
    results: dict[str, object] = {}

    def serve():
        results["server"] = _outcome(prove_server, listener.accept()[0], server_secret)

    t = threading.Thread(target=serve)
    t.start()
    try:
        results["client"] = _outcome(prove_client, socket.create_connection(listener.getsockname()), client_secret)
    finally:
        t.join(10)
        listener.close()
    return results["server"], results["client"]


def test_both_ends_with_the_secret_connect():
    secret = new_secret()
    assert _handshake(secret, secret) == ("ok", "ok")


def test_a_peer_without_the_secret_is_refused_by_both_ends():
    server, client = _handshake(new_secret(), new_secret())
    assert isinstance(server, PeerAuthError)
    assert isinstance(client, PeerAuthError)  # the consumer never answered the worker's challenge


def test_a_silent_peer_is_dropped_after_the_timeout():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    try:
        with pytest.raises(PeerAuthError):
            prove_server(conn, new_secret(), timeout_s=0.3)
    finally:
        for s in (conn, client, listener):
            s.close()


def test_a_trickling_peer_is_dropped_at_the_handshakes_deadline():
    """One deadline for the whole handshake: a byte every 0.1 s never lets a single read time out, and
    would take 6.4 s to send an answer; the consumer drops it at its 1 s deadline."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.1):
            try:
                client.send(b"x")
            except OSError:
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        with pytest.raises(PeerAuthError, match="did not finish in time"):
            prove_server(conn, new_secret(), timeout_s=1.0)
    finally:
        stop.set()
        t.join(5)
        for s in (conn, client, listener):
            s.close()


def _worker_process(listener: socket.socket, lifeline: int, env: dict, **popen) -> subprocess.Popen:
    """A node worker process that connects to ``listener``, with ``lifeline`` as its launcher's pipe."""
    port = str(listener.getsockname()[1])
    command = [sys.executable, "-m", "raypipe.workers.worker_process", "--connect", "127.0.0.1", port, str(lifeline)]
    return subprocess.Popen(command, pass_fds=(lifeline,), env=env, **popen)


def test_a_worker_told_a_wrong_secret_ends_without_serving():
    """The worker process itself: it answers, the consumer refuses, the worker exits (no request read)."""
    listener = socket.create_server(("127.0.0.1", 0))
    read, write = os.pipe()
    env = dict(os.environ, **{SECRET_ENV: new_secret().hex()})
    proc = _worker_process(listener, read, env, stderr=subprocess.PIPE)
    os.close(read)
    try:
        listener.settimeout(60)
        conn, _ = listener.accept()
        with pytest.raises(PeerAuthError):
            prove_server(conn, new_secret(), timeout_s=30)
        conn.close()
        assert proc.wait(timeout=60) != 0
        assert b"PeerAuthError" in proc.stderr.read()
    finally:
        os.close(write)
        proc.kill()
        proc.wait()
        listener.close()


def test_a_worker_ends_with_its_launcher():
    """The lifeline: a connected worker whose launcher's pipe closes ends at once."""
    secret = new_secret()
    listener = socket.create_server(("127.0.0.1", 0))
    read, write = os.pipe()
    env = dict(os.environ, **{SECRET_ENV: secret.hex()})
    proc = _worker_process(listener, read, env)
    os.close(read)
    try:
        listener.settimeout(60)
        conn, _ = listener.accept()
        prove_server(conn, secret, timeout_s=30)
        assert proc.poll() is None
        os.close(write)
        write = None
        assert proc.wait(timeout=30) == 0
        conn.settimeout(30)
        try:
            while conn.recv(1 << 16):  # its "ready" frame, then the end of the connection (a timeout fails)
                pass
        except ConnectionResetError:  # an end too: a process that exits with bytes unread resets it
            pass
        conn.close()
    finally:
        if write is not None:
            os.close(write)
        proc.kill()
        proc.wait()
        listener.close()


# -- configuration --------------------------------------------------------------------------------------


def test_nodes_backend_needs_a_ray_cluster(sample_dir):
    import ray

    from raypipe.pipeline import Pipeline

    if ray.is_initialized():
        ray.shutdown()
    pipe = Pipeline(
        str(sample_dir),
        TrainAugment(input_size=32),
        config=PipelineConfig(batch_size=8),
        execution=ExecutionConfig(backend="nodes"),
    )
    with pytest.raises(RuntimeError, match="backend='nodes' runs on a Ray cluster"):
        pipe.stream()


# -- on a simulated cluster -----------------------------------------------------------------------------

PREPROCESS = {"preprocess": 0.001}


def _batches(data, backend: str, *, epochs: int, on_batch=None) -> tuple[list, list]:
    from raypipe.pipeline import EpochSource, Pipeline

    pipe = Pipeline(
        str(data),
        TrainAugment(input_size=64),
        config=PipelineConfig(batch_size=8, seed=3),
        execution=ExecutionConfig(chunk_rows=8, backend=backend, resources=PREPROCESS if backend != "local" else {}),
    )
    source = EpochSource(pipe, end_epoch=epochs)
    out = []
    for epoch in range(epochs):
        if epoch == 1 and backend in ("nodes", "auto"):
            _wait_for_remote_workers()  # the first epoch is made here while they start: the others on them
        source.set_epoch(epoch)
        for i, batch in enumerate(source):
            out.append((epoch, batch["sample_id"].copy(), batch["image"].copy()))
            if on_batch is not None:
                on_batch(epoch, i)
    reports = list(source.reports)
    source.close()
    return out, reports


def _wait_for_remote_workers(timeout_s: float = 120.0) -> None:
    import time

    from raypipe.workers.node import NodeWorkers

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pool = NodeWorkers._shared
        if pool is not None and pool.pool.ready_count(remote_only=True) >= pool.count:
            return
        time.sleep(0.1)
    raise AssertionError("the other nodes' workers did not connect")


def _refresh_until(done, timeout_s: float = 60.0) -> None:
    """Call the pool's refresh (what the stream calls at each budget refresh) until ``done(pool)``."""
    import time

    from raypipe.workers.node import NodeWorkers

    pool = NodeWorkers._shared
    deadline = time.monotonic() + timeout_s
    while not done(pool) and time.monotonic() < deadline:
        time.sleep(0.2)
        pool.size_tasks(1.0)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from raypipe.sample_data import write_sample_data

    out = tmp_path_factory.mktemp("photos")
    write_sample_data(out, classes=4, per_class=40, seed=2)
    return out


@contextlib.contextmanager
def _cluster(cpu_nodes: int):
    """A simulated cluster: the head (1 CPU, this process's node) and ``cpu_nodes`` nodes of 1 CPU that
    offer ``preprocess``; yields (cluster, those nodes), and ends this process's node workers, Ray and
    the cluster after."""
    import ray
    from ray.cluster_utils import Cluster

    from raypipe.workers.node import NodeWorkers

    os.environ[HOST_ENV] = "127.0.0.1"  # the simulated nodes are this machine: the loopback interface only
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        # connected before the other nodes start: this process's node is the head (with several raylets
        # on one address, a driver may attach to any of them)
        ray.init(address=cluster.address, logging_level="WARNING")
        nodes = [cluster.add_node(num_cpus=1, resources={"preprocess": 1}) for _ in range(cpu_nodes)]
        cluster.wait_for_nodes()
        yield cluster, nodes
        NodeWorkers.shutdown_shared()
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.environ.pop(HOST_ENV, None)


def _every_sample_once(reports: list, epochs: int) -> None:
    assert [(r.emitted, r.num_skipped) for r in reports] == [(160, 0)] * epochs


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (ea, ia, xa), (eb, ib, xb) in zip(a, b, strict=True):
        assert ea == eb
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(xa, xb)


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(300)
def test_node_workers_give_the_local_batches_from_the_other_nodes(photos):
    import ray

    from raypipe.workers.node import NodeWorkers

    local, _ = _batches(photos, "local", epochs=3)
    with _cluster(cpu_nodes=2):
        head = ray.get_runtime_context().get_node_id()
        got, reports = _batches(photos, "nodes", epochs=3)
        pool = NodeWorkers._shared
        assert pool.pool.remote_workers >= 2 and pool.pool.received_chunks > 0  # images came over the connections
        assert set(pool.slots) and head not in pool.slots  # no worker on the trainer's node (no resource)
    _every_sample_once(reports, 3)
    _same(got, local)


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(300)
def test_auto_on_a_joined_cluster_is_elastic_node_workers_or_ray_tasks_where_nodes_cannot_connect(
    photos, monkeypatch, caplog
):
    import ray

    from raypipe.pipeline import Pipeline, backend
    from raypipe.workers import reach
    from raypipe.workers.node import NodeWorkers

    local, _ = _batches(photos, "local", epochs=2)
    monkeypatch.setattr(backend, "_REACH", {})
    with _cluster(cpu_nodes=1) as (cluster, nodes):
        ours = Pipeline(str(photos), TrainAugment(input_size=64))
        assert ours.decide().backend == "ray"  # a Ray this process started: Ray tasks, as before
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # joined, as `ray job submit` tells a driver
        got, reports = _batches(photos, "auto", epochs=2)
        pool = NodeWorkers._shared
        assert pool is not None and pool.elastic  # node workers, their width following the consumer
        assert pool.pool.remote_workers >= 1 and pool.pool.received_chunks > 0
        assert backend._REACH == {ray.get_runtime_context().get_node_id(): None}  # the probe connected
        NodeWorkers.shutdown_shared()
        # the other node's probe, against a port nobody listens on: the reason it gives
        with socket.create_server(("127.0.0.1", 0)) as closed:
            port = closed.getsockname()[1]
        assert "ConnectionRefusedError" in reach.connect_from(nodes[0].node_id, "127.0.0.1", port)
        # where the nodes cannot connect: Ray tasks, and one line that says why
        monkeypatch.setattr(backend, "_REACH", {})
        monkeypatch.setattr(reach, "unreachable_reason", lambda here, resources: "node x cannot connect (refused)")
        pipe = Pipeline(str(photos), TrainAugment(input_size=64), execution=ExecutionConfig(resources=PREPROCESS))
        with caplog.at_level("WARNING", logger="raypipe.pipeline.backend"):
            decision = pipe.decide()
        assert decision.backend == "ray" and decision.reason == (
            "Ray tasks make this rank's chunks, not node workers: node x cannot connect (refused)"
        )
        assert [r.getMessage() for r in caplog.records] == [
            "raypipe: Ray tasks make this rank's chunks, not node workers: node x cannot connect (refused)"
        ]
        ray_tasks, _ = _batches(photos, "auto", epochs=1)
        assert NodeWorkers._shared is None
    _every_sample_once(reports, 2)
    _same(got, local)
    _same(ray_tasks, local[: len(ray_tasks)])


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(300)
def test_a_node_lost_mid_epoch_loses_no_sample(photos, monkeypatch):

    from raypipe.pipeline import stream
    from raypipe.workers.node import NodeWorkers

    monkeypatch.setattr(stream, "BUDGET_REFRESH_S", 0.2)  # the refresh notices the launcher's end
    local, _ = _batches(photos, "local", epochs=3)
    removed = {}
    with _cluster(cpu_nodes=2) as (cluster, nodes):

        def on_batch(epoch: int, i: int) -> None:
            pool = NodeWorkers._shared
            if "at" not in removed and epoch >= 1 and i == 2 and pool.pool.received_chunks > 0:
                removed["at"] = pool.pool.received_chunks
                cluster.remove_node(nodes[1])

        got, reports = _batches(photos, "nodes", epochs=3, on_batch=on_batch)
        pool = NodeWorkers._shared
        assert removed, "the node was never removed: no chunk came from the other nodes"
        assert pool.pool.received_chunks > removed["at"]  # the other node's workers went on
        lost = nodes[1].node_id
        _refresh_until(lambda pool: lost not in pool.launched_nodes)
        assert lost not in pool.launched_nodes and len(pool.launched_nodes) == 1  # dropped, not started again
    _every_sample_once(reports, 3)
    _same(got, local)


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(300)
def test_a_feeder_on_node_workers_hands_over_slabs(photos):

    from raypipe import FeederSource
    from raypipe.pipeline import Pipeline

    local, _ = _batches(photos, "local", epochs=2)
    with _cluster(cpu_nodes=1):
        pipe = Pipeline(
            str(photos),
            TrainAugment(input_size=64),
            config=PipelineConfig(batch_size=8, seed=3),
            execution=ExecutionConfig(chunk_rows=8, backend="nodes", resources=PREPROCESS),
        )
        source = FeederSource(pipe, end_epoch=2)
        got = []
        try:
            assert source.runs_on_local_workers  # the feeder's chunks are slabs, handed over as such
            for epoch in range(2):
                source.set_epoch(epoch)
                got += [(epoch, b["sample_id"].copy(), np.array(b["image"])) for b in source]
        finally:
            source.close()
    _same(got, local)


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(300)
def test_a_node_that_joins_gets_workers_at_the_next_budget_refresh(photos, monkeypatch):

    from raypipe.pipeline import stream
    from raypipe.workers.node import NodeWorkers

    monkeypatch.setattr(stream, "BUDGET_REFRESH_S", 0.2)
    local, _ = _batches(photos, "local", epochs=4)
    joined = {}
    with _cluster(cpu_nodes=1) as (cluster, _):

        def on_batch(epoch: int, i: int) -> None:
            if epoch == 1 and i == 0:
                joined["node"] = cluster.add_node(num_cpus=1, resources={"preprocess": 1})
                cluster.wait_for_nodes()
            if epoch == 2 and i == 0:  # the refresh has had an epoch's batches to see the node
                _refresh_until(lambda pool: len(pool.launched_nodes) == 2)
                _wait_for_remote_workers()  # the new node's worker connected: the last epochs run on both

        got, reports = _batches(photos, "nodes", epochs=4, on_batch=on_batch)
        pool = NodeWorkers._shared
        assert joined["node"].node_id in pool.launched_nodes  # the new node has its launcher
        assert pool.count == 2 and pool.pool.remote_workers >= 2
    _every_sample_once(reports, 4)
    _same(got, local)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_raypipe_run_on_node_workers_gives_the_local_digest(sample_dir, tmp_path):
    """``raypipe run --backend nodes`` starts its private Ray in the background (``connect(wait=False)``):
    the node workers wait for it, and on that one node they are local workers, with the same images."""
    import json

    digests = {}
    for backend in ("local", "nodes"):
        out = tmp_path / f"{backend}.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "raypipe",
                "run",
                str(sample_dir),
                "--epochs",
                "1",
                "-b",
                "16",
                "--img-size",
                "40",
                "--backend",
                backend,
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        epoch = json.loads(out.read_text())["epochs"][0]
        assert epoch["emitted"] == 48
        digests[backend] = epoch["content_sha256"]
    assert digests["nodes"] == digests["local"]


@pytest.mark.cluster
@pytest.mark.isolated
@pytest.mark.timeout(300)
def test_with_no_node_to_run_on_a_launcher_waits_for_one(photos, monkeypatch):
    """A preprocessing group scaled to zero: a launcher asks Ray for any node with the resources (the
    request an autoscaler acts on); when one joins, the launcher runs there, and the next refresh pins
    the node's own launcher in its place."""

    from raypipe.pipeline import stream
    from raypipe.workers.node import ANY_NODE, NodeWorkers

    monkeypatch.setattr(stream, "BUDGET_REFRESH_S", 0.2)
    local, _ = _batches(photos, "local", epochs=3)
    seen = {}
    with _cluster(cpu_nodes=0) as (cluster, _):  # no node offers "preprocess"

        def on_batch(epoch: int, i: int) -> None:
            pool = NodeWorkers._shared
            if epoch == 0 and i == 3:  # the workers' start is released once the consumer asks for a second chunk
                seen["waiting"] = ANY_NODE in pool.launched_nodes and pool.count == 0
                seen["node"] = cluster.add_node(num_cpus=1, resources={"preprocess": 1})
                cluster.wait_for_nodes()
                _refresh_until(lambda pool: seen["node"].node_id in pool.launched_nodes)

        got, reports = _batches(photos, "nodes", epochs=3, on_batch=on_batch)
        pool = NodeWorkers._shared
        assert seen["waiting"]  # before the node: one launcher asking for any node, no slot
        assert seen["node"].node_id in pool.launched_nodes and ANY_NODE not in pool.launched_nodes
        assert pool.pool.received_chunks > 0
    _every_sample_once(reports, 3)
    _same(got, local)


# -- hostile peers at the consumer's port ----------------------------------------------------------------


def _local_nodes_run(data, epochs: int, on_first_batch=None) -> list:
    """``backend="nodes"`` on a one-node Ray: the consumer listens for other nodes' workers all the same."""
    from raypipe.pipeline import EpochSource, Pipeline
    from raypipe.workers.node import NodeWorkers

    pipe = Pipeline(
        str(data),
        TrainAugment(input_size=32),
        config=PipelineConfig(batch_size=8, seed=5),
        execution=ExecutionConfig(chunk_rows=8, backend="nodes"),
    )
    source = EpochSource(pipe, end_epoch=epochs)
    out = []
    for epoch in range(epochs):
        source.set_epoch(epoch)
        for batch in source:
            if on_first_batch is not None and not out:
                on_first_batch(NodeWorkers._shared)
            out.append((epoch, batch["sample_id"].copy(), batch["image"].copy()))
    source.close()
    return out


def test_hostile_peers_at_the_worker_port_are_dropped_and_the_epochs_are_exact(ray_local, sample_dir, monkeypatch):
    """Whatever connects to the port without the secret (a wrong secret, random bytes, a first frame and
    then nothing, a byte a second) is dropped within the handshake's deadline, nothing of it read as a
    pickle, and the epochs' ids and pixels are an undisturbed run's."""
    import time

    from raypipe.workers import peer_auth
    from raypipe.workers.node import NodeWorkers

    monkeypatch.setattr(peer_auth, "AUTH_TIMEOUT_S", 2.0)
    monkeypatch.setenv(HOST_ENV, "127.0.0.1")  # the consumer listens on loopback only
    try:
        undisturbed = _local_nodes_run(sample_dir, epochs=2)
    finally:
        NodeWorkers.shutdown_shared()
    peers: dict[str, socket.socket] = {}
    outcomes: dict[str, object] = {}
    stop = threading.Event()

    def attack(pool) -> None:
        address = pool.address
        wrong = socket.create_connection(address)
        try:
            prove_client(wrong, new_secret(), timeout_s=5)
            outcomes["wrong secret"] = "accepted"
        except PeerAuthError as exc:
            outcomes["wrong secret"] = exc
        wrong.close()
        peers["random bytes"] = socket.create_connection(address)
        peers["random bytes"].sendall(os.urandom(4096))
        peers["first frame, then nothing"] = socket.create_connection(address, timeout=20)
        peers["first frame, then nothing"].recv(32)  # the consumer's challenge
        peers["first frame, then nothing"].sendall(os.urandom(16))  # part of an answer, and no more
        peers["a byte a second"] = trickler = socket.create_connection(address)

        def trickle():
            while not stop.wait(1.0):
                try:
                    trickler.send(b"\x80")  # a pickle's first byte, were anything read as one
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()

    attacker: list[threading.Thread] = []

    def start_attack(pool) -> None:  # beside the epochs: the consumer goes on while they connect
        attacker.append(threading.Thread(target=attack, args=(pool,), daemon=True))
        attacker[0].start()

    try:
        disturbed = _local_nodes_run(sample_dir, epochs=2, on_first_batch=start_attack)
        attacker[0].join(30)
        assert not attacker[0].is_alive()
        pool = NodeWorkers._shared
        deadline = time.monotonic() + 2.0 + 10.0
        for name, peer in peers.items():  # each is closed by the consumer: its reads end
            peer.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while peer.recv(4096):
                    pass
                outcomes[name] = "dropped"
            except ConnectionResetError:
                outcomes[name] = "dropped"
            except TimeoutError:
                outcomes[name] = "still open"
        assert pool.pool.remote_workers == 0  # none became a worker
    finally:
        stop.set()
        for peer in peers.values():
            peer.close()
        NodeWorkers.shutdown_shared()
    assert isinstance(outcomes.pop("wrong secret"), PeerAuthError)
    assert outcomes == dict.fromkeys(["random bytes", "first frame, then nothing", "a byte a second"], "dropped")
    _same(undisturbed, disturbed)
