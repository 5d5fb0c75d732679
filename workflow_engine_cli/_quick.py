"""``runs list``, ``requests list``, ``runs show`` and ``--version`` started in a fraction of the
time: without typer, the runtime or the event loop (and the listings without pydantic).

A listing is what a person runs most, and a fresh process spent most of a second importing what
the other commands need. This module takes the common forms of these commands (the options
they document, read as click reads them), reads the file through a read-only snapshot
(``SqliteReader``) and prints through ``_listing``, as the commands do; ``runs show`` works the
run out with the runtime's own functions (``run_info_of``, ``effects_cut_off``), building the
run's workflow if the command line builds it, as the command does, and says as it does that an
id names no run, several, or a request. Anything else -- help, a usage error, another command,
a database the snapshot does not read as it is (see ``reading_uri``) -- returns None before a
byte is printed, and the command line proper (``_app``) runs the command and says what it has
to say.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._exits import EXIT_DONE
from ._output import flush_output, output_failed

if TYPE_CHECKING:
    from workflow_engine.storage._reader import SqliteReader

_OPTIONS: dict[tuple[str, ...], dict[str, bool]] = {
    # option → whether it takes a value
    ("runs", "list"): {
        "--status": True,
        "--workflow": True,
        "--limit": True,
        "--db": True,
        "--json": False,
    },
    ("requests", "list"): {"--limit": True, "--db": True, "--json": False},
    ("runs", "show"): {"--db": True, "--json": False},
}
_ARGUMENTS = {("runs", "show"): 1}
"""How many arguments a command takes (a run id), before, between or after its options."""


class _NotQuick(Exception):
    """This listing is for the command line proper (before anything is printed)."""


def quick_read(argv: Sequence[str]) -> int | None:
    """Run ``argv`` (the arguments after the program's name) if it is a listing this module
    serves, and return its exit code; None, having printed nothing, for anything else."""
    if _asks_version(argv):
        return _printed(lambda: print(version_line()))
    parsed = _parse(argv)
    if parsed is None or not _all_text(argv) or not _store_settings_valid():
        return None
    # (loaded only now: ``--version`` loads nothing of the engine)
    from workflow_engine.storage._reader import SqliteReader, refused_before_reading

    command, options = parsed
    work_out = {("runs", "list"): _runs, ("requests", "list"): _requests, ("runs", "show"): _show}
    try:
        database = _database(options)
        refused = refused_before_reading(database)
    except Exception:  # (see below)
        return None
    if refused is not None:  # said as the store says it, without loading the store
        return _printed(lambda: _refused(refused))
    try:
        reader = SqliteReader.open(database)
        if reader is None:
            return None
        with reader:
            show = work_out[command](reader, options)
    except Exception:
        # _NotQuick, or what reading a database can raise (a lock, a damaged row, a file gone),
        # or a surprise in working out the list: nothing is printed yet, so the command line
        # proper runs the command, and says what is wrong in its own words
        return None
    return _printed(show)


def _refused(said: str) -> int:
    """The store's refusal of the database, said as the commands say it (exit 6)."""
    from ._exits import EXIT_STORAGE
    from ._output import print_error

    print_error(said)
    return EXIT_STORAGE


def _asks_version(argv: Sequence[str]) -> bool:
    """``--version``, beside at most a ``--db`` (which it ignores, as the command line proper
    does): with one, typer was loaded to say the same (outside tester 147)."""
    words = list(argv)
    if "--version" not in words:
        return False
    words.remove("--version")
    if not words:
        return True
    if len(words) == 1:
        return words[0].startswith("--db=") and words[0] != "--db="
    return len(words) == 2 and words[0] == "--db" and words[1] != ""


def version_line() -> str:
    """What ``--version`` prints."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("workflow-engine")
    except PackageNotFoundError:  # running from a source tree that was never installed
        installed = "unknown"
    return f"workflow-engine {installed}"


def _printed(show: Callable[[], int | None]) -> int:
    """Run ``show`` and flush: the exit code it says (None: done), or that of a reader gone
    or a full disk."""
    try:
        code = show()
    except OSError as exc:
        failed = output_failed(exc)
        if failed is None:
            raise
        return failed
    return int(flush_output(EXIT_DONE if code is None else code))


def _parse(argv: Sequence[str]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """(the command, the options given: ``before_db`` for a ``--db`` before the command, and
    ``arguments``) for the forms served; None for any other. As click reads them: an option
    given twice takes its last value."""
    words = list(argv)
    options: dict[str, Any] = {}
    while words and (words[0] == "--db" or words[0].startswith("--db=")):
        value, words = _value("--db", words)
        if value is None:
            return None
        options["before_db"] = value
    command = tuple(words[:2])
    known = _OPTIONS.get(command)
    if known is None:
        return None
    words = words[2:]
    arguments: list[str] = []
    while words:
        if not words[0].startswith("-"):  # (one that does: an option, or click's to refuse)
            arguments.append(words.pop(0))
            continue
        name = words[0].partition("=")[0]
        if name not in known:
            return None
        if known[name]:
            value, words = _value(name, words)
            if value is None:
                return None
            options[name] = value
        elif words[0] != name:  # ``--json=...``: click's error to give
            return None
        else:
            options[name] = True
            words = words[1:]
    if len(arguments) != _ARGUMENTS.get(command, 0):
        return None
    options["arguments"] = arguments
    return command, options


def _value(name: str, words: list[str]) -> tuple[str | None, list[str]]:
    """The value of option ``name`` at the head of ``words`` (``--name VALUE`` or
    ``--name=VALUE``) and the words after it; None for a value click would read otherwise
    or refuse, or that names no file: none, one that looks like an option, an empty
    ``--db``."""
    head = words[0]
    if head == name:
        value, rest = (words[1], words[2:]) if len(words) > 1 else (None, [])
    else:
        value, rest = head[len(name) + 1 :], words[1:]
    if value is None or value.startswith("-") or (name == "--db" and not value):
        return None, rest
    return value, rest


def _all_text(argv: Sequence[str]) -> bool:
    """Whether the arguments and the ``WORKFLOW_ENGINE_`` variables are all text: one that is
    not (bytes that were not UTF-8, arriving as lone surrogates) the command line proper
    refuses in its own words."""
    values = [value for name, value in os.environ.items() if name.startswith("WORKFLOW_ENGINE_")]
    for text in [*argv, *values]:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


def _store_settings_valid() -> bool:
    """Whether the store's settings from the environment are ones it takes: the store refuses
    any other as it opens (the command line proper says so), and a read must not hide that
    (tester 94)."""
    from workflow_engine.storage._location import synchronous_mode

    return synchronous_mode() is not None


def _database(options: dict[str, Any]) -> Path:
    """The file the command reads, and the ``--db`` the commands it prints repeat (as the
    command line proper sets them: ``_db_or_before``)."""
    from ._hints import DirectoryGone, Hints

    given = options.get("--db") or options.get("before_db")
    try:
        return Hints.database(Path(given) if given is not None else None)
    except (DirectoryGone, ValueError):  # (ValueError: UsageError, no default location)
        raise _NotQuick from None  # (the command line proper says so)


def _runs(reader: SqliteReader, options: dict[str, Any]) -> Callable[[], None]:
    """``runs list``, read and worked out; returns what prints it."""
    from ._listing import limited, person_status, runs_output, status_filter

    status, workflow = options.get("--status"), options.get("--workflow")
    json_mode = bool(options.get("--json"))
    try:
        state, shown_only = status_filter(status)
    except ValueError:
        raise _NotQuick from None  # (a usage error, said by the command line proper)
    # (``not_started``: runs no worker ever took; ``interrupted``: taken ones -- told apart by
    # the query, not by reading every run in progress: 0.8 s at 100,000, outside tester 122)
    started = None if shown_only is None else shown_only != "not_started"
    limit = _limit(options)
    if shown_only:  # (which are interrupted: whether their worker lives, asked here)
        runs, _ = reader.runs_by_update(state, workflow, started=started)
        runs = [r for r in runs if person_status(r) == shown_only]
        runs, left_out = limited(runs, limit, newest=True)
    else:
        runs, matched = reader.runs_by_update(state, workflow, started=started, last=limit or None)
        left_out = max(0, matched - limit) if limit else 0
    filtered = status is not None or workflow is not None
    # the answers waiting of the runs listed (of all of them, when all are)
    answered = reader.answered_counts([r.run_id for r in runs] if filtered else None)
    every = (
        reader.run_ids_beside([r.run_id for r in runs])
        if (filtered or left_out) and runs and not json_mode
        else None
    )
    return runs_output(
        runs, answered, every, filtered=filtered, json_mode=json_mode, left_out=left_out
    )


def _limit(options: dict[str, Any]) -> int | None:
    """``--limit``'s value; one click would refuse is for the command line proper to say."""
    given = options.get("--limit")
    if given is None:
        return None
    if not (given.isascii() and given.isdigit()) or int(given) > 2**63 - 1:
        raise _NotQuick  # (the command line proper says what --limit takes)
    return int(given)


def _requests(reader: SqliteReader, options: dict[str, Any]) -> Callable[[], None]:
    """``requests list``, read and worked out; returns what prints it."""
    from ._listing import (
        Pending,
        answered_to_apply,
        may_be_in_doubt,
        requests_json_output,
        requests_output,
    )

    limit = _limit(options)
    # (the first N alone read and decoded: all of them were, then cut -- 1.1 s for 20 at
    # 53,000 requests, outside tester 175)
    requests = reader.list_requests(status="pending", limit=limit or None)
    left_out = max(0, reader.count_requests("pending") - limit) if limit else 0
    runs: dict[str, Any] = {}
    if not limit and len({r.run_id for r in requests}) > 1:  # (one read for the runs asking:
        # not every resting run, most of which may have only answers waiting -- tester 122)
        runs = {run.run_id: run for run in reader.runs_with_pending()}

    def run_of(run_id: str) -> Any:
        if run_id not in runs:
            runs[run_id] = reader.get_run(run_id)
        if runs[run_id] is None:  # (a request of no run: the store's error says so)
            raise _NotQuick
        return runs[run_id]

    pending = [
        Pending(r.request_id, r.run_id, run_of(r.run_id).workflow_name, r.port_id, r.data)
        for r in requests
    ]
    if options.get("--json"):
        return requests_json_output(pending)
    # (not every run in progress: tester 122)
    interrupted = [r for r in reader.runs_journaled_past() if may_be_in_doubt(r)]
    in_doubt, read = [], 0
    for record in interrupted:  # (whether a step is in doubt takes folding its checkpoints)
        if limit and len(in_doubt) == limit:
            break  # (the rest counted, not read: outside tester 182)
        read += 1
        info = _run_info(reader, record.run_id, None)
        if info.effects_in_doubt:
            in_doubt.append(info)
    in_doubt_left = len(interrupted) - read
    waiting = []
    counts = reader.answered_counts()
    read = 0
    for run_id, count in counts.items():
        if limit and len(waiting) == limit:
            break  # the rest counted, not read (all were, and listed: outside tester 182)
        read += 1
        record = run_of(run_id)
        if answered_to_apply(record):
            waiting.append((record, count))
    request_ids = reader.request_ids_beside([p.request_id for p in pending])
    run_ids = reader.run_ids_beside([p.run_id for p in pending])
    answered_left = len(counts) - read
    return requests_output(
        pending,
        in_doubt,
        waiting,
        request_ids,
        run_ids,
        left_out=left_out,
        runs_left_out=(in_doubt_left, answered_left),
    )


def _show(reader: SqliteReader, options: dict[str, Any]) -> Callable[[], int | None]:
    """``runs show``, read and worked out; returns what prints it."""
    from workflow_engine._run_info import decoding_workflow

    from ._ids import lowered_hex
    from ._listing import run_output
    from ._registry import workflow_factory, workflow_names

    (given,) = options["arguments"]
    found = reader.run_and_latest(given) if given else None
    if found is None:  # a unique prefix, as the command reads it
        ids = reader.run_ids(given) if given else []
        lowered = lowered_hex(given) if not ids else None
        if lowered is not None:  # (hex in capitals: read as the command does, tester 122)
            found_lowered = reader.run_ids(lowered)
            given, ids = (lowered, found_lowered) if found_lowered else (given, ids)
        if len(ids) != 1:  # none or several: said as the command says it (its runtime took
            return _no_single_run(reader, given, ids, options)  # ~0.3 s: tester 208)
        found = reader.run_and_latest(ids[0])
        if found is None:
            raise _NotQuick
    record, checkpoint = found
    run_id = record.run_id
    workflow = None
    if record.workflow_name in workflow_names():  # (as ``_run_for`` registers it)
        built = workflow_factory(record.workflow_name)()
        workflow = decoding_workflow(built, record, checkpoint)
    info = _run_info(reader, run_id, workflow, found)
    history = reader.history(run_id)
    shown = [] if record.status.is_terminal else reader.list_requests(run_id, status="answered")
    return run_output(info, record, history, shown, json_mode=bool(options.get("--json")))


def _no_single_run(
    reader: SqliteReader, given: str, ids: list[str], options: dict[str, Any]
) -> Callable[[], int]:
    """What ``runs show`` says of an id that names no run, or several (``_app._full_run_id``)."""
    from ._exits import EXIT_NOT_FOUND, EXIT_USAGE
    from ._ids import AmbiguousIdError
    from ._output import print_error

    requests = reader.request_ids(given.lower()) if given and not ids else []
    asked = reader.get_request(requests[0]) if len(requests) == 1 else None
    if ids:
        said, code = str(AmbiguousIdError("run", given, ids)), EXIT_USAGE
    elif asked is not None:  # (said only for a request it names, whole or by a unique prefix)
        todo = "answer it with respond, then resume" if asked.status == "pending" else "resume"
        said = f"no run {given!r}: that is the id of a request of run {asked.run_id!r}; {todo}"
        said, code = f"{said} that run", EXIT_NOT_FOUND
    else:
        said, code = f"no run {given!r} in {_database(options)}", EXIT_NOT_FOUND

    def show() -> int:
        print_error(said)
        return code

    return show


def _run_info(
    reader: SqliteReader, run_id: str, workflow: Any, found: tuple[Any, Any] | None = None
) -> Any:
    """What ``Runtime.get_run`` says of the run (``found``: its record and latest checkpoint,
    read already), its steps in doubt too: the command line proper took ~0.3 s more to load
    the runtime for them (outside tester 208)."""
    import time

    from workflow_engine._run_info import effects_cut_off, may_have_effects_in_doubt, run_info_of

    found = found or reader.run_and_latest(run_id)
    if found is None:
        raise _NotQuick  # (gone meanwhile: the command line proper says so)
    record, checkpoint = found
    answered = []
    if checkpoint is not None and checkpoint.pending_requests:
        answered = [r.request_id for r in reader.list_requests(run_id, status="answered")]
    in_doubt = []
    if checkpoint is not None and may_have_effects_in_doubt(record, time.time()):
        entries = reader.journal_after(run_id, checkpoint.superstep)
        if entries:
            asked = reader.list_requests(run_id, status=None)
            in_doubt = effects_cut_off(checkpoint, entries, asked)
    stored = reader.list_requests(run_id) if checkpoint is not None and workflow is None else []
    return run_info_of(
        record,
        checkpoint,
        workflow,
        answered=answered,
        effects_in_doubt=in_doubt,
        stored_pending=stored,
    )
