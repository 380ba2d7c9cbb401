"""A folder of buckets as the S3 server sees it: ``root/bucket/a/b.jpg`` is object ``a/b.jpg`` of
bucket ``bucket``. Where a key lies (never outside its bucket's folder), the keys under a prefix in
S3's order, an object's ETag, and writes that a reader never sees half done.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from typing import NamedTuple

__all__ = ["UPLOADS", "FolderMarker", "atomic_write", "etag", "iso", "locate", "walk"]

UPLOADS = ".s3server-uploads"  # per-bucket folder of multipart uploads in progress; never listed


def locate(root: str, bucket: str, key: str = "") -> str | None:
    """The local path of ``bucket``/``key`` under ``root`` (the real path of the buckets' folder), or None
    when it would lie outside the bucket's folder."""
    if not bucket or bucket in (".", "..") or "/" in bucket or bucket.startswith("."):
        return None
    base = os.path.join(root, bucket)
    parts = [p for p in key.split("/") if p]
    if any(p in (".", "..") or p == UPLOADS for p in parts):
        return None
    path = os.path.join(base, *parts)
    real = os.path.realpath(path)
    if real != root and not real.startswith(root + os.sep):
        return None
    return path


def etag(st: os.stat_result) -> str:
    """An object's ETag, from its stat."""
    # Cheap and changes with the content's size or time: hashing every object would cost the CPU this
    # server exists to save.
    return '"' + hashlib.md5(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode()).hexdigest() + '"'


def iso(ts: float) -> str:
    """``ts`` as S3 writes a time in XML (UTC, milliseconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def walk(base: str, prefix: str, delimiter: str):
    """``(key, stat)`` of the objects under ``base`` whose keys start with ``prefix``, and ``(common
    prefix, None)`` for each folder the delimiter rolls up, in key order (as S3 sorts them). An empty
    folder is what a PutObject of ``folder/`` leaves: the empty marker object ``folder/``, as on S3."""
    folder = prefix.rpartition("/")[0] if "/" in prefix else ""
    if any(p in (".", "..") for p in folder.split("/")):
        return []
    start = os.path.join(base, *folder.split("/")) if folder else base
    found: dict[str, os.stat_result | None] = {}

    def visit(dirpath: str, keybase: str) -> None:
        try:
            it = list(os.scandir(dirpath))
        except OSError:
            return
        if not it and keybase.startswith(prefix) and keybase:
            st = os.stat(dirpath)
            found[keybase] = FolderMarker(0, st.st_mtime, st.st_mtime_ns, st.st_ino)
        for entry in it:
            name = keybase + entry.name
            if entry.name == UPLOADS and not keybase:
                continue
            if entry.is_dir(follow_symlinks=False):
                sub = name + "/"
                if not (sub.startswith(prefix) or prefix.startswith(sub)):
                    continue
                if delimiter == "/" and sub.startswith(prefix) and len(sub) > len(prefix):
                    found[sub] = None  # rolled up: S3 does not descend
                else:
                    visit(entry.path, sub)
            elif entry.is_file(follow_symlinks=False) and name.startswith(prefix):
                found[name] = entry.stat()

    visit(start, folder + "/" if folder else "")
    return sorted(found.items())


class FolderMarker(NamedTuple):
    """The stat of a folder marker object (an empty folder): no bytes."""

    st_size: int
    st_mtime: float
    st_mtime_ns: int
    st_ino: int


def atomic_write(path: str, write) -> None:
    """``write(file)`` into a temporary file beside ``path``, then renamed into place: a reader never
    sees half an object."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.s3server-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
