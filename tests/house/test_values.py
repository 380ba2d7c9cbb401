"""One rule for option values (raypipe._values), whichever layer checks them: a NumPy integer is an int,
a bool is not, and the error names the field first."""

import numpy as np
import pytest

from raypipe._values import check_int, check_prob, is_int, is_number
from raypipe.config import ExecutionConfig, PipelineConfig, TrainAugment
from raypipe.device.erasing import RandomErasing
from raypipe.pipeline.controller import WidthBounds
from raypipe.plan.span import RankSpan


def test_numpy_integers_are_ints_and_bools_are_not():
    assert is_int(3) and is_int(np.int64(3)) and is_int(np.uint8(3))
    assert not any(is_int(v) for v in (True, np.bool_(True), 3.0, "3", None))
    assert is_number(np.float32(0.5)) and is_number(np.int32(2)) and not is_number(True) and not is_number(float("nan"))
    assert check_int("n", np.int64(4), 1) == 4 and type(check_int("n", np.int64(4), 1)) is int
    assert type(check_prob("p", np.float32(0.5))) is float


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda v: PipelineConfig(batch_size=v), "batch_size"),
        (lambda v: ExecutionConfig(num_tasks=v), "num_tasks"),
        (lambda v: TrainAugment(input_size=v), "input_size"),
        (lambda v: RandomErasing(probability=0.5, min_count=v), "min_count"),
        (lambda v: WidthBounds(floor=v, ceiling=8), "floor"),
        (lambda v: RankSpan(rank=0, world_size=v), "world_size"),
    ],
)
def test_every_layer_takes_a_numpy_int_and_refuses_a_bool_naming_the_field(make, name):
    made = make(np.int64(2))
    kept = getattr(made, name)
    assert kept == 2 or kept == (2, 2)
    for bad in (True, np.bool_(True)):
        with pytest.raises(ValueError, match=rf"^{name}=(True|np\.True_)(\)|): "):
            make(bad)


def test_configs_keep_python_ints_so_they_write_to_json():
    import json

    cfg = PipelineConfig(batch_size=np.int64(32), seed=np.int32(7))
    assert type(cfg.batch_size) is int and type(cfg.seed) is int
    json.dumps({"batch_size": cfg.batch_size, "seed": cfg.seed})
    assert TrainAugment(input_size=np.int64(64)).input_size == (64, 64)
