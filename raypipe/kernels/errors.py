"""Why an image was skipped: one list of reasons shared by the kernels and the pipeline stages.

Kernels raise :class:`SkipImage` for bad data and nothing else; the stage turns it into a skip record
``(sample_id, path, reason)`` so one bad file never kills a block.
"""

from __future__ import annotations

__all__ = [
    "EMPTY",
    "TRUNCATED",
    "NOT_AN_IMAGE",
    "TOO_LARGE",
    "DECODE_ERROR",
    "MISSING",
    "UNREADABLE",
    "OUTSIDE_ROOT",
    "BAD_LABEL",
    "NULL_IMAGE",
    "MISSING_FIELD",
    "BAD_FIELD",
    "REASONS",
    "REASON_CODES",
    "REASON_NAMES",
    "SkipImage",
]

# Decode reasons (raised by raypipe.kernels).
EMPTY = "empty"  # zero bytes
TRUNCATED = "truncated"  # the decoder reached the end of the data early
NOT_AN_IMAGE = "not_an_image"  # no known image format (random bytes, text, …)
TOO_LARGE = "too_large"  # width * height > DecodeConfig.max_pixels, refused from the header
DECODE_ERROR = "decode_error"  # anything else the decoder raised; the detail has its message
# I/O reasons (raised by the pipeline's read stage).
MISSING = "missing"  # the path does not exist
UNREADABLE = "unreadable"  # the path exists but reading it failed (permissions, I/O error)
OUTSIDE_ROOT = "outside_root"  # the path escapes the dataset root
BAD_LABEL = "bad_label"  # the label is missing or not a valid class index
NULL_IMAGE = "null_image"  # the row has neither bytes nor a path
# Field reasons (raised by the read stage for ``ListingOptions.fields``).
MISSING_FIELD = "missing_field"  # the sample has no such member, or a null in that column
BAD_FIELD = "bad_field"  # the member is not what its extension says (a .json that does not parse)

REASONS = (
    EMPTY,
    TRUNCATED,
    NOT_AN_IMAGE,
    TOO_LARGE,
    DECODE_ERROR,
    MISSING,
    UNREADABLE,
    OUTSIDE_ROOT,
    BAD_LABEL,
    NULL_IMAGE,
    MISSING_FIELD,
    BAD_FIELD,
)


# Each reason as a small integer, for outputs whose columns must be numbers (``RayDataAugment(bad_rows=
# "keep")`` into ``iter_torch_batches``); 0 is a row that was not skipped. Fixed: a new reason takes the
# next number, and no number is reused.
REASON_CODES = {
    "": 0,
    EMPTY: 1,
    TRUNCATED: 2,
    NOT_AN_IMAGE: 3,
    TOO_LARGE: 4,
    DECODE_ERROR: 5,
    MISSING: 6,
    UNREADABLE: 7,
    OUTSIDE_ROOT: 8,
    BAD_LABEL: 9,
    NULL_IMAGE: 10,
    MISSING_FIELD: 11,
    BAD_FIELD: 12,
}
REASON_NAMES = {code: name for name, code in REASON_CODES.items()}  # code -> reason ("" for 0)


class SkipImage(Exception):
    """This sample cannot be used; ``reason`` is one of :data:`REASONS`, ``detail`` says more."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in REASONS:
            raise ValueError(f"reason={reason!r}: expected one of {REASONS}")
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason
