"""A stand-in tokenizer for field transforms in tests and examples: importable on every worker (a field
transform travels to other processes by reference to its module), with no vocabulary to download."""

from __future__ import annotations

import numpy as np

__all__ = ["ByteTokens"]


class ByteTokens:
    """Text to a fixed-length int64 vector of its UTF-8 bytes, zero-padded or cut to ``length``: the
    shape a tokenizer gives (``open_clip``'s is 77 ids), a value that tells the text back exactly.

    Args:
        length: ids per text.

    Raises:
        ValueError: ``length`` < 1.
    """

    def __init__(self, length: int = 77):
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length={length!r}: expected an int >= 1")
        self.length = length

    def __call__(self, text: str) -> np.ndarray:
        data = text.encode("utf-8")[: self.length].ljust(self.length, b"\0")
        return np.frombuffer(data, np.uint8).astype(np.int64)
