"""raypipe.pipeline.controller over traces: a simulated rank (workers of a set rate, a trainer of a set
demand, a cluster that brings asked-for workers some intervals later) driven by the controller."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from raypipe.pipeline.controller import (
    ControllerPolicy,
    Observation,
    WidthBounds,
    WidthController,
    decide,
    start,
)

POLICY = ControllerPolicy()
PER_WORKER = 100.0  # images/s one worker makes
SPAN_S = 3.0


@dataclass
class Rank:
    """A rank of ``width`` workers of ``PER_WORKER`` img/s each (at most ``cores`` of them make images: a
    machine with fewer cores than workers) whose trainer takes up to ``demand`` img/s. A worker asked
    for runs ``delay`` intervals later (its node starts); one given back ends at once."""

    width: int
    delay: int = 0
    cores: float = math.inf
    rng: random.Random | None = None  # noise: the trainer's demand and the workers' rate +-10 %, wait blips
    _coming: list[tuple[int, int]] = field(default_factory=list)  # (interval it runs from, width)
    _t: int = 0

    def interval(self, demand: float, wanted: int) -> Observation:
        self._t += 1
        if wanted < self.width:
            self.width, self._coming = wanted, []
        elif wanted > self.width and not any(w == wanted for _, w in self._coming):
            self._coming.append((self._t + self.delay, wanted))
        for at, w in list(self._coming):
            if at <= self._t:
                self.width = w
                self._coming.remove((at, w))
        per_worker, blip = PER_WORKER, 0.0
        if self.rng is not None:
            demand *= self.rng.uniform(0.9, 1.1)
            per_worker *= self.rng.uniform(0.9, 1.1)
            blip = self.rng.uniform(0.0, 0.015)
        capacity = min(self.width, self.cores) * per_worker
        made = min(capacity, demand)
        wait = 1.0 - made / demand if demand > 0 else 0.0
        idle = 1.0 - made / capacity if capacity > 0 else 0.0
        return Observation(
            span_s=SPAN_S,
            wait_s=SPAN_S * min(1.0, wait + blip),
            idle_share=idle,
            ready_chunks=2 if idle > 0.01 else 0,
            width=self.width,
            images=int(made * SPAN_S),
        )


def run(controller: WidthController, rank: Rank, demands) -> list[int]:
    """The width wanted after each interval of ``demands`` (img/s)."""
    out = []
    for demand in demands:
        out.append(controller.observe(rank.interval(demand, controller.wanted)))
    return out


def needed(demand: float) -> int:
    return math.ceil(demand / PER_WORKER - 1e-9)


def settled(controller: WidthController, rank: Rank, demand: float, intervals: int = 40) -> None:
    run(controller, rank, [demand] * intervals)


# -- step up and step down -------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0, 3, 10], ids=["nodes-at-once", "nodes-in-3", "nodes-in-10"])
@pytest.mark.parametrize("demand", [350.0, 180.0, 790.0])
def test_a_step_up_grows_to_the_needed_width_and_stops(demand, delay):
    controller = WidthController(1, WidthBounds(ceiling=16))
    rank = Rank(width=1, delay=delay)
    assert set(run(controller, rank, [80.0] * 10)) == {1}  # one worker feeds it
    widths = run(controller, rank, [demand] * 80)
    final = widths[-1]
    assert needed(demand) <= final <= math.ceil(needed(demand) * (1 + POLICY.headroom))
    assert max(widths) == final  # never past it on the way
    assert set(widths[-30:]) == {final}  # and stops there
    assert rank.interval(demand, final).wait_share == 0.0  # the trainer is fed
    # no growth is asked for while the last one's workers are still coming
    assert controller.changes <= 3


def test_no_growth_is_asked_for_while_the_workers_asked_for_are_coming():
    controller = WidthController(1, WidthBounds(ceiling=64))
    rank = Rank(width=1, delay=8)
    wanted_before = 1
    for _ in range(60):
        obs = rank.interval(5000.0, controller.wanted)
        wanted = controller.observe(obs)
        if obs.width < wanted_before:  # the workers of the last growth are not all there
            assert wanted <= wanted_before
        wanted_before = wanted
    assert controller.wanted > 1


def test_a_step_down_shrinks_after_the_sustained_period_in_one_step():
    controller = WidthController(1, WidthBounds(ceiling=16))
    rank = Rank(width=1)
    settled(controller, rank, 350.0)
    high = controller.wanted
    assert high >= 4
    widths = run(controller, rank, [120.0] * 30)
    changed_at = next(i for i, w in enumerate(widths) if w != high)
    assert changed_at == POLICY.shrink_intervals - 1  # the sixth interval of chunks sitting ready
    assert widths[changed_at] == math.ceil(1.2 * (1 + POLICY.headroom))  # the busy workers and headroom
    assert set(widths[changed_at:]) == {widths[changed_at]}
    assert controller.changes >= 2


def test_a_lost_worker_is_waited_for_not_grown_past():
    controller = WidthController(1, WidthBounds(ceiling=16))
    rank = Rank(width=1)
    settled(controller, rank, 350.0)
    width = controller.wanted
    for _ in range(8):  # a node is lost: one worker fewer while the cluster replaces it
        obs = rank.interval(350.0, controller.wanted)
        lost = Observation(
            span_s=obs.span_s,
            wait_s=obs.span_s * 0.15,
            idle_share=0.0,
            ready_chunks=0,
            width=obs.width - 1,
            images=obs.images,
        )
        assert controller.observe(lost) == width
    assert set(run(controller, rank, [350.0] * 20)) == {width}


def test_a_growth_still_waiting_for_its_nodes_is_withdrawn_when_the_demand_drops():
    controller = WidthController(1, WidthBounds(ceiling=16))
    rank = Rank(width=1, delay=10_000)  # the cluster cannot bring more (its autoscaler at its maximum)
    widths = run(controller, rank, [300.0] * 12)
    assert max(widths) > 1  # asked for more ...
    widths = run(controller, rank, [50.0] * 12)
    assert widths[-1] == 1  # ... and asks no more once one worker feeds it


# -- no oscillation, bounds, start-up ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("demand", [330.0, 300.0])  # 4 workers, whose rate varies as the demand does, feed it
def test_a_noisy_trace_at_the_right_width_does_not_oscillate(demand, seed):
    controller = WidthController(4, WidthBounds(ceiling=16))
    rank = Rank(width=4, rng=random.Random(seed))
    widths = run(controller, rank, [demand] * 300)
    assert set(widths) == {4}
    assert controller.changes == 0


@pytest.mark.parametrize("seed", range(3))
def test_after_a_noisy_step_it_comes_to_rest(seed):
    controller = WidthController(1, WidthBounds(ceiling=16))
    rank = Rank(width=1, rng=random.Random(seed))
    widths = run(controller, rank, [400.0] * 300)
    assert needed(400.0 * 1.1) - 1 <= widths[-1] <= math.ceil(needed(400.0 * 1.1) * (1 + POLICY.headroom))
    assert len(set(widths[-200:])) == 1  # settled: no change over the last 200 intervals
    assert controller.changes <= 4


@pytest.mark.parametrize("seed", range(6))
def test_after_a_noisy_step_down_it_shrinks_and_comes_to_rest(seed):
    """260 img/s +-10 % on workers of 100 +-10 %: between three workers and four, three at times short."""
    controller = WidthController(1, WidthBounds(ceiling=16))
    rank = Rank(width=1, rng=random.Random(seed))
    settled(controller, rank, 700.0)
    before = controller.changes
    widths = run(controller, rank, [260.0] * 400)
    assert widths[-1] in (3, 4)
    assert max(widths[POLICY.shrink_intervals + POLICY.settle_intervals + 1 :]) <= 4
    assert controller.changes - before <= 4  # 8 -> 4 -> 3, and at most one shrink taken back and made again
    assert controller.state.reversals <= 1


def test_a_demand_that_keeps_coming_back_does_not_make_it_flap():
    """Ten intervals that three workers feed, then three that need four, over and over: each shrink to
    three is taken back; the holds after it double, so the changes grow with the log of the time."""
    controller = WidthController(4, WidthBounds(ceiling=16))
    rank = Rank(width=4)
    widths = run(controller, rank, ([250.0] * 10 + [320.0] * 3) * 40)
    assert controller.changes <= 2 * math.ceil(math.log2(len(widths) / POLICY.plateau_hold + 1)) + 2
    assert set(widths[-POLICY.plateau_hold :]) == {4}


def test_a_trainer_that_still_waits_a_little_keeps_its_workers_while_chunks_are_ready():
    controller = WidthController(4, WidthBounds(ceiling=16))
    obs = Observation(span_s=SPAN_S, wait_s=SPAN_S * 0.015, idle_share=0.6, ready_chunks=2, width=4, images=480)
    assert {controller.observe(obs) for _ in range(40)} == {4}


def test_bounds_hold_whatever_the_demand():
    bounds = WidthBounds(floor=3, ceiling=6)
    controller = WidthController(5, bounds)
    rank = Rank(width=5)
    high = run(controller, rank, [2000.0] * 60)
    assert max(high) == 6 and controller.reason.endswith("at the ceiling")
    low = run(controller, rank, [10.0] * 60)
    assert min(low) == 3 and low[-1] == 3
    rng = random.Random(3)
    widths = run(controller, rank, [rng.choice([0.0, 50.0, 500.0, 5000.0]) for _ in range(400)])
    assert all(3 <= w <= 6 for w in widths)


def test_the_start_width_is_put_within_the_bounds():
    assert WidthController(10, WidthBounds(floor=2, ceiling=4)).wanted == 4
    assert WidthController(0, WidthBounds(floor=2, ceiling=4)).wanted == 2


def test_a_fixed_width_is_never_changed():
    controller = WidthController(2, WidthBounds.fixed_at(2))
    rank = Rank(width=2)
    assert set(run(controller, rank, [5000.0] * 30 + [1.0] * 30)) == {2}
    assert controller.reason == "fixed width"


def test_a_trainer_one_worker_feeds_never_asks_for_more_at_start_up():
    controller = WidthController(1, WidthBounds(ceiling=16))
    # the first intervals: the trainer waits for its first batches while the workers set up
    start_up = [
        Observation(span_s=SPAN_S, wait_s=SPAN_S * w, idle_share=0.0, ready_chunks=0, width=1, images=i)
        for w, i in ((0.9, 0), (0.6, 60), (0.3, 150))
    ]
    assert [controller.observe(o) for o in start_up] == [1, 1, 1]
    rank = Rank(width=1, rng=random.Random(1))
    assert set(run(controller, rank, [80.0] * 200)) == {1}


def test_a_growth_that_does_not_raise_the_rate_is_taken_back():
    controller = WidthController(2, WidthBounds(ceiling=16))
    rank = Rank(width=2, cores=2)  # two cores: more workers make no more images
    widths = run(controller, rank, [400.0] * 40)
    assert max(widths) > 2  # tried
    assert widths[-1] == 2 and "limit" in controller.reason  # and went back
    assert set(widths[-20:]) == {2}  # it does not try again at once
    more = run(controller, rank, [400.0] * POLICY.plateau_hold)
    assert max(more) > 2  # after the hold it tries again, and goes back again
    assert run(controller, rank, [400.0] * 20)[-1] == 2


def test_a_trainer_that_waits_while_workers_idle_is_not_given_more_workers():
    controller = WidthController(3, WidthBounds(ceiling=16))
    obs = Observation(span_s=SPAN_S, wait_s=SPAN_S * 0.4, idle_share=0.5, ready_chunks=0, width=3, images=300)
    assert {controller.observe(obs) for _ in range(30)} == {3}
    assert "workers idle" in controller.reason


# -- the pure function and its values ------------------------------------------------------------------------


def test_decide_is_pure():
    bounds = WidthBounds(ceiling=8)
    state = start(1, bounds, POLICY)
    obs = Observation(span_s=3.0, wait_s=2.0, idle_share=0.0, ready_chunks=0, width=1, images=300)
    first = decide(state, obs, bounds, POLICY)
    assert decide(state, obs, bounds, POLICY) == first  # same state and observation, same decision
    assert state == start(1, bounds, POLICY)  # the state given is left as it was


def test_bounds_from_cpus():
    assert WidthBounds.from_cpus(floor_cpus=1.5, ceiling_cpus=8, cpus_per_task=1) == WidthBounds(floor=2, ceiling=8)
    assert WidthBounds.from_cpus(floor_cpus=0, ceiling_cpus=16, cpus_per_task=1, ranks=4) == WidthBounds(ceiling=4)
    assert WidthBounds.from_cpus(floor_cpus=2, ceiling_cpus=3, cpus_per_task=0.5) == WidthBounds(floor=4, ceiling=6)
    with pytest.raises(ValueError, match="^ceiling_cpus="):
        WidthBounds.from_cpus(floor_cpus=0, ceiling_cpus=0.5, cpus_per_task=1)
    with pytest.raises(ValueError, match="^floor_cpus="):
        WidthBounds.from_cpus(floor_cpus=5, ceiling_cpus=4, cpus_per_task=1)
    with pytest.raises(ValueError, match="^cpus_per_task="):
        WidthBounds.from_cpus(floor_cpus=1, ceiling_cpus=4, cpus_per_task=0)


@pytest.mark.parametrize(
    "cls, kwargs, name",
    [
        (Observation, {"span_s": 0.0}, "span_s"),
        (Observation, {"wait_s": 4.0}, "wait_s"),
        (Observation, {"wait_s": -0.1}, "wait_s"),
        (Observation, {"idle_share": 1.5}, "idle_share"),
        (Observation, {"ready_chunks": -1}, "ready_chunks"),
        (Observation, {"width": 1.5}, "width"),
        (Observation, {"images": True}, "images"),
        (WidthBounds, {"floor": 0, "ceiling": 2}, "floor"),
        (WidthBounds, {"floor": 3, "ceiling": 2}, "ceiling"),
        (ControllerPolicy, {"grow_wait": 0.0}, "grow_wait"),
        (ControllerPolicy, {"calm_wait": 0.05}, "calm_wait"),
        (ControllerPolicy, {"max_growth": 1.0}, "max_growth"),
        (ControllerPolicy, {"shrink_intervals": 0}, "shrink_intervals"),
        (ControllerPolicy, {"headroom": float("nan")}, "headroom"),
    ],
)
def test_bad_values_name_the_field(cls, kwargs, name):
    base = {
        Observation: {"span_s": 3.0, "wait_s": 0.0, "idle_share": 0.0, "ready_chunks": 0, "width": 1, "images": 0},
        WidthBounds: {},
        ControllerPolicy: {},
    }[cls]
    with pytest.raises(ValueError, match=f"^{name}="):
        cls(**{**base, **kwargs})


def test_the_controller_imports_nothing_but_the_standard_library():
    """It is pure: no Ray, no workers, nothing of the pipeline."""
    import ast

    import raypipe.pipeline.controller as module

    tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "dataclasses", "math", "raypipe._values"}  # _values: standard library only


def test_fields_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        WidthBounds(1, 4)  # noqa
    bounds = WidthBounds(ceiling=4)
    with pytest.raises(AttributeError):
        bounds.ceiling = 5  # type: ignore[misc]
