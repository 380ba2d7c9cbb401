"""Shard indexes other tools write, parsed: DALI's ``wds2idx`` files and WebDataset's ``wids`` shard lists.

- **DALI** (``tools/wds2idx.py``, read by ``fn.readers.webdataset(index_paths=…)``): one text file per
  shard. The first line is the version and the number of samples (``v1.2 2500``); each further line is
  one sample, its members one after another as ``ext offset size`` (``v1.1``) or ``ext offset size
  name`` (``v1.2``), ``offset`` being where the member's data starts in the tar. A sample is a run of
  consecutive members with the same key. It holds no shard size or time.
- **wids** (``widsindex create``): JSON, ``{"__kind__": "wids-shard-index-v1", "wids_version": 1,
  "name", "base"?, "shardlist": [{"url", "nsamples", "filesize", "md5sum"?}, …]}``; a relative
  ``url`` is relative to ``base``, else to the JSON file's folder. Sample counts per shard, no members.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

__all__ = ["DaliMember", "WidsShard", "dali_index_for", "parse_dali_index", "parse_wids"]

_DALI_VERSIONS = {"v1.1": 3, "v1.2": 4}  # fields per member


@dataclass(frozen=True)
class DaliMember:
    ext: str
    offset: int  # of the data
    size: int
    name: str | None  # v1.2 only


@dataclass(frozen=True)
class WidsShard:
    url: str
    nsamples: int
    filesize: int | None


def parse_dali_index(text: str, where: str) -> list[list[DaliMember]]:
    """The samples of a DALI index file (each a list of its members); ``ValueError`` naming ``where`` and
    the line for anything else."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] not in _DALI_VERSIONS or not head[1].isdigit():
        raise ValueError(
            f"{where}: not a DALI webdataset index (first line {lines[0][:40] if lines else ''!r}; "
            f"expected a version of {sorted(_DALI_VERSIONS)} and a sample count)"
        )
    fields = _DALI_VERSIONS[head[0]]
    samples = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split()
        if not parts:
            continue
        if len(parts) % fields:
            raise ValueError(f"{where}:{number}: {len(parts)} fields, expected a multiple of {fields} ({head[0]})")
        try:
            members = [
                DaliMember(parts[i], int(parts[i + 1]), int(parts[i + 2]), parts[i + 3] if fields == 4 else None)
                for i in range(0, len(parts), fields)
            ]
        except ValueError:
            raise ValueError(f"{where}:{number}: an offset or size is not an integer") from None
        if any(m.offset < 0 or m.size < 0 for m in members):
            raise ValueError(f"{where}:{number}: a negative offset or size")
        samples.append(members)
    if len(samples) != int(head[1]):
        raise ValueError(f"{where}: the first line says {head[1]} samples, the file holds {len(samples)}")
    return samples


def parse_wids(data: bytes, where: str) -> tuple[str | None, list[WidsShard]]:
    """(``base`` or None, the shard list) of a wids shard-index JSON."""
    try:
        desc = json.loads(data)
    except ValueError as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(desc, dict) or (desc.get("__kind__") != "wids-shard-index-v1" and desc.get("wids_version") != 1):
        raise ValueError(f"{where}: not a wids shard index (no __kind__ 'wids-shard-index-v1' or wids_version 1)")
    if desc.get("datasets"):
        raise ValueError(
            f"{where}: wids 'datasets' (indexes that name other indexes) are not read; list the "
            "shards in one 'shardlist'"
        )
    shards = []
    for i, s in enumerate(desc.get("shardlist") or []):
        if not isinstance(s, dict) or not isinstance(s.get("url"), str) or not isinstance(s.get("nsamples"), int):
            raise ValueError(f"{where}: shardlist[{i}] lacks a 'url' string or an integer 'nsamples'")
        size = s.get("filesize")
        shards.append(WidsShard(s["url"], s["nsamples"], size if isinstance(size, int) else None))
    if not shards:
        raise ValueError(f"{where}: an empty shardlist")
    base = desc.get("base")
    return (base if isinstance(base, str) and base else None), shards


def dali_index_for(shard: str) -> str:
    """Where ``wds2idx.py`` puts a shard's index by default: the shard's path up to the first dot of its
    base name (past its first character), plus ``.idx``."""
    folder, _, base = shard.rpartition("/")
    dot = base.find(".", 1)
    stem = base[:dot] if dot > 0 else base
    return posixpath.join(folder, stem + ".idx") if folder else stem + ".idx"
