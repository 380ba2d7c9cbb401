"""A pyarrow filesystem over local disk that adds latency and fails on demand, to test remote reads.

``pafs.PyFileSystem(WrappedFS(delay_s=0.05, fail_first=2))`` is a non-local filesystem to raypipe, so
its reads take the remote path (threads, retries) while the bytes come from local files.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pyarrow.fs as pafs


class WrappedFS(pafs.FileSystemHandler):
    """``gather=N``: each open first waits (up to ``gather_s``) until N opens are under way at once, so a
    test of how many requests a reader keeps in flight does not depend on how fast its threads start on
    a loaded machine: a reader that sends fewer than N at once waits out ``gather_s`` and shows its
    count in ``max_active``."""

    def __init__(
        self,
        delay_s: float = 0.0,
        fail_first: int = 0,
        error: BaseException | None = None,
        gather: int = 0,
        gather_s: float = 10.0,
    ):
        self.fs = pafs.LocalFileSystem()
        self.delay_s, self.fail_first = delay_s, fail_first
        self.gather, self.gather_s = gather, gather_s
        self.error = error if error is not None else ConnectionResetError("Connection reset by peer")
        self.attempts: Counter[str] = Counter()  # opens per path
        self.opened: list[str] = []  # every open, in order
        self.active = self.max_active = 0
        self._lock = threading.Condition()

    def _open(self, path: str) -> None:
        with self._lock:
            self.attempts[path] += 1
            self.opened.append(path)
            n = self.attempts[path]
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: self.max_active >= self.gather, timeout=self.gather_s):
                self.gather = 0  # never came: the later opens do not wait again
        try:
            time.sleep(self.delay_s)
            if n <= self.fail_first:
                raise self.error
        finally:
            with self._lock:
                self.active -= 1

    def open_input_stream(self, path):
        self._open(path)
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        self._open(path)
        return self.fs.open_input_file(path)

    def get_type_name(self):
        return "wrapped"

    def normalize_path(self, path):
        return path

    def equals(self, other):
        return self is other

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path)


def wrapped(**kwargs) -> tuple[pafs.FileSystem, WrappedFS]:
    handler = WrappedFS(**kwargs)
    return pafs.PyFileSystem(handler), handler
