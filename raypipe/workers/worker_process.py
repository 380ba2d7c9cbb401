"""The worker process of ``LocalWorkers`` and ``NodeWorkers``.

``python -m raypipe.workers.worker_process SOCKET_FD``: a worker of this machine's trainer. It reads
requests from a Unix socket shared with the trainer and answers on it, one at a time, in order
(frames: an 8-byte length, then a pickle; both ends are raypipe's own code in processes of one
user). A chunk's request carries the descriptor of the shared memory its images go into
(``raypipe.workers.slabs``) as the socket's ancillary data.

``python -m raypipe.workers.worker_process --connect HOST PORT LIFELINE_FD``: a worker on another node
of the cluster (``raypipe.workers.node``), started by that node's launcher. It connects to
the consumer over TCP, and both ends prove they know the secret the launcher passed in the
environment before either reads a pickle (``raypipe.workers.peer_auth``). No descriptor can cross
nodes: a chunk's request comes without one, and the worker writes the images into a buffer of its
own, reused from chunk to chunk, then sends them as raw bytes right after the answer's frame. It ends
when the launcher does (the read end of ``LIFELINE_FD`` sees the end of the pipe) or when its
connection does.

It imports the stage and nothing else of raypipe's but ``raypipe.allocator`` (it keeps the memory its
chunks free): no Ray, no torch.
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


_inline_buffer = None  # a remote worker's images, written here and sent: reused, so its pages are made once


def run_chunk_inline(rows: dict, spec) -> tuple[dict, memoryview]:
    """Augment ``rows`` into this process's own buffer; the block carries ``("inline", shape)`` for the
    images, whose bytes (the returned view) follow the answer on the connection."""
    global _inline_buffer
    import numpy as np

    from raypipe.stages.augment import augment_block

    shape = (len(rows["sample_id"]), *spec.image_shape)
    size = int(np.prod(shape))
    if _inline_buffer is None or _inline_buffer.size < size:
        _inline_buffer = np.empty(size, dtype=np.uint8)
    block = augment_block(rows, spec, out=_inline_buffer[:size].reshape(shape))
    block["image"] = ("inline", shape)
    return block, memoryview(_inline_buffer)[:size]


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (the parent raises it with its own type), else a RuntimeError
    that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception type may refuse pickling
        return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


def serve(sock: socket.socket, outbox: BinaryIO) -> None:
    # The stage's modules (the kernels, numpy, pyarrow) are imported before the worker says it is ready:
    # seconds on a busy node, which the first chunk sent to it would otherwise wait while other workers
    # take the rest.
    import raypipe.stages.augment  # noqa: F401

    send(outbox, ("ready", None, os.getpid()))
    while (received := receive_with_fds(sock)) is not None:
        (kind, task_id, payload), fds = received
        images = None
        try:
            if kind == "setup":
                payload.prepare()
                reply = None
            elif fds:
                reply = run_chunk(*payload, fds.pop(0))
            else:  # from another node: the images follow the answer
                reply, images = run_chunk_inline(*payload)
        except Exception as exc:  # the task's failure, reported to the parent with its traceback
            send(outbox, ("error", task_id, (_portable(exc), traceback.format_exc())))
            continue
        finally:
            for fd in fds:  # none is expected
                os.close(fd)
        outbox.write(_frame(("done", task_id, reply)))
        if images is not None:
            outbox.write(images)
        outbox.flush()


def _watch_lifeline(fd: int) -> None:
    """End this process when the pipe's other end closes (its launcher ended, however)."""
    import threading

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os._exit(0)

    threading.Thread(target=watch, name="raypipe-lifeline", daemon=True).start()


def _connect(host: str, port: int) -> socket.socket:
    from raypipe.workers.peer_auth import SECRET_ENV, prove_client, tune_stream_socket

    secret = bytes.fromhex(os.environ.pop(SECRET_ENV))
    sock = socket.create_connection((host, port), timeout=30)
    try:
        prove_client(sock, secret)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    tune_stream_socket(sock)
    return sock


def main(argv: list[str]) -> None:
    from raypipe.allocator import keep_freed_memory

    keep_freed_memory()
    if len(argv) > 1 and argv[1] == "--connect":
        _watch_lifeline(int(argv[4]))
        sock = _connect(argv[2], int(argv[3]))
    else:
        sock = socket.socket(fileno=int(argv[1]))
    outbox = sock.makefile("wb")
    try:
        serve(sock, outbox)
    except (BrokenPipeError, ConnectionResetError):  # the parent is gone
        pass


if __name__ == "__main__":
    main(sys.argv)
