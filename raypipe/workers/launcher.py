"""The actor that keeps a node's share of raypipe's worker processes running on that node.

It is pinned to its node and holds the CPUs its workers use, so that Ray schedules nothing else onto
them and an autoscaler sees the node busy. Each worker connects back to the consumer and ends with the
launcher: it watches a pipe whose writing end only the launcher holds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import ray

from raypipe.workers.peer_auth import SECRET_ENV

__all__ = ["Launcher", "MAX_LAUNCHER_RESTARTS"]

log = logging.getLogger(__name__)

# Restarts of a node's workers a launcher makes before it leaves the dead ones dead (a broken node).
MAX_LAUNCHER_RESTARTS = 8


@ray.remote(max_restarts=0, max_concurrency=3)  # run, close and node at once
class Launcher:
    """Starts ``count`` workers on its node that connect to the consumer at ``(host, port)``, keeps them
    running (a worker that ends is replaced) until ``close`` or its own end, which ends them: each
    watches a pipe whose writing end only this process holds."""

    def __init__(self, host: str, port: int, secret: bytes, count: int):
        self._args = (host, str(port))
        self._env = dict(os.environ)
        self._env["PYTHONPATH"] = os.pathsep.join([p or os.getcwd() for p in sys.path])
        self._env[SECRET_ENV] = secret.hex()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._procs = [self._spawn() for _ in range(count)]
        self.restarts = 0
        threading.Thread(target=self._keep, name="raypipe-launcher", daemon=True).start()

    def _spawn(self) -> tuple[subprocess.Popen, int]:
        read, write = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "raypipe.workers.worker_process", "--connect", *self._args, str(read)],
                pass_fds=(read,),
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        return proc, write

    def _keep(self) -> None:
        while not self._closed.wait(0.5):
            with self._lock:
                for i, (proc, lifeline) in enumerate(self._procs):
                    if proc.poll() is None or self.restarts >= MAX_LAUNCHER_RESTARTS or self._closed.is_set():
                        continue
                    os.close(lifeline)
                    self.restarts += 1
                    log.warning("raypipe worker %d ended (exit code %s); starting another", proc.pid, proc.returncode)
                    self._procs[i] = self._spawn()

    @staticmethod
    def node() -> str:
        """The node it runs on (a call that returns once Ray placed it)."""
        return ray.get_runtime_context().get_node_id()

    def run(self) -> int:
        """Returns when closed (its caller's reference ends with the actor, however it ends)."""
        self._closed.wait()
        return self.restarts

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            for _, lifeline in self._procs:
                os.close(lifeline)
        for proc, _ in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
