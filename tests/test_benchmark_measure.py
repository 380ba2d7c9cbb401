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
    monkeypatch.setattr(Pipeline, "stream", lambda self, **kw: streams.append(kw) or make(self, **kw))
    monkeypatch.setattr(ChunkStream, "close", lambda self: closed.append(1) or close(self))
    r = contenders.raypipe_pipeline(str(sample_dir), TrainAugment(input_size=32), batch_size=8, epochs=3,
                                    device_side=False)
    assert [kw["start_epoch"] for kw in streams] == [0]
    assert closed
    assert len(r.epoch_rates) == 2 and r.images_per_s > 0


def test_the_plot_shows_every_contender_with_its_spread_and_a_caption(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from raypipe.benchmark.measure import Result
    from raypipe.benchmark.report import caption, machine, plot

    suites = {"RRC224 + hflip": {"raypipe": Result("raypipe", 1000.0, 0.1, [900.0, 1100.0]),
                                 "timm": Result("timm", 500.0, 0.4, [480.0, 520.0]),
                                 "decode limit": Result("decode limit", 2500.0, 0.0, [2400.0])}}  # fmt: skip
    text = caption(data="/data/photos", images=4000, batch_size=128, epochs=4, host=machine())
    assert "cores" in text and "/data/photos (4000 images)" in text and "slowest and fastest" in text
    out = tmp_path / "bench.png"
    plot(str(out), suites, text)
    with Image.open(out) as im:
        assert im.size[0] > 300 and im.size[1] > 300
