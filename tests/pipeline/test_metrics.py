"""A rank's metrics without Ray: the figures an epoch sends equal its report, the served endpoint
(``raypipe run --metrics-port``) and a port already taken, the documented contract and the dashboard."""

from __future__ import annotations

import json
import re
import shutil
import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from image_factory import truncated_jpeg
from prometheus_client.parser import text_string_to_metric_families
from test_in_process_stream import _in_process, _pipe

from raypipe.kernels.errors import REASONS
from raypipe.pipeline import metrics
from raypipe.pipeline.epoch_source import EpochSource

ROOT = Path(__file__).resolve().parents[2]


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(series, sorted labels): value}`` of a Prometheus text page."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels) -> float:
    """The sum over the series ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


@pytest.fixture
def served(monkeypatch):
    """This process's series go to a registry of their own (as ``serve`` sets up, without the HTTP port)."""
    sink = metrics._PromSink()
    monkeypatch.setattr(metrics, "_served", sink)
    return sink


def _page(sink) -> dict:
    from prometheus_client import generate_latest

    return _samples(generate_latest(sink.registry).decode())


def test_an_epochs_counters_equal_its_report_and_the_gauges_are_there(sample_dir, tmp_path, monkeypatch, served):
    data = tmp_path / "data"
    shutil.copytree(sample_dir, data)
    for bad in sorted(data.rglob("*.jpg"))[3:6]:
        bad.write_bytes(truncated_jpeg())
    pipe = _pipe(data, max_skip_ratio=0.5)
    _in_process(pipe, monkeypatch)
    source = EpochSource(pipe, rank=1, world_size=2, end_epoch=2)
    for _ in range(2):
        list(source)
    page = _page(served)
    emitted = sum(r.emitted for r in source.reports)
    skipped: dict[str, int] = {}
    for r in source.reports:
        for reason, n in r.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
    assert emitted > 0 and sum(skipped.values()) > 0
    tags = {"run": "raypipe", "rank": "1"}
    assert _value(page, "ray_raypipe_images_emitted_total", **tags) == emitted
    for reason, n in skipped.items():
        assert _value(page, "ray_raypipe_images_skipped_total", reason=reason, **tags) == n
    chunks = _value(page, "ray_raypipe_chunks_made_total", **tags)
    assert chunks > 0 and _value(page, "ray_raypipe_chunk_latency_seconds_count", **tags) == chunks
    assert _value(page, "ray_raypipe_augment_cpu_seconds_per_image_count", **tags) == chunks
    assert _value(page, "ray_raypipe_epoch", **tags) == 1
    assert _value(page, "ray_raypipe_epoch_batches", **tags) == len(source)
    for gauge in ("wait_share", "width_wanted", "workers_running", "workers_pending", "chunks_ready_ahead"):
        assert any(n == f"ray_raypipe_{gauge}" for n, _ in page), gauge


def test_the_run_name_is_a_tag_and_a_reason_outside_the_set_is_other(served):
    rec = metrics.metrics_for("exp-7", 0)
    import numpy as np

    block = {"ok": np.array([True, False, False]), "reason": np.array(["", "truncated", "/data/x.jpg"], dtype=object)}
    rec.block(block)
    rec.flush()
    page = _page(served)
    assert _value(page, "ray_raypipe_images_skipped_total", run="exp-7", reason="truncated") == 1
    assert _value(page, "ray_raypipe_images_skipped_total", run="exp-7", reason="other") == 1
    assert not any("/data/x.jpg" in str(labels) for _, labels in page)


def test_nothing_is_recorded_where_nothing_exports(monkeypatch):
    monkeypatch.setattr(metrics, "_served", None)
    ray = __import__("sys").modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.skip("Ray is up in this process")
    assert metrics.metrics_for("x", 0) is metrics.NULL and not metrics.NULL.enabled


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_servers():
    for server in metrics._servers:
        if isinstance(server, tuple):
            server[0].shutdown()
            server[0].server_close()
    metrics._servers.clear()


def test_serve_answers_on_loopback_with_the_exported_names(monkeypatch):
    monkeypatch.setattr(metrics, "_served", None)
    port = _free_port()
    try:
        assert metrics.serve(port)
        rec = metrics.metrics_for("served", 0)
        rec.batch(8)
        rec.flush()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()  # noqa: S310
    finally:
        _stop_servers()
    assert _value(_samples(text), "ray_raypipe_images_emitted_total", run="served", rank="0") == 8


def test_a_port_already_taken_is_one_line_and_no_metrics(monkeypatch, capsys):
    monkeypatch.setattr(metrics, "_served", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert metrics.serve(port) is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{port}" in err[0] and "goes on without them" in err[0]
    assert metrics._served is None


def _docs_table() -> list[tuple[str, str, tuple[str, ...]]]:
    text = (ROOT / "docs" / "cluster.md").read_text()
    rows = re.findall(r"^\| `(raypipe_\w+)` \| (\w+) \| ([\w, ]+) \|", text, flags=re.M)
    return [(name, kind, tuple(t.strip() for t in tags.split(","))) for name, kind, tags in rows]


def test_the_documented_table_is_the_codes_list():
    assert _docs_table() == [(m.name, m.kind, m.tags) for m in metrics.METRICS]


def test_tags_are_bounded_sets():
    tags = {t for m in metrics.METRICS for t in m.tags}
    assert tags == {"run", "rank", "reason", "backend", "source"}
    assert metrics.OTHER_REASON not in REASONS


def test_the_dashboard_loads_and_every_query_names_an_exported_series():
    dash = json.loads((ROOT / "deploy" / "grafana" / "raypipe.json").read_text())
    exported = {n for m in metrics.METRICS for n in metrics.exported_names(m)}
    titles, named = [], set()
    for panel in dash["panels"]:
        titles.append(panel["title"])
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\bray_\w+", target["expr"]))
            assert names and names <= exported, (panel["title"], names - exported)
            named |= names
    for want in ("Images/s", "Stall", "Skipped", "Width", "latency"):
        assert any(want.lower() in t.lower() for t in titles), want
    for var in dash["templating"]["list"]:
        assert set(re.findall(r"\bray_\w+", var.get("definition", ""))) <= exported
    # every series but the sums and counts the quantiles leave out has a panel
    assert {n for n in exported if not n.endswith(("_sum", "_count"))} <= named


class _Calls:
    """A sink that keeps what it was sent."""

    def __init__(self):
        self.sent: list[tuple[str, str, float, dict]] = []

    def inc(self, name, value, tags):
        self.sent.append(("inc", name, value, tags))

    def observe(self, name, value, tags):
        self.sent.append(("observe", name, value, tags))

    def set(self, name, value, tags):
        self.sent.append(("set", name, value, tags))


def test_counts_and_gauges_go_out_once_per_interval_with_the_wait_share_of_that_interval():
    now = [0.0]
    sink = _Calls()
    rec = metrics._Recording(sink, "r", 2, clock=lambda: now[0])
    probe_calls = []

    def probe():
        probe_calls.append(now[0])
        return {"raypipe_width_wanted": 3}

    for _ in range(10):  # per batch and per chunk: kept here, nothing sent before the interval
        rec.batch(8)
        rec.chunk("nodes", 0.5)
        rec.tick(probe)
    assert sink.sent == [] and probe_calls == []
    rec.waited(1.25)
    now[0] = metrics.INTERVAL_S
    rec.tick(probe)
    sent = {(kind, name): value for kind, name, value, _ in sink.sent if kind != "observe"}
    assert sent[("inc", "raypipe_images_emitted")] == 80 and sent[("inc", "raypipe_chunks_made")] == 10
    assert sent[("set", "raypipe_wait_share")] == 1.25 / metrics.INTERVAL_S
    assert sent[("set", "raypipe_width_wanted")] == 3 and sent[("set", "raypipe_epoch_batches")] == 10
    assert sum(1 for kind, *_ in sink.sent if kind == "observe") == 10 and probe_calls == [metrics.INTERVAL_S]
    assert all(tags["rank"] == "2" and tags["run"] == "r" for *_, tags in sink.sent)
    sink.sent.clear()
    rec.tick(probe)  # nothing new, not due
    assert sink.sent == []


def test_a_failing_backend_is_one_warning_and_then_nothing(caplog):
    class Broken(_Calls):
        def inc(self, name, value, tags):
            raise RuntimeError("agent gone")

    rec = metrics._Recording(Broken(), "r", 0)
    rec.batch(4)
    rec.flush()
    rec.batch(4)
    rec.flush()
    assert len([r for r in caplog.records if "metrics not sent" in r.getMessage()]) == 1


def test_a_mixtures_good_rows_are_counted_by_source():
    sink = _Calls()
    rec = metrics._Recording(sink, "r", 0, clock=lambda: 0.0)
    ok = np.array([True, True, False, True, True])
    fields = {"source": np.array([0, 1, 1, 0, 2]), "take": np.arange(5)}
    rec.block({"ok": ok, "reason": np.array(["", "", "truncated", "", ""], object), "fields": fields})
    rec.block({"ok": np.ones(2, bool), "reason": np.array(["", ""], object)})  # one dataset's: no source
    rec.flush()
    by_source = {tags["source"]: value for kind, name, value, tags in sink.sent if name == "raypipe_images_by_source"}
    assert by_source == {"0": 2, "1": 1, "2": 1}
