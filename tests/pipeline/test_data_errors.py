"""Only a failure of an image's own bytes is a skip; anything else fails the epoch with its own type.

Both sides: bad bytes of every kind come back as skip records (test_bad_inputs.py has the full corpus),
and a simulated bug in raypipe's transform (every call raises TypeError, installed in the Ray workers
by a setup hook) fails the stage, the epoch and ``raypipe run`` with that TypeError. Then the default
skip limit through ``raypipe run``: 30 % bad images fail in a few lines; ``--max-skip-ratio 0.5`` on
70 good + 30 bad emits exactly the 70.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fault_hooks
import image_factory as f
import numpy as np
import pytest

from raypipe.cli.main import main as cli
from raypipe.config import DecodeConfig, PipelineConfig, TrainAugment
from raypipe.kernels import SkipImage, build_transform, decode, sample_rng, transform
from raypipe.pipeline import Pipeline
from raypipe.sources import open_root
from raypipe.stages.augment import AugmentStage, StageSpec

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent  # this module and fault_hooks, which Ray's workers import
TESTS = HERE.parent  # the helpers this module imports (image_factory)
REPO = TESTS.parent
AUG = TrainAugment(input_size=32, color_jitter=None)


def _stage(root: Path) -> AugmentStage:
    spec = StageSpec(kind="folder", root=open_root(str(root)), augment=AUG, decode=DecodeConfig(), seed=0, epoch=0)
    return AugmentStage(spec)


def _batch(names: list[str]) -> dict[str, np.ndarray]:
    n = len(names)
    return {
        "sample_id": np.arange(n, dtype=np.int64),
        "label": np.zeros(n, np.int64),
        "path": np.array(names, dtype=object),
        "row": np.full(n, -1, np.int64),
    }


def test_stage_skips_bad_bytes_and_raises_bugs(tmp_path, monkeypatch):
    (tmp_path / "good.jpg").write_bytes(f.photo_jpeg(size=(80, 60)))
    (tmp_path / "cut.jpg").write_bytes(f.truncated_jpeg())
    (tmp_path / "noise.png").write_bytes(f.random_bytes())
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "adir.jpg").mkdir()
    names = ["good.jpg", "cut.jpg", "noise.png", "empty.jpg", "adir.jpg", "gone.jpg", "../outside.jpg"]
    out = _stage(tmp_path)(_batch(names))
    assert out["ok"].tolist() == [True] + [False] * 6
    assert out["reason"].tolist() == ["", "truncated", "not_an_image", "empty", "unreadable", "missing", "outside_root"]
    monkeypatch.setattr(transform.TrainTransform, "__call__", fault_hooks._raise)
    with pytest.raises(TypeError, match=fault_hooks.BUG):
        _stage(tmp_path)(_batch(["good.jpg"]))


@pytest.mark.parametrize(
    "error",
    [
        TypeError("bug"),
        AttributeError("bug"),
        MemoryError(),
        AssertionError("bug"),
        KeyError("bug"),
        ImportError("no module"),
    ],
)
def test_errors_that_are_not_the_datas_propagate_from_the_decoders(monkeypatch, error):
    """The same exception raised where a decoder is called (Pillow's conversion, simplejpeg) is not turned
    into a skip: only the decoders' own error types are."""

    def broken(*args, **kwargs):
        raise error

    t = build_transform(AUG)
    monkeypatch.setattr(decode, "_pil_to_rgb", broken)
    with pytest.raises(type(error)):
        t(f.encode(f.photo(size=(60, 40)), "PNG"), sample_rng(0, 0, 0))
    monkeypatch.setattr(decode, "_decode_region", None)  # the crop's region decode would not call simplejpeg
    monkeypatch.setattr(decode.simplejpeg, "decode_jpeg", broken)
    with pytest.raises(type(error)):
        t(f.photo_jpeg(size=(60, 40)), sample_rng(0, 0, 0))


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ValueError("Premature end of JPEG file"), "truncated"),
        (OSError("broken data stream"), "decode_error"),
        (SyntaxError("bad chunk"), "decode_error"),
        (EOFError(), "truncated"),
    ],
)
def test_the_decoders_own_errors_are_skips(monkeypatch, error, reason):
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(decode, "_pil_to_rgb", broken)
    with pytest.raises(SkipImage) as e:
        build_transform(AUG)(f.encode(f.photo(size=(60, 40)), "PNG"), sample_rng(0, 0, 0))
    assert e.value.reason == reason


def _hooked_ray():
    """A local Ray whose workers run ``fault_hooks.break_transforms`` when they start."""
    import ray

    ray.shutdown()  # the shared fixture's Ray has no hook
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 2**20,
        logging_level="WARNING",
        runtime_env={
            "worker_process_setup_hook": "fault_hooks.break_transforms",
            "env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), str(HERE)])},
        },
    )
    return ray


@pytest.mark.ray
def test_a_bug_fails_the_epoch_with_its_own_type(sample_dir):
    ray = _hooked_ray()
    try:
        pipe = Pipeline(str(sample_dir), AUG, config=PipelineConfig(batch_size=8))
        with pytest.raises(TypeError, match=fault_hooks.BUG) as e:
            list(pipe.epoch(0))
        assert "pid=" in str(e.value)  # Ray names the worker that raised it
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_raypipe_run_exits_nonzero_naming_the_type_error(sample_dir, tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(REPO)!r}, {str(TESTS)!r}, {str(HERE)!r}]
        import test_data_errors
        test_data_errors._hooked_ray()
        from raypipe.cli.main import main
        sys.exit(main(["run", {str(sample_dir)!r}, "--img-size", "32", "-b", "8"]))
    """)
    )
    env = dict(os.environ, RAYPIPE_NO_PROGRESS="1", PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), str(HERE)]))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"TypeError: {fault_hooks.BUG}" in out, out[-3000:]


@pytest.fixture(scope="module")
def seventy_thirty(tmp_path_factory):
    """70 good JPEGs and 30 bad files (truncated, empty, noise, text) in two classes."""
    root = tmp_path_factory.mktemp("seventy_thirty")
    for c in ("a", "b"):
        (root / c).mkdir()
    names = f.PHOTOS
    for i in range(70):
        size = (64 + 4 * (i % 5), 48 + 2 * (i % 7))
        (root / "ab"[i % 2] / f"good_{i:02d}.jpg").write_bytes(f.photo_jpeg(names[i % len(names)], size))
    bad = [f.truncated_jpeg(), b"", f.random_bytes(2000, seed=1), f.text_bytes()]
    for i in range(30):
        (root / "ab"[i % 2] / f"bad_{i:02d}.jpg").write_bytes(bad[i % len(bad)])
    return root


def test_thirty_percent_bad_fails_by_default_in_a_few_lines(ray_local, seventy_thirty, capsys):
    assert cli(["run", str(seventy_thirty), "--img-size", "32", "-b", "10"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message = [line for line in err.splitlines() if line.strip()]
    assert len(message) <= 9, err
    assert "samples skipped" in message[0] and "of 100" in message[0] and "max_skip_ratio=0.01" in message[0]
    assert "top reasons:" in err and "--max-skip-ratio" in err and "bad_" in err


def test_max_skip_ratio_half_emits_exactly_the_seventy(ray_local, seventy_thirty, tmp_path):
    out = tmp_path / "run.json"
    assert (
        cli(["run", str(seventy_thirty), "--img-size", "32", "-b", "10", "--max-skip-ratio", "0.5", "--json", str(out)])
        == 0
    )
    epoch = json.loads(out.read_text())["epochs"][0]
    assert epoch["emitted"] == 70 and sum(epoch["skipped"].values()) == 30 and epoch["expected"] == 100
    assert all(os.path.basename(p["path"]).startswith("bad_") for p in epoch["skipped_paths"])


def test_training_reports_a_ranks_skip_limit_without_a_traceback(monkeypatch, capsys):
    import importlib.util

    import ray.train

    import raypipe.runtime
    import raypipe.train
    from raypipe.pipeline import SkipLimitError
    from raypipe.train.run import data_failure

    failures = {0: RuntimeError("something else"), 1: SkipLimitError("epoch 0: 9 of 10 samples skipped")}
    got = data_failure(ray.train.WorkerGroupError("workers failed", failures))
    assert isinstance(got, SkipLimitError) and str(got) == "rank 1: epoch 0: 9 of 10 samples skipped"
    assert data_failure(ray.train.WorkerGroupError("workers failed", {0: TypeError("bug")})) is None

    spec = importlib.util.spec_from_file_location("train_job", REPO / "jobs" / "train.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)

    def fail(_job, **_kwargs):
        raise got

    monkeypatch.setattr(raypipe.runtime, "connect", lambda **kw: None)
    monkeypatch.setattr(raypipe.train, "run_training", fail)
    assert job.main(["--epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "train.py: error: rank 1: epoch 0: 9 of 10 samples skipped"
