"""The bad-input corpus end to end: every file is emitted as a 3-channel image or skipped with its
own reason, the totals add up, and ``raypipe scan`` reports the same classification."""

import json
import os

import image_factory as f
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.cli.main import main as cli
from raypipe.config import DecodeConfig, ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.pipeline import Pipeline, SkipLimitError

pytestmark = pytest.mark.timeout(240)

# file name -> expected reason ("" = must come out as a good image)
CORPUS = {
    "good.jpg": ("", lambda: f.photo_jpeg(size=(120, 90))),
    "truncated.jpg": ("truncated", f.truncated_jpeg),
    "zero.jpg": ("empty", f.empty),
    "random.jpg": ("not_an_image", f.random_bytes),
    "text.jpg": ("not_an_image", f.text_bytes),
    "bomb.png": ("too_large", f.huge_png),
    "cmyk.jpg": ("", f.cmyk_jpeg),
    "gray.jpg": ("", lambda: f.gray("JPEG")),
    "gray.png": ("", lambda: f.gray("PNG")),
    "palette.png": ("", lambda: f.palette_png(True)),
    "la.png": ("", lambda: f.alpha_png("LA")),
    "rgba.png": ("", lambda: f.alpha_png("RGBA")),
    "deep.png": ("", lambda: f.png16(np.full((40, 50), 40000, np.uint16))),
    "exif6.jpg": ("", lambda: f.exif_jpeg(6)),
    "badexif.jpg": ("", f.broken_exif_jpeg),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    root = base / "data"
    cls = root / "cls"
    cls.mkdir(parents=True)
    expected = {}
    for name, (reason, make) in CORPUS.items():
        (cls / name).write_bytes(make())
        expected[name] = reason
    (base / "secret.jpg").write_bytes(f.photo_jpeg(size=(64, 48)))
    os.symlink(base / "secret.jpg", cls / "escape.jpg")
    expected["escape.jpg"] = "outside_root"
    (cls / "locked.jpg").write_bytes(f.photo_jpeg(size=(64, 48)))
    os.chmod(cls / "locked.jpg", 0)
    # root reads mode-000 files anyway; elsewhere it is an unreadable file
    expected["locked.jpg"] = "" if os.geteuid() == 0 else "unreadable"
    (cls / "adir.jpg").mkdir()  # a directory named like an image is not a sample
    try:  # POSIX file names are bytes; these are not UTF-8 (one good image, one truncated)
        (cls / os.fsdecode(b"bad\xffname.jpg")).write_bytes(f.photo_jpeg(size=(64, 48)))
        expected["bad\\xffname.jpg"] = ""
        (cls / os.fsdecode(b"cut\xfe.jpg")).write_bytes(f.truncated_jpeg())
        expected["cut\\xfe.jpg"] = "truncated"  # reported with the name escaped
    except OSError:  # filesystems that only take UTF-8 names
        pass
    (cls / "deleted.jpg").write_bytes(f.photo_jpeg(size=(64, 48)))
    expected["deleted.jpg"] = "missing"
    return root, expected


def _classify(report, batches) -> dict[str, str]:
    return {os.path.basename(s["path"]): s["reason"] for s in report.skipped_paths}


def test_corpus_through_the_pipeline(ray_local, corpus):
    root, expected = corpus
    from raypipe.sources import open_source

    rows = open_source(str(root))  # listing happens before deletion, as in a real race
    (root / "cls" / "deleted.jpg").unlink()
    try:
        pipe = Pipeline(
            rows,
            TrainAugment(input_size=40),
            config=PipelineConfig(batch_size=4, max_skip_ratio=None),
            execution=ExecutionConfig(chunk_rows=32),
            decode=DecodeConfig(max_pixels=50_000_000),
        )
        run = pipe.epoch(0)
        batches = list(run)
    finally:
        (root / "cls" / "deleted.jpg").write_bytes(f.photo_jpeg(size=(64, 48)))
    rep = run.report
    got = _classify(rep, batches)
    want = {k: v for k, v in expected.items() if v}
    assert got == want
    assert "cls/adir.jpg" not in rows.table.column("path").to_pylist()
    assert rep.emitted + rep.num_skipped == rep.expected == len(rows)
    assert rep.emitted == sum(1 for v in expected.values() if not v)
    for b in batches:
        assert b["image"].dtype == np.uint8 and b["image"].shape[-1] == 3


def test_skip_ratio_error_lists_the_paths(ray_local, corpus):
    root, expected = corpus
    pipe = Pipeline(str(root), TrainAugment(input_size=40), config=PipelineConfig(batch_size=4, max_skip_ratio=0.1))
    with pytest.raises(SkipLimitError) as e:
        for _ in pipe.epoch(0):
            pass
    for name in ("truncated.jpg", "bomb.png", "escape.jpg"):
        assert name in str(e.value)


def test_scan_reports_the_same_classification(ray_local, corpus, tmp_path, capsys):
    root, expected = corpus
    out = tmp_path / "scan.json"
    assert cli(["scan", str(root), "--json", str(out)]) == 1  # bad images found
    report = json.loads(out.read_text())
    got = {os.path.basename(s["path"]): s["reason"] for s in report["skipped_paths"]}
    want = {k: v for k, v in expected.items() if v and k != "deleted.jpg"}  # it exists again now
    assert got == want
    assert report["ok"] + sum(report["skipped"].values()) == report["total"]
    assert "skipped" in capsys.readouterr().out


def test_manifest_and_parquet_bad_rows(ray_local, tmp_path):
    img = tmp_path / "a.jpg"
    img.write_bytes(f.photo_jpeg(size=(64, 48)))
    man = tmp_path / "m.jsonl"
    man.write_text(
        '{"path": "a.jpg", "label": 1}\n{"path": "a.jpg"}\n{"path": "a.jpg", "label": "x"}\n'
        '{"path": "../a.jpg", "label": 0}\n'
    )
    cfg = PipelineConfig(batch_size=2, max_skip_ratio=None)  # bad rows on purpose
    run = Pipeline(str(man), TrainAugment(input_size=32), config=cfg).epoch(0)
    list(run)
    assert run.report.emitted == 1 and run.report.skipped == {"bad_label": 2, "outside_root": 1}
    table = pa.table({"image": pa.array([img.read_bytes(), None, b"junk"], pa.binary()), "label": [0, 1, None]})
    pq.write_table(table, tmp_path / "d.parquet")
    pipe = Pipeline(str(tmp_path / "d.parquet"), TrainAugment(input_size=32), config=cfg)
    run = pipe.epoch(0)
    list(run)
    assert run.report.emitted == 1 and run.report.skipped == {"bad_label": 1, "null_image": 1}


def test_mutated_files_give_an_image_or_a_skip_reason():
    """Truncated, bit-flipped and cut JPEGs and PNGs through the train (plain and rand-m9) and eval
    transforms: each comes out as an image of the requested shape or as SkipImage with a known reason;
    no other exception, and no crash in the C extensions (which would take the worker down)."""
    import random

    from raypipe.config import EvalAugment
    from raypipe.kernels import REASONS, SkipImage, build_transform, sample_rng

    transforms = [
        build_transform(TrainAugment(input_size=64)),
        build_transform(TrainAugment(input_size=64, auto_augment="rand-m9-mstd0.5-inc1")),
        build_transform(EvalAugment(input_size=64)),
    ]
    img = f.photo(size=(160, 120))
    sources = [
        f.photo_jpeg(size=(160, 120)),
        f.encode(img, "JPEG", progressive=True, quality=80),
        f.encode(img, "JPEG", subsampling=0),
        f.encode(img, "PNG"),
    ]
    rnd = random.Random(7)
    outcomes = {"image": 0}
    for i in range(240):
        data = bytearray(rnd.choice(sources))
        kind = i % 4
        if kind == 0:  # truncated anywhere
            data = data[: rnd.randrange(1, len(data))]
        elif kind == 1:  # bytes flipped anywhere
            for _ in range(rnd.randint(1, 20)):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
        elif kind == 2:  # bytes flipped in the headers (markers, tables, dimensions)
            for _ in range(rnd.randint(1, 5)):
                data[rnd.randrange(min(len(data), 700))] = rnd.randrange(256)
        else:  # a range cut out
            a, b = sorted(rnd.randrange(len(data)) for _ in range(2))
            del data[a:b]
        t = transforms[i % len(transforms)]
        try:
            out = t(bytes(data), sample_rng(0, 0, i))
        except SkipImage as e:
            assert e.reason in REASONS, e.reason
            outcomes[e.reason] = outcomes.get(e.reason, 0) + 1
            continue
        assert out.shape == (64, 64, 3) and out.dtype == np.uint8
        outcomes["image"] += 1
    # the mutations reach both outcomes (a corpus where everything decodes, or nothing does, tests little)
    assert outcomes["image"] > 20 and sum(outcomes.values()) - outcomes["image"] > 20, outcomes
