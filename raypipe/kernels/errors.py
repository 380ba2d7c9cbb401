"""Skip reasons (provisional copy; the kernels branch owns this file)."""

EMPTY = "empty"
TRUNCATED = "truncated"
NOT_AN_IMAGE = "not_an_image"
TOO_LARGE = "too_large"
DECODE_ERROR = "decode_error"
MISSING = "missing"
UNREADABLE = "unreadable"
OUTSIDE_ROOT = "outside_root"
BAD_LABEL = "bad_label"
NULL_IMAGE = "null_image"
REASONS = (EMPTY, TRUNCATED, NOT_AN_IMAGE, TOO_LARGE, DECODE_ERROR, MISSING, UNREADABLE, OUTSIDE_ROOT,
           BAD_LABEL, NULL_IMAGE)


class SkipImage(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail
