"""The S3 actions ``raypipe.testing.s3server`` answers: ListBuckets, HeadBucket, ListObjectsV2, HeadObject,
GetObject (with ``Range``), PutObject (and CopyObject), DeleteObject and multipart uploads, each
written into one reply that the server's loop sends after its latency. Which action a request is
comes from its method, path and query alone (``_action``), as on S3.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import os
import shutil
import urllib.parse
import uuid
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from xml.sax.saxutils import escape

from raypipe.testing.bucket_folders import UPLOADS, atomic_write, etag, iso, locate

__all__ = ["byte_range", "decode_aws_chunked", "make_handler"]

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def make_handler(server) -> type[BaseHTTPRequestHandler]:
    """The handler class of ``server`` (a ``raypipe.testing.s3server.S3Server``): it reads the server's
    ``root`` and tells it each request (``record_request``), the object bytes it sent (``count_sent``)
    and asks it for listings (``listing``, cached there or not)."""

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
            data = self.rfile.read()  # the body as the server's loop read it (chunking undone)
            if "aws-chunked" in self.headers.get("Content-Encoding", ""):
                data = decode_aws_chunked(data)
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

        def reply_error(self, status: int, code: str, message: str, *, head: bool = False) -> None:
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{escape(message)}'
                f"</Message><RequestId>0</RequestId></Error>"
            ).encode()
            self._send(status, body, head=head)

        def answer(self) -> None:
            bucket, key, query, raw_query = self._parse()
            action = _action(self.command, bucket, key, query, self.headers)
            server.record_request(self.command, action, f"/{bucket}/{key}", raw_query, self.headers.get("Range", ""))
            getattr(self, "_" + action)(bucket, key, query)

        # -- buckets ----------------------------------------------------------------------------

        def _ListBuckets(self, bucket, key, query):
            names = sorted(
                n
                for n in os.listdir(server.root)
                if not n.startswith(".") and os.path.isdir(os.path.join(server.root, n))
            )
            items = "".join(
                f"<Bucket><Name>{escape(n)}</Name><CreationDate>{iso(0)}</CreationDate></Bucket>" for n in names
            )
            self._send(
                200,
                f'<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="{_NS}">'
                f"<Owner><ID>raypipe</ID></Owner><Buckets>{items}</Buckets></ListAllMyBucketsResult>".encode(),
            )

        def _HeadBucket(self, bucket, key, query):
            base = locate(server.root, bucket)
            if base is None or not os.path.isdir(base):
                return self.reply_error(404, "NoSuchBucket", bucket, head=True)
            self._send(200, headers={"x-amz-bucket-region": "us-east-1"}, head=True)

        def _ListObjectsV2(self, bucket, key, query):
            base = locate(server.root, bucket)
            if base is None or not os.path.isdir(base):
                return self.reply_error(404, "NoSuchBucket", bucket)
            prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
            max_keys = max(1, min(1000, int(query.get("max-keys") or 1000)))
            after = query.get("continuation-token") or query.get("start-after") or ""
            names, entries = server.listing(base, prefix, delimiter)  # (key or common prefix, stat or None)
            first = bisect.bisect_right(names, after)  # strictly after `after`
            page = entries[first : first + max_keys]
            truncated = len(entries) - first > max_keys
            contents = "".join(
                f"<Contents><Key>{escape(n)}</Key><LastModified>{iso(st.st_mtime)}</LastModified><ETag>"
                f"{escape(etag(st))}</ETag><Size>{st.st_size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
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
            path = locate(server.root, bucket, key)
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
                "ETag": etag(st),
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }

        def _HeadObject(self, bucket, key, query):
            path, st = self._stat(bucket, key)
            if path is None:
                return self.reply_error(404, "NoSuchKey", key, head=True)
            self._send(200, headers={**self._object_headers(st), "Content-Length": str(st.st_size)}, head=True)

        def _GetObject(self, bucket, key, query):
            path, st = self._stat(bucket, key)
            if path is None:
                return self.reply_error(404, "NoSuchKey", key)
            size = st.st_size
            start, end, status = 0, size - 1, 200
            headers = self._object_headers(st)
            rng = self.headers.get("Range")
            if rng:
                parsed = byte_range(rng, size)
                if parsed is None:
                    return self.reply_error(416, "InvalidRange", f"{rng} of {size} bytes")
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            length = end - start + 1
            headers["Content-Length"] = str(length)
            try:
                with open(path, "rb") as f:
                    data = os.pread(f.fileno(), length, start) if length > 0 else b""
            except OSError:
                return self.reply_error(404, "NoSuchKey", key)
            self._send(status, headers=headers)
            self.wfile.write(data)
            server.count_sent(len(data))

        def _PutObject(self, bucket, key, query):
            base = locate(server.root, bucket)
            path = locate(server.root, bucket, key)
            if base is None or not os.path.isdir(base) or path is None:
                return self.reply_error(404, "NoSuchBucket", bucket)
            data = self._body()
            if key.endswith("/"):  # a "directory" marker
                os.makedirs(path, exist_ok=True)
                return self._send(200, headers={"ETag": '"d41d8cd98f00b204e9800998ecf8427e"'})
            source = self.headers.get("x-amz-copy-source")
            if source:
                src_bucket, _, src_key = urllib.parse.unquote(source).lstrip("/").partition("/")
                src, _ = self._stat(src_bucket, src_key)
                if src is None:
                    return self.reply_error(404, "NoSuchKey", src_key)
                atomic_write(path, lambda f: shutil.copyfileobj(open(src, "rb"), f))
                st = os.stat(path)
                body = (
                    f'<?xml version="1.0" encoding="UTF-8"?><CopyObjectResult><LastModified>{iso(st.st_mtime)}'
                    f"</LastModified><ETag>{escape(etag(st))}</ETag></CopyObjectResult>"
                )
                return self._send(200, body.encode())
            atomic_write(path, lambda f: f.write(data))
            self._send(200, headers={"ETag": etag(os.stat(path))})

        def _DeleteObject(self, bucket, key, query):
            path = locate(server.root, bucket, key)
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
            base = locate(server.root, bucket)
            if base is None or not os.path.isdir(base) or "/" in upload_id or upload_id.startswith("."):
                return None
            return os.path.join(base, UPLOADS, upload_id)

        def _CreateMultipartUpload(self, bucket, key, query):
            self._body()
            upload_id = uuid.uuid4().hex
            folder = self._uploads(bucket, upload_id)
            if folder is None or locate(server.root, bucket, key) is None:
                return self.reply_error(404, "NoSuchBucket", bucket)
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
                return self.reply_error(404, "NoSuchUpload", query.get("uploadId", ""))
            number = int(query["partNumber"])
            with open(os.path.join(folder, f"{number:05d}"), "wb") as f:
                f.write(data)
            self._send(200, headers={"ETag": '"' + hashlib.md5(data).hexdigest() + '"'})

        def _CompleteMultipartUpload(self, bucket, key, query):
            self._body()  # the part list: every uploaded part is used, in number order
            folder = self._uploads(bucket, query.get("uploadId", ""))
            path = locate(server.root, bucket, key)
            if folder is None or path is None or not os.path.isdir(folder):
                return self.reply_error(404, "NoSuchUpload", query.get("uploadId", ""))

            def join(f):
                for part in sorted(os.listdir(folder)):
                    with open(os.path.join(folder, part), "rb") as p:
                        shutil.copyfileobj(p, f)

            atomic_write(path, join)
            shutil.rmtree(folder, ignore_errors=True)
            st = os.stat(path)
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult xmlns="{_NS}"><Bucket>'
                f"{escape(bucket)}</Bucket><Key>{escape(key)}</Key><ETag>{escape(etag(st))}</ETag>"
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
            self.reply_error(501, "NotImplemented", f"{self.command} {self.path}", head=self.command == "HEAD")

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


def byte_range(header: str, size: int) -> tuple[int, int] | None:
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


def decode_aws_chunked(data: bytes) -> bytes:
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
