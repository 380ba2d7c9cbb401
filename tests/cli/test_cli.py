"""The raypipe console script end to end (in-process, sharing the test session's local Ray)."""

import json
from pathlib import Path

import pytest
from PIL import Image

from raypipe.cli.main import main as cli

pytestmark = pytest.mark.timeout(240)


def test_sample_data_is_deterministic_for_any_worker_count(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(["sample-data", str(a), "--classes", "3", "--per-class", "4", "--seed", "5", "--workers", "1"]) == 0
    # several processes, several chunks per class: the same bytes
    assert cli(["sample-data", str(b), "--classes", "3", "--per-class", "4", "--seed", "5", "--workers", "2"]) == 0
    files = sorted(p.relative_to(a) for p in a.rglob("*.jpg"))
    assert len(files) == 12 and len({p.parent for p in files}) == 3
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in files)
    with Image.open(a / files[0]) as im:
        assert im.format == "JPEG" and max(im.size) >= 450


def test_run_reports_and_agrees_with_itself(ray_local, sample_dir, tmp_path, capsys):
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        rc = cli(["run", str(sample_dir), "--epochs", "2", "-b", "16", "--img-size", "40", "--json", str(out)])
        assert rc == 0
        outs.append(json.loads(out.read_text()))
    e0, e1 = outs[0]["epochs"]
    for e in (e0, e1):
        assert set(e) >= {
            "epoch",
            "emitted",
            "skipped",
            "skipped_paths",
            "images_per_s",
            "ids_sha256",
            "content_sha256",
        }
        assert e["emitted"] == 48 and e["skipped"] == {}
    assert e0["ids_sha256"] == e1["ids_sha256"]  # the same samples every epoch
    assert e0["content_sha256"] != e1["content_sha256"]  # augmented differently
    assert outs[0]["epochs"][0]["content_sha256"] == outs[1]["epochs"][0]["content_sha256"]  # fixed seed
    text = capsys.readouterr().out
    assert "content_sha256" in text and "epoch 1" in text


def test_run_with_yaml_and_flags(ray_local, sample_dir, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("augment:\n  input_size: 24\n  hflip: 0.0\npipeline:\n  batch_size: 5\n  drop_last: true\n")
    out = tmp_path / "r.json"
    assert cli(["run", str(sample_dir), "-c", str(cfg), "--aa", "rand-m9-mstd0.5-inc1", "--json", str(out)]) == 0
    (e,) = json.loads(out.read_text())["epochs"]
    assert e["emitted"] == 45 and e["dropped_last"] == 3


def test_bad_config_is_a_clear_error(sample_dir, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("augment:\n  hflipp: 0.5\n")
    assert cli(["run", str(sample_dir), "-c", str(cfg)]) == 2
    assert "hflipp" in capsys.readouterr().err
    assert cli(["run", str(sample_dir), "--scale", "0.9", "0.1"]) == 2
    assert "scale" in capsys.readouterr().err


def test_missing_files_and_bad_yaml_are_clear_errors(sample_dir, tmp_path, capsys):
    """Checked before a Ray starts: one line on stderr and exit 2, not a traceback."""
    assert cli(["run", str(tmp_path / "nope.csv")]) == 2
    assert "No such file" in capsys.readouterr().err
    assert cli(["scan", str(sample_dir), "--kind", "manifest"]) == 2
    assert "Is a directory" in capsys.readouterr().err
    assert cli(["run", str(sample_dir), "-c", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("augment:\n  hflip: [\n")
    assert cli(["run", str(sample_dir), "-c", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "Traceback" not in err


def test_preview_writes_a_grid(ray_local, sample_dir, tmp_path):
    out = tmp_path / "new" / "grid.png"  # its folder is made, as --json's is
    assert cli(["preview", str(sample_dir), "--out", str(out), "--count", "6", "--img-size", "48"]) == 0
    with Image.open(out) as im:
        assert im.size == (3 * 48, 2 * (48 + 14))
    assert cli(["preview", str(sample_dir), "--out", str(out), "--eval", "--count", "4", "--img-size", "32"]) == 0


def test_bench_smoke(ray_local, sample_dir, tmp_path):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    args = [
        "bench",
        str(sample_dir),
        "--only",
        "decode",
        "kernel",
        "packed",
        "--suites",
        "plain",
        "--epochs",
        "2",
        "--img-size",
        "32",
        "-b",
        "8",
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    assert cli(args) == 0
    report = json.loads(out.read_text())
    (suite,) = report["suites"].values()
    names = [r["name"] for r in suite["results"]]
    assert names == ["decode limit", "raypipe kernel", "raypipe packed"]
    assert all(r["images_per_s"] > 0 for r in suite["results"])
    with Image.open(png) as im:
        assert im.format == "PNG"


@pytest.mark.ray
def test_bench_naive_contender_reads_only_the_images(sample_dir, tmp_path):
    """A stray file under the data root (a manifest, notes) is no image: the naive contender read it and
    failed, and its Ray exception could not be sent back from the bench's child process."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(sample_dir, data)
    (data / "notes.csv").write_text("path,label\n")
    out = tmp_path / "b.json"
    args = [
        "bench",
        str(data),
        "--only",
        "naive",
        "--suites",
        "plain",
        "--epochs",
        "2",
        "--img-size",
        "32",
        "-b",
        "8",
        "--json",
        str(out),
    ]
    assert cli(args) == 0
    (suite,) = json.loads(out.read_text())["suites"].values()
    assert [r["name"] for r in suite["results"]] == ["naive Ray Data"]
    assert suite["results"][0]["images_per_s"] > 0


@pytest.mark.ray
def test_bench_raypipe_on_ray_data_contender(sample_dir, tmp_path):
    """The contender runs in its own bench process (its own Ray) and gives a figure beside the others'."""
    out = tmp_path / "b.json"
    args = [
        "bench",
        str(sample_dir),
        "--only",
        "raydata",
        "--suites",
        "plain",
        "--epochs",
        "2",
        "--img-size",
        "32",
        "-b",
        "8",
        "--json",
        str(out),
    ]
    assert cli(args) == 0
    (suite,) = json.loads(out.read_text())["suites"].values()
    assert [r["name"] for r in suite["results"]] == ["raypipe on Ray Data"]
    assert suite["results"][0]["images_per_s"] > 0


def test_ctrl_c_is_one_line_and_exit_130(sample_dir, monkeypatch, capsys):
    from raypipe.cli import run

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "main", interrupted)
    assert cli(["run", str(sample_dir)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "raypipe run: interrupted"


def test_bench_reads_any_source_and_gives_timm_a_folder_copy(ray_local, sample_dir, tmp_path):
    """A Parquet source: raypipe's contenders read it as it is, timm reads a local folder copy of the
    same images (removed afterwards), and the decode limit times its JPEGs."""
    from raypipe.benchmark.data import open_bench_data
    from raypipe.sources.writing.convert import convert

    convert(str(sample_dir), str(tmp_path / "pq"), format="parquet")
    data = open_bench_data(str(tmp_path / "pq")).with_folder(workdir=str(tmp_path))
    try:
        copied = sorted(p for p in Path(data.folder).rglob("*") if p.is_file())
        assert data.copied and len(copied) == data.images == len(list(sample_dir.rglob("*.jpg")))
        assert sorted(p.read_bytes() for p in copied) == sorted(p.read_bytes() for p in sample_dir.rglob("*.jpg"))
        assert len(data.sample_bytes(limit=5)) == 5
    finally:
        data.close()
    assert not Path(data.folder).exists()
    import tempfile

    copies = set(Path(tempfile.gettempdir()).glob("raypipe-bench-folder-*"))
    out = tmp_path / "b.json"
    args = [
        "bench",
        str(tmp_path / "pq"),
        "--only",
        "decode",
        "timm",
        "--timm-workers",
        "1",
        "--suites",
        "plain",
        "--epochs",
        "2",
        "--img-size",
        "32",
        "-b",
        "8",
        "--json",
        str(out),
    ]
    assert cli(args) == 0
    (suite,) = json.loads(out.read_text())["suites"].values()
    assert [r["name"] for r in suite["results"]] == ["decode limit", "timm (1 workers)"]
    assert all(r["images_per_s"] > 0 for r in suite["results"])
    assert set(Path(tempfile.gettempdir()).glob("raypipe-bench-folder-*")) == copies  # the copy is gone
