"""raypipe's settings (raypipe.settings): every RAYPIPE_ variable the code reads is in the docs' table,
the environment's values are checked naming the variable, and the value in force is explicit."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from raypipe import settings
from raypipe.settings import VARIABLES, Settings

REPO = pathlib.Path(__file__).resolve().parents[2]
NAME = re.compile(r"RAYPIPE_[A-Z0-9_]+")
# Matches of NAME in the code that are no variable of raypipe's.
NOT_VARIABLES = {"RAYPIPE_VECTOR_LEVEL_H": "the include guard of raypipe/kernels/_vector_level.h"}


def _names_in_code() -> dict[str, str]:
    found = {}
    for folder in ("raypipe", "jobs"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix in (".py", ".h", ".c", ".cpp", ".sh", ".yaml") and path.is_file():
                for name in NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
                    found.setdefault(name, str(path.relative_to(REPO)))
    return found


def _names_in_docs() -> set[str]:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    table = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(RAYPIPE_[A-Z0-9_]+)` \|", table, flags=re.MULTILINE))


def test_every_variable_the_code_reads_is_in_the_docs_table():
    documented = _names_in_docs()
    missing = {}
    for name, where in _names_in_code().items():
        if name in NOT_VARIABLES:
            continue
        if name.endswith("_"):  # a family written as RAYPIPE_READ_*: it must name documented variables
            if not any(d.startswith(name) for d in documented):
                missing[name] = where
        elif name not in documented:
            missing[name] = where
    assert not missing, f"RAYPIPE_ variables missing from docs/design.md's Settings table: {missing}"


def test_every_setting_has_its_variable_and_the_docs_list_each():
    assert list(VARIABLES) == [f.name for f in dataclasses.fields(Settings)]
    assert set(VARIABLES.values()) <= _names_in_docs()


def test_the_defaults_and_the_environment():
    assert Settings.from_env({}) == Settings()
    assert Settings().listing_s == 900.0 and Settings().read_in_flight == 128
    assert Settings().cache_max_bytes == 50 << 30 and Settings().cache_dir == "" and not Settings().no_progress
    env = {
        "RAYPIPE_LISTING_S": "1800",
        "RAYPIPE_READ_IN_FLIGHT": "16",
        "RAYPIPE_BY_SHARD_ROWS": "1e6",
        "RAYPIPE_CACHE_DIR": "None",
        "RAYPIPE_CACHE_MAX_BYTES": "2GB",
        "RAYPIPE_NO_PROGRESS": "1",
        "RAYPIPE_READ_RETRIES": "",  # empty: the default
    }
    s = Settings.from_env(env)
    assert (s.listing_s, s.read_in_flight, s.by_shard_rows, s.cache_max_bytes) == (1800.0, 16, 10**6, 2 << 30)
    assert s.cache_off and s.no_progress and s.read_retries == 5


@pytest.mark.parametrize(
    "variable, text, why",
    [
        ("RAYPIPE_LISTING_S", "soon", "expected a number of seconds"),
        ("RAYPIPE_FIRST_ANSWER_S", "0", "expected a number of seconds > 0"),
        ("RAYPIPE_STORE_ATTEMPTS", "2.5", "expected an int"),
        ("RAYPIPE_READ_IN_FLIGHT", "0", "must be at least 1"),
        ("RAYPIPE_READ_RETRIES", "-1", "must be 0 or more"),
        ("RAYPIPE_READ_BACKOFF_S", "fast", "expected a number"),
        ("RAYPIPE_CACHE_MAX_BYTES", "lots", "expected a size"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(variable, text, why):
    with pytest.raises(ValueError, match=rf"^{variable}={text!r}: .*{why}"):
        Settings.from_env({variable: text})


def test_fields_are_checked_naming_the_field():
    with pytest.raises(ValueError, match=r"^read_in_flight=0: "):
        Settings(read_in_flight=0)
    with pytest.raises(ValueError, match=r"^store_attempts=True: "):
        Settings(store_attempts=True)
    with pytest.raises(TypeError):
        Settings(5.0)  # keyword-only


def test_current_follows_the_environment_and_use_overrides_it(monkeypatch):
    monkeypatch.setenv("RAYPIPE_READ_RETRIES", "2")
    assert settings.current().read_retries == 2
    assert settings.current() is settings.current()  # read once while nothing changed
    monkeypatch.setenv("RAYPIPE_READ_RETRIES", "3")
    assert settings.current().read_retries == 3
    chosen = Settings(read_retries=7)
    with settings.use(chosen):
        assert settings.current() is chosen
        monkeypatch.setenv("RAYPIPE_READ_RETRIES", "4")
        assert settings.current() is chosen
    assert settings.current().read_retries == 4


def test_read_options_and_stage_specs_take_the_settings_where_they_are_made(tmp_path):
    from raypipe.config import DecodeConfig, EvalAugment
    from raypipe.sources import ReadOptions
    from raypipe.sources.transport.paths import open_root
    from raypipe.stages.augment import StageSpec, stage_for

    chosen = Settings(read_in_flight=3, read_retries=1, cache_dir=str(tmp_path / "cache"))
    with settings.use(chosen):
        options = ReadOptions()
        spec = StageSpec(
            kind="folder",
            root=open_root(str(tmp_path)),
            augment=EvalAugment(input_size=8),
            decode=DecodeConfig(),
            seed=0,
            epoch=0,
        )
    assert (options.in_flight, options.retries, options.cache.dir) == (3, 1, str(tmp_path / "cache"))
    assert spec.settings == chosen
    assert stage_for(spec).reader.options == ReadOptions.from_settings(chosen)  # not those in force here
