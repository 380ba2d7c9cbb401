"""The position value (``raypipe.plan.position``): one JSON shape, read back as it was written, checked
field by field; one rank's value or every rank's list told apart in one place; raypipe 0.1.0's shapes
read as this release's value, with the trainer's count."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from raypipe.plan.position import PlanIdentity, Position, StateMismatchError, read_positions

PLAN = PlanIdentity(
    listing="ab" * 32, rows=100, shards="", seed=0, shuffle=True, shuffle_window=2048, batch_size=5, drop_last=False
)
OLD = json.loads((Path(__file__).parents[1] / "fixtures" / "rank_loader_positions_v0.1.0.json").read_text())


def position(rank=0, world=2, batches=3, remaining=((15, 50),), epoch=1, plan=PLAN) -> Position:
    return Position(epoch=epoch, batches=batches, rank=rank, world_size=world, remaining=remaining, plan=plan)


def test_a_position_is_one_json_value_read_back_as_written():
    at = position()
    saved = json.loads(json.dumps(at.as_dict()))
    plan = {
        "listing": "ab" * 32,
        "rows": 100,
        "shards": "",
        "seed": 0,
        "shuffle": True,
        "shuffle_window": 2048,
        "batch_size": 5,
        "drop_last": False,
    }
    assert saved == {
        "format": "raypipe-position",
        "version": 2,
        "epoch": 1,
        "rank": 0,
        "world_size": 2,
        "batches": 3,
        "remaining": [[15, 50]],
        "plan": plan,
    }
    assert Position.from_dict(saved) == at
    assert at.rows_left == 35 and at.placed and at.with_batches(7).batches == 7
    bare = Position(epoch=2, batches=4)  # a loader over a source with no plan: the epoch and the count
    assert Position.from_dict(json.loads(json.dumps(bare.as_dict()))) == bare and not bare.placed
    with pytest.raises(ValueError, match="no rows left to count"):
        _ = bare.rows_left


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format": "other"}, "not a raypipe position"),
        ({"version": 3}, "version 3"),
        ({"epoch": -1}, "epoch is -1"),
        ({"batches": "3"}, "batches is '3'"),
        ({"rank": 2}, "rank 2 of 2"),
        ({"remaining": [[50, 15]]}, "not ascending ranges"),
        ({"remaining": [[10, 20], [15, 30]]}, "not ascending ranges"),
        ({"remaining": [[10, 101]]}, "epoch's 100 positions"),
        ({"remaining": [[1.5, 3]]}, "not a list of"),
        ({"plan": {"listing": "x"}}, "plan has the keys"),
        ({"plan": None}, "or none"),
    ],
)
def test_a_bad_value_is_refused_naming_what_is_wrong(change, match):
    with pytest.raises(StateMismatchError, match=match):
        Position.from_dict({**position().as_dict(), **change})


def test_one_ranks_value_or_every_ranks_list():
    one = read_positions(position(rank=1).as_dict())
    assert not one.every_rank and one.epoch == 1 and one.batches == 3 and one.world_size == 2
    assert one.as_state() == position(rank=1).as_dict()
    assert one.segments(PLAN, rank=1, world_size=2) == [(15, 50)]
    with pytest.raises(StateMismatchError, match="rank 1 of 2, this is rank 0 of 3"):
        one.segments(PLAN, rank=0, world_size=3)
    states = [position(rank=1, batches=4, remaining=((60, 100),)).as_dict(), position().as_dict()]  # any order
    every = read_positions(states)
    assert every.every_rank and [p.rank for p in every.positions] == [0, 1] and every.batches == 4
    assert every.rows_left == 35 + 40 and isinstance(every.as_state(), list)
    assert every.segments(PLAN, rank=1, world_size=2) == [(60, 100)]  # the same ranks: each its own
    assert [every.segments(PLAN, rank=r, world_size=3) for r in range(3)] == [
        [(15, 40)],
        [(40, 50), (60, 75)],
        [(75, 100)],
    ]  # another number: what is left, split again
    for bad, match in (
        ([], "no saved position"),
        ([states[0]], r"ranks \[1\], expected each of 0 … 1"),
        ([states[1], position(epoch=2, rank=1).as_dict()], "different epochs"),
        ([states[1], Position(epoch=1, batches=0).as_dict()], "with and without a plan"),
    ):
        with pytest.raises(StateMismatchError, match=match):
            read_positions(bad)
    other = PlanIdentity(**{**PLAN.__dict__, "seed": 1})
    with pytest.raises(StateMismatchError, match="seed 0 in the state, 1 here"):
        one.segments(other, rank=1, world_size=2)


def test_the_shapes_of_0_1_0_are_read_with_the_trainers_count():
    # RankLoader's: DeviceLoader {"format": "raypipe-device-loader", "source": EqualBatches {"batches",
    # "source": <version 1>}}; after a repeated batch the source's own count is one less than the trainer's
    repeat = next(c for c in OLD["cases"] if "repeated" in c["name"])["states"]
    assert repeat["batches"] == 6 and repeat["source"]["source"]["batches"] == 5
    at = Position.from_dict(repeat)
    inner = repeat["source"]["source"]
    assert (at.epoch, at.batches, at.rank, at.world_size) == (0, 6, inner["rank"], inner["world_size"])
    assert at.remaining == tuple(map(tuple, inner["remaining"])) and at.plan == PlanIdentity(**inner["plan"])
    # EqualBatches' envelope alone, a DeviceLoader's around a bare position, a bare position
    assert Position.from_dict(repeat["source"]) == at
    device = {"format": "raypipe-device-loader", "epoch": 0, "batches": 6, "source": inner}
    assert Position.from_dict(device) == at
    assert Position.from_dict(inner) == at.with_batches(5)
    # between passes 0.1.0's EqualBatches counted 0 where its source and the DeviceLoader had the loaded count
    between = {"format": "raypipe-device-loader", "epoch": 0, "batches": 6, "source": {"batches": 0, "source": inner}}
    assert Position.from_dict(between).batches == 6
    assert Position.from_dict({"batches": 0, "source": {**inner, "batches": 6}}).batches == 6
    # a DeviceLoader over a source with no position
    plain = {"format": "raypipe-device-loader", "epoch": 2, "batches": 5, "source": None}
    assert Position.from_dict(plain) == Position(epoch=2, batches=5)
    # every rank's list of 0.1.0 states is read as every rank's values
    two = next(c for c in OLD["cases"] if c["world"] == 2 and isinstance(c["states"], list))["states"]
    saved = read_positions(two)
    assert saved.every_rank and [p.rank for p in saved.positions] == [0, 1] and saved.batches == 2
    assert read_positions(saved.as_state()) == saved  # and written back in this release's shape
    bad = copy.deepcopy(two[0])
    bad["source"]["source"]["epoch"] = 3
    with pytest.raises(StateMismatchError, match="epoch 0 and its source's position of epoch 3"):
        Position.from_dict(bad)
    with pytest.raises(StateMismatchError, match="not a raypipe position of version 1"):
        Position.from_dict({"format": "raypipe-device-loader", "epoch": 0, "batches": 1, "source": {"x": 1}})
