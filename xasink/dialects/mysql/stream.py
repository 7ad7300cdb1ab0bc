"""LOAD DATA LOCAL fed through a pipe: the server loads rows while the next ones are encoded.

pymysql answers the server's request for a LOCAL file by opening the path the statement names and sending
it to its end.  Naming a pipe's read end (``/dev/fd/N``) lets a second thread run the statement while this
thread writes the encoded rows into the pipe: encoding, sending and the server's parsing overlap, no file
is written, and one statement carries many batches (fewer round trips).  Before, each 10,000 rows were
written to a temporary file and loaded while the worker waited: a branch's load took the server's LOAD
time plus the encoding.  Where ``/dev/fd`` is missing the rows go to a private temporary file loaded when
the statement ends.

The connection belongs to the statement's thread until :meth:`finish` or :meth:`abandon` has joined it;
only then may the caller use its cursor again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable

PIPE_BYTES = 1 << 20  # the pipe's buffer (Linux may grant less): a batch or two ahead of the sender

Run = Callable[[str], tuple[int, int]]  # runs the LOAD DATA naming the path: (rows loaded, warning count)


class StreamedLoad:
    """One LOAD DATA LOCAL statement whose input is written while the server reads it."""

    def __init__(self, run: Run) -> None:
        self.rows = 0  # rows written so far (the caller counts them)
        self.bytes = 0
        self._result: tuple[int, int] | None = None
        self._error: BaseException | None = None
        self._read, self._write = os.pipe()
        with contextlib.suppress(AttributeError, OSError):  # Linux only; the default 64 KiB works too
            import fcntl

            fcntl.fcntl(self._write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[attr-defined,unused-ignore]
        self._thread = threading.Thread(target=self._serve, args=(run,), name="xasink-load-data", daemon=True)
        self._thread.start()

    def _serve(self, run: Run) -> None:
        try:
            self._result = run(f"/dev/fd/{self._read}")
        except BaseException as exc:  # noqa: BLE001 - handed to the writing thread by finish()
            self._error = exc
        finally:
            os.close(self._read)  # the last read end: a writer still writing gets EPIPE instead of waiting

    def write(self, data: memoryview | bytes, rows: int) -> None:
        """Write encoded rows; a statement that failed meanwhile raises its error here."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._write, view) :]
        except BrokenPipeError:
            self.finish()  # raises the statement's error
            raise  # the statement ended without an error before reading all: cannot happen, but never hide it
        self.rows += rows
        self.bytes += len(data)

    def finish(self) -> tuple[int, int]:
        """End the input, wait for the statement: (rows loaded, warning count), or its error raised."""
        self._close_write()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def abandon(self) -> None:
        """End the input and wait for the statement, whatever it did (the caller rolls the branch back)."""
        self._close_write()
        self._thread.join()

    def _close_write(self) -> None:
        if self._write >= 0:
            os.close(self._write)
            self._write = -1


class FileLoad:
    """The same interface without ``/dev/fd``: a private temporary file, loaded when the statement ends."""

    def __init__(self, run: Run) -> None:
        self.rows = 0
        self.bytes = 0
        self._run = run
        fd, self._path = tempfile.mkstemp(prefix="xasink-", suffix=".tsv")
        self._file = os.fdopen(fd, "wb")

    def write(self, data: memoryview | bytes, rows: int) -> None:
        self._file.write(data)
        self.rows += rows
        self.bytes += len(data)

    def finish(self) -> tuple[int, int]:
        try:
            self._file.close()
            return self._run(self._path)
        finally:
            self.abandon()

    def abandon(self) -> None:
        self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self._path)


def open_load(run: Run) -> StreamedLoad | FileLoad:
    """A load streamed through a pipe where ``/dev/fd`` names open descriptors (Linux, macOS), else a file."""
    return StreamedLoad(run) if os.path.isdir("/dev/fd") else FileLoad(run)
