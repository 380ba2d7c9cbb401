"""The worker process of ``LocalWorkers`` (``python -m raypipe.pipeline._local_worker READ_FD WRITE_FD``).

It reads requests from one pipe and answers on the other, one at a time, in order (frames: an 8-byte
length, then a pickle; both ends are raypipe's own code in processes of one user). It imports the
stage and nothing else of raypipe's: no Ray, no torch.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import sys
import traceback
from typing import BinaryIO

_HEAD = struct.Struct("<Q")


def send(stream: BinaryIO, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEAD.pack(len(data)))
    stream.write(data)
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


def run_chunk(rows: dict, spec, path: str) -> dict:
    """Augment ``rows`` with their images written straight into a new shared file at ``path``, which
    the parent maps and unlinks; the returned block carries ``("shared", path, shape)`` for them."""
    import numpy as np

    from raypipe.stages.augment import augment_block

    shape = (len(rows["sample_id"]), *spec.image_shape)
    size = int(np.prod(shape))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.ftruncate(fd, size)
            mapped = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        images = np.frombuffer(mapped, dtype=np.uint8).reshape(shape)
        block = augment_block(rows, spec, out=images)
        block["image"] = ("shared", path, shape)
        del images
        mapped.close()
        return block
    except BaseException:
        _remove(path)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (the parent raises it with its own type), else a RuntimeError
    that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception type may refuse pickling
        return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


def serve(inbox: BinaryIO, outbox: BinaryIO) -> None:
    from raypipe.stages.augment import stage_for

    send(outbox, ("ready", None, os.getpid()))
    while (message := receive(inbox)) is not None:
        kind, task_id, payload = message
        try:
            if kind == "setup":
                stage_for(payload)
                reply = None
            else:
                reply = run_chunk(*payload)
        except Exception as exc:  # the task's failure, reported to the parent with its traceback
            send(outbox, ("error", task_id, (_portable(exc), traceback.format_exc())))
            continue
        try:
            send(outbox, ("done", task_id, reply))
        except BrokenPipeError:  # the parent is gone: nobody will map the file
            if kind == "chunk":
                _remove(reply["image"][1])
            return


def main(argv: list[str]) -> None:
    inbox = os.fdopen(int(argv[1]), "rb")
    outbox = os.fdopen(int(argv[2]), "wb")
    try:
        serve(inbox, outbox)
    except BrokenPipeError:
        pass


if __name__ == "__main__":
    main(sys.argv)
