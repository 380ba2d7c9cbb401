"""LocalWorkers: a rank's chunks in worker processes of this machine, for a run without Ray (and inside
node workers). The same stage on the same chunks in the same order as on Ray, so the same batches:

- each worker is a fresh ``python -m raypipe.workers.worker_process`` (not a fork: the trainer has
  threads and maybe CUDA; not spawn, which imports the trainer's script again), in its own session,
  with a Unix socket to this process; it ends when its socket does;
- it writes a chunk's images straight into a slab of shared memory passed with the chunk as a
  descriptor (``raypipe.workers.slabs``), reused from chunk to chunk; the slab goes back to the pool
  with the array's last view;
- a worker that dies is replaced and its chunk sent again, up to ``MAX_RETRIES`` times (same output:
  per-sample seeds); an exception in the stage fails the chunk with its own type.

One pool serves every stream of the process (``shared``); it ends with the process.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence

import numpy as np

from raypipe.workers.errors import LocalWorkerDiedError, WorkerTraceback
from raypipe.workers.host import local_cpus, shared_memory_dir
from raypipe.workers.slabs import SlabPool
from raypipe.workers.worker_process import receive, send_with_fds

__all__ = ["LocalWorkers", "WorkerTraceback", "LocalWorkerDiedError", "shared_memory_dir", "local_cpus", "MAX_RETRIES"]

log = logging.getLogger(__name__)

MAX_RETRIES = 3  # as the Ray tasks' max_retries
# Workers that may die before they answer at all (raypipe not importable there, a broken environment)
# before the pool gives up with an error, rather than starting one after another.
MAX_FAILED_STARTS = 3


class _Task:
    __slots__ = ("id", "kind", "payload", "tries", "done", "value", "error", "cancelled", "slab")

    def __init__(self, task_id: int, kind: str, payload):
        self.id, self.kind, self.payload = task_id, kind, payload
        self.tries = 0
        self.done = threading.Event()
        self.value = self.error = None
        self.cancelled = False
        self.slab = None  # where a chunk's images go: taken when it is sent, kept for a retry


class _Worker:
    """A worker's connection: ``proc`` is the process where this machine started it (None for one on
    another node, ``inline``: its images come on the connection, not in shared memory)."""

    def __init__(self, proc: subprocess.Popen | None, sock: socket.socket, *, inline: bool = False):
        self.proc, self.sock, self.outbox = proc, sock, sock.makefile("rb")
        self.inline = inline
        self.sent: collections.deque[_Task] = collections.deque()  # answered in this order
        self.pinned: collections.deque[_Task] = collections.deque()  # for this worker only (set-up)
        self.ready = False
        self.alive = True


class LocalWorkers:
    """A pool of ``count`` worker processes, started by ``release_start()`` (see the module doc); a
    ``Workers``. A pool of node workers adopts other nodes' workers into it (``adopt``)."""

    _shared: LocalWorkers | None = None
    _shared_lock = threading.Lock()
    queues_while_starting = True  # a chunk submitted during the start waits for the first worker up

    def __init__(self, count: int, directory: str, *, prefetch_chunks: int = 0, processes: int | None = None):
        self.count = count  # workers that take chunks: this machine's processes and adopted ones
        self.processes = count if processes is None else processes  # of them, started here
        self.directory = directory
        self.prefetch_chunks = prefetch_chunks
        self.slabs = SlabPool(directory, keep=self._slabs_kept(count))
        self._lock = threading.Lock()
        # A task's slab is taken from it by one thread only (its answer, its worker's loss, shutdown):
        # given back twice, one slab would take two chunks at once.
        self._slab_lock = threading.Lock()
        self._queue: collections.deque[_Task] = collections.deque()
        self._workers: list[_Worker] = []
        self._ids = itertools.count()
        self._started = False
        self._closed = False
        self._failed_starts = 0
        self._start_error: Exception | None = None
        self.restarts = 0  # workers replaced after they died
        self.remote_workers = 0  # connections adopted from other nodes' workers
        self._leaving = 0  # other nodes' workers ended on purpose (``retire_remote``), yet to go
        self.received_chunks = 0  # chunks whose images came on the connection (another node's workers)

    def _slabs_kept(self, count: int) -> int:
        """Free slabs kept: one for each worker's chunk, each finished chunk the stream holds ahead
        (``prefetch_chunks``) and the one its consumer reads. Fewer, and a feeder (which also holds the
        chunk whose batch the trainer maps) closed a slab and made a new one about once an epoch, whose
        pages cost about three times a reused slab's (``python bench/profiles.py slab-cost``); these
        are no more than the first epoch makes."""
        return count + self.prefetch_chunks + 1

    @classmethod
    def shared(cls, count: int, directory: str, *, prefetch_chunks: int = 0) -> LocalWorkers:
        """This process's pool, made (not started) on first use, running chunks on ``count`` workers:
        the latest stream's count (a pipeline over a local folder after one over an object store runs
        one worker per core again, not two)."""
        with cls._shared_lock:
            pool = cls._shared
            if pool is None or pool._closed:
                pool = cls._shared = cls(count, directory, prefetch_chunks=prefetch_chunks)
                atexit.register(pool.shutdown)
            elif count != pool.count or prefetch_chunks != pool.prefetch_chunks:
                pool.prefetch_chunks = prefetch_chunks
                pool.resize(count)
            return pool

    @classmethod
    def shutdown_shared(cls) -> None:
        with cls._shared_lock:
            pool, cls._shared = cls._shared, None
        if pool is not None:
            pool.shutdown()

    # -- what the stream asks -----------------------------------------------------------------------

    def starting(self) -> bool:
        """Whether the workers cannot take chunks yet: not started, or not all answered. Raises when
        they cannot start."""
        if self._start_error is not None:
            raise self._start_error
        if not self._started:
            return True
        with self._lock:
            return not all(w.ready for w in self._workers if w.alive)

    def release_start(self) -> None:
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self._start_workers()

    def set_up(self, spec, count: int) -> list[_Task]:
        """A set-up for each worker that takes chunks, its stage made before its first chunk (``count``,
        how many Ray set-up tasks a stream sends, does not apply: these go to those workers); done when
        each answered."""
        with self._lock:
            tasks = []
            for worker in self._alive()[: self.count]:
                task = _Task(next(self._ids), "setup", spec)
                worker.pinned.append(task)
                tasks.append(task)
            self._dispatch()
        return tasks

    def size_tasks(self, cpus: float) -> None:
        """Nothing to ask for: local workers are processes, and their count is the budget's share."""

    def submit(self, rows: dict[str, np.ndarray], spec) -> _Task:
        with self._lock:
            if self._closed:
                raise RuntimeError("raypipe's local workers were shut down")
            if self._start_error is not None:
                raise self._start_error
            if not self._started:  # a stream that did not make chunks itself first
                self._started = True
                self._start_workers()
            task = _Task(next(self._ids), "chunk", (rows, spec))
            self._queue.append(task)
            self._dispatch()
        return task

    @staticmethod
    def all_done(tasks: Sequence[_Task]) -> bool:
        return all(t.done.is_set() for t in tasks)

    @staticmethod
    def wait(task: _Task, timeout: float) -> bool:
        return task.done.wait(timeout)

    @staticmethod
    def get(task: _Task):
        task.done.wait()
        if task.error is not None:
            raise task.error
        return task.value

    @staticmethod
    def shared_ref(task: _Task) -> None:
        return None  # a slab: handed over as a descriptor, not read by reference

    def cancel(self, task: _Task) -> None:
        with self._lock:
            task.cancelled = True
            try:
                self._queue.remove(task)
            except ValueError:
                return  # sent: its result is dropped when it comes
            self._give_back(task)  # a chunk sent again after its worker died holds its slab

    def shutdown(self) -> None:
        """End the workers (closing their sockets ends them; a stuck one is killed) and close the slabs
        (those of chunks still viewed as each one's last view goes)."""
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, []
            for task in self._queue:
                task.cancelled = True
                self._give_back(task)
                self._fail_shut_down(task)
            self._queue.clear()
        for w in workers:
            try:
                w.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            for f in (w.outbox, w.sock):
                try:
                    f.close()
                except OSError:
                    pass
        for w in workers:
            if w.proc is not None:
                try:
                    w.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
            for task in w.sent:
                self._give_back(task)
                self._fail_shut_down(task)
        self.slabs.close()

    # -- what a pool of node workers asks -------------------------------------------------------------

    def resize(self, count: int, *, processes: int | None = None) -> None:
        """Chunks go to ``count`` workers from now on, ``processes`` of them (default ``count``) started
        here: more are started where there are fewer; those beyond stay, idle, for a later stream that
        wants them again."""
        with self._lock:
            self.count = count
            self.processes = count if processes is None else processes
            self.slabs.keep = self._slabs_kept(count)
            if self._started:
                while sum(w.proc is not None for w in self._alive()) < self.processes:
                    self._workers.append(self._spawn())
            self._dispatch()

    def adopt(self, sock: socket.socket) -> bool:
        """Take a connection from a worker on another node (one that proved it knows the pool's secret)
        as a worker whose images come on the connection; False where the pool is shut down."""
        with self._lock:
            if self._closed:
                return False
            worker = _Worker(None, sock, inline=True)
            self._workers.append(worker)
            self.remote_workers += 1
            threading.Thread(target=self._read, args=(worker,), name="raypipe-node-worker", daemon=True).start()
            self._dispatch()
        return True

    def retire_remote(self, count: int = 1) -> None:
        """``count`` workers on other nodes are about to be ended on purpose (a narrower width): their
        connections' ends are departures, not losses (their chunks go to the others all the same)."""
        with self._lock:
            self._leaving += count

    def ready_count(self, *, remote_only: bool = False) -> int:
        """Workers alive that answered (``remote_only``: of those on other nodes)."""
        with self._lock:
            return sum(w.ready and (w.inline or not remote_only) for w in self._alive())

    # -- inside ---------------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        """Start the pool's processes (called holding the lock)."""
        self._workers.extend(self._spawn() for _ in range(self.processes))

    def _alive(self) -> list[_Worker]:
        return [w for w in self._workers if w.alive]

    def _spawn(self) -> _Worker:
        """A new worker process and the thread that reads its answers (called holding the lock)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        # the worker imports raypipe (and the user's own modules a spec may name) as this process does
        env["PYTHONPATH"] = os.pathsep.join([p or os.getcwd() for p in sys.path])
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "raypipe.workers.worker_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        worker = _Worker(proc, ours)
        threading.Thread(target=self._read, args=(worker,), name=f"raypipe-local-{proc.pid}", daemon=True).start()
        return worker

    def _dispatch(self) -> None:
        """Send the next task to each idle worker of the first ``count`` (called holding the lock): one
        at a time per worker, so a chunk waits here, not behind a slow chunk of some worker. Workers
        beyond ``count`` get only the set-ups pinned to them."""
        for position, worker in enumerate(self._alive()):
            if worker.sent:
                continue
            if worker.pinned:
                task = worker.pinned.popleft()
            elif self._queue and position < self.count:
                task = self._queue.popleft()
            else:
                continue
            fds = []
            if task.kind == "chunk":  # a slab for it even where it comes inline: received into it
                if task.slab is None:
                    rows, spec = task.payload
                    try:
                        task.slab = self.slabs.take(len(rows["sample_id"]) * int(np.prod(spec.image_shape)))
                    except OSError as e:  # no memory (or descriptors) for it: the chunk fails, saying so
                        task.error = e
                        task.done.set()
                        continue
                fds = [] if worker.inline else [task.slab.fd]
            worker.sent.append(task)
            try:
                send_with_fds(worker.sock, (task.kind, task.id, task.payload), fds)
            except (OSError, ValueError):
                pass  # the worker is gone: its reader sees the end and sends the task again

    def _read(self, worker: _Worker) -> None:
        while True:
            try:
                message = receive(worker.outbox)
            except (OSError, ValueError):  # closed by shutdown
                message = None
            if message is None:
                self._lost(worker)
                return
            kind, task_id, payload = message
            if kind == "done" and worker.inline and isinstance(payload, dict) and payload["image"][0] == "inline":
                with self._lock:
                    task = worker.sent[0] if worker.sent else None
                if task is None or not self._receive_images(worker, task, payload["image"][1]):
                    self._lost(worker)
                    return
                self.received_chunks += 1
            with self._lock:
                if kind == "ready":
                    worker.ready = True
                    continue
                task = worker.sent.popleft()
                assert task.id == task_id, (task.id, task_id)  # a worker answers in order
                self._dispatch()
            self._finish(task, kind, payload)
            # Not held here while the next answer is awaited: the chunk's slab goes back as soon as its
            # consumer lets go of its batches, in time for a chunk sent to a worker meanwhile.
            del task, payload, message

    def _finish(self, task: _Task, kind: str, payload) -> None:
        if kind == "error":
            exc, text = payload
            exc.__cause__ = WorkerTraceback(text)
            task.error = exc
            self._give_back(task)
        elif task.kind == "chunk":
            block = payload
            slab = self._take_slab(task)
            if slab is None:  # shutdown took it back meanwhile
                self._fail_shut_down(task)
            elif task.cancelled:
                self.slabs.give_back(slab)
            else:
                try:
                    block["image"] = self.slabs.view(slab, block["image"][1])
                    task.value = block
                except OSError as e:  # the mapping failed (no memory): the chunk fails, saying so
                    self.slabs.give_back(slab)
                    task.error = e
        task.done.set()

    @staticmethod
    def _receive_images(worker: _Worker, task: _Task, shape: tuple[int, ...]) -> bool:
        """Read a chunk's images that follow its answer into the chunk's slab (this reader thread is the
        only one that takes a sent task's slab before the answer is finished), or past them for a chunk
        no longer wanted; False when the connection ended first."""
        size = int(np.prod(shape))
        slab = None if task.cancelled else task.slab
        try:
            if slab is None or size == 0:
                scratch = memoryview(bytearray(min(size, 1 << 20) or 1))
                left = size
                while left:
                    got = worker.outbox.readinto(scratch[: min(left, len(scratch))])
                    if not got:
                        return False
                    left -= got
                return True
            with slab.writable()[:size] as view:
                got = 0
                while got < size:
                    n = worker.outbox.readinto(view[got:])
                    if not n:
                        return False
                    got += n
            return True
        except (OSError, ValueError):  # closed by shutdown, or the peer vanished
            return False

    @staticmethod
    def _fail_shut_down(task: _Task) -> None:
        """A task shutdown ended before its answer: whoever waits on it is told so, not left waiting."""
        if not task.done.is_set():
            task.error = RuntimeError("raypipe's local workers were shut down")
            task.done.set()

    def _take_slab(self, task: _Task):
        with self._slab_lock:
            slab, task.slab = task.slab, None
        return slab

    def _give_back(self, task: _Task) -> None:
        slab = self._take_slab(task)
        if slab is not None:
            self.slabs.give_back(slab)

    def _replace_local(self, worker: _Worker, code: int | None, failed: list[_Task]) -> None:
        """A new process in place of a local worker that ended, unless they end before they start
        (then the pool fails, with what it holds added to ``failed``; called holding the lock)."""
        self._failed_starts += not worker.ready
        if self._failed_starts >= MAX_FAILED_STARTS:
            self._start_error = LocalWorkerDiedError(
                f"raypipe's local worker processes end before they start ({self._failed_starts} did, the "
                f"last with exit code {code}; their errors are on this process's stderr). Run "
                f"`{sys.executable} -m raypipe.workers.worker_process` to see why, or run on Ray "
                "(ExecutionConfig(backend='ray'))"
            )
            failed += list(self._queue)
            self._queue.clear()
            return
        log.warning("raypipe local worker %d ended (exit code %s); starting another", worker.proc.pid, code)
        self.restarts += 1
        self._workers.append(self._spawn())
        self._dispatch()

    def _lost(self, worker: _Worker) -> None:
        """A worker's socket ended: send what it held again (a new worker in its place), or fail it."""
        with self._lock:
            worker.alive = False
            if self._closed:
                return
            code = None
            if worker.proc is not None:
                try:
                    code = worker.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:  # it closed its pipe but lives on: not ours to keep
                    worker.proc.kill()
                    code = worker.proc.wait()
            failed = []
            for task in reversed(worker.sent):
                task.tries += 1
                if task.kind == "setup" or task.cancelled:
                    self._give_back(task)
                    task.done.set()  # a set-up is not needed for the chunks to run
                elif task.tries > MAX_RETRIES:
                    self._give_back(task)
                    failed.append(task)
                else:
                    self._queue.appendleft(task)  # with its slab: every row is written again
            worker.sent.clear()
            self._workers = [w for w in self._workers if w.alive]
            if worker.proc is None and self._leaving:  # ended on purpose (retire_remote)
                self._leaving -= 1
                log.info("a raypipe worker on another node left (a narrower width); its chunks go to the others")
                self._dispatch()
            elif worker.proc is None:  # another node's: its launcher starts another, which connects
                log.warning("a raypipe worker on another node was lost; its chunks go to the other workers")
                self.restarts += 1
                self._dispatch()
            else:
                self._replace_local(worker, code, failed)
        for task in failed:
            self._give_back(task)
            task.error = self._start_error or LocalWorkerDiedError(
                f"chunk {task.id}: its worker process died on each of {task.tries} tries (last exit code {code}); "
                "out of memory, or killed?"
            )
            task.done.set()
