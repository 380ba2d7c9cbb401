"""Small helpers of raypipe's frozen option values (``ListingOptions``, ``RankSpan``): standard library
only, so that every layer, the plan included, may use them."""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["fail", "one_value"]

T = TypeVar("T")


def fail(name: str, value: Any, why: str) -> None:
    """The error a value's check raises: it names the field first."""
    raise ValueError(f"{name}={value!r}: {why}")


def one_value(cls: type[T], value: T | None, keywords: dict[str, Any], *, name: str, what: str) -> T:
    """``value`` (a ``cls``), or the same fields given as keywords made into one; both at once is refused.
    ``name`` is the argument's name, ``what`` says what the keywords are."""
    if value is None:
        return cls(**keywords)
    if not isinstance(value, cls):
        fail(name, value, f"expected a {cls.__name__}")
    if keywords:
        raise ValueError(f"give {name}= or the {what} ({', '.join(sorted(keywords))}), not both")
    return value
