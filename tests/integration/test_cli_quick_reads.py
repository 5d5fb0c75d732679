"""``runs list``, ``requests list``, ``runs show`` and ``--version`` start without the runtime
(``_quick``).

The quick path reads a read-only snapshot of the file and prints through the same code as the
commands proper; anything it does not serve (help, a usage error, a database that is missing,
damaged or of another schema) goes to the commands proper before a byte is printed. So the
promise is: for every command line and every database, the installed ``workflow-engine`` prints
exactly what the commands proper print, with the same exit code. Each case here runs both as
subprocesses and compares them, and checks in-process which path served it (a quick path that
quietly stopped serving would only be slow, not wrong: the check keeps it serving what it
should).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Never

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.cli_harness import ENGINE, Cli, base_env
from tests.integration.workflows import stepper_workflow
from workflow_engine import RequestPort, Runtime, WorkflowBuilder, WorkflowContext, executor
from workflow_engine.storage import SqliteStore
from workflow_engine_cli._hints import Hints
from workflow_engine_cli._quick import quick_read

pytestmark = pytest.mark.slow  # subprocesses of the CLI

PROPER = (
    "import sys; from workflow_engine_cli._app import main; sys.argv[0] = 'workflow-engine'; main()"
)
EFFECT_SCRIPT = Path(__file__).with_name("effect_edges_workflow.py")


@executor(id="ask")
async def ask(text: str, ctx: WorkflowContext[str]) -> None:
    await ctx.send_message(text)


@executor(id="noted")
async def noted(text: str, ctx: WorkflowContext[Never, str]) -> None:
    await ctx.yield_output(text)


@executor(id="boom")
async def boom(text: str, ctx: WorkflowContext[Never, str]) -> None:
    raise RuntimeError(f"cannot handle {text!r}")


def failing_workflow() -> Any:
    return WorkflowBuilder("failing", start=boom).build()


def asking_workflow() -> Any:
    """Asks a person for text: a request whose data is whatever text it was started with."""
    port = RequestPort("note", request_type=str, response_type=str)
    return WorkflowBuilder("asking", start=ask).add_edge(ask, port).add_edge(port, noted).build()


async def fill(db: Path) -> dict[str, str]:
    """Runs in every state a listing shows, of a workflow the command line does not build;
    their ids by what they are."""
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: stepper_workflow(name="stepper"))
    runtime.register(asking_workflow)
    runtime.register(failing_workflow)
    ids: dict[str, str] = {}
    try:
        ids["paused"] = (await runtime.run("stepper", 1)).run_id
        answered = await runtime.run("stepper", 1)
        await runtime.respond(answered.pending_requests[0].request_id, {"approved": True})
        ids["answered"] = answered.run_id
        for run_id in ("ffff-answered-later", "0000-answered-last"):  # (ids against the order)
            later = await runtime.run("stepper", 1, run_id=run_id)
            await runtime.respond(later.pending_requests[0].request_id, {"approved": True})
        finished = await runtime.run("stepper", 1)
        await runtime.respond(finished.pending_requests[0].request_id, {"approved": True})
        await runtime.resume(finished.run_id)
        ids["finished"] = finished.run_id
        cancelled = await runtime.run("stepper", 1)
        await runtime.cancel(cancelled.run_id)
        ids["cancelled"] = cancelled.run_id
        ids["not_started"] = await runtime.start("stepper", 1)
        ids["long"] = (await runtime.run("asking", "word " * 400)).run_id
        ids["odd"] = (await runtime.run("asking", "tab\there, ünïcode ✓, [markup]\x1b[31m")).run_id
        ids["failed"] = (await runtime.run("failing", "this")).run_id
        ids["forked"] = await runtime.fork(finished.run_id, superstep=1)
    finally:
        await runtime.close()
    return ids


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Named databases: ``full`` (every state, a demo run paused at its approval, a run with a
    step in doubt), ``empty`` (a store with no runs), and files the quick path leaves alone."""
    root = tmp_path_factory.mktemp("quick")
    cli = Cli(root / "full")
    cli.expect(0, "demo", "handoff")  # a workflow the command line builds, finished (outputs)
    cli.start_paused()  # and paused: it prints how to resume
    anyio.run(fill, cli.db)
    paths = {"full": cli.db}
    in_doubt = root / "in_doubt.db"
    started = subprocess.run(
        [sys.executable, str(EFFECT_SCRIPT), "start", str(in_doubt), str(root / "ledger.txt")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode == 3, started.stderr[-2000:]  # it died inside its effect
    paths["in_doubt"] = in_doubt
    paths["empty"] = root / "empty.db"
    anyio.run(_open_and_close, paths["empty"])
    paths["damaged"] = root / "damaged.db"
    anyio.run(fill, paths["damaged"])
    with contextlib.closing(sqlite3.connect(paths["damaged"])) as conn, conn:
        conn.execute("UPDATE runs SET status = 'sleeping' WHERE rowid = 2")
    paths["damaged_version"] = root / "damaged_version.db"
    anyio.run(fill, paths["damaged_version"])
    with contextlib.closing(sqlite3.connect(paths["damaged_version"])) as conn, conn:
        conn.execute("UPDATE runs SET version = -1 WHERE status = 'in_progress'")
    paths["damaged_superstep"] = root / "damaged_superstep.db"
    with (
        contextlib.closing(sqlite3.connect(in_doubt)) as source,
        contextlib.closing(sqlite3.connect(paths["damaged_superstep"])) as conn,
    ):
        source.backup(conn)  # (the WAL's pages too)
        with conn:
            conn.execute("UPDATE runs SET superstep = 'one' WHERE status = 'in_progress'")
    paths["damaged_answer"] = root / "damaged_answer.db"
    anyio.run(fill, paths["damaged_answer"])
    with contextlib.closing(sqlite3.connect(paths["damaged_answer"])) as conn, conn:
        conn.execute("UPDATE requests SET answer = '{not json' WHERE status = 'answered'")
    paths["foreign"] = root / "foreign.db"
    with contextlib.closing(sqlite3.connect(paths["foreign"])) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    paths["zero_bytes"] = root / "zero.db"
    paths["zero_bytes"].touch()
    paths["missing"] = root / "missing.db"
    paths["not_sqlite"] = root / "notes.txt"
    paths["not_sqlite"].write_text("these are notes, not a database\n")
    paths["tiny"] = root / "tiny.txt"
    paths["tiny"].write_text("notes")
    paths["one_byte"] = root / "one_byte.db"  # (``echo > file``; SQLite took it for a new one)
    paths["one_byte"].write_text("\n")
    paths["fifo"] = root / "a_fifo"
    os.mkfifo(paths["fifo"])
    paths["header_only"] = root / "header_only.db"  # (a SQLite header and nothing after it)
    paths["header_only"].write_bytes(b"SQLite format 3\x00")
    paths["directory"] = root / "a_folder"
    paths["directory"].mkdir()
    return paths


async def _open_and_close(db: Path) -> None:
    runtime = Runtime(SqliteStore(db))
    await runtime.list_runs()
    await runtime.close()


def env_for(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**base_env(Path(os.devnull)), **(extra or {})}


def both(argv: Sequence[str], env: dict[str, str]) -> tuple[Any, Any]:
    """(what the installed command printed, what the commands proper printed): each
    ``(exit code, stdout, stderr)``."""
    runs = []
    for command in ([str(ENGINE)], [sys.executable, "-c", PROPER]):
        proc = subprocess.run(
            [*command, *argv],
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        runs.append((proc.returncode, proc.stdout, proc.stderr))
    return runs[0], runs[1]


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def served_quickly(argv: Sequence[str], env: dict[str, str]) -> tuple[int | None, str]:
    """In this process: ``quick_read``'s code (None: left to the commands proper) and what it
    printed."""
    out = io.StringIO()
    try:
        with environment(env), contextlib.redirect_stdout(out):
            code = quick_read(list(argv))
    finally:
        Hints.db = ""  # (set from --db, as the command line sets it: not for the next test)
    return code, out.getvalue()


LISTINGS = [
    ["runs", "list"],
    ["runs", "list", "--json"],
    ["requests", "list"],
    ["requests", "list", "--json"],
    ["runs", "list", "--status", "interrupted"],
    ["runs", "list", "--status", "not_started"],
    ["runs", "list", "--status=idle_with_pending_requests"],
    ["runs", "list", "--status", "idle", "--json"],
    ["runs", "list", "--status", "Idle_With_Pending_Requests"],  # (as ids: capitals too)
    ["runs", "list", "--workflow", "stepper"],
    ["runs", "list", "--workflow=nosuch"],
    ["runs", "list", "--json", "--workflow", "asking", "--status", "idle_with_pending_requests"],
    ["runs", "list", "--limit", "2"],
    ["runs", "list", "--limit=1", "--json"],
    ["runs", "list", "--limit", "0"],
    ["requests", "list", "--limit", "1"],
    ["requests", "list", "--limit", "1", "--json"],
]


def test_a_limit_lists_the_newest_runs_and_the_oldest_requests(
    databases: dict[str, Path],
) -> None:
    """At 21,000 runs a listing took half a second and as many lines (outside tester 147):
    ``--limit N`` lists the N runs updated last, the N requests waiting longest, and says how
    many it left out."""
    db = str(databases["full"])
    runs = json.loads(served_quickly(["runs", "list", "--json", "--db", db], env_for())[1])
    asks = json.loads(served_quickly(["requests", "list", "--json", "--db", db], env_for())[1])
    assert len(runs) > 2 and len(asks) > 1
    code, printed = served_quickly(["runs", "list", "--limit", "2", "--db", db], env_for())
    lines = printed.splitlines()
    assert code == 0 and len(lines) == 4, printed  # the header, 2 runs, what was left out
    assert [line.split()[0] for line in lines[1:3]] == [
        r["run_id"][: len(lines[1].split()[0])] for r in runs[-2:]
    ]
    assert lines[3] == f"({len(runs) - 2:,} updated earlier not shown: --limit 0 lists them all)"
    code, printed = served_quickly(
        ["requests", "list", "--limit=1", "--json", "--db", db], env_for()
    )
    assert code == 0 and json.loads(printed) == asks[:1]


def test_the_run_updated_last_is_listed_last_and_kept_by_a_limit(tmp_path: Path) -> None:
    """``runs list`` was in the order the runs were created, under a column saying when each
    was updated, so ``--limit 1`` kept the run created last, called the run updated after it
    "older", and a week-old chat still going never showed (outside tester 175). Runs are
    listed by their last update, by both paths; ``requests list --limit`` reads only what
    it shows."""
    db = tmp_path / "runs.db"

    async def make() -> tuple[str, str]:
        runtime = Runtime(SqliteStore(db))
        runtime.register(asking_workflow)
        try:
            first = await runtime.run("asking", "first")
            second = await runtime.run("asking", "second")
            await runtime.run("asking", "third")
            await runtime.respond_and_resume(first.pending_requests[0].request_id, "done")
            return first.run_id, second.run_id
        finally:
            await runtime.close()

    first, second = anyio.run(make)
    env = env_for()
    for argv in (["runs", "list"], ["runs", "list", "--limit", "1"], ["requests", "list"]):
        quick, proper = both([*argv, "--db", str(db)], env)
        assert quick == proper and quick[0] == 0, (argv, quick, proper)
    code, printed = served_quickly(["runs", "list", "--json", "--db", str(db)], env)
    listed = [r["run_id"] for r in json.loads(printed)]
    assert code == 0 and listed[0] == second and listed[-1] == first, listed
    code, printed = served_quickly(["runs", "list", "--limit", "1", "--db", str(db)], env)
    lines = printed.splitlines()
    assert code == 0 and lines[1].split()[0] == first[: len(lines[1].split()[0])], printed
    assert lines[2] == "(2 updated earlier not shown: --limit 0 lists them all)", printed
    code, printed = served_quickly(["requests", "list", "--limit", "1", "--db", str(db)], env)
    assert code == 0 and "second" in printed and "third" not in printed, printed
    assert printed.splitlines()[-1] == "(1 newer not shown: --limit 0 lists them all)"


@pytest.mark.parametrize("argv", LISTINGS, ids=" ".join)
@pytest.mark.parametrize("where", ["after", "before", "environment"])
def test_a_listing_prints_what_the_command_proper_prints(
    databases: dict[str, Path], argv: list[str], where: str
) -> None:
    db = str(databases["full"])
    env = env_for({"WORKFLOW_ENGINE_DB": db} if where == "environment" else None)
    given = {
        "after": [*argv, "--db", db],
        "before": ["--db", db, *argv],
        "environment": argv,
    }[where]
    quick, proper = both(given, env)
    assert quick == proper
    assert quick[0] == 0, quick
    code, printed = served_quickly(given, env)
    assert code == 0 and printed == quick[1]


def test_the_full_database_shows_every_state(databases: dict[str, Path]) -> None:
    """What the comparisons above compare is the whole listing, not an empty one."""
    env = env_for()
    _, runs, _ = both(["runs", "list", "--db", str(databases["full"])], env)[0]
    for shown in ("idle_with_pending_requests, answered", "not_started", "cancelled", "idle"):
        assert shown in runs
    _, inbox, _ = both(["requests", "list", "--db", str(databases["full"])], env)[0]
    assert "approve submit_refund(" in inbox  # the demo's
    assert "more characters: --json shows all" in inbox  # the long one, cut
    assert "tab\\there" in inbox  # a control character shown escaped
    assert "has an answer to apply" in inbox and "its application can apply it" in inbox
    # runs with answers waiting, in the order they were asked (not by id)
    later, last = inbox.index("ffff-answered"), inbox.index("0000-answered")
    assert later < last, inbox


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("damaged", ["runs", "list"]),
        ("damaged", ["requests", "list"]),
        ("damaged", ["runs", "list", "--status", "idle"]),  # (the damaged one: said, not left out)
        # a damaged lease version is read by both filters, and said; not left out of both
        ("damaged_version", ["runs", "list", "--status", "interrupted"]),
        ("damaged_version", ["runs", "list", "--status", "not_started"]),
        ("damaged_superstep", ["requests", "list"]),  # (of a run journaled: said too)
        ("foreign", ["runs", "list"]),
        ("zero_bytes", ["requests", "list"]),
        ("missing", ["runs", "list"]),
        ("full", ["runs", "list", "--status", "sleeping"]),
        ("full", ["runs", "list", "--status="]),
        ("full", ["runs", "list", "--help"]),
        ("full", ["runs", "list", "--db"]),
        ("full", ["requests", "list", "--status", "idle"]),
        ("full", ["runs", "list", "--workflow", "-x"]),
    ],
    ids=lambda value: value if isinstance(value, str) else " ".join(value),
)
def test_what_the_quick_path_does_not_serve_is_left_to_the_commands(
    databases: dict[str, Path], name: str, argv: list[str]
) -> None:
    given = [*argv, "--db", str(databases[name])] if argv[-1] != "--db" else argv
    env = env_for()
    code, printed = served_quickly(given, env)
    assert code is None and printed == ""
    quick, proper = both(given, env)
    assert quick == proper
    assert "Traceback" not in quick[1] + quick[2]


@pytest.mark.parametrize(
    "name", ["not_sqlite", "tiny", "one_byte", "header_only", "directory", "fifo"]
)
@pytest.mark.parametrize(
    "argv", [["runs", "list"], ["requests", "list", "--json"], ["runs", "show", "abc"]]
)
def test_a_path_that_is_no_database_is_refused_quickly_as_the_commands_refuse_it(
    databases: dict[str, Path], name: str, argv: list[str]
) -> None:
    """A directory, or a file SQLite refuses as not a database: the command line proper
    loaded the store to say so (0.3-0.5 s, over the 300 ms a read-only command may take:
    outside testers 214, 217); the quick path says it, in the store's words."""
    given = [*argv, "--db", str(databases[name])]
    env = env_for()
    quick, proper = both(given, env)
    assert quick == proper and quick[0] == 6, (quick, proper)
    said = {"directory": "it is a directory", "fifo": "it is not a file"}
    assert said.get(name, "file is not a database") in quick[2], quick
    code, printed = served_quickly(given, env)
    assert code == 6 and printed == ""


def test_a_file_of_one_byte_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """SQLite takes a file of a byte (what ``echo > file`` leaves) for a new database: the
    reading commands said it had no tables, and ``demo`` wrote a database over it (outside
    tester 218). It is no database, and nothing is written to it."""
    path = tmp_path / "notes"
    path.write_text("\n")
    for command in (["runs", "list"], ["demo", "handoff", "--approve", "-m", "refund 12345"]):
        done = subprocess.run(
            [str(ENGINE), *command, "--db", str(path)],
            capture_output=True,
            text=True,
            env=env_for(),
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        assert done.returncode == 6, (command, done.stderr)
        assert done.stderr.strip().endswith("is damaged: file is not a database"), done.stderr
        assert path.read_text() == "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_a_device_is_no_database_for_any_command() -> None:
    """``--db /dev/null``: the commands that act on a run said it had no tables (exit 4),
    the others that it is not a file (exit 6: outside tester 219). Every one says the
    latter."""
    for command in (
        ["runs", "list"],
        ["respond", "abcd", "--approve"],
        ["resume", "abcd"],
        ["cancel", "abcd"],
    ):
        done = subprocess.run(
            [str(ENGINE), *command, "--db", "/dev/null"],
            capture_output=True,
            text=True,
            env=env_for(),
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        said = "error: cannot open the database /dev/null: it is not a file"
        assert (done.returncode, done.stderr.strip()) == (6, said), (command, done.stderr)


def test_a_damaged_answer_is_counted_in_listings_and_said_when_its_run_is_shown(
    databases: dict[str, Path],
) -> None:
    db = str(databases["damaged_answer"])
    code, runs, _ = both(["runs", "list", "--db", db], env_for())[0]
    assert code == 0 and "idle_with_pending_requests, answered" in runs, runs
    answered = [line.split()[0] for line in runs.splitlines() if ", answered" in line]
    code, _, said = both(["runs", "show", answered[0], "--db", db], env_for())[0]
    assert code != 0 and "is damaged" in said, said


# (what damages one run, the words that name it: every other run's requests are listed)
def filled_and_damaged(
    source_db: Path, tmp_path: Path, statement: str
) -> tuple[Path, dict[str, str]]:
    """A copy of ``source_db`` with runs in every state (``fill``), then damaged by
    ``statement`` (formatted with their ids); the copy and the ids."""
    db = tmp_path / "runs.db"
    with (
        contextlib.closing(sqlite3.connect(source_db)) as source,
        contextlib.closing(sqlite3.connect(db)) as conn,
    ):
        source.backup(conn)  # (the WAL's pages too)
    ids = anyio.run(fill, db)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        assert conn.execute(statement.format(**ids)).rowcount >= 1
    return db, ids


ONE_RUN_DAMAGED = {
    "a journal entry's value": ("UPDATE journal SET value = '{{bad'", "journal entry"),
    "a journal entry's key": ("UPDATE journal SET key = X'FF'", "journal entry's key"),
    "the interrupted run's row": (
        "UPDATE runs SET lease_expires_at = 'z' WHERE status = 'in_progress'",
        "lease_expires_at is damaged",
    ),
    "the row of a run with an answer waiting": (
        "UPDATE runs SET status = 'bogus' WHERE run_id = '{answered}'",
        "status is damaged",
    ),
    "a pending request's run row": (
        "DELETE FROM runs WHERE run_id = '{paused}'",
        "yet pending requests name it",
    ),
    "the id of a run with an answer waiting": (  # (exit 4, nothing listed: tester 141)
        "UPDATE runs SET run_id = 'x' || run_id WHERE run_id = '{answered}'",
        "yet stored answers name it",
    ),
}


@pytest.mark.slow  # four command lines per kind of damage
@pytest.mark.parametrize("damage", ONE_RUN_DAMAGED)
def test_one_damaged_run_hides_no_other_run_s_requests(
    databases: dict[str, Path], tmp_path: Path, damage: str
) -> None:
    """The inbox reads each interrupted run's journal to tell a step in doubt, and each run
    with answers waiting: one damaged row there failed the whole table, every other run's
    requests unshown, though ``--json`` (which does not look) listed them; a request whose run
    row was gone failed both, exit 4 (outside testers 133, 134). Each is said for its run, the
    rest listed, exit 6 as for a damaged request row."""
    statement, named = ONE_RUN_DAMAGED[damage]
    db, ids = filled_and_damaged(databases["in_doubt"], tmp_path, statement)
    for argv in (["requests", "list"], ["requests", "list", "--json"]):
        code, printed, said = both([*argv, "--db", str(db)], env_for())[0]
        assert "Traceback" not in said and "internal error" not in said, said
        assert ids["long"][:8] in printed, (argv, printed)
        if "--json" not in argv or "pending requests" in named:  # (--json reads no journal)
            assert code == 6 and named in said, (argv, code, said)


RUN_ROW_DAMAGED = {  # the damage, whose run, what names it
    "status": (
        "UPDATE runs SET status = 'bogus' WHERE run_id = '{answered}'",
        "answered",
        "run '{answered}': its status",
    ),
    "lease": (
        "UPDATE runs SET lease_expires_at = 'z' WHERE status = 'in_progress'",
        "not_started",
        "run '{not_started}': its lease",
    ),
    "name": (
        "UPDATE runs SET workflow_name = X'FF' WHERE run_id = '{finished}'",
        "finished",
        "run '{finished}': its workflow_name",
    ),
    "id": (  # (the id itself: the run cannot be read by it -- tester 140)
        "UPDATE runs SET run_id = CAST(X'FF' || run_id AS TEXT) WHERE run_id = '{finished}'",
        "finished",
        "its run_id is damaged",
    ),
}


@pytest.mark.slow  # four command lines per kind of damage
@pytest.mark.parametrize("damage", RUN_ROW_DAMAGED)
def test_one_damaged_run_row_hides_no_other_run(
    databases: dict[str, Path], tmp_path: Path, damage: str
) -> None:
    """``runs list`` named a run whose row is damaged and showed no other run (outside tester
    137), where the inbox lists every other run's requests: it lists the rest, and names the
    damaged run, exit 6."""
    statement, which, named = RUN_ROW_DAMAGED[damage]
    db, ids = filled_and_damaged(databases["empty"], tmp_path, statement)
    for argv in (["runs", "list"], ["runs", "list", "--json"]):
        code, printed, said = both([*argv, "--db", str(db)], env_for())[0]
        assert "Traceback" not in said and "internal error" not in said, said
        assert code == 6 and named.format(**ids) in said and "damaged" in said, (argv, said)
        for run_id in (ids["long"], ids["cancelled"], ids["paused"]):
            assert run_id[:8] in printed, (argv, run_id, printed)
        assert ids[which][:8] not in printed, (argv, printed)


def test_the_inbox_names_the_interrupted_run_with_a_step_in_doubt(
    databases: dict[str, Path],
) -> None:
    """Such runs are found in one query (every run in progress was read: 0.7 s at 20,000 never
    started, outside tester 122) and each is said -- by the quick path too, which folds their
    checkpoints and reads their journal as the runtime does (left to the command proper, the
    listing took ~0.3 s longer for one stale run in doubt: outside tester 208)."""
    (run_id,) = run_ids(databases["in_doubt"])
    argv = ["requests", "list", "--db", str(databases["in_doubt"])]
    quick, proper = both(argv, env_for())
    assert quick == proper
    code, printed, _ = quick
    assert code == 0 and f"interrupted: run {run_id}" in printed, printed
    assert "in doubt: " in printed, printed
    assert served_quickly(argv, env_for()) == (0, printed)


def test_a_limit_lists_as_many_runs_in_doubt_and_runs_answered_and_counts_the_rest(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """``requests list --limit N`` read and printed every interrupted run and every run with
    answers stored, whatever N: 3 s and 20,000 lines for ``--limit 1`` after a crash left
    5,000 runs in doubt (outside tester 182). N of each, and how many more."""
    db = tmp_path / "crashed.db"
    for _ in range(3):
        started = subprocess.run(
            [sys.executable, str(EFFECT_SCRIPT), "start", str(db), str(tmp_path / "ledger.txt")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert started.returncode == 3, started.stderr[-2000:]
    env = env_for()
    code, printed, _ = both(["requests", "list", "--limit", "1", "--db", str(db)], env)[1]
    assert code == 0 and printed.count("interrupted: run ") == 1, printed
    assert "(2 more interrupted runs not shown: --limit 0 lists them all)" in printed, printed
    code, printed, _ = both(["requests", "list", "--limit", "2", "--db", str(db)], env)[1]
    assert printed.count("interrupted: run ") == 2 and "(1 more interrupted run" in printed
    code, printed, _ = both(["requests", "list", "--db", str(db)], env)[1]
    assert printed.count("interrupted: run ") == 3 and "not shown" not in printed, printed
    # a run stopped after its step's result was journaled has no step in doubt (the result is
    # replayed): not one of those left out (it was counted: outside tester 186)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            'UPDATE journal SET value = \'{"value": "charged"}\' WHERE run_id = '
            "(SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1)"
        )
    code, printed, _ = both(["requests", "list", "--limit", "1", "--db", str(db)], env)[1]
    assert printed.count("interrupted: run ") == 1, printed
    assert "(1 more interrupted run not shown: --limit 0 lists them all)" in printed, printed
    full = ["requests", "list", "--limit", "1", "--db", str(databases["full"])]
    quick, proper = both(full, env)
    assert quick == proper and quick[0] == 0
    assert proper[1].count("answered: ") == 1, proper[1]
    assert "(2 more runs with answers stored not read: --limit 0" in proper[1], proper[1]


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("in_doubt", ["runs", "list"]),  # a run in doubt lists as interrupted: no fold needed
        ("in_doubt", ["runs", "list", "--status", "interrupted"]),
        ("in_doubt", ["runs", "list", "--status", "not_started", "--json"]),
        ("in_doubt", ["requests", "list", "--json"]),
        ("empty", ["runs", "list"]),
        ("empty", ["requests", "list"]),
        # answers waiting are counted, not read: a damaged one failed every listing of runs
        # (it is said when that run is acted on)
        ("damaged_answer", ["runs", "list"]),
        ("damaged_answer", ["runs", "list", "--status", "idle_with_pending_requests"]),
        ("damaged_answer", ["requests", "list"]),
        ("empty", ["runs", "list", "--status", "idle"]),
    ],
    ids=lambda value: value if isinstance(value, str) else " ".join(value),
)
def test_other_databases_are_served_and_print_the_same(
    databases: dict[str, Path], name: str, argv: list[str]
) -> None:
    given = [*argv, "--db", str(databases[name])]
    env = env_for()
    quick, proper = both(given, env)
    assert quick == proper and quick[0] == 0
    code, printed = served_quickly(given, env)
    assert code == 0 and printed == quick[1]


def run_ids(db: Path) -> list[str]:
    """The runs stored in ``db``, oldest first."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [row[0] for row in conn.execute("SELECT run_id FROM runs ORDER BY created_at")]


def request_ids(db: Path) -> list[str]:
    """The requests stored in ``db``, oldest first."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        query = "SELECT request_id FROM requests ORDER BY created_at"
        return [row[0] for row in conn.execute(query)]


def test_runs_show_prints_what_the_command_proper_prints(databases: dict[str, Path]) -> None:
    """Every run of the full database, by its id and by a prefix, as text and as JSON: among
    them runs the command line builds (their values decoded) and runs it does not."""
    db = str(databases["full"])
    env = env_for()
    shown = ""
    for run_id in run_ids(databases["full"]):
        typed = [["runs", "show", run_id[:10].upper(), "--db", db]]  # hex in capitals
        for argv in (
            ["runs", "show", run_id, "--db", db],
            ["--db", db, "runs", "show", "--json", run_id[:12]],
            *(typed if run_id.isalnum() else []),  # (the engine's own ids: hex)
        ):
            quick, proper = both(argv, env)
            assert quick == proper, argv
            assert quick[0] == 0, quick
            assert served_quickly(argv, env) == (0, quick[1]), argv
            shown += quick[1]
    for said in (
        "(ToolApprovalRequestContent: approve submit_refund(",  # the demo's request, decoded
        "output: conversation completed (last agent: refund_agent)",  # the demo's output
        "note: workflow 'stepper' is not built here",
        "answered: ",
        "its application can apply it",
        "not started: ",
        "forked from: ",
        "failed with: ",
        '"decoded": true',
        '"decoded": false',
    ):
        assert said in shown, said


def test_runs_show_leaves_to_the_command_what_it_does_not_work_out(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """A run id missing, two, or a damaged run: left before a byte is printed, and what the
    command says is the same. A run with a step in doubt, and an id that names no run, several,
    or a request, are served as the command serves them (left to it, they took ~0.3 s longer:
    outside testers 208, 210)."""
    full = str(databases["full"])
    many = tmp_path / "many.db"
    anyio.run(_many_runs, many, 40)
    first = [run_id[0] for run_id in run_ids(many)]
    shared = next(c for c in sorted(set(first)) if first.count(c) > 1)  # (40 ids, 16 letters)
    in_doubt = databases["in_doubt"]
    damaged = run_ids(databases["damaged"])[1]  # (the row made unreadable)
    some, other = run_ids(databases["full"])[:2]
    served = [  # (the command line, the exit code the command gives)
        (["runs", "show", run_ids(in_doubt)[0], "--db", str(in_doubt)], 0),
        (["runs", "show", "nosuchrun", "--db", full], 4),
        (["runs", "show", shared, "--db", str(many)], 2),
        (["runs", "show", shared.upper(), "--db", str(many)], 2),
        (["runs", "show", "", "--db", full], 4),
        (["runs", "show", request_ids(databases["full"])[0][:10], "--db", full], 4),
    ]
    for argv, code in served:
        quick, proper = both(argv, env_for())
        assert quick == proper, argv
        assert quick[0] == code, (argv, quick)
        assert served_quickly(argv, env_for()) == (code, quick[1]), argv
    assert "`resume` asks whether it happened" in both(served[0][0], env_for())[0][1]
    cases = [  # (the command line, the exit code the command gives)
        (["runs", "show", "--db", full], 2),
        (["runs", "show", some, other, "--db", full], 2),
        (["runs", "show", "--", some, "--db", full], 2),
        (["runs", "show", some, "--db", full, "--status", "idle"], 2),
        (["runs", "show", damaged, "--db", str(databases["damaged"])], 6),
        (["runs", "show", some, "--db", str(databases["missing"])], 4),
    ]
    for argv, code in cases:
        assert served_quickly(argv, env_for()) == (None, ""), argv
        quick, proper = both(argv, env_for())
        assert quick == proper, argv
        assert quick[0] == code, (argv, quick)
        assert "Traceback" not in quick[1] + quick[2], argv


def test_an_application_s_question_about_a_step_in_doubt_shows_as_that_question(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """Resumed by its application, the run asks whether its step happened. The command line
    does not build that workflow, so its values show as stored; but the question is the
    engine's own, and it showed as ``waiting: ID (at pay)`` (tester 94). Both paths now say
    what is asked, and what to look the effect up by."""
    db = copy_of(databases, tmp_path)
    # the file and its WAL: the process that made it was killed, and what it wrote may be in
    # the WAL yet (the file alone then had no tables: "no such table: runs", now and then)
    db.write_bytes(databases["in_doubt"].read_bytes())
    wal = Path(f"{databases['in_doubt']}-wal")
    if wal.exists():
        Path(f"{db}-wal").write_bytes(wal.read_bytes())
    run_id = run_ids(db)[0]
    ledger = str(tmp_path / "ledger.txt")
    resumed = subprocess.run(
        [sys.executable, str(EFFECT_SCRIPT), "resume", str(db), ledger, run_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert json.loads(resumed.stdout) == {
        "status": "idle_with_pending_requests",
        "asked": ["InDoubtEffect"],
    }, resumed.stderr[-2000:]
    argv = ["runs", "show", run_id, "--db", str(db)]
    assert served_quickly(argv, env_for())[0] == 0
    quick, proper = both(argv, env_for())
    assert quick == proper and quick[0] == 0, quick
    waiting = [line for line in quick[1].splitlines() if line.startswith("waiting: ")]
    assert len(waiting) == 1 and waiting[0].endswith(" (InDoubtEffect)"), quick[1]
    assert 'pay\'s step charge ("the charge") started before the run stopped' in quick[1]
    assert "idempotency key" in quick[1] or "look it up" in quick[1], quick[1]


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "list", "--json", "--json"],
        ["runs", "list", "--status", "idle", "--status", "idle_with_pending_requests"],
        ["runs", "list", "--workflow="],
        ["runs", "list", "--workflow", "nosuch", "--workflow", "stepper"],
        ["--db", "elsewhere.db", "--db", "DB", "runs", "list", "--db", "other.db", "--db", "DB"],
    ],
    ids=" ".join,
)
def test_an_option_given_twice_or_empty_is_served_as_click_reads_it(
    databases: dict[str, Path], argv: list[str]
) -> None:
    """Its last value counts; an empty one is a value (tester 93: these went to the command
    line proper, which writes to the file as it opens it as a store)."""
    db = str(databases["full"])
    given = [word.replace("DB", db) for word in argv]
    if "--db" not in given:
        given += ["--db", db]
    quick, proper = both(given, env_for())
    assert quick == proper and quick[0] == 0, quick
    assert served_quickly(given, env_for()) == (0, quick[1])


def test_a_sync_setting_the_store_refuses_is_left_to_the_commands(
    databases: dict[str, Path],
) -> None:
    """The store refuses it as it opens; a read served without the store hid that (tester 94)."""
    env = env_for({"WORKFLOW_ENGINE_SQLITE_SYNC": "bogus"})
    for argv in (["runs", "list"], ["requests", "list"]):
        given = [*argv, "--db", str(databases["full"])]
        assert served_quickly(given, env) == (None, "")
        quick, proper = both(given, env)
        assert quick == proper and quick[0] != 0 and "NORMAL or FULL" in quick[2]
    assert (
        served_quickly(
            ["runs", "list", "--db", str(databases["full"])],
            env_for({"WORKFLOW_ENGINE_SQLITE_SYNC": "full"}),
        )[0]
        == 0
    )


@pytest.mark.parametrize(
    "argv", [["--version"], ["--db", "x.db", "--version"], ["--version", "--db=x.db"]]
)
def test_the_version_is_served_quickly(argv: list[str]) -> None:
    """Beside a ``--db`` too (it loaded typer to say the same: outside tester 147)."""
    quick, proper = both(argv, env_for())
    assert quick == proper and quick[0] == 0
    assert quick[1].startswith("workflow-engine ")
    assert served_quickly(argv, env_for()) == (0, quick[1])


@pytest.mark.parametrize(
    "argv",
    [["runs", "list", "--db", ""], ["--db=", "requests", "list"], ["--db", "", "--version"]],
)
def test_an_empty_db_is_a_usage_error(argv: list[str]) -> None:
    """It was read as the current directory and said to be one, exit 6 (outside tester
    147)."""
    quick, proper = both(argv, env_for())
    assert quick == proper and quick[0] == 2, quick
    assert "--db needs the name of a file; it was given empty" in quick[2]


@pytest.mark.parametrize("listing", ["runs", "requests"])
@pytest.mark.parametrize("limit", ["9223372036854775808", "99999999999999999999"])
def test_a_limit_past_what_the_store_counts_is_a_usage_error(
    databases: dict[str, Path], listing: str, limit: str
) -> None:
    """SQLite said "datatype mismatch", exit 6, as if the database were damaged (outside
    tester 180)."""
    argv = [listing, "list", "--limit", limit, "--db", str(databases["full"])]
    quick, proper = both(argv, env_for())
    assert quick == proper and quick[0] == 2, quick
    assert "less than or equal to 9223372036854775807" in quick[2], quick[2]


def test_a_quick_listing_writes_nothing_beside_the_database(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """The snapshot is read-only: no WAL or shared-memory file is left, the file unchanged."""
    db = tmp_path / "copy.db"
    db.write_bytes(databases["full"].read_bytes())
    before = db.read_bytes()
    for argv in (["runs", "list"], ["requests", "list"]):
        assert served_quickly([*argv, "--db", str(db)], env_for())[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db"]
    assert db.read_bytes() == before


async def _many_runs(db: Path, count: int) -> None:
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: stepper_workflow(name="stepper"))
    try:
        for _ in range(count):
            await runtime.start("stepper", 1)
    finally:
        await runtime.close()


def test_a_reader_that_goes_away_ends_a_quick_listing_quietly(tmp_path: Path) -> None:
    """``| head -c 1``: exit 141 without a word, as the commands proper end. (1,500 runs list
    in ~100 KB, more than a pipe holds: the write after head has gone fails.)"""
    db = tmp_path / "many.db"
    anyio.run(_many_runs, db, 1500)
    for argv in (["runs", "list", "--db", str(db)], ["runs", "list", "--json", "--db", str(db)]):
        shell = f"{ENGINE} {' '.join(argv)} | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}"
        proc = subprocess.run(
            ["bash", "-c", shell], capture_output=True, text=True, env=env_for(), timeout=60
        )
        assert (proc.returncode, proc.stderr) == (141, ""), proc
        assert served_quickly(argv, env_for())[0] == 0  # (it was the quick path that ended)


def _drain(fd: int, into: list[bytes]) -> None:
    """Read ``fd`` to its end, into ``into``."""
    into.extend(iter(partial(os.read, fd, 65536), b""))


def test_output_to_a_pipe_made_non_blocking_meanwhile_is_all_written(tmp_path: Path) -> None:
    """A process sharing the pipe turns ``O_NONBLOCK`` on while the command writes into it (the
    flag belongs to the pipe, not to one process): Python's buffered stdout dropped what did
    not fit, and the command exited 0 (tester 95). 1,500 runs are about 100 KB, more than a
    pipe holds: the command is blocked writing when the flag changes."""
    db = tmp_path / "many.db"
    anyio.run(_many_runs, db, 1500)
    argv = ["runs", "list", "--json", "--db", str(db)]
    expected = both(argv, env_for())[0]
    assert expected[0] == 0 and len(expected[1]) > 100_000
    for command in ([str(ENGINE)], [sys.executable, "-c", PROPER]):
        read, write = os.pipe()  # (``write`` stays open here: the child shares its flags)
        proc = subprocess.Popen([*command, *argv], stdout=write, env=env_for())
        time.sleep(1.0)  # (it fills the pipe and waits in write)
        os.set_blocking(write, False)
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(read, chunks))
        reader.start()
        code = proc.wait(timeout=60)
        os.close(write)
        reader.join(timeout=60)
        os.close(read)
        assert code == 0, command
        assert b"".join(chunks).decode() == expected[1], command


WORDS = st.sampled_from(
    [
        "runs",
        "requests",
        "list",
        "show",
        "--json",
        "--status",
        "--status=idle",
        "interrupted",
        "--workflow",
        "stepper",
        "--db",
        "DB",
        "--db=DB",
        "--help",
        "--version",
        "-x",
        "",
        "RUN",
        "RUNPREFIX",
        "--",
    ]
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    head=st.sampled_from(
        [[], ["runs", "list"], ["requests", "list"], ["runs", "show"], ["--db", "DB"]]
    ),
    tail=st.lists(WORDS, max_size=5),
)
def test_any_command_line_prints_what_the_commands_proper_print(
    databases: dict[str, Path], head: list[str], tail: list[str]
) -> None:
    db = str(databases["full"])
    run_id = run_ids(databases["full"])[-1]
    names = {"DB": db, "RUN": run_id, "RUNPREFIX": run_id[:6]}
    argv = [names.get(word, word) for word in [*head, *tail]]
    argv = [f"--db={db}" if word == "--db=DB" else word for word in argv]
    quick, proper = both(argv, env_for())
    assert quick == proper, json.dumps(argv)


def test_another_program_s_database_in_wal_mode_is_left_as_it_was(tmp_path: Path) -> None:
    """Refused as not ours, with no WAL or shared-memory file left beside it: a read-only
    connection could not remove those it made (they were left by every listing)."""
    foreign = tmp_path / "customers.db"
    with contextlib.closing(sqlite3.connect(foreign)) as conn, conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE customers (name TEXT)")
        conn.execute("INSERT INTO customers VALUES ('bob')")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["customers.db"]
    for argv in (["runs", "list"], ["requests", "list"], ["runs", "show", "abc"]):
        quick, proper = both([*argv, "--db", str(foreign)], env_for())
        assert quick == proper and quick[0] == 4, quick
        assert "another program's tables (customers)" in quick[2]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["customers.db"], argv
    with contextlib.closing(sqlite3.connect(foreign)) as conn:
        assert conn.execute("SELECT name FROM customers").fetchall() == [("bob",)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_snapshot_never_creates_a_missing_file(tmp_path: Path) -> None:
    """The snapshot opens an existing file only: SQLite creates a missing one by default."""
    from workflow_engine.storage._reader import SqliteReader, query_only_uri

    gone = tmp_path / "gone.db"
    gone.touch()
    uri = query_only_uri(gone)
    gone.unlink()
    with pytest.raises(sqlite3.OperationalError):
        sqlite3.connect(uri, uri=True).close()
    assert not gone.exists()
    assert SqliteReader.open(gone) is None and not gone.exists()


# --- files and processes around the database (outside tester 92) -------------------------------

KILLED_WRITER = """
import os, signal, sys
import anyio
from tests.integration.workflows import stepper_workflow
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

async def main():
    runtime = Runtime(SqliteStore(sys.argv[1]))
    runtime.register(lambda: stepper_workflow(name="stepper"))
    for _ in range(3):
        await runtime.run("stepper", 1)
    os.kill(os.getpid(), signal.SIGKILL)  # its WAL stays beside the file, not yet folded in

anyio.run(main)
"""
ROOT = Path(__file__).resolve().parents[2]


def as_a_user(argv: Sequence[str], *, proper: bool = True) -> tuple[Any, Any]:
    """``both`` (or the installed command alone), as a user without root's power over file
    permissions (``setpriv``: the tests run as root here, for whom every file is writable)."""
    user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    runs: list[Any] = [None, None]
    commands = ([str(ENGINE)], [sys.executable, "-c", PROPER])
    for n, command in enumerate(commands if proper else commands[:1]):
        proc = subprocess.run(
            [*user, *command, *argv],
            capture_output=True,
            text=True,
            env=env_for(),
            timeout=60,
            check=False,
        )
        runs[n] = (proc.returncode, proc.stdout, proc.stderr)
    return runs[0], runs[1]


def copy_of(databases: dict[str, Path], tmp_path: Path, name: str = "runs.db") -> Path:
    db = tmp_path / name
    db.write_bytes(databases["full"].read_bytes())
    return db


@pytest.mark.parametrize("through", ["its path", "a symlink"])
def test_a_killed_writer_s_wal_is_read_and_left_as_it_was(
    databases: dict[str, Path], tmp_path: Path, through: str
) -> None:
    """An ordinary connection closing last would fold the WAL into the file and remove it: the
    listing would write to the database it promises only to read. Through a symlink in another
    folder too: the WAL was looked for beside the link (tester 94)."""
    db = copy_of(databases, tmp_path)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(db)], cwd=ROOT, timeout=60, check=False
    )
    assert killed.returncode == -9

    def files() -> dict[str, bytes]:  # (-shm is shared memory: readers mark it as they read)
        return {p.name: b"" if "-shm" in p.name else p.read_bytes() for p in tmp_path.iterdir()}

    before = files()
    assert sorted(before) == ["runs.db", "runs.db-shm", "runs.db-wal"]
    assert len(before["runs.db-wal"]) > 0
    named = db
    if through == "a symlink":
        named = tmp_path.parent / f"{tmp_path.name}-link" / "runs.db"
        named.parent.mkdir()
        named.symlink_to(db)
    _, listed = served_quickly(["runs", "list", "--db", str(databases["full"])], env_for())
    code, printed = served_quickly(["runs", "list", "--db", str(named)], env_for())
    assert code == 0
    assert printed.count("\n") == listed.count("\n") + 3  # with the runs only the WAL holds
    assert files() == before


def test_a_file_no_one_may_write_is_read_without_leaving_files_beside_it(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """A read-only connection left -wal and -shm files no one could write either; once the
    file was writable again, every write failed on them ("attempt to write a readonly
    database") until they were deleted by hand."""
    db = copy_of(databases, tmp_path)
    db.chmod(0o444)
    try:
        for argv in (["runs", "list"], ["requests", "list"]):
            quick, _ = as_a_user([*argv, "--db", str(db)], proper=False)
            assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"], argv
            # (the command line proper, as root, who may write it: what it shows is the same)
            assert (quick, served_quickly([*argv, "--db", str(db)], env_for())[0]) == (
                both([*argv, "--db", str(db)], env_for())[1],
                0,
            )
    finally:
        db.chmod(0o644)


def test_a_file_this_user_may_not_write_is_refused_by_the_store_without_leaving_files(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """What writes (a resume) opened the file as a store: SQLite opened it read-only and left
    -wal and -shm files of this user's beside it, which stopped its owner's next write (tester
    94). The store now refuses it first, naming the user and the owner. What only reads -- the
    quick path, and what it leaves to the commands proper (an id of no run), with a read-only
    store since tester 132 -- reads a file no one may write as it is (immutable)."""
    db = copy_of(databases, tmp_path)
    db.chmod(0o444)
    try:
        for argv in (["runs", "show", "nosuch"], ["resume", "nosuch"], ["requests", "list"]):
            quick, proper = as_a_user([*argv, "--db", str(db)])
            assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"], argv
            if argv[0] == "requests":  # (served as it is, see above)
                assert quick[0] == 0, quick
                continue
            assert quick == proper
            if argv[0] == "runs":
                assert quick[0] == 4, quick
                assert "no run 'nosuch'" in quick[2], quick
                continue
            assert quick[0] == 6, quick
            # (its owner is this user, root without its power over permissions)
            assert "it is read-only (no write permission for its owner, this user)" in quick[2]
            assert "Traceback" not in quick[2]
    finally:
        db.chmod(0o644)


def test_a_symlink_to_a_database_in_a_folder_this_user_cannot_write_names_that_folder(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """The store checked the folder of the link, not of the file it names, where SQLite keeps
    the -wal and -shm files: SQLite's "attempt to write a readonly database" instead of the
    store's line naming the folder (tester 95)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    db = copy_of(databases, folder)
    link = tmp_path / "link.db"
    link.symlink_to(db)
    folder.chmod(0o555)
    try:
        quick, proper = as_a_user(["runs", "show", "nosuch", "--db", str(link)])
    finally:
        folder.chmod(0o755)
    assert quick == proper and quick[0] == 6, quick
    assert f"directory {folder} is not writable" in quick[2], quick


def test_a_database_out_of_wal_mode_or_with_views_for_tables_is_left_to_the_store(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """Another program switched it to a rollback journal (the store switches it back, waiting
    for that program's lock), or replaced a table by a view (the store says it is damaged)."""
    journal = copy_of(databases, tmp_path, "journal.db")
    with contextlib.closing(sqlite3.connect(journal)) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    viewed = copy_of(databases, tmp_path, "viewed.db")
    with contextlib.closing(sqlite3.connect(viewed)) as conn, conn:
        conn.execute("ALTER TABLE requests RENAME TO requests_old")
        conn.execute("CREATE VIEW requests AS SELECT * FROM requests_old")
    for db in (journal, viewed):
        argv = ["requests", "list", "--db", str(db)]
        assert served_quickly(argv, env_for()) == (None, "")
        quick, proper = both(argv, env_for())
        assert quick == proper
    assert "damaged" in quick[2] and quick[0] == 6


def test_a_lease_held_by_an_impossible_process_lists_the_run_as_interrupted(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """A process id beyond any (damage, or another tool's writing) raised OverflowError while
    telling whether its holder lives: a traceback from the listing, an internal error from
    the command line proper."""
    from workflow_engine import default_owner

    db = copy_of(databases, tmp_path)
    owner = f"{default_owner().partition(':')[0]}:18446744073709551617:x:y"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "UPDATE runs SET status = 'in_progress', owner = ?, version = 3, "
            "lease_expires_at = strftime('%s', 'now') + 3600 WHERE rowid = 1",
            (owner,),
        )
    for argv in (["runs", "list"], ["runs", "list", "--status", "interrupted", "--json"]):
        quick, proper = both([*argv, "--db", str(db)], env_for())
        assert quick == proper and quick[0] == 0, quick
        assert "interrupted" in quick[1] or '"worker": null' in quick[1]


def test_a_closed_standard_output_is_one_error_line(databases: dict[str, Path]) -> None:
    """``>&-``: Python gives no stdout at all, and printing failed with a traceback."""
    db = str(databases["full"])
    for argv in (["runs", "list", "--db", db], ["--version"], ["runs", "show", "x", "--db", db]):
        for command in (str(ENGINE), f"{sys.executable} -c {PROPER!r}"):
            proc = subprocess.run(
                ["bash", "-c", f"{command} {' '.join(argv)} >&-"],
                capture_output=True,
                text=True,
                env=env_for(),
                timeout=60,
                check=False,
            )
            if "show" in argv:  # (its error comes first: no run x)
                assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc
                continue
            assert proc.returncode == 1, proc
            assert proc.stderr == "error: cannot write the output: standard output is closed\n"


def test_a_database_in_a_folder_this_user_cannot_write_is_left_to_the_store(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """The store refuses it (SQLite keeps -wal and -shm beside a database even to read it); a
    listing read it when those files were there (a worker had it open). Run as a user
    without root's power over permissions (``setpriv``), as the test runs as root here."""
    folder = tmp_path / "locked"
    folder.mkdir()
    db = copy_of(databases, folder)
    (folder / "runs.db-wal").write_bytes(b"")  # as beside a database a worker has open
    folder.chmod(0o555)
    try:
        results = as_a_user(["runs", "list", "--db", str(db)])
    finally:
        folder.chmod(0o755)
    assert results[0] == results[1]
    assert results[0][0] == 6 and "is not writable" in results[0][2], results[0]


def test_a_path_that_is_not_ascii_is_still_served_quickly(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    db = copy_of(databases, tmp_path, "josé ✓.db")
    argv = ["runs", "list", "--workflow", "stepper", "--db", str(db)]
    code, printed = served_quickly(argv, env_for())
    assert code == 0
    quick, proper = both(argv, env_for())
    assert quick == proper and quick[1] == printed


def test_a_wal_without_its_shared_memory_file_is_left_to_the_store(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    """Reading it would make a -shm file and leave it (tester 93)."""
    db = copy_of(databases, tmp_path)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(db)], cwd=ROOT, timeout=60, check=False
    )
    assert killed.returncode == -9
    Path(f"{db}-shm").unlink()
    argv = ["runs", "list", "--db", str(db)]
    assert served_quickly(argv, env_for()) == (None, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db", "runs.db-wal"]
    quick, proper = both(argv, env_for())
    assert quick == proper and quick[0] == 0


def test_a_table_s_short_ids_are_unique_among_ids_it_does_not_show(tmp_path: Path) -> None:
    """A table shows each id's shortest unique prefix among every id stored, yet reads only
    the ids beside those it shows (it read every id: 0.9 s for 12 pending requests among
    100,000 finished runs, outside tester 119). Here the ids it does not show -- a finished
    run's, an applied request's -- share all but the last characters with the shown ones."""
    db = tmp_path / "runs.db"

    async def fill_sharing() -> tuple[str, str]:
        runtime = Runtime(SqliteStore(db))
        runtime.register(lambda: stepper_workflow(name="stepper"))
        try:
            done = await runtime.run("stepper", 1, run_id="shared-prefix-run-b")
            await runtime.respond(done.pending_requests[0].request_id, {"approved": True})
            await runtime.resume(done.run_id)
            paused = await runtime.run("stepper", 1, run_id="shared-prefix-run-a")
            return paused.run_id, paused.pending_requests[0].request_id
        finally:
            await runtime.close()

    run_id, request_id = anyio.run(fill_sharing)
    rival = request_id[:20] + ("0" if request_id[20] != "0" else "1") + request_id[21:]
    with sqlite3.connect(db) as raw:  # an applied request whose id differs at character 21
        columns = [row[1] for row in raw.execute("PRAGMA table_info(requests)")]
        row = dict(
            zip(
                columns,
                raw.execute(
                    "SELECT * FROM requests WHERE request_id = ?", (request_id,)
                ).fetchone(),
                strict=True,
            )
        )
        row.update(request_id=rival, status="applied")
        marks = ", ".join("?" for _ in columns)
        raw.execute(f"INSERT INTO requests VALUES ({marks})", [row[c] for c in columns])
    env = env_for()
    for argv in (
        ["requests", "list", "--db", str(db)],
        ["runs", "list", "--status", "idle_with_pending_requests", "--db", str(db)],
    ):
        quick, proper = both(argv, env)
        assert quick == proper
        assert quick[0] == 0, quick
        shown = quick[1]
        assert run_id in shown  # (its whole id: all but the last character is shared)
        if argv[0] == "requests":
            assert f"{request_id[:21]} " in shown and f"{request_id[:20]} " not in shown


def test_a_damaged_request_leaves_the_others_listed_oldest_first(tmp_path: Path) -> None:
    """With one request row damaged, the others were read run by run and listed in the order
    of the runs' ids: ``--limit 2`` showed two of them at random and called the older ones it
    left out "newer" (outside tester 186). They are listed waiting longest first."""
    db = tmp_path / "runs.db"

    async def make() -> None:
        runtime = Runtime(SqliteStore(db))
        runtime.register(asking_workflow)
        try:
            for word in ("first", "second", "third", "fourth", "fifth"):
                await runtime.run("asking", word)
        finally:
            await runtime.close()

    anyio.run(make)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "UPDATE requests SET status = 'wat' WHERE request_id = "
            "(SELECT request_id FROM requests ORDER BY created_at DESC LIMIT 1)"
        )
    code, printed, said = both(["requests", "list", "--limit", "2", "--db", str(db)], env_for())[1]
    assert code == 6 and "damaged" in said, said
    shown = [w for w in ("first", "second", "third", "fourth") if w in printed]
    assert shown == ["first", "second"], printed
