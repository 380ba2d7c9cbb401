import dataclasses

import pytest

from raypipe.config import (
    DecodeConfig,
    EvalAugment,
    ExecutionConfig,
    PipelineConfig,
    TrainAugment,
    auto_chunk_rows,
    config_from_dict,
    load_yaml,
)


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (TrainAugment, {"scale": (0.9, 0.1)}, "scale"),
        (TrainAugment, {"ratio": (1.0,)}, "ratio"),
        (TrainAugment, {"hflip": 1.5}, "hflip"),
        (TrainAugment, {"interpolation": "nearest"}, "interpolation"),
        (TrainAugment, {"input_size": (1, 224, 224)}, "input_size"),
        (TrainAugment, {"auto_augment": "bogus-m9"}, "auto_augment"),
        (TrainAugment, {"color_jitter": (0.4, 0.4)}, "color_jitter"),
        (EvalAugment, {"crop_pct": 0.0}, "crop_pct"),
        (EvalAugment, {"crop_mode": "zoom"}, "crop_mode"),
        (PipelineConfig, {"batch_size": 0}, "batch_size"),
        (PipelineConfig, {"shuffle_window": 0}, "shuffle_window"),
        (PipelineConfig, {"max_skip_ratio": 2}, "max_skip_ratio"),
        (ExecutionConfig, {"resources": {"preprocess": -1}}, "resources"),
        (ExecutionConfig, {"worker_nice": 20}, "worker_nice"),
        (ExecutionConfig, {"worker_sched_idle": "yes"}, "worker_sched_idle"),
        (ExecutionConfig, {"chunk_rows": 0}, "chunk_rows"),
        (ExecutionConfig, {"num_tasks": 0}, "num_tasks"),
        (ExecutionConfig, {"cpus_per_task": 0}, "cpus_per_task"),
        (ExecutionConfig, {"prefetch_chunks": -1}, "prefetch_chunks"),
        (DecodeConfig, {"max_pixels": 0}, "max_pixels"),
    ],
)
def test_invalid_values_name_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_normalises_timm_style_values():
    aug = TrainAugment(input_size=(3, 160, 128), color_jitter=0.3)
    assert aug.input_size == (160, 128)
    assert aug.color_jitter == (0.3, 0.3, 0.3)
    assert TrainAugment(input_size=96).input_size == (96, 96)


def test_configs_are_frozen_and_keyword_only():
    aug = TrainAugment()
    with pytest.raises(dataclasses.FrozenInstanceError):
        aug.hflip = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrainAugment((224, 224))  # type: ignore[misc]


def test_yaml_is_strict(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("augment:\n  hflip: 0.5\n  hflip: 0.2\n")
    with pytest.raises(ValueError, match="duplicated key 'hflip'"):
        load_yaml(dup)
    unknown = {"hflip": 0.5, "hfilp": 0.1}
    with pytest.raises(ValueError, match="hfilp"):
        config_from_dict(TrainAugment, unknown)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("augment: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(Exception, match="could not determine a constructor|constructor"):
        load_yaml(unsafe)


def test_config_from_dict_builds_valid_objects():
    aug = config_from_dict(TrainAugment, {"scale": [0.2, 1.0], "input_size": 128})
    assert aug.scale == (0.2, 1.0) and aug.input_size == (128, 128)


@pytest.mark.parametrize(
    "batch, block",
    [
        (1, 128),
        (32, 128),
        (48, 144),
        (100, 200),
        (128, 128),
        (256, 256),
        (384, 192),
        (512, 256),
        (1000, 250),
        (257, 256),
    ],
)
def test_chunk_rows_follow_the_batch_size(batch, block):
    assert auto_chunk_rows(batch) == block
    assert ExecutionConfig().chunk_rows_for(batch) == block
    # a multiple of the batch (whole batches are views of a chunk) or a divisor (chunks pack whole batches)
    assert block % batch == 0 or batch % block == 0 or batch == 257
    assert ExecutionConfig(chunk_rows=64).chunk_rows_for(batch) == 64  # an explicit value wins


def test_worker_sched_idle_is_decided_by_the_trainer_when_left_open():
    auto = ExecutionConfig()
    assert auto.worker_sched_idle is None
    assert auto.resolved_for(gpu_trainer=True).worker_sched_idle is True  # a GPU trainer sleeps each step
    assert auto.resolved_for(gpu_trainer=False).worker_sched_idle is False  # a CPU trainer would starve them
    for chosen in (True, False):  # a user's choice stands either way
        cfg = ExecutionConfig(worker_sched_idle=chosen)
        assert cfg.resolved_for(gpu_trainer=not chosen).worker_sched_idle is chosen
    assert auto.resolved_for(gpu_trainer=True).cpus_per_task == auto.cpus_per_task  # nothing else changes


def test_cpus_per_task_is_decided_by_where_the_dataset_lies_when_left_open():
    auto = ExecutionConfig()
    assert auto.cpus_per_task is None
    assert auto.cpus_per_task_for(store_objects=False) == 1.0  # a task per core
    assert auto.cpus_per_task_for(store_objects=True) == 0.5  # one decodes while the other waits for its bytes
    assert ExecutionConfig(cpus_per_task=2).cpus_per_task_for(store_objects=True) == 2.0  # a user's choice stands


def test_load_config_reads_every_section():
    from raypipe.config import load_config

    cfg = load_config({"pipeline": {"batch_size": 8}, "execution": {"num_tasks": 3}, "train": {"epochs": 2}})
    assert cfg.pipeline.batch_size == 8 and cfg.execution.num_tasks == 3 and dict(cfg.train) == {"epochs": 2}
    assert load_config({}).execution == ExecutionConfig()
