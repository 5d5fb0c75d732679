"""What the commands the CLI prints to continue a run must repeat (set from the options)."""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

REPLY_PLACEHOLDER = "<your reply>"
"""What a printed ``respond`` command holds where the person's words go; ``respond`` refuses it
as an answer (pasted as printed, a placeholder was stored for good)."""


DATA_PLACEHOLDER = "<JSON>"
"""What a printed ``respond --data`` command holds where the answer goes (its form is said just
above it: ``answer as JSON: ...``); ``respond`` says so rather than "malformed JSON"."""


class Hints:
    """`` --db PATH`` when the command was given a database, so that a printed
    ``workflow-engine resume RUN`` continues the same run (else nothing)."""

    db = ""
    path: Path | None = None
    """The database the command uses, once ``database`` has found it."""

    @classmethod
    def given(cls, db: Path | None, named_by: str = "--db") -> None:
        """Remember ``db`` (named by ``named_by``: ``--db`` or the environment variable).
        :class:`DirectoryGone` when it is relative to a current directory that was deleted."""
        # absolute: a command printed to continue "from another terminal" runs from any
        # directory (a relative path was not found from another one, tester 76)
        cls.db = f" --db {shell_quoted(str(_absolute(db, named_by)))}" if db is not None else ""

    @classmethod
    def database(cls, given: Path | None) -> Path:
        """The file a command uses, remembering the ``--db`` its printed commands repeat:
        ``given`` (``--db``; a leading ``~`` expanded, as no shell expands ``--db=~/x.db``),
        else the default one. :class:`DirectoryGone`, or ``UsageError`` when there is no
        home directory to find the default (or ``~``) in."""
        from workflow_engine.storage._location import default_db_path, expand_home

        if given is not None:
            path = Path(expand_home(str(given)))
            cls.given(path)
        elif os.environ.get("WORKFLOW_ENGINE_DB"):
            # named too: a printed command pasted in a terminal without the variable (or
            # elsewhere, for a relative path) read another database (tester 77)
            path = default_db_path()
            cls.given(path, "WORKFLOW_ENGINE_DB")
        else:
            path = default_db_path()
            cls.defaulted(path)
        from ._output import name_in_errors

        cls.path = path
        name_in_errors(str(path))
        with contextlib.suppress(OSError):  # (a relative path in a deleted directory)
            name_in_errors(str(path.absolute()))  # (as the store may name it)
        return path

    @classmethod
    def defaulted(cls, db: Path) -> None:
        """No database was given: ``db`` is the default one, relative only when ``$HOME`` is.
        :class:`DirectoryGone` (naming ``HOME``) when the current directory was deleted."""
        cls.db = ""
        if not db.is_absolute():  # (a relative $HOME: named, as elsewhere it is another file)
            _absolute(Path(os.environ.get("HOME", "")), "HOME")
            cls.given(db, "HOME")


class DirectoryGone(Exception):
    """A relative database path, in a current directory that no longer exists: there is no
    file it names (the message says which path and where it came from)."""


def _absolute(db: Path, named_by: str) -> Path:
    try:
        return Path(db).absolute()
    except FileNotFoundError:  # (os.getcwd: the directory was deleted under the shell)
        raise DirectoryGone(
            f"{named_by}{' ' if named_by.startswith('-') else '='}{shell_quoted(str(db))} is "
            "relative to the current directory, which no longer exists (deleted?): cd to a "
            "directory that exists, or give an absolute path"
        ) from None


def shell_quoted(text: str) -> str:
    """``text`` as one shell word that survives being printed: ``shlex.quote``, or, for text
    with characters that do not print (a tab, a newline, an escape, a line separator), bash's
    ``$'...'`` with them escaped -- printed raw, a tab became spaces and a newline split the
    command (tester 77)."""
    if text.isprintable():
        return shlex.quote(text)
    escaped = {"\\": "\\\\", "'": "\\'", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
    return "$'" + "".join(escaped.get(c) or _escape_unprintable(c) for c in text) + "'"


def _escape_unprintable(c: str) -> str:
    """``c`` as ``$'...'`` writes it: as its UTF-8 bytes (``\\u202e`` is read as text outside
    a UTF-8 locale, ``LC_ALL=C``: the pasted id named no run -- outside tester 195)."""
    if c.isprintable():
        return c
    return "".join(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogateescape"))


def resume_command(run_id: str) -> str:
    """The command that continues run ``run_id``, to paste: the id one shell word (a web client
    picks an AG-UI thread's id, which is in its run's: printed bare, a ``$(...)`` in it ran
    when the line was pasted -- outside tester 191), after ``--`` if it begins with a dash
    (else it reads as an option)."""
    return _command("resume", run_id)


def respond_command(request_id: str, flags: str) -> str:
    """The command that answers request ``request_id`` with ``flags``, to paste (as
    :func:`resume_command`)."""
    return _command("respond", request_id, flags)


def _command(name: str, target: str, flags: str = "") -> str:
    word = shell_quoted(target)
    if target.startswith("-"):
        return f"workflow-engine {name}{Hints.db} {flags + ' ' if flags else ''}-- {word}"
    return f"workflow-engine {name} {word} {flags + ' ' if flags else ''}".rstrip() + Hints.db
