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



def test_raypipe_window_is_a_long_runs_steady_state(ray_local, sample_dir, monkeypatch):
    """The bench's raypipe row: the warm-up epoch warms epoch 1 up, each measured epoch warms the next,
    and the last one warms an epoch nobody reads, which closing the source releases (as in a long run,
    the window inherits one head start and hands one on)."""
    from raypipe.benchmark import contenders
    from raypipe.config import TrainAugment
    from raypipe.pipeline.pipeline import EpochRun

    warmed, dropped = [], []  # started before anyone iterated them / stopped without being iterated
    prestart, cancel = EpochRun.prestart, EpochRun.cancel
    monkeypatch.setattr(EpochRun, "prestart",
                        lambda run: (run._started or warmed.append(run.epoch), prestart(run))[1])
    monkeypatch.setattr(EpochRun, "cancel", lambda run: (run._started or dropped.append(run.epoch), cancel(run))[1])
    r = contenders.raypipe_pipeline(str(sample_dir), TrainAugment(input_size=32), batch_size=8, epochs=3,
                                    device_side=False)
    assert warmed == [1, 2, 3]
    assert dropped == [3]
    assert len(r.epoch_rates) == 2 and r.images_per_s > 0
