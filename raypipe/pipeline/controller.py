"""Pure: the width (augmentation workers) a rank wants next, from what its trainer and workers did.

Each interval, from the trainer's first batch on, the rank observes its trainer's wait for data, its
workers' idle share, the chunks ready ahead of the trainer, the workers running and the images taken
(``Observation``); ``decide`` turns that and the state into the width wanted next. It grows while the
trainer waits and the workers run busy at the wanted width, to the width that would have fed it
(``width / (1 - wait share)``, plus headroom, at most ``max_growth`` times in one step); it shrinks
to the workers busy plus headroom once chunks sat ready, the trainer fed, ``shrink_intervals`` in a
row. After a change it lets ``settle_intervals`` pass at the new width before judging; a growth that
raised the rate too little while the trainer still waits is taken back (more workers do not help),
and a shrink taken back holds longer each time. Never outside ``WidthBounds``; fixed: never changed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from raypipe._values import check_int, fail, is_number

__all__ = [
    "Observation",
    "WidthBounds",
    "ControllerPolicy",
    "ControllerState",
    "Decision",
    "decide",
    "start",
    "WidthController",
]


def _number(name: str, value, lo: float, hi: float = math.inf, *, open_lo: bool = False) -> None:
    if not is_number(value):
        fail(name, value, "expected a number")
    if value < lo or (open_lo and value == lo) or value > hi:
        fail(name, value, f"expected {lo} {'<' if open_lo else '<='} {name} <= {hi}")


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One interval of a rank: ``span_s`` long, the trainer blocked on data ``wait_s`` of it, the
    workers idle ``idle_share`` of their time, ``ready_chunks`` finished ahead of the trainer at its
    end, ``width`` workers running, ``images`` taken by the trainer."""

    span_s: float
    wait_s: float
    idle_share: float
    ready_chunks: int
    width: int
    images: int

    def __post_init__(self) -> None:
        _number("span_s", self.span_s, 0.0, open_lo=True)
        _number("wait_s", self.wait_s, 0.0, self.span_s * (1 + 1e-6))
        _number("idle_share", self.idle_share, 0.0, 1.0)
        check_int("ready_chunks", self.ready_chunks, 0)
        check_int("width", self.width, 0)
        check_int("images", self.images, 0)

    @property
    def wait_share(self) -> float:
        return min(1.0, self.wait_s / self.span_s)

    @property
    def rate(self) -> float:
        return self.images / self.span_s

    @property
    def busy_workers(self) -> float:
        return self.width * (1.0 - self.idle_share)


@dataclass(frozen=True, kw_only=True)
class WidthBounds:
    """The user's bounds on a rank's width, in workers; ``floor == ceiling`` fixes it."""

    floor: int = 1
    ceiling: int

    def __post_init__(self) -> None:
        check_int("floor", self.floor, 1)
        check_int("ceiling", self.ceiling, 1)
        if self.ceiling < self.floor:
            fail("ceiling", self.ceiling, f"expected >= floor ({self.floor})")

    @property
    def fixed(self) -> bool:
        return self.floor == self.ceiling

    def clamp(self, width: int) -> int:
        return max(self.floor, min(self.ceiling, width))

    @classmethod
    def fixed_at(cls, width: int) -> WidthBounds:
        """A width that is not controlled (``ExecutionConfig(num_tasks=…)``)."""
        return cls(floor=width, ceiling=width)

    @classmethod
    def from_cpus(cls, *, floor_cpus: float, ceiling_cpus: float, cpus_per_task: float, ranks: int = 1) -> WidthBounds:
        """Bounds in CPUs (per rank, or for a job of ``ranks`` ranks, each taking its part) as whole
        workers of ``cpus_per_task``: the floor rounded up (at least one worker), the ceiling down."""
        _number("cpus_per_task", cpus_per_task, 0.0, open_lo=True)
        check_int("ranks", ranks, 1)
        _number("floor_cpus", floor_cpus, 0.0)
        _number("ceiling_cpus", ceiling_cpus, 0.0)
        ceiling = math.floor(ceiling_cpus / ranks / cpus_per_task + 1e-9)
        if ceiling < 1:
            fail("ceiling_cpus", ceiling_cpus, f"less than one worker of {cpus_per_task:g} CPU per rank ({ranks})")
        floor = max(1, math.ceil(floor_cpus / ranks / cpus_per_task - 1e-9))
        if floor > ceiling:
            fail("floor_cpus", floor_cpus, f"more than ceiling_cpus={ceiling_cpus!r}")
        return cls(floor=floor, ceiling=ceiling)


@dataclass(frozen=True, kw_only=True)
class ControllerPolicy:
    """How the controller judges (the defaults, with what each is for)."""

    # The trainer's wait share, in each of ``grow_intervals`` in a row, above which it grows (sized from
    # their mean): the stall it tolerates.
    grow_wait: float = 0.02
    grow_intervals: int = 2
    # Workers idle at most this share (mean over those intervals) run at their width: a trainer that
    # waits while workers idle waits on something else (the consumer, the network), not on their number.
    busy_idle: float = 0.25
    # The trainer's mean wait share over ``shrink_intervals`` at most this for a shrink (none of them above
    # ``grow_wait``), chunks ready ahead in each. Slower to shrink than to grow: a stall costs more than a node.
    calm_wait: float = 0.01
    shrink_intervals: int = 6
    # Spare capacity sized in, growing and shrinking alike, so noise around the right width changes nothing.
    headroom: float = 0.15
    # The most one growth multiplies the width by: a wait share near 1 (a stuck read) is no measure of need.
    max_growth: float = 2.0
    # Intervals not judged after the start (the window fills) and after the width reached a new value
    # (new workers set up); observations start at the trainer's first batch.
    warmup_intervals: int = 3
    settle_intervals: int = 2
    # A growth from w0 to w1 must raise the rate by this part of w1/w0 - 1 while the trainer still
    # waits, or it is taken back, and the width it came from is the limit for ``plateau_hold`` intervals.
    # A growth right after a shrink takes the shrink back: no shrink below it for ``plateau_hold``
    # intervals, doubled at each such growth (noise around a width between two does not flap).
    min_gain: float = 0.25
    plateau_hold: int = 60

    def __post_init__(self) -> None:
        _number("grow_wait", self.grow_wait, 0.0, 1.0, open_lo=True)
        check_int("grow_intervals", self.grow_intervals, 1)
        _number("busy_idle", self.busy_idle, 0.0, 1.0)
        _number("calm_wait", self.calm_wait, 0.0, 1.0)
        if self.calm_wait >= self.grow_wait:
            fail("calm_wait", self.calm_wait, f"expected < grow_wait ({self.grow_wait}): a band where nothing changes")
        check_int("shrink_intervals", self.shrink_intervals, 1)
        _number("headroom", self.headroom, 0.0, 1.0)
        _number("max_growth", self.max_growth, 1.0, open_lo=True)
        check_int("warmup_intervals", self.warmup_intervals, 0)
        check_int("settle_intervals", self.settle_intervals, 0)
        _number("min_gain", self.min_gain, 0.0, 1.0)
        check_int("plateau_hold", self.plateau_hold, 0)

    @property
    def memory(self) -> int:
        return max(self.grow_intervals, self.shrink_intervals)


@dataclass(frozen=True)
class _Trial:
    """A growth not yet judged: the width it came from and the rate the trainer got there."""

    width: int
    rate: float


@dataclass(frozen=True)
class ControllerState:
    """What the controller carries from one interval to the next (``start`` makes the first)."""

    wanted: int
    arrived: bool = False  # the running width has equalled ``wanted`` since it was set
    settle: int = 0  # intervals left before judging
    history: tuple[Observation, ...] = ()  # since the last change (settling ones left out), newest last
    trial: _Trial | None = None
    limit: int | None = None  # a plateau's width: no growth beyond it ...
    limit_for: int = 0  # ... for this many more intervals
    shrunk: bool = False  # the last change was a shrink
    keep: int | None = None  # a shrink taken back: no shrink below this width ...
    keep_for: int = 0  # ... for this many more intervals
    reversals: int = 0  # shrinks taken back so far: each doubles the next hold


@dataclass(frozen=True)
class Decision:
    state: ControllerState
    reason: str

    @property
    def wanted(self) -> int:
        return self.state.wanted


def start(width: int, bounds: WidthBounds, policy: ControllerPolicy) -> ControllerState:
    """The state before the first interval: ``width`` within the bounds, the warm-up to pass."""
    check_int("width", width, 0)
    return ControllerState(wanted=bounds.clamp(width), settle=policy.warmup_intervals)


def decide(state: ControllerState, obs: Observation, bounds: WidthBounds, policy: ControllerPolicy) -> Decision:
    """The width wanted after ``obs`` (see the module doc), and why."""
    if bounds.fixed:
        return Decision(dataclasses.replace(state, wanted=bounds.floor), "fixed width")
    limit_for, keep_for = max(0, state.limit_for - 1), max(0, state.keep_for - 1)
    state = dataclasses.replace(
        state,
        wanted=bounds.clamp(state.wanted),
        limit_for=limit_for,
        limit=state.limit if limit_for else None,
        keep_for=keep_for,
        keep=state.keep if keep_for else None,
    )
    at_width = obs.width == state.wanted
    if at_width and not state.arrived:  # new workers set up now: what came before is of another width
        state = dataclasses.replace(state, arrived=True, history=(), settle=max(state.settle, policy.settle_intervals))
    if state.settle > 0:
        return Decision(dataclasses.replace(state, settle=state.settle - 1), "settling")
    history = (*state.history, obs)[-policy.memory :]
    state = dataclasses.replace(state, history=history)

    shrunk = _shrink(state, bounds, policy)
    if shrunk is not None:
        return shrunk
    if not at_width:
        return Decision(state, f"{obs.width} of {state.wanted} workers running")
    recent = [o for o in history if o.width == state.wanted][-policy.grow_intervals :]
    if len(recent) < policy.grow_intervals:
        return Decision(state, "observing")
    wait = sum(o.wait_share for o in recent) / len(recent)
    rate = sum(o.rate for o in recent) / len(recent)
    if state.trial is not None:
        needed = state.trial.rate * (1 + policy.min_gain * (state.wanted / state.trial.width - 1))
        if wait > policy.grow_wait and rate < needed:
            back = state.trial.width
            return Decision(
                _changed(state, back, limit=back, limit_for=policy.plateau_hold),
                f"{state.wanted} workers made {rate:.0f} img/s against {state.trial.rate:.0f} with {back}: back to "
                f"{back}, the limit for {policy.plateau_hold} intervals",
            )
        state = dataclasses.replace(state, trial=None)
    if not all(o.wait_share > policy.grow_wait for o in recent):  # one slow interval is no need
        return Decision(state, "fed")
    idle = sum(o.idle_share for o in recent) / len(recent)
    if idle > policy.busy_idle:
        return Decision(state, f"the trainer waits ({wait:.0%}) while workers idle ({idle:.0%}): not on their number")
    width = state.wanted
    factor = (1 + policy.headroom) / (1 - wait) if wait < 1 else math.inf
    target = max(width + 1, math.ceil(width * min(policy.max_growth, factor) - 1e-9))
    top = bounds.ceiling if state.limit is None else min(bounds.ceiling, state.limit)
    target = min(target, top)
    if target <= width:
        return Decision(state, f"the trainer waits ({wait:.0%}) at the {'ceiling' if state.limit is None else 'limit'}")
    reason = f"the trainer waits {wait:.0%} of its time: {width} -> {target} workers"
    if not state.shrunk:
        return Decision(_changed(state, target, trial=_Trial(width, rate)), reason)
    # the last shrink is taken back: no shrink below this width for a while, twice as long each time
    hold = policy.plateau_hold * 2**state.reversals
    grown = _changed(
        state, target, trial=_Trial(width, rate), keep=target, keep_for=hold, reversals=state.reversals + 1
    )
    return Decision(grown, f"{reason}; no shrink below {target} for {hold} intervals")


def _shrink(state: ControllerState, bounds: WidthBounds, policy: ControllerPolicy) -> Decision | None:
    """A shrink where chunks sat ready and the trainer hardly waited in each of the last
    ``shrink_intervals`` (at whatever width ran): to the most workers busy in one of them, plus
    headroom. It withdraws a growth still waiting for its nodes too."""
    last = state.history[-policy.shrink_intervals :]
    if len(last) < policy.shrink_intervals:
        return None
    if any(o.ready_chunks < 1 or o.wait_share > policy.grow_wait for o in last):
        return None
    if sum(o.wait_share for o in last) / len(last) > policy.calm_wait:
        return None
    busy = max(o.busy_workers for o in last)  # the busiest of them: noise does not shrink below a need seen
    target = bounds.clamp(max(math.ceil(busy * (1 + policy.headroom) - 1e-9), state.keep or 0))
    if target >= state.wanted:
        return None
    return Decision(
        _changed(state, target, shrunk=True),
        f"chunks ready and the trainer fed for {len(last)} intervals, {busy:.1f} workers busy: "
        f"{state.wanted} -> {target}",
    )


def _changed(state: ControllerState, wanted: int, **fields) -> ControllerState:
    fields.setdefault("trial", None)
    fields.setdefault("shrunk", False)
    return dataclasses.replace(state, wanted=wanted, arrived=False, settle=0, history=(), **fields)


class WidthController:
    """``decide`` with its state kept: ``observe(obs)`` returns the width wanted next; ``reason`` says
    why, ``changes`` counts the changes made."""

    def __init__(self, width: int, bounds: WidthBounds, policy: ControllerPolicy | None = None):
        self.bounds = bounds
        self.policy = policy or ControllerPolicy()
        self.state = start(width, bounds, self.policy)
        self.reason = "start"
        self.changes = 0

    @property
    def wanted(self) -> int:
        return self.state.wanted

    def observe(self, obs: Observation) -> int:
        before = self.state.wanted
        decision = decide(self.state, obs, self.bounds, self.policy)
        self.state, self.reason = decision.state, decision.reason
        self.changes += decision.wanted != before
        return decision.wanted
