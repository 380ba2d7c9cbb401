"""The worker process of ``LocalWorkers`` (``python -m raypipe.pipeline._local_worker SOCKET_FD``).

It reads requests from a Unix socket shared with the trainer and answers on it, one at a time, in
order (frames: an 8-byte length, then a pickle; both ends are raypipe's own code in processes of one
user). A chunk's request carries the descriptor of the shared memory its images go into
(``raypipe.pipeline.slabs``) as the socket's ancillary data. It imports the stage and nothing else of
raypipe's: no Ray, no torch.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import struct
import sys
import traceback
from typing import BinaryIO

_HEAD = struct.Struct("<Q")
_MAX_FDS = 4  # descriptors one request may carry (a chunk's carries one)


def _frame(message: object) -> bytes:
    """A message as it goes on the wire: its length, then its pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(data)) + data


def send(stream: BinaryIO, message: object) -> None:
    stream.write(_frame(message))
    stream.flush()


def receive(stream: BinaryIO) -> object | None:
    """The next message, or None at the end of the stream (the other side closed or died)."""
    head = stream.read(_HEAD.size)
    if len(head) < _HEAD.size:
        return None
    (size,) = _HEAD.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def send_with_fds(sock: socket.socket, message: object, fds: list[int]) -> None:
    """``send`` on a socket, with ``fds`` passed along with the frame's first bytes."""
    frame = _frame(message)
    sent = socket.send_fds(sock, [frame], fds) if fds else 0
    if sent < len(frame):
        sock.sendall(memoryview(frame)[sent:])


def receive_exactly(sock: socket.socket, n: int, fds: list[int], max_fds: int = _MAX_FDS) -> bytes | None:
    """``n`` bytes from ``sock``, the descriptors that came with them appended to ``fds`` (the caller
    closes them, whatever happens); None at the end of the stream."""
    parts, got = [], 0
    while got < n:
        data, more, flags, _ = socket.recv_fds(sock, n - got, max_fds)
        fds.extend(more)
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            raise OSError("a message's descriptors were cut short")
        if not data:
            return None
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def receive_with_fds(sock: socket.socket) -> tuple[object, list[int]] | None:
    """The next message and the descriptors that came with it, or None at the end. Reads exactly one
    frame, so no descriptor of the next one is taken with it."""
    fds: list[int] = []
    head = receive_exactly(sock, _HEAD.size, fds)
    body = receive_exactly(sock, _HEAD.unpack(head)[0], fds) if head is not None else None
    if body is None:
        for fd in fds:
            os.close(fd)
        return None
    return pickle.loads(body), fds


def run_chunk(rows: dict, spec, fd: int) -> dict:
    """Augment ``rows`` with their images written straight into the shared memory of ``fd`` (the
    parent's slab, closed here); the returned block carries ``("shared", shape)`` for them."""
    import numpy as np

    from raypipe.stages.augment import augment_block

    shape = (len(rows["sample_id"]), *spec.image_shape)
    size = int(np.prod(shape))
    try:
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
    # On an exception the mapping goes with the traceback's frames, which still view it.
    block = augment_block(rows, spec, out=np.frombuffer(mapped, dtype=np.uint8).reshape(shape))
    block["image"] = ("shared", shape)  # this thread's last view of the mapping
    try:
        mapped.close()
    except BufferError:
        # The stage's thread (``call_at_niceness``) has handed back the result but may not yet have
        # dropped its task, which holds ``out``: the mapping then goes with that last view instead.
        pass
    return block


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (the parent raises it with its own type), else a RuntimeError
    that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception type may refuse pickling
        return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


def serve(sock: socket.socket, outbox: BinaryIO) -> None:
    from raypipe.stages.augment import stage_for

    send(outbox, ("ready", None, os.getpid()))
    while (received := receive_with_fds(sock)) is not None:
        (kind, task_id, payload), fds = received
        try:
            if kind == "setup":
                stage_for(payload)
                reply = None
            else:
                reply = run_chunk(*payload, fds.pop(0))
        except Exception as exc:  # the task's failure, reported to the parent with its traceback
            send(outbox, ("error", task_id, (_portable(exc), traceback.format_exc())))
            continue
        finally:
            for fd in fds:  # none is expected
                os.close(fd)
        send(outbox, ("done", task_id, reply))


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[1]))
    outbox = sock.makefile("wb")
    try:
        serve(sock, outbox)
    except (BrokenPipeError, ConnectionResetError):  # the parent is gone
        pass


if __name__ == "__main__":
    main(sys.argv)
