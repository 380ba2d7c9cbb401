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
for objects past its part size; ``raypipe.testing.s3_actions``). Requests are not authenticated (use
anonymous or any credentials). A key that would leave the bucket's folder (``..``, a symlink out of
``root``) is answered as missing.

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
import os
import signal
import socket
import threading
from collections import Counter

from raypipe.testing.bucket_folders import walk
from raypipe.testing.s3_actions import make_handler

__all__ = ["S3Server"]


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
        self._handler = make_handler(self)
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
                    handler.answer()  # counts the request as active (``record_request``) until it is sent
                except Exception as e:  # noqa: BLE001 - a bug here: the client gets a 500, the server goes on
                    handler = self._handler.for_request(method, path, version, headers, b"")
                    handler.close_connection = True
                    self.record_request(method, "InternalError", path, "", "")
                    handler.reply_error(500, "InternalError", f"{type(e).__name__}: {e}")
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

    def record_request(self, method: str, action: str, path: str, query: str, rng: str) -> None:
        """Count a request being answered (active until it is sent); a write forgets cached listings."""
        with self._lock:
            self.requests[(method, action)] += 1
            self.log.append((method, path, query, rng))
            if len(self.log) > self._log_size:
                del self.log[: len(self.log) - self._log_size]
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            if method in ("PUT", "POST", "DELETE"):
                self._listings.clear()

    def listing(self, base: str, prefix: str, delimiter: str) -> tuple[list[str], list]:
        """(keys, entries) of ``bucket_folders.walk``, walked once per (base, prefix, delimiter) when listings
        are cached."""
        if not self.cache_listings:
            entries = walk(base, prefix, delimiter)
            return [n for n, _ in entries], entries
        key = (base, prefix, delimiter)
        found = self._listings.get(key)
        if found is None:
            entries = walk(base, prefix, delimiter)
            found = self._listings[key] = ([n for n, _ in entries], entries)
        return found

    def count_sent(self, n: int) -> None:
        """Count ``n`` object bytes a GetObject reply carried."""
        with self._lock:
            self.bytes_sent += n

    def _leave(self) -> None:
        with self._lock:
            self.active -= 1


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
