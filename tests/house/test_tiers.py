"""The suite's tiers (tests/tiers.py): what marks a test, and the check that a test outside the ray tier
started no Ray."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from tiers import ray_sessions, tier_markers

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "room, fixtures, markers, expected",
    [
        ("kernels", ["tmp_path"], [], set()),
        ("bench", [], [], {"bench"}),
        ("pipeline", ["ray_local", "sample_dir"], [], {"ray"}),
        ("workers", [], ["isolated"], {"ray"}),
        ("pipeline", [], ["cluster"], {"ray"}),
        ("pipeline", ["ray_local"], ["ray", "timeout"], set()),  # marked already: nothing to add
    ],
)
def test_a_tests_folder_fixtures_and_markers_give_its_tiers(room, fixtures, markers, expected):
    assert tier_markers(room, fixtures, markers) == expected


def test_a_ray_started_with_a_temp_dir_is_seen_as_a_new_session(tmp_path):
    assert ray_sessions(tmp_path) == set()  # no ray folder at all
    (tmp_path / "ray" / "session_2026-01-01_00-00-00_000000_1").mkdir(parents=True)
    (tmp_path / "ray" / "session_latest").mkdir()  # Ray's link to the newest: not a session of its own
    before = ray_sessions(tmp_path)
    (tmp_path / "ray" / "session_2026-01-01_00-00-05_000000_2").mkdir()
    assert ray_sessions(tmp_path) - before == {"session_2026-01-01_00-00-05_000000_2"}


def test_the_first_tier_holds_no_test_that_takes_the_local_ray_or_runs_a_bench_script():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not ray and not bench",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    ).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    assert ids and not [i for i in ids if i.startswith("tests/bench/")]
    assert (
        "tests/pipeline/test_in_process_stream.py::test_a_position_saved_mid_epoch_resumes_with_the_exact_batches"
        in ids
    )
    assert not [i for i in ids if "test_pipeline.py::test_every_sample_once_exact_batches" in i]  # takes ray_local
