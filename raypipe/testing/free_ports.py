"""Free ports on 127.0.0.1 for a cluster started on this machine: single ones, and a range of
consecutive ones (a Ray head's worker ports), found by binding them.
"""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack

__all__ = ["free_ports", "free_range"]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def free_range(size: int, *, avoid: list[int]) -> int:
    """A base port with ``size`` consecutive ports free after it, none of them in ``avoid``."""
    for base in range(30000 + os.getpid() % 200 * 100, 60000, 137):
        if any(base <= p < base + size for p in avoid):
            continue
        try:
            with ExitStack() as stack:
                for port in range(base, base + size):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no range of {size} free ports on 127.0.0.1")
