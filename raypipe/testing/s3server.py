"""A small S3-compatible HTTP server over a local directory, with first-byte latency on demand.

Object stores answer each request after tens of milliseconds; a reader that waits for each answer
in turn is bound by that latency, not by its CPUs. This server reproduces exactly that on one
machine: every response waits ``latency_ms`` before its first byte, then comes at local speed. It
costs far less CPU than moto, which models all of S3 and spends enough per request to cap a 2-core
machine well below what raypipe reads: one thread runs an asyncio loop for every connection (threads
per connection would spend more on handing the interpreter lock around than on the requests), and a
response goes out in one write once its latency has passed (``python bench/profiles.py s3-requests``
prints the CPU per request). On a small machine that is still CPU a real store would not take from the
reader: figures taken with it are a floor.

Each top-level folder of ``root`` is a bucket; ``root/bucket/a/b.jpg`` is object ``a/b.jpg``. What
pyarrow's ``S3FileSystem`` sends to list, stat, read and write is implemented: ListBuckets,
HeadBucket, ListObjectsV2 (prefix, delimiter, max-keys, continuation), HeadObject, GetObject
(with ``Range``), PutObject (and CopyObject), DeleteObject, and multipart uploads (which pyarrow uses
for objects past its part size). Requests are not authenticated (use anonymous or any credentials).
A key that would leave the bucket's folder (``..``, a symlink out of ``root``) is answered as missing.

Each ListObjectsV2 page walks (and stats) the folder under its prefix afresh, so that files changed
behind the server's back are seen; a flat listing of ``n`` objects then costs the server ``n²/1000``
stats. ``cache_listings=True`` walks each (bucket, prefix, delimiter) once and cuts every page from
that (writes through the server clear it): for benchmarks of large listings, whose tree stays still.

    with S3Server("/data/buckets", latency_ms=20) as server:
        fs = server.filesystem()                    # a pyarrow S3FileSystem pointing at it
        open_source("s3://photos/train", filesystem=fs)

Or from a shell (``python -m raypipe.testing.s3server /data/buckets --latency-ms 20``), then point any
S3 client at the printed endpoint (``AWS_ENDPOINT_URL`` is honoured by pyarrow and boto3).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hashlib
import io
import os
import shutil
import signal
import socket
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from typing import NamedTuple
from xml.sax.saxutils import escape

__all__ = ["S3Server"]

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_UPLOADS = ".s3server-uploads"  # per-bucket folder of multipart uploads in progress; never listed


class S3Server:
    """An HTTP server on 127.0.0.1 (a free port) serving ``root``'s folders as buckets.

    ``latency_ms`` is added before the first byte of every response (changeable while running).
    ``requests`` counts requests by ``(method, action)`` (``"GET", "GetObject"``…), ``log`` keeps the
    last ones as ``(method, path, query, range)``, and ``max_active`` is the most requests that were
    being answered at once (with latency, how many a client keeps in flight). ``bytes_sent`` counts
    the object bytes that ``GetObject`` answers carried.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        latency_ms: float = 0.0,
        port: int = 0,
        log_size: int = 10000,
        cache_listings: bool = False,
    ):
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise ValueError(f"root={str(root)!r}: not a directory")
        self.latency_ms = latency_ms
        self.requests: Counter[tuple[str, str]] = Counter()
        self.log: list[tuple[str, str, str, str]] = []
        self.active = self.max_active = 0
        self.bytes_sent = 0
        self.cache_listings = cache_listings
        self._listings: dict[tuple[str, str, str], tuple[list[str], list]] = {}
        self._log_size = log_size
        self._lock = threading.Lock()
        self._handler = _make_handler(self)
        self._sock = socket.create_server(("127.0.0.1", port), backlog=256)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        if self._thread is None:
            loop = self._loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                self._server = loop.run_until_complete(asyncio.start_server(self._serve, sock=self._sock))
                started.set()
                loop.run_forever()

            self._thread = threading.Thread(target=run, name="s3server", daemon=True)
            self._thread.start()
            started.wait()
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if thread is not None and loop is not None:

            async def close() -> None:
                self._server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            self._thread = self._loop = None
        self._sock.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests one after another (keep-alive), each answered after the latency."""
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, version = (lines[0].split(" ", 2) + ["", ""])[:3]
                headers = _Headers(line.split(":", 1) for line in lines[1:] if ":" in line)
                body = await _read_body(reader, headers)
                handler = self._handler.for_request(method, path, version, headers, body)
                try:
                    handler.answer()  # counts the request as active (``_enter``) until it is sent
                except Exception as e:  # noqa: BLE001 - a bug here: the client gets a 500, the server goes on
                    handler = self._handler.for_request(method, path, version, headers, b"")
                    handler.close_connection = True
                    self._enter(method, "InternalError", path, "", "")
                    handler._error(500, "InternalError", f"{type(e).__name__}: {e}")
                try:
                    if self.latency_ms > 0:
                        await asyncio.sleep(self.latency_ms / 1000.0)
                    writer.write(handler.wfile.getvalue())
                    await writer.drain()
                finally:
                    self._leave()
                if handler.close_connection:
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def filesystem(self, **kwargs):
        """A pyarrow ``S3FileSystem`` for this server (anonymous, plain http); ``kwargs`` override."""
        import pyarrow.fs as pafs

        opts = {
            "anonymous": True,
            "endpoint_override": f"127.0.0.1:{self.port}",
            "scheme": "http",
            "region": "us-east-1",
            **kwargs,
        }
        return pafs.S3FileSystem(**opts)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.log.clear()
            self.bytes_sent = 0
            self.max_active = self.active

    def count(self, *actions: str) -> int:
        """Requests answered so far whose action is one of ``actions`` (all when none given)."""
        with self._lock:
            return sum(n for (_, a), n in self.requests.items() if not actions or a in actions)

    # -- called by the handler -------------------------------------------------------------------

    def _enter(self, method: str, action: str, path: str, query: str, rng: str) -> None:
        with self._lock:
            self.requests[(method, action)] += 1
            self.log.append((method, path, query, rng))
            if len(self.log) > self._log_size:
                del self.log[: len(self.log) - self._log_size]
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            if method in ("PUT", "POST", "DELETE"):
                self._listings.clear()

    def _listing(self, base: str, prefix: str, delimiter: str) -> tuple[list[str], list]:
        """(keys, entries) of ``_walk``, walked once per (base, prefix, delimiter) when listings are cached."""
        if not self.cache_listings:
            entries = _walk(base, prefix, delimiter)
            return [n for n, _ in entries], entries
        key = (base, prefix, delimiter)
        found = self._listings.get(key)
        if found is None:
            entries = _walk(base, prefix, delimiter)
            found = self._listings[key] = ([n for n, _ in entries], entries)
        return found

    def _leave(self) -> None:
        with self._lock:
            self.active -= 1

    def _locate(self, bucket: str, key: str = "") -> str | None:
        """The local path of ``bucket``/``key``, or None when it would lie outside the bucket's folder."""
        if not bucket or bucket in (".", "..") or "/" in bucket or bucket.startswith("."):
            return None
        base = os.path.join(self.root, bucket)
        parts = [p for p in key.split("/") if p]
        if any(p in (".", "..") or p == _UPLOADS for p in parts):
            return None
        path = os.path.join(base, *parts)
        real = os.path.realpath(path)
        if real != self.root and not real.startswith(self.root + os.sep):
            return None
        return path


def _etag(st: os.stat_result) -> str:
    # Cheap and changes with the content's size or time: hashing every object would cost the CPU this
    # server exists to save.
    return '"' + hashlib.md5(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode()).hexdigest() + '"'


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def _make_handler(server: S3Server):
    class Handler(BaseHTTPRequestHandler):
        """The S3 actions, answering one parsed request into ``wfile`` (the server's loop sends it: one
        write, after the latency; the TCP_NODELAY it sets keeps a reply from waiting for the client's
        delayed ACK of an earlier one, ~40 ms on Linux). ``BaseHTTPRequestHandler`` lends the status
        line and header formatting; its socket handling is not used."""

        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections, as with a real store
        server_version = "raypipe-s3server"

        @classmethod
        def for_request(cls, method: str, path: str, version: str, headers, body: bytes) -> Handler:
            self = cls.__new__(cls)
            self.command, self.path, self.request_version = method, path, version or "HTTP/1.1"
            self.requestline = f"{method} {path} {version}"
            self.headers, self.rfile, self.wfile = headers, io.BytesIO(body), io.BytesIO()
            self.client_address = ("127.0.0.1", 0)
            self.close_connection = headers.get("Connection", "").lower() == "close" or version == "HTTP/1.0"
            return self

        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

        # -- plumbing ---------------------------------------------------------------------------

        def _parse(self):
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            bucket, _, key = path.lstrip("/").partition("/")
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            return bucket, key, {k: v[0] for k, v in query.items()}, url.query

        def _body(self) -> bytes:
            data = self.rfile.read()  # the body as the loop read it (``_read_body``: chunking undone)
            if "aws-chunked" in self.headers.get("Content-Encoding", ""):
                data = _decode_aws_chunked(data)
            return data

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None, *, head: bool = False) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if body and "Content-Type" not in (headers or {}):
                self.send_header("Content-Type", "application/xml")
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head and body:
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str, *, head: bool = False) -> None:
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{escape(message)}'
                f"</Message><RequestId>0</RequestId></Error>"
            ).encode()
            self._send(status, body, head=head)

        def answer(self) -> None:
            bucket, key, query, raw_query = self._parse()
            action = _action(self.command, bucket, key, query, self.headers)
            server._enter(self.command, action, f"/{bucket}/{key}", raw_query, self.headers.get("Range", ""))
            getattr(self, "_" + action)(bucket, key, query)

        # -- buckets ----------------------------------------------------------------------------

        def _ListBuckets(self, bucket, key, query):
            names = sorted(
                n
                for n in os.listdir(server.root)
                if not n.startswith(".") and os.path.isdir(os.path.join(server.root, n))
            )
            items = "".join(
                f"<Bucket><Name>{escape(n)}</Name><CreationDate>{_iso(0)}</CreationDate></Bucket>" for n in names
            )
            self._send(
                200,
                f'<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="{_NS}">'
                f"<Owner><ID>raypipe</ID></Owner><Buckets>{items}</Buckets></ListAllMyBucketsResult>".encode(),
            )

        def _HeadBucket(self, bucket, key, query):
            base = server._locate(bucket)
            if base is None or not os.path.isdir(base):
                return self._error(404, "NoSuchBucket", bucket, head=True)
            self._send(200, headers={"x-amz-bucket-region": "us-east-1"}, head=True)

        def _ListObjectsV2(self, bucket, key, query):
            base = server._locate(bucket)
            if base is None or not os.path.isdir(base):
                return self._error(404, "NoSuchBucket", bucket)
            prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
            max_keys = max(1, min(1000, int(query.get("max-keys") or 1000)))
            after = query.get("continuation-token") or query.get("start-after") or ""
            names, entries = server._listing(base, prefix, delimiter)  # (key or common prefix, stat or None)
            first = bisect.bisect_right(names, after)  # strictly after `after`
            page = entries[first : first + max_keys]
            truncated = len(entries) - first > max_keys
            contents = "".join(
                f"<Contents><Key>{escape(n)}</Key><LastModified>{_iso(st.st_mtime)}</LastModified><ETag>"
                f"{escape(_etag(st))}</ETag><Size>{st.st_size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
                for n, st in page
                if st is not None
            )
            prefixes = "".join(
                f"<CommonPrefixes><Prefix>{escape(n)}</Prefix></CommonPrefixes>" for n, st in page if st is None
            )
            token = f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>" if truncated else ""
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{_NS}"><Name>{escape(bucket)}'
                f"</Name><Prefix>{escape(prefix)}</Prefix><Delimiter>{escape(delimiter)}</Delimiter>"
                f"<MaxKeys>{max_keys}</MaxKeys><KeyCount>{len(page)}</KeyCount>"
                f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{token}{contents}{prefixes}"
                "</ListBucketResult>"
            )
            self._send(200, body.encode())

        # -- objects ----------------------------------------------------------------------------

        def _stat(self, bucket, key):
            path = server._locate(bucket, key)
            if path is None or key.endswith("/") or not key:
                return None, None
            try:
                st = os.stat(path)
            except OSError:
                return None, None
            return (path, st) if os.path.isfile(path) else (None, None)

        def _object_headers(self, st) -> dict:
            return {
                "Last-Modified": formatdate(st.st_mtime, usegmt=True),
                "ETag": _etag(st),
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }

        def _HeadObject(self, bucket, key, query):
            path, st = self._stat(bucket, key)
            if path is None:
                return self._error(404, "NoSuchKey", key, head=True)
            self._send(200, headers={**self._object_headers(st), "Content-Length": str(st.st_size)}, head=True)

        def _GetObject(self, bucket, key, query):
            path, st = self._stat(bucket, key)
            if path is None:
                return self._error(404, "NoSuchKey", key)
            size = st.st_size
            start, end, status = 0, size - 1, 200
            headers = self._object_headers(st)
            rng = self.headers.get("Range")
            if rng:
                parsed = _range(rng, size)
                if parsed is None:
                    return self._error(416, "InvalidRange", f"{rng} of {size} bytes")
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            length = end - start + 1
            headers["Content-Length"] = str(length)
            try:
                with open(path, "rb") as f:
                    data = os.pread(f.fileno(), length, start) if length > 0 else b""
            except OSError:
                return self._error(404, "NoSuchKey", key)
            self._send(status, headers=headers)
            self.wfile.write(data)
            with server._lock:
                server.bytes_sent += len(data)

        def _PutObject(self, bucket, key, query):
            base = server._locate(bucket)
            path = server._locate(bucket, key)
            if base is None or not os.path.isdir(base) or path is None:
                return self._error(404, "NoSuchBucket", bucket)
            data = self._body()
            if key.endswith("/"):  # a "directory" marker
                os.makedirs(path, exist_ok=True)
                return self._send(200, headers={"ETag": '"d41d8cd98f00b204e9800998ecf8427e"'})
            source = self.headers.get("x-amz-copy-source")
            if source:
                src_bucket, _, src_key = urllib.parse.unquote(source).lstrip("/").partition("/")
                src, _ = self._stat(src_bucket, src_key)
                if src is None:
                    return self._error(404, "NoSuchKey", src_key)
                _atomic_write(path, lambda f: shutil.copyfileobj(open(src, "rb"), f))
                st = os.stat(path)
                body = (
                    f'<?xml version="1.0" encoding="UTF-8"?><CopyObjectResult><LastModified>{_iso(st.st_mtime)}'
                    f"</LastModified><ETag>{escape(_etag(st))}</ETag></CopyObjectResult>"
                )
                return self._send(200, body.encode())
            _atomic_write(path, lambda f: f.write(data))
            self._send(200, headers={"ETag": _etag(os.stat(path))})

        def _DeleteObject(self, bucket, key, query):
            path = server._locate(bucket, key)
            if path is not None:
                try:
                    if key.endswith("/"):
                        os.rmdir(path)
                    else:
                        os.unlink(path)
                except OSError:
                    pass  # S3 answers 204 whether or not the key existed
            self._send(204)

        # -- multipart uploads ------------------------------------------------------------------

        def _uploads(self, bucket, upload_id=""):
            base = server._locate(bucket)
            if base is None or not os.path.isdir(base) or "/" in upload_id or upload_id.startswith("."):
                return None
            return os.path.join(base, _UPLOADS, upload_id)

        def _CreateMultipartUpload(self, bucket, key, query):
            self._body()
            upload_id = uuid.uuid4().hex
            folder = self._uploads(bucket, upload_id)
            if folder is None or server._locate(bucket, key) is None:
                return self._error(404, "NoSuchBucket", bucket)
            os.makedirs(folder)
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult xmlns="{_NS}"><Bucket>'
                f"{escape(bucket)}</Bucket><Key>{escape(key)}</Key><UploadId>{upload_id}</UploadId>"
                "</InitiateMultipartUploadResult>"
            )
            self._send(200, body.encode())

        def _UploadPart(self, bucket, key, query):
            folder = self._uploads(bucket, query.get("uploadId", ""))
            data = self._body()
            if folder is None or not os.path.isdir(folder):
                return self._error(404, "NoSuchUpload", query.get("uploadId", ""))
            number = int(query["partNumber"])
            with open(os.path.join(folder, f"{number:05d}"), "wb") as f:
                f.write(data)
            self._send(200, headers={"ETag": '"' + hashlib.md5(data).hexdigest() + '"'})

        def _CompleteMultipartUpload(self, bucket, key, query):
            self._body()  # the part list: every uploaded part is used, in number order
            folder = self._uploads(bucket, query.get("uploadId", ""))
            path = server._locate(bucket, key)
            if folder is None or path is None or not os.path.isdir(folder):
                return self._error(404, "NoSuchUpload", query.get("uploadId", ""))

            def join(f):
                for part in sorted(os.listdir(folder)):
                    with open(os.path.join(folder, part), "rb") as p:
                        shutil.copyfileobj(p, f)

            _atomic_write(path, join)
            shutil.rmtree(folder, ignore_errors=True)
            st = os.stat(path)
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult xmlns="{_NS}"><Bucket>'
                f"{escape(bucket)}</Bucket><Key>{escape(key)}</Key><ETag>{escape(_etag(st))}</ETag>"
                "</CompleteMultipartUploadResult>"
            )
            self._send(200, body.encode())

        def _AbortMultipartUpload(self, bucket, key, query):
            folder = self._uploads(bucket, query.get("uploadId", ""))
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            self._send(204)

        def _Unsupported(self, bucket, key, query):
            if self.command in ("PUT", "POST"):
                self._body()
            self._error(501, "NotImplemented", f"{self.command} {self.path}", head=self.command == "HEAD")

    return Handler


def _action(method: str, bucket: str, key: str, query: dict, headers) -> str:
    if not bucket:
        return "ListBuckets" if method == "GET" else "Unsupported"
    if not key:
        if method == "HEAD":
            return "HeadBucket"
        if method == "GET" and query.get("list-type") == "2":
            return "ListObjectsV2"
        return "Unsupported"
    if method == "POST":
        return (
            "CreateMultipartUpload"
            if "uploads" in query
            else "CompleteMultipartUpload"
            if "uploadId" in query
            else "Unsupported"
        )
    if method == "PUT":
        return "UploadPart" if "uploadId" in query else "PutObject"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    return {"HEAD": "HeadObject", "GET": "GetObject"}.get(method, "Unsupported")


def _walk(base: str, prefix: str, delimiter: str):
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
            found[keybase] = _Marker(0, st.st_mtime, st.st_mtime_ns, st.st_ino)
        for entry in it:
            name = keybase + entry.name
            if entry.name == _UPLOADS and not keybase:
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


class _Marker(NamedTuple):
    """The stat of a folder marker object (an empty folder): no bytes."""

    st_size: int
    st_mtime: float
    st_mtime_ns: int
    st_ino: int


def _range(header: str, size: int) -> tuple[int, int] | None:
    """``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` as inclusive ``(start, end)``; None if unsatisfiable."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    if first == "":
        n = int(last)
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else None
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    return (start, end) if start < size and start <= end else None


class _Headers(dict):
    """A request's headers, looked up without regard to case (``get`` as on ``email.message.Message``)."""

    def __init__(self, pairs):
        super().__init__((name.strip().lower(), value.strip()) for name, value in pairs)

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


async def _read_body(reader: asyncio.StreamReader, headers: _Headers) -> bytes:
    """A request's body: ``Content-Length`` bytes, or a chunked body's data up to its end (trailers read
    and dropped)."""
    if headers.get("Transfer-Encoding", "").lower() == "chunked":
        data = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(data)
            data += await reader.readexactly(size)
            await reader.readline()  # the CRLF after the chunk
    length = int(headers.get("Content-Length") or 0)
    return await reader.readexactly(length) if length > 0 else b""


def _atomic_write(path: str, write) -> None:
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


def _decode_aws_chunked(data: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (``<hex size>[;ext]\\r\\n<data>\\r\\n`` …, trailers last)."""
    out, pos = bytearray(), 0
    while pos < len(data):
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";")[0], 16)
        if size == 0:
            break
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2
    return bytes(out)


def main() -> None:
    p = argparse.ArgumentParser(description="Serve a folder's sub-folders as S3 buckets on 127.0.0.1.")
    p.add_argument("root")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=0.0, help="added before the first byte of every response")
    p.add_argument("--cache-listings", action="store_true", help="walk each listed prefix once (a still tree)")
    args = p.parse_args()
    with S3Server(args.root, latency_ms=args.latency_ms, port=args.port, cache_listings=args.cache_listings) as server:
        print(f"serving {server.root} at {server.endpoint} (AWS_ENDPOINT_URL={server.endpoint})", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        # what a benchmark running the server in a process of its own counts (``benchmark.s3.S3Process``)
        print(f"served {server.count()} requests, at most {server.max_active} at once", flush=True)


if __name__ == "__main__":
    main()
