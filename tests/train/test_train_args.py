"""Training job flags and YAML: precedence, strictness, what reaches the pipeline configs."""

from __future__ import annotations

import pytest

from raypipe.train.args import DEFAULTS, TrainJobConfig, parse_job

pytestmark = pytest.mark.timeout(60)


def _yaml(tmp_path, text: str) -> str:
    p = tmp_path / "job.yaml"
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_defaults_are_the_embedded_job():
    job = parse_job([])
    assert job.data is None and job.model == "resnet10t"
    assert job.augment.input_size == (DEFAULTS["img_size"],) * 2
    assert job.eval.input_size == job.augment.input_size
    assert job.pipeline.batch_size == DEFAULTS["batch_size"]
    assert job.execution.resources == {}


def test_flags_override_yaml_override_defaults(tmp_path):
    cfg = _yaml(
        tmp_path,
        "train: {model: resnet18, epochs: 7, lr: 0.5}\npipeline: {batch_size: 48}\n"
        "augment: {input_size: 96, scale: [0.5, 1.0]}\n",
    )
    job = parse_job(["-c", cfg, "--epochs", "3", "-b", "8", "--amp", "--preprocess-resource", "preprocess"])
    assert job.model == "resnet18"  # YAML over default
    assert job.lr == 0.5
    assert job.epochs == 3  # flag over YAML
    assert job.pipeline.batch_size == 8
    assert job.augment.input_size == (96, 96) and job.augment.scale == (0.5, 1.0)
    assert job.amp is True
    assert dict(job.execution.resources) == {"preprocess": 0.001}


def test_timm_flag_names(tmp_path):
    job = parse_job(
        "--model m --data d --val-data v --epochs 2 --batch-size 4 --input-size 3 40 48 --lr 0.1 --opt sgd "
        "--sched step --warmup-epochs 0 --weight-decay 0 --scale 0.2 1 --ratio 0.5 2 --hflip 0 --color-jitter 0 "
        "--aa rand-m9-mstd0.5 --reprob 0.25 --remode const --recount 2 --mixup 0.2 --cutmix 1.0 --smoothing 0.1 "
        "--channels-last --seed 3 --num-workers 2 --use-gpu --cpus-per-worker 0.25 --storage-path /s "
        "--name r --max-failures 2".split()
    )
    assert job.augment.input_size == (40, 48) and job.augment.color_jitter is None
    assert job.augment.auto_augment == "rand-m9-mstd0.5" and job.pipeline.seed == 3
    assert (job.reprob, job.remode, job.recount, job.mixup, job.cutmix, job.smoothing) == (
        0.25,
        "const",
        2,
        0.2,
        1.0,
        0.1,
    )
    assert job.soft_targets and job.use_gpu and job.num_workers == 2 and job.cpus_per_worker == 0.25
    assert (job.storage_path, job.name, job.max_failures, job.opt, job.sched) == ("/s", "r", 2, "sgd", "step")


def test_unknown_yaml_key_is_an_error(tmp_path, capsys):
    cfg = _yaml(tmp_path, "train:\n  epochs: 2\n  batch_sise: 8\n")
    with pytest.raises(SystemExit):
        parse_job(["-c", cfg])
    assert "unknown key(s) ['batch_sise']" in capsys.readouterr().err
    cfg = _yaml(tmp_path, "pipeline:\n  batch_sise: 8\n")
    with pytest.raises(SystemExit):
        parse_job(["-c", cfg])
    assert "unknown key(s) ['batch_sise']" in capsys.readouterr().err
    cfg = _yaml(tmp_path, "epochs: 2\n")  # a key outside any section
    with pytest.raises(SystemExit):
        parse_job(["-c", cfg])
    assert "unknown section(s) ['epochs']" in capsys.readouterr().err


def test_duplicated_yaml_key_is_an_error(tmp_path, capsys):
    cfg = _yaml(tmp_path, "train:\n  epochs: 2\n  epochs: 3\n")
    with pytest.raises(SystemExit):
        parse_job(["-c", cfg])
    assert "duplicated key 'epochs'" in capsys.readouterr().err


def test_bad_values_name_the_field(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_job(["--val-split", "1.5"])
    assert "val_split=1.5" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cpus_per_worker"):
        TrainJobConfig(cpus_per_worker=-1)


@pytest.mark.parametrize("name", ["resnet50_imagenet.yaml", "tiny_cpu.yaml"])
def test_shipped_configs_load(name):
    from pathlib import Path

    path = Path(__file__).parents[2] / "jobs" / "configs" / name
    job = parse_job(["-c", str(path)])
    assert job.epochs >= 1


def test_val_split_is_stable_and_disjoint():
    import numpy as np

    from raypipe.train.data import held_out_mask

    ids = np.arange(20_000)
    mask = held_out_mask(ids, 0.1)
    assert abs(mask.mean() - 0.1) < 0.01
    assert np.array_equal(mask[:5000], held_out_mask(ids[:5000], 0.1))  # a function of the id alone
    assert not held_out_mask(ids, 0.0).any()


def test_feeder_and_pipeline_speed_knobs(tmp_path):
    job = parse_job([])
    assert job.feeder == "process" and job.execution.worker_nice == 10  # the consumer first
    assert job.execution.chunk_rows_for(job.pipeline.batch_size) == 128  # auto: a multiple of the batch of 32
    job = parse_job(["-c", _yaml(tmp_path, "train: {feeder: thread}\nexecution: {worker_nice: 0}\n"), "-b", "256"])
    assert job.feeder == "thread" and job.execution.worker_nice == 0
    assert job.execution.chunk_rows_for(job.pipeline.batch_size) == 256
    assert parse_job(["--feeder", "process", "--chunk-rows", "64"]).execution.chunk_rows == 64
    assert job.execution.worker_sched_idle is None  # decided by the trainer's device (see resolved_for)
    assert parse_job(["--worker-sched-idle"]).execution.worker_sched_idle is True
    assert parse_job(["--no-worker-sched-idle"]).execution.worker_sched_idle is False
    assert parse_job(["-c", _yaml(tmp_path, "execution: {worker_sched_idle: true}\n")]).execution.worker_sched_idle
    with pytest.raises(ValueError, match="feeder"):
        TrainJobConfig(feeder="actor")


def test_checkpoint_steps_from_the_flag_and_the_yaml(tmp_path, capsys):
    assert parse_job([]).checkpoint_steps is None  # epoch-end checkpoints only
    assert parse_job(["--checkpoint-steps", "5"]).checkpoint_steps == 5
    cfg = _yaml(tmp_path, "train: {checkpoint_steps: 200}\n")
    assert parse_job(["-c", cfg]).checkpoint_steps == 200
    assert parse_job(["-c", cfg, "--checkpoint-steps", "7"]).checkpoint_steps == 7  # the flag over the file
    assert parse_job(["-c", _yaml(tmp_path, "train: {checkpoint_steps: null}\n")]).checkpoint_steps is None
    for bad in ("0", "-3"):
        with pytest.raises(SystemExit):
            parse_job(["--checkpoint-steps", bad])
        assert f"checkpoint_steps={bad}: expected a positive int" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_job(["--checkpoint-steps", "2.5"])
    assert "--checkpoint-steps: invalid int value" in capsys.readouterr().err
    for bad in (1.5, True, "5"):
        with pytest.raises(ValueError, match="checkpoint_steps"):
            TrainJobConfig(checkpoint_steps=bad)
    with pytest.raises(SystemExit):
        parse_job(["-c", _yaml(tmp_path, "train: {checkpoint_steps: 0}\n")])
    assert "checkpoint_steps=0" in capsys.readouterr().err


def test_what_the_trainers_and_feeders_leave_to_augmentation():
    from raypipe.train.run import augmentation_cpus

    two = parse_job(["--num-workers", "2", "--cpus-per-worker", "0.5"])
    # each rank's two feeders (the train split's, the eval split's) hold a quarter core each: none left
    assert augmentation_cpus(two, 2.0) == 2.0 - 2 * (0.5 + 2 * 0.25) == 0
    one = parse_job(["--num-workers", "1", "--cpus-per-worker", "0.5"])
    assert augmentation_cpus(one, 2.0) == 1.0
    assert (
        augmentation_cpus(parse_job(["--num-workers", "2", "--cpus-per-worker", "0.5", "--feeder", "thread"]), 2.0)
        == 1.0
    )
    assert augmentation_cpus(parse_job(["--num-workers", "2", "--cpus-per-worker", "1"]), 2.0) < 0  # none left


def test_val_data_is_numbered_like_the_training_data(tmp_path):
    """--val-data with a class folder missing: its labels follow the training data's class numbers."""
    from raypipe.train.data import job_rows

    for split, classes in (("train", ["ant", "bee", "cat"]), ("val", ["ant", "cat"]), ("odd", ["ant", "dog"])):
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
            (tmp_path / split / c / "x.jpg").write_bytes(b"x")
    train, val, _ = job_rows(parse_job(["--data", str(tmp_path / "train"), "--val-data", str(tmp_path / "val")]))
    assert val.classes == train.classes
    assert val.table.column("label").to_pylist() == [0, 2]
    with pytest.raises(ValueError, match=r"--val-data .*dog"):
        job_rows(parse_job(["--data", str(tmp_path / "train"), "--val-data", str(tmp_path / "odd")]))


def test_num_classes_cover_both_splits_and_may_not_be_fewer(tmp_path):
    """A label seen only in the held-out split still needs its logit; --num-classes below the data's
    classes is an error before training (it was an IndexError in the loss after the first epoch)."""
    from raypipe.sources import SourceRows, open_root
    from raypipe.sources.table import make_rows
    from raypipe.train.run import _num_classes

    root = open_root(str(tmp_path))

    def rows(labels):
        return SourceRows(kind="manifest", root=root, table=make_rows([f"{i}.jpg" for i in labels], labels))

    train, val = rows([0, 1, 2, 1]), rows([3, 0])
    assert _num_classes(parse_job([]), train, val) == 4
    assert _num_classes(parse_job(["--num-classes", "10"]), train, val) == 10
    with pytest.raises(ValueError, match="num_classes=3 but the data has 4 classes"):
        _num_classes(parse_job(["--num-classes", "3"]), train, val)


def test_drop_last_with_a_batch_bigger_than_a_shard_is_an_error(tmp_path):
    from raypipe.train.run import _check_batches

    _check_batches(parse_job(["-b", "16", "--drop-last"]), 16)  # one full batch: fine
    with pytest.raises(ValueError, match="no batch would be trained"):
        _check_batches(parse_job(["-b", "16", "--drop-last", "--num-workers", "2"]), 31)  # shards of 16 and 15
    _check_batches(parse_job(["-b", "16"]), 3)  # without drop_last the short batch trains


def test_train_script_reports_a_bad_dataset_in_one_line(ray_local, tmp_path, monkeypatch, capsys):
    import importlib.util
    import pathlib

    import raypipe.runtime

    monkeypatch.setattr(raypipe.runtime, "connect", lambda **kw: None)  # the test's Ray is already up
    path = pathlib.Path(__file__).resolve().parents[2] / "jobs" / "train.py"
    spec = importlib.util.spec_from_file_location("train_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--data", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ") and "does not exist" in err and "Traceback" not in err


def test_one_config_file_for_the_job_raypipe_run_and_the_python_api(tmp_path):
    """The same YAML file: jobs/train.py reads every section, `raypipe run` and ``load_config`` the
    pipeline's (the train section is accepted and not used), and all three agree on those. (What the
    file leaves out, the job takes from its embedded default job, ``DEFAULTS``; this file sets those.)"""
    from raypipe.cli.main import build_parser
    from raypipe.config import load_config
    from raypipe.flags import build_configs

    path = _yaml(
        tmp_path,
        "augment: {input_size: 48, auto_augment: rand-m9-mstd0.5-inc1, hflip: 0.25, scale: [0.3, 1]}\n"
        "eval: {crop_pct: 0.9}\npipeline: {batch_size: 12, seed: 4}\nexecution: {cpus_per_task: 1}\n"
        "decode: {max_pixels: 1000000}\n"
        "train: {model: resnet18, epochs: 2, mixup: 0.2}\n",
    )
    job = parse_job(["-c", path])
    run = build_configs(build_parser().parse_args(["run", "data", "-c", path]))
    api = load_config(path)
    for section in ("augment", "eval", "pipeline", "execution", "decode"):
        assert getattr(job, section) == run[section] == getattr(api, section), section
    assert job.augment.input_size == job.eval.input_size == (48, 48) and job.eval.crop_pct == 0.9
    assert (job.model, job.epochs, job.mixup) == ("resnet18", 2, 0.2)
    assert dict(api.train) == {"model": "resnet18", "epochs": 2, "mixup": 0.2}


@pytest.mark.parametrize("name", ["resnet50_imagenet.yaml", "tiny_cpu.yaml"])
def test_shipped_configs_load_in_raypipe_run_too(name):
    from pathlib import Path

    from raypipe.cli.main import build_parser
    from raypipe.flags import build_configs

    path = str(Path(__file__).parents[2] / "jobs" / "configs" / name)
    run = build_configs(build_parser().parse_args(["run", "data", "-c", path]))
    job = parse_job(["-c", path])
    assert run["augment"] == job.augment and run["pipeline"] == job.pipeline


def test_verbose_is_a_flag_of_the_run_not_a_field_of_the_job():
    from raypipe.train.args import parse_job_args

    quiet_job, quiet = parse_job_args([])
    loud_job, loud = parse_job_args(["-v"])
    assert (quiet.verbose, loud.verbose) == (False, True)
    assert quiet_job == loud_job


_HIDE = """
import os, sys
from raypipe.ray_logs import hide_worker_lines
print(hide_worker_lines(verbose=True), os.environ.get("RAY_DEDUP_LOGS_SKIP_REGEX"))
print(hide_worker_lines(), os.environ["RAY_DEDUP_LOGS_SKIP_REGEX"].startswith("(?:mine)|"))
import ray
from ray._private import ray_constants  # read back only: what Ray took from the environment
print(ray_constants.RAY_DEDUP_LOGS_SKIP_REGEX == os.environ["RAY_DEDUP_LOGS_SKIP_REGEX"], hide_worker_lines())
"""


def test_ray_worker_lines_are_hidden_through_rays_setting_read_at_import():
    """Set before ``import ray`` (joined to a pattern already set), not by -v, and never after."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RAY_DEDUP_LOGS_SKIP_REGEX="mine")
    out = subprocess.run([sys.executable, "-c", _HIDE], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split("\n")[:3] == ["False mine", "True True", "True False"], out.stdout + out.stderr


@pytest.mark.parametrize(
    ("line", "hidden"),
    [
        (
            "Reporting training result 2: TrainingReport(checkpoint=Checkpoint(filesystem=local, path=/r/c), "
            "metrics={'epoch': 1}, validation=False) from rank 0",
            True,
        ),
        ("Checkpoint successfully created at: Checkpoint(filesystem=local, path=/r/checkpoint_1)", True),
        ("Requesting resources: {'CPU': 0.5} * 1", True),
        ("- (ip=10.0.0.2, pid=8482) world_rank=0, local_rank=0, node_rank=0", True),
        (
            "[2026-12-05 03:19:51,805 E 8108 8143] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' "
            "and ID: 'bb19ab3c' has constructor arguments in the object store and max_restarts > 0.",
            True,
        ),
        # other errors from the same C++ file, and the job's own lines, still show
        ("[2026-12-05 03:19:51,805 E 8108 8143] core_worker.cc:812: Failed to register worker to Raylet", False),
        ("epoch 1/2  loss 1.7864  top1 40.00  top5 100.00  emitted 19/20 skipped 1", False),
        ("Traceback (most recent call last):", False),
    ],
)
def test_only_rays_own_lines_match(line, hidden):
    import re

    from raypipe.ray_logs import WORKER_LINES_HIDDEN

    assert bool(re.compile("|".join(f"(?:{p})" for p in WORKER_LINES_HIDDEN)).search(line)) is hidden


def test_trainers_and_feeders_that_hold_a_private_cluster_are_refused(monkeypatch):
    import raypipe.runtime
    import raypipe.train.run as run

    monkeypatch.setattr(run.ray, "cluster_resources", lambda: {"CPU": 2.0})
    job = parse_job(["--num-workers", "2", "--cpus-per-worker", "0.5"])
    monkeypatch.setattr(raypipe.runtime, "private_cluster", lambda: True)
    with pytest.raises(ValueError, match="leaving none for augmentation.*--feeder thread"):
        run._check_cpus(job, "ray")
    monkeypatch.setattr(raypipe.runtime, "private_cluster", lambda: False)
    run._check_cpus(job, "nodes")  # a cluster that may grow: a warning, the job waits for nodes
    run._check_cpus(parse_job(["--num-workers", "2", "--cpus-per-worker", "0.5", "--feeder", "thread"]), "ray")


def test_on_the_private_cluster_the_jobs_tasks_are_local_workers_and_need_no_ray_cpu(monkeypatch):
    import dataclasses

    import raypipe.runtime
    import raypipe.train.run as run

    monkeypatch.setattr(run.ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(raypipe.runtime, "private_cluster", lambda: True)
    job = parse_job(["--num-workers", "2", "--cpus-per-worker", "0.5"])
    assert raypipe.runtime.connection() == "private"
    backend = run.workers_decision(job, "folder", raypipe.runtime.connection()).backend
    assert backend == "local"
    assert job.execution.backend == "auto"  # the job's config is left as it was given
    run._check_cpus(job, backend)  # trainers and feeders hold all 2 CPUs; augmentation runs beside them
    over = dataclasses.replace(job, cpus_per_worker=0.75)
    with pytest.raises(ValueError, match="ask for more than the cluster's 2 CPUs"):
        run._check_cpus(over, backend)
    assert run.workers_decision(job, "raydata", "private").backend == "ray"
    given = dataclasses.replace(job, execution=dataclasses.replace(job.execution, backend="local"))
    assert run.workers_decision(given, "raydata", "private").backend == "local"  # given, kept
    steered = parse_job(["--preprocess-resource", "preprocess"])
    assert run.workers_decision(steered, "folder", "private").backend == "ray"
    monkeypatch.setattr(raypipe.runtime, "private_cluster", lambda: False)
    joined = parse_job([])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(raypipe.runtime.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(raypipe.runtime.ray, "get_runtime_context", lambda: _Driver())
    assert raypipe.runtime.connection() == "own"
    assert run.workers_decision(joined, "folder", "own").backend == "ray"  # a Ray this script started itself
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # as `ray job submit` tells a job
    assert raypipe.runtime.connection() == "joined"
    # each rank decides on its node, told the connection: node workers where the other nodes reach it
    assert run.workers_decision(joined, "folder", "joined").backend == "nodes"
    assert run.workers_decision(joined, "raydata", "joined").backend == "ray"


class _Driver:
    """A driver's Ray runtime context (no actor)."""

    def get_actor_id(self):
        return None


def test_a_listing_by_shard_takes_the_number_of_classes_given(tmp_path):
    from image_factory import sample, write_shard

    from raypipe.sources import open_source
    from raypipe.sources.indexes.indexer import index_shards
    from raypipe.train.run import _num_classes

    d = tmp_path / "wds"
    write_shard(d / "s-0.tar", sample("a/0", 3) + sample("a/1", 1))
    index_shards(str(d), use_ray=False)
    rows = open_source(str(d), by_shard=True)
    assert _num_classes(parse_job(["--num-classes", "10"]), rows, rows) == 10
    with pytest.raises(ValueError, match="number of classes"):
        _num_classes(parse_job([]), rows, rows)


def test_the_index_flag_lists_the_training_shards_from_that_index(tmp_path):
    """``--index`` reaches the listing of ``--data`` (an index kept away from read-only shards); for
    data that is not WebDataset shards it is refused with the reason."""
    from image_factory import sample, write_shard

    from raypipe.sources import open_source
    from raypipe.sources.indexes.indexer import index_shards
    from raypipe.train.data import job_rows

    d = tmp_path / "wds"
    write_shard(d / "s-0.tar", sample("a/0", 3) + sample("a/1", 1) + sample("a/2", 0) + sample("a/3", 2))
    index = tmp_path / "elsewhere" / "index.parquet"
    index.parent.mkdir()
    index_shards(str(d), str(index), use_ray=False)
    train, val, _ = job_rows(parse_job(["--data", str(d), "--index", str(index), "--val-split", "0.5"]))
    assert len(train) + len(val) == len(open_source(str(d))) == 4
    (tmp_path / "cut.parquet").write_bytes(index.read_bytes()[:-8] + b"garbage!")
    with pytest.raises(Exception):  # noqa: B017 - pyarrow's own error for a cut Parquet file: the flag is read
        job_rows(parse_job(["--data", str(d), "--index", str(tmp_path / "cut.parquet")]))
    (tmp_path / "folder" / "c").mkdir(parents=True)
    (tmp_path / "folder" / "c" / "x.jpg").write_bytes(b"x")
    with pytest.raises(ValueError, match="shard indexes are for WebDataset"):
        job_rows(parse_job(["--data", str(tmp_path / "folder"), "--index", str(index)]))
    assert parse_job(["-c", _yaml(tmp_path, f"train: {{index: {index}}}\n")]).index == str(index)
