"""Several datasets on the commands: ``raypipe run``, ``scan`` and ``preview`` take them as positional
arguments, as ``--data`` flags or as a config's ``data:`` list, show each one's share, and count what
each gave. No Ray starts: local workers, in-process."""

from __future__ import annotations

import json

import pytest
import yaml
from image_factory import truncated_jpeg, write_captioned_shards

from raypipe.cli.main import main as cli
from raypipe.sample_data import write_sample_data

RUN = ["run", "--epochs", "2", "-b", "4", "--img-size", "32", "--backend", "local"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    write_sample_data(str(root / "a"), classes=2, per_class=8, workers=1)
    write_sample_data(str(root / "b"), classes=2, per_class=5, workers=1)
    write_captioned_shards(root / "shards", n=10, per_shard=5)
    write_captioned_shards(root / "more", n=14, per_shard=5)
    return root


def _run(args, out):
    assert cli([*RUN, *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_run_takes_each_datasets_share_every_epoch(data, tmp_path, capsys):
    a, b = str(data / "a"), str(data / "b")
    report = _run([a, b, "--weights", "3", "1", "--samples-per-epoch", "12"], tmp_path / "r.json")
    assert [(p["path"], p["rows"], p["takes"]) for p in report["parts"]] == [(a, 16, 9), (b, 10, 3)]
    for epoch in report["epochs"]:
        assert epoch["emitted"] == epoch["expected"] == 12
        assert epoch["by_source"] == {"0": 9, "1": 3}
    out = capsys.readouterr().out
    assert f"source 0: {a}: 16 rows, weight 3, takes 9 an epoch (75.0 %" in out
    assert "by source: 0=9, 1=3" in out


def test_the_data_flags_and_a_configs_data_list_are_the_positional_datasets(data, tmp_path):
    a, b = str(data / "a"), str(data / "b")
    positional = _run([a, b, "--weights", "2", "1"], tmp_path / "p.json")
    flags = _run(["--data", a, "--data", b, "--weights", "2", "1"], tmp_path / "f.json")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"data": [{"path": a, "weight": 2}, {"path": b, "weight": 1}]}))
    from_file = _run(["-c", str(config)], tmp_path / "c.json")
    hashes = [[e["content_sha256"] for e in r["epochs"]] for r in (positional, flags, from_file)]
    assert hashes[0] == hashes[1] == hashes[2] and hashes[0][0] != hashes[0][1]
    assert positional["parts"] == flags["parts"] == from_file["parts"]


def test_scan_reads_every_row_of_each_dataset_once_and_names_a_bad_ones_source(data, tmp_path):
    bad = tmp_path / "b"
    write_sample_data(str(bad), classes=2, per_class=3, workers=1)
    victim = sorted((bad / sorted(p.name for p in bad.iterdir() if p.is_dir())[0]).iterdir())[0]
    victim.write_bytes(truncated_jpeg())
    out = tmp_path / "scan.json"
    assert cli(["scan", str(data / "a"), str(bad), "--weights", "9", "1", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["total"] == 16 + 6 and report["ok"] == 21  # every row once, whatever the weights
    (skip,) = report["skipped_paths"]
    assert skip["source"] == 1 and skip["path"].endswith(victim.name)


def test_preview_names_each_samples_source_and_shows_a_parts_own_fields(data, tmp_path, capsys):
    config = tmp_path / "job.yaml"
    parts = [{"path": str(data / "shards"), "fields": ["txt"]}, {"path": str(data / "more")}]
    config.write_text(yaml.safe_dump({"data": parts}))
    assert cli(["preview", "-c", str(config), "--out", str(tmp_path / "g.png"), "--count", "12"]) == 0
    lines = [s.strip() for s in capsys.readouterr().out.splitlines() if s.strip().startswith("#")]
    assert len(lines) == 12
    sources = {line[1:].split(":")[0] for line in lines}
    assert sources == {"0", "1"}  # the first batch holds both, about at their shares (10 and 14 rows)
    for line in lines:
        source, sid = (int(x) for x in line[1:].split(":")[:2])
        assert line.endswith(f"txt=caption {sid}" if source == 0 else "txt=None")


@pytest.mark.parametrize(
    "args, words",
    [
        (["A", "B", "--weights", "1"], "1 weight(s) for 2 dataset(s)"),
        (["A", "B", "--index", "x.parquet"], "--index with several datasets"),
        ([], "no dataset"),
        (["A", "--weights", "-1"], "finite number >= 0"),
    ],
)
def test_a_bad_mixture_on_the_command_line_is_one_line(args, words, capsys):
    assert cli(["run", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
