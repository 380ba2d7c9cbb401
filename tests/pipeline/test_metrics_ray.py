"""Seen from the cluster: a driver joined to a Ray head started with ``--metrics-export-port`` runs epochs
through the README's API (``raypipe.connect()``, ``FeederSource``, ``from_timm_args``) over data with cut
JPEGs; the head's Prometheus endpoint then shows raypipe's counters equal to the run's own reports and
its gauges. Only the process group started here is ended (never ``ray stop``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from image_factory import truncated_jpeg
from prometheus_client.parser import text_string_to_metric_families

from raypipe.sample_data import write_sample_data
from raypipe.testing.free_ports import free_ports

pytestmark = [pytest.mark.ray, pytest.mark.cluster, pytest.mark.timeout(420)]

RAY_BIN = Path(sys.executable).parent / "ray"
REPO = Path(__file__).resolve().parents[2]
RUN = "metrics-test"

DRIVER = textwrap.dedent(
    """
    import json, sys
    import raypipe
    from raypipe import FeederSource, Pipeline, PipelineConfig, TrainAugment, from_timm_args

    raypipe.connect()  # joins RAY_ADDRESS
    pipe = Pipeline(sys.argv[1], TrainAugment(input_size=32), config=PipelineConfig(batch_size=8, seed=1,
                    max_skip_ratio=0.5))
    source = FeederSource(pipe, end_epoch=2)
    with from_timm_args(source, device="cpu", num_classes=pipe.rows.num_classes) as loader:
        for epoch in range(2):
            for batch in loader:
                pass
    print("REPORTS " + json.dumps([r.as_dict() for r in source.reports]), flush=True)
    sys.stdin.readline()  # the feeder (and its metrics) stays until the test has read the endpoint
    """
)


def _end_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def head(tmp_path):
    """A Ray head on 127.0.0.1 with a metrics port: (its address, the metrics URL, the environment)."""
    gcs, nm, om, ag_listen, ag_grpc, metrics, renv, dash = free_ports(8)
    temp_dir = tempfile.mkdtemp(prefix="rpm", dir="/tmp")  # unix socket paths must stay < 100 chars
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",  # as cluster.yaml's nodes (the driver sends ~/.ray/auth_token)
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_worker_niceness": "0",
        "RAY_num_workers_soft_limit": "8",
        "RAY_metrics_report_interval_ms": "2000",
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(RAY_BIN),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--include-dashboard=false",
        f"--dashboard-port={dash}",
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--dashboard-agent-listen-port={ag_listen}",
        f"--dashboard-agent-grpc-port={ag_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={renv}",
        f"--temp-dir={temp_dir}",
        "--num-cpus=2",
    ]
    log_path = tmp_path / "head.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{metrics}/metrics"
            deadline = time.monotonic() + 120
            while True:  # up once its metrics endpoint answers
                if proc.poll() is not None:
                    raise RuntimeError(f"ray start exited: {log_path.read_text()[-2000:]}")
                try:
                    urllib.request.urlopen(url, timeout=2)  # noqa: S310 - our own loopback endpoint
                    break
                except (urllib.error.URLError, OSError):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{url} did not answer: {log_path.read_text()[-2000:]}") from None
                    time.sleep(1)
            yield f"127.0.0.1:{gcs}", url, env
        finally:
            _end_group(proc)
            shutil.rmtree(temp_dir, ignore_errors=True)


def _series(url: str) -> list:
    text = urllib.request.urlopen(url, timeout=10).read().decode()  # noqa: S310 - our own loopback endpoint
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _sum(samples, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(s.value for s in samples if s.name == name and want <= set(s.labels.items()))


def test_the_heads_endpoint_shows_counters_equal_to_the_reports_and_the_gauges(head, tmp_path):
    address, url, env = head
    data = tmp_path / "data"
    write_sample_data(data, classes=3, per_class=8, seed=4)
    for bad in sorted(data.rglob("*.jpg"))[::7]:
        bad.write_bytes(truncated_jpeg())
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver_env = {**env, "RAY_ADDRESS": address, "RAYPIPE_RUN_NAME": RUN, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen(
        [sys.executable, str(script), str(data)],
        env=driver_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        lines = []
        for line in driver.stdout:
            lines.append(line)
            if line.startswith("REPORTS "):
                break
        else:
            pytest.fail("the driver ended without its reports:\n" + "".join(lines[-40:]))
        reports = json.loads(line[len("REPORTS ") :])
        emitted = sum(r["emitted"] for r in reports)
        skipped: dict[str, int] = {}
        for r in reports:
            for reason, n in r["skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + n
        assert len(reports) == 2 and emitted > 0 and sum(skipped.values()) == 2 * 4
        tags = {"run": RUN, "rank": "0"}
        deadline, samples = time.monotonic() + 90, []
        while time.monotonic() < deadline:  # Ray's agent exports every few seconds
            samples = _series(url)
            got = _sum(samples, "ray_raypipe_images_emitted_total", **tags)
            got_skips = {r: _sum(samples, "ray_raypipe_images_skipped_total", reason=r, **tags) for r in skipped}
            if got == emitted and got_skips == skipped:
                break
            time.sleep(2)
        names = {s.name for s in samples if s.labels.get("run") == RUN}
        assert _sum(samples, "ray_raypipe_images_emitted_total", **tags) == emitted, sorted(names)
        for reason, n in skipped.items():
            assert _sum(samples, "ray_raypipe_images_skipped_total", reason=reason, **tags) == n
        for gauge in ("wait_share", "width_wanted", "workers_running", "workers_pending", "chunks_ready_ahead"):
            assert f"ray_raypipe_{gauge}" in names, sorted(names)
        assert {"ray_raypipe_epoch", "ray_raypipe_epoch_batches", "ray_raypipe_chunks_made_total"} <= names
        assert "ray_raypipe_chunk_latency_seconds_bucket" in names
        assert "ray_raypipe_augment_cpu_seconds_per_image_count" in names
        assert _sum(samples, "ray_raypipe_epoch", **tags) == 1
    finally:
        try:
            driver.stdin.write("\n")
            driver.stdin.flush()
            driver.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _end_group(driver)
