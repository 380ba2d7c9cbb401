"""The command-line contract, for every command: exit status, one-line errors, no traceback without
--debug, arguments checked before anything starts, help text and defaults, fast start, quiet Ray."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raypipe.cli import common
from raypipe.cli.main import COMMANDS, build_parser
from raypipe.cli.main import main as cli

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if a command tries to start (or join) Ray."""

    def refuse(*args, **kwargs):
        raise AssertionError("this command must not start Ray")

    from raypipe.cli import run, scan  # imported first, so they bind the real function before it is patched

    for module in (common, run, scan):
        monkeypatch.setattr(module, "connect_quietly", refuse)


@pytest.fixture(scope="module")
def bad_dir(sample_dir, tmp_path_factory):
    """The sample data plus two images that cannot be read (a truncated JPEG, an empty file)."""
    out = tmp_path_factory.mktemp("bad") / "data"
    shutil.copytree(sample_dir, out)
    first = sorted(out.rglob("*.jpg"))[0]
    (first.parent / "truncated.jpg").write_bytes(first.read_bytes()[:300])
    (first.parent / "empty.jpg").write_bytes(b"")
    return out


def one_line_error(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "error:" in lines[0]
    for word in words:
        assert word in lines[0], err


# ---- user errors: exit 2, one line, no traceback ----------------------------------------------

USER_ERRORS = [
    (["sample-data", "{tmp}/s", "--classes", "99"], "--classes"),
    (["sample-data", "{tmp}/s", "--per-class", "0"], "per_class"),
    (["sample-data", "{tmp}/s", "--classes", "many"], "invalid int value"),
    (["scan", "{tmp}/nope"], "does not exist"),
    (["scan", "{data}", "--num-tasks", "0"], "--num-tasks"),
    (["run", "{data}", "--epochs", "0"], "--epochs"),
    (["run", "{data}", "-b", "-4"], "batch_size"),
    (["run", "{data}", "--hflip", "2"], "hflip"),
    (["run", "{data}", "--object-store-mb", "0"], "--object-store-mb"),
    (["run", "{data}", "--device", "tpu"], "--device"),
    (["run", "{data}", "-c", "{tmp}/bad.yaml"], "not valid YAML"),
    (["run", "{data}", "--interpolation", "nearest"], "invalid choice"),
    (["preview", "{data}", "--out", "{tmp}/g.png", "--count", "0"], "--count"),
    (["convert", "{data}", "{tmp}/out", "--format", "webdataset", "--max-side", "0"], "--max-side"),
    (["convert", "{data}", "{tmp}/out", "--format", "zip"], "invalid choice"),
    (["index", "{tmp}/nope.tar", "--out", "{tmp}/i.parquet"], "no .tar shards"),
    (["index", "{data}", "--out", "{tmp}/i.json"], "--out"),
    (["preview", "{data}", "--out", "{tmp}/g.notanimage"], "--out"),
    (["preview", "{tmp}/nope", "--out", "{tmp}/g.png"], "does not exist"),
    (["preview", "{data}"], "--out"),
    (["bench", "{data}", "--epochs", "0"], "--epochs"),
    (["bench", "{data}", "-b", "1000"], "fewer than one batch"),
    (["bench", "{tmp}/nope"], "does not exist"),
    (["bench", "{data}", "--only", "turbo"], "invalid choice"),
    (["bench", "{data}", "--timm-workers", "0"], "--timm-workers"),
    # a shard index, for a source that is no WebDataset shards
    (["scan", "{data}", "--index", "{tmp}/i.parquet"], "--index"),
    (["run", "{data}", "--index", "{tmp}/i.parquet"], "--index"),
    (["preview", "{data}", "--out", "{tmp}/g.png", "--index", "{tmp}/i.parquet"], "--index"),
    (["convert", "{data}", "{tmp}/out", "--format", "parquet", "--index", "{tmp}/i.parquet"], "--index"),
    (["bench", "{data}", "--index", "{tmp}/i.parquet"], "--index"),
]


def status(argv: list[str]) -> int:
    """The exit status of ``raypipe argv`` (argparse's own errors exit through SystemExit)."""
    try:
        return cli(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize(("argv", "word"), USER_ERRORS, ids=[" ".join(a[:1] + a[2:]) for a, _ in USER_ERRORS])
def test_user_errors_are_one_line_and_exit_2(argv, word, sample_dir, tmp_path, capsys, no_ray):
    (tmp_path / "bad.yaml").write_text("augment:\n  hflip: [\n")
    assert status([a.format(tmp=tmp_path, data=sample_dir) for a in argv]) == 2
    one_line_error(capsys.readouterr().err, word)


def test_argparse_errors_exit_2_with_one_line(capsys):
    assert status(["run", "data", "--epochs"]) == 2  # a flag without its value: argparse's own error
    one_line_error(capsys.readouterr().err, "raypipe run: error:", "--help")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA message")
def test_run_rejects_cuda_without_cuda_before_ray_starts(sample_dir, capsys, no_ray):
    assert cli(["run", str(sample_dir), "--device", "cuda"]) == 2
    one_line_error(capsys.readouterr().err, "CUDA is not available")


def _run_report(sample_dir, tmp_path, name: str, *flags: str) -> list[dict]:
    out = tmp_path / f"{name}.json"
    argv = ["run", str(sample_dir), "--epochs", "2", "-b", "16", "--img-size", "40", "--json", str(out), *flags]
    assert cli(argv) == 0
    return json.loads(out.read_text())["epochs"]


def test_run_not_connected_to_ray_runs_on_local_workers(sample_dir, tmp_path, monkeypatch, no_ray):
    import ray

    from raypipe.workers.local import LocalWorkers

    if ray.is_initialized():
        ray.shutdown()  # an earlier test's; the ray_local fixture starts it again when needed
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    LocalWorkers.shutdown_shared()
    epochs = _run_report(sample_dir, tmp_path, "auto")
    assert not ray.is_initialized()
    assert LocalWorkers._shared is not None and LocalWorkers._shared._started
    assert [e["emitted"] for e in epochs] == [48, 48]


def test_run_on_local_workers_and_on_ray_emit_the_same(ray_local, sample_dir, tmp_path):
    """The backend changes where the tasks run, never what comes out: same ids, same pixels."""
    on_ray = _run_report(sample_dir, tmp_path, "ray", "--backend", "ray")
    local = _run_report(sample_dir, tmp_path, "local", "--backend", "local")
    for a, b in zip(on_ray, local, strict=True):
        assert (a["ids_sha256"], a["content_sha256"]) == (b["ids_sha256"], b["content_sha256"])


def test_debug_shows_the_traceback(sample_dir, capsys, no_ray):
    assert cli(["--debug", "run", str(sample_dir), "--epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("raypipe run: error: --epochs 0")
    assert cli(["run", str(sample_dir), "--epochs", "0", "--debug"]) == 2  # after the command, too
    assert "Traceback" in capsys.readouterr().err


# ---- failed runs: exit 1, a short message naming the exception -----------------------------------


def _raising(exc: BaseException):
    def fail(args):
        raise exc

    return fail


def test_a_ray_task_that_raised_is_exit_1_naming_its_type(ray_local, sample_dir, monkeypatch, capsys):
    import ray

    @ray.remote
    def broken():
        raise TypeError("unsupported operand type(s)")

    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(broken.remote(), timeout=60)
    from raypipe.cli import run

    monkeypatch.setattr(run, "main", _raising(info.value))
    assert cli(["run", str(sample_dir)]) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("raypipe run: failed: TypeError: unsupported operand type(s)"), err
    assert "Traceback" not in err and len(err.splitlines()) <= 8


@pytest.mark.parametrize("name", ["WorkerCrashedError", "NodeDiedError", "FeederDiedError"])
def test_a_lost_worker_or_feeder_is_exit_1(name, sample_dir, monkeypatch, capsys):
    import ray.exceptions

    from raypipe.cli import run
    from raypipe.pipeline.feeder import FeederDiedError

    exc = (
        FeederDiedError("the feeder process of rank 0 died (exit code -9)")
        if name == "FeederDiedError"
        else (
            getattr(ray.exceptions, name)()
            if name == "WorkerCrashedError"
            else ray.exceptions.NodeDiedError("node 1 died")
        )
    )
    monkeypatch.setattr(run, "main", _raising(exc))
    assert cli(["run", str(sample_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"raypipe run: failed: {name}") and "Traceback" not in err


def test_skip_limit_is_exit_1(ray_local, bad_dir, capsys):
    rc = cli(["run", str(bad_dir), "-b", "8", "--img-size", "32", "--max-skips", "0"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.startswith("raypipe run: failed: SkipLimitError") and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 8


def test_an_unexpected_error_is_exit_1_and_debug_shows_where(sample_dir, monkeypatch, capsys):
    from raypipe.cli import preview

    monkeypatch.setattr(preview, "main", _raising(KeyError("image")))
    assert cli(["preview", str(sample_dir), "--out", "x.png"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("raypipe preview: failed: KeyError: 'image'") and "--debug" in err
    assert cli(["--debug", "preview", str(sample_dir), "--out", "x.png"]) == 1
    assert "Traceback" in capsys.readouterr().err


# ---- --index: a shard index written elsewhere -----------------------------------------------------


def test_index_names_a_shard_index_written_elsewhere(sample_dir, tmp_path, monkeypatch, capsys, no_ray):
    """`raypipe index --out` writes the index away from the shards (a read-only bucket's case); a command
    given it with --index lists from it, not from the shards' headers. A bad --index is one line, exit 2."""
    from image_factory import sample, write_shard

    from raypipe.sources.indexes.shard_index import INDEX_NAME

    photos = sorted(sample_dir.rglob("*.jpg"))[:6]
    shard = tmp_path / "wds" / "shard-0000.tar"
    write_shard(shard, [m for i, p in enumerate(photos) for m in sample(f"s/{i:03d}", i % 2, image=p.read_bytes())])
    index = tmp_path / "elsewhere" / "i.parquet"
    assert cli(["index", str(shard), "--out", str(index)]) == 0  # one shard: indexed in this process
    assert index.is_file() and not (shard.parent / INDEX_NAME).exists()

    def refuse(*args, **kwargs):
        raise AssertionError("a shard was listed from its tar headers")

    monkeypatch.setattr("raypipe.sources.formats.webdataset._list_shard", refuse)
    capsys.readouterr()
    out = tmp_path / "scan.json"
    assert cli(["scan", str(shard), "--index", str(index), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["total"] == report["ok"] == 6 and not report["skipped_paths"]
    assert status(["scan", str(shard)]) == 1  # without it, the headers are read
    assert "listed from its tar headers" in capsys.readouterr().err
    for bad, word in ((tmp_path / "nope.parquet", "nope.parquet"), (tmp_path / "i.txt", "expected a raypipe index")):
        assert status(["scan", str(shard), "--index", str(bad)]) == 2
        one_line_error(capsys.readouterr().err, word)


# ---- scan: exit 1 when it found bad images; in-process below the threshold -----------------------


def test_scan_exits_1_on_bad_images_without_starting_ray(bad_dir, tmp_path, capsys, no_ray):
    out = tmp_path / "scan.json"
    assert cli(["scan", str(bad_dir), "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["total"] == 50 and report["ok"] == 48
    assert sorted(Path(s["path"]).name for s in report["skipped_paths"]) == ["empty.jpg", "truncated.jpg"]
    assert "skipped 2" in capsys.readouterr().out


def test_scan_on_ray_agrees_with_scan_in_process(ray_local, bad_dir, tmp_path, no_ray, monkeypatch):
    from raypipe.cli import scan
    from raypipe.runtime import connect

    monkeypatch.setattr(scan, "connect_quietly", lambda args, **kw: connect())
    here, there = tmp_path / "here.json", tmp_path / "there.json"
    assert cli(["scan", str(bad_dir), "--json", str(here)]) == 1
    assert cli(["scan", str(bad_dir), "--ray", "--json", str(there)]) == 1
    a, b = json.loads(here.read_text()), json.loads(there.read_text())
    assert (a["total"], a["ok"], a["skipped"]) == (b["total"], b["ok"], b["skipped"])
    key = lambda s: s["sample_id"]  # noqa: E731
    assert sorted(a["skipped_paths"], key=key) == sorted(b["skipped_paths"], key=key)


def test_scan_threshold_is_one_number():
    from raypipe.cli import inprocess, scan

    assert scan._IN_PROCESS_MAX == inprocess.SCAN_IN_PROCESS_MAX


def test_scan_of_a_good_dataset_exits_0(sample_dir, no_ray, capsys):
    assert cli(["scan", str(sample_dir)]) == 0
    assert "skipped: none" in capsys.readouterr().out


# ---- preview: in-process, the pixels a Ray run gives ---------------------------------------------


def test_preview_runs_in_process_and_matches_the_ray_pipeline(ray_local, sample_dir, tmp_path, no_ray):
    from raypipe.cli.inprocess import first_images
    from raypipe.config import DecodeConfig, PipelineConfig, TrainAugment
    from raypipe.pipeline import Pipeline
    from raypipe.sources import open_source

    out = tmp_path / "grid.png"
    assert cli(["preview", str(sample_dir), "--out", str(out), "--count", "16", "--img-size", "32"]) == 0
    with Image.open(out) as im:
        assert im.size == (4 * 32, 4 * (32 + 14))
    rows = open_source(str(sample_dir))
    aug = TrainAugment(input_size=32, auto_augment="rand-m9-mstd0.5-inc1")
    here = first_images(rows, aug, DecodeConfig(), count=10, seed=7, epoch=2)
    pipe = Pipeline(rows, aug, config=PipelineConfig(batch_size=10, seed=7))
    there = next(iter(pipe.epoch(2)))
    assert np.array_equal(here["sample_id"], there["sample_id"])
    assert np.array_equal(here["image"], np.asarray(there["image"]))


def test_preview_skips_unreadable_images(bad_dir, tmp_path, no_ray):
    out = tmp_path / "grid.png"
    assert cli(["preview", str(bad_dir), "--out", str(out), "--count", "50", "--img-size", "16"]) == 0
    with Image.open(out) as im:  # 48 good images: 7 columns, 7 rows
        assert im.size == (7 * 16, 7 * (16 + 14))


# ---- bench: no contender shown at 0 img/s --------------------------------------------------------


def test_bench_rejects_data_smaller_than_a_batch_before_running(sample_dir, capsys, monkeypatch):
    from raypipe.cli import bench

    monkeypatch.setattr(bench, "_run_one", _raising(AssertionError("must not run")))
    assert cli(["bench", str(sample_dir), "-b", "64", "--only", "timm"]) == 2
    one_line_error(capsys.readouterr().err, "48 images", "fewer than one batch of 64")


# ---- help, defaults, version, fast start ---------------------------------------------------------


def _commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return parser, sub.choices


def test_every_command_is_covered_and_every_flag_has_help():
    parser, commands = _commands()
    assert set(commands) == {"sample-data", "scan", "run", "preview", "convert", "index", "bench", "cluster-check"}
    assert len(COMMANDS) == len(commands)
    for name, command in [("raypipe", parser), *commands.items()]:
        for action in command._actions:
            assert action.help and action.help.strip(), f"{name}: {action.option_strings or action.dest} has no help"


def test_convert_restates_the_kinds_and_formats_it_offers():
    from raypipe.cli import convert
    from raypipe.sources import KINDS
    from raypipe.sources.writing.convert import FORMATS

    assert convert.KINDS == KINDS and convert.FORMATS == FORMATS


def test_help_shows_defaults():
    _, commands = _commands()
    bench_help = commands["bench"].format_help()
    assert "(default: 3)" in bench_help and "(default: 128)" in bench_help
    run_help = commands["run"].format_help().replace("\n", " ")
    for shown in ("(default: 0.5)", "(default: 224)", "(default: 256)", "(default: cpu)", "(default: 1)"):
        assert shown in " ".join(run_help.split()), shown
    assert "(default: None)" not in run_help


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["--version"])
    assert exit_info.value.code == 0
    from raypipe import __version__

    assert capsys.readouterr().out.strip() == f"raypipe {__version__}"


def test_help_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from raypipe.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('ray', 'torch', 'timm', 'pyarrow', 'cv2', 'tqdm') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


def test_python_dash_m_raypipe(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "raypipe", "--version"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("raypipe ")


# ---- progress and Ray's start-up messages ---------------------------------------------------------


def test_progress_without_a_terminal_is_plain_lines(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(common, "PROGRESS_INTERVAL_S", 0.0)
    monkeypatch.delenv("RAYPIPE_NO_PROGRESS", raising=False)
    with common.progress(30, "epoch 0") as bar:
        for _ in range(3):
            bar.update(10)
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 4 and lines[-1].startswith("epoch 0: 30/30 img (100 %)")
    stream.truncate(0)
    monkeypatch.setattr(common, "PROGRESS_INTERVAL_S", 3600.0)
    with common.progress(30, "epoch 1") as bar:
        bar.update(30)
    assert stream.getvalue().count("\n") == 1  # only the final line within the interval


def test_ray_startup_warnings_are_hidden_unless_verbose():
    pytest.importorskip("ray")
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    ray_logger = logging.getLogger("ray")
    handler = Collect(level=logging.DEBUG)
    ray_logger.addHandler(handler)
    child = logging.getLogger("ray.some.startup.module")
    try:
        with common.quiet_ray_startup(verbose=False):
            child.warning("Token authentication is enabled for this Ray cluster")
            child.error("a real error")
        child.warning("after start-up")
        with common.quiet_ray_startup(verbose=True):
            child.warning("asked for")
    finally:
        ray_logger.removeHandler(handler)
    assert seen == ["a real error", "after start-up", "asked for"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_fresh_ray_start_prints_no_warnings(bad_dir, tmp_path):
    """End to end in a child process with its own new Ray: no token-auth warning, no traceback."""
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_ADDRESS="")
    env.pop("RAY_AUTH_MODE", None)
    cmd = [sys.executable, "-m", "raypipe", "scan", str(bad_dir), "--ray", "--num-tasks", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=200, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Token authentication" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "skipped 2" in proc.stdout
