"""A cache segment's files: the segment, a file of many objects' bytes appended one after another, and
its index log, a record per object (key digest, offset, size, crc32) written after the bytes it names.

One process appends to a segment (``SegmentWriter``); any process reads its log (``parse_records``),
so a reader never needs a lock to find another process's objects. A record cut short or torn (a
writer killed mid-append) fails its checksum and is not read; ``raypipe.sources.transport.cache.LocalCache``
keeps the index and serves the bytes.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib

__all__ = ["SegmentWriter", "parse_records", "write_at"]

_RECORD_HEAD = struct.Struct("<32sQQ")  # an index record: key digest, offset, size ...
_RECORD = struct.Struct("<32sQQI4x")  # ... and the crc32 of those 48 bytes


def parse_records(tail: bytes) -> tuple[list[tuple[bytes, int, int]], int]:
    """The complete records at the start of ``tail`` (bytes of an index log) as (key digest, offset,
    size), and the bytes they take: reading stops at the first record torn or still being written, to
    be read again later from there."""
    records, read = [], 0
    for at in range(0, len(tail) - _RECORD.size + 1, _RECORD.size):
        digest, offset, size, crc = _RECORD.unpack_from(tail, at)
        if zlib.crc32(tail[at : at + _RECORD_HEAD.size]) != crc:
            break  # torn or being written: read again at the next refresh
        records.append((digest, offset, size))
        read = at + _RECORD.size
    return records, read


class SegmentWriter:
    """A segment of this process's and its index log, appended to under the cache's write lock."""

    def __init__(self, folder: str):
        self.name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self._data = os.open(os.path.join(folder, self.name + ".seg"), flags, 0o644)
        try:
            self._log = os.open(os.path.join(folder, self.name + ".idx"), flags, 0o644)
        except BaseException:
            os.close(self._data)
            raise
        self.end = 0  # bytes of the segment
        self._logged = 0  # bytes of the log

    def append(self, digest: bytes, data: bytes | memoryview) -> int:
        """Write ``data`` at the segment's end, then its index record; the offset it lies at. On a
        failure both files are cut back to where they were."""
        offset, size = self.end, len(data)
        record = _RECORD.pack(digest, offset, size, zlib.crc32(_RECORD_HEAD.pack(digest, offset, size)))
        try:
            write_at(self._data, data, offset)
            write_at(self._log, record, self._logged)
        except BaseException:
            for fd, length in ((self._log, self._logged), (self._data, offset)):
                try:
                    os.ftruncate(fd, length)
                except OSError:
                    pass  # the record, if any, is unreadable beyond the log's length or the segment's end
            raise
        self.end += size
        self._logged += len(record)
        return offset

    def removed(self) -> bool:
        """Whether an eviction pass removed this segment (appends to it would be lost)."""
        return os.fstat(self._data).st_nlink == 0

    def close(self) -> None:
        os.close(self._data)
        os.close(self._log)


def write_at(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (``pwrite`` may write less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
