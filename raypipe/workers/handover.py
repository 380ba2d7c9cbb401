"""A feeder's batches handed to the trainer's process as shared memory, not as copies.

A feeder whose augmentation runs on local worker processes (``FeederSource``: one node, nothing else
to run on) holds each chunk's images in a slab (``raypipe.workers.slabs``: anonymous shared memory
the workers wrote into). A batch that is rows of one chunk goes to the trainer as that slab's
descriptor, passed over a Unix socket (``SCM_RIGHTS``), plus the rows' bounds; the trainer maps it
read-only, as it would map a Ray object, and the images are never copied between the two processes.

The feeder keeps the chunk's images (so its slab is not written again) until the trainer says the
batch is released: the trainer's mapping has a finalizer that notes its token, and the trainer's next
request to the feeder carries the tokens noted. A batch the trainer never took (an epoch stopped with
requests in flight) is released when the trainer passes its message on the socket.

The socket lives in a directory only this user can enter, removed once the one expected connection is
made, and that connection must first send a secret the feeder gave through Ray; messages are a
fixed-size token, never a pickle.
"""

from __future__ import annotations

import collections
import hmac
import mmap
import os
import secrets
import shutil
import socket
import struct
import tempfile
import weakref

import numpy as np

from raypipe.workers.worker_process import receive_exactly

__all__ = ["SlabSender", "SlabReceiver", "HandoverError"]

_TOKEN = struct.Struct("<Q")
_SECRET_BYTES = 32
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class HandoverError(ConnectionError):
    """The feeder's end of the hand-over is gone (the feeder died) or out of step."""


class SlabSender:
    """The feeder's end: ``address()`` for the trainer, ``accept()`` its connection, then ``send`` a slab
    per batch and ``release`` the tokens the trainer gives back."""

    def __init__(self):
        self._dir = tempfile.mkdtemp(prefix="raypipe-handover-")  # mode 0700: this user's only
        self._path = os.path.join(self._dir, "feeder.sock")
        self._secret = secrets.token_bytes(_SECRET_BYTES)
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._path)
        self._listener.listen(1)
        self._conn: socket.socket | None = None
        self._held: dict[int, object] = {}  # token -> the chunk images its batch views
        self._next_token = 1

    def address(self) -> tuple[str, bytes]:
        return self._path, self._secret

    def accept(self, timeout_s: float) -> bool:
        """Take the trainer's connection (already queued: it connected before asking for this); False
        when none came or it did not know the secret. The socket's file goes either way."""
        listener, self._listener = self._listener, None
        try:
            listener.settimeout(timeout_s)
            conn, _ = listener.accept()
        except OSError:
            return False
        finally:
            listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
        fds: list[int] = []
        try:
            conn.settimeout(timeout_s)
            got = receive_exactly(conn, _SECRET_BYTES, fds, max_fds=1) or b""
        except OSError:
            got = b""
        _close(fds)  # none is expected
        if not hmac.compare_digest(got, self._secret):
            conn.close()
            return False
        self._conn = conn
        return True

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def send(self, fd: int, keep: object) -> int:
        """Pass ``fd`` to the trainer; ``keep`` (the chunk's images) is held until the token returned
        comes back through ``release``."""
        token, self._next_token = self._next_token, self._next_token + 1
        self._held[token] = keep
        socket.send_fds(self._conn, [_TOKEN.pack(token)], [fd])
        return token

    def release(self, tokens) -> None:
        for token in tokens:
            self._held.pop(token, None)

    @property
    def held(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._held.clear()
        for s in (self._listener, self._conn):
            if s is not None:
                s.close()
        self._listener = self._conn = None
        shutil.rmtree(self._dir, ignore_errors=True)


class SlabReceiver:
    """The trainer's end: connects to a ``SlabSender``'s address; ``view`` maps a batch's rows;
    ``take_released`` gives the tokens of the batches no longer viewed."""

    def __init__(self, address: tuple[str, bytes], timeout_s: float):
        path, secret = address
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout_s)
            self._sock.connect(path)
            self._sock.sendall(secret)
        except BaseException:
            self._sock.close()
            raise
        # appended by finalizers, which run in any thread at any allocation: a deque needs no lock
        self._released: collections.deque[int] = collections.deque()

    def view(self, token: int, start: int, stop: int, row_shape: tuple[int, ...]) -> np.ndarray:
        """Rows ``start:stop`` of the chunk images in the slab sent with ``token``, mapped read-only."""
        fd = self._descriptor(token)
        row = int(np.prod(row_shape))
        try:
            mapped = mmap.mmap(fd, stop * row, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        weakref.finalize(mapped, self._released.append, token).atexit = False
        images = np.frombuffer(mapped, dtype=np.uint8, count=(stop - start) * row, offset=start * row)
        return images.reshape((stop - start, *row_shape))

    def take_released(self) -> list[int]:
        out = []
        while self._released:
            out.append(self._released.popleft())
        return out

    def _descriptor(self, token: int) -> int:
        """The descriptor sent with ``token``; those sent before it were for batches never taken."""
        while True:
            got, fds = self._receive()
            if got == token:
                return fds[0]
            _close(fds)
            if got > token:
                raise HandoverError(f"the feeder sent batch token {got} where {token} was expected")
            self._released.append(got)

    def _receive(self) -> tuple[int, list[int]]:
        fds: list[int] = []
        try:
            data = receive_exactly(self._sock, _TOKEN.size, fds, max_fds=1)
        except OSError as exc:
            _close(fds)
            raise HandoverError(f"the batch hand-over from the feeder failed: {exc}") from exc
        if data is None:
            _close(fds)
            raise HandoverError("the feeder closed its end of the batch hand-over")
        if len(fds) != 1:
            _close(fds)
            raise HandoverError(f"a batch message from the feeder carried {len(fds)} descriptors, not 1")
        return _TOKEN.unpack(data)[0], fds

    def close(self) -> None:
        self._sock.close()


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
