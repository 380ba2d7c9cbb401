"""Tar members: a shard's regular members walked from its tar headers, its samples' record made from
them (what ``sources.formats.webdataset`` lists and ``sources.writing.convert`` indexes from what it wrote), and the
check a read makes of the 512-byte header before a member's data (``header_mismatch``).

Members are grouped into samples by key, as WebDataset does: the key is the member's path up to the
first dot of its base name (``a.b/x.seg.png`` has key ``a.b/x`` and extension ``seg.png``). A sample's
image is its first member with an image extension; keys with neither an image nor a ``.cls`` member
are not samples. A member's ``header_crc`` is the CRC-32 of its own header block (the one right before
its data): a read that finds another block there reads a shard its listing no longer describes.
"""

from __future__ import annotations

import re
import tarfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raypipe.kernels.errors import BAD_LABEL, NULL_IMAGE, TRUNCATED
from raypipe.sources.formats.folder import IMG_EXTENSIONS
from raypipe.sources.indexes.shard_index import ShardRecord

if TYPE_CHECKING:
    from raypipe.sources.transport.paths import DatasetRoot

__all__ = [
    "BLOCK",
    "Member",
    "MemberHeaders",
    "Ranges",
    "ShardChangedError",
    "TarListing",
    "header_crc",
    "header_mismatch",
    "member_ext",
    "shard_record",
    "walk",
]

BLOCK = 512  # tar's block: a header, and the unit member data is padded to
_IMAGE_EXTS = frozenset(e.lstrip(".") for e in IMG_EXTENSIONS)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
# The longest ``.cls`` read at listing: a few hundred class ids of a multi-label set; a longer one is
# not a label file (its reads would cost a listing of many shards more than its images' headers).
CLS_BYTES = 4096
_USTAR_NAME = 100  # bytes of a name a ustar header holds in full (longer ones: an extended header)
_OCTAL_SIZE = 8**11  # sizes from here on do not fit the header's octal field


@dataclass
class Member:
    name: str
    offset: int  # of the data
    size: int
    header_crc: int = -1  # CRC-32 of its header block; -1: not known (a DALI index names no header)


@dataclass
class TarListing:
    members: list[Member] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)  # index in members -> a .cls member's text
    file_size: int = 0
    stopped_at: int | None = None  # where the listing stopped early (None: a complete archive)
    reason: str = ""


class Ranges:
    """Reads byte ranges of one file; remote reads fetch a window around them to save requests."""

    def __init__(self, read_at: Callable[[int, int], bytes], size: int, window: int):
        self._read_at, self.size, self._window = read_at, size, window
        self._start, self._buf = 0, b""

    def read(self, pos: int, n: int) -> bytes:
        if self._start <= pos and pos + n <= self._start + len(self._buf):
            return self._buf[pos - self._start : pos - self._start + n]
        if n >= self._window:
            return self._read_at(pos, n)
        self._start, self._buf = pos, self._read_at(pos, min(self._window, max(0, self.size - pos)))
        return self._buf[:n]


def _pax(data: bytes) -> dict[str, str]:
    """The records of a pax extended header (``"<len> <key>=<value>\\n"`` each)."""
    out, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def walk(ranges: Ranges) -> TarListing:
    """The regular members of a tar archive, from its headers; stops (and says where) at the first header
    that cannot be read, and at a member whose data the file does not hold in full."""
    out = TarListing(file_size=ranges.size)
    pos, long_name, pax = 0, None, {}
    while True:
        header = ranges.read(pos, BLOCK) if pos < ranges.size else b""
        if not header:
            out.stopped_at, out.reason = pos, "the shard ends without tar's end-of-archive marker"
            return out
        if len(header) < BLOCK:
            out.stopped_at, out.reason = pos, "the shard ends inside a member's header"
            return out
        if header.count(0) == BLOCK:
            return out  # end-of-archive marker
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            out.stopped_at, out.reason = pos, f"unreadable tar header ({e})"
            return out
        size = int(pax.get("size", info.size)) if info.type not in (tarfile.XHDTYPE, tarfile.XGLTYPE) else info.size
        data = pos + BLOCK
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE):
            body = ranges.read(data, size)
            if len(body) < size:
                out.stopped_at, out.reason = pos, "the shard ends inside an extended header"
                return out
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = body.rstrip(b"\0").decode("utf-8", "surrogateescape")
            else:
                pax = _pax(body)
        elif info.type in _REGULAR:
            name = pax.get("path") or long_name or info.name
            out.members.append(Member(name, data, size, header_crc(header)))
            if member_ext(name) == "cls":
                out.labels[len(out.members) - 1] = cls_text(ranges.read, data, size)
            if data + size > ranges.size:
                out.stopped_at, out.reason = data, f"the shard ends inside member {name!r}"
                return out
            long_name, pax = None, {}
        else:  # directories, links, global headers, GNU long link names: not samples
            if info.type not in (tarfile.XGLTYPE, tarfile.GNUTYPE_LONGLINK):
                long_name, pax = None, {}
        pos = data + -(-size // BLOCK) * BLOCK


def _sample_key(name: str) -> str:
    folder, _, base = name.rpartition("/")
    stem = base.split(".", 1)[0]
    return f"{folder}/{stem}" if folder else stem


def member_ext(name: str) -> str:
    base = name.rpartition("/")[2]
    return base.split(".", 1)[1].lower() if "." in base else ""


def cls_text(read: Callable[[int, int], bytes], offset: int, size: int) -> str:
    """A ``.cls`` member's text: its bytes, or, past ``CLS_BYTES``, a note of its size that no label parses."""
    return read(offset, size).decode("utf-8", "replace") if size <= CLS_BYTES else f"<{size} bytes>"


def _label(text: str | None, key: str) -> tuple[int | tuple[int, ...], str | None]:
    """A ``.cls``'s class id, or its ids (a tuple) where it holds several, separated by spaces or commas;
    -1 and the reason for a bad one."""
    if text is None:
        return -1, f"{BAD_LABEL}: no {key}.cls member"
    words = [w for w in re.split(r"[\s,]+", text.strip()) if w]
    try:
        values = [int(w) for w in words]
    except ValueError:
        values = []
    if not values:
        return -1, f"{BAD_LABEL}: {key}.cls holds {text.strip()[:32]!r}"
    if min(values) < 0:
        return -1, f"{BAD_LABEL}: {key}.cls holds {min(values)}"
    return (values[0] if len(values) == 1 else tuple(values)), None


def shard_record(rel: str, stamp: tuple[int, int], listing: TarListing, fields: tuple[str, ...] = ()) -> ShardRecord:
    """A shard's rows (everything but the columns the dataset sets) from its members, with where each of
    ``fields`` (members by extension) lies."""
    samples: dict[str, dict] = {}
    wanted = set(fields)
    for index, m in enumerate(listing.members):
        sample = samples.setdefault(_sample_key(m.name), {})
        ext = member_ext(m.name)
        if ext in wanted and ("field", ext) not in sample:
            sample["field", ext] = m
        if ext in _IMAGE_EXTS and "image" not in sample:
            sample["image"] = m
        elif ext == "cls" and "cls" not in sample:
            sample["cls"] = listing.labels[index]
    rec = ShardRecord(
        rel,
        listing.file_size,
        stamp[1],
        [],
        [],
        [],
        [],
        [],
        keys=len(samples),
        stopped_at=listing.stopped_at,
        reason=listing.reason,
    )
    for key, sample in samples.items():
        if "image" not in sample and "cls" not in sample:
            continue
        label, error = _label(sample.get("cls"), key)
        image = sample.get("image")
        if image is None:
            error = f"{NULL_IMAGE}: {key} has no image member ({', '.join(sorted(_IMAGE_EXTS))})"
        elif image.offset + image.size > listing.file_size:
            short = image.offset + image.size - listing.file_size
            error = f"{TRUNCATED}: the shard ends {short} bytes before the end of {image.name}"
        rec.labels.append(label)
        rec.errors.append(error)
        rec.offsets.append(image.offset if image else -1)
        rec.sizes.append(image.size if image else -1)
        rec.members.append(image.name if image else f"{key}.cls")
        rec.header_crcs.append(image.header_crc if image else -1)
        for name in fields:
            m = sample.get(("field", name))
            rec.fields.setdefault(name, []).append((m.offset, m.size, m.header_crc) if m else (-1, -1, -1))
    return rec


def header_crc(block: bytes) -> int:
    """The digest of a member's 512-byte header block that a listing records (CRC-32)."""
    return zlib.crc32(block)


def header_mismatch(block: bytes, member: str | None, size: int, crc: int) -> str | None:
    """Why ``block``, the 512 bytes before a member's data, is not the header the listing recorded for
    ``member`` of ``size`` bytes (None: it is). With the header's digest (``crc`` >= 0) the block must be
    that header, byte for byte. Without one (an index written before digests, a DALI index) it must be a
    file's tar header stating that size and, where a plain tar header can hold the name, that name."""
    if len(block) < BLOCK:
        return "is missing (the shard ends before it)"
    if crc >= 0:
        return None if header_crc(block) == crc else "is not the one listed (its digest differs)"
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as e:
        return f"is not a tar header ({e})"
    if info.type not in _REGULAR:
        return "is not a file's tar header"
    if info.size != size and size < _OCTAL_SIZE:
        return f"states {info.size} bytes where the listing has {size}"
    if member and not member.startswith("#") and info.name != member and _in_ustar(member):
        return f"names {info.name!r}"  # ("#3.jpg": a DALI v1.1 index's number, the member unnamed)
    return None


def _in_ustar(name: str) -> bool:
    """Whether a tar header holds ``name`` itself: an ASCII name of up to 100 bytes (a longer one is in
    an extended header, and writers put various stand-ins in the header's own field)."""
    return name.isascii() and len(name) <= _USTAR_NAME


class ShardChangedError(ValueError):
    """A shard no longer holds what its listing says: a read found another header before a member's
    data. Not a skip: the rows of the shard, not one image, are wrong; the epoch fails with what to run."""


class MemberHeaders:
    """A block's tar members as the listing gave them (data offset, size, name, header digest), and the
    check each read makes of the header block before a member's data."""

    def __init__(self, rows: Mapping):
        self.offsets, self.sizes = rows["offset"], rows["size"]
        self.names, self.crcs = rows.get("member"), rows.get("header_crc")

    def check(self, root: DatasetRoot, rel: str, i: int, block: bytes | memoryview) -> None:
        """Raise ``ShardChangedError`` where row ``i``'s header block is not the one listed."""
        name = None if self.names is None else self.names[i]
        crc = -1 if self.crcs is None else int(self.crcs[i])
        why = header_mismatch(bytes(block), name, int(self.sizes[i]), crc)
        if why is not None:
            raise ShardChangedError(
                f"shard {root.display(rel)} changed since it was listed: the tar header before member {name!r} "
                f"(its data at byte {int(self.offsets[i])}) {why}. Its rows, from its index or from the headers "
                f"read when the run began, no longer describe it: `raypipe index {root.display('')}` writes the "
                "index again (--out PATH for one kept elsewhere); then start again"
            )
