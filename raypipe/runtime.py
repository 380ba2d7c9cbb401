"""Connecting to Ray: a running cluster when there is one, else a small local one."""

from __future__ import annotations

import logging
import os
import socket
import warnings

import ray

from raypipe import timeouts

__all__ = [
    "connect",
    "check_ray_address",
    "raise_original_errors",
    "quiet_ray_data_console",
    "worker_pool_config",
    "check_worker_priority",
    "pin_mmap_threshold",
    "private_cluster",
    "process_memory_mb",
]


def connect(
    *, num_cpus: int | None = None, object_store_memory: int | None = None, quiet: bool = True, dashboard: bool = False
) -> None:
    """``ray.init`` once: joins ``RAY_ADDRESS`` (set by ``ray job submit``; ``RAY_ADDRESS=auto`` joins a
    cluster started with ``ray start`` on this machine), else starts a private local Ray, with the
    dashboard (on 127.0.0.1) only when ``dashboard``: Ray Train needs it, as its placement-group cleaner
    asks the State API, which the dashboard serves, whether the train controller still lives (without
    it the cleaner warns every few seconds and cannot clean up). Never joins some other local cluster by
    accident (Ray's bare ``ray.init()`` would). Token auth is Ray's default in 2.60 and is left on."""
    if quiet:
        quiet_ray_data_console()
    raise_original_errors()
    if ray.is_initialized():
        return
    kwargs: dict = {"logging_level": logging.WARNING if quiet else logging.INFO, "log_to_driver": True}
    if os.environ.get("RAY_ADDRESS"):
        check_ray_address(os.environ["RAY_ADDRESS"])
        ray.init(**kwargs)
        check_worker_priority()
        return
    global _PRIVATE_CLUSTER
    _PRIVATE_CLUSTER = True  # no autoscaler: what its nodes have now is all there will be
    ray.init(
        address="local",
        num_cpus=num_cpus,
        object_store_memory=object_store_memory,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        _system_config=worker_pool_config(num_cpus or os.cpu_count() or 1),
        **kwargs,
    )


_PRIVATE_CLUSTER = False

# RAY_ADDRESS scheme -> the port Ray uses when the address names none
_DEFAULT_PORTS = {"": 6379, "ray": 10001, "http": 80, "https": 443}


def check_ray_address(address: str, timeout_s: float | None = None) -> None:
    """Raise a one-line ``ConnectionError`` when nothing accepts a TCP connection at ``address`` (a
    ``RAY_ADDRESS``: ``host:port``, ``ray://host:port`` or a dashboard's ``http(s)://host:port``) within
    ``timeout_s`` (``timeouts.RAY_CONNECT_S``). ``ray.init`` would retry such an address for ~20 s and
    print a page of gRPC warnings first. ``auto``, ``local`` and unknown schemes are left to Ray."""
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
    timeout_s = timeouts.RAY_CONNECT_S if timeout_s is None else timeout_s
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        why = f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ConnectionError(
            f"RAY_ADDRESS={address!r}: no Ray cluster at {host}:{port} ({why}): start one "
            "there (`ray start --head`), correct RAY_ADDRESS, or unset it to run on a private local Ray"
        ) from None


def raise_original_errors() -> None:
    """Make the Ray Data executions this process starts from now on fail with the exception a stage
    raised, not Ray Data's ``UserCodeException`` wrapper: the consumer then gets a ``RayTaskError``
    that subclasses the original type (a ``TypeError`` stays a ``TypeError``) and carries the worker's
    traceback, pid and node address. A bug in a stage must not look like a data-pipeline failure.
    Datasets capture the current ``DataContext`` when they are created, so call this before."""
    import ray.data

    ray.data.DataContext.get_current().raise_original_map_exception = True


def private_cluster() -> bool:
    """Whether ``connect`` started the Ray this process uses (a fixed local cluster, no autoscaler)."""
    return _PRIVATE_CLUSTER and ray.is_initialized()


def quiet_ray_data_console() -> None:
    """Ray Data prints every execution's start, plan and end at INFO (each epoch, train and eval);
    raypipe prints its own per-epoch summary. Raise the level of Ray Data's console handler only: its
    session log file (ray-data.log) keeps everything. Ray Data sets its logging up when ``ray.data`` is
    first imported (so a level set on the logger before that is lost), hence the import here.

    Also drops Ray Data's "Progress bars disabled. To enable, set ..." warning: raypipe turns its
    progress bars off on purpose (it draws its own), so the advice would only mislead."""
    import ray.data  # noqa: F401 - configures the "ray.data" logger and its handlers

    for handler in logging.getLogger("ray.data").handlers:
        if "File" not in type(handler).__name__:  # Ray Data's SessionFileHandler is no logging.FileHandler
            handler.setLevel(max(handler.level, logging.WARNING))
    logging.getLogger("ray.data._internal.progress").addFilter(_drop_progress_bar_notice)  # once: same object


def _drop_progress_bar_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Progress bars disabled")


def worker_pool_config(cpus: int) -> dict:
    """Ray system config for a local cluster: raypipe's worker pool at normal priority, kept alive.

    - ``worker_niceness``: Ray starts every worker process at niceness 15, which on Linux is ~3 % of
      the CPU weight of a normal process. Alone on a machine that costs nothing, but beside any other
      busy process (a trainer's own threads, a second job) the augmentation workers all but stop:
      2-core bench with two busy processes beside it, 81 img/s at 15 vs 550 at 0 (timm's loader,
      whose workers run at 0: 367). Workers start at 0 here; ``PipelineConfig.worker_nice`` then
      lowers the augmentation thread's priority on purpose (an unprivileged process can raise its
      niceness but never lower it back, so it has to start at 0).
    - ``num_workers_soft_limit``: Ray kills idle worker processes beyond it (default: the CPU count)
      after a second. raypipe runs two augmentation workers per CPU (``cpus_per_actor=0.5``) and a
      trainer that applies backpressure, so workers idled, were killed and restarted, each
      re-importing the stage (then torch and timm too with auto-augment; OpenCV): 22 worker processes
      started in 10 s on a 16-core machine, and a 2-core run started 3 per 2000-image epoch (none with
      this limit).

    ``RAY_worker_niceness`` / ``RAY_num_workers_soft_limit`` in the environment win, as for clusters
    started with ``ray start`` (see cluster.yaml)."""
    config: dict = {}
    if not os.environ.get("RAY_worker_niceness"):
        config["worker_niceness"] = 0
    if not os.environ.get("RAY_num_workers_soft_limit"):
        config["num_workers_soft_limit"] = 2 * cpus + 4
    return config


def check_worker_priority(timeout_s: float = 30.0) -> int | None:
    """The niceness a worker of the connected cluster runs at; warns when it is above 0 (Ray's
    default is 15: see ``worker_pool_config``), which only the cluster's operator can change. None
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


_MMAP_PINNED = False


def pin_mmap_threshold(nbytes: int = 1 << 20) -> bool:
    """Make glibc serve every allocation >= ``nbytes`` with its own mmap, returned to the OS on free.

    glibc raises its mmap threshold (up to 32 MB) each time a large mmapped block is freed, after
    which our 10-40 MB batch buffers come from per-thread heap arenas that keep their pages: the
    driver's RSS then climbs for a few epochs (measured +350 MB over 3 epochs of 20k images) before
    it levels off. Fixing the threshold keeps RSS flat. No-op (False) off glibc.
    """
    global _MMAP_PINNED
    if _MMAP_PINNED:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_mmap_threshold = -3
        _MMAP_PINNED = bool(libc.mallopt(m_mmap_threshold, int(nbytes)))
    except (OSError, AttributeError):
        return False
    return _MMAP_PINNED


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
