"""workflow-engine: run the demos, inspect runs, answer requests, resume after restarts.

Exit codes (also in ``--help`` and the README):

    0  done (the run finished, or the command succeeded)
    1  the run failed or was cancelled
    2  bad usage or invalid input (malformed JSON, an answer of the wrong type, an ambiguous id)
    3  paused: the run waits for input (answer with ``respond``, continue with ``resume``)
    4  not found: unknown run, request or workflow
    5  conflict: already answered differently, cancelled, finished, or run by another worker
    6  storage problem: the database is unusable, damaged or locked (or a record is corrupt)
    7  the server cannot listen: the address is in use or not allowed
  141  the reader of the output went away (``| head``): stopped quietly, like other tools

Errors are one line on stderr, with any control character in it (an id, a path) shown escaped.
Arguments that are not UTF-8 text, and JSON that is malformed, too large or too deeply nested,
are refused before anything runs (exit 2). Output that cannot be written (a full disk) is one
error line and exit 1.

Start-up time counts for a command line: this module imports typer and the standard library
only; the engine, storage, agents, rich and the server load inside the commands that use them.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import ipaddress
import os
import re
import string
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ._exits import (
    EXIT_BROKEN_PIPE,
    EXIT_CANNOT_LISTEN,
    EXIT_DONE,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_PAUSED,
    EXIT_QUIT,
    EXIT_STORAGE,
    EXIT_USAGE,
    Exit,
    exit_code_for,
)
from ._hints import (
    DATA_PLACEHOLDER,
    REPLY_PLACEHOLDER,
    DirectoryGone,
    Hints,
    resume_command,
)
from ._ids import AmbiguousIdError, lowered_hex, match
from ._listing import (
    Pending,
    answered_to_apply,
    limited,
    may_be_in_doubt,
    person_status,
    requests_json_output,
    requests_output,
    run_output,
    runs_output,
    status_filter,
)
from ._output import (
    acted,
    closed_output_refused,
    discard_output,
    err_console,
    flush_output,
    output_failed,
    prepare_output,
    print_error,
    stdout_failed,
)
from ._registry import (
    DEMO_ALIASES,
    ModelConfigError,
    ModelFlags,
    model_for_resume,
    model_for_start,
    open_runtime,
    recorded_model,
    register,
    start_run,
    takes_model,
    workflow_factories,
    workflow_names,
)
from ._term import clean, visible, write_plainly

if TYPE_CHECKING:
    import socket
    import threading

    from workflow_engine import Runtime, WorkflowError
    from workflow_engine.storage import SqliteStore


HELP = __doc__ or ""
app = typer.Typer(
    help=HELP.split("\n\n")[0],
    epilog="Exit codes: 0 done · 1 run failed or cancelled · 2 bad input · "
    "3 paused (waiting for input), or stopped by Ctrl-C, SIGTERM or SIGHUP · 4 not found · "
    "5 conflict · 6 storage problem · 7 server cannot listen · 130 quit at once (Ctrl-C while "
    "starting or at the demo's first prompt; a third Ctrl-C on serve) · 141 output closed "
    "(| head)",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
runs_app = typer.Typer(help="List and inspect runs.", no_args_is_help=True)
requests_app = typer.Typer(help="The inbox of pending requests.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(requests_app, name="requests")


def _print_version(value: bool) -> None:
    if not value:
        return
    from ._quick import version_line

    print(version_line())
    raise typer.Exit(EXIT_DONE)


_DB_HELP = (
    "SQLite file holding the runs (default: $WORKFLOW_ENGINE_DB, else "
    "$XDG_DATA_HOME/workflow-engine/runs.db, else ~/.local/share/workflow-engine/runs.db)."
)


class _Before:
    """Options given before the command: ``workflow-engine --db PATH runs list`` is
    ``workflow-engine runs list --db PATH``."""

    db: Path | None = None


def _db_before(db: Path | None) -> Path | None:
    _Before.db = db
    return db


def _db_or_before(db: Path | None) -> Path | None:
    chosen = db if db is not None else _Before.db
    from workflow_engine import UsageError

    try:
        path = Hints.database(chosen)
    except (DirectoryGone, UsageError) as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    return path if chosen is not None else None


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    db: Annotated[Path | None, typer.Option("--db", callback=_db_before, help=_DB_HELP)] = None,
) -> None:
    pass


DbOption = Annotated[
    Path | None,
    typer.Option("--db", callback=_db_or_before, help=_DB_HELP),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
MAX_LIMIT = 2**63 - 1
"""The largest ``--limit`` (SQLite's largest integer: past it, the database said "datatype
mismatch", exit 6 -- outside tester 180)."""
LimitOption = Annotated[
    int | None,
    typer.Option(min=0, max=MAX_LIMIT, help="At most this many (0: all).", metavar="N"),
]
# (metavar: errors name it as the usage shows it, RUN_ID, not the parameter's name)
RunIdArgument = Annotated[
    str, typer.Argument(help="A run id, or any unique prefix of one.", metavar="RUN_ID")
]

T = TypeVar("T")


@contextlib.contextmanager
def _prompt_stopped_by(signals: list[int]) -> Iterator[None]:
    """While a prompt waits, SIGTERM and SIGHUP interrupt it as Ctrl-C does (the signal is
    added to ``signals``). Their default action killed the process inside the line editor,
    leaving the terminal without echo (tester 67); interrupted, the editor restores it."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:  # (before a write fails on the dead terminal)
            _silence_the_terminal()
        signals.append(signum)
        raise KeyboardInterrupt

    stopping = (signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.signal(sig, interrupt) for sig in stopping}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _silence_the_terminal() -> bool:
    """Point stdout and stderr at /dev/null where they write to a terminal (one that hung up:
    a write would fail); a file or a pipe (a script's log) keeps what is said -- stdout's
    too, where only stdout wrote to the terminal (``demo 2> log``: how to continue went to the
    closed window, and the log kept nothing -- outside tester 177). True if stderr was
    silenced."""
    on_terminal = [s for s in (sys.stdout, sys.stderr) if _is_a_terminal(s)]
    if on_terminal == [sys.stdout]:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
            write_plainly()  # (a log: no escape codes)
            return False
    if on_terminal:
        discard_output(*on_terminal)
    return sys.stderr in on_terminal


def _is_a_terminal(stream: Any) -> bool:
    """``stream`` writes to a device (a terminal: ``isatty`` says no once it hung up), not to
    a file or a pipe that outlives it."""
    import stat

    try:
        return stat.S_ISCHR(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


def run_async(func: Callable[[], Awaitable[int]]) -> None:
    """Run a command body; turn engine errors into one clear line and an exit code."""
    import anyio

    from workflow_engine import WorkflowError

    try:
        code = anyio.run(func)
    except Exit as stop:
        code = stop.code
    except WorkflowError as exc:
        print_error(_said_here(exc))
        code = exit_code_for(exc)
    except (typer.Exit, typer.Abort):  # click's own control flow (RuntimeErrors)
        raise
    except OSError as exc:
        failed = output_failed(exc)
        code = failed if failed is not None else _internal_error(exc)
    except Exception as exc:  # a bug: still one line (WORKFLOW_ENGINE_DEBUG=1 shows where)
        code = _internal_error(exc)
    raise typer.Exit(code)


def _database_usable(db: Path | None) -> None:
    """Exit as a command using the database would if it cannot be used: an existing one is
    opened (and closed); for a new one, nothing is created (a person may still leave at the
    prompt), only its nearest existing directory is checked."""
    import anyio

    from workflow_engine import StoreUnavailableError, WorkflowError
    from workflow_engine.storage import SqliteStore

    async def check() -> None:
        store = SqliteStore(db)
        path = store.path
        if os.path.lexists(path):
            try:
                await store.open()
                await store.check_tables()  # (a damaged table said now, not after the run)
            finally:
                await store.close()
            return
        ancestor = path.parent
        while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            why = f"{ancestor} is not a directory"
        elif not os.access(ancestor, os.W_OK | os.X_OK):
            why = f"directory {ancestor} is not writable"
        else:
            return
        raise StoreUnavailableError(f"cannot create the database {path}: {why}")

    try:
        anyio.run(check)
    except WorkflowError as exc:
        print_error(_said_here(exc))
        raise typer.Exit(exit_code_for(exc)) from None


def _said_here(exc: Exception) -> str:
    """The error's message; for a workflow the command line does not build (an application's),
    what it builds and where to go instead of the runtime's "registered: ..." list."""
    from workflow_engine import WorkflowNotRegisteredError

    name = getattr(exc, "workflow_name", None)
    if isinstance(exc, WorkflowNotRegisteredError) and name not in workflow_names():
        said = str(exc)
        runtimes = f"no workflow named {name!r} is registered (registered: "
        # what the runtime added after its list ("; no worker is executing ..."): the list
        # holds the command line's own names, so its first ")" closes it
        rest = said[said.find(")", len(runtimes)) + 1 :] if said.startswith(runtimes) else ""
        return (
            f"workflow {name!r} is not one the command line builds "
            f"({', '.join(workflow_names())}): act on its runs from the application that "
            f"defines it{rest}"
        )
    return str(exc)


def _internal_error(exc: Exception) -> int:
    if os.environ.get("WORKFLOW_ENGINE_DEBUG"):
        raise exc
    print_error(
        f"internal error: {type(exc).__name__}: {exc} "
        "(set WORKFLOW_ENGINE_DEBUG=1 for the traceback)"
    )
    return EXIT_FAILED


async def _with_runtime(
    db: Path | None,
    body: Callable[[Runtime], Awaitable[T]],
    workflows: Sequence[str] = (),
    *,
    read_only: bool = False,
) -> T:
    """Open the runtime for a command that needs an existing database (it never creates one,
    so a mistyped ``--db`` is reported instead of silently starting an empty file).

    Only ``workflows`` are registered up front; commands register the workflow of the run they
    act on once they know it (building every graph would dominate a listing's start-up time).
    ``read_only``: a command that only reads leaves the file, and the files beside it, as it
    found them (no upgrade, no WAL folded in: outside tester 132).
    """
    _require_database(db)
    runtime = open_runtime(db, workflows=workflows, read_only=read_only)
    try:
        return await body(runtime)
    finally:
        await runtime.close()


def _store_of(runtime: Runtime) -> SqliteStore:
    """The SQLite store under a runtime the command line opened (``open_runtime``)."""
    from workflow_engine.storage import SqliteStore

    store = runtime.store
    assert isinstance(store, SqliteStore)
    return store


def _require_database(db: Path | None) -> None:
    """Exit 4 when there is no database where the command looks (a mistyped ``--db`` is said,
    not met with a new empty file)."""
    from workflow_engine.storage import default_db_path

    path = Path(db if db is not None else default_db_path())
    said = visible(str(path))  # (a HOME or --db with a newline cut the line there)
    try:
        there = path.exists()
    except OSError as exc:  # (a name longer than the file system takes: "internal error")
        print_error(f"cannot use {said} as the database: {exc.strerror or exc}; check --db")
        raise Exit(EXIT_USAGE) from None
    if not there:
        print_error(f"no database at {said} (nothing has run there yet; check --db)")
        raise Exit(EXIT_NOT_FOUND)
    with contextlib.suppress(OSError):  # (unreadable: opening it says why)
        if path.is_file() and path.stat().st_size == 0:
            print_error(f"no database at {said}: the file is empty (nothing has run there yet)")
            raise Exit(EXIT_NOT_FOUND)
    refused = _not_ours(path)
    if refused is not None:
        code, why = refused
        print_error(why)
        raise Exit(code)


def _not_ours(path: Path) -> tuple[int, str] | None:
    """The exit code and error line for a SQLite file at ``path`` that is not a workflow-engine
    database, read without writing anything to it (opening it as a store would create our
    tables in it, and switch another program's database to WAL; a read-only connection left
    WAL and shared-memory files beside one in WAL mode); ``None`` if it is one, or if that
    cannot be told here (opening it as a store then says what is wrong)."""
    import sqlite3

    from workflow_engine.storage._reader import not_sqlite, read_only_uri

    if not os.access(path, os.W_OK):
        return None  # (SQLite would open it read-only, and leave its -wal and -shm files)
    with contextlib.suppress(OSError):
        if not path.is_file():  # (a device, a FIFO: the store says it is not a file)
            return None
        if not_sqlite(Path(os.path.realpath(path)), path.stat().st_size):
            return None  # (SQLite would take a byte for a new database: the store refuses it)
    # (a WAL a killed writer left is read where it is, not folded into the file on closing:
    # outside testers 132 and 133)
    uri = read_only_uri(path)
    try:
        # (ours, in WAL mode, is never locked for reading: no need to wait long)
        conn = sqlite3.connect(uri, uri=True, timeout=1.0)
    except (sqlite3.Error, ValueError):
        return None
    try:
        conn.execute("PRAGMA query_only = ON")
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc).lower():  # (ours, in WAL mode, is never locked for reading)
            return EXIT_STORAGE, (
                f"cannot read {path}: another program holds it locked (a database of ours, in "
                "WAL mode, never is for reading); try again when it is done"
            )
        return None
    except (sqlite3.Error, UnicodeDecodeError):  # (damage: the store then names it)
        return None
    finally:
        conn.close()
    if "we_schema" in {name.lower() for name in tables}:  # (every schema of ours has it)
        return None
    if not tables:
        why = "the SQLite file has no tables (nothing has run there yet)"
    else:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        why = f"the SQLite file holds another program's tables ({shown})"
    return EXIT_NOT_FOUND, f"no workflow-engine database at {path}: {why} (check --db)"


# --- ids: any unique prefix -----------------------------------------------------------------


async def _full_run_id(runtime: Runtime, given: str) -> str:
    """The run ``given`` names: its id or a unique prefix of one (unknown: ``given``)."""
    from workflow_engine import RunNotFoundError

    try:
        return (await runtime.store.get_run(given)).run_id
    except RunNotFoundError:
        pass
    given, ids = await _starting_with(runtime.store.run_ids, given)
    requests = list(await runtime.store.request_ids(given.lower())) if not ids and given else []
    if len(requests) == 1:  # (said only for a request it names, whole or by a unique prefix)
        asked = await runtime.store.get_request(requests[0])
        todo = "answer it with respond, then resume" if asked.status == "pending" else "resume"
        raise RunNotFoundError(
            f"no run {given!r}: that is the id of a request of run {asked.run_id!r}; "
            f"{todo} that run"
        )
    return _matched("run", given, ids)


async def _full_request_id(runtime: Runtime, given: str) -> str:
    """The request ``given`` names: its id or a unique prefix of one (unknown: ``given``)."""
    from workflow_engine import UnknownRequestError

    try:
        return (await runtime.store.get_request(given)).request_id
    except UnknownRequestError:
        pass
    request_id, dot, mac = given.partition(".")
    if dot and request_id and mac and all(c in string.hexdigits for c in given.replace(".", "")):
        # an AG-UI interrupt's id (the request id, a dot, a MAC), copied from a web client:
        # this command line is the store's own (outside tester 153)
        given = request_id
    given, ids = await _starting_with(runtime.store.request_ids, given)
    runs = list(await runtime.store.run_ids(given.lower())) if not ids and given else []
    if len(runs) == 1:  # a run's id where a request's goes (outside tester 113)
        waiting = await runtime.store.list_requests(runs[0], status="pending")
        which = (
            f"its pending request is {waiting[0].request_id!r}"
            if len(waiting) == 1
            else f"it has {len(waiting)} pending requests (requests list shows them)"
            if waiting
            else "it has no pending request"
        )
        raise UnknownRequestError(
            f"no request {given!r}: that is the id of run {runs[0]!r}; {which}"
        )
    return _matched("request", given, ids)


async def _starting_with(
    listed: Callable[[str], Awaitable[Sequence[str]]], given: str
) -> tuple[str, list[str]]:
    """The ids ``listed`` finds starting with ``given``, and the prefix that found them (hex
    typed in capitals: in lower case, see ``lowered_hex``)."""
    ids = list(await listed(given))
    lowered = lowered_hex(given) if not ids else None
    if lowered is not None:
        found = list(await listed(lowered))
        if found:
            return lowered, found
    return given, ids


def _matched(kind: str, given: str, ids: list[str]) -> str:
    try:
        return match(kind, given, ids)
    except AmbiguousIdError as exc:
        print_error(str(exc))
        raise Exit(EXIT_USAGE) from None


async def _run_for(runtime: Runtime, given: str) -> Any:
    """Resolve a run id (prefix), register the workflow that run belongs to (its agents on
    the scripted model: the commands using this run none), and return the run's record."""
    run = await runtime.store.get_run(await _full_run_id(runtime, given))
    register(runtime, [run.workflow_name])
    return run


# --- running ----------------------------------------------------------------------------------


ApproveOption = Annotated[
    bool,
    typer.Option("--approve", help="Approve every tool call instead of asking."),
]
RejectOption = Annotated[
    bool,
    typer.Option("--reject", help="Reject every tool call instead of asking."),
]


def _approvals(approve: bool, reject: bool) -> bool | None:
    """--approve: True, --reject: False, neither: None (ask); both is a usage error (exit 2),
    not "the last one wins"."""
    if approve and reject:
        print_error("give --approve or --reject, not both")
        raise typer.Exit(EXIT_USAGE)
    return True if approve else False if reject else None


ReplyOption = Annotated[
    list[str] | None,
    typer.Option("--reply", help="Answer the next 'your turn' prompt (repeatable)."),
]
EndOption = Annotated[
    bool, typer.Option("--end", help="End the conversation when no --reply is left.")
]
InteractiveOption = Annotated[
    bool | None,
    typer.Option("--interactive/--no-interactive", help="Prompt on the terminal (default: TTY)."),
]
ModelOption = Annotated[
    str | None, typer.Option("--model", help="Use a real model (OpenAI-compatible).")
]
BaseUrlOption = Annotated[
    str | None, typer.Option("--base-url", help="OpenAI-compatible endpoint.")
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key", help="API key for the endpoint (never stored; default: $OPENAI_API_KEY)."
    ),
]
OfflineOption = Annotated[
    bool, typer.Option("--offline", help="Use the offline scripted model, whatever is configured.")
]


@app.command()
def demo(
    name: Annotated[
        str, typer.Argument(help="handoff (support), banking, transfer or review", metavar="DEMO")
    ] = "handoff",
    message: Annotated[
        str | None, typer.Option("--message", "-m", help="The first user message.")
    ] = None,
    approve_all: ApproveOption = False,
    reject_all: RejectOption = False,
    reply: ReplyOption = None,
    end: EndOption = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="Stop at the first pause and print how to continue.")
    ] = False,
    interactive: InteractiveOption = None,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    offline: OfflineOption = False,
    db: DbOption = None,
    json_mode: JsonOption = False,
) -> None:
    """Run a demo workflow durably: streams agents, asks for approvals and input.

    The run records its model (endpoint and model name; a key only by the name of the
    environment variable holding it), and `resume` continues on the same one.
    """
    workflow = DEMO_ALIASES.get(name)
    if workflow is None:
        print_error(f"no demo named {name!r} (choose from: {', '.join(DEMO_ALIASES)})")
        raise typer.Exit(EXIT_USAGE)
    _refuse_blank(message, reply)
    try:
        chosen = model_for_start(ModelFlags(model, base_url, api_key, offline), os.environ)
    except ModelConfigError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    from ._console import drive, make_policy, terminals

    term, talk = terminals(json_mode)
    approve = _approvals(approve_all, reject_all)
    policy = make_policy(approve, reply or [], end, interactive, talk)
    if not policy.interactive and not detach and approve is None:
        # No one to ask: a demo should still run to the end (say so; --reject/--detach exist).
        talk.line(("no terminal: approving tool calls and ending at the next prompt", "dim"))
        policy.approvals = "approve"
        policy.end_when_out_of_replies = True
    typed = False
    if message is None and policy.interactive:
        _database_usable(db)  # before asking: a message typed for a file it cannot use is lost
        talk.line((f"{workflow} demo · type the first message (empty: a sample one)", "dim"))
        stopped_by: list[int] = []
        try:
            with _prompt_stopped_by(stopped_by):
                message = talk.ask(policy.read, ("You: ", "bold green")).strip()
                message = "" if _blank(message) else message  # (invisible: the sample one)
        except (EOFError, KeyboardInterrupt) as stop:
            talk.end()
            talk.line("Nothing started.")
            # Ctrl-D is "no message": done; Ctrl-C aborts, and a script must be able to tell;
            # SIGTERM and SIGHUP end it as they would any program (the terminal restored)
            quit = EXIT_QUIT if not stopped_by else 128 + stopped_by[0]
            raise typer.Exit(quit if isinstance(stop, KeyboardInterrupt) else EXIT_DONE) from None
        typed = bool(message)
    first = message or _DEFAULT_MESSAGES[workflow]

    started: list[str] = []

    async def body() -> int:
        runtime = open_runtime(db, chosen, workflows=[workflow])
        try:
            run_id = await start_run(runtime, workflow, first, chosen)
            started.append(run_id)
            if not json_mode:
                file = visible(str(runtime.store.path))  # (a newline in it broke the line)
                shown = f"run {visible(run_id)} · workflow {workflow} · db {file}"
                term.line((shown, "dim"))
                if not typed or talk is not term:  # (typed elsewhere: `demo > log`)
                    term.line(("You: ", "bold green"), first, indent=5)
            return await drive(
                runtime, run_id, policy, json_mode=json_mode, detach=detach, term=term
            )
        finally:
            await runtime.close()

    _interruptible(body, started, json_mode=json_mode)


_DEFAULT_MESSAGES = {
    "support": "Hi! My headphones from order 12345 arrived broken. I'd like a refund.",
    "banking": "Please transfer 300 to savings and show my balance",
    "bank_transfer": "Please transfer 1000 from account 123456 to account 654321.",
    "review_loop": "durable workflows",
}


_PLAIN: dict[str, Any] = {"markup": False, "emoji": False, "highlight": False}
"""How rich prints a line that holds a run id: as plain text, no markup nor emoji code (an id
of "[/]" crashed the line, ":warning:" became an emoji in the command to paste -- outside
testers 195, 199)."""


def _interruptible(
    body: Callable[[], Awaitable[int]], run_ids: list[str], *, json_mode: bool = False
) -> None:
    """Run ``body``; on Ctrl-C say how to continue the run it started or resumed (its id is
    in ``run_ids`` once known) and exit 3. SIGTERM (a process manager stopping the command,
    ``timeout``) and SIGHUP (its terminal closed) stop it the same way: the run gives its
    lease back at once instead of keeping it, held by a dead process, for the lease's length.
    ``json_mode``: stdout carries JSON lines, so it gets an ``interrupted`` line, never text.
    """
    import asyncio
    import signal
    import threading

    from ._console import stopped_from_outside  # (not imported in a signal handler)

    hung_up = False
    grace_over = threading.Event()  # set just before the grace's own signal is sent
    silenced = False  # stderr went to /dev/null with the terminal it wrote to
    stopped_by: int | None = None  # the SIGTERM or SIGHUP that stopped it (None: a Ctrl-C)
    asked_to_stop = False
    # Started with SIGINT ignored (``cmd &`` in a script: the shell shields it from the
    # terminal's Ctrl-C), the event loop never hooks SIGINT and a SIGINT sent to stop the run
    # is lost: SIGTERM did nothing at all (tester 66). Then those signals stop the run
    # themselves, as the loop's own Ctrl-C handling would; real Ctrl-Cs stay ignored.
    sigint_ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    main_task: asyncio.Task[Any] | None = None

    async def main() -> int:
        nonlocal main_task
        main_task = asyncio.current_task()
        return await body()

    def as_ctrl_c(signum: int, frame: Any) -> None:
        nonlocal hung_up, silenced, asked_to_stop, stopped_by
        if signum == signal.SIGHUP and not hung_up:
            hung_up = True
            # before a write fails on the dead terminal (tester 67: a log lost the run id)
            silenced = _silence_the_terminal()
        if asked_to_stop and not grace_over.is_set():
            # the same request again: a closed terminal's SIGHUP comes from the kernel and
            # from the shell it ran, and the second was taken for a second Ctrl-C -- a step
            # under way was cut off at once, without its grace (outside tester 113)
            return
        first = not asked_to_stop
        if first:
            # no one is left to press Ctrl-C again: a step that does not finish within the
            # grace is stopped waiting for, as a second Ctrl-C would (it is asked about then)
            asked_to_stop = True
            stopped_by = signum
            again = signal.SIGTERM if sigint_ignored else signal.SIGINT
            _signal_later(STOP_GRACE_SECONDS, again, grace_over)
            stopped_from_outside(STOP_GRACE_SECONDS)  # (what the wait for a step says)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # at a prompt (which takes SIGINT even in a job that ignores it): stop at once --
            # a SIGINT sent to itself here reached the line editor's wait only at the next
            # signal when this ran as the wait began (outside tester 154)
            raise KeyboardInterrupt
        if not sigint_ignored:
            os.kill(os.getpid(), signal.SIGINT)
        elif first and main_task is not None and not main_task.done():
            main_task.cancel()  # what the loop does on a first Ctrl-C: the run stops gracefully
            main_task.get_loop().call_soon_threadsafe(lambda: None)  # (wake it up)
        else:
            raise KeyboardInterrupt  # and when the grace is over: stop waiting

    stopping = (signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.signal(sig, as_ctrl_c) for sig in stopping}
    try:
        try:
            run_async(main)
        except asyncio.CancelledError:
            if not (sigint_ignored and asked_to_stop):
                raise
            raise KeyboardInterrupt from None  # (the cancel above, come back out)
    except KeyboardInterrupt:
        # the first Ctrl-C decided it: more presses must not cut off the line saying how to
        # continue (they killed the process, exit 130, after or before it)
        for sig in (signal.SIGINT, *stopping):
            signal.signal(sig, signal.SIG_IGN)
        from workflow_engine.executors import calls_in_threads

        running = calls_in_threads() > 0
        # said on stderr; when that was the terminal that hung up, on stdout -- a file or a
        # pipe (a script's log) keeps it (it kept nothing: outside tester 114), /dev/null if
        # stdout was that terminal too. With --json, stdout gets a JSON line instead (a
        # line of text broke the stream a program reads: outside tester 113)
        if json_mode:
            with contextlib.suppress(OSError, ValueError):
                _say_interrupted_as_json(run_ids, running)
        if silenced:
            from rich.console import Console

            term = Console(file=sys.stdout, soft_wrap=True)
        else:
            term = err_console()
        with contextlib.suppress(OSError, ValueError):  # (it closed after all the same)
            if silenced and json_mode:
                pass  # (said on stdout as JSON, above)
            elif run_ids:
                run_id = visible(run_ids[-1])
                term.print(f"\nInterrupted: run {run_id} keeps its last checkpoint.", **_PLAIN)
                if running:  # (what the second Ctrl-C stopped waiting for)
                    term.print(
                        "A call was still running: it may yet complete. `resume` asks "
                        "whether it did."
                    )
                term.print(f"Continue with: {resume_command(run_ids[-1])}", **_PLAIN)
            else:
                term.print("\nInterrupted before a run started.")
        # nothing to resume without a run: a quit, as a signal would end any program (tester
        # 67: exit 3 said "resume continues it")
        code = EXIT_PAUSED if run_ids else EXIT_QUIT if stopped_by is None else 128 + stopped_by
        if _a_thread_lingers():
            _exit_now(code)
        raise typer.Exit(code) from None
    except typer.Exit as stop:
        # a write that failed on the closed terminal before the signal was handled (another
        # thread's, say) ended the command as an output failure: it was the hang-up
        if hung_up and stop.exit_code == EXIT_FAILED:
            raise typer.Exit(EXIT_PAUSED) from None
        failed = stop.exit_code == EXIT_FAILED and run_ids and stdout_failed()
        if failed or (stop.exit_code == EXIT_BROKEN_PIPE and run_ids):
            # the output could not be written (a full disk), or its reader went away (``|
            # head``): the run stopped where it was, which stdout can no longer say -- stderr
            # still may (outside tester 106); after a full disk, exit 1 would have a script
            # start another run (217). A run that ended meanwhile has nothing to continue (218)
            ended = _ended(run_ids[-1])
            said = "Output failed" if failed else "Output closed"
            with contextlib.suppress(OSError, ValueError):
                err_console().print(
                    f"{said}: run {visible(run_ids[-1])} "
                    + (
                        f"had ended ({ended})."
                        if ended is not None
                        else f"stopped where it was. Continue with: {resume_command(run_ids[-1])}"
                    ),
                    soft_wrap=True,
                    **_PLAIN,
                )
                sys.stderr.flush()
            if failed:
                raise typer.Exit(EXIT_DONE if ended == "idle" else EXIT_PAUSED) from None
        raise
    finally:
        for sig, handler in before.items():
            if signal.getsignal(sig) is as_ctrl_c:
                signal.signal(sig, handler)


def _ended(run_id: str) -> str | None:
    """The status run ``run_id`` rests at for good -- ``idle`` (finished) or ``cancelled`` --
    as its database says now; None when it may go on, or that cannot be read."""
    from workflow_engine.storage._reader import SqliteReader

    if Hints.path is None:
        return None
    try:
        reader = SqliteReader.open(Hints.path)
        if reader is None:
            return None
        with reader:
            run = reader.get_run(run_id)
    except Exception:  # (whatever the file is now: the usual advice stands)
        return None
    status = run.status.value if run is not None else None
    return status if status in ("idle", "cancelled") else None


def _say_interrupted_as_json(run_ids: list[str], running: bool) -> None:
    """The ``interrupted`` line of a ``--json`` stream: which run stopped, whether a call was
    still running, and the command that continues it."""
    import json

    line: dict[str, Any] = {"type": "interrupted", "run_id": run_ids[-1] if run_ids else None}
    if run_ids:
        line["call_running"] = running
        line["continue_with"] = resume_command(run_ids[-1])
    print(json.dumps(line), flush=True)


STOP_GRACE_SECONDS = 10.0
"""After SIGTERM or SIGHUP (the terminal closed), how long a step under way (an approved tool
call) gets to finish before the command stops waiting for it as a second Ctrl-C would: no one
is there to press it, and a call that hung kept the process, and the run, for good."""


def _signal_later(seconds: float, signum: int, sending: threading.Event | None = None) -> None:
    """Send this process ``signum`` in ``seconds`` (from a daemon thread: gone at exit),
    setting ``sending`` first."""
    import threading

    def send() -> None:
        if sending is not None:
            sending.set()
        os.kill(os.getpid(), signum)

    timer = threading.Timer(seconds, send)
    timer.daemon = True
    timer.start()


def _a_thread_lingers() -> bool:
    """A thread the command started still runs: a tool call in a thread that the second
    Ctrl-C stopped waiting for (it cannot be cut off), or an idle worker thread. The
    interpreter would wait for it at exit, with Ctrl-C ignored from then on: the command said
    it was interrupted and never ended (see ``_exit_now``)."""
    import threading

    main = threading.main_thread()
    return any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate())


def _exit_now(code: int) -> None:
    """Exit without waiting for the threads that linger (``_a_thread_lingers``)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(code)


_AT_REST = ("idle", "cancelled")  # WorkflowRunState values: nothing left to resume


@app.command()
def resume(
    run_id: RunIdArgument,
    approve_all: ApproveOption = False,
    reject_all: RejectOption = False,
    reply: ReplyOption = None,
    end: EndOption = False,
    interactive: InteractiveOption = None,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    offline: OfflineOption = False,
    db: DbOption = None,
    json_mode: JsonOption = False,
) -> None:
    """Continue a run (after answers, a restart or a crash), streaming like the demo.

    The agents continue on the model the run was started with, or the command refuses (exit
    2) saying why; --model/--base-url or --offline choose another model for this resume.
    """
    from ._console import drive, make_policy, terminals

    _refuse_blank(None, reply)
    approve = _approvals(approve_all, reject_all)
    term, talk = terminals(json_mode)
    policy = make_policy(approve, reply or [], end, interactive, talk)
    flags = ModelFlags(model, base_url, api_key, offline)
    try:
        flags.check()
    except ModelConfigError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    if closed_output_refused():
        raise typer.Exit(EXIT_FAILED)

    resumed: list[str] = []

    async def body() -> int:
        _require_database(db)
        runtime = open_runtime(db, workflows=())
        try:
            full = await _full_run_id(runtime, run_id)
            resumed.append(full)
            run, checkpoint = await runtime.store.get_run_and_latest(full)
            chosen = None
            # at rest (a finished or cancelled run runs no agent), or held by a live worker
            # (the model is chosen all the same: the lease may lapse before ours is asked
            # for): refused below in one line, with nothing said before it
            busy = run.live_owner(time.time()) is not None
            if takes_model(run.workflow_name) and run.status not in _AT_REST:
                try:
                    recorded = recorded_model(full, checkpoint)
                    chosen, note = model_for_resume(full, recorded, flags, os.environ)
                except ModelConfigError as exc:
                    print_error(str(exc))
                    return EXIT_USAGE
                if note and not busy:
                    talk.line((note, "dim"))
            register(runtime, [run.workflow_name], chosen)
            runtime.workflow(run.workflow_name)  # an application's: refused before "resuming"
            if run.status not in _AT_REST and not busy:
                if not json_mode:
                    file = visible(str(runtime.store.path))
                    shown = visible(run.workflow_name)
                    where = f"run {visible(full)} · workflow {shown} · db {file}"
                    term.line((f"resuming {where}", "dim"))
                # what it goes on with: the answers given since (an approval's edits too --
                # only the call's result showed, run with arguments no one saw: tester 153;
                # with --json as a line of its own: tester 159)
                import json

                from ._views import answer_data, describe_answer

                for request in await runtime.store.list_requests(run_id=full, status="answered"):
                    if json_mode:
                        line = {"type": "applying", "run_id": full}
                        line.update(request_id=request.request_id, answer=answer_data(request))
                        print(json.dumps(line), flush=True)
                    else:
                        term.line(("  applying: ", "dim"), visible(describe_answer(request)))
            return await drive(runtime, full, policy, json_mode=json_mode, detach=False, term=term)
        finally:
            await runtime.close()

    _interruptible(body, resumed, json_mode=json_mode)


@app.command()
def respond(
    request_id: Annotated[
        str, typer.Argument(help="A request id, or any unique prefix of one.", metavar="REQUEST_ID")
    ],
    approve_flag: Annotated[
        bool, typer.Option("--approve", help="Approve a tool call.", show_default=False)
    ] = False,
    reject_flag: Annotated[
        bool, typer.Option("--reject", help="Reject a tool call.", show_default=False)
    ] = False,
    arguments: Annotated[
        str | None, typer.Option(help="With --approve: JSON object of edited arguments.")
    ] = None,
    messages: Annotated[
        list[str] | None, typer.Option("--message", help="Your next message.")
    ] = None,
    end: Annotated[bool, typer.Option("--end", help="End the conversation.")] = False,
    data: Annotated[str | None, typer.Option("--data", help="The answer as raw JSON.")] = None,
    db: DbOption = None,
) -> None:
    """Answer a pending request (stored durably; run `resume` to continue the run)."""
    if messages and len(messages) > 1:  # the last would silently win: one reply at a time
        print_error("give --message once: a reply is one message")
        raise typer.Exit(EXIT_USAGE)
    message = messages[0] if messages else None
    if message is not None and _blank(message):
        print_error("--message is blank: give the words to say (or --end to end the conversation)")
        raise typer.Exit(EXIT_USAGE)
    chosen = [
        x for x in (approve_flag, reject_flag, message is not None, end, data is not None) if x
    ]
    if arguments is not None and not approve_flag:
        print_error("--arguments goes with --approve (the edited arguments of the approved call)")
        raise typer.Exit(EXIT_USAGE)
    if len(chosen) != 1:
        print_error("give exactly one of --approve, --reject, --message, --end, --data")
        raise typer.Exit(EXIT_USAGE)
    approve = True if approve_flag else False if reject_flag else None
    from workflow_engine._input import InputError, check_text, parse_json

    if data is not None and data.strip() == DATA_PLACEHOLDER:  # a printed command, pasted
        print_error(
            f"replace {DATA_PLACEHOLDER} with the answer, as JSON in the form the pause said "
            "(answer as JSON: ...); nothing was stored"
        )
        raise typer.Exit(EXIT_USAGE)
    try:
        if data is not None:
            answer: Any = parse_json(data, what="--data", max_bytes=MAX_ANSWER_BYTES)
        elif approve is not None:
            answer = {"approved": approve}
            if arguments is not None:
                answer["arguments"] = parse_json(
                    arguments, what="--arguments", max_bytes=MAX_ANSWER_BYTES
                )
        elif message is not None:
            answer = {"message": check_text(message, "--message")}
        else:
            answer = {"end": True}
    except InputError as exc:
        said = str(exc)
        if data is not None and re.search(r"\btrue\|false\b", data):
            # the form's ``true|false``, pasted as it was said: one of the two is meant
            said += " (true|false in the answer's form means one of them: write true or false)"
        print_error(said)
        raise typer.Exit(EXIT_USAGE) from None
    if REPLY_PLACEHOLDER in (message, answer):  # a printed command, pasted as it was
        print_error(f"replace {REPLY_PLACEHOLDER} with what to say; nothing was stored")
        raise typer.Exit(EXIT_USAGE)
    if closed_output_refused():
        raise typer.Exit(EXIT_FAILED)

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            full = await _full_request_id(runtime, request_id)
            asked, run = await runtime.store.get_request_and_run(full)
            mismatch = _answer_of_another_kind(asked, approve, message, end)
            if mismatch is not None:  # (said before pydantic's "approved: Field required")
                print_error(f"request {clean(full)} {mismatch}; nothing was stored")
                return EXIT_USAGE
            register(runtime, [run.workflow_name])
            outcome = await runtime.respond(full, answer)
            if outcome.value != "duplicate":
                acted(f"the answer to request {clean(full)} is stored")
            if outcome.value == "duplicate":  # (a repeat leaves the run as read above)
                now = run.status.value
                if now in ("idle", "cancelled"):  # `resume` would refuse it (tester 74)
                    print(f"already had this answer; run {clean(run.run_id)} has ended ({now})")
                    return EXIT_DONE
            note = "already had this answer" if outcome.value == "duplicate" else "answer stored"
            # the command whole on a line of its own, as a pause prints it: quoted in
            # backticks, the line pasted into a shell ran it as a substitution (tester 106)
            print(f"{note}; continue with:\n  {resume_command(run.run_id)}")
            return EXIT_DONE

        return await _with_runtime(db, go)

    run_async(body)


def _answer_of_another_kind(
    asked: Any, approve: bool | None, message: str | None, end: bool
) -> str | None:
    """What is wrong when the flags answer another kind of question than the request asks
    (None: they may fit; the workflow's own validation has the last word): a message for a
    tool call's approval said "approved: Field required" (outside tester 113)."""
    from ._views import describe_request

    said = describe_request(asked.data, asked.port_id)
    if said.startswith("approve ") and (message is not None or end):
        return (
            f"asks to {said}: answer it with --approve (--arguments to edit the call) or --reject"
        )
    if said.startswith("reply to ") and approve is not None:
        agent = said.removeprefix("reply to ").partition(":")[0]
        return f"asks for your next message to {agent}: answer it with --message TEXT or --end"
    return None


@app.command()
def cancel(
    run_id: RunIdArgument,
    db: DbOption = None,
) -> None:
    """Cancel a run: it ends CANCELLED and its pending requests can no longer be answered."""
    if closed_output_refused():
        raise typer.Exit(EXIT_FAILED)

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            from workflow_engine import RunNotResumableError

            full = (await _run_for(runtime, run_id)).run_id
            try:
                info = await runtime.cancel(full)
            except RunNotResumableError:
                # cancelled before: what that cancel left in doubt is said again (the error
                # follows on stderr), not only by the cancel that did it
                before = await runtime.get_run(full)
                if before.status.value == "cancelled":
                    _show_cancelled_in_doubt(before.effects_in_doubt)
                raise
            acted(f"run {clean(info.run_id)} is {info.status.value}")
            if info.cancel_requested:  # another worker executes it: it ends it at a boundary
                print(
                    f"Run {visible(info.run_id)} {info.status.value}, cancelling: the worker "
                    "executing it ends it cancelled after its current step (unless that step "
                    "finishes it: a finished run stays finished)."
                )
            else:
                print(f"Run {visible(info.run_id)} {info.status.value}.")
            _show_cancelled_in_doubt(info.effects_in_doubt)
            return EXIT_DONE

        return await _with_runtime(db, go)

    run_async(body)


def _show_cancelled_in_doubt(effects: Sequence[Any]) -> None:
    """The steps a cancelled run left in doubt, said on stdout (see ``show_in_doubt``)."""
    if not effects:
        return
    from ._console import CANCELLED_WITHOUT_ASKING, show_in_doubt
    from ._term import Terminal

    term = Terminal()
    for effect in effects:
        show_in_doubt(term, effect, then=CANCELLED_WITHOUT_ASKING)


@app.command()
def graph(
    name: Annotated[
        str, typer.Argument(help="A workflow name (see `runs list`) or demo alias.", metavar="NAME")
    ],
    format: Annotated[str, typer.Option("--format", help="mermaid or dot")] = "mermaid",
) -> None:
    """Print a workflow's graph as Mermaid or Graphviz DOT."""
    factories = workflow_factories()
    key = DEMO_ALIASES.get(name, name)
    if key not in factories:
        print_error(f"no workflow named {name!r} (known: {', '.join(sorted(factories))})")
        raise typer.Exit(EXIT_NOT_FOUND)
    if format not in ("mermaid", "dot"):
        print_error(f"--format must be mermaid or dot, not {format!r}")
        raise typer.Exit(EXIT_USAGE)
    wf = factories[key]()
    try:
        sys.stdout.write(wf.to_mermaid() if format == "mermaid" else wf.to_dot())
        sys.stdout.flush()
    except OSError as exc:
        failed = output_failed(exc)
        if failed is None:
            raise
        raise typer.Exit(failed) from None


# --- inspecting -------------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    status: Annotated[
        str | None,
        typer.Option(
            help="e.g. idle_with_pending_requests, or interrupted or not_started (as the list "
            "shows)"
        ),
    ] = None,
    workflow: Annotated[str | None, typer.Option(help="Only this workflow.")] = None,
    limit: LimitOption = None,
    db: DbOption = None,
    json_mode: JsonOption = False,
) -> None:
    """List runs, the most recently updated last (with --limit N, only the N most recently
    updated)."""
    try:
        state, shown_only = status_filter(status)
    except ValueError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            # (interrupted and not_started: told apart by the query, as the quick listing does)
            started = None if shown_only is None else shown_only != "not_started"
            # every run whose row reads, and the damaged ones named: one hid all the others
            # (outside testers 137, 140)
            store = _store_of(runtime)
            if shown_only:  # (which are interrupted: whether their worker lives, asked here)
                runs, damaged, _ = await store.runs_by_update_apart(
                    state, workflow, started=started
                )
                runs = [r for r in runs if person_status(r) == shown_only]
                runs, left_out = limited(runs, limit, newest=True)
            else:
                runs, damaged, matched = await store.runs_by_update_apart(
                    state, workflow, started=started, last=limit or None
                )
                left_out = max(0, matched - limit) if limit else 0
            filtered = status is not None or workflow is not None
            answered = await _answered_counts(runtime, runs if filtered else None)
            every = (
                await store.run_ids_beside([r.run_id for r in runs])
                if (filtered or left_out) and runs and not json_mode
                else None
            )
            if runs or json_mode or not damaged:  # ("No runs." where every run is damaged: no)
                runs_output(
                    runs,
                    answered,
                    every,
                    filtered=filtered,
                    json_mode=json_mode,
                    left_out=left_out,
                )()
            return _said(damaged)

        return await _with_runtime(db, go, read_only=True)

    run_async(body)


@runs_app.command("show")
def runs_show(
    run_id: RunIdArgument,
    db: DbOption = None,
    json_mode: JsonOption = False,
) -> None:
    """A run's timeline (checkpoints per superstep), outputs and pending requests."""

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            record = await _run_for(runtime, run_id)
            full = record.run_id
            info = await runtime.get_run(full)
            history = await runtime.history(full)
            # stored, not applied yet: the run goes on only when resumed (tester 74)
            answered = (
                []
                if info.status.is_terminal
                else await runtime.store.list_requests(run_id=full, status="answered")
            )
            run_output(info, record, history, answered, json_mode=json_mode)()
            return EXIT_DONE

        return await _with_runtime(db, go, read_only=True)

    run_async(body)


@requests_app.command("list")
def requests_list(
    limit: LimitOption = None, db: DbOption = None, json_mode: JsonOption = False
) -> None:
    """Pending requests across all runs, oldest first (approvals show the tool and its
    arguments; with --limit N, the N waiting longest)."""

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            # No workflow is registered, so the data stays as stored; describe_request reads it.
            pending, damaged, left_out = await _pending_tolerantly(runtime, limit)
            if json_mode:
                code = _said(damaged)
                if damaged and not pending:  # nothing read: no list (`[]` said "none waits",
                    return code  # to a script reading stdout -- outside tester 191)
                requests_json_output(pending)()
                return code
            # (each damaged run is said for itself, the others listed: testers 106, 133, 134)
            in_doubt, unreadable, in_doubt_left = await _runs_in_doubt(runtime, limit)
            damaged.extend(unreadable)
            waiting, unreadable, answered_left = await _runs_answered(runtime, limit)
            damaged.extend(unreadable)
            code = _said(damaged)  # said first: a long list would scroll them away
            store = _store_of(runtime)
            request_ids = await store.request_ids_beside([p.request_id for p in pending])
            run_ids = await store.run_ids_beside([p.run_id for p in pending])
            requests_output(
                pending,
                in_doubt,
                waiting,
                request_ids,
                run_ids,
                bool(damaged),
                left_out,
                (in_doubt_left, answered_left),
            )()
            return code

        return await _with_runtime(db, go, read_only=True)

    run_async(body)


def _said(errors: Sequence[WorkflowError]) -> int:
    """Say each error (on stderr) once -- a file damaged past one run's rows fails each run's
    read the same way (the same line seven times: outside tester 138); the exit code of the
    last, or 0 if none."""
    code = EXIT_DONE
    for said in dict.fromkeys(str(exc) for exc in errors):
        print_error(said)
    for exc in errors:
        code = exit_code_for(exc)
    return code


async def _pending_tolerantly(
    runtime: Runtime, limit: int | None
) -> tuple[list[Pending], list[WorkflowError], int]:
    """The pending requests (the first ``limit``), the errors of runs whose requests cannot
    be read, and how many ``limit`` left out: one damaged request row stopped the whole inbox
    (outside tester 106). Only then is each run read on its own, so that the others are
    still listed. With a limit, only the requests shown are read (every one was, then cut:
    1.1 s for 20 of 53,000, outside tester 175)."""
    from workflow_engine import RunNotFoundError, StoreCorruptError

    try:
        if limit:
            store = _store_of(runtime)
            listed = await store.list_requests(status="pending", limit=limit)
            names = {}
            for r in listed:
                if r.run_id not in names:
                    names[r.run_id] = (await store.get_run(r.run_id)).workflow_name
            pending = [
                Pending(r.request_id, r.run_id, names[r.run_id], r.port_id, r.data) for r in listed
            ]
            return pending, [], max(0, await store.count_requests("pending") - limit)
        return _as_pending(await runtime.pending_requests()), [], 0
    except (StoreCorruptError, RunNotFoundError):
        pass
    found: list[Any] = []
    damaged: list[WorkflowError] = []
    try:  # the runs with pending requests, from the requests' rows alone
        listed = await runtime.store.list_requests(status="pending")
        run_ids = list(dict.fromkeys(r.run_id for r in listed))
    except StoreCorruptError:  # a request row itself: every run, by id alone
        run_ids = list(await runtime.store.run_ids(""))
    for run_id in run_ids:  # (a damaged run row too is said for its run alone: tester 114)
        try:
            found.extend(await runtime.pending_requests(run_id))
        except StoreCorruptError as exc:
            damaged.append(exc)
        except RunNotFoundError as exc:  # (its run's row gone: tester 134)
            damaged.append(_gone_yet_named(exc, "pending requests"))
    # (waiting longest first, as the listing is otherwise: read run by run, they were in the
    # order of the runs' ids -- outside tester 186)
    found.sort(key=lambda r: (r.created_at, r.request_id))
    pending, left_out = limited(_as_pending(found), limit, newest=False)
    return pending, damaged, left_out


def _as_pending(found: Sequence[Any]) -> list[Pending]:
    """``PendingRequest`` s as the inbox lists them."""
    return [Pending(r.request_id, r.run_id, r.workflow_name, r.port_id, r.data) for r in found]


def _gone_yet_named(exc: WorkflowError, by: str) -> WorkflowError:
    """A run no row holds, named by ``by`` (its row deleted, or its id changed): damage."""
    from workflow_engine import StoreCorruptError

    return StoreCorruptError(f"{exc}, yet {by} name it: damaged")


async def _runs_in_doubt(
    runtime: Runtime, limit: int | None
) -> tuple[list[Any], list[WorkflowError], int]:
    """Interrupted runs with a step in doubt: no request asks about it until a resume does,
    but a person looking at the inbox should know a question is coming (tester 69). And the
    errors of runs that cannot be read to tell: one damaged journal entry hid every other
    run's requests (outside tester 133). With a ``limit``, the first that many, and how many
    interrupted runs were left unread (every one was read, and listed: 3 s and 20,000 lines
    for ``--limit 1`` after a crash, outside tester 182)."""
    from workflow_engine import StoreCorruptError

    # Only a run with journal entries after its latest checkpoint can have a step in doubt:
    # the store finds those in one query (a read per run in progress: 0.7 s at 20,000 runs
    # never started, outside tester 122), where ``get_run`` folds a run's checkpoints (a
    # thousand runs cut off by a crash would otherwise be a thousand folds to show the inbox).
    found = []
    damaged: list[WorkflowError] = []
    try:
        journaled = await _store_of(runtime).runs_journaled_past()
    except StoreCorruptError as exc:  # (a run row of those the query reads: tester 134)
        return [], [exc], 0
    interrupted = [record for record in journaled if may_be_in_doubt(record)]
    read = 0
    for record in interrupted:
        if limit and len(found) == limit:
            break
        read += 1
        try:
            info = await runtime.get_run(record.run_id)
        except StoreCorruptError as exc:
            damaged.append(exc)
            continue
        if info.effects_in_doubt:
            found.append(info)
    return found, damaged, len(interrupted) - read


async def _answered_counts(runtime: Runtime, runs: Sequence[Any] | None) -> dict[str, int]:
    """Run id → answers stored and not applied, of ``runs`` (None: of every run): counted,
    as the quick listings count them."""
    given = [r.run_id for r in runs] if runs is not None else None
    return await _store_of(runtime).answered_counts(given)


async def _runs_answered(
    runtime: Runtime, limit: int | None
) -> tuple[list[tuple[Any, int]], list[WorkflowError], int]:
    """Resting runs with answers stored and not applied (no live worker applies them): they
    wait for ``resume``, with no request left pending to say so (tester 74). (run, answers);
    and the errors of such runs whose rows are damaged (one hid every request: tester 134);
    and, with a ``limit``, how many runs with answers stored were left unread."""
    from workflow_engine import RunNotFoundError, StoreCorruptError

    found = []
    damaged: list[WorkflowError] = []
    counts = await _answered_counts(runtime, None)
    read = 0
    for run_id, count in counts.items():
        if limit and len(found) == limit:
            break
        read += 1
        try:
            record = await runtime.store.get_run(run_id)
        except StoreCorruptError as exc:
            damaged.append(exc)
            continue
        except RunNotFoundError as exc:  # (its row's id changed under them: tester 141)
            damaged.append(_gone_yet_named(exc, "stored answers"))
            continue
        if answered_to_apply(record):
            found.append((record, count))
    return found, damaged, len(counts) - read


MAX_ANSWER_BYTES = 1_000_000


def _refuse_blank(message: str | None, replies: Sequence[str] | None) -> None:
    """Exit 2 on a blank ``--message`` or ``--reply`` before anything starts: a blank reply
    was refused only when the run reached the prompt it answered, leaving a run paused behind
    an exit 2 (outside tester 106); a blank first message was taken as one."""
    if message is not None and _blank(message):
        print_error("--message is blank: give the words of the first message")
        raise typer.Exit(EXIT_USAGE)
    if any(_blank(r) for r in replies or ()):
        print_error("a --reply is blank: give the words to say (or --end to end the conversation)")
        raise typer.Exit(EXIT_USAGE)


def _blank(text: str) -> bool:
    from workflow_engine._input import is_blank

    return is_blank(text)


def _refuse_non_text(texts: list[tuple[str, str]]) -> None:
    """Exit 2 on the first argument or variable that is not text.

    argv arrives decoded with surrogateescape: a byte that was not UTF-8 becomes a lone
    surrogate, which no file name, SQLite query or terminal can take. Say so once."""
    from workflow_engine._input import InputError, check_text

    try:
        for what, text in texts:
            check_text(text, what)
    except InputError as exc:
        print_error(str(exc))
        raise SystemExit(EXIT_USAGE) from None


def main() -> None:
    """The console script: refuse what cannot be text before click parses it, then run."""
    prepare_output()
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        # A typed line that is not UTF-8 arrives with its bad bytes as lone surrogates, which
        # the prompts refuse (and ask again) instead of failing to decode the line at all.
        reconfigure(errors="surrogateescape")
    texts = [(f"argument {n}", argument) for n, argument in enumerate(sys.argv[1:], start=1)]
    texts += [
        (f"environment variable {name}", value)
        for name, value in os.environ.items()
        if name.startswith("WORKFLOW_ENGINE_")
    ]
    suspect = [(what, text) for what, text in texts if not text.isascii()]  # ASCII is always text
    if suspect:
        _refuse_non_text(suspect)
    _refuse_empty_db(sys.argv[1:])
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # a usage error: one line, like every other error
        code = _usage_error(exc)
    except typer.Abort:  # Ctrl-C or end of input at a click prompt
        print_error("aborted")
        code = EXIT_FAILED
    except SystemExit as done:
        code = done.code
        cause = done.__context__
        if code == 1 and isinstance(cause, OSError) and cause.errno == errno.EPIPE:
            # click or rich met a closed pipe printing their own output (--help, --version)
            # and exit 1; every other command stops quietly with 141 there (tester 94)
            discard_output()
            code = EXIT_BROKEN_PIPE
        raise SystemExit(flush_output(code)) from None
    except OSError as exc:  # click's own output (--help) failing, say
        failed = output_failed(exc)
        if failed is None:
            raise
        raise SystemExit(failed) from None
    raise SystemExit(flush_output(code if isinstance(code, int) else 0))


def _refuse_empty_db(argv: list[str]) -> None:
    """Exit 2 for a ``--db`` given empty: it was read as the current directory, and said to
    be one, exit 6 (outside tester 147)."""
    for index, word in enumerate(argv):
        if word == "--db=" or (word == "--db" and argv[index + 1 : index + 2] == [""]):
            print_error("--db needs the name of a file; it was given empty (see --help)")
            raise SystemExit(EXIT_USAGE)


def _usage_error(exc: typer.TyperException) -> int:
    """Print a usage error on one line of stderr, naming the command's ``--help``; its code.
    (A group called with nothing has shown its help already.)"""
    if type(exc).__name__ == "NoArgsIsHelpError":
        return EXIT_USAGE
    ctx = getattr(exc, "ctx", None)
    message = " ".join(exc.format_message().split())
    path = ctx.command_path if ctx is not None else _command_path(sys.argv[1:])
    print_error(f"{message} (see '{path} --help')")
    return EXIT_USAGE


def _command_path(argv: list[str]) -> str:
    """The command a command line names (``workflow-engine respond``), for errors click raises
    without saying which command it was parsing (an option missing its value)."""
    command: Any = typer.main.get_command(app)
    path = ["workflow-engine"]
    words = iter(argv)
    for word in words:
        if word == "--db":  # the one option before a command that takes a value
            next(words, None)
        elif not word.startswith("-"):
            sub = getattr(command, "commands", {}).get(word)
            if sub is None:
                break
            path.append(word)
            command = sub
    return " ".join(path)


LOG_LEVELS = ("debug", "info", "warning", "error")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(envvar="WORKFLOW_ENGINE_TOKEN", help="Bearer token clients must send."),
    ] = None,
    cors_origin: Annotated[
        list[str] | None, typer.Option("--cors-origin", help="Allow this browser origin.")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body accepted.")] = 1_000_000,
    log_level: Annotated[
        str,
        typer.Option(
            envvar="WORKFLOW_ENGINE_LOG_LEVEL",
            help="debug, info (with one access-log line per request), warning or error.",
        ),
    ] = "info",
    db: DbOption = None,
) -> None:
    """Serve the support demo (/support) and the banking agent (/banking) over AG-UI.

    Logs go to stderr through Python's logging: uvicorn's access log (uvicorn.access), the
    server's own messages (uvicorn.error) and the engine's (workflow_engine*) -- one
    format, one level. Needs the server extra: pip install 'workflow-engine\\[server]'.
    """
    import contextlib
    import logging

    if log_level.lower() not in LOG_LEVELS:
        print_error(f"--log-level must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}")
        raise typer.Exit(EXIT_USAGE)
    level = log_level.upper()

    try:
        import uvicorn

        from workflow_engine_agui._http import normalize_origin

        from ._server import create_app, is_loopback, token_problem, unmapped
    except ImportError as exc:
        print_error(
            f"serve needs the server extra ({exc.name or exc} is not installed): "
            "pip install 'workflow-engine[server]'"
        )
        raise typer.Exit(EXIT_USAGE) from None

    if not 0 <= port <= 65535:
        print_error(f"--port must be between 0 and 65535 (0: any free port), not {port}")
        raise typer.Exit(EXIT_USAGE)
    if token is not None and (problem := token_problem(token)) is not None:
        print_error(f"--token (or WORKFLOW_ENGINE_TOKEN) {problem}")
        raise typer.Exit(EXIT_USAGE)
    given = host
    if (problem := _host_problem(host)) is not None:
        print_error(f"--host {given!r} {problem}")
        raise typer.Exit(EXIT_USAGE)
    host = host.removeprefix("[").removesuffix("]")  # (an IPv6 address as URLs write it)
    try:
        family, address = _bind_address(host)
    except OSError as exc:
        print_error(f"cannot listen on {_in_url(host)}:{port}: {exc.strerror or exc}")
        raise typer.Exit(EXIT_CANNOT_LISTEN) from None
    bound_ip = unmapped(ipaddress.ip_address(address.partition("%")[0]))
    if (problem := _address_problem(bound_ip)) is not None:
        print_error(f"--host {given!r} {problem}")
        raise typer.Exit(EXIT_USAGE)
    if not bound_ip.is_loopback and not token:
        named = host if host == address else f"{host} ({address})"
        print_error(
            f"binding {named} exposes the server beyond this machine; "
            "set --token (or WORKFLOW_ENGINE_TOKEN)"
        )
        raise typer.Exit(EXIT_USAGE)
    for origin in cors_origin or []:
        if origin == "*" and not token:
            print_error("--cors-origin '*' lets every web page call the server; set --token too")
            raise typer.Exit(EXIT_USAGE)
        if origin != "*" and normalize_origin(origin) != origin:
            print_error(
                f"--cors-origin {origin!r} is not an origin as browsers send it: "
                "scheme://host[:port], lower case, no path or default port"
            )
            raise typer.Exit(EXIT_USAGE)
    if max_body_bytes < 1:
        print_error("--max-body-bytes must be at least 1")
        raise typer.Exit(EXIT_USAGE)
    _open_or_exit(db)
    _configure_logging(level)
    try:
        sock = _listen(family, address, port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print_error(
            f"cannot listen on {_in_url(host)}:{port}: {reason}"
            + (" (another server is using it; pick another --port)" if _in_use(exc) else "")
        )
        raise typer.Exit(EXIT_CANNOT_LISTEN) from None
    bound = sock.getsockname()[1]
    # without a token only loopback names are answered (DNS rebinding): a name that resolves to
    # loopback without being one (the machine's own, ``127.1``) is said as its address -- its
    # URL was logged and every POST to it refused (outside tester 203)
    named = host if token or is_loopback(host) else address
    try:
        app_ = create_app(db, token=token, cors_origins=cors_origin, max_body_bytes=max_body_bytes)
    except ModelConfigError as exc:
        sock.close()
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    config = uvicorn.Config(
        app_,
        log_config=None,
        log_level=level.lower(),
        access_log=True,
        backlog=LISTEN_BACKLOG,
    )
    tune_gc_for_a_server()
    import signal

    server = _patient_server(config, app_.state.agui_services)

    def stop(signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP and not server.should_exit:
            # its terminal closed: a log written there goes nowhere from now on (a file or a
            # pipe keeps it: it stopped at "startup complete" -- outside tester 171), and no
            # one is left to press Ctrl-C again: runs that have not paused within the grace
            # are stopped where they are, and a tool call that hung in a thread is left after
            # another
            _silence_the_terminal()
            _signal_later(STOP_GRACE_SECONDS, signal.SIGTERM)
            _signal_later(2 * STOP_GRACE_SECONDS, signal.SIGTERM)
        server.should_exit = True  # (before uvicorn's own handlers are in place, or after)

    # uvicorn shuts down gracefully on Ctrl-C or SIGTERM, then raises the signal again once
    # its own handlers are gone: that is a normal stop (SIGTERM killed the process, 143).
    # SIGHUP (the terminal it runs in closed; uvicorn leaves it alone) stops it the same way.
    # In place before the endpoints are logged: a process manager that reads them may stop
    # the server at once.
    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with contextlib.suppress(KeyboardInterrupt):
            logging.getLogger("workflow_engine.cli").info(
                "AG-UI endpoints: http://%s:%d/support and /banking", _in_url(named), bound
            )
            server.run(sockets=[sock])
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    logging.getLogger("workflow_engine.cli").info("stopped")


def _patient_server(config: Any, services: list[Any]) -> Any:
    """uvicorn's server, stopped by a second Ctrl-C without dropping what it does. uvicorn
    quits at once then: its connections and the runs they stream were torn down mid-step, two
    tracebacks logged, no client told, the store left unclosed. Here the second Ctrl-C (or
    SIGTERM) stops the runs where they are (each keeps its last checkpoint and gives its lease
    back; each client gets ``RUN_ERROR``) and the graceful stop goes on from there; a third
    Ctrl-C (or SIGTERM) quits the process at once (exit 130)."""
    import asyncio
    import logging

    import uvicorn

    class Server(uvicorn.Server):
        interrupting = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                super().handle_exit(sig, frame)  # the first: a graceful stop
            elif not self.interrupting:
                self.interrupting = True  # the second (Ctrl-C or SIGTERM): stop the runs now
                asyncio.get_running_loop().call_soon_threadsafe(self.interrupt_runs)
            else:
                # the third (Ctrl-C or SIGTERM): a run that did not stop is in a tool call in a
                # thread, which nothing can cut off; quit now, as a kill would (no traceback:
                # uvicorn's own forced exit tore the app down mid-request). Its lease lapses at
                # once on this host; the call is asked about when the run is continued.
                log = logging.getLogger("workflow_engine.cli")
                log.warning("quitting now: runs still executing stop where they are")
                for handler in logging.getLogger().handlers:
                    with contextlib.suppress(Exception):
                        handler.flush()
                os._exit(130)

        async def _wait_tasks_to_complete(self) -> None:
            """uvicorn waits for every connection to close; one that carries no run -- a
            client stalled mid-upload, or one that stopped reading its stream -- kept the
            server from stopping for as long as the client liked, no run in progress (outside
            tester 171). Once no run is executing, such connections get a grace, then are
            closed (by a watcher beside uvicorn's own wait, which says what it waits for)."""
            watcher = asyncio.get_running_loop().create_task(self._close_idle_connections())
            try:
                await super()._wait_tasks_to_complete()
            finally:
                watcher.cancel()

        async def _close_idle_connections(self) -> None:
            loop = asyncio.get_running_loop()
            idle_since: float | None = None
            while self.server_state.connections:
                if any(service.executing() for service in services):
                    idle_since = None
                elif idle_since is None:
                    idle_since = loop.time()
                elif loop.time() - idle_since >= IDLE_CONNECTIONS_GRACE:
                    left = list(self.server_state.connections)
                    logging.getLogger("workflow_engine.cli").info(
                        "closing %d connection(s) that carry no run (a client that stopped "
                        "sending or reading)",
                        len(left),
                    )
                    for connection in left:
                        transport = getattr(connection, "transport", None)
                        if transport is not None:
                            transport.abort()
                    return
                await asyncio.sleep(0.1)

        def interrupt_runs(self) -> None:
            stopped = sum(service.interrupt() for service in services)
            logging.getLogger("workflow_engine.cli").info(
                "interrupting %d run(s) at their last checkpoint (Ctrl-C or SIGTERM again "
                "quits now)",
                stopped,
            )

    return Server(config)


def _open_or_exit(db: Path | None) -> None:
    """Exit with one line (6) unless the database opens (created if new): a server started on
    a damaged or newer database would answer every request with an error."""
    from workflow_engine.storage import SqliteStore

    async def opened() -> int:
        store = SqliteStore(db)
        try:
            await store.open()
            await store.check_tables()
        finally:
            await store.close()
        return 0

    try:
        run_async(opened)
    except typer.Exit as stop:
        if stop.exit_code:
            raise


IDLE_CONNECTIONS_GRACE = 5.0
"""Seconds a stopping server keeps a connection that carries no run (see ``_patient_server``)."""

SERVER_GC_THRESHOLD = 10_000


def tune_gc_for_a_server() -> None:
    """A busy server keeps many runs' objects alive at once, and with Python's default the
    cyclic garbage collector walks all of them again and again (W5 with 2,000 runs in flight:
    about 40 % of the CPU, in full collections). A larger youngest generation lets short-lived
    objects die before they are promoted (measured there: +34-49 % runs/s); what start-up built
    is frozen out of every collection. Process-wide settings: the engine leaves them to the
    application, and ``serve`` is ours."""
    import gc

    gc.freeze()
    gc.set_threshold(SERVER_GC_THRESHOLD)


def _configure_logging(level: str) -> None:
    """One handler on stderr for everything: uvicorn's loggers propagate to it (uvicorn is
    given no logging config of its own)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
    )
    handler.addFilter(_says_what_ctrl_c_does)
    handler.addFilter(_model_calls_without_credentials)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


def _says_what_ctrl_c_does(record: Any) -> bool:
    """uvicorn's "Waiting for connections to close. (CTRL+C to force quit)" says what Ctrl-C
    does here: the second stops the runs where they are, only a third quits (see
    ``_patient_server``; it told a person that one more Ctrl-C quit: outside tester 156)."""
    if record.name == "uvicorn.error" and isinstance(record.msg, str):
        record.msg = record.msg.replace(
            "(CTRL+C to force quit)",
            "(Ctrl-C or SIGTERM again stops the runs at their last checkpoint; a third quits)",
        )
    return True


def _model_calls_without_credentials(record: Any) -> bool:
    """httpx's line for each call to the model endpoint, without the user and password written
    into it: logged at ``info``, once a call (outside tester 203)."""
    if record.name.startswith("httpx"):
        from workflow_engine._redaction import without_credentials

        record.msg, record.args = without_credentials(record.getMessage()), ()
    return True


LISTEN_BACKLOG = 2048
"""Connections the kernel queues before the server accepts them (uvicorn's default)."""


_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(?:\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")
_WITH_PORT = re.compile(r"[^:\[\]]*:[0-9]+|\[[^\]]*\]:[0-9]+")


def _host_problem(host: str) -> str | None:
    """What is wrong with ``--host`` as written (None: an IP address, IPv6 in brackets or not,
    or a host name). ``[::1`` reached the socket and was told "cannot listen on [[::1]",
    exit 7; ``127.0.0.1:8000`` was told it is no IPv6 address (outside testers 199, 200)."""
    if not host:
        return "is empty (0.0.0.0 binds every IPv4 interface, :: every IPv6 one)"
    if "://" in host:
        return "is a URL: give the host alone (e.g. 127.0.0.1), the port with --port"
    if _WITH_PORT.fullmatch(host):
        return "holds a port: give the host alone, the port with --port"
    bracketed = host.startswith("[") and host.endswith("]")
    inner = host[1:-1] if bracketed else host
    try:
        found = ipaddress.ip_address(inner)
    except ValueError:
        found = None
    if bracketed and (found is None or found.version != 6):
        return "is not an IPv6 address (brackets hold one, as in [::1])"
    if found is not None:
        return None
    if ":" in host or "[" in host or "]" in host:
        return "is not an IPv6 address (write it as ::1 or [::1])"
    name = host.removesuffix(".")  # (one trailing dot: the same name, fully qualified)
    if len(name) > 253 or _HOST_NAME.fullmatch(name) is None:
        return "is not an IP address or a host name"
    return None


def _bind_address(host: str) -> tuple[int, str]:
    """The address family and numeric address ``host`` is bound at: itself if it is one, else
    what the name resolves to -- an IPv4 address if it has one (``localhost``: 127.0.0.1, as
    before), else its IPv6 address (a name with an IPv6 address alone was bound as IPv4 and
    failed, outside tester 200). ``OSError`` if it resolves to nothing."""
    import socket

    try:
        found = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        pass
    else:
        return (socket.AF_INET6 if found.version == 6 else socket.AF_INET), host
    addresses = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    ordered = sorted(addresses, key=lambda a: a[0] != socket.AF_INET)
    family, address = ordered[0][0], str(ordered[0][4][0])
    return family, address


def _address_problem(found: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """An address no one can reach a server at (it was bound, and its URL logged)."""
    if found.is_multicast:
        return f"is a multicast address ({found}), not one of this machine's"
    if found == ipaddress.IPv4Address("255.255.255.255"):
        return "is the broadcast address, not one of this machine's"
    return None


def _in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # (an IPv6 address in a URL)


def _listen(family: int, address: str, port: int) -> socket.socket:
    """A listening socket for uvicorn, so that a busy port is our one-line error, not its exit
    3. It listens at once: a client that connects as soon as the endpoints are logged waits in
    the backlog while the app starts (opens its store), instead of being refused."""
    import socket

    # TCP by name: asyncio sets TCP_NODELAY on the connections of a listener whose protocol is
    # IPPROTO_TCP only -- with 0, Nagle's algorithm and the client's delayed ACK held every
    # response on a kept-alive connection about 40 ms (outside tester 190)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is ok
        sock.bind((address, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _in_use(exc: OSError) -> bool:
    return exc.errno == errno.EADDRINUSE


def _flow_help(group: typer.Typer) -> None:
    """Each command's help as flowing paragraphs. Typer keeps a docstring's line breaks, and
    rich wraps the lines at the terminal's width as well: at 80 columns a word or two was left
    alone on a line in the middle of a sentence."""
    for info in group.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        info.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in doc.split("\n\n"))
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _flow_help(sub.typer_instance)


_flow_help(app)
