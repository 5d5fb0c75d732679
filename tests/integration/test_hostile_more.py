"""Hostile input, second report: what an outside tester still broke after the first round.

Each test is one finding, run the way a user meets it: the installed ``workflow-engine`` as a
subprocess (raw bytes on its stdin, a pipe closed under it, ``/dev/full``), and a real
``workflow-engine serve`` spoken to over HTTP. The rules checked everywhere:

* never a traceback (stderr, server log) and never a 5xx;
* a refusal changes nothing -- the database's rows, read raw with sqlite3, are byte-for-byte
  the same before and after;
* a damaged record is a ``StoreCorruptError`` naming the run and the record: one ``error:``
  line and exit 6 on the command line, ``RUN_ERROR`` ``store_corrupt`` from the server;
* one-line errors with documented exit codes: 2 bad input, 6 storage, 141 a closed pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from ag_ui.core import EventType

from tests.integration.agui_harness import Client, Server, Stream, resolved, run_input, user
from tests.integration.cli_harness import ENGINE, TIMEOUT, Cli, Result
from tests.integration.hostile_harness import corrupt_request_data, default_server, server_log_clean
from tests.integration.workflows import stepper_workflow
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

REFUND = "I want a refund for order 12345"
DEEP = "[" * 100_000  # json.loads recurses once per "[": this is a RecursionError for it
CONTROL = ("\x1b", "\x07", "\x00", "\r", "\u2028", "\x85")


# --- helpers --------------------------------------------------------------------------------------


def raw_state(db: Path) -> tuple[Any, ...]:
    """Every row of every table, as sqlite3 reads it (bytes for text, so nothing fails to
    decode): what "nothing changed" means."""
    conn = sqlite3.connect(db)
    try:
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        conn.text_factory = bytes
        return tuple(
            (t, sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr))
            for t in sorted(tables)
        )
    finally:
        conn.close()


def execute(db: Path, sql: str, params: Sequence[Any] = ()) -> None:
    """Damage the database the way a hand edit, a buggy tool or a bad disk would."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            for statement in sql.split(";"):  # (statements apart: no ";" inside one)
                conn.execute(statement, params)
    finally:
        conn.close()


def run(
    cli: Cli,
    args: Sequence[str],
    *,
    stdin: bytes = b"",
    stdout: Any = subprocess.PIPE,
    db: bool = True,
) -> Result:
    """``workflow-engine ARGS --db DB`` with ``stdin`` as its input (a pipe, not a terminal)."""
    proc = subprocess.run(
        [str(ENGINE), *args, *(["--db", str(cli.db)] if db else [])],
        input=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=cli.env,
        cwd=cli.cwd,
        timeout=TIMEOUT,
        check=False,
    )
    out = proc.stdout.decode("utf-8", "replace") if proc.stdout is not None else ""
    return Result(tuple(args), proc.returncode, out, proc.stderr.decode("utf-8", "replace"))


def copy_of(base: Cli, tmp_path: Path) -> Cli:
    """A new CLI whose database is a copy of ``base``'s."""
    cli = Cli(tmp_path)
    shutil.copy(base.db, cli.db)
    return cli


def thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def refused_stream(stream: Stream, code: str) -> str:
    """The stream is exactly RUN_STARTED + RUN_ERROR with ``code``; its message."""
    assert [e.type for e in stream.events] == [EventType.RUN_STARTED, EventType.RUN_ERROR], (
        stream.describe()
    )
    assert stream.error_code == code, stream.describe()
    return stream.last.message


def ledger(server: Server, thread_id: str) -> list[dict[str, Any]]:
    path = Path(server.env["WORKFLOW_ENGINE_DEMO_LEDGER"])
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [e for e in lines if f"support:{thread_id}/" in str(e["key"])]


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, str, str, str]:
    """A database with two demo runs paused at their approvals: (cli, run, request, other run).
    Tests damage copies of it."""
    cli = Cli(tmp_path_factory.mktemp("hostile-more"))
    run_id, request_id = cli.start_paused()
    other, _ = cli.start_paused("My order 67890 arrived broken, I want a refund")
    return cli, run_id, request_id, other


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with default_server(tmp_path_factory.mktemp("hostile-more-server")) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    yield Client(server.url)
    server_log_clean(server)


def pause(client: Client, thread_id: str) -> Any:
    [interrupt] = client.start("/support", thread_id, REFUND).interrupts
    assert interrupt.reason == "tool_call"
    return interrupt


# --- 1. a bearer token that is not ASCII ---------------------------------------------------------


def test_a_bearer_header_that_is_not_ascii_is_a_401_not_a_500(tmp_path: Path) -> None:
    """``secrets.compare_digest`` raised TypeError on a non-ASCII str: a 500 and a traceback."""
    db, log = tmp_path / "runs.db", tmp_path / "server.log"
    with Server(db=db, log=log, args=["--token", "s3cret"]) as server:
        body = json.dumps(run_input(thread(), [user(REFUND)])).encode()
        before = raw_state(db) if db.exists() else None
        for value in (
            "Bearer s3cr\u00e9t".encode(),  # UTF-8 bytes: a latin-1 str to Starlette
            b"Bearer \xff",
            b"Bearer s3cret\xff",
            b"Bearer s3cre",
            b"Basic s3cret",
            b"s3cret",
        ):
            answer = httpx.post(
                f"{server.url}/support",
                content=body,
                headers={"content-type": "application/json", "authorization": value},
                timeout=30,
            )
            assert answer.status_code == 401, (value, answer.text)
            assert answer.json() == {  # (a message as every other refusal has: tester 153)
                "error": "unauthorized",
                "message": "this server needs its token: Authorization: Bearer <token>",
            }
        assert (raw_state(db) if db.exists() else None) == before
        ok = Client(server.url, token="s3cret").start("/support", thread(), "Hello")
        assert ok.finished.outcome is not None
        for scheme in (b"bearer", b"BEARER"):  # a scheme's name is case-insensitive (RFC 7235)
            started = httpx.post(
                f"{server.url}/support",
                content=json.dumps(run_input(thread(), [user("Hello")])).encode(),
                headers={"content-type": "application/json", "authorization": scheme + b" s3cret"},
                timeout=30,
            )
            assert started.status_code == 200 and "RUN_FINISHED" in started.text, scheme
        server_log_clean(server)


@pytest.mark.parametrize(
    ("token", "env", "mentions"),
    [
        ("s3cr\u00e9t", False, "not ASCII"),
        ("s3cr\u00e9t", True, "not ASCII"),
        ("   ", False, "whitespace"),
        ("", False, "empty"),
        ("a\tb", True, "control character"),
        (" s3cret", False, "whitespace"),
    ],
)
def test_a_token_clients_could_not_send_is_refused_at_start(
    tmp_path: Path, token: str, env: bool, mentions: str
) -> None:
    cli = Cli(tmp_path)
    args = ["serve", "--port", "0"] + ([] if env else ["--token", token])
    if env:
        cli.env["WORKFLOW_ENGINE_TOKEN"] = token
    result = cli.run(*args)
    assert result.code == 2, str(result)
    line = result.error_line()
    assert "--token" in line and mentions in line, line


# --- 2. a port out of range ---------------------------------------------------------------------


@pytest.mark.parametrize("port", ["70000", "-1", "65536", "99999999999999999999"])
def test_a_port_out_of_range_is_one_line_exit_2(tmp_path: Path, port: str) -> None:
    """``serve --port 70000`` was an OverflowError traceback and exit 1."""
    result = Cli(tmp_path).run("serve", f"--port={port}")
    assert result.code == 2, str(result)
    assert "between 0 and 65535" in result.error_line()


# --- 3. deeply nested JSON in stored columns ----------------------------------------------------

DEEP_COLUMNS: dict[str, tuple[str, list[list[str]]]] = {
    "requests.data": (
        "UPDATE requests SET data = :deep WHERE run_id = :run",
        [["requests", "list"], ["respond", "{request}", "--approve"]],
    ),
    "requests.answer": (
        "UPDATE requests SET answer = :deep, status = 'answered', answered_at = 1.0 "
        "WHERE run_id = :run",
        [["resume", "{run}"], ["respond", "{request}", "--approve"]],
    ),
    "runs.error": (
        "UPDATE runs SET error = :deep WHERE run_id = :run",
        [["runs", "list"], ["runs", "show", "{run}"], ["resume", "{run}"]],
    ),
}


@pytest.mark.parametrize("column", list(DEEP_COLUMNS))
def test_deeply_nested_stored_json_is_store_corrupt_exit_6(
    base: tuple[Cli, str, str, str], tmp_path: Path, column: str
) -> None:
    """It was a RecursionError: "internal error", exit 1."""
    source, run_id, request_id, _ = base
    cli = copy_of(source, tmp_path)
    sql, commands = DEEP_COLUMNS[column]
    execute(cli.db, sql, {"deep": DEEP, "run": run_id})
    before = raw_state(cli.db)
    for command in commands:
        args = [a.replace("{run}", run_id).replace("{request}", request_id) for a in command]
        result = run(cli, args)
        assert result.code == 6, str(result)
        line = result.error_line()
        assert run_id in line and "nested more than" in line and "damaged" in line, line
        assert raw_state(cli.db) == before, str(result)


# --- 4. columns of the wrong type ---------------------------------------------------------------

BAD_COLUMNS: dict[str, tuple[str, list[list[str]], str]] = {
    # one bad row used to break `runs list` for the whole database
    "runs.status": (
        "UPDATE runs SET status = 'bogus' WHERE run_id = :run",
        [["runs", "list"], ["runs", "show", "{run}"], ["resume", "{run}"], ["cancel", "{run}"]],
        "'bogus' is not a run state",
    ),
    "runs.version": (
        "UPDATE runs SET version = 'x' WHERE run_id = :run",
        [["resume", "{run}"], ["cancel", "{run}"]],
        "lease version",
    ),
    "runs.lease": (
        "UPDATE runs SET owner = 'x', lease_expires_at = 'soon' WHERE run_id = :run",
        [["resume", "{run}"], ["cancel", "{run}"]],
        "'soon' is not a time",
    ),
    "runs.error": (
        "UPDATE runs SET error = '5' WHERE run_id = :run",
        [["runs", "show", "{run}"]],
        "recorded error",
    ),
    "runs.error without a message": (
        'UPDATE runs SET error = \'{"code": "x"}\' WHERE run_id = :run',
        [["runs", "show", "{run}"], ["runs", "show", "{run}", "--json"]],
        "recorded error",
    ),
    "runs.created_at": (
        "UPDATE runs SET created_at = 'abc' WHERE run_id = :run",
        [["runs", "list"], ["runs", "list", "--json"]],
        "'abc' is not a time",
    ),
    "runs.updated_at past any calendar": (
        # a float, but no date: `runs list` failed on it with an internal error, exit 1
        "UPDATE runs SET updated_at = 1e300 WHERE run_id = :run",
        [["runs", "list"], ["runs", "list", "--json"], ["runs", "show", "{run}"]],
        "1e+300 is not a time",
    ),
    "runs.workflow_name not UTF-8": (
        "UPDATE runs SET workflow_name = CAST(X'73FF' AS TEXT) WHERE run_id = :run",
        [["runs", "list"], ["runs", "show", "{run}"]],
        "not UTF-8",
    ),
    "checkpoints deleted": (
        "DELETE FROM checkpoints WHERE run_id = :run",
        [["cancel", "{run}"], ["resume", "{run}"], ["runs", "show", "{run}"]],
        "is missing",
    ),
    "runs.latest_checkpoint_id NULL": (
        # the step ran (an approved tool call), then its commit was refused, exit 5, "fork":
        # on every resume (outside tester 138)
        "UPDATE runs SET latest_checkpoint_id = NULL WHERE run_id = :run",
        [["resume", "{run}"], ["runs", "show", "{run}"]],
        "names no latest checkpoint",
    ),
    "runs.latest_checkpoint_id NULL, its checkpoints gone": (
        # cancel: "internal error: AssertionError", exit 1, and the row written (tester 140)
        "DELETE FROM checkpoints WHERE run_id = :run; "
        "UPDATE runs SET latest_checkpoint_id = NULL WHERE run_id = :run",
        [["cancel", "{run}"], ["resume", "{run}"], ["runs", "show", "{run}"]],
        "names no latest checkpoint, nor is one stored",
    ),
    "runs.run_no NULL": (
        # said as its latest checkpoint missing, which was stored (tester 140)
        "UPDATE runs SET run_no = NULL WHERE run_id = :run",
        [["cancel", "{run}"], ["resume", "{run}"], ["runs", "show", "{run}"]],
        "its run_no is damaged",
    ),
    "runs.latest_checkpoint_id an older one": (
        "UPDATE runs SET latest_checkpoint_id = (SELECT checkpoint_id FROM checkpoints WHERE "
        "run_id = :run AND seq = 0) WHERE run_id = :run",
        [["resume", "{run}"], ["runs", "show", "{run}"]],
        "is not its newest stored",
    ),
    "checkpoint body not UTF-8": (
        "UPDATE checkpoints SET body = CAST(X'7BFF7D' AS TEXT) WHERE run_id = :run",
        [["runs", "show", "{run}"], ["resume", "{run}"]],
        "not UTF-8",
    ),
    "checkpoint status": (
        "UPDATE checkpoints SET status = 'odd' WHERE run_id = :run",
        [["runs", "show", "{run}"]],
        "'odd' is not a run state",
    ),
    "requests.status": (
        "UPDATE requests SET status = 'weird' WHERE run_id = :run",
        [["respond", "{request}", "--approve"]],
        "'weird' is not a status",
    ),
    "requests.superstep": (
        "UPDATE requests SET superstep = 'x' WHERE run_id = :run",
        [["requests", "list"], ["respond", "{request}", "--approve"]],
        "superstep",
    ),
}


@pytest.mark.parametrize("column", list(BAD_COLUMNS))
def test_a_column_of_the_wrong_type_is_store_corrupt_naming_the_run(
    base: tuple[Cli, str, str, str], tmp_path: Path, column: str
) -> None:
    """ValueError, TypeError, AttributeError or a bare AssertionError before: exit 1."""
    source, run_id, request_id, other = base
    cli = copy_of(source, tmp_path)
    sql, commands, mentions = BAD_COLUMNS[column]
    execute(cli.db, sql, {"run": run_id})
    before = raw_state(cli.db)
    for command in commands:
        args = [a.replace("{run}", run_id).replace("{request}", request_id) for a in command]
        result = run(cli, args)
        assert result.code == 6, str(result)
        line = result.error_line()
        assert run_id in line and mentions in line, line
        assert other not in line  # the damaged run is named, not the healthy one
        assert raw_state(cli.db) == before, str(result)
    # the healthy run is still usable
    assert run(cli, ["runs", "show", other]).code == 0


def test_a_schema_version_that_is_not_a_number_names_the_database(
    base: tuple[Cli, str, str, str], tmp_path: Path
) -> None:
    """``we_schema.version = 'x'``: a TypeError on every command before."""
    source, run_id, _, _ = base
    cli = copy_of(source, tmp_path)
    execute(cli.db, "UPDATE we_schema SET version = 'x'")
    before = raw_state(cli.db)
    for command in (["runs", "list"], ["runs", "show", run_id], ["requests", "list"]):
        result = run(cli, command)
        assert result.code == 6, str(result)
        line = result.error_line()
        assert str(cli.db) in line and "schema version" in line and "'x'" in line, line
    assert raw_state(cli.db) == before


def test_the_server_reports_a_wrongly_typed_run_as_store_corrupt(
    client: Client, server: Server
) -> None:
    thread_id = thread()
    pause(client, thread_id)
    run_id = f"support:{thread_id}/0"
    for sql in (
        "UPDATE runs SET status = 'bogus' WHERE run_id = ?",
        "UPDATE runs SET created_at = 'abc', status = 'idle_with_pending_requests' "
        "WHERE run_id = ?",
    ):
        execute(server.db, sql, (run_id,))
        before = raw_state(server.db)
        message = refused_stream(client.start("/support", thread_id, "Hello?"), "store_corrupt")
        assert run_id in message
        assert raw_state(server.db) == before


# --- 3 (server). deep JSON read back by the server ---------------------------------------------


@pytest.mark.parametrize("column", ["requests.data", "requests.answer", "runs.error"])
def test_the_server_reports_deep_stored_json_as_store_corrupt(
    client: Client, server: Server, column: str
) -> None:
    """An internal_error and a traceback in the log before."""
    thread_id = thread()
    interrupt = pause(client, thread_id)
    answer = resolved(interrupt.id, {"accepted": False})
    client.resume("/support", thread_id, answer)  # answered and applied: a repeat reads it
    run_id = f"support:{thread_id}/0"
    table, _, name = column.partition(".")
    execute(server.db, f"UPDATE {table} SET {name} = ? WHERE run_id = ?", (DEEP, run_id))
    before = raw_state(server.db)
    if column == "runs.error":
        stream = client.start("/support", thread_id, "Hello?")
    else:
        stream = client.resume("/support", thread_id, answer)
    message = refused_stream(stream, "store_corrupt")
    assert run_id in message and "nested more than" in message
    assert raw_state(server.db) == before


# --- 5. control characters in ids ---------------------------------------------------------------

HOSTILE_THREADS = [
    "ctl\x1b[31mred",
    "ctl\x07bell",
    "ctl\x00nul",
    "ctl\r\nerror: forged",
    "ctl\u2028sep",
    "ctl\x85next",
]


def test_control_characters_in_ids_never_reach_the_terminal(tmp_path: Path) -> None:
    """The server takes any text as a threadId; the command line printed such run ids raw in
    the "ambiguous prefix" error (an ESC sequence recoloured the terminal, a CR/LF forged a
    line). Every id it prints is escaped as repr does, in errors and tables alike."""
    with Server(db=tmp_path / "runs.db", log=tmp_path / "server.log") as server:
        client = Client(server.url)
        for thread_id in HOSTILE_THREADS:
            client.start("/support", thread_id, "Hello")
        log = server_log_clean(server)
    # a thread id cannot write a line of its own into the server's log (its run id was logged
    # raw: a client could forge whole log lines)
    assert not [line for line in log.splitlines() if line.startswith("error: forged")], log

    def forges_no_line(result: Result) -> Result:
        assert not [x for x in result.out.splitlines() if x.startswith("error: forged")], result
        return result

    cli = Cli(tmp_path / "cli")
    cli.db = server.db

    def clean(result: Result) -> Result:
        for char in CONTROL:
            assert char not in result.out + result.err, (char, str(result))
        return result

    for command in (["runs", "show", "support:ctl"], ["cancel", "support:ctl"]):
        result = clean(run(cli, command))
        assert result.code == 2, str(result)
        line = result.error_line()
        assert "is ambiguous: 6 runs start with it" in line
        assert "support:ctl\\x1b[31mred/0" in line and "support:ctl\\r\\nerror: forged/0" in line
        assert "support:ctl\\x00nul/0" in line and "support:ctl\\u2028sep/0" in line
    listing = clean(run(cli, ["runs", "list"]))
    # a table shows an id as an error line does: escaped, so it can be typed back
    assert listing.code == 0 and "support:ctl\\x1b" in listing.out, str(listing)
    clean(run(cli, ["requests", "list"]))
    shown = clean(run(cli, ["runs", "show", "support:ctl\x1b[31mred/0"]))
    assert shown.code == 0, str(shown)
    forges_no_line(clean(run(cli, ["runs", "show", "support:ctl\r\nerror: forged/0"])))
    cancelled = forges_no_line(clean(run(cli, ["cancel", "support:ctl\r\nerror: forged/0"])))
    assert cancelled.code == 0 and cancelled.out.startswith("Run support:ctl"), str(cancelled)
    missing = clean(run(cli, ["runs", "show", "no\x1b[2Jsuch"]))
    assert missing.code == 4 and "no\\x1b[2Jsuch" in missing.error_line()


def test_an_id_with_whitespace_at_either_end_is_shown_quoted(tmp_path: Path) -> None:
    """A run id ``"  lead"`` (any text is an id through the API) was shown as ``lead`` in
    ``runs list``, ``requests list`` and ``runs show`` (outside tester 155): typed back, it
    named no run. It is shown quoted, as it can be typed back."""

    async def two_runs() -> None:
        rt = Runtime(SqliteStore(tmp_path / "runs.db"))
        rt.register(stepper_workflow)
        for run_id in ("  lead", "trail "):
            await rt.run("stepper", 1, run_id=run_id)
        await rt.close()

    anyio.run(two_runs)
    cli = Cli(tmp_path / "cli")
    cli.db = tmp_path / "runs.db"
    for command in (["runs", "list"], ["requests", "list"]):
        listed = run(cli, command)
        assert listed.code == 0 and "'  lead'" in listed.out, str(listed)
        assert "'trail '" in listed.out, str(listed)
    shown = run(cli, ["runs", "show", "  lead"])
    assert shown.code == 0 and shown.out.startswith("Run '  lead' · stepper"), str(shown)


# --- 6. bytes that are not UTF-8 at the prompts --------------------------------------------------


def test_a_first_message_that_is_not_utf8_is_asked_again(tmp_path: Path) -> None:
    """It was "internal error: PydanticSerializationError ... surrogates not allowed"."""
    cli = Cli(tmp_path)
    result = run(cli, ["demo", "handoff", "--interactive"], stdin=b"\xff\xfe hi\n")
    assert result.code == 0, str(result)
    assert "Traceback" not in result.out + result.err and "internal error" not in result.err
    assert "that line is not text (byte 0xff is not UTF-8); type it again" in result.out
    assert "Nothing started." in result.out
    assert not cli.db.exists()  # nothing stored: not even a database


@pytest.mark.parametrize(
    ("typed", "code"),
    [(b"hello\n\xff\n", 3), (b"hello\n\xed\xa0\x80 hi\n/end\n", 0)],
)
def test_a_reply_that_is_not_utf8_is_refused_and_never_stored(
    tmp_path: Path, typed: bytes, code: int
) -> None:
    """It was exit 2, "Invalid JSON: lone leading surrogate"; now the prompt asks again and,
    when the input ends there, the run waits (exit 3) or takes the next line."""
    cli = Cli(tmp_path)
    result = run(cli, ["demo", "handoff", "--interactive"], stdin=typed)
    assert result.code == code, str(result)
    assert "Traceback" not in result.out + result.err and "error" not in result.err, str(result)
    assert "that line is not text" in result.out
    conn = sqlite3.connect(cli.db)
    try:
        conn.text_factory = bytes
        answers = [a for (a,) in conn.execute("SELECT answer FROM requests") if a is not None]
    finally:
        conn.close()
    for stored in answers:  # the refused line reached no row, escaped or not
        assert b"\\udc" not in stored.lower() and b"\\ud8" not in stored.lower(), stored
        stored.decode("utf-8")


def test_a_non_blocking_stdin_waits_for_what_is_typed(tmp_path: Path) -> None:
    """stdin left non-blocking by a process sharing it: ``input()`` read "nothing yet" as the
    end of input, and the person's words were lost -- the run left paused as at Ctrl-D (tester
    95). Now the prompt waits, puts a line that arrives in parts together (a character split
    between them included), and the flag is left as it was."""
    cli = Cli(tmp_path)
    read, write = os.pipe()
    os.set_blocking(read, False)  # (one open file: the command shares the flag)
    proc = subprocess.Popen(
        [str(ENGINE), "demo", "handoff", "--interactive", "--db", str(cli.db)],
        stdin=read,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli.env,
        cwd=cli.cwd,
    )
    os.close(read)
    try:
        # (a character split between two writes, too: tester 99 saw "Café" refused as no text)
        parts = (b"hello", b" there\n", b"my ord", b"er is late, Caf\xc3", b"\xa9\n", b"/end\n")
        for part in parts:
            time.sleep(0.4)  # (the command is at the prompt, and nothing is there yet)
            with contextlib.suppress(BrokenPipeError):  # (it stopped reading: asserted below)
                os.write(write, part)
    finally:
        os.close(write)
    out, err = proc.communicate(timeout=TIMEOUT)
    result = Result(("demo",), proc.returncode, out.decode(), err.decode())
    assert result.code == 0, str(result)
    assert "Traceback" not in result.out + result.err, str(result)
    conn = sqlite3.connect(cli.db)
    try:
        answers = [a for (a,) in conn.execute("SELECT answer FROM requests") if a is not None]
        (status,) = conn.execute("SELECT status FROM runs").fetchone()
    finally:
        conn.close()
    said = [json.loads(a)["data"]["message"] for a in answers]
    assert "my order is late, Caf\u00e9" in said, answers
    assert status == "idle", status  # (finished)


def test_json_typed_at_a_prompt_is_bounded(tmp_path: Path) -> None:
    """Edited arguments go through the same bounded parser as ``--arguments``."""
    cli = Cli(tmp_path)
    typed = b"e\n" + DEEP.encode() + b'\n{"amount": NaN}\n\nn\n\n\n'
    result = run(cli, ["demo", "handoff", "-m", REFUND, "--interactive"], stdin=typed)
    assert result.code == 0, str(result)
    assert "Traceback" not in result.out + result.err and "internal error" not in result.err
    assert "nests 100000 levels deep; the limit is 64" in result.out
    assert "NaN is not JSON" in result.out
    assert cli.ledger() == []  # rejected at last: nothing ran


# --- 7. resume payloads that do not match the responseSchema ------------------------------------

NOT_THE_SCHEMA = [
    True,  # a bare boolean used to run submit_refund
    False,
    {"accepted": True, "approved": False},  # which one counts? it used to approve
    {"approved": True, "accepted": True},
    {"accepted": True, "arguments": None},
    {"accepted": True, "arguments": [1]},
    {"accepted": True, "approve": True},
    {"accepted": 1},
    {},
    "yes",
    None,
    [True],
]


def test_resume_payloads_outside_the_response_schema_are_refused(
    client: Client, server: Server
) -> None:
    thread_id = thread()
    interrupt = pause(client, thread_id)
    assert interrupt.response_schema["required"] == ["accepted"]
    before = raw_state(server.db)
    for payload in NOT_THE_SCHEMA:
        stream = client.resume("/support", thread_id, resolved(interrupt.id, payload))
        message = refused_stream(stream, "invalid_resume_payload")
        assert "expected {accepted: boolean, arguments?: object}" in message, message
        assert raw_state(server.db) == before, payload
    assert ledger(server, thread_id) == []
    # what the schema says is still taken: {"approved": bool} alone too, with arguments
    edit = {"approved": True, "arguments": {"amount": 10.0}}
    done = client.resume("/support", thread_id, resolved(interrupt.id, edit))
    assert "submitted" in done.results()[interrupt.tool_call_id]
    [refund] = ledger(server, thread_id)
    assert refund["amount"] == 10.0


# --- 8. the rest ----------------------------------------------------------------------------------


def test_a_closed_pipe_stops_quietly(base: tuple[Cli, str, str, str]) -> None:
    """``runs list | head -1`` printed "internal error: BrokenPipeError"."""
    cli, run_id, _, _ = base
    for command in (
        ["runs", "list"],
        ["runs", "list", "--json"],
        ["runs", "show", run_id],
        ["requests", "list"],
        ["graph", "handoff"],
        ["--help"],  # (click's and rich's own output: they exited 1 there, tester 94)
        ["runs", "--help"],
        ["--version"],
        ["--db", "any.db", "--version"],  # (the command line proper prints it)
    ):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before anything is written
        try:
            result = run(
                cli,
                command,
                stdout=write,
                db=command[0] in ("runs", "requests") and "--help" not in command,
            )
        finally:
            os.close(write)
        assert result.code == 141, str(result)
        assert result.err == "", str(result)


def test_errors_into_a_closed_or_abandoned_stderr_stop_quietly(
    base: tuple[Cli, str, str, str],
) -> None:
    """stderr's reader gone: a usage error exited 1 (rich's own reaction to the broken pipe),
    and an error line waiting in a full non-blocking pipe whose reader then left exited 120
    (Python's flush at exit failed). Both are now 141, as for stdout (tester 95)."""
    cli, _, _, _ = base
    commands = (
        ["--bogus"],
        ["runs", "list", "--bogus"],
        ["runs", "show"],
        ["runs", "show", "nosuch", "--db", str(cli.db)],
        ["runs", "list", "--db", str(cli.cwd / "nope.db")],
    )
    for command in commands:
        read, write = os.pipe()
        os.close(read)
        try:
            proc = subprocess.run(
                [str(ENGINE), *command],
                stderr=write,
                env=cli.env,
                stdout=subprocess.DEVNULL,
                timeout=TIMEOUT,
                check=False,
            )
        finally:
            os.close(write)
        assert proc.returncode == 141, command
        read, write, _ = _full_non_blocking_pipe()
        proc2 = subprocess.Popen(
            [str(ENGINE), *command], stderr=write, stdout=subprocess.DEVNULL, env=cli.env
        )
        os.close(write)
        time.sleep(0.5)  # (it waits for room in the pipe)
        os.close(read)
        assert proc2.wait(timeout=TIMEOUT) == 141, command


def _full_non_blocking_pipe() -> tuple[int, int, int]:
    """A pipe whose write end is non-blocking (``O_NONBLOCK``, as a parent sharing it may
    leave it) and already full: (read end, write end, bytes in it)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    filled = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            filled += os.write(write, b"x" * 4096)
    return read, write, filled


def test_output_to_a_full_non_blocking_pipe_waits_for_the_reader(
    base: tuple[Cli, str, str, str],
) -> None:
    """A full pipe left non-blocking: the command waits for room, as on any pipe. Python's
    buffered stdout dropped the output there, and the command exited 0 having printed nothing
    (tester 94). When the reader goes away instead, the command stops quietly with 141."""
    cli, run_id, _, other = base
    shared = next(i for i, (a, b) in enumerate(zip(run_id, other, strict=True)) if a != b)
    for command in (
        ["runs", "list"],  # (the quick path)
        ["runs", "show", run_id, "--json"],
        # (a prefix the command line proper takes; shortest that tells the two runs apart: a
        # one-character prefix was ambiguous whenever both ids began alike, 1 run in 16)
        ["runs", "show", "--json", run_id[: shared + 1]],
        ["graph", "handoff"],
        ["--help"],
    ):
        expected = run(cli, command, db=command[0] not in ("graph", "--help"))
        assert expected.code == 0 and expected.out, str(expected)
        for reader_stays in (True, False):
            read, write, filled = _full_non_blocking_pipe()
            argv = [str(ENGINE), *command]
            if command[0] not in ("graph", "--help"):
                argv += ["--db", str(cli.db)]
            proc = subprocess.Popen(
                argv, stdout=write, stderr=subprocess.PIPE, env=cli.env, cwd=cli.cwd
            )
            os.close(write)
            time.sleep(0.5)  # (the command meets the full pipe)
            if reader_stays:
                with os.fdopen(read, "rb") as reader:
                    got = reader.read()
                _, err = proc.communicate(timeout=TIMEOUT)
                assert (proc.returncode, err) == (0, b""), (command, err)
                assert got[:filled] == b"x" * filled
                assert got[filled:].decode() == expected.out, command
            else:
                os.close(read)
                _, err = proc.communicate(timeout=TIMEOUT)
                assert (proc.returncode, err) == (141, b""), (command, err)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_output_to_a_full_disk_is_one_line(base: tuple[Cli, str, str, str]) -> None:
    cli, run_id, _, _ = base
    for command in (["runs", "list"], ["runs", "show", run_id, "--json"], ["graph", "handoff"]):
        with open("/dev/full", "wb") as full:
            result = run(cli, command, stdout=full, db=command[0] != "graph")
        assert result.code == 1, str(result)
        assert "cannot write the output: No space left on device" in result.error_line()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_an_action_whose_output_meets_a_full_disk_says_it_was_done(
    base: tuple[Cli, str, str, str], tmp_path: Path
) -> None:
    """``respond`` and ``cancel`` act, then meet the full disk printing what they did: exit 1
    (which tells a script nothing was done and it may retry) after the answer was stored or
    the run cancelled -- the retried cancel then met "already cancelled" (outside tester
    214). The line says it was done, and the exit code is the action's."""
    source, run_id, request_id, other = base
    cli = copy_of(source, tmp_path)
    with open("/dev/full", "wb") as full:
        answered = run(cli, ["respond", request_id, "--approve"], stdout=full)
    assert answered.code == 0, str(answered)
    assert answered.error_line().endswith(
        f"No space left on device; the answer to request {request_id} is stored all the same"
    ), str(answered)
    assert cli.json("runs", "show", run_id)["status"] == "idle_with_pending_requests"
    with open("/dev/full", "wb") as full:
        cancelled = run(cli, ["cancel", other], stdout=full)
    assert cancelled.code == 0, str(cancelled)
    assert cancelled.error_line().endswith(f"run {other} is cancelled all the same")
    assert cli.json("runs", "show", other)["status"] == "cancelled"
    with open("/dev/full", "wb") as full:  # nothing done: exit 1, as before
        again = run(cli, ["runs", "list"], stdout=full)
    assert again.code == 1 and again.error_line().endswith("No space left on device")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_demo_whose_output_meets_a_full_disk_says_how_to_continue_its_run(
    tmp_path: Path,
) -> None:
    """It exited 1 saying only that the output could not be written, leaving a run behind
    that nothing named -- a script retrying on exit 1 piled up runs (outside tester 217). The
    run stopped where it was, as when the output's reader goes away: exit 3, and how to
    continue it on stderr; the command given there finishes it."""
    cli = Cli(tmp_path)
    with open("/dev/full", "wb") as full:
        stopped = run(cli, ["demo", "handoff", "--approve", "-m", REFUND], stdout=full)
    assert stopped.code == 3, str(stopped)
    [run_id] = [r["run_id"] for r in cli.json("runs", "list", "--json")]
    said = stopped.err.strip().splitlines()
    assert said[0] == "error: cannot write the output: No space left on device", said
    assert said[-1].startswith(f"Output failed: run {run_id} stopped where it was."), said
    assert said[-1].endswith(f"Continue with: workflow-engine resume {run_id} --db {cli.db}")
    finished = cli.expect(0, "resume", run_id, "--approve")
    assert f"Run {run_id} finished." in finished.out
    assert len(cli.ledger()) == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_an_action_with_both_its_outputs_on_a_full_disk_keeps_its_exit_code(
    base: tuple[Cli, str, str, str], tmp_path: Path
) -> None:
    """``>log 2>&1`` on a full disk: the error line cannot be written either, and failing to
    write it ended the command with exit 1 after the answer was stored (outside tester 217)."""
    source, run_id, request_id, other = base
    cli = copy_of(source, tmp_path)
    for command in (["respond", request_id, "--approve"], ["cancel", other]):
        with open("/dev/full", "wb") as full:
            done = subprocess.run(
                [str(ENGINE), *command, "--db", str(cli.db)],
                stdout=full,
                stderr=full,
                env=cli.env,
                cwd=cli.cwd,
                timeout=TIMEOUT,
                check=False,
            )
        assert done.returncode == 0, command
    assert cli.json("runs", "show", run_id)["status"] == "idle_with_pending_requests"
    assert cli.json("runs", "show", other)["status"] == "cancelled"


@pytest.mark.parametrize(
    "value",
    [{"$float": "x"}, {"$items": 5}, {"$type": 3, "data": {}}, {"$uuid": "zz"}, {"$nope": 1}],
)
def test_requests_list_flags_damaged_data(
    base: tuple[Cli, str, str, str], tmp_path: Path, value: Any
) -> None:
    """``{"$float": "x"}`` used to show as ``refund_agent: "x"``."""
    source, _, request_id, _ = base
    cli = copy_of(source, tmp_path)
    corrupt_request_data(cli.db, request_id, json.dumps(value))
    table = run(cli, ["requests", "list"])
    assert table.code == 0, str(table)
    [row] = [line for line in table.out.splitlines() if line.startswith(request_id[:8])]
    assert "damaged record, cannot be shown" in row, row
    rows = {r["request_id"]: r for r in cli.json("requests", "list")}
    assert rows[request_id]["what"].startswith("damaged record"), rows


def test_a_stranded_run_has_its_own_code(client: Client, server: Server) -> None:
    """The workflow's graph changed under a paused run: its interrupt is not "of an earlier
    run" (interrupt_not_current) -- the run is stranded."""
    thread_id = thread()
    interrupt = pause(client, thread_id)
    execute(
        server.db,
        "UPDATE runs SET workflow_signature = 'an-older-graph' WHERE run_id = ?",
        (f"support:{thread_id}/0",),
    )
    before = raw_state(server.db)
    cancelled = [{"interruptId": interrupt.id, "status": "cancelled"}]
    for answer in (
        *(resolved(interrupt.id, p) for p in ({"accepted": True}, {"accepted": False})),
        cancelled,
    ):
        stream = client.resume("/support", thread_id, answer)
        message = refused_stream(stream, "run_stranded")  # a cancel too (it said "pending")
        assert "stranded" in message and "an-older-graph" in message, message
        assert "earlier run" not in message
    assert raw_state(server.db) == before
    assert ledger(server, thread_id) == []


def test_a_client_s_text_cannot_forge_a_line_of_the_server_s_log(
    client: Client, server: Server
) -> None:
    """A thread id or interrupt id with a line break, quoted in a RUN_ERROR's message, was
    written to the log as it came -- a forged log line (outside tester 107)."""
    forged = "14:00:00 INFO    uvicorn.error: FORGED LOG LINE"
    thread_id = f"x\n{forged}"
    stream = client.resume("/support", thread_id, resolved(f"y\n{forged}", {"accepted": True}))
    assert stream.last.type == EventType.RUN_ERROR, stream.describe()
    time.sleep(0.2)  # (the log is written by the server's process)
    log = server_log_clean(server)
    assert "RUN_ERROR" in log
    assert not any(line.startswith("14:00:00") for line in log.splitlines()), log[-2000:]


def test_a_change_asked_for_with_stdout_closed_is_refused_before_it_is_made(
    base: tuple[Cli, str, str, str], tmp_path: Path
) -> None:
    """``respond ... >&-`` and ``cancel ... >&-`` stored the answer or cancelled the run, then
    failed to say so (exit 1): a script retries what was done. Now, as ``resume`` does, they
    refuse before acting (outside tester 106)."""
    cli, run_id, request_id, _ = base
    copy = copy_of(cli, tmp_path)
    before = raw_state(copy.db)
    for argv in (
        ["respond", request_id, "--reject"],
        ["cancel", run_id],
        ["resume", run_id, "--json", "--reject"],
    ):
        proc = subprocess.run(
            ["bash", "-c", f"{ENGINE} {' '.join(argv)} --db {copy.db} >&-"],
            capture_output=True,
            text=True,
            env=copy.env,
            timeout=TIMEOUT,
            check=False,
        )
        assert proc.returncode == 1, proc
        assert proc.stderr == (
            "error: cannot write the output: standard output is closed; nothing was done\n"
        ), proc
    assert raw_state(copy.db) == before


def test_a_run_whose_output_reader_went_away_says_how_to_continue_on_stderr(
    tmp_path: Path,
) -> None:
    """``demo | head -1``: the run stopped where it was and the command ended 141 without a
    word, though stderr was still there to tell (outside tester 106). It says how to continue,
    and that continues it."""
    cli = Cli(tmp_path)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        result = run(cli, ["demo", "handoff", "-m", REFUND, "--approve"], stdout=write)
    finally:
        os.close(write)
    assert result.code == 141, str(result)
    [said] = result.err.splitlines()
    assert said.startswith("Output closed: run ") and " stopped where it was. " in said, said
    command = said.split("Continue with: ", 1)[1]
    assert command.startswith("workflow-engine resume ") and command.endswith(f"--db {cli.db}")
    resumed = cli.run(*command.split()[1:-2], "--approve")
    assert resumed.code == 0 and "finished" in resumed.out, str(resumed)


def test_a_stopped_command_tells_a_run_that_had_ended_from_one_to_continue(
    base: tuple[Cli, str, str, str], tmp_path: Path
) -> None:
    """Output closed (``demo | head``) or failed: the run stopped where it was, and stderr
    says how to continue it -- unless it had ended before the output closed: then
    ``resume`` only refused it (outside tester 218). What tells them apart: the run's
    status, read from its database (``_ended``)."""
    from workflow_engine_cli._app import _ended
    from workflow_engine_cli._hints import Hints

    source, run_id, request_id, other = base
    cli = copy_of(source, tmp_path)
    before = Hints.path
    Hints.path = cli.db
    try:
        assert _ended(run_id) is None  # (paused: resume continues it)
        cli.expect(0, "cancel", other)
        assert _ended(other) == "cancelled"
        cli.expect(0, "respond", request_id, "--approve")
        cli.expect(0, "resume", run_id, "--approve")
        assert _ended(run_id) == "idle"
        assert _ended("no-such-run") is None
    finally:
        Hints.path = before
