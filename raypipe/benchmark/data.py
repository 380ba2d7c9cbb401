"""What each contender of ``raypipe bench`` reads, from any source raypipe reads.

raypipe reads the source itself (a folder, Parquet, WebDataset shards, a manifest, local or remote). timm's
``create_loader`` and naive Ray Data read image folders: for any other source they read a local folder
copy of it, made once before they run (their best case: local files, no remote reads). The decode limit
and the kernel time the first images' bytes in one process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import pyarrow.compute as pc

from raypipe.sources.table import SourceRows, column_or_default

__all__ = ["BenchData", "open_bench_data"]

_IMAGE_KINDS = {b"\xff\xd8": "jpg", b"\x89P": "png", b"RI": "webp", b"GI": "gif", b"BM": "bmp"}


def _ext(data: bytes) -> str:
    return _IMAGE_KINDS.get(data[:2], "img")


@dataclass
class BenchData:
    source: str  # what raypipe reads
    rows: SourceRows  # its listing, made once
    folder: str | None  # a local image folder for the folder-only contenders (the source, or a copy)
    copied: bool = False  # the folder is a temporary copy, removed by close()

    @property
    def images(self) -> int:
        """Rows the listing found readable (no listing error)."""
        return column_or_default(self.rows.table, "error").null_count

    def sample_bytes(self, limit: int = 400) -> list[bytes]:
        """The bytes of the first ``limit`` readable images, in listing order."""
        got = [data for _, _, data in _read(self.rows, 0, limit * 2)]
        return got[:limit]

    def with_folder(self, workdir: str | None = None) -> BenchData:
        """This data with a local folder for the folder-only contenders: itself for a local image folder,
        else a copy of every readable, labelled image (``close()`` removes it)."""
        if self.folder is not None:
            return self
        folder = tempfile.mkdtemp(prefix="raypipe-bench-folder-", dir=workdir)
        try:
            _write_folder(self.rows, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return BenchData(self.source, self.rows, folder, copied=True)

    def close(self) -> None:
        if self.copied and self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def open_bench_data(source: str, *, index: str | None = None) -> BenchData:
    """List ``source`` (WebDataset shards with the shard index ``index``, as ``open_source`` takes it); a
    local image folder is also the folder-only contenders' folder."""
    from raypipe.sources import open_source

    rows = open_source(source, index=index)
    local_folder = rows.kind == "folder" and rows.root.is_local
    return BenchData(source, rows, rows.root.root if local_folder else None)


def _read(rows: SourceRows, start: int, count: int, chunk: int = 256):
    """``(batch, i, bytes)`` of each readable row of ``rows[start:start + count]`` (listing errors and
    read skips left out), read ``chunk`` rows at a time."""
    from raypipe.kernels.errors import SkipImage
    from raypipe.sources.reader import BlockReader

    reader = BlockReader(rows.root, rows.kind, rows.image_column)
    try:
        for first in range(start, min(len(rows), start + count), chunk):
            part = rows.table.slice(first, min(chunk, start + count - first))
            batch = {k: part.column(k).to_numpy(zero_copy_only=False) for k in part.column_names}
            for i, data in enumerate(reader.read_block(batch)):
                if not isinstance(data, SkipImage) and ("error" not in batch or batch["error"][i] is None):
                    yield batch, i, data
    finally:
        reader.close()


def _write_folder(rows: SourceRows, folder: str) -> None:
    """Every readable, labelled image of ``rows`` as ``folder/<label>/<sample id>.<ext>`` (labels
    zero-padded, so a natural sort of the class folders keeps the label order)."""
    width = len(str(max(0, pc.max(rows.table.column("label")).as_py() or 0)))
    for batch, i, data in _read(rows, 0, len(rows)):
        cls = os.path.join(folder, str(int(batch["label"][i])).zfill(width))
        os.makedirs(cls, exist_ok=True)
        with open(os.path.join(cls, f"{int(batch['sample_id'][i])}.{_ext(data)}"), "wb") as fh:
            fh.write(data)
