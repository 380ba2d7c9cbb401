"""``raypipe bench``'s rows for other projects' loaders (NVIDIA DALI on the CPU, SPDL): run where they are
installed, and where they are not a row that says so with the command that installs them."""

from __future__ import annotations

import json
import sys

import pytest

from raypipe.benchmark import peers
from raypipe.cli.main import main as cli
from raypipe.config import TrainAugment

PLAIN = TrainAugment(input_size=32, color_jitter=None)  # the bench's plain suite, at 32 px


def _need(key: str) -> None:
    """Skip unless ``key``'s library (and the system libraries it loads) is installed here."""
    pytest.importorskip(peers.PEERS[key].module)
    why = peers.missing(key)
    if why:
        pytest.skip(why)


def _bench(data, tmp_path, *only: str, suites=("plain",)) -> list[dict]:
    out = tmp_path / "b.json"
    args = [
        "bench",
        str(data),
        "--only",
        *only,
        "--suites",
        *suites,
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
    return [r for suite in json.loads(out.read_text())["suites"].values() for r in suite["results"]]


@pytest.mark.parametrize("key", ["dali", "spdl"])
def test_an_installed_peer_gives_a_row_with_every_figure(key, sample_dir, tmp_path):
    """The row runs in its own bench process, on the same folder, and has img/s, the machine's CPU per
    image, its first batch and where its images differ from raypipe's."""
    _need(key)
    (row,) = _bench(sample_dir, tmp_path, key)
    assert row["name"] == peers.PEERS[key].label and not row["skipped"]
    assert row["images_per_s"] > 0 and row["cpu_ms_per_image"] > 0 and row["first_batch_s"] > 0
    assert len(row["epoch_rates"]) == 1  # the first epoch is the warm-up
    assert row["differs"] and "threads" in row["note"]


@pytest.mark.parametrize("key", ["dali", "spdl"])
def test_a_peer_delivers_what_the_other_rows_deliver(key, sample_dir):
    """Normalised fp32 NCHW batches of the bench's size, full batches, each image of an epoch once."""
    _need(key)
    module = __import__(f"raypipe.benchmark.peers.{key}", fromlist=["build_loader"])
    loader = module.build_loader(str(sample_dir), PLAIN, batch_size=8, threads=2)
    for epoch in range(2):  # each pass over the loader is an epoch
        labels = []
        for batch in loader:
            batch = batch[0] if isinstance(batch, list) else batch  # DALI: one dict per pipeline
            x = batch["image"]
            assert str(x.dtype) == "torch.float32" and tuple(x.shape) == (8, 3, 32, 32) and x.is_contiguous()
            assert -3.0 < float(x.mean()) < 3.0 and float(x.min()) < 0  # normalised, not 0..255
            labels += [int(v) for v in batch["label"].flatten()]
        assert len(labels) == 48  # 4 classes x 12 images, 6 full batches
        assert sorted(labels) == sorted(i // 12 for i in range(48)), epoch  # class folders in sorted order


def test_spdl_filter_crops_resizes_and_flips():
    from raypipe.benchmark.peers.spdl import filter_desc

    assert filter_desc((5, 3, 21, 31), (24, 32), "bilinear", True) == (
        "crop=w=31:h=21:x=3:y=5,scale=w=32:h=24:flags=bilinear,hflip,format=pix_fmts=rgb24"
    )
    assert "hflip" not in filter_desc((0, 0, 8, 8), (4, 4), "bicubic", False)


def test_spdl_lists_an_image_folder_as_image_folder_does(tmp_path):
    from raypipe.benchmark.peers.spdl import list_folder

    for path in ("b/2.jpg", "b/1.JPEG", "a/x/3.png", "a/notes.txt", "c/4.webp", "top.jpg"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"")
    got = [(p.removeprefix(str(tmp_path) + "/"), label) for p, label in list_folder(str(tmp_path))]
    assert got == [("a/x/3.png", 0), ("b/1.JPEG", 1), ("b/2.jpg", 1), ("c/4.webp", 2)]


def test_rows_of_peers_not_installed_say_so_with_the_install_command(sample_dir, tmp_path, monkeypatch, capsys):
    """Neither library importable (as on CI): the bench goes on, and each row names the command."""
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import fails, find_spec finds nothing
    monkeypatch.setitem(sys.modules, "spdl.io", None)
    rows = _bench(sample_dir, tmp_path, "dali", "spdl", "decode")
    assert [r["name"] for r in rows] == ["decode limit", "DALI (CPU)", "SPDL"]
    assert rows[0]["images_per_s"] > 0 and rows[0]["cpu_ms_per_image"] > 0  # the other rows still run
    dali, spdl = rows[1], rows[2]
    assert dali["skipped"].startswith("not installed: pip install nvidia-dali-cuda120")
    assert spdl["skipped"].startswith("not installed: pip install spdl")
    assert dali["images_per_s"] == 0 and spdl["images_per_s"] == 0
    out = capsys.readouterr().out
    assert "pip install nvidia-dali-cuda120" in out and "pip install spdl" in out and ".[peers]" in out


def test_spdl_without_ffmpeg_says_which_libraries_and_the_apt_command(monkeypatch):
    import ctypes.util

    monkeypatch.setattr(peers, "_importable", lambda module: True)  # SPDL's wheel is there
    # this machine's own FFmpeg (or its absence) left out: every other library is there
    monkeypatch.setattr(
        ctypes.util, "find_library", lambda name: None if name in ("avutil", "swscale") else f"lib{name}.so"
    )
    why = peers.missing("spdl")
    assert why.startswith("not installed: FFmpeg's shared libraries (libavutil, libswscale")
    assert why.endswith(peers.FFMPEG_APT) and "apt-get install" in why
    assert peers.missing("dali") is None  # DALI loads no system library
    monkeypatch.setattr(peers, "_importable", lambda module: False)  # neither: both commands at once
    why = peers.missing("spdl")
    assert why.startswith("not installed: pip install spdl") and why.endswith(peers.FFMPEG_APT)


def test_peers_run_only_the_work_they_can_do():
    """They crop, flip, resize and normalise: a suite with more is not theirs to run."""
    assert peers.unsupported(PLAIN) is None
    aa = TrainAugment(input_size=32, color_jitter=None, auto_augment="rand-m9-mstd0.5-inc1")
    assert "rand-m9-mstd0.5-inc1" in peers.unsupported(aa)
    assert "colour jitter" in peers.unsupported(TrainAugment(input_size=32))  # timm's default jitter 0.4
    assert "vertical flip" in peers.unsupported(TrainAugment(input_size=32, color_jitter=None, vflip=0.5))


def test_the_table_and_the_plot_show_rows_without_a_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from raypipe.benchmark.measure import Result
    from raypipe.benchmark.report import format_table, plot, ratios

    results = {
        "raypipe": Result("raypipe", 1000.0, 0.5, [990.0, 1010.0], cpu_ms_per_image=1.9),
        "DALI (CPU)": Result("DALI (CPU)", 500.0, 0.2, [500.0], cpu_ms_per_image=3.8, differs="another resize"),
        "SPDL": peers.skipped_row("spdl", "not installed: pip install spdl"),
    }
    table = format_table("plain", results)
    assert "CPU ms/img" in table and "1.90" in table and "3.80" in table
    assert "SPDL: not installed: pip install spdl" in table
    assert "DALI (CPU), where its images differ from raypipe's: another resize" in table
    got = ratios(results)
    assert got["raypipe/dali_cpu"] == 2.0 and got["raypipe/spdl"] is None
    out = tmp_path / "b.png"
    plot(str(out), {"plain": results})
    with Image.open(out) as im:
        assert im.format == "PNG"
