"""The device modules' validators: raypipe's one rule for option values (``raypipe._values``), where an
int may be a NumPy integer but never a bool; each ValueError names the keyword at fault."""

from __future__ import annotations

from raypipe._values import check_int, check_nonneg, check_prob, fail, is_number

__all__ = ["fail", "check_prob", "check_nonneg", "check_int", "is_number"]
