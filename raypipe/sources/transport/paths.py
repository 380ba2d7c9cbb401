"""Filesystems and root containment.

Every dataset has a root; every file we read must lie inside it. Local paths are resolved with
``os.path.realpath`` (so a symlink pointing out of the root is caught) *before* anything is opened.
Reads resolve a file's directory once per process and open the file with ``O_NOFOLLOW``; a file that
is itself a symlink is resolved and checked in full. What was opened is checked again through
``/proc/self/fd``: a directory swapped for a symlink after it was resolved (``O_NOFOLLOW`` guards the
last path component only) would otherwise lead the cached path out of the root.
Remote URIs (``s3://``, ``gs://``, …) go through pyarrow's filesystems; there symlinks do not
exist, so a normalised key that leaves the root prefix (``..``) is what we refuse. The filesystems
``open_root`` builds from a URI carry raypipe's timeouts (``raypipe.settings``), which travel with
them to the workers: a store that does not answer fails a request in seconds instead of retrying
for minutes.
"""

from __future__ import annotations

import errno
import os
import posixpath
from dataclasses import dataclass
from datetime import timedelta

import pyarrow.fs as pafs

from raypipe import settings
from raypipe.kernels.errors import MISSING, OUTSIDE_ROOT, UNREADABLE, SkipImage

__all__ = ["DatasetRoot", "bounded", "is_uri", "open_root", "path_value", "printable"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", None)  # None (Windows): every read resolves the whole path
# The fast path needs to see where an open descriptor really is (Linux); elsewhere every read resolves.
_FD_PATHS = os.path.isdir("/proc/self/fd")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Per process, (root, directory) -> the directory's realpath inside the root. Bounded: cleared when full.
_REAL_DIRS: dict[tuple[str, str], str] = {}
_REAL_DIRS_MAX = 65536


# A path-column value that starts with NUL holds a local file name's raw bytes in hex: a name that is not
# UTF-8 (POSIX allows any bytes but NUL and "/"), which an Arrow string column cannot hold. No real name
# starts with NUL, so the two kinds of values cannot be confused.
_RAW_NAME = "\x00"


def path_value(relpath: str) -> str:
    """``relpath`` (from ``os`` listings: undecodable bytes as surrogates) as a path-column value."""
    try:
        relpath.encode("utf-8")
    except UnicodeEncodeError:
        return _RAW_NAME + os.fsencode(relpath).hex()
    return relpath


def _local_name(value: str) -> str:
    """The relative path a path-column value stands for (the inverse of ``path_value``)."""
    return os.fsdecode(bytes.fromhex(value[1:])) if value.startswith(_RAW_NAME) else value


def printable(relpath: str) -> str:
    """``relpath`` with undecodable bytes written as ``\\xNN`` (for reports and messages)."""
    return relpath.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_uri(path: str) -> bool:
    head, sep, _ = path.partition("://")
    return bool(sep) and head.isalnum() and len(head) > 1


@dataclass(frozen=True)
class DatasetRoot:
    """A dataset root on some filesystem; picklable so Ray workers can read through it."""

    root: str  # absolute local path (realpath) or a filesystem path without scheme (bucket/prefix)
    filesystem: pafs.FileSystem | None = None  # None: the local filesystem via os (fastest)
    uri: str = ""  # what the user gave, for messages

    @property
    def is_local(self) -> bool:
        return self.filesystem is None

    def resolve(self, relpath: str) -> str:
        """Absolute path of ``relpath`` inside the root, or SkipImage(OUTSIDE_ROOT)."""
        if self.is_local:
            joined = relpath if os.path.isabs(relpath) else os.path.join(self.root, relpath)
            real = os.path.realpath(joined)
            if not self._contains(real):
                raise SkipImage(OUTSIDE_ROOT, f"{relpath!r} resolves to {real!r}, outside {self.root!r}")
            return real
        rel = relpath
        if is_uri(rel):
            rel = pafs.FileSystem.from_uri(rel)[1]
        joined = rel if rel.startswith(self.root.rstrip("/") + "/") else posixpath.join(self.root, rel)
        norm = posixpath.normpath(joined)
        if ".." in relpath.split("/") or not norm.startswith(self.root.rstrip("/") + "/"):
            raise SkipImage(OUTSIDE_ROOT, f"{relpath!r} is outside {self.uri or self.root!r}")
        return norm

    def read_bytes(self, relpath: str) -> bytes:
        """Read a whole file inside the root; I/O failures become SkipImage with their reason."""
        try:
            if self.is_local:
                return self._read_local(_local_name(relpath))
            with self.filesystem.open_input_stream(self.resolve(relpath)) as f:
                return f.read()
        except FileNotFoundError as e:
            raise SkipImage(MISSING, printable(f"{_local_name(relpath)}: {e}")) from None
        except OSError as e:  # permission denied, a directory, an I/O error on a network filesystem
            shown = printable(f"{_local_name(relpath)}: {e}")
            if "not found" in str(e).lower() or "does not exist" in str(e).lower():
                raise SkipImage(MISSING, shown) from None
            raise SkipImage(UNREADABLE, shown) from None

    def _read_local(self, relpath: str) -> bytes:
        # Fast path: the file's directory resolved once per process (realpath costs an lstat per path
        # component, per file), the file itself opened without following a symlink. A symlinked file,
        # or a name realpath must interpret, takes the full resolve-then-check path. About half the cost
        # per file of a full resolve (``python bench/profiles.py reads DATA`` measures both).
        parent, name = os.path.split(relpath)
        fast = _NOFOLLOW is not None and _FD_PATHS and name not in ("", ".", "..")
        real_dir = self._real_dir(parent) if fast else None
        if real_dir is not None:
            try:
                fd = os.open(os.path.join(real_dir, name), os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
            else:
                with open(fd, "rb") as f:
                    if self._contains(os.readlink(f"/proc/self/fd/{fd}")):
                        return f.read()
                _REAL_DIRS.pop((self.root, parent), None)  # moved since it was resolved: resolve anew
        with open(self.resolve(relpath), "rb") as f:
            return f.read()

    def _contains(self, real: str) -> bool:
        """Whether the resolved local path ``real`` is the root or lies under it."""
        return real == self.root or real.startswith(self.root.rstrip(os.sep) + os.sep)

    def _real_dir(self, parent: str) -> str | None:
        """realpath of the directory ``parent`` (relative to the root, or absolute) when it lies inside
        the root; None otherwise (the caller's full path then raises the usual OUTSIDE_ROOT skip)."""
        key = (self.root, parent)
        real = _REAL_DIRS.get(key)
        if real is None:
            real = os.path.realpath(os.path.join(self.root, parent))
            if not self._contains(real):
                return None
            if len(_REAL_DIRS) >= _REAL_DIRS_MAX:
                _REAL_DIRS.clear()
            _REAL_DIRS[key] = real
        return real

    def relative(self, abspath: str) -> str:
        sep = os.sep if self.is_local else "/"
        prefix = self.root.rstrip(sep) + sep
        return abspath[len(prefix) :] if abspath.startswith(prefix) else abspath

    def display(self, relpath: str) -> str:
        """A path users recognise in reports (the URI form for remote roots); "" is the root itself (a
        single Parquet file's rows)."""
        if relpath == "":
            return self.uri.rstrip("/") if self.uri and not self.is_local else self.root
        if self.is_local:
            relpath = printable(_local_name(relpath))
            return relpath if os.path.isabs(relpath) else os.path.join(self.root, relpath)
        base = self.uri.rstrip("/") if self.uri else self.root
        return f"{base}/{relpath}"


def open_root(path_or_uri: str, *, filesystem: pafs.FileSystem | None = None) -> DatasetRoot:
    """Make a DatasetRoot from a local path or any pyarrow filesystem URI (``s3://bucket/prefix``)."""
    if filesystem is None and not is_uri(path_or_uri):
        return DatasetRoot(root=os.path.realpath(path_or_uri), uri=path_or_uri)
    if filesystem is None:
        filesystem, path = pafs.FileSystem.from_uri(path_or_uri)
        filesystem = bounded(filesystem)
    else:
        path = path_or_uri.split("://", 1)[-1]
    if isinstance(filesystem, pafs.LocalFileSystem):
        return DatasetRoot(root=os.path.realpath(path), uri=path_or_uri)
    return DatasetRoot(root=path.rstrip("/"), filesystem=filesystem, uri=path_or_uri)


def bounded(filesystem: pafs.FileSystem) -> pafs.FileSystem:
    """``filesystem`` with raypipe's timeouts where it left them unset: S3 connect and request timeouts
    and fewer attempts, GCS a retry time limit (pyarrow's defaults retry a missing credential or a
    silent endpoint for minutes). Options are copied through the filesystem's own pickle state, so
    everything ``from_uri`` resolved (region, endpoint from ``AWS_ENDPOINT_URL``, scheme) is kept; any
    other filesystem is returned as it is."""
    kind = {pafs.S3FileSystem: "s3", pafs.GcsFileSystem: "gcs"}.get(type(filesystem))
    if kind is None:
        return filesystem
    try:
        _, (options,) = filesystem.__reduce__()
        options = dict(options)
    except (TypeError, ValueError):
        return filesystem
    bounds = settings.current()
    if kind == "s3":
        if options.get("connect_timeout", -1) < 0:
            options["connect_timeout"] = bounds.store_connect_s
        if options.get("request_timeout", -1) < 0:
            options["request_timeout"] = bounds.store_request_s
        options["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=bounds.store_attempts)
        return pafs.S3FileSystem(**options)
    if options.get("retry_time_limit") is None:
        options["retry_time_limit"] = timedelta(seconds=bounds.gcs_retry_s)
    return pafs.GcsFileSystem(**options)
