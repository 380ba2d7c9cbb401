"""Ending a tree of processes, and the strays that left it, without touching any other process: what
stops a test's Ray cluster (``raypipe.testing.autoscaler``) without ``ray stop``, which ends every Ray
of the machine. A process is one cluster's when its environment carries ``MARK_ENV`` with the cluster's
value (Ray passes its environment on to every process it starts).
"""

from __future__ import annotations

import os
import signal

__all__ = ["MARK_ENV", "end_process_tree", "marked_processes"]

# Every process of one cluster carries this variable (Ray passes its environment on), with the
# cluster's own value: what finds a process that left the tree (its parent ended first).
MARK_ENV = "RAYPIPE_FAKE_CLUSTER"


def end_process_tree(root_pid: int, mark: str | None = None, *, grace_s: float = 3.0) -> list[str]:
    """End ``root_pid`` and every process under it. The tree is first stopped (``SIGSTOP``, again
    until no new process appears: a stopped process starts none), then sent ``SIGTERM`` and let go
    on; what is left after ``grace_s`` is killed (a GCS sent ``SIGTERM`` can wait far longer, flushing
    its events). With ``mark``, processes whose environment has
    ``MARK_ENV=mark`` are ended too (one whose parent ended first is no longer under the root).
    Returns those (pid and name): a tree that held everything returns none."""
    import psutil

    try:
        root = psutil.Process(root_pid)
    except psutil.NoSuchProcess:
        root = None
    seen: dict[int, psutil.Process] = {}
    frontier = [root] if root is not None else []
    while frontier:
        for proc in frontier:
            seen[proc.pid] = proc
            _signal(proc, signal.SIGSTOP)
        found = []
        for proc in list(seen.values()):
            try:
                found += [c for c in proc.children(recursive=True) if c.pid not in seen]
            except psutil.NoSuchProcess:
                continue
        frontier = list({p.pid: p for p in found}.values())
    _end(list(seen.values()), grace_s)
    strays: list[str] = []
    if mark is not None:
        for _ in range(3):
            left = marked_processes(mark)
            if not left:
                break
            strays += [f"{p.pid} {_name(p)}" for p in left]
            for proc in left:
                _signal(proc, signal.SIGSTOP)
            _end(left, grace_s)
    return strays


def _end(procs: list, grace_s: float) -> None:
    import psutil

    for proc in procs:
        _signal(proc, signal.SIGTERM)
    for proc in procs:
        _signal(proc, signal.SIGCONT)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    _, alive = psutil.wait_procs(alive, timeout=10)
    if alive:
        raise RuntimeError(f"processes that did not end on SIGKILL: {[p.pid for p in alive]}")


def marked_processes(mark: str) -> list:
    """The processes of this machine whose environment has ``MARK_ENV=mark`` (``psutil.Process``)."""
    import psutil

    out = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARK_ENV) == mark:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _signal(proc, sig: int) -> None:
    import psutil

    try:
        proc.send_signal(sig)
    except (psutil.NoSuchProcess, ProcessLookupError):
        pass


def _name(proc) -> str:
    try:
        return proc.name()
    except Exception:  # noqa: BLE001 - it ended meanwhile
        return "?"
