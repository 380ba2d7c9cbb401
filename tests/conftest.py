"""Shared fixtures (a small local Ray, started once and re-started after multi-node tests; data), and the
suite's tiers: markers set from a test's folder and fixtures (tests/tiers.py)."""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
from tiers import ray_sessions, tier_markers

_TESTS = pathlib.Path(__file__).resolve().parent
_RAY_TEMP = pathlib.Path(os.environ.get("RAY_TMPDIR") or "/tmp")  # Ray's default temp dir

os.environ.setdefault("RAYPIPE_NO_PROGRESS", "1")
# Remote folders' images are cached in ~/.cache/raypipe unless this says otherwise: the suite's tests
# count the requests each epoch makes and must not share a cache through the home folder; the tests of
# the cache (tests/sources/test_cache.py) set its folder, or unset it, themselves. Ray's and local workers
# inherit it.
os.environ.setdefault("RAYPIPE_CACHE_DIR", "off")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its tiers; skip tests marked needs_cuda on machines without a GPU (CI has none)."""
    for item in items:
        room = pathlib.Path(str(item.path)).resolve().relative_to(_TESTS).parts[0]
        for name in tier_markers(room, item.fixturenames, (m.name for m in item.iter_markers())):
            item.add_marker(name)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "needs_cuda" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run tests marked ``isolated`` in a child pytest process.

    Multi-node tests start and stop a ``ray.cluster_utils.Cluster``; when its GCS goes away, a Ray
    client thread left in the process can end the whole interpreter (pytest exits 1 with no report).
    In a child process that can only fail the one test. The parent's own Ray is shut down first (the
    next test that needs it starts a new one): a driver whose Ray dies under it also ends the whole
    interpreter, and a second Ray session beside a child's cluster on a small machine is where that
    has happened (CI's pytest exited 1 with no report right after the Ray Train recipe's child).
    ``isolated(env={...})`` sets variables in the child's environment from its start (Ray reads some,
    ``RAY_AUTH_MODE`` among them, only when it is imported).
    """
    if "isolated" not in pyfuncitem.keywords or os.environ.get("RAYPIPE_ISOLATED_CHILD"):
        return None
    import ray

    from raypipe.runtime import wait_connected

    wait_connected(120)  # not shut down half-way through a background start
    ray.shutdown()
    env = dict(
        os.environ, **pyfuncitem.get_closest_marker("isolated").kwargs.get("env", {}), RAYPIPE_ISOLATED_CHILD="1"
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        pyfuncitem.nodeid,
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(pyfuncitem.config.rootpath),
    ]
    marker = pyfuncitem.get_closest_marker("timeout")
    limit = (marker.args[0] if marker and marker.args else 600) - 10
    proc = subprocess.run(cmd, cwd=pyfuncitem.config.rootpath, env=env, capture_output=True, text=True, timeout=limit)
    if proc.returncode != 0:
        pytest.fail(
            f"isolated run failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    return True


def pytest_addoption(parser):
    parser.addoption(
        "--check-tiers",
        action="store_true",
        help="fail a test outside the ray tier that starts a Ray in any process (a new session folder in "
        "Ray's temp dir): for a machine where nothing else starts Ray meanwhile, as CI's",
    )


@pytest.fixture(autouse=True)
def _ray_starts_only_in_the_ray_tier(request):
    """A test outside the ``ray`` tier that leaves a Ray running in this process (or, with
    ``--check-tiers``, starts one in any process) fails: its tier is wrong, and the README's command
    would start a cluster."""
    if request.node.get_closest_marker("ray"):
        yield
        return
    ray = sys.modules.get("ray")
    before = ray is not None and ray.is_initialized()
    sessions = ray_sessions(_RAY_TEMP) if request.config.getoption("--check-tiers") else None
    yield
    ray = sys.modules.get("ray")
    if not before and ray is not None and ray.is_initialized():
        pytest.fail(f"{request.node.nodeid} starts Ray: mark it pytest.mark.ray", pytrace=False)
    if sessions is not None and (new := ray_sessions(_RAY_TEMP) - sessions):
        pytest.fail(f"{request.node.nodeid} started a Ray ({sorted(new)}): mark it pytest.mark.ray", pytrace=False)


@pytest.fixture(autouse=True)
def _restore_rng_state():
    """Tests must not depend on (or leak) global RNG state."""
    py, npy = random.getstate(), np.random.get_state()
    yield
    random.setstate(py)
    np.random.set_state(npy)


@pytest.fixture
def ray_local():
    """A local 2-CPU Ray with no dashboard; kept across tests, restarted if a test shut it down."""
    import ray

    from raypipe.runtime import wait_connected, worker_pool_env

    wait_connected(120)  # a background start an earlier test's loader left under way: never two ray.init at once
    if not ray.is_initialized():
        for key, value in worker_pool_env(2).items():  # as raypipe.runtime.connect starts one
            os.environ.setdefault(key, value)
        ray.init(
            address="local",  # never join a cluster some other process started on this machine
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=300 * 1024 * 1024,
            logging_level="WARNING",
        )
    yield ray


_SESSION = pytest.StashKey()


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_SESSION] = session
    try:
        import ray

        from raypipe.runtime import wait_connected

        wait_connected(120)  # a background start under way: its Ray is shut down, not orphaned
        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001
        pass


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the suite's process with pytest's status once everything is reported, without finalizing
    the interpreter. After a thousand tests the process holds what they left in native code: threads of
    deadlines that timed out inside a network client, pyarrow's and obstore's S3 clients kept by
    per-process caches, Ray's core worker after its shutdown. Finalizing the interpreter under them can
    crash it (signal 11 after every test passed): a dependency's teardown, not a test's result. How
    raypipe's own processes end is tested in processes of their own: the command and the training job
    after a timed-out listing (test_timeouts.py), a script that exits with a loader's pass unfinished
    (test_device_loader.py), a script that read an object store (test_process_exit.py)."""
    session = config.stash.get(_SESSION, None)
    if session is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(session.exitstatus))


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory):
    """A small image-folder dataset of real-photo JPEGs (4 classes x 12)."""
    from raypipe.sample_data import write_sample_data

    out = tmp_path_factory.mktemp("sample")
    write_sample_data(out, classes=4, per_class=12, seed=1)
    return out


@pytest.fixture
def row_group_reads(monkeypatch):
    """The row groups this process reads from Parquet files from now on, in order (a list it fills)."""
    import pyarrow.parquet as pq

    reads: list[int] = []
    real = pq.ParquetFile.read_row_group

    def counted(self, i, *args, **kwargs):
        reads.append(i)
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    return reads
