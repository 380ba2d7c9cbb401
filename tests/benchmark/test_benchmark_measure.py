"""The benchmark's summary: warm epochs are aggregated (images / seconds), not a median of epoch rates."""

from __future__ import annotations

import time

import pytest

from raypipe.benchmark.measure import measure_epochs


def test_rate_is_all_warm_epochs_together():
    sizes = {0: 10, 1: 40, 2: 10, 3: 10}
    delay = {0: 0.001, 1: 0.005, 2: 0.001, 3: 0.001}  # epoch 1: bigger and 5x slower per image

    def make_epoch(epoch):
        for _ in range(sizes[epoch]):
            time.sleep(delay[epoch])
            yield 1

    r = measure_epochs("fake", make_epoch, epochs=4, count=lambda b: b)
    assert len(r.epoch_rates) == 3  # epoch 0 is the warm-up
    seconds = [n / rate for n, rate in zip((40, 10, 10), r.epoch_rates, strict=True)]
    assert r.images_per_s == pytest.approx(60 / sum(seconds))
    assert r.images_per_s < sorted(r.epoch_rates)[1] * 0.6  # well below the median epoch rate
    assert r.first_batch_s > 0


def test_raypipe_reads_every_epoch_from_one_stream(ray_local, sample_dir, monkeypatch):
    """The bench's raypipe row runs as a training run does: one stream for all epochs (the warm-up epoch
    and the measured ones), closed when the measurement ends."""
    from raypipe.benchmark import contenders
    from raypipe.config import TrainAugment
    from raypipe.pipeline import Pipeline
    from raypipe.pipeline.stream import ChunkStream

    streams, closed = [], []
    make, close = Pipeline.stream, ChunkStream.close
    monkeypatch.setattr(Pipeline, "stream", lambda self, span, **kw: streams.append(span) or make(self, span, **kw))
    monkeypatch.setattr(ChunkStream, "close", lambda self: closed.append(1) or close(self))
    r = contenders.raypipe_pipeline(
        str(sample_dir), TrainAugment(input_size=32), batch_size=8, epochs=3, device_side=False
    )
    assert [span.start_epoch for span in streams] == [0]
    assert closed
    assert len(r.epoch_rates) == 2 and r.images_per_s > 0


def test_the_plot_shows_every_contender_with_its_spread_and_a_caption(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from raypipe.benchmark.measure import Result
    from raypipe.benchmark.report import caption, machine, plot

    suites = {
        "RRC224 + hflip": {
            "raypipe": Result("raypipe", 1000.0, 0.1, [900.0, 1100.0]),
            "timm": Result("timm", 500.0, 0.4, [480.0, 520.0]),
            "decode limit": Result("decode limit", 2500.0, 0.0, [2400.0]),
        }
    }
    text = caption(data="/data/photos", images=4000, batch_size=128, epochs=4, host=machine())
    assert "cores" in text and "/data/photos (4000 images)" in text and "slowest and fastest" in text
    assert "3 epochs after a warm-up epoch" in text  # 4 epochs run, the first not timed
    out = tmp_path / "bench.png"
    plot(str(out), suites, text)
    with Image.open(out) as im:
        assert im.size[0] > 300 and im.size[1] > 300


def test_cold_first_batch_counts_from_the_start_and_steady_rate_leaves_out_epoch_starts():
    """The first batch is timed from the contender's start (``started``), not from its first loop; the
    steady rate leaves out each epoch's wait for its first batch, the headline keeps it."""
    wait = 0.05

    def make_epoch(epoch):
        time.sleep(wait)  # each epoch's start
        for _ in range(10):
            time.sleep(0.001)
            yield 1

    started = time.perf_counter()
    time.sleep(0.1)  # the contender's own start (its Ray, its workers)
    r = measure_epochs("fake", make_epoch, epochs=3, count=lambda b: b, started=started)
    assert r.first_batch_s >= 0.15
    assert r.epoch_start_s == pytest.approx(wait, abs=0.03)
    assert r.steady_per_s > 2 * r.images_per_s  # without the 50 ms waits: ~9 images in ~10 ms
    again = measure_epochs("fake", make_epoch, epochs=3, count=lambda b: b)
    assert again.first_batch_s < 0.1  # no ``started``: from the first epoch's loop


def test_cpu_per_image_counts_the_timed_epochs_work():
    """The machine's busy CPU over the timed epochs, per image: at least the loader's own work (other
    work on the machine only adds to it); the warm-up epoch's work is left out."""

    def burn(seconds: float) -> None:
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    def make_epoch(epoch):
        for _ in range(20):
            burn(0.05 if epoch == 0 else 0.005)  # a slow warm-up: 10x the timed epochs' CPU per image
            yield 1

    r = measure_epochs("fake", make_epoch, epochs=2, count=lambda b: b)
    assert 4.0 <= r.cpu_ms_per_image < 40.0  # 5 ms of this process's CPU per image (ticks of 10 ms)
    assert r.as_dict()["cpu_ms_per_image"] == round(r.cpu_ms_per_image, 3)


def test_median_and_spread_of_epochs():
    from raypipe.benchmark.measure import Result

    r = Result("x", 0.0, 0.0, [900.0, 1000.0, 1100.0])
    assert r.median_rate == 1000.0
    assert r.spread == pytest.approx(0.2)
    assert Result("x", 5.0, 0.0, [800.0]).spread == 0.0


def test_ratios_take_timms_fastest_setting():
    from raypipe.benchmark.measure import Result
    from raypipe.benchmark.report import ratios

    results = {
        "raypipe": Result("raypipe", 1000.0, 2.0, [1000.0], steady_per_s=1200.0),
        "timm (2 workers)": Result("timm (2 workers)", 400.0, 0.5, [400.0], steady_per_s=410.0),
        "timm (4 workers)": Result("timm (4 workers)", 500.0, 1.0, [500.0], steady_per_s=600.0),
        "naive Ray Data": Result("naive Ray Data", 100.0, 3.0, [100.0]),
    }
    got = ratios(results)
    assert got["raypipe/timm"] == 2.0
    assert got["steady raypipe/timm"] == 2.0
    assert got["first_batch raypipe/timm"] == 2.0  # against the same (fastest) setting's first batch
    assert got["raypipe/naive_ray_data"] == 10.0
    assert got["raypipe/decode_limit"] is None


def _first_batches(monkeypatch):
    """Make ``measure_epochs`` keep each contender's first batch instead of timing it."""
    from raypipe.benchmark import contenders

    got = {}

    def keep_first(name, make_epoch, *, epochs, count, **kw):
        from raypipe.benchmark.measure import Result

        it = iter(make_epoch(0))
        got[name] = next(it)
        for _ in it:  # finish the epoch, so the loader closes cleanly
            pass
        return Result(name, 1.0, 0.0, [1.0])

    monkeypatch.setattr(contenders, "measure_epochs", keep_first)
    return got


def test_every_loader_that_feeds_a_trainer_gives_normalised_fp32_nchw(ray_local, sample_dir, monkeypatch):
    """Same output for every contender a trainer would use: the bench compares like with like."""
    from raypipe.benchmark import contenders
    from raypipe.config import TrainAugment

    got = _first_batches(monkeypatch)
    aug = TrainAugment(input_size=32, color_jitter=None)
    contenders.raypipe_pipeline(str(sample_dir), aug, batch_size=8, epochs=1)
    contenders.timm_loader(str(sample_dir), aug, batch_size=8, epochs=1, workers=1)
    contenders.naive_ray_data(str(sample_dir), aug, batch_size=8, epochs=1)
    contenders.raypipe_on_ray_data(str(sample_dir), aug, batch_size=8, epochs=1)
    images = {
        "raypipe": got["raypipe"][0],
        "timm": got["timm (1 workers)"][0],
        "naive": got["naive Ray Data"]["image"],
        "raypipe on Ray Data": got["raypipe on Ray Data"]["image"],
    }
    for name, x in images.items():
        assert str(x.dtype) == "torch.float32", name
        assert tuple(x.shape) == (8, 3, 32, 32), name
        assert -3.0 < float(x.float().mean()) < 3.0 and float(x.min()) < 0, name  # normalised, not 0..255
