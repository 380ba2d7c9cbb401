"""Every rank reads the same listing: a digest exchanged at start, a mismatch is an error.

Each rank takes a contiguous slice of the epoch's order (``order.rank_slice``), by position. If two
ranks listed different data (a file added between two listings, another mount, a stale cache) the
positions mean different samples on each, and images are read twice or never with no error anywhere.
The listing's digest (``SourceRows.digest``) is compared across ranks before the first epoch.
"""

from __future__ import annotations

__all__ = ["ListingMismatchError", "check_same_listing"]


class ListingMismatchError(ValueError):
    """Ranks listed different data; the message names rank 0's digest and each differing rank's."""


def check_same_listing(digest: str, *, rank: int, world_size: int) -> None:
    """All-gather ``digest`` (this rank's ``SourceRows.digest()``) over the default ``torch.distributed``
    process group and raise :class:`ListingMismatchError` on every rank when any differs from rank 0's.
    Nothing to compare (one rank, or no process group initialised): returns at once."""
    if world_size <= 1:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    differing = [(r, d) for r, d in enumerate(digests) if d != digests[0]]
    if differing:
        others = "; ".join(f"rank {r}: {d}" for r, d in differing)
        raise ListingMismatchError(
            f"rank {rank}: the ranks listed different data, so their shards would overlap and lose samples. "
            f"rank 0: {digests[0]}; differing: {others}. Give every rank the same dataset (list it once, or "
            "make sure no files change while the job starts)"
        )
