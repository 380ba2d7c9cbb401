"""Connecting to Ray: a running cluster when there is one, else a small local one."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
import warnings

import ray

from raypipe import settings
from raypipe.allocator import pin_mmap_threshold
from raypipe.ray_logs import quiet_ray_startup

__all__ = [
    "connect",
    "starting",
    "joined_cluster",
    "connection",
    "wait_connected",
    "release_start",
    "tune_consumer_process",
    "worker_pool_env",
    "check_ray_address",
    "check_worker_priority",
    "pin_mmap_threshold",
    "private_cluster",
    "join_private_cluster",
    "node_cpus",
    "process_memory_mb",
]


def connect(
    *,
    num_cpus: int | None = None,
    object_store_memory: int | None = None,
    quiet: bool = True,
    dashboard: bool = False,
    wait: bool = True,
) -> None:
    """``ray.init`` once: joins ``RAY_ADDRESS`` (set by ``ray job submit``; ``RAY_ADDRESS=auto`` joins a
    cluster started with ``ray start`` on this machine), else starts a private local Ray, with the
    dashboard (on 127.0.0.1) only when ``dashboard``: Ray Train needs it, as its placement-group cleaner
    asks the State API, which the dashboard serves, whether the train controller still lives (without
    it the cleaner warns every few seconds and cannot clean up; ``_state_api_named`` lets it find this
    cluster's beside another Ray). Never joins some other local cluster by accident (Ray's bare
    ``ray.init()`` would). Token auth is Ray's default in 2.60 and is left on.

    ``wait=False`` returns at once and starts the private local Ray on a background thread (joining
    ``RAY_ADDRESS`` is done at once all the same, so that an unreachable address is an error here): a
    local Ray takes seconds to start, and raypipe's streams make their first chunks in this process
    meanwhile (``starting``), so a trainer has its first batches before the cluster is up. The start
    itself begins once a stream's first batches are out (``release_start``) or something waits for the
    cluster (``wait_connected``), so that Ray's start does not share the cores with the first batch.
    Until ``wait_connected()`` returns, this process must not call Ray itself (Ray would start a second
    cluster of its own).

    Args:
        num_cpus, object_store_memory: the private local Ray's sizes (None: Ray's defaults); ignored
            when joining a cluster.
        quiet: Ray's logging at WARNING rather than INFO.
        dashboard: start the private local Ray with its dashboard.
        wait: False starts a private local Ray in the background, as above.

    Returns:
        None: Ray is initialised (with ``wait=False``, it may still be starting). In a process already
        connected, nothing is done.

    Raises:
        ConnectionError: ``RAY_ADDRESS`` names an address where no Ray cluster answers.
        Exception: what ``ray.init`` raises; with ``wait``, a ``wait=False`` start's error.
    """
    global _START
    if _START is not None:
        if not _START.done.is_set():
            if wait:
                wait_connected()
            return
        _START = None  # finished: connected (below, a no-op) or failed (tried again)
    if ray.is_initialized():
        return
    if wait or os.environ.get("RAY_ADDRESS"):
        _connect_now(num_cpus=num_cpus, object_store_memory=object_store_memory, quiet=quiet, dashboard=dashboard)
        return
    _START = _BackgroundStart(
        dict(num_cpus=num_cpus, object_store_memory=object_store_memory, quiet=quiet, dashboard=dashboard)
    )


def starting() -> bool:
    """Whether a ``connect(wait=False)`` is still under way. Raises its error once it has failed."""
    start = _START
    if start is None:
        return False
    if not start.done.is_set():
        return True
    if start.error is not None:
        raise start.error  # its own type: a caller tells an unreachable RAY_ADDRESS from a bug, as after connect()
    return False


def joined_cluster() -> bool:
    """Whether this process runs (or is to run) on a Ray cluster it joined rather than started: not
    raypipe's private local Ray, and told where by ``RAY_ADDRESS`` (``ray job submit``,
    ``raypipe.connect()``) or a Ray actor (a feeder, a training worker: what a cluster's driver
    starts). A script's own ``ray.init()`` that started a local Ray is not one, nor a Ray Client
    (``ray://``), which is on no node of the cluster."""
    if private_cluster():
        return False
    address = os.environ.get("RAY_ADDRESS", "")
    if address:
        return not address.startswith("ray://")
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def connection() -> str:
    """How this process is on Ray, as only it can tell (a Ray actor it starts cannot: it must be told),
    which is where ``ExecutionConfig(backend="auto")`` runs its tasks
    (``raypipe.pipeline.backend.decide_backend``):

    - ``"none"``: not connected, not connecting, no ``RAY_ADDRESS``;
    - ``"private"``: raypipe's private local Ray (``private_cluster``, or ``connect(wait=False)`` starting it);
    - ``"own"``: a Ray the script reached itself (its own ``ray.init()``), not from a Ray actor;
    - ``"joined"``: connected to a cluster it joined (``joined_cluster``);
    - ``"joining"``: told to join one (``RAY_ADDRESS``) and not connected yet;
    - ``"client"``: Ray Client (``ray://``), which is on no node of the cluster.

    Raises the error of a ``connect(wait=False)`` that failed (``starting``)."""
    if private_cluster():
        return "private"
    client = os.environ.get("RAY_ADDRESS", "").startswith("ray://")
    if ray.is_initialized():
        if joined_cluster():
            return "joined"
        return "client" if client else "own"
    if starting():
        return "private"  # connect(wait=False) with no RAY_ADDRESS: it joins nothing, it starts raypipe's own
    if not os.environ.get("RAY_ADDRESS"):
        return "none"
    return "client" if client else "joining"


def wait_connected(timeout_s: float | None = None) -> None:
    """Block until a ``connect(wait=False)`` has finished (at once when none is under way); raises its
    error, or ``TimeoutError`` after ``timeout_s``."""
    start = _START
    if start is not None:
        start.go.set()
        if not start.done.wait(timeout_s):
            raise TimeoutError(f"Ray did not start within {timeout_s} s")
    starting()


def release_start() -> None:
    """Let a ``connect(wait=False)`` begin its start, if it has not yet (a stream calls this when its
    consumer comes back for a second chunk: the first chunk's batches are out, Ray may take the cores)."""
    start = _START
    if start is not None:
        start.go.set()


class _BackgroundStart:
    """``connect`` on a thread that then stays parked for the life of the process. It must outlive the
    start: the Ray processes a local ``ray.init`` starts are told by the kernel to die with the thread
    that started them (Linux's parent-death signal follows the thread, not the process)."""

    def __init__(self, kwargs: dict):
        self.go = threading.Event()  # see connect's doc
        self.done = threading.Event()
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(kwargs,), name="raypipe-connect", daemon=True).start()
        atexit.register(self._end_with_process)

    def _end_with_process(self) -> None:
        """A process that ends while its Ray is still starting (an error in the trainer's set-up) waits
        for the start, then shuts Ray down: stopped half-way, Ray's agents would outlive the process."""
        if not self.go.is_set():
            return  # never begun
        if self.done.wait(60.0) and ray.is_initialized():  # a start takes seconds; a minute bounds a stuck one
            ray.shutdown()

    def _run(self, kwargs: dict) -> None:
        # Quiet as the CLI's start is: these messages would land in the middle of the trainer's output.
        # (Among them, that Ray cannot set its SIGTERM handler off the main thread: that handler only
        # turns SIGTERM into an exit, and a terminated driver takes its local Ray down with it anyway.)
        self.go.wait()
        try:
            with quiet_ray_startup(verbose=not kwargs["quiet"]):
                _connect_now(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the cluster
            self.error = exc
        finally:
            self.done.set()
        threading.Event().wait()  # parked: see the class doc


_START: _BackgroundStart | None = None


def _connect_now(*, num_cpus: int | None, object_store_memory: int | None, quiet: bool, dashboard: bool) -> None:
    kwargs: dict = {"logging_level": logging.WARNING if quiet else logging.INFO, "log_to_driver": True}
    if os.environ.get("RAY_ADDRESS"):
        check_ray_address(os.environ["RAY_ADDRESS"])
        ray.init(**kwargs)
        check_worker_priority()
        return
    global _PRIVATE_CLUSTER
    _PRIVATE_CLUSTER = True  # no autoscaler: what its nodes have now is all there will be
    # The raylet this starts reads its settings from the environment, as `ray start` does.
    for key, value in worker_pool_env(num_cpus or os.cpu_count() or 1).items():
        os.environ.setdefault(key, value)
    with _state_api_named(dashboard) as port:
        if port is not None:
            kwargs["dashboard_port"] = port
        ray.init(
            address="local",
            num_cpus=num_cpus,
            object_store_memory=object_store_memory,
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            **kwargs,
        )


_API_SERVER = "RAY_API_SERVER_ADDRESS"


@contextlib.contextmanager
def _state_api_named(dashboard: bool):
    """While the private Ray starts: a free port for its dashboard (yielded), named in Ray's
    ``RAY_API_SERVER_ADDRESS`` so that the raylet and every worker it starts inherit it. Ray's State API,
    called with no address in a worker (Ray Train's placement-group cleaner asks it whether the train
    controller lives), otherwise looks for the cluster among the machine's GCS processes and fails when
    it finds more than one ("Found multiple active Ray instances": any other Ray on the machine). This
    process's own environment is as before afterwards, so nothing it starts later inherits the name of
    a dashboard that may be gone. Yields None (Ray picks the port) without a dashboard or where the user
    set the variable."""
    if not dashboard or os.environ.get(_API_SERVER):
        yield None
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ[_API_SERVER] = f"http://127.0.0.1:{port}"
    try:
        yield port
    finally:
        os.environ.pop(_API_SERVER, None)


_PRIVATE_CLUSTER = False

# RAY_ADDRESS scheme -> the port Ray uses when the address names none
_DEFAULT_PORTS = {"": 6379, "ray": 10001, "http": 80, "https": 443}


def check_ray_address(address: str, timeout_s: float | None = None) -> None:
    """Raise a one-line ``ConnectionError`` when nothing accepts a TCP connection at ``address`` (a
    ``RAY_ADDRESS``: ``host:port``, ``ray://host:port`` or a dashboard's ``http(s)://host:port``) within
    ``timeout_s`` (``Settings.ray_connect_s``), or, for ``host:port`` and ``ray://``, when what accepts
    does not answer as a gRPC server within the same time (``_not_grpc``: a dashboard's port, a proxy).
    ``ray.init`` would retry either for ~20 s or more, printing a page of gRPC warnings. ``auto``,
    ``local`` and unknown schemes are left to Ray."""
    address = address.strip()
    if address.lower() in ("", "auto", "local"):
        return
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    port_default = _DEFAULT_PORTS.get(scheme.lower())
    if port_default is None:
        return
    hostport = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    host, port = hostport, port_default
    if hostport.startswith("["):  # [IPv6]:port
        host, _, tail = hostport[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else port_default
    elif hostport.count(":") == 1:
        name, _, number = hostport.partition(":")
        if number.isdigit():
            host, port = name, int(number)
    timeout_s = settings.current().ray_connect_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as e:
        why = f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ConnectionError(
            f"RAY_ADDRESS={address!r}: no Ray cluster at {host}:{port} ({why}): start one "
            "there (`ray start --head`), correct RAY_ADDRESS, or unset it to run on this machine alone"
        ) from None
    with conn:
        if scheme.lower() not in ("", "ray") or _ray_uses_tls():
            return  # http(s): Ray itself says at once that a driver cannot join a dashboard's address
        why = _not_grpc(conn, deadline, timeout_s)
    if why:
        expected = (
            "a Ray Client server (ray://head:10001)"
            if scheme.lower() == "ray"
            else "a Ray head's GCS (head:6379, the address `ray start --head` prints)"
        )
        raise ConnectionError(
            f"RAY_ADDRESS={address!r}: {host}:{port} {why}, so it is not {expected}: check the port (the "
            "dashboard's 8265 is for `ray job submit --address http://…`, not for a driver), correct "
            "RAY_ADDRESS, or unset it to run on this machine alone"
        )


# What an HTTP/2 client sends first (RFC 9113, section 3.4): the preface, then its (empty) SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _not_grpc(conn: socket.socket, deadline: float, timeout_s: float) -> str | None:
    """None when the server at ``conn`` speaks HTTP/2 as Ray's gRPC servers do (its first frame is a
    SETTINGS frame), else what it did instead. Ray's GCS and Ray Client server are gRPC servers on
    plain TCP; without this check ``ray.init`` retries anything else that accepts connections for
    minutes (a dashboard, a proxy, some other service on the port), printing gRPC warnings."""
    got = b""
    try:
        conn.sendall(_H2_PREFACE)
        while len(got) < 9:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = conn.recv(9 - len(got))
            if not chunk:
                break
            got += chunk
    except TimeoutError:
        if not got:
            return f"accepts connections but sent nothing in {timeout_s:g} s"
    except OSError as e:
        return f"accepts connections, then failed ({e.strerror or type(e).__name__})"
    if len(got) == 9 and got[3] == 4 and got[5:9] == bytes(4):  # a SETTINGS frame on stream 0
        return None
    if got.startswith((b"HTTP/", b"<")):  # a status line, or an HTML error page (an HTTP/0.9-style reply)
        return "answers HTTP, not gRPC (a dashboard, a job API or a proxy?)"
    if not got:
        return "accepts connections and closes them without an answer"
    return f"answers something other than gRPC ({got[:9]!r}…)"


def _ray_uses_tls() -> bool:
    """Ray's documented ``RAY_USE_TLS``: its gRPC servers then expect a TLS handshake first."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")


def private_cluster() -> bool:
    """Whether ``connect`` started the Ray this process uses, or ``join_private_cluster`` joined another
    process's so started (a fixed local cluster, no autoscaler)."""
    return _PRIVATE_CLUSTER and ray.is_initialized()


def node_cpus() -> float | None:
    """The CPUs this process's Ray node declares (``connect(num_cpus=…)``, ``ray start --num-cpus``),
    where this process is connected to Ray; None where it is not."""
    if not ray.is_initialized():
        return None
    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == here and node.get("Alive", True):
            return float(node.get("Resources", {}).get("CPU", 0.0))
    return None


def join_private_cluster(address: str) -> None:
    """Join the private local Ray that another process of this machine started with ``connect`` (the
    ranks of a node share their local rank 0's), knowing it for what it is (``private_cluster``)."""
    global _PRIVATE_CLUSTER
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
    _PRIVATE_CLUSTER = True


def worker_pool_env(cpus: int) -> dict[str, str]:
    """Ray settings (as ``RAY_*`` environment variables, which `ray start` and a local ``ray.init``
    read) for a cluster that runs raypipe's workers:

    - ``RAY_worker_niceness=0``: Ray starts every worker process at niceness 15, about 3 % of a normal
      process's CPU weight: beside any other busy process (a trainer's own threads, another job) the
      augmentation all but stops. ``ExecutionConfig.worker_nice`` then lowers only the augmentation
      thread, on purpose (an unprivileged process can raise its niceness but never lower it back).
    - ``RAY_num_workers_soft_limit``: Ray ends idle worker processes beyond it (default: the CPU count)
      after a second; with a task per CPU beside the trainer's own processes and a consumer that
      applies backpressure, workers idle briefly and would be ended and restarted, each restart setting
      its stage up again
      (``python bench/pipeline_profile.py DATA --consumer-ms 300 --ray-soft-limit 2`` counts them).

    cluster.yaml and deploy/kuberay set the same variables for `ray start`."""
    return {"RAY_worker_niceness": "0", "RAY_num_workers_soft_limit": str(2 * cpus + 4)}


def check_worker_priority(timeout_s: float = 30.0) -> int | None:
    """The niceness a worker of the connected cluster runs at; warns when it is above 0 (Ray's
    default is 15: see ``worker_pool_env``), which only the cluster's operator can change. None
    when no worker answered in time or the platform has no niceness."""
    if not hasattr(os, "nice"):
        return None

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    try:
        nice = ray.get(niceness.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - a probe: a busy or odd cluster must not stop the job
        return None
    if nice > 0:
        warnings.warn(
            f"Ray workers on this cluster run at niceness {nice} (Ray's default is 15): beside any other busy "
            "process they get a few percent of a CPU, and augmentation all but stops. Start the nodes with "
            "RAY_worker_niceness=0 in the environment of `ray start` (cluster.yaml and deploy/kuberay do).",
            RuntimeWarning,
            stacklevel=2,
        )
    return nice


def tune_consumer_process() -> None:
    """Settings for a process that consumes raypipe's batches for its whole life (a feeder, the
    `raypipe` command): glibc's mmap threshold pinned (``raypipe.allocator.pin_mmap_threshold``).
    Called explicitly by such processes; importing raypipe changes nothing."""
    pin_mmap_threshold()


def process_memory_mb(pid: int | str = "self") -> dict[str, float]:
    """A process's resident memory in MB, split as the kernel counts it (Linux ``/proc/PID/status``).

    ``rss`` = ``anon`` (the process's own heap: what a leak grows) + ``file`` (mapped code and files)
    + ``shmem`` (shared memory it has touched: for a Ray process, pages of the object store it read
    zero-copy, which belong to the store and are bounded by its size). Off Linux only ``rss`` is known.
    """
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in fields:
                    out[fields[key]] = round(int(value.split()[0]) / 1024, 1)  # kB
    except OSError:
        pass
    if "rss" not in out:
        import psutil

        proc = psutil.Process() if pid == "self" else psutil.Process(int(pid))
        out["rss"] = round(proc.memory_info().rss / 2**20, 1)
    return out
