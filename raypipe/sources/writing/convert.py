"""Write any dataset raypipe reads as WebDataset tar shards or Parquet files, in parallel across Ray.

``convert(src, dst, format="webdataset")`` lists ``src``, decides on the driver which samples go to
which output shard (consecutive runs of the listing, sized to ``shard_size`` from the mean size of a
fixed probe of samples), then runs one Ray task per shard. The plan depends only on the listing and the
bytes, and every writer is deterministic (fixed tar header fields, one Parquet writer configuration),
so the same input gives byte-identical shards on any cluster.

- Samples keep their order: output sample ``k`` is input sample ``k`` unless a sample before it could
  not be read (missing, unreadable, outside the root: such samples are left out and listed in the
  report). A sample whose label is bad is written without a label (no ``.cls``; a null Parquet label),
  so it stays a counted ``bad_label`` skip when the output is read.
- WebDataset keys are the sample ids, zero-padded (``000123.jpg`` + ``000123.cls``); the extension is
  the image's format, read from its bytes.
- Parquet files have columns ``image`` (binary) and ``label`` (int64), row groups of ``row_group_rows``.
- ``max_side``: an image whose longer side (as displayed, after EXIF orientation) exceeds it is decoded,
  shrunk to it (Pillow, Lanczos) and stored as JPEG quality 90; smaller ones are copied as they are, and
  so is an image that does not decode (reading the output skips it, as reading the input did).
- Each shard is written under a temporary name (``.NAME.tmp-…``, which no listing takes for a shard)
  and renamed when complete: a failed or interrupted conversion leaves only complete shards.
- WebDataset output gets raypipe's shard index (``raypipe-index.parquet``, ``sources.indexes.shard_index``)
  beside the shards, made from what the writers recorded, so listing the output reads that file alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypipe.kernels.errors import BAD_LABEL, SkipImage
from raypipe.sources.formats.tar_members import Member, TarListing, header_crc, shard_record
from raypipe.sources.reader import BlockReader
from raypipe.sources.table import SourceRows, listed_stamp
from raypipe.sources.transport.paths import DatasetRoot, open_root

__all__ = ["FORMATS", "ConvertReport", "convert", "parse_size", "plan_shards"]

FORMATS = ("webdataset", "parquet")
_PROBE = 32  # samples read on the driver to size the shards
_CHUNK = 64  # samples a writer reads at once (its memory: one chunk's bytes)
_PARQUET_SCHEMA = pa.schema([("image", pa.binary()), ("label", pa.int64())])


def parse_size(text: str | int) -> int:
    """``256MB``, ``1GiB``, ``500k`` or a plain number of bytes."""
    if isinstance(text, int):
        return text
    units = {
        "": 1,
        "b": 1,
        "k": 10**3,
        "kb": 10**3,
        "kib": 2**10,
        "m": 10**6,
        "mb": 10**6,
        "mib": 2**20,
        "g": 10**9,
        "gb": 10**9,
        "gib": 2**30,
    }
    s = text.strip().lower()
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = s[len(number) :].strip()
    if unit not in units or not number:
        raise ValueError(f"shard size {text!r}: expected a number with an optional unit (256MB, 1GiB)")
    size = int(float(number) * units[unit])
    if size <= 0:
        raise ValueError(f"shard size {text!r}: must be positive")
    return size


@dataclass(frozen=True)
class ConvertReport:
    dst: str
    format: str
    shards: tuple[str, ...]  # relative to dst, in order
    samples: int  # written
    skipped: tuple[dict, ...] = ()  # {sample_id, path, reason, detail} of samples left out
    resized: int = 0
    undecodable: int = 0  # copied as they were (max_side asked for a decode that failed)
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def pattern(self) -> str:
        """The shards as one brace pattern (``shard-{00000..00009}.tar``)."""
        if not self.shards:
            return ""
        stem, ext = self.shards[0].rsplit("-", 1)[0], self.shards[0].rsplit(".", 1)[1]
        first, last = (s.rsplit("-", 1)[1].split(".")[0] for s in (self.shards[0], self.shards[-1]))
        return f"{stem}-{{{first}..{last}}}.{ext}" if len(self.shards) > 1 else self.shards[0]


def plan_shards(n: int, mean_bytes: float, shard_size: int, *, samples_per_shard: int | None = None) -> list[range]:
    """Consecutive runs of the ``n`` samples, one per output shard."""
    per = samples_per_shard or max(1, int(shard_size // max(mean_bytes, 1.0)))
    return [range(start, min(start + per, n)) for start in range(0, n, per)]


def _ext(data: bytes) -> str:
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:2] in (b"P5", b"P2"):
        return "pgm"
    if data[:2] in (b"P6", b"P3"):
        return "ppm"
    return "jpg"  # not an image we know: stored as one, so reading it is a counted decode skip


def _shrink(data: bytes, max_side: int) -> tuple[bytes, str]:
    """``data`` with its longer side capped at ``max_side`` ("resized"), as it was ("kept"), or as it was
    because it does not decode ("undecodable")."""
    from PIL import Image

    from raypipe.config import DecodeConfig
    from raypipe.kernels.decode import decode_rgb, open_image, probe_image

    limit = DecodeConfig().max_pixels
    try:
        info = probe_image(data, limit)
        if max(info.width, info.height) <= max_side:
            return data, "kept"
        rgb = decode_rgb(open_image(data, limit))  # as training decodes it: EXIF orientation, modes
    except SkipImage:
        return data, "undecodable"
    h, w = rgb.shape[:2]
    scale = max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    out = io.BytesIO()
    Image.fromarray(rgb).resize(size, Image.Resampling.LANCZOS).save(out, format="JPEG", quality=90)
    return out.getvalue(), "resized"


@dataclass(frozen=True)
class _ShardJob:
    source: SourceRows  # this shard's rows only
    dst: DatasetRoot
    name: str
    format: str
    max_side: int | None
    key_width: int
    row_group_rows: int


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> tuple[int, int, int]:
    """Append a member; returns (where its data starts in the archive, its size, its header's digest)."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644  # fixed fields: the same bytes on every run
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    # the blocks addfile writes before the data (extended headers, then the member's own, last)
    header = info.tobuf(tar.format, tar.encoding, tar.errors)[-tarfile.BLOCKSIZE :]
    tar.addfile(info, io.BytesIO(data))
    # the data, padded, ends at tar.offset
    return tar.offset - -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE, len(data), header_crc(header)


def _write_shard(job: _ShardJob) -> dict:
    """Write one output shard (a Ray task's work); returns what it wrote and left out."""
    rows = job.source
    reader = BlockReader(rows.root, rows.kind, rows.image_column)
    tmp = f".{job.name}.tmp-{uuid.uuid4().hex[:12]}"
    dst = job.dst
    local = dst.is_local
    final_path = os.path.join(dst.root, job.name) if local else posixpath.join(dst.root, job.name)
    tmp_path = os.path.join(dst.root, tmp) if local else posixpath.join(dst.root, tmp)
    stats = {"name": job.name, "samples": 0, "skipped": [], "resized": 0, "undecodable": 0}
    members: list[tuple[str, int, int, int]] = []  # (name, data offset, size, header digest), for the index
    cls_texts: dict[int, str] = {}  # index in members -> a .cls member's text
    sink = open(tmp_path, "wb") if local else dst.filesystem.open_output_stream(tmp_path)  # noqa: SIM115
    writer = None
    try:
        tar = tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) if job.format == "webdataset" else None
        writer = pq.ParquetWriter(sink, _PARQUET_SCHEMA, compression="none") if tar is None else None
        images: list[bytes] = []
        labels: list[int | None] = []
        columns = rows.columns()
        for start in range(0, len(rows), _CHUNK):
            batch = _with_errors(columns.take(np.arange(start, min(start + _CHUNK, len(rows)))))
            for i, data in enumerate(reader.read_block({**batch, "error": _unless_label(batch["error"])})):
                sid, err = int(batch["sample_id"][i]), batch["error"][i]
                if isinstance(data, SkipImage):
                    stats["skipped"].append(
                        {
                            "sample_id": sid,
                            "path": reader.describe(batch, i),
                            "reason": data.reason,
                            "detail": data.detail,
                        }
                    )
                    continue
                if job.max_side:
                    data, what = _shrink(data, job.max_side)
                    if what != "kept":
                        stats[what] += 1
                label = None if err else int(batch["label"][i])  # a bad label (other errors were skipped)
                stats["samples"] += 1
                if tar is not None:
                    key = str(sid).zfill(job.key_width)
                    name = f"{key}.{_ext(data)}"
                    members.append((name, *_tar_member(tar, name, data)))
                    if label is not None:
                        text = str(label)
                        cls_texts[len(members)] = text
                        members.append((f"{key}.cls", *_tar_member(tar, f"{key}.cls", text.encode())))
                else:
                    images.append(data)
                    labels.append(label)
                    if len(images) == job.row_group_rows:
                        writer.write_table(pa.table({"image": images, "label": labels}, schema=_PARQUET_SCHEMA))
                        images, labels = [], []
        if tar is not None:
            tar.close()
        else:
            if images:
                writer.write_table(pa.table({"image": images, "label": labels}, schema=_PARQUET_SCHEMA))
            writer.close()
        sink.close()
        if local:
            os.replace(tmp_path, final_path)
            st = os.stat(final_path)
            stamp = (st.st_size, st.st_mtime_ns)
        else:
            dst.filesystem.move(tmp_path, final_path)
            stamp = listed_stamp(dst.filesystem.get_file_info(final_path))
        if tar is not None:
            stats["index"] = {"members": members, "labels": cls_texts, "stamp": stamp}
    except BaseException:
        if writer is not None:  # closed here, or its finaliser would write to the closed sink later
            with contextlib.suppress(Exception):
                writer.close()
        sink.close()
        try:
            os.unlink(tmp_path) if local else dst.filesystem.delete_file(tmp_path)
        except OSError:
            pass
        raise
    finally:
        reader.close()
    return stats


def _with_errors(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``batch`` with an ``error`` column: all None where the listing has none (no row is known bad)."""
    if "error" not in batch:
        batch["error"] = np.full(len(batch["sample_id"]), None, dtype=object)
    return batch


def _unless_label(errors: np.ndarray) -> np.ndarray:
    """The listing's errors but for bad labels: such an image is still read and written, without a label."""
    return np.array([None if e is None or str(e).startswith(BAD_LABEL) else e for e in errors], dtype=object)


def _write_index(root: DatasetRoot, names: list[str], results: list[dict]) -> None:
    """raypipe's shard index of the shards just written, from what their writers recorded (nothing is read
    back): the rows a listing of the shards would make."""
    from raypipe.sources.indexes.shard_index import INDEX_NAME, write_index

    records = []
    for name, result in zip(names, results, strict=True):
        info = result["index"]
        listing = TarListing(
            members=[Member(*m) for m in info["members"]], labels=dict(info["labels"]), file_size=info["stamp"][0]
        )
        records.append(shard_record(name, tuple(info["stamp"]), listing))
    where = os.path.join(root.root, INDEX_NAME) if root.is_local else posixpath.join(root.root, INDEX_NAME)
    write_index(records, where, root=root, filesystem=root.filesystem)


def _mean_bytes(rows: SourceRows, max_side: int | None) -> float:
    """Mean stored size of up to ``_PROBE`` evenly spaced samples (the same ones on every run)."""
    n = len(rows)
    picks = np.unique(np.linspace(0, n - 1, min(n, _PROBE)).astype(np.int64))
    batch = _with_errors(rows.columns().take(picks))
    reader = BlockReader(rows.root, rows.kind, rows.image_column)
    sizes = []
    for data in reader.read_block({**batch, "error": _unless_label(batch["error"])}):
        if isinstance(data, bytes):
            sizes.append(len(_shrink(data, max_side)[0]) if max_side else len(data))
    reader.close()
    return float(np.mean(sizes)) + 1024 if sizes else 100_000.0  # + tar headers and the label


def _prepare_dst(dst: str, filesystem: pafs.FileSystem | None, ext: str) -> DatasetRoot:
    root = open_root(dst, filesystem=filesystem)
    if root.is_local:
        os.makedirs(root.root, exist_ok=True)
        existing = [n for n in os.listdir(root.root) if n.endswith(ext)]
    else:
        root.filesystem.create_dir(root.root, recursive=True)
        infos = root.filesystem.get_file_info(pafs.FileSelector(root.root, allow_not_found=True))
        existing = [i.base_name for i in infos if i.base_name.endswith(ext)]
    if existing:
        raise ValueError(
            f"{dst!r} already holds {ext} files (e.g. {sorted(existing)[0]!r}): convert into an "
            "empty folder, so no shard of another conversion mixes with these"
        )
    return root


def _gather(pending: dict, progress: Callable[[dict[str, dict]], None] | None) -> dict[str, dict]:
    """Each shard task's result by its name, as they end. When one fails, the error is raised once the
    others have ended too: a caller that goes on (a notebook, a retry) finds the destination settled,
    no shard still being written behind its back. Not ``ray.cancel``: a cancel that races a task's reply
    can end the driver (ray-project/ray#54846); a shard is one task's bounded work."""
    import ray

    results: dict[str, dict] = {}
    failure: Exception | None = None
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            name = pending.pop(ref)
            try:
                results[name] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - raised below, after the rest
                failure = failure or e
        if progress is not None and failure is None:
            progress(results)
    if failure is not None:
        raise failure
    return results


def convert(
    src,
    dst: str,
    *,
    format: str = "webdataset",
    shard_size: int | str = "256MB",
    max_side: int | None = None,
    samples_per_shard: int | None = None,
    row_group_rows: int = 256,
    filesystem: pafs.FileSystem | None = None,
    dst_filesystem: pafs.FileSystem | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    **source_options,
) -> ConvertReport:
    """Convert ``src`` (any source ``open_source`` reads: a path or URI, a ``ray.data.Dataset``, or its
    rows) into shards under ``dst``.

    ``progress(shards_done, shards_total, samples_done)`` is called as shards complete. Connects to
    Ray (``ray.init()``) when it is not yet. ``source_options`` go to ``open_source`` (its keywords, or
    ``options=ListingOptions(…)``).

    >>> report = convert("imagenet/train", "shards/", format="webdataset", max_side=512)  # doctest: +SKIP
    >>> report.pattern  # doctest: +SKIP
    'shard-{00000..00511}.tar'
    """
    import ray

    from raypipe.sources import open_source

    if format not in FORMATS:
        raise ValueError(f"format={format!r}: expected one of {FORMATS}")
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side={max_side}: must be at least 1")
    if row_group_rows < 1:
        raise ValueError(f"row_group_rows={row_group_rows}: must be at least 1")
    began = time.monotonic()
    if filesystem is not None:  # a listing option, passed on as the others are
        source_options["filesystem"] = filesystem
    rows = src if isinstance(src, SourceRows) else open_source(src, **source_options)
    ext = ".tar" if format == "webdataset" else ".parquet"
    out_root = _prepare_dst(dst, dst_filesystem, ext)
    plan = plan_shards(
        len(rows), _mean_bytes(rows, max_side), parse_size(shard_size), samples_per_shard=samples_per_shard
    )
    digits = max(5, len(str(len(plan) - 1)))
    names = [f"{'shard' if format == 'webdataset' else 'part'}-{k:0{digits}d}{ext}" for k in range(len(plan))]
    key_width = max(6, len(str(max(len(rows) - 1, 0))))
    if not ray.is_initialized():
        from raypipe.runtime import connect

        connect()
    task = ray.remote(_write_shard).options(num_cpus=1, max_retries=2)
    pending = {}
    for name, span in zip(names, plan, strict=True):
        part = rows.take(np.asarray(span, dtype=np.int64))  # with the refs of its blocks, for a Ray Dataset's
        job = _ShardJob(part, out_root, name, format, max_side, key_width, row_group_rows)
        pending[task.remote(job)] = name

    def report(done: dict[str, dict]) -> None:
        progress(len(done), len(plan), sum(r["samples"] for r in done.values()))

    results = _gather(pending, report if progress is not None else None)
    ordered = [results[name] for name in names]
    if format == "webdataset":
        _write_index(out_root, names, ordered)
    return ConvertReport(
        dst=dst,
        format=format,
        shards=tuple(names),
        samples=sum(r["samples"] for r in ordered),
        skipped=tuple(s for r in ordered for s in r["skipped"]),
        resized=sum(r["resized"] for r in ordered),
        undecodable=sum(r["undecodable"] for r in ordered),
        seconds=time.monotonic() - began,
        extra={"classes": list(rows.classes)},
    )
