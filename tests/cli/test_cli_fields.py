"""``--fields`` on the commands: ``scan`` counts a sample without one, ``preview`` prints them, ``run``
carries them, and a bad name is a one-line error (exit 2). No Ray starts: local workers, in-process."""

from __future__ import annotations

import json

import pytest
from image_factory import write_captioned_shards

from raypipe.cli.main import main as cli


@pytest.fixture
def shards(tmp_path):
    write_captioned_shards(tmp_path / "shards", n=12, without_txt={3})
    return tmp_path / "shards"


def test_scan_counts_a_sample_without_a_named_field_as_missing_field(shards, tmp_path):
    out = tmp_path / "scan.json"
    assert cli(["scan", str(shards), "--fields", "txt", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["skipped"] == {"missing_field": 1} and report["ok"] == 11
    assert report["skipped_paths"][0]["sample_id"] == 3


def test_preview_prints_each_samples_fields(shards, tmp_path, capsys):
    assert (
        cli(["preview", str(shards), "--fields", "txt", "json", "--out", str(tmp_path / "g.png"), "--count", "4"]) == 0
    )
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("#")]
    assert len(lines) == 4
    for line in lines:
        sid = int(line[1:].split(":")[0])
        assert line == f"#{sid}: txt=caption {sid}, json={{'i': {sid}}}"


def test_run_carries_fields_on_local_workers(shards, tmp_path):
    out = tmp_path / "run.json"
    args = ["run", str(shards), "--fields", "txt", "--epochs", "1", "-b", "4", "--img-size", "32"]
    assert cli([*args, "--max-skip-ratio", "0.5", "--backend", "local", "--json", str(out)]) == 0
    epoch = json.loads(out.read_text())["epochs"][0]
    assert epoch["emitted"] == 11 and epoch["skipped"] == {"missing_field": 1}


def test_a_reserved_field_name_is_a_one_line_error(shards, capsys):
    assert cli(["scan", str(shards), "--fields", "label"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fields" in err[0] and "label" in err[0]
