"""The suite's tiers, as pure functions the conftest applies.

A test's folder and fixtures say what it needs, and its markers follow, so that
``pytest -m "not ray and not bench"`` (the README's command) runs every test that starts no Ray. A test
that starts Ray some other way (``raypipe.connect``, Ray Train, a subprocess) says so with
``pytest.mark.ray``; ``cluster`` (several Ray nodes, or a Ray head of its own) and ``isolated`` (a
child pytest process for a cluster) imply ``ray``.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable

FOLDER_MARKERS = {"bench": "bench"}  # tests/bench/ runs the scripts of bench/
FIXTURE_MARKERS = {"ray_local": "ray"}
RAY_MARKERS = ("cluster", "isolated")


def tier_markers(room: str, fixtures: Iterable[str], markers: Iterable[str]) -> set[str]:
    """The tier markers a test of folder ``room`` (the first folder under tests/) gets from its folder,
    its ``fixtures`` and its ``markers``, besides those it has."""
    fixtures, markers = set(fixtures), set(markers)
    names = {FOLDER_MARKERS[room]} if room in FOLDER_MARKERS else set()
    names |= {marker for fixture, marker in FIXTURE_MARKERS.items() if fixture in fixtures}
    if markers & set(RAY_MARKERS):
        names.add("ray")
    return names - markers


def ray_sessions(temp_dir: pathlib.Path) -> set[str]:
    """The session folders in Ray's temp dir ``temp_dir``: every Ray started with it adds one."""
    try:
        return {p.name for p in (temp_dir / "ray").iterdir() if p.name.startswith("session_2")}
    except OSError:
        return set()
