"""WebDataset tar shards: ``KEY.jpg`` (or any image extension) with ``KEY.cls`` holding the label as text.

The data is a directory (or prefix) of ``*.tar`` files, one ``.tar`` file, or a brace pattern such as
``shards-{0000..0099}.tar`` or ``{train,extra}-{0..9}.tar``, on local disk or any pyarrow filesystem.

Listing reads each shard's tar headers, nothing else but the ``.cls`` members: locally one ``pread``
per header; remotely ranged reads of a few MB, so that a request's latency covers many small members
while a large member is stepped over rather than downloaded. Members are grouped into samples by key,
as WebDataset does: the key is the member's path up to the first dot of its base name (``a.b/x.seg.png``
has key ``a.b/x`` and extension ``seg.png``). A sample's image is its first member with an image
extension (``raypipe.sources.folder.IMG_EXTENSIONS``); keys with neither an image nor a ``.cls`` member
(e.g. ``__meta__.json``) are not samples.

Rows: ``sample_id`` is the sample's index in (shards sorted by path, samples in the order of their first
member in the tar), so the same shards give the same ids on every run and cluster size; ``path`` is the
shard, ``offset``/``size`` the image member's data, ``member`` its name, ``shard`` the shard's index.
A sample with no ``.cls`` or one that holds no non-negative integer is kept with error ``bad_label``,
one with no image with ``null_image``: counted as skipped, not dropped.

A truncated or corrupt shard is listed up to the last header that could be read: a member whose data
runs past the end of the file is kept with error ``truncated``. Members after that point were never
seen, so they are not rows at all and no epoch's accounting can count them; the listing says so with a
warning naming the shard and the byte where the listing stopped, and records it in
``SourceRows.extra["incomplete_shards"]`` (one dict per shard: ``shard``, ``listed_samples``,
``stopped_at``, ``shard_bytes``, ``reason``). A shard that ends exactly after a member but lacks tar's
end-of-archive marker is reported the same way, as members may have followed.
"""

from __future__ import annotations

import itertools
import logging
import os
import posixpath
import re
import tarfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from raypipe.kernels.errors import BAD_LABEL, NULL_IMAGE, TRUNCATED, SkipImage
from raypipe.sources.folder import IMG_EXTENSIONS
from raypipe.sources.paths import DatasetRoot, open_root
from raypipe.sources.remote import ReadOptions, with_retries
from raypipe.sources.table import SourceRows, listed_stamp, make_rows

__all__ = ["expand_braces", "has_braces", "list_webdataset", "shard_paths"]

log = logging.getLogger(__name__)

_IMAGE_EXTS = frozenset(e.lstrip(".") for e in IMG_EXTENSIONS)
_BLOCK = 512
_WINDOW = 4 * 1024 * 1024  # remote listing: bytes per ranged read
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def has_braces(data: str) -> bool:
    """Whether ``data`` holds a brace pattern (``{0..9}`` or ``{a,b}``)."""
    return any(_RANGE.match(m.group(1)) or "," in m.group(1) for m in _BRACE.finditer(data))


def expand_braces(pattern: str) -> list[str]:
    """All names a brace pattern stands for, in order: ``{0000..0099}`` is a zero-padded range (padded to
    the wider bound when either bound starts with 0), ``{a,b}`` a list; several braces multiply."""
    parts: list[list[str]] = []
    pos = 0
    for m in _BRACE.finditer(pattern):
        parts.append([pattern[pos:m.start()]])
        body = m.group(1)
        rng = _RANGE.match(body)
        if rng:
            lo, hi = rng.group(1), rng.group(2)
            width = max(len(lo), len(hi)) if lo.lstrip("-").startswith("0") or hi.lstrip("-").startswith("0") else 0
            step = 1 if int(hi) >= int(lo) else -1
            parts.append([str(n).zfill(width) for n in range(int(lo), int(hi) + step, step)])
        elif "," in body:
            parts.append(body.split(","))
        else:
            parts.append([m.group(0)])  # a literal "{x}"
        pos = m.end()
    parts.append([pattern[pos:]])
    return ["".join(p) for p in itertools.product(*parts)]


_UNKNOWN = (-1, -1)


def _existing(root: DatasetRoot, rels: list[str]) -> dict[str, tuple[int, int]]:
    """Those of ``rels`` that are files, each with its (size, mtime_ns) where the store said them."""
    if root.is_local:
        return {r: _UNKNOWN for r in rels if os.path.isfile(os.path.join(root.root, r))}
    infos = root.filesystem.get_file_info([posixpath.join(root.root, r) for r in rels])
    return {r: listed_stamp(i) for r, i in zip(rels, infos, strict=True) if i.type == pafs.FileType.File}


def shard_paths(data: str, *, filesystem: pafs.FileSystem | None = None) -> tuple[DatasetRoot, list[str]]:
    """The root and the sorted relative paths of the shards ``data`` names (see the module docstring)."""
    root, shards = _shards(data, filesystem)
    return root, list(shards)


def _shards(data: str, filesystem: pafs.FileSystem | None) -> tuple[DatasetRoot, dict[str, tuple[int, int]]]:
    """The root and the shards ``data`` names, sorted, each with its (size, mtime_ns) as a remote listing
    gave them (-1 for local shards)."""
    if has_braces(data):
        head = data[: data.index("{")]
        base = head.rsplit("/", 1)[0] if "/" in head else "."
        root = open_root(base, filesystem=filesystem)
        rels = sorted(set(name[len(base) + 1:] if base != "." else name for name in expand_braces(data)))
        found = _existing(root, rels)
        missing = [r for r in rels if r not in found]
        if missing:
            raise ValueError(f"{len(missing)} of the {len(rels)} shards of {data!r} do not exist, e.g. {missing[:3]}")
        return root, found
    probe = open_root(data, filesystem=filesystem)
    stamp = _UNKNOWN
    if probe.is_local:
        kind = "file" if os.path.isfile(probe.root) else "dir" if os.path.isdir(probe.root) else None
    else:
        info = probe.filesystem.get_file_info(probe.root)
        kind = {pafs.FileType.File: "file", pafs.FileType.Directory: "dir"}.get(info.type)
        if kind == "file":
            stamp = listed_stamp(info)
    if kind == "file":
        parent, _, name = data.rstrip("/").rpartition("/")
        return open_root(parent or ".", filesystem=filesystem), {name: stamp}
    if kind == "dir":
        return probe, _tar_files(probe, probe.root, recursive=True)
    # a prefix: the shards in its folder whose names start with it
    parent, _, stem = data.rstrip("/").rpartition("/")
    root = open_root(parent or ".", filesystem=filesystem)
    found = {r: st for r, st in _tar_files(root, root.root, recursive=False).items() if r.startswith(stem)}
    if not found:
        raise ValueError(f"no .tar shards at {data!r} (a folder, a prefix, a .tar file or a brace pattern)")
    return root, found


def _tar_files(root: DatasetRoot, where: str, *, recursive: bool) -> dict[str, tuple[int, int]]:
    if root.is_local:
        if not os.path.isdir(where):
            return {}
        found = []
        for dirpath, dirnames, filenames in os.walk(where):
            dirnames.sort()
            found += [os.path.relpath(os.path.join(dirpath, f), root.root) for f in filenames if f.endswith(".tar")]
            if not recursive:
                break
        return dict.fromkeys(sorted(found), _UNKNOWN)
    infos = root.filesystem.get_file_info(pafs.FileSelector(where, recursive=recursive, allow_not_found=True))
    found = {root.relative(i.path): listed_stamp(i) for i in infos
             if i.type == pafs.FileType.File and i.path.endswith(".tar")}  # fmt: skip
    return {r: found[r] for r in sorted(found)}


@dataclass
class _Member:
    name: str
    offset: int  # of the data
    size: int


@dataclass
class _Listing:
    members: list[_Member] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)  # index in members -> a .cls member's text
    file_size: int = 0
    stopped_at: int | None = None  # where the listing stopped early (None: a complete archive)
    reason: str = ""


class _Ranges:
    """Reads byte ranges of one file; remote reads fetch a window around them to save requests."""

    def __init__(self, read_at: Callable[[int, int], bytes], size: int, window: int):
        self._read_at, self.size, self._window = read_at, size, window
        self._start, self._buf = 0, b""

    def read(self, pos: int, n: int) -> bytes:
        if self._start <= pos and pos + n <= self._start + len(self._buf):
            return self._buf[pos - self._start:pos - self._start + n]
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
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _walk(ranges: _Ranges) -> _Listing:
    """The regular members of a tar archive, from its headers; stops (and says where) at the first header
    that cannot be read, and at a member whose data the file does not hold in full."""
    out = _Listing(file_size=ranges.size)
    pos, long_name, pax = 0, None, {}
    while True:
        header = ranges.read(pos, _BLOCK) if pos < ranges.size else b""
        if not header:
            out.stopped_at, out.reason = pos, "the shard ends without tar's end-of-archive marker"
            return out
        if len(header) < _BLOCK:
            out.stopped_at, out.reason = pos, "the shard ends inside a member's header"
            return out
        if header.count(0) == _BLOCK:
            return out  # end-of-archive marker
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            out.stopped_at, out.reason = pos, f"unreadable tar header ({e})"
            return out
        size = int(pax.get("size", info.size)) if info.type not in (tarfile.XHDTYPE, tarfile.XGLTYPE) else info.size
        data = pos + _BLOCK
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
            out.members.append(_Member(name, data, size))
            if _ext(name) == "cls":
                out.labels[len(out.members) - 1] = ranges.read(data, min(size, 64)).decode("utf-8", "replace")
            if data + size > ranges.size:
                out.stopped_at, out.reason = data, f"the shard ends inside member {name!r}"
                return out
            long_name, pax = None, {}
        else:  # directories, links, global headers, GNU long link names: not samples
            if info.type not in (tarfile.XGLTYPE, tarfile.GNUTYPE_LONGLINK):
                long_name, pax = None, {}
        pos = data + -(-size // _BLOCK) * _BLOCK


def _key(name: str) -> str:
    folder, _, base = name.rpartition("/")
    stem = base.split(".", 1)[0]
    return f"{folder}/{stem}" if folder else stem


def _ext(name: str) -> str:
    base = name.rpartition("/")[2]
    return base.split(".", 1)[1].lower() if "." in base else ""


def _list_shard(root: DatasetRoot, rel: str, options: ReadOptions) -> _Listing:
    try:
        where = root.resolve(rel)
    except SkipImage as e:  # a shard that is a link out of the root
        raise ValueError(f"shard {root.display(rel)}: {e}") from None
    if root.is_local:
        fd = os.open(where, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            return _walk(_Ranges(lambda pos, n: os.pread(fd, n, pos), os.fstat(fd).st_size, 0))
        finally:
            os.close(fd)
    handle = with_retries(lambda: root.filesystem.open_input_file(where), options)
    return _walk(_Ranges(lambda pos, n: with_retries(lambda: handle.read_at(n, pos), options), handle.size(), _WINDOW))


def _label(text: str | None, key: str) -> tuple[int, str | None]:
    if text is None:
        return -1, f"{BAD_LABEL}: no {key}.cls member"
    try:
        value = int(text.strip())
    except ValueError:
        return -1, f"{BAD_LABEL}: {key}.cls holds {text.strip()[:32]!r}"
    return (value, None) if value >= 0 else (-1, f"{BAD_LABEL}: {key}.cls holds {value}")


def list_webdataset(
    data: str, *, filesystem: pafs.FileSystem | None = None, options: ReadOptions | None = None
) -> SourceRows:
    """List WebDataset tar shards (a folder, a prefix, a ``.tar`` file or a brace pattern) into SourceRows."""
    options = options or ReadOptions()
    root, stamps = _shards(data, filesystem)
    rels = list(stamps)
    if not rels:
        raise ValueError(f"no .tar shards under {data!r}")
    if root.is_local:
        listings = [_list_shard(root, rel, options) for rel in rels]
    else:
        with ThreadPoolExecutor(min(options.in_flight, len(rels)), thread_name_prefix="raypipe-list") as pool:
            listings = list(pool.map(lambda rel: _list_shard(root, rel, options), rels))
    cols: dict[str, list] = {k: [] for k in ("path", "label", "error", "shard", "offset", "size", "member",
                                             "object_size", "object_mtime_ns")}  # fmt: skip
    incomplete = []
    for shard, (rel, listing) in enumerate(zip(rels, listings, strict=True)):
        samples: dict[str, dict] = {}
        for index, m in enumerate(listing.members):
            sample = samples.setdefault(_key(m.name), {})
            ext = _ext(m.name)
            if ext in _IMAGE_EXTS and "image" not in sample:
                sample["image"] = m
            elif ext == "cls" and "cls" not in sample:
                sample["cls"] = listing.labels[index]
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
            for col, value in (("path", rel), ("label", label), ("error", error), ("shard", shard),
                               ("offset", image.offset if image else -1), ("size", image.size if image else -1),
                               ("member", image.name if image else f"{key}.cls"),
                               ("object_size", stamps[rel][0]), ("object_mtime_ns", stamps[rel][1])):  # fmt: skip
                cols[col].append(value)
        if listing.stopped_at is not None:
            incomplete.append({"shard": root.display(rel), "listed_samples": len(samples),
                               "stopped_at": listing.stopped_at, "shard_bytes": listing.file_size,
                               "reason": listing.reason})  # fmt: skip
            log.warning("raypipe: %s: %s; listed %d samples up to byte %d of %d, any after it are not in the "
                        "dataset", root.display(rel), listing.reason, len(samples), listing.stopped_at,
                        listing.file_size)  # fmt: skip
    if not cols["path"]:
        raise ValueError(f"the {len(rels)} shard(s) of {data!r} hold no samples (KEY.jpg with KEY.cls)")
    table = make_rows(cols["path"], cols["label"], errors=cols["error"], shards=cols["shard"],
                      offsets=cols["offset"], sizes=cols["size"], members=cols["member"],
                      object_sizes=cols["object_size"], object_mtimes=cols["object_mtime_ns"])  # fmt: skip
    return SourceRows(kind="webdataset", root=root, table=table,
                      extra={"shards": tuple(rels), "incomplete_shards": incomplete})  # fmt: skip
