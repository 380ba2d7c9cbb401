"""raypipe.pipeline.backend.decide_backend, the one place that decides where a rank's tasks run, over a
table of situations (no Ray: the decision is pure), and the facts it is given (``situation``,
``raypipe.runtime.connection``) with the process's Ray faked."""

from __future__ import annotations

import pytest

from raypipe import runtime
from raypipe.config import ExecutionConfig
from raypipe.pipeline import backend
from raypipe.pipeline.backend import UNREACHABLE, Situation, decide_backend


def _never() -> str | None:
    raise AssertionError("the other nodes' reach was asked where it decides nothing")


def _unreachable() -> str:
    return "node ab12 (127.0.0.2) cannot connect to this node's 127.0.0.1:4321 (ConnectionRefusedError: refused)"


def _reachable() -> None:
    return None


AUTO = {"backend": "auto", "reach": _never}

# (situation, backend, elastic, what the reason names)
TABLE = [
    # not on Ray: local worker processes, no cluster started
    (Situation(**AUTO), "local", False, "not on Ray"),
    (Situation(connection="none", **AUTO), "local", False, "not on Ray"),
    (Situation(connection="none", source_kind="raydata", **AUTO), "local", False, "not on Ray"),
    # not on Ray, but Ray is needed (a feeder actor, ranks that share a node's cluster)
    (Situation(connection="none", needs_ray=True, **AUTO), "ray", False, "Ray is needed"),
    # raypipe's private local Ray: local worker processes for a process on a Ray worker ...
    (Situation(connection="private", on_ray_worker=True, **AUTO), "local", False, "nothing joins"),
    (Situation(connection="private", on_ray_worker=True, needs_ray=True, **AUTO), "local", False, "nothing joins"),
    # ... Ray tasks where resources steer them, or the rows are a Ray Dataset's ...
    (
        Situation(connection="private", on_ray_worker=True, resources={"preprocess": 0.001}, **AUTO),
        "ray",
        False,
        "steered by resources",
    ),
    (Situation(connection="private", on_ray_worker=True, source_kind="raydata", **AUTO), "ray", False, "Ray Dataset"),
    # ... and in the process that started it
    (Situation(connection="private", **AUTO), "ray", False, "started raypipe's private local Ray"),
    # a Ray this script started itself, Ray Client, a cluster not joined yet: Ray tasks
    (Situation(connection="own", **AUTO), "ray", False, "started itself"),
    (Situation(connection="own", on_ray_worker=True, needs_ray=True, **AUTO), "ray", False, "started itself"),
    (Situation(connection="client", **AUTO), "ray", False, "Ray Client"),
    (Situation(connection="client", on_ray_worker=True, **AUTO), "ray", False, "Ray Client"),
    (Situation(connection="joining", **AUTO), "ray", False, "not connected yet"),
    # a cluster joined: node workers, elastic unless num_tasks fixes the width ...
    (Situation(backend="auto", connection="joined", reach=_reachable), "nodes", True, "node workers"),
    (Situation(backend="auto", connection="joined", reach=None), "nodes", True, "node workers"),  # not asked
    (Situation(backend="auto", connection="joined", num_tasks=3, reach=_reachable), "nodes", False, "num_tasks=3"),
    # ... told to a worker by a process that was still to connect: the worker runs once it is
    (
        Situation(backend="auto", connection="joining", on_ray_worker=True, reach=_reachable),
        "nodes",
        True,
        "node workers",
    ),
    # ... Ray tasks where the other nodes cannot connect to this one, the reason naming why ...
    (
        Situation(backend="auto", connection="joined", reach=_unreachable),
        "ray",
        False,
        f"{UNREACHABLE}: node ab12 (127.0.0.2) cannot connect",
    ),
    # ... or where the rows are a Ray Dataset's
    (Situation(connection="joined", source_kind="raydata", **AUTO), "ray", False, "Ray Dataset"),
    # a backend given is kept as given, whatever the situation
    (Situation(backend="local", connection="joined", reach=_never), "local", False, "backend='local'"),
    (Situation(backend="local", connection="none", source_kind="raydata"), "local", False, "as given"),
    (Situation(backend="ray", connection="none"), "ray", False, "backend='ray'"),
    (Situation(backend="ray", connection="private", on_ray_worker=True), "ray", False, "as given"),
    (Situation(backend="nodes", connection="own", reach=_never), "nodes", False, "backend='nodes'"),
    (Situation(backend="nodes", elastic=True, connection="private"), "nodes", True, "as given"),
]


@pytest.mark.parametrize(("situation", "chosen", "elastic", "why"), TABLE)
def test_the_backend_follows_the_situation_and_says_why_in_one_line(situation, chosen, elastic, why):
    decision = decide_backend(situation)
    assert (decision.backend, decision.elastic) == (chosen, elastic)
    assert why in decision.reason and "\n" not in decision.reason
    assert decision.on_ray == (chosen != "local")


def test_the_other_nodes_reach_is_asked_once_per_decision_and_only_on_a_cluster_joined():
    asked = []

    def reach() -> None:
        asked.append(1)

    for connection in ("none", "private", "own", "client", "joining"):
        decide_backend(Situation(backend="auto", connection=connection, needs_ray=True, reach=reach))
    decide_backend(Situation(backend="auto", connection="joined", source_kind="raydata", reach=reach))
    assert asked == []
    decide_backend(Situation(backend="auto", connection="joined", reach=reach))
    assert asked == [1]


def _process(monkeypatch, *, initialized: bool, private: bool = False, actor: bool = False, address: str = ""):
    """This process's Ray, as ``raypipe.runtime.connection`` reads it, faked."""

    class Context:
        def get_actor_id(self):
            return "actor" if actor else None

    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: initialized)
    monkeypatch.setattr(runtime.ray, "get_runtime_context", Context)
    monkeypatch.setattr(runtime, "_PRIVATE_CLUSTER", private)
    monkeypatch.setattr(runtime, "_START", None)
    if address:
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.parametrize(
    ("process", "connection"),
    [
        ({"initialized": False}, "none"),
        ({"initialized": True, "private": True}, "private"),
        ({"initialized": True}, "own"),  # the script's own ray.init()
        ({"initialized": True, "actor": True}, "joined"),  # a Ray actor: what a cluster's driver starts
        ({"initialized": True, "address": "127.0.0.1:6379"}, "joined"),  # ray job submit, connect()
        ({"initialized": False, "address": "127.0.0.1:6379"}, "joining"),
        ({"initialized": True, "address": "ray://127.0.0.1:10001"}, "client"),
        ({"initialized": False, "address": "ray://127.0.0.1:10001"}, "client"),
        ({"initialized": True, "private": True, "actor": True}, "private"),
    ],
)
def test_the_connection_is_what_this_process_can_tell_of_its_ray(monkeypatch, process, connection):
    _process(monkeypatch, **process)
    assert runtime.connection() == connection


def test_a_background_start_is_raypipes_private_ray(monkeypatch):
    _process(monkeypatch, initialized=False)
    monkeypatch.setattr(runtime, "starting", lambda: True)
    assert runtime.connection() == "private"


def test_auto_follows_what_the_process_finds_and_a_given_backend_asks_nothing(monkeypatch):
    """What ``ExecutionConfig.backend`` runs in this process (as ``Pipeline.uses_ray`` and the timm
    drop-in ask it, before connecting): a backend given as given, ``auto`` by what the process finds."""

    def decide(execution: ExecutionConfig, **facts):
        return backend.decide_here(execution, "folder", probe=False, **facts)

    _process(monkeypatch, initialized=False)
    assert decide(ExecutionConfig(backend="ray")).on_ray
    assert decide(ExecutionConfig(backend="nodes")).on_ray
    assert not decide(ExecutionConfig(backend="local")).on_ray
    assert not decide(ExecutionConfig(backend="local"), needs_ray=True).on_ray  # as asked (the caller checks)
    assert decide(ExecutionConfig()).backend == "local"  # one process, no cluster: local workers
    assert decide(ExecutionConfig(), needs_ray=True).backend == "ray"  # ranks sharing a node's cluster, a feeder
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # told to join a cluster
    assert decide(ExecutionConfig()).backend == "ray"

    def failed() -> bool:
        raise ConnectionError("the background start failed")

    monkeypatch.setattr(runtime, "starting", failed)
    assert backend.situation(ExecutionConfig(backend="local"), "folder").connection is None  # not asked
    with pytest.raises(ConnectionError):
        backend.situation(ExecutionConfig(), "folder")


def test_a_told_connection_stands_for_the_process_s_own_and_makes_it_a_ray_worker(monkeypatch):
    _process(monkeypatch, initialized=True, actor=True)  # a feeder: it would take itself for one joined
    told = backend.situation(ExecutionConfig(), "folder", told="private", probe=False)
    assert (told.connection, told.on_ray_worker, told.reach) == ("private", True, None)
    assert decide_backend(told).backend == "local"
    own = backend.situation(ExecutionConfig(), "folder")
    assert (own.connection, own.on_ray_worker, own.reach is not None) == ("joined", False, True)


def test_the_probe_runs_once_per_process_and_node_and_says_once_why(monkeypatch, caplog):
    from raypipe.workers import reach

    class Context:
        def get_node_id(self):
            return "node-a"

    probes = []

    def unreachable(here, resources):
        probes.append((here, dict(resources)))
        return "node b cannot connect (refused)"

    monkeypatch.setattr(backend, "_REACH", {})
    monkeypatch.setattr(reach, "unreachable_reason", unreachable)
    monkeypatch.setattr("ray.get_runtime_context", Context)
    execution = ExecutionConfig(resources={"preprocess": 0.001})
    with caplog.at_level("WARNING", logger="raypipe.pipeline.backend"):
        decisions = [backend.decide_here(execution, "folder", told="joined") for _ in range(3)]
    assert {d.backend for d in decisions} == {"ray"}
    assert decisions[0].reason == f"{UNREACHABLE}: node b cannot connect (refused)"
    assert probes == [("node-a", {"preprocess": 0.001})]
    assert [r.getMessage() for r in caplog.records] == [
        "raypipe: Ray tasks make this rank's chunks, not node workers: node b cannot connect (refused)"
    ]
