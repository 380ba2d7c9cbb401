"""The training job's storage path: one that every training worker reads, known before the first step.

Ray Train writes each rank's checkpoints to ``RunConfig(storage_path)`` from the rank's own node, and
finds out that a node cannot reach the path only when that node writes its first checkpoint: a whole
epoch, then the job, is lost. The job asks the same question at its start instead:

- A URI with a scheme (``s3://``, ``gs://``, ``hdfs://`` …; ``file://`` is a local path) is read by
  every node: it is taken as given, and not probed.
- A relative path is resolved against the directory the command ran in. Under ``ray job submit`` that
  directory is Ray's unpacked copy of ``--working-dir`` (or the job supervisor's own directory), which
  goes with the job, and the submitter's directory is not known there: a relative path is an error.
  ``~`` is the head's home directory.
- A local path: the driver writes a marker file there, and a task pinned to each other alive node that
  could run a training worker (its CPUs and GPU cover one worker's) looks for it, as Ray Train's own
  check does; a node that does not see it makes the path an error, before the data is listed.
- Nodes that are not up yet, such as an autoscaling cluster's groups at 0 nodes when the job starts,
  cannot be asked then: the marker stays for the run, and each training worker looks for it itself
  before its first step (``check_seen_here``), so a worker on a node that joined later stops the job
  before any step, though after the worker group started. A mount that every node's setup makes
  (``cluster.yaml``'s ``setup_commands``, a KubeRay volume) passes; the head's own disk does not.

``resolve_storage``, ``training_nodes`` and ``decide`` are the rules (pure), ``probe_nodes`` asks the
nodes, and ``checked_storage`` does all of it for ``jobs/train.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence

__all__ = [
    "StorageError",
    "WHAT_TO_GIVE",
    "is_uri",
    "in_submitted_job",
    "resolve_storage",
    "training_nodes",
    "decide",
    "probe_nodes",
    "checked_storage",
    "check_storage",
    "check_seen_here",
]

WHAT_TO_GIVE = "give a URI (s3://BUCKET/runs) or a path on a mount that every node shares (/mnt/shared/runs)"
PROBE_TIMEOUT_S = 60.0  # a node's first task starts a worker process: seconds on a busy node
MARKER_PREFIX = ".raypipe-storage-check-"
# The variable Ray's job supervisor sets for the driver of a job sent with `ray job submit`.
JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(ValueError):
    """``--storage-path`` names a place that not every training worker reads: the message, one line,
    says what was given and what to give instead."""


def is_uri(path: str) -> bool:
    """Whether ``path`` is a URI that Ray Train reaches from any node (a scheme other than ``file``).

    Args:
        path: the storage path as given.

    Returns:
        True for ``s3://…``, ``gs://…`` and the like; False for a local path or a ``file://`` URI.
    """
    match = _SCHEME.match(path)
    return bool(match) and match.group(1).lower() != "file"


def in_submitted_job(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the driver of a job sent with ``ray job submit`` (its working directory is
    then Ray's, not the submitter's).

    Args:
        environ: the environment to look at (None: this process's).

    Returns:
        True where Ray's job supervisor started this process.
    """
    return bool((os.environ if environ is None else environ).get(JOB_ENV))


def resolve_storage(given: str, *, cwd: str | None = None, in_job: bool | None = None) -> str:
    """Pure but for its defaults: the storage path Ray Train is given for ``given``.

    Args:
        given: ``--storage-path`` as given.
        cwd: the directory a relative path is resolved against (None: this process's).
        in_job: whether this is a job sent with ``ray job submit`` (None: ``in_submitted_job()``).

    Returns:
        ``given`` itself for a URI; else an absolute local path (``~`` expanded, a ``file://`` scheme
        taken off).

    Raises:
        StorageError: ``given`` is empty, or relative in a submitted job (see the module doc).
    """
    if not given:
        raise StorageError(f"--storage-path is empty: {WHAT_TO_GIVE}")
    if is_uri(given):
        return given
    path = os.path.expanduser(_SCHEME.sub("", given) if _SCHEME.match(given) else given)
    if not os.path.isabs(path):
        if in_submitted_job() if in_job is None else in_job:
            raise StorageError(
                f"--storage-path {given!r} is relative, and a job sent with `ray job submit` runs in Ray's copy "
                f"of its working dir, which goes with the job: {WHAT_TO_GIVE}"
            )
        path = os.path.join(os.getcwd() if cwd is None else cwd, path)
    return os.path.normpath(path)


def training_nodes(nodes: Sequence[Mapping], *, here: str | None, cpus: float, gpu: bool) -> dict[str, str]:
    """Pure: the alive nodes other than ``here`` where a training worker could run, by node id.

    Args:
        nodes: ``ray.nodes()``.
        here: the driver's node id (None: the driver is on no node, so every node counts).
        cpus: one training worker's CPUs.
        gpu: whether a training worker takes a GPU.

    Returns:
        node id -> a label for messages (its address and the id's first 8 characters).
    """
    out = {}
    for node in nodes:
        have = node.get("Resources", {})
        if not node.get("Alive") or node.get("NodeID") == here:
            continue
        if have.get("CPU", 0.0) >= cpus and (not gpu or have.get("GPU", 0.0) >= 1):
            out[node["NodeID"]] = f"{node.get('NodeManagerAddress', '?')} ({node['NodeID'][:8]})"
    return out


Verdict = tuple[str | None, str | None]  # (error, warning)


def decide(given: str, resolved: str, seen: Mapping[str, bool | None]) -> Verdict:
    """Pure: whether the storage path will do, from what the other nodes saw of the driver's marker.

    Args:
        given: ``--storage-path`` as given.
        resolved: what ``resolve_storage`` made of it.
        seen: for each other node that could run a training worker (by label): True where it saw the
            marker, False where it did not, None where it did not answer in time; empty where no
            other node is up (a local Ray, one node, or an autoscaling cluster's head alone: the
            training workers look for themselves, ``check_seen_here``).

    Returns:
        (error, warning): each one line or None; an error means the job must not start.
    """
    if is_uri(resolved):
        return None, None
    shown = repr(given) if given == resolved else f"{given!r} ({resolved})"
    blind = sorted(label for label, saw in seen.items() if saw is False)
    if blind:
        return (
            f"--storage-path {shown} is not shared: {len(blind)} node(s) that may run a training worker do not "
            f"see a file the driver wrote there ({', '.join(blind)}): {WHAT_TO_GIVE}"
        ), None
    silent = sorted(label for label, saw in seen.items() if saw is None)
    if silent:
        return None, (
            f"warning: --storage-path {shown}: node(s) {', '.join(silent)} did not answer in {PROBE_TIMEOUT_S:g} s, "
            "so whether they read it is not known"
        )
    return None, None


def probe_nodes(path: str, nodes: Mapping[str, str], *, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, bool | None]:
    """Ask each node whether it sees ``path``: one task of no CPU pinned to each (``soft=False``).

    Args:
        path: a file (the driver's marker).
        nodes: node id -> label (``training_nodes``).
        timeout_s: how long to wait for all the answers together.

    Returns:
        label -> True (the node sees the file), False (it does not), None (no answer in time, or the
        node went away).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not nodes:
        return {}

    # defined here, so that it travels by value: a node needs no raypipe to run it
    @ray.remote(num_cpus=0, max_retries=0)
    def sees(file: str) -> bool:
        return os.path.exists(file)

    refs = {
        sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(path): label
        for node_id, label in nodes.items()
    }
    done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    out: dict[str, bool | None] = {refs[ref]: None for ref in pending}
    for ref in pending:
        ray.cancel(ref, force=True)
    for ref in done:
        try:
            out[refs[ref]] = bool(ray.get(ref))
        except Exception:  # noqa: BLE001 - a node that went away meanwhile runs no training worker
            out[refs[ref]] = None
    return out


@contextlib.contextmanager
def checked_storage(given: str, *, cpus: float, gpu: bool) -> Iterator[tuple[str, str | None]]:
    """``resolve_storage``, then, for a local path, the driver's marker written there and probed on each
    other alive node that could run a training worker (``decide``); a warning is printed. The marker
    stays while the block runs, so that a training worker on a node that joined later can look for it
    too (``check_seen_here``), and is removed after.

    Args:
        given: ``--storage-path`` as given.
        cpus: one training worker's CPUs.
        gpu: whether a training worker takes a GPU.

    Yields:
        (the storage path for Ray Train, the marker's path or None for a URI); a local directory exists.

    Raises:
        StorageError: the path is not one every training worker reads, or cannot be written here.
    """
    resolved = resolve_storage(given)
    if is_uri(resolved):
        yield resolved, None
        return
    import ray

    marker = os.path.join(resolved, f"{MARKER_PREFIX}{uuid.uuid4().hex}")
    try:
        os.makedirs(resolved, exist_ok=True)
        with open(marker, "w"):
            pass
    except OSError as e:
        why = f"cannot write in {resolved} ({e.strerror})"
        raise StorageError(f"--storage-path {given!r}: {why}: {WHAT_TO_GIVE}") from None
    try:
        here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        nodes = training_nodes(ray.nodes(), here=here, cpus=cpus, gpu=gpu) if ray.is_initialized() else {}
        error, warning = decide(given, resolved, probe_nodes(marker, nodes))
        if error:
            raise StorageError(error)
        if warning:
            print(f"raypipe train: {warning}", flush=True)
        yield resolved, marker
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(marker)


def check_storage(given: str, *, cpus: float, gpu: bool) -> str:
    """``checked_storage`` alone, its marker removed at once.

    Args:
        given, cpus, gpu: as ``checked_storage``'s.

    Returns:
        The storage path for Ray Train.

    Raises:
        StorageError: as ``checked_storage``.
    """
    with checked_storage(given, cpus=cpus, gpu=gpu) as (resolved, _):
        return resolved


def check_seen_here(marker: str | None, *, given: str, node: str) -> None:
    """A training worker's own look for the driver's marker, before its first step: its node may have
    joined after the driver asked the nodes that were up (an autoscaling group at 0 at the start).

    Args:
        marker: the driver's marker (None: a URI, nothing to look for).
        given: ``--storage-path`` as given.
        node: this node, for the message (its address).

    Raises:
        StorageError: this node does not see the marker.
    """
    if marker is not None and not os.path.exists(marker):
        raise StorageError(
            f"--storage-path {given!r} is not shared: node {node} runs a training worker and does not see a file "
            f"the driver wrote in {os.path.dirname(marker)}: {WHAT_TO_GIVE}"
        )
