"""How the command line writes: the one error line on stderr, and stdout that may fail (a
reader that went away, a full disk) ending the command quietly with the right exit code.

Apart from the commands (``_app``), so that a command started without typer (``_quick``) writes
the same way. rich loads only when an error is printed.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from typing import TYPE_CHECKING, Any

from ._exits import EXIT_BROKEN_PIPE, EXIT_FAILED
from ._term import visible

if TYPE_CHECKING:
    from rich.console import Console


def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def escape(text: str) -> str:
    """``text`` safe inside rich markup (rich loads only when an error is printed)."""
    from rich.markup import escape

    return escape(text)


def print_error(message: str) -> None:
    """The one line on stderr every failure ends with."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    err_console().print(f"[red]error:[/] {escape(visible(first))}", highlight=False)


_WRITE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EIO", "EFBIG", "EDQUOT", "EBADF")
    if hasattr(errno, name)
)


class ClosedOutput(io.TextIOBase):
    """``sys.stdout`` for a command started with it closed (``>&-``). Python leaves None there,
    on which printing failed with an AttributeError and a traceback; this fails as writing to a
    closed descriptor does for any program (EBADF), which ``output_failed`` says in one line."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


class _PatientWrites(io.RawIOBase):
    """Writes to a descriptor a parent left non-blocking (``O_NONBLOCK`` on a pipe it shares):
    a write the full pipe would refuse waits until the reader makes room, as on a blocking
    pipe. Python's own buffered stream drops such output without a word (the command printed
    nothing and exited 0, tester 94); the flag itself is left alone (the parent shares it)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        import select

        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                done += os.write(self._fd, view[done:])
            except BlockingIOError:
                select.select([], [self._fd], [])  # (a reader gone: the next write says so)
        return done

    def close(self) -> None:  # the descriptor is the process's, not this stream's
        self.flush()
        super().close()


def _patient(stream: Any) -> Any:
    """``stream``, or where its descriptor is non-blocking the same stream over
    :class:`_PatientWrites`."""
    if isinstance(getattr(getattr(stream, "buffer", None), "raw", None), _PatientWrites):
        return stream  # (prepared already)
    try:
        fd = stream.fileno()
        if os.get_blocking(fd):
            return stream
    except (OSError, ValueError, AttributeError):
        return stream
    return io.TextIOWrapper(
        io.BufferedWriter(_PatientWrites(fd)),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=stream.line_buffering,
        write_through=getattr(stream, "write_through", False),
    )


def prepare_output() -> None:
    """Before a command prints: a ``ClosedOutput`` to fail on for a command started with stdout
    closed (``>&-``), output that waits for a full non-blocking pipe (``_PatientWrites``), and
    never dying on a character the terminal lacks."""
    if sys.stdout is None:
        sys.stdout = ClosedOutput()
    else:
        sys.stdout.flush()
        sys.stdout = _patient(sys.stdout)
    if sys.stderr is not None:
        sys.stderr.flush()
        sys.stderr = _patient(sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def discard_output(*streams: Any) -> None:
    """Point stdout (or ``streams``) at /dev/null, so that what is still buffered, and what is
    written from now on, goes nowhere quietly (Python flushes stdout once more at exit)."""
    for stream in streams or (sys.stdout,):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


def output_failed(exc: OSError) -> int | None:
    """The exit code when ``exc`` is stdout failing (None: some other error). A reader that
    went away (``| head``) is no error: stop quietly. A full disk is one line, exit 1."""
    if isinstance(exc, BrokenPipeError):
        discard_output()
        return EXIT_BROKEN_PIPE
    if exc.errno in _WRITE_ERRNOS:
        discard_output()
        print_error(f"cannot write the output: {exc.strerror or exc}")
        return EXIT_FAILED
    return None


def flush_output(code: Any) -> Any:
    """Flush stdout before exiting with ``code`` (Python's own flush at exit would report a
    failure as a traceback-like message and exit 120)."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        failed = output_failed(exc)
        if failed is None:
            raise
        return failed
    return code
