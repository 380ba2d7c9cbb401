"""The house's rules, checked on the source: the plan imports neither Ray nor the workers nor the pipeline,
no module of raypipe imports another's private name, no module of raypipe runs over 500 lines, and no
modules of raypipe import each other in a circle (lazy imports and ``if TYPE_CHECKING:`` ones count)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "raypipe"
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


def test_every_module_stays_under_500_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert not long, long


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    """The dotted name of ``path`` in ``package`` (a package's ``__init__.py`` is the package)."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, at any depth of its source (a function's lazy
    import and an ``if TYPE_CHECKING:`` block count). ``from a.b import x`` is an edge to ``a.b.x``
    where that is a module of the package, else to ``a.b``; relative imports are resolved."""
    paths = sorted(package.rglob("*.py"))
    modules = {_module_name(p, package): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]  # what "." names
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if sub in modules else target)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_modules_import_each_other_in_a_circle():
    circles = _circles(_import_graph(PACKAGE))
    assert not circles, "modules that import each other in a circle:\n" + "\n".join(
        " <-> ".join(circle) for circle in circles
    )


def test_the_circle_check_sees_a_circle(tmp_path):
    """A circle through a lazy import, a ``TYPE_CHECKING`` one and a relative one is found; a submodule's
    import of a sibling through its package (``from pkg import sibling``) is no edge to the package."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("A = 1\n\ndef f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .c import C\n")
    (pkg / "sub" / "c.py").write_text("import pkg.a\nfrom pkg import d\n\nC = 1\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    graph = _import_graph(pkg)
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.a", "pkg.d"},
        "pkg.d": {"pkg.a"},
    }
    assert _circles(graph) == [["pkg.a", "pkg.d", "pkg.sub.b", "pkg.sub.c"]]  # not "pkg": no edge to it
    (pkg / "a.py").write_text("A = 1\n")
    assert _circles(_import_graph(pkg)) == []


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
