"""The real path: a Ray head started with `ray start` on 127.0.0.1 (token auth on), the job sent
with `ray job submit --working-dir`, metrics read back. Only the process group started here is
stopped (never `ray stop`, which would hit every Ray on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from train_helpers import REPO, tiny_args, tiny_dataset

pytestmark = [pytest.mark.ray, pytest.mark.cluster]

RAY_BIN = Path(sys.executable).parent / "ray"


def _free_ports(n: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _free_range(size: int) -> int:
    """A base port with ``size`` consecutive free ports after it."""
    for base in range(30000 + os.getpid() % 200 * 100, 60000, 137):
        try:
            with ExitStack() as stack:
                for port in range(base, base + size):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def _wait_http(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)  # noqa: S310 - our own 127.0.0.1 dashboard
            return
        except urllib.error.HTTPError:
            return  # it answers (401 without a token is fine: it is up)
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    raise TimeoutError(f"dashboard at {url} did not come up")


@pytest.fixture
def ray_head(tmp_path):
    workers = _free_range(60)
    ports = _free_ports(9)
    while any(workers <= p < workers + 60 for p in ports):  # ray start refuses a port inside the range
        ports = _free_ports(9)
    gcs, dash, client, nm, om, ag_listen, ag_grpc, metrics, renv = ports
    temp_dir = tempfile.mkdtemp(prefix="rp", dir="/tmp")  # unix socket paths must stay < 100 chars
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_worker_niceness": "0",
        "RAY_num_workers_soft_limit": "8",
    }  # as cluster.yaml's nodes
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(RAY_BIN),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={client}",
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--dashboard-agent-listen-port={ag_listen}",
        f"--dashboard-agent-grpc-port={ag_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={renv}",
        f"--min-worker-port={workers}",
        f"--max-worker-port={workers + 59}",
        f"--temp-dir={temp_dir}",
        "--num-cpus=2",
    ]
    log = open(tmp_path / "head.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{dash}/api/version", 120, proc)
        yield f"http://127.0.0.1:{dash}", env
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.timeout(300)
def test_job_submission_runs_and_writes_metrics(ray_head, tmp_path):
    address, env = ray_head
    data = tiny_dataset(tmp_path / "data", per_class=6, corrupt=1)
    storage = tmp_path / "runs"
    sid = f"raypipe-test-{os.getpid()}-{int(time.time())}"
    submit = [
        str(RAY_BIN),
        "job",
        "submit",
        "--address",
        address,
        "--submission-id",
        sid,
        "--working-dir",
        str(REPO),
        "--",
        "python",
        "jobs/train.py",
        *tiny_args(data, storage, "submitted", "--epochs", "2"),
    ]
    out = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=270)
    tail = (out.stdout + out.stderr)[-4000:]
    assert out.returncode == 0, tail
    status = subprocess.run(
        [str(RAY_BIN), "job", "status", "--address", address, sid], env=env, capture_output=True, text=True, timeout=60
    )
    assert "succeeded" in (status.stdout + status.stderr).lower(), tail
    metrics = json.loads((storage / "submitted" / "metrics.json").read_text())
    assert [m["epoch"] for m in metrics] == [0, 1]
    assert metrics[-1]["emitted"] + sum(metrics[-1]["skipped"].values()) == metrics[-1]["expected"]
    assert "epoch 2/2" in out.stdout  # the per-epoch lines reach the submitter's log
    # ... once each (a plain print went through Ray Train's print-to-logger patch and came twice)
    assert [out.stdout.count(f"epoch {e}/2  loss") for e in (1, 2)] == [1, 1], tail
    # Ray's own lines (Ray Train's per-report and per-checkpoint INFO, a C++ warning from its controller)
    # are left out of the job's output without -v (test_train_worker_death.py sees them with -v)
    for ray_line in ("Reporting training result", "Checkpoint successfully created", "PreemptionWatcher"):
        assert ray_line not in out.stdout + out.stderr, tail
