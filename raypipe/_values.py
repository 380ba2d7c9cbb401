"""Small helpers of raypipe's frozen option values (configs, ``ListingOptions``, ``RankSpan``, the device
modules' keywords, ``Settings``): one way to refuse a value, and one rule for what an int or a number is.
Standard library only, so that every layer, the plan included, may use them.

The rule: an int is any integral number but a bool (NumPy's integers are ints: a size computed with
NumPy, or read from an array, is one); a number is any real number but a bool or NaN. Checks return
the value as a Python ``int`` or ``float``, so that what a config keeps writes to JSON and YAML as it is.
"""

from __future__ import annotations

import numbers
import re
from typing import Any, NoReturn, TypeVar

__all__ = ["fail", "is_int", "is_number", "check_int", "check_prob", "check_nonneg", "one_value", "parse_bytes"]

T = TypeVar("T")


def fail(name: str, value: Any, why: str) -> NoReturn:
    """The error a value's check raises: it names the field first (``name=value: why``)."""
    raise ValueError(f"{name}={value!r}: {why}")


def is_int(value: Any) -> bool:
    """An integral number that is not a bool: ``int`` or a NumPy integer (``numbers.Integral``, which
    NumPy's integer types register with; its ``bool_`` does not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number that is neither a bool nor NaN (NumPy's integers and floats included)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value


def check_int(name: str, value: Any, lo: int) -> int:
    """``value`` as an ``int`` if it is an int >= ``lo``, else ``fail``."""
    if not is_int(value) or value < lo:
        fail(name, value, f"expected an int >= {lo}")
    return int(value)


def check_prob(name: str, value: Any) -> float:
    """``value`` as a ``float`` if it is a number in [0, 1], else ``fail``."""
    if not is_number(value) or not 0.0 <= value <= 1.0:
        fail(name, value, "expected a probability in [0, 1]")
    return float(value)


def check_nonneg(name: str, value: Any) -> float:
    """``value`` as a ``float`` if it is a finite number >= 0, else ``fail``."""
    if not is_number(value) or value < 0 or value == float("inf"):
        fail(name, value, "expected a finite number >= 0")
    return float(value)


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


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}


def parse_bytes(text: str | int) -> int:
    """``"50GB"``, ``"512MiB"``, ``"1e9"`` or an int as a byte count (binary units: 1 GB = 2**30)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r}: expected a size such as 50GB, 512MiB or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
