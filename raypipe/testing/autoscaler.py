"""A Ray cluster on this machine whose CPU nodes come and go with Ray's fake multi-node autoscaler.

A head started with ``RAY_FAKE_CLUSTER=1 ray start --head --block --autoscaling-config=FILE`` runs
Ray's autoscaler with the ``fake_multinode`` provider: a node it launches is a set of processes of
this machine (raylet and agents), started by the autoscaler's monitor, ended when idle. The head is
the trainer's node; one CPU-only node type offers the ``preprocess`` resource. Everything runs on free
ports of its own, in a temporary directory of its own, with token auth; ending it ends exactly the
process tree its ``ray start`` began (and anything that carries its mark,
``raypipe.testing.process_tree``), never another Ray
(``ray stop`` and ``AutoscalingCluster.start()``/``shutdown()`` end every Ray of the machine).

    with FakeAutoscalingCluster(max_workers=3, idle_timeout_s=6) as cluster:
        cluster.connect()  # this process: imported Ray with RAY_AUTH_MODE=token
        cluster.wait_for_workers(0, timeout_s=30)
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import yaml

from raypipe.cluster_config import DEFAULT_PREPROCESS_RESOURCE
from raypipe.testing.free_ports import free_ports, free_range
from raypipe.testing.process_tree import MARK_ENV, end_process_tree

__all__ = [
    "FakeAutoscalingCluster",
    "autoscaling_config",
    "PREPROCESS",
    "WORKER_TYPE",
    "HEAD_TYPE",
]

log = logging.getLogger(__name__)

PREPROCESS = DEFAULT_PREPROCESS_RESOURCE  # the resource that steers augmentation to the CPU nodes (cluster.yaml's)
WORKER_TYPE = "cpu"  # the CPU node type's name in the config
HEAD_TYPE = "ray.head.default"  # the head's type: the name the fake provider gives its head
WORKER_PORTS = 60  # the head's range of worker ports (its own processes and the driver's)


def autoscaling_config(
    *,
    gcs_address: str,
    head_cpus: int,
    worker_cpus: int,
    worker_resources: Mapping[str, float],
    min_workers: int,
    max_workers: int,
    idle_timeout_s: float,
    worker_object_store_bytes: int,
) -> dict:
    """Pure: the autoscaler's config for a ``fake_multinode`` cluster of a head of ``head_cpus`` and up
    to ``max_workers`` nodes of type ``WORKER_TYPE`` (``worker_cpus`` and ``worker_resources`` each).
    The provider joins its nodes to ``gcs_address`` (the head's own port, not Ray's default)."""
    worker = {"CPU": worker_cpus, **dict(worker_resources), "object_store_memory": worker_object_store_bytes}
    return {
        "cluster_name": "raypipe-fake",
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_s / 60.0,
        "provider": {
            "type": "fake_multinode",
            "gcs_address": gcs_address,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,  # the provider starts Ray on its nodes itself
            "disable_launch_config_check": True,
        },
        "head_node_type": HEAD_TYPE,
        "available_node_types": {
            HEAD_TYPE: {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {
                "resources": worker,
                "node_config": {},
                "min_workers": min_workers,
                "max_workers": max_workers,
            },
        },
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def _process_token() -> str:
    """This process's token for the clusters it starts: Ray's client keeps the first token it reads for
    the life of the process, so every cluster a process connects to has the same one."""
    global _TOKEN
    if _TOKEN is None:
        _TOKEN = os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)
    return _TOKEN


_TOKEN: str | None = None


def _positive_int(name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an int >= {minimum}")
    return value


class FakeAutoscalingCluster:
    """The cluster of the module doc: ``start()`` (or ``with``) starts the head, ``stop()`` ends it.

    ``address`` is what ``ray.init(address=…)`` takes; ``driver_env()`` the variables a driver in
    another process needs (Ray reads ``RAY_AUTH_MODE`` when it is imported: this process must have
    been started with ``RAY_AUTH_MODE=token`` to ``connect()``). ``alive_workers()`` counts the CPU
    nodes alive now, as this process's Ray sees them; ``most_workers_seen`` is the most it counted,
    ``timeline`` each change it saw.
    """

    def __init__(
        self,
        *,
        head_cpus: int = 1,
        worker_cpus: int = 1,
        worker_resources: Mapping[str, float] | None = None,
        min_workers: int = 0,
        max_workers: int = 3,
        idle_timeout_s: float = 6.0,
        head_object_store_mb: int = 256,
        worker_object_store_mb: int = 128,
        dashboard: bool = False,
        start_timeout_s: float = 120.0,
    ):
        self.head_cpus = _positive_int("head_cpus", head_cpus)
        self.worker_cpus = _positive_int("worker_cpus", worker_cpus)
        resources = {PREPROCESS: float(worker_cpus)} if worker_resources is None else dict(worker_resources)
        if not resources or not all(
            isinstance(k, str) and k != "CPU" and isinstance(v, (int, float)) and v > 0 for k, v in resources.items()
        ):
            raise ValueError(
                f"worker_resources={worker_resources!r}: expected custom resource name -> amount > 0 "
                "(what tells the CPU nodes apart from the head)"
            )
        self.worker_resources = resources
        self.min_workers = _positive_int("min_workers", min_workers, minimum=0)
        self.max_workers = _positive_int("max_workers", max_workers)
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers={min_workers!r}: more than max_workers={max_workers!r}")
        if isinstance(idle_timeout_s, bool) or not isinstance(idle_timeout_s, (int, float)) or idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s={idle_timeout_s!r}: expected seconds > 0")
        self.idle_timeout_s = float(idle_timeout_s)
        self.head_object_store_mb = _positive_int("head_object_store_mb", head_object_store_mb, minimum=80)
        self.worker_object_store_mb = _positive_int("worker_object_store_mb", worker_object_store_mb, minimum=80)
        self.dashboard = bool(dashboard)
        self.start_timeout_s = float(start_timeout_s)
        self.token = _process_token()
        self.mark = uuid.uuid4().hex
        self.most_workers_seen = 0
        self.timeline: list[tuple[float, int]] = []  # (time.monotonic(), CPU nodes alive) at each change seen
        self.address: str | None = None
        self.dashboard_url: str | None = None
        self.temp_dir: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._saved_token: str | None = None
        self._connected = False

    # -- starting and ending ----------------------------------------------------------------------

    def start(self) -> FakeAutoscalingCluster:
        if self._proc is not None:
            return self
        # unix socket paths under it must stay below ~100 characters: a short path of its own
        self.temp_dir = tempfile.mkdtemp(prefix="rpas", dir="/tmp")
        try:
            self._start_head()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_head(self) -> None:
        ports = free_ports(9)
        workers = free_range(WORKER_PORTS, avoid=ports)
        gcs, client, nm, om, agent_listen, agent_grpc, metrics, runtime_env, dash = ports
        self.address = f"127.0.0.1:{gcs}"
        config = autoscaling_config(
            gcs_address=self.address,
            head_cpus=self.head_cpus,
            worker_cpus=self.worker_cpus,
            worker_resources=self.worker_resources,
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            idle_timeout_s=self.idle_timeout_s,
            worker_object_store_bytes=self.worker_object_store_mb << 20,
        )
        config_path = Path(self.temp_dir, "autoscaling.yaml")
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
        env.update(
            {
                "RAY_FAKE_CLUSTER": "1",
                "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": self.token,
                "RAY_USAGE_STATS_ENABLED": "0",
                MARK_ENV: self.mark,
            }
        )
        # --node-ip-address: Ray replaces 127.0.0.1 with the machine's address, which every node shares
        cmd = [
            _ray_command(),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs}",
            f"--num-cpus={self.head_cpus}",
            f"--object-store-memory={self.head_object_store_mb << 20}",
            f"--ray-client-server-port={client}",
            f"--node-manager-port={nm}",
            f"--object-manager-port={om}",
            f"--dashboard-agent-listen-port={agent_listen}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--min-worker-port={workers}",
            f"--max-worker-port={workers + WORKER_PORTS - 1}",
            f"--temp-dir={self.temp_dir}",
            f"--autoscaling-config={config_path}",
        ]
        if self.dashboard:
            cmd += ["--dashboard-host=127.0.0.1", f"--dashboard-port={dash}"]
            self.dashboard_url = f"http://127.0.0.1:{dash}"
        else:
            cmd += ["--include-dashboard=false"]
        log_path = Path(self.temp_dir, "head.log")
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed by stop()
        self._proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + self.start_timeout_s
        while b"Ray runtime started." not in log_path.read_bytes():
            if self._proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self._proc.returncode}:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray head did not start in {self.start_timeout_s:g} s:\n{_tail(log_path)}")
            time.sleep(0.2)
        log.info("fake autoscaling cluster at %s (ray start pid %d, %s)", self.address, self._proc.pid, self.temp_dir)

    def stop(self) -> None:
        """Disconnect this process (if ``connect`` did; a process that called ``ray.init`` itself calls
        ``ray.shutdown()`` first: a driver whose cluster ends under it can end the interpreter), end the
        head's process tree and remove its directory. Raises ``RuntimeError`` where a process of it had
        to be found outside the tree."""
        if self._connected:
            import ray

            ray.shutdown()
            self._connected = False
            if self._saved_token is None:
                os.environ.pop("RAY_AUTH_TOKEN", None)
            else:
                os.environ["RAY_AUTH_TOKEN"] = self._saved_token
        proc, self._proc = self._proc, None
        strays: list[str] = []
        try:
            if proc is not None:
                strays = end_process_tree(proc.pid, self.mark)
                proc.wait(timeout=10)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
        if strays:
            raise RuntimeError(f"processes of the fake cluster outside its process tree were ended: {strays}")

    def __enter__(self) -> FakeAutoscalingCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def head_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- drivers ------------------------------------------------------------------------------------

    def driver_env(self) -> dict[str, str]:
        """What a driver in another process needs in its environment (from its start): ``ray.init()``
        there joins this cluster."""
        self._check_started()
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_ADDRESS": self.address}

    def connect(self, **init_kwargs) -> None:
        """``ray.init`` this process to the cluster (``stop`` disconnects it)."""
        self._check_started()
        if os.environ.get("RAY_AUTH_MODE") != "token":
            raise RuntimeError(
                "the fake cluster runs with token auth, and Ray reads RAY_AUTH_MODE when it is imported: start "
                "this process with RAY_AUTH_MODE=token (or use driver_env() for a driver of its own)"
            )
        import ray

        self._saved_token = os.environ.get("RAY_AUTH_TOKEN")
        os.environ["RAY_AUTH_TOKEN"] = self.token
        ray.init(address=self.address, **{"logging_level": logging.WARNING, **init_kwargs})
        self._connected = True

    def _check_started(self) -> None:
        if self._proc is None:
            raise RuntimeError("the fake cluster is not started: call start() or use it as a context manager")

    # -- watching the CPU nodes -----------------------------------------------------------------------

    def alive_workers(self) -> int:
        """The CPU nodes alive now (``ray.nodes()``: nodes that offer every worker resource and are not
        the head); needs this process connected to the cluster."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError("alive_workers() asks Ray: connect() this process (or ray.init) first")
        count = 0
        for node in ray.nodes():
            have = node.get("Resources", {})
            if (
                node.get("Alive")
                and "node:__internal_head__" not in have
                and all(have.get(k, 0.0) >= v for k, v in self.worker_resources.items())
            ):
                count += 1
        self.most_workers_seen = max(self.most_workers_seen, count)
        if not self.timeline or self.timeline[-1][1] != count:
            self.timeline.append((time.monotonic(), count))
        return count

    def wait_for_workers(self, count: int, *, timeout_s: float, poll_s: float = 0.25) -> float:
        """Wait until exactly ``count`` CPU nodes are alive; return the seconds it took. Raises
        ``TimeoutError`` with the counts seen."""
        start = time.monotonic()
        seen: list[int] = []
        while True:
            now = self.alive_workers()
            if not seen or seen[-1] != now:
                seen.append(now)
            if now == count:
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"{count} CPU node(s) not reached in {timeout_s:g} s; counts seen: {seen}")
            time.sleep(poll_s)

    def workers_during(self, seconds: float, *, poll_s: float = 0.25) -> list[int]:
        """The CPU nodes alive, counted every ``poll_s`` for ``seconds``."""
        end = time.monotonic() + seconds
        counts = [self.alive_workers()]
        while time.monotonic() < end:
            time.sleep(poll_s)
            counts.append(self.alive_workers())
        return counts


def _ray_command() -> str:
    """The ``ray`` command of this interpreter's Ray (a virtual environment's, where it runs in one)."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def _tail(path: Path, size: int = 4000) -> str:
    return path.read_bytes()[-size:].decode(errors="replace")
