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

from ._exits import EXIT_BROKEN_PIPE, EXIT_DONE, EXIT_FAILED
from ._term import visible

if TYPE_CHECKING:
    from rich.console import Console


_ERR_CONSOLE: Any = None


def err_console() -> Console:
    """A rich console on stderr that, when stderr's reader went away, stops writing there and
    lets the command end with 141 (``stderr_gone``). rich's own reaction pointed stdout at
    /dev/null and exited 1 (tester 95)."""
    global _ERR_CONSOLE
    if _ERR_CONSOLE is None:
        from rich.console import Console

        class ErrConsole(Console):
            def on_broken_pipe(self) -> None:
                self.quiet = True
                stderr_gone()

        _ERR_CONSOLE = ErrConsole
    console: Console = _ERR_CONSOLE(stderr=True, soft_wrap=True)
    return console


class _Gone:
    stderr = False
    """Set when a write to stderr found its reader gone: the command ends with 141."""
    stdout_failed = False
    """Set when stdout could not be written (a full disk): see ``output_failed``."""


def stdout_failed() -> bool:
    """Whether the command's output could not be written (a full disk, an I/O error)."""
    return _Gone.stdout_failed


def stderr_gone() -> None:
    """stderr's reader went away: what is still to say there goes nowhere, quietly (as for
    stdout), and the command's exit code becomes 141 (``flush_output``)."""
    _Gone.stderr = True
    if sys.stderr is not None:
        discard_output(sys.stderr)


def escape(text: str) -> str:
    """``text`` safe inside rich markup (rich loads only when an error is printed)."""
    from rich.markup import escape

    return escape(text)


_NAMED_IN_ERRORS: set[str] = set()
"""What the user named (the database's path) that holds a line break or another control
character: written escaped wherever a message quotes it, before the message is cut to its first
line (a newline in a path cut the line there: outside tester 102)."""


def name_in_errors(text: str) -> None:
    """Have :func:`print_error` escape ``text`` where a message quotes it, when it needs to."""
    if not text.isprintable():
        _NAMED_IN_ERRORS.add(text)


def print_error(message: str) -> None:
    """The one line on stderr every failure ends with."""
    for named in _NAMED_IN_ERRORS:
        message = message.replace(named, visible(named))
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
    """Writes to a descriptor that may be non-blocking (``O_NONBLOCK`` on a pipe shared with a
    parent, which may set it at any time): a write the full pipe would refuse waits until the
    reader makes room, as on a blocking pipe. Python's own buffered stream drops such output
    without a word (the command printed nothing and exited 0, tester 94); the flag itself is
    left alone (it is the other processes' too)."""

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
    """The same stream over :class:`_PatientWrites` (whether its descriptor is non-blocking
    now or not: a process sharing it may set the flag later, tester 95); ``stream`` itself
    when it has no descriptor (a test's capture)."""
    buffer = getattr(stream, "buffer", None)
    if isinstance(buffer, _PatientWrites) or isinstance(
        getattr(buffer, "raw", None), _PatientWrites
    ):
        return stream  # (prepared already)
    try:
        fd = stream.fileno()
        os.fstat(fd)
    except (OSError, ValueError, AttributeError):
        return stream
    raw = _PatientWrites(fd)
    # buffered as the stream was: stderr writes straight through (no buffer to flush, and a
    # signal handler that logs while a write is under way meets no buffer's reentrancy check)
    unbuffered = isinstance(buffer, io.RawIOBase)
    return io.TextIOWrapper(
        raw if unbuffered else io.BufferedWriter(raw),  # type: ignore[arg-type]
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


def closed_output_refused() -> bool:
    """For a command that changes a run, before it does: with stdout closed (``>&-``) it would
    act, then fail to say so and exit 1 -- a script would retry what was done (outside tester
    106). Said in one line (True: refused, nothing done), as ``resume`` does."""
    if not isinstance(sys.stdout, ClosedOutput):
        return False
    print_error("cannot write the output: standard output is closed; nothing was done")
    return True


def discard_output(*streams: Any) -> None:
    """Point stdout (or ``streams``) at /dev/null, so that what is still buffered, and what is
    written from now on, goes nowhere quietly (Python flushes stdout once more at exit)."""
    for stream in streams or (sys.stdout,):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


_DONE: list[str] = []
"""What this command changed, as ``acted`` said it."""


def acted(what: str) -> None:
    """Note that the command changed something (``what``: "the answer to request X is
    stored"): if its output cannot be written after that (a full disk), the error says it was
    done all the same, and the command's exit code stands. Exit 1 tells a script that nothing
    was done and it may retry; after a stored answer or a cancel, it did (outside tester
    214)."""
    _DONE.append(what)


def output_failed(exc: OSError, code: int | None = None) -> int | None:
    """The exit code when ``exc`` is stdout failing (None: some other error). A reader that
    went away (``| head``) is no error: stop quietly. A full disk is one line, exit 1 --
    unless the command changed something (``acted``): then the line says so, and the exit
    code is ``code``, the command's own (0 if it did not get that far)."""
    if isinstance(exc, BrokenPipeError):
        discard_output()
        return EXIT_BROKEN_PIPE
    if exc.errno in _WRITE_ERRNOS:
        discard_output()
        _Gone.stdout_failed = True
        said = f"cannot write the output: {exc.strerror or exc}"
        if _DONE:
            said = f"{said}; {'; '.join(_DONE)} all the same"
        # (stderr on the same full disk, ``>log 2>&1``: nowhere left to say it, and the exit
        # code must still be the action's -- it was 1 after the answer was stored, tester 217)
        with contextlib.suppress(OSError):
            print_error(said)
            sys.stderr.flush()
        if not _DONE:
            return EXIT_FAILED
        return EXIT_DONE if code is None else code
    return None


def flush_output(code: Any) -> Any:
    """Flush stdout and stderr before exiting with ``code`` (Python's own flush at exit would
    report a failure as a traceback-like message and exit 120); 141 when either one's reader
    went away."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        failed = output_failed(exc, code if isinstance(code, int) else None)
        if failed is None:
            raise
        return failed
    if sys.stderr is not None:
        try:
            sys.stderr.flush()
        except BrokenPipeError:
            stderr_gone()
        except OSError:
            pass  # (nowhere left to say so)
    return EXIT_BROKEN_PIPE if _Gone.stderr else code
