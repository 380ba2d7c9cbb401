"""The training job on several datasets: ``--data`` given again (or a config's ``data:`` list) with
``--weights`` is a mixture; each dataset is split train/eval as one dataset is, training mixes what is
left, and eval reads every held-out row of each once."""

from __future__ import annotations

import json

import pytest
import yaml
from train_helpers import tiny_job

from raypipe.sample_data import write_sample_data
from raypipe.sources.data_parts import DataPart, DataParts
from raypipe.train.args import parse_job
from raypipe.train.data import job_rows


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    write_sample_data(str(root / "a"), classes=2, per_class=10, workers=1)
    write_sample_data(str(root / "b"), classes=3, per_class=6, workers=1)
    return str(root / "a"), str(root / "b")


def test_data_given_again_with_weights_is_a_mixture_and_once_is_that_dataset():
    job = parse_job(["--data", "a", "--data", "b", "--weights", "2", "1", "--samples-per-epoch", "9"])
    assert job.data == DataParts((DataPart("a", 2.0), DataPart("b", 1.0)), 9)
    assert parse_job(["--data", "a"]).data == "a"
    assert parse_job(["--data", "a", "--samples-per-epoch", "5"]).data == DataParts((DataPart("a"),), 5)


def test_the_configs_data_list_and_the_flags_over_it(tmp_path, capsys):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"data": [{"path": "a", "weight": 3}, {"path": "b", "weight": 1}]}))
    assert parse_job(["-c", str(config)]).data == DataParts((DataPart("a", 3.0), DataPart("b", 1.0)))
    assert parse_job(["-c", str(config), "--data", "c"]).data == "c"  # the command line's data replaces it
    spe = parse_job(["-c", str(config), "--samples-per-epoch", "40"]).data
    assert spe.samples_per_epoch == 40
    twice = tmp_path / "twice.yaml"
    twice.write_text(yaml.safe_dump({"data": ["a", "b"], "train": {"data": "c"}}))
    for argv, words in (
        (["-c", str(twice)], "data is named twice"),
        (["-c", str(config), "--weights", "1", "1"], "their weights are set there"),
        (["--weights", "1"], "are for the --data datasets"),
        (["--data", "a", "--data", "b", "--weights", "1"], "1 weight(s) for 2 dataset(s)"),
    ):
        with pytest.raises(SystemExit):
            parse_job(argv)
        assert words in capsys.readouterr().err


def test_each_dataset_is_split_as_alone_and_eval_reads_every_held_out_row_once(folders):
    a, b = folders
    train, val, described = job_rows(parse_job(["--data", a, "--data", b, "--weights", "1", "1", "--val-split", "0.3"]))
    assert described == f"{a} (1) + {b} (1)"
    assert train.classes == val.classes and len(train.classes) == 3  # one class space by name
    assert train.weights == (1.0, 1.0) and val.takes == val.sizes  # eval: each held-out row once
    for part, path in enumerate((a, b)):
        alone_train, alone_val, _ = job_rows(parse_job(["--data", path, "--val-split", "0.3"]))
        assert _ids(train.parts[part]) == _ids(alone_train) and _ids(val.parts[part]) == _ids(alone_val)
        assert _ids(val.parts[part]) and not set(_ids(train.parts[part])) & set(_ids(val.parts[part]))


def _ids(rows) -> list[int]:
    return sorted(rows.table.column("sample_id").to_pylist())


@pytest.mark.timeout(300)
def test_the_job_trains_a_mixture_and_evaluates_every_held_out_row(ray_local, folders, tmp_path):
    from raypipe.train.run import run_training

    a, b = folders
    job = tiny_job(
        a,
        tmp_path / "runs",
        "mix",
        "--data",
        b,
        "--weights",
        "3",
        "1",
        "--samples-per-epoch",
        "24",
        "--epochs",
        "2",
        "--record-ids",
    )
    run_training(job)
    metrics = json.loads((tmp_path / "runs" / "mix" / "metrics.json").read_text())
    _, val, _ = job_rows(job)
    assert len(metrics) == 2
    for m in metrics:
        assert m["emitted"] == m["expected"] == 24 and not m["skipped"]
        assert m["eval_samples"] == len(val) == sum(val.sizes)
    for epoch in range(2):  # a mixture's recorded ids are its takes: each position of the epoch once
        recorded = json.loads((tmp_path / "runs" / "mix" / "ids" / f"epoch{epoch:04d}_rank000.json").read_text())
        assert sorted(recorded) == list(range(24))
