"""The shards a WebDataset's name stands for: a folder (or prefix) of ``*.tar`` files, one ``.tar``, a
brace pattern (``shards-{0000..0099}.tar``) or a wids shard list (``.json``), on local disk or any
pyarrow filesystem. Each shard comes with its (size, mtime_ns) where a remote listing gave them, so
the listing's rows can key the cache without another request (-1s for local shards); reading the
shards is ``raypipe.sources.formats.webdataset``'s.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re

import pyarrow.fs as pafs

from raypipe.kernels.errors import SkipImage
from raypipe.sources.indexes.foreign_index import parse_wids
from raypipe.sources.table import listed_stamp
from raypipe.sources.transport.paths import DatasetRoot, open_root

__all__ = ["expand_braces", "find_shards", "has_braces", "shard_paths"]

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
        parts.append([pattern[pos : m.start()]])
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


def find_shards(
    data: str, filesystem: pafs.FileSystem | None
) -> tuple[DatasetRoot, dict[str, tuple[int, int]], dict[str, int]]:
    """The shards ``data`` names (a folder, a prefix, a ``.tar``, a brace pattern or a wids shard-list
    ``.json``): their root, each one's (size, mtime_ns), and the sample counts a wids list gives (else
    none); no shard at all is an error."""
    expected: dict[str, int] = {}
    if data.rstrip("/").lower().endswith(".json"):
        root, stamps, expected = _wids_shards(data, filesystem)
    else:
        root, stamps = _shards(data, filesystem)
    if not stamps:
        raise ValueError(f"no .tar shards under {data!r}")
    return root, stamps, expected


def _shards(data: str, filesystem: pafs.FileSystem | None) -> tuple[DatasetRoot, dict[str, tuple[int, int]]]:
    """The root and the shards ``data`` names, sorted, each with its (size, mtime_ns) as a remote listing
    gave them (-1 for local shards)."""
    if has_braces(data):
        head = data[: data.index("{")]
        base = head.rsplit("/", 1)[0] if "/" in head else "."
        root = open_root(base, filesystem=filesystem)
        rels = sorted(set(name[len(base) + 1 :] if base != "." else name for name in expand_braces(data)))
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
    found = {
        root.relative(i.path): listed_stamp(i)
        for i in infos
        if i.type == pafs.FileType.File and i.path.endswith(".tar")
    }
    return {r: found[r] for r in sorted(found)}


def _wids_shards(
    data: str, filesystem: pafs.FileSystem | None
) -> tuple[DatasetRoot, dict[str, tuple[int, int]], dict[str, int]]:
    """The root, the shards (with their stamps) and the sample count per shard of a wids shard list."""
    parent, _, name = data.rstrip("/").rpartition("/")
    here = open_root(parent or ".", filesystem=filesystem)
    try:
        raw = here.read_bytes(name)
    except SkipImage as e:
        raise ValueError(f"wids shard index {data!r}: {e.reason} ({e.detail})") from None
    base, shards = parse_wids(raw, data)
    root = here
    if base is not None:
        root = (
            open_root(base, filesystem=filesystem)
            if "://" in base or base.startswith("/")
            else open_root(posixpath.join(parent or ".", base), filesystem=filesystem)
        )
    rels, counts = [], {}
    for s in shards:
        url = s.url
        try:
            resolved = root.resolve(url)  # a URI or a path inside the root; ".." out of it is refused
        except SkipImage as e:
            raise ValueError(
                f"wids shard index {data!r}: shard {url!r} lies outside {root.uri or root.root!r} ({e.detail})"
            ) from None
        rel = root.relative(resolved)
        rels.append(rel)
        counts[rel] = s.nsamples
    found = _existing(root, rels)
    missing = [r for r in rels if r not in found]
    if missing:
        raise ValueError(f"{len(missing)} of the {len(rels)} shards of {data!r} do not exist, e.g. {missing[:3]}")
    return root, {r: found[r] for r in sorted(found)}, counts
