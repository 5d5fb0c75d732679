"""Where the SQLite store keeps its runs when it is not told, and how it syncs them: apart from
the store itself, so that a command that only needs these loads nothing else."""

from __future__ import annotations

import os
from pathlib import Path


def default_db_path() -> Path:
    """``$WORKFLOW_ENGINE_DB``, else ``$XDG_DATA_HOME/workflow-engine/runs.db`` (a relative
    ``XDG_DATA_HOME`` is ignored, as the XDG spec says: ``~/.local/share`` then)."""
    env = os.environ.get("WORKFLOW_ENGINE_DB")
    if env:
        return Path(expand_home(env))  # (a shell leaves "~" in VAR='~/x.db' as it is)
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg and os.path.isabs(xdg):
        base = xdg
    else:
        instead = "give --db PATH, or set WORKFLOW_ENGINE_DB"
        home = home_directory("the default database is", instead)
        base = os.path.join(home, ".local", "share")
    return Path(base) / "workflow-engine" / "runs.db"


def expand_home(path: str) -> str:
    """``path`` with a leading ``~`` (or ``~/``) as :func:`home_directory` says, and ``~user``
    as the password database does (left as written for no such user, as a shell leaves it).
    Not ``os.path.expanduser``, which takes an empty ``$HOME`` for ``/`` and a ``$HOME`` of
    ``~`` for a directory named so in the current one (tester 100)."""
    if path == "~" or path.startswith("~/"):
        home = home_directory(f"{path!r} is", "give a path without ~")
        return os.path.join(home, path[2:]) if path != "~" else home  # (HOME=/: not //x.db)
    if not path.startswith("~"):
        return path
    from workflow_engine._errors import UsageError

    name, _, rest = path[1:].partition("/")
    try:
        import pwd

        home = pwd.getpwnam(name).pw_dir
    except (ImportError, KeyError):  # ``~name`` of no user: a shell leaves it, and the store
        # then made a directory named so in the current one (outside tester 101)
        raise UsageError(
            f"cannot tell where {path!r} is: there is no user {name!r}; give a path without ~"
        ) from None
    if not os.path.isdir(home):  # (made by the store, as a missing $HOME was: tester 102)
        raise UsageError(
            f"cannot tell where {path!r} is: user {name!r} has the home {home!r}, which is "
            "not a directory; give a path without ~"
        )
    return os.path.join(home, rest) if rest else home


def home_directory(what: str, instead: str) -> str:
    """``$HOME``; when it is unset or empty, the user's entry in the password database (an
    empty one read as ``/`` put runs at the file system's root, tester 99). ``UsageError``
    when there is none, or when it begins with ``~`` (``Path.home()`` raised a bare
    ``RuntimeError`` for that), saying where ``what`` is cannot be told and what to do
    ``instead``."""
    home = os.environ.get("HOME") or ""
    said = f"$HOME is {home!r}"
    if not home:
        said = "$HOME is not set" if "HOME" not in os.environ else "$HOME is empty"
        try:
            import pwd

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (ImportError, KeyError):
            said += f", and user {os.getuid()} has no entry in the password database"
    if not home or home.startswith("~"):
        from workflow_engine._errors import UsageError

        raise UsageError(f"cannot tell where {what}: {said}; {instead} (or set HOME)")
    if not os.path.isdir(home) and not _in_a_deleted_directory(home):
        # (the store made it, parents and all: outside testers 101, 102)
        from workflow_engine._errors import UsageError

        which = said if said.startswith("$HOME is '") else f"{said}, and its home is {home!r}"
        raise UsageError(
            f"cannot tell where {what}: {which}, which is not a directory (the store makes its "
            f"own folders, not a home); {instead} (or set HOME)"
        )
    return home


def _in_a_deleted_directory(path: str) -> bool:
    """``path`` is relative, and the current directory was deleted: there is no telling what
    it names (the command line says so, naming where the path came from)."""
    if os.path.isabs(path):
        return False
    try:
        os.getcwd()
    except OSError:
        return True
    return False


def synchronous_mode(given: str | None = None) -> str | None:
    """The store's ``synchronous`` setting: ``given``, else ``$WORKFLOW_ENGINE_SQLITE_SYNC``,
    else ``NORMAL`` (upper-cased); None when it is not one the store takes (NORMAL, FULL)."""
    mode = (given or os.environ.get("WORKFLOW_ENGINE_SQLITE_SYNC") or "NORMAL").upper()
    return mode if mode in ("NORMAL", "FULL") else None
