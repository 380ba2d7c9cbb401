"""The public names (``raypipe.__all__``, ``raypipe.timm.__all__``) say how they are called: a function's
docstring has Google-style ``Args:`` (where it takes any), ``Returns:`` or ``Yields:``, and ``Raises:``
sections; a class's, ``Args:`` for its constructor and ``Raises:``; an exception class has a docstring."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

import raypipe
import raypipe.timm

SECTION = re.compile(r"^(Args|Returns|Yields|Raises):$")


def _public_names() -> list[tuple[str, object]]:
    names = [(f"raypipe.{n}", getattr(raypipe, n)) for n in raypipe.__all__]
    return names + [(f"raypipe.timm.{n}", getattr(raypipe.timm, n)) for n in raypipe.timm.__all__]


def _sections(doc: str) -> set[str]:
    """The sections of ``doc``: a header alone on its line, followed by an indented, non-empty line."""
    lines = inspect.cleandoc(doc).splitlines()
    found = set()
    for i, line in enumerate(lines[:-1]):
        match = SECTION.match(line)
        if match and lines[i + 1].startswith((" ", "\t")) and lines[i + 1].strip():
            found.add(match.group(1))
    return found


def _takes_arguments(obj) -> bool:
    try:
        return bool(inspect.signature(obj).parameters)  # a class's signature leaves out self
    except (TypeError, ValueError):
        return True


def missing_sections(obj) -> list[str]:
    """What ``obj``'s own docstring lacks (an inherited or generated one does not count)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return [] if doc and doc.strip() else ["a docstring"]
    if not doc or not doc.strip():
        return ["a docstring"]
    have = _sections(doc)
    want = [["Args"]] if _takes_arguments(obj) else []
    if not isinstance(obj, type):
        want.append(["Returns", "Yields"])
    want.append(["Raises"])
    return [" or ".join(alternatives) for alternatives in want if not have.intersection(alternatives)]


def test_every_public_name_is_checked():
    names = dict(_public_names())
    assert "raypipe.Pipeline" in names and "raypipe.timm.create_loader" in names
    assert len(names) == len(raypipe.__all__) + len(raypipe.timm.__all__)


@pytest.mark.parametrize("name, obj", [pytest.param(n, o, id=n) for n, o in _public_names() if callable(o)])
def test_public_name_documents_its_arguments_result_and_errors(name, obj):
    assert not missing_sections(obj), f"{name}'s docstring lacks {missing_sections(obj)}"


# -- the checker refuses what it should -------------------------------------------------------------


def _prose_only(path: str) -> dict:
    """Load ``path``. Args: and Raises: named in prose are not sections."""
    return {}


def _no_docstring(path):
    return path


def _documented(path: str) -> dict:
    """Load ``path``.

    Args:
        path: the file.

    Returns:
        Its mapping.

    Raises:
        ValueError: it is not one.
    """
    return {}


def _yields(n: int):
    """Count.

    Args:
        n: how far.

    Yields:
        0 … n - 1.

    Raises:
        Nothing.
    """
    yield from range(n)


class _Undocumented:
    def __init__(self, value: int):
        self.value = value


@dataclasses.dataclass
class _Record:  # a dataclass without a docstring gets its signature as one
    value: int


class _NoRaises:
    """A value.

    Args:
        value: it.
    """

    def __init__(self, value: int):
        self.value = value


class _QuietError(Exception):
    pass


class _SaidError(Exception):
    """Raised when said."""


@pytest.mark.parametrize(
    "obj, missing",
    [
        (_prose_only, ["Args", "Returns or Yields", "Raises"]),
        (_no_docstring, ["a docstring"]),
        (_Undocumented, ["a docstring"]),
        (_Record, ["Args", "Raises"]),
        (_NoRaises, ["Raises"]),
        (_QuietError, ["a docstring"]),
        (_documented, []),
        (_yields, []),
        (_SaidError, []),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_the_checker_names_what_a_docstring_lacks(obj, missing):
    assert missing_sections(obj) == missing
