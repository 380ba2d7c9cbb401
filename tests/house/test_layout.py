"""The house's rules, checked on the source: the plan imports neither Ray nor the workers nor the pipeline,
no module of raypipe imports another's private name, and the three rooms keep their modules small."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "raypipe"
ROOMS = ("plan", "workers", "pipeline")
# What the plan may import: the standard library, NumPy, torch (the listing check's process group), itself
# and the standard-library-only helpers of option values.
PLAN_MAY_IMPORT = ("raypipe.plan", "raypipe._lazy", "raypipe._values", "numpy", "torch")


def _imports(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in ``path``, at any depth (a function's lazy import counts)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def _third_party(module: str) -> bool:
    import sys

    return module.split(".")[0] not in sys.stdlib_module_names


@pytest.mark.parametrize("path", sorted((PACKAGE / "plan").glob("*.py")), ids=lambda p: p.name)
def test_the_plan_imports_nothing_but_itself_numpy_and_torch(path):
    for module, _ in _imports(path):
        if _third_party(module):
            assert module.startswith(PLAN_MAY_IMPORT), f"{path.name} imports {module}"


def test_the_plan_check_sees_an_import_of_ray(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from raypipe.workers.local import LocalWorkers\n    import ray\n")
    found = [m for m, _ in _imports(bad) if _third_party(m) and not m.startswith(PLAN_MAY_IMPORT)]
    assert found == ["raypipe.workers.local", "ray"]


def test_no_module_imports_another_modules_private_name():
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for module, names in _imports(path):
            if module.startswith("raypipe"):
                private += [
                    f"{path.relative_to(PACKAGE)}: {module}.{n}"
                    for n in names
                    if n.startswith("_") and not n.startswith("__")
                ]
    assert not private, private


@pytest.mark.parametrize("room", ROOMS)
def test_the_rooms_modules_stay_under_500_lines(room):
    long = {p.name: n for p in (PACKAGE / room).glob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_the_pipeline_holds_no_plan_or_worker_module():
    names = {p.stem for p in (PACKAGE / "pipeline").glob("*.py")}
    assert not names & {
        "order",
        "position",
        "identity",
        "same_listing",
        "local_workers",
        "_local_worker",
        "node_workers",
        "slabs",
        "handover",
        "peer_auth",
    }
