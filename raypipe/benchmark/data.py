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

__all__ = ["BenchData", "open_bench_data"]

_IMAGE_KINDS = {b"\xff\xd8": "jpg", b"\x89P": "png", b"RI": "webp", b"GI": "gif", b"BM": "bmp"}


def _ext(data: bytes) -> str:
    return _IMAGE_KINDS.get(data[:2], "img")


@dataclass
class BenchData:
    source: str  # what raypipe reads
    images: int  # rows the listing found readable (no listing error)
    kind: str
    folder: str | None  # a local image folder for the folder-only contenders (the source, or a copy)
    copied: bool = False  # the folder is a temporary copy, removed by close()

    def sample_bytes(self, limit: int = 400) -> list[bytes]:
        """The bytes of the first ``limit`` readable images, in listing order."""
        from raypipe.kernels.errors import SkipImage
        from raypipe.sources import open_source
        from raypipe.sources.reader import BlockReader

        rows = open_source(self.source)
        part = rows.table.slice(0, min(len(rows), limit * 2))
        batch = {k: part.column(k).to_numpy(zero_copy_only=False) for k in part.column_names}
        reader = BlockReader(rows.root, rows.kind, rows.image_column)
        try:
            got = [d for d in reader.read_block(batch) if not isinstance(d, SkipImage)]
        finally:
            reader.close()
        return got[:limit]

    def close(self) -> None:
        if self.copied and self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def open_bench_data(source: str, *, need_folder: bool, workdir: str | None = None) -> BenchData:
    """List ``source``; with ``need_folder``, give the folder-only contenders a local folder of it."""
    from raypipe.sources import open_source

    rows = open_source(source)
    errors = rows.table.column("error").to_pylist()
    images = sum(e is None for e in errors)
    if rows.kind == "folder" and rows.root.is_local:
        return BenchData(source, images, rows.kind, rows.root.root)
    if not need_folder:
        return BenchData(source, images, rows.kind, None)
    folder = tempfile.mkdtemp(prefix="raypipe-bench-folder-", dir=workdir)
    try:
        _write_folder(rows, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return BenchData(source, images, rows.kind, folder, copied=True)


def _write_folder(rows, folder: str, chunk: int = 256) -> None:
    """Every readable, labelled image of ``rows`` as ``folder/<label>/<sample id>.<ext>`` (labels
    zero-padded, so a natural sort of the class folders keeps the label order)."""
    from raypipe.kernels.errors import SkipImage
    from raypipe.sources.reader import BlockReader

    reader = BlockReader(rows.root, rows.kind, rows.image_column)
    width = len(str(max(rows.table.column("label").to_pylist() or [0], key=lambda v: v or 0) or 0))
    try:
        for start in range(0, len(rows), chunk):
            part = rows.table.slice(start, chunk)
            batch = {k: part.column(k).to_numpy(zero_copy_only=False) for k in part.column_names}
            for i, data in enumerate(reader.read_block(batch)):
                if isinstance(data, SkipImage) or batch["error"][i] is not None:
                    continue
                cls = os.path.join(folder, str(int(batch["label"][i])).zfill(width))
                os.makedirs(cls, exist_ok=True)
                with open(os.path.join(cls, f"{int(batch['sample_id'][i])}.{_ext(data)}"), "wb") as fh:
                    fh.write(data)
    finally:
        reader.close()
