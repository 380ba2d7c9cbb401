"""Small validators shared by the device modules: each ValueError names the keyword at fault."""

from __future__ import annotations

from typing import Any

__all__ = ["fail", "check_prob", "check_nonneg", "check_int", "is_number"]


def fail(name: str, value: Any, why: str) -> None:
    raise ValueError(f"{name}={value!r}: {why}")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def check_prob(name: str, value: Any) -> float:
    if not is_number(value) or not 0.0 <= value <= 1.0:
        fail(name, value, "expected a probability in [0, 1]")
    return float(value)


def check_nonneg(name: str, value: Any) -> float:
    if not is_number(value) or value < 0 or value == float("inf"):
        fail(name, value, "expected a finite number >= 0")
    return float(value)


def check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        fail(name, value, f"expected an int >= {lo}")
    return value
