"""``raypipe run --metrics-port``: a run on local workers (no Ray) serves its series on loopback, equal to
its report; a port already taken is one line and the run goes on."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.request

import pytest
from image_factory import truncated_jpeg
from prometheus_client.parser import text_string_to_metric_families

from raypipe.cli.main import main as cli
from raypipe.pipeline import metrics

pytestmark = pytest.mark.timeout(240)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sum(text: str, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and want <= set(s.labels.items())
    )


@pytest.fixture
def no_server(monkeypatch):
    monkeypatch.setattr(metrics, "_served", None)
    yield
    for server in metrics._servers:
        if isinstance(server, tuple):
            server[0].shutdown()
            server[0].server_close()
    metrics._servers.clear()


def test_a_local_run_serves_counters_equal_to_its_report(sample_dir, tmp_path, capsys, no_server):
    data = tmp_path / "data"
    shutil.copytree(sample_dir, data)
    for bad in sorted(data.rglob("*.jpg"))[:2]:
        bad.write_bytes(truncated_jpeg())
    port, out = _free_port(), tmp_path / "run.json"
    args = ["run", str(data), "--backend", "local", "--epochs", "2", "-b", "8", "--img-size", "32"]
    assert cli([*args, "--max-skip-ratio", "0.5", "--metrics-port", str(port), "--json", str(out)]) == 0
    assert f"metrics on http://127.0.0.1:{port}/metrics" in capsys.readouterr().out
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()  # noqa: S310
    epochs = json.loads(out.read_text())["epochs"]
    assert _sum(text, "ray_raypipe_images_emitted_total", rank="0") == sum(e["emitted"] for e in epochs) == 92
    for reason in {r for e in epochs for r in e["skipped"]}:
        n = sum(e["skipped"].get(reason, 0) for e in epochs)
        assert _sum(text, "ray_raypipe_images_skipped_total", reason=reason) == n
    assert _sum(text, "ray_raypipe_chunks_made_total") > 0
    assert "ray_raypipe_wait_share{" in text and "ray_raypipe_workers_running{" in text


def test_a_port_already_taken_is_one_line_and_the_run_goes_on(sample_dir, tmp_path, capsys, no_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc = cli(
            ["run", str(sample_dir), "--backend", "local", "-b", "16", "--img-size", "32", "--metrics-port", str(port)]
        )
    assert rc == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if "metrics" in line]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0]
    assert "epoch 0: emitted 48/48" in captured.out


def test_a_port_out_of_range_is_a_user_error(sample_dir):
    assert cli(["run", str(sample_dir), "--metrics-port", "70000"]) == 2
