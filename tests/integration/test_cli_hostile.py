"""Hostile input to the ``workflow-engine`` executable: bytes that are not UTF-8, JSON that is
too deep or not quite JSON, and a database whose records were damaged.

Every command runs as a real subprocess (``argv`` given as bytes where a shell would pass raw
bytes, e.g. ``runs show $'\\xff'``). A refusal is one ``error:`` line on stderr with exit 2, and
the store, read through the Runtime API before and after, has not changed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import struct
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.cli_harness import ENGINE, TIMEOUT, Cli, Result
from tests.integration.hostile_harness import (
    corrupt_checkpoint_body,
    corrupt_request_data,
    store_state,
)

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

DEEP = "[" * 50_000 + "]" * 50_000


def run_bytes(
    cli: Cli, args: Sequence[str | bytes], env: dict[str, str] | None = None, db: bool = True
) -> Result:
    """``workflow-engine ARGS --db DB`` with raw bytes allowed in ``args``."""
    argv: list[str | bytes] = [str(ENGINE), *args, *(["--db", str(cli.db)] if db else [])]
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={**cli.env, **(env or {})},
        cwd=cli.cwd,
        timeout=TIMEOUT,
        check=False,
    )
    shown = tuple(os.fsdecode(a) if isinstance(a, bytes) else a for a in args)
    return Result(
        shown,
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


@pytest.fixture(scope="module")
def paused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, str, str]:
    """One database with a demo run paused at its approval: (cli, run id, request id)."""
    cli = Cli(tmp_path_factory.mktemp("cli-hostile"))
    run_id, request_id = cli.start_paused()
    return cli, run_id, request_id


def refused(cli: Cli, args: Sequence[str | bytes], mentions: str, **env: str) -> str:
    before = store_state(cli.db)
    result = run_bytes(cli, args, env)
    assert result.code == 2, str(result)
    line = result.error_line()  # one line, no traceback
    assert mentions in line, str(result)
    assert result.out == "", str(result)
    assert store_state(cli.db) == before
    return line


# --- argv that is not UTF-8 ---------------------------------------------------------------------

NOT_UTF8 = {
    "runs show": [b"runs", b"show", b"\xff"],
    "respond id": [b"respond", b"\xfe\xff", b"--approve"],
    "respond --message": ["respond", "{request}", "--message", b"caf\xe9"],
    "respond --data": ["respond", "{request}", "--data", b'"\xc3"'],
    "respond --arguments": ["respond", "{request}", "--approve", "--arguments", b'{"a": "\xff"}'],
    "cancel": [b"cancel", b"\xed\xa0\x80"],  # an encoded surrogate is not UTF-8 either
    "demo -m": [b"demo", b"handoff", b"-m", b"\x80refund"],
    "graph": [b"graph", b"\xff"],
}


@pytest.mark.parametrize("case", list(NOT_UTF8))
def test_argv_that_is_not_utf8_is_one_line_and_exit_2(
    paused: tuple[Cli, str, str], case: str
) -> None:
    cli, _, request_id = paused
    args = [a.replace("{request}", request_id) if isinstance(a, str) else a for a in NOT_UTF8[case]]
    line = refused(cli, args, "is not valid text")
    assert "is not UTF-8" in line and "UnicodeEncodeError" not in line


def test_a_database_path_that_is_not_utf8_is_refused(paused: tuple[Cli, str, str]) -> None:
    cli, _, _ = paused
    for env in ({}, {"WORKFLOW_ENGINE_DB": os.fsdecode(b"/tmp/\xff.db")}):
        argv = ["runs", "list"] if env else ["runs", "list", "--db", b"/tmp/\xff.db"]
        before = store_state(cli.db)
        result = run_bytes(cli, argv, env, db=False)
        assert result.code == 2, str(result)
        assert "is not valid text" in result.error_line()
        assert store_state(cli.db) == before


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "list"],
        ["runs", "show", "abc"],
        ["requests", "list", "--json"],
        ["resume", "x"],
        ["demo", "handoff"],
    ],
)
@pytest.mark.parametrize("named_by", ["--db", "WORKFLOW_ENGINE_DB", "HOME"])
def test_a_relative_database_in_a_deleted_directory_is_one_line_and_exit_2(
    paused: tuple[Cli, str, str], tmp_path: Path, args: list[str], named_by: str
) -> None:
    """The shell sits in a directory someone deleted: a relative path names no file there (it
    printed a traceback from ``os.getcwd``; for the default database under a relative
    ``HOME``, "no database" or "cannot create", exit 4 or 6: outside tester 97). An absolute
    one still works from there."""
    cli, _, _ = paused
    gone = tmp_path / "gone"
    gone.mkdir()
    db = ["--db", "runs.db"] if named_by == "--db" else []
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    argv = ["sh", "-c", script, "sh", str(gone), str(ENGINE), *args, *db]
    env = {**cli.env, "WORKFLOW_ENGINE_DB": "runs.db" if not db else str(cli.db)}
    if named_by == "HOME":
        env = {k: v for k, v in env.items() if k not in ("WORKFLOW_ENGINE_DB", "XDG_DATA_HOME")}
        env["HOME"] = "home"
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    result = Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)
    assert result.code == 2, str(result)
    line = result.error_line()
    said = {"--db": "--db runs.db", "HOME": "HOME=home"}.get(named_by, "WORKFLOW_ENGINE_DB=runs.db")
    assert f"{said} is relative to the current directory, which no longer exists" in line
    assert result.out == ""

    absolute = ["sh", "-c", script, "sh", str(gone), str(ENGINE), "runs", "list", "--db"]
    gone.mkdir()
    proc = subprocess.run(
        [*absolute, str(cli.db)], capture_output=True, text=True, env=env, timeout=TIMEOUT
    )
    assert proc.returncode == 0 and "support" in proc.stdout, proc.stderr


def _default_db_run(cli: Cli, env: dict[str, str], *args: str) -> Result:
    unset = ("WORKFLOW_ENGINE_DB", "XDG_DATA_HOME")
    env = {k: v for k, v in {**cli.env, **env}.items() if k not in unset}
    proc = subprocess.run(
        [str(ENGINE), *args], capture_output=True, text=True, env=env, cwd=cli.cwd, timeout=TIMEOUT
    )
    return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("args", [["runs", "list"], ["runs", "show", "abc"], ["demo", "handoff"]])
def test_a_home_that_names_no_directory_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str]
) -> None:
    """``HOME=~`` printed ``RuntimeError: Could not determine home directory.`` from
    ``Path.home()``, exit 1, at every command using the default database (outside tester 99)."""
    cli = Cli(tmp_path)
    result = _default_db_run(cli, {"HOME": "~"}, *args)
    assert result.code == 2, str(result)
    assert "$HOME is '~'; give --db PATH, or set WORKFLOW_ENGINE_DB" in result.error_line()
    assert list(tmp_path.iterdir()) == [], "nothing is made anywhere"


def test_a_tilde_no_shell_expanded_is_the_home_directory(tmp_path: Path) -> None:
    """``--db=~/runs.db`` and ``WORKFLOW_ENGINE_DB='~/runs.db'`` (no shell expands those)
    made a directory named ``~`` in the current one (outside tester 99)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    cli = Cli(work)
    env = {**cli.env, "HOME": str(home)}
    for args, extra in (
        (["runs", "list", "--db=~/runs.db"], {}),
        (["runs", "list"], {"WORKFLOW_ENGINE_DB": "~/runs.db"}),
    ):
        proc = subprocess.run(
            [str(ENGINE), *args],
            capture_output=True,
            text=True,
            env={**env, **extra},
            cwd=work,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 4, proc
        assert f"no database at {home}/runs.db" in proc.stderr, proc.stderr
    started = subprocess.run(
        [str(ENGINE), "demo", "handoff", "--offline", "-m", "refund order 12345", "--detach"],
        capture_output=True,
        text=True,
        env={**env, "WORKFLOW_ENGINE_DB": "~/runs.db"},
        cwd=work,
        timeout=TIMEOUT,
    )
    assert started.returncode == 3, started
    assert (home / "runs.db").exists() and list(work.iterdir()) == []


def test_a_tilde_under_an_empty_or_tilde_home_is_the_default_s_home_or_refused(
    tmp_path: Path,
) -> None:
    """Under ``HOME=`` a ``--db '~/t.db'`` made ``/t.db`` at the file system's root, and under
    ``HOME='~'`` a directory named ``~`` in the current one (outside tester 100)."""
    import pwd

    cli = Cli(tmp_path)
    own = pwd.getpwuid(os.getuid()).pw_dir
    name = f"no-such-{uuid.uuid4().hex}.db"
    empty = _default_db_run(cli, {"HOME": ""}, "runs", "list", "--db", f"~/{name}")
    assert empty.code == 4 and f"no database at {own}/{name}" in empty.error_line(), str(empty)
    refused = _default_db_run(
        cli, {"HOME": "~"}, "demo", "handoff", "--offline", "-m", "hi", "--detach", "--db",
        "~/x.db",
    )  # fmt: skip
    assert refused.code == 2, str(refused)
    assert "cannot tell where '~/x.db' is: $HOME is '~'" in refused.error_line()
    assert list(tmp_path.iterdir()) == [] and not Path("/t.db").exists()


def test_no_home_nor_user_directory_is_made_for_the_database(tmp_path: Path) -> None:
    """A ``HOME`` naming no directory was made by the demo, parents and all, and a ``--db``
    of ``~nosuchuser/x.db`` a directory named ``~nosuchuser`` in the current one; a path with
    a newline cut the error line there (outside tester 101)."""
    cli = Cli(tmp_path)
    home = tmp_path / "home" / "nobody"
    demo = ["demo", "handoff", "--offline", "-m", "refund order 12345", "--detach"]
    refused = _default_db_run(cli, {"HOME": str(home)}, *demo)
    assert refused.code == 2, str(refused)
    said = f"cannot tell where the default database is: $HOME is '{home}', which is not a dir"
    assert said in refused.error_line()
    nobody = _default_db_run(cli, {}, *demo, "--db", "~no-such-user-here/x.db")
    assert nobody.code == 2, str(nobody)
    assert "there is no user 'no-such-user-here'" in nobody.error_line()
    assert list(tmp_path.iterdir()) == []  # (cwd is tmp_path: no ~no-such-user-here there)
    relative = _default_db_run(cli, {"HOME": "relhome"}, *demo)
    assert relative.code == 2 and "$HOME is 'relhome', which is not a" in relative.error_line()
    assert list(tmp_path.iterdir()) == []
    odd = tmp_path / "home" / "a\nb"
    odd.mkdir(parents=True)
    listed = _default_db_run(cli, {"HOME": str(odd)}, "runs", "list")
    assert listed.code == 4, str(listed)
    assert f"no database at {tmp_path}/home/a\\nb/.local/share/" in listed.error_line()
    # wherever a message names the database, a line break in its path is written escaped
    (odd / "garbage.db").write_text("garbage")
    for args in (["runs", "list"], ["runs", "show", "zzzz"], ["resume", "zzzz"]):
        damaged = _default_db_run(cli, {}, *args, "--db", str(odd / "garbage.db"))
        assert damaged.code == 6, str(damaged)
        assert f"database {tmp_path}/home/a\\nb/garbage.db is damaged" in damaged.error_line()


@pytest.mark.parametrize("args", [["runs", "list"], ["runs", "show", "x"], ["resume", "x"]])
def test_a_database_name_too_long_for_the_file_system_is_one_line_exit_2(
    tmp_path: Path, args: list[str]
) -> None:
    """A component over 255 bytes was "internal error: OSError: [Errno 36] File name too
    long", exit 1 (outside tester 101)."""
    cli = Cli(tmp_path)
    db = tmp_path / ("a" * 300) / "runs.db"
    result = _default_db_run(cli, {}, *args, "--db", str(db))
    assert result.code == 2, str(result)
    assert "as the database: File name too long; check --db" in result.error_line()
    assert "internal error" not in result.err


def test_the_commands_printed_under_a_relative_home_name_the_database(tmp_path: Path) -> None:
    """Under a relative ``HOME`` the printed ``respond``/``resume`` commands had no ``--db``:
    pasted in another directory, they looked elsewhere (outside tester 99)."""
    cli = Cli(tmp_path)
    (tmp_path / "home").mkdir()  # (one that does not exist is refused, as an absolute one)
    started = _default_db_run(
        cli, {"HOME": "home"}, "demo", "handoff", "--offline", "-m", "refund order 12345",
        "--detach",
    )  # fmt: skip
    assert started.code == 3, str(started)
    db = tmp_path / "home" / ".local" / "share" / "workflow-engine" / "runs.db"
    text = started.out + started.err
    assert f"--db {db}" in text, text
    resume = next(line for line in text.splitlines() if "workflow-engine resume" in line)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = resume.split("workflow-engine", 1)[1].split()
    proc = subprocess.run(
        [str(ENGINE), *argv], capture_output=True, text=True, env={**cli.env, "HOME": "home"},
        cwd=elsewhere, timeout=TIMEOUT, input="",
    )  # fmt: skip
    assert "no database" not in proc.stderr, proc.stderr


# --- JSON in --data / --arguments ---------------------------------------------------------------

BAD_JSON = {
    "deep --data": (["--data", DEEP], "nests 50000 levels deep; the limit is 64"),
    "deep --arguments": (["--approve", "--arguments", f'{{"a": {DEEP}}}'], "levels deep"),
    "lone surrogate": (["--data", '{"message": "\\ud800"}'], "lone surrogate U+D800"),
    "NaN": (["--data", '{"approved": NaN}'], "NaN is not JSON"),
    "Infinity": (["--approve", "--arguments", '{"amount": -Infinity}'], "-Infinity is not JSON"),
    "overflow": (["--data", '{"approved": 1e999}'], "out of range"),
    "huge integer": (["--data", "9" * 5000], "too many digits"),
    "malformed": (["--data", "{not json"], "malformed JSON"),
}


@pytest.mark.parametrize("case", list(BAD_JSON))
def test_bad_json_answers_are_one_line_and_exit_2(paused: tuple[Cli, str, str], case: str) -> None:
    cli, _, request_id = paused
    flags, mentions = BAD_JSON[case]
    refused(cli, ["respond", request_id, *flags], mentions)


def test_the_request_still_takes_a_good_answer_afterwards(
    paused: tuple[Cli, str, str], tmp_path: Path
) -> None:
    """Run last in this module: all the refusals above left the request answerable."""
    cli, run_id, request_id = paused
    answer = cli.expect(0, "respond", request_id, "--data", '{"approved": false}')
    assert "answer stored" in answer.out
    cli.expect(0, "resume", run_id, "--end")


# --- damaged records ----------------------------------------------------------------------------


def test_a_corrupt_checkpoint_is_one_line_exit_6(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    run_id, _ = cli.start_paused()
    checkpoint_id = corrupt_checkpoint_body(cli.db, run_id)
    for args in (["runs", "show", run_id], ["resume", run_id], ["cancel", run_id]):
        result = cli.run(*args)
        assert result.code == 6, str(result)
        line = result.error_line()
        assert run_id in line and checkpoint_id in line and "corrupt" in line


def test_a_checkpoint_from_a_newer_engine_is_one_line_exit_6(tmp_path: Path) -> None:
    """The row says a newer engine wrote it: nothing reads it as today's layout, and the run
    gains no checkpoint from the attempts."""
    cli = Cli(tmp_path)
    run_id, _ = cli.start_paused()
    with sqlite3.connect(cli.db) as raw:
        (checkpoint_id,) = raw.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
            (run_id,),
        ).fetchone()
        raw.execute(
            "UPDATE checkpoints SET schema_version = 99 WHERE checkpoint_id = ?", (checkpoint_id,)
        )
        before = raw.execute("SELECT count(*) FROM checkpoints").fetchone()
    for args in (["runs", "show", run_id], ["resume", run_id], ["cancel", run_id]):
        result = cli.run(*args)
        assert result.code == 6, str(result)
        line = result.error_line()
        assert run_id in line and checkpoint_id in line and "newer workflow-engine" in line
    with sqlite3.connect(cli.db) as raw:
        assert raw.execute("SELECT count(*) FROM checkpoints").fetchone() == before


def test_a_corrupt_request_row_is_one_line_exit_6(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    run_id, request_id = cli.start_paused()
    corrupt_request_data(cli.db, request_id, "{not json")
    for args in (["requests", "list"], ["respond", request_id, "--approve"]):
        result = cli.run(*args)
        assert result.code == 6, str(result)
        line = result.error_line()
        assert request_id in line and run_id in line


@pytest.mark.parametrize("json_mode", [False, True])
def test_one_damaged_request_leaves_the_rest_of_the_inbox_listed(
    tmp_path: Path, json_mode: bool
) -> None:
    """One damaged request row stopped ``requests list`` whole (outside tester 106): every
    other run's requests are listed, the damaged one said on stderr, exit 6."""
    cli = Cli(tmp_path)
    damaged_run, damaged = cli.start_paused()
    good_run, good = cli.start_paused()
    corrupt_request_data(cli.db, damaged, "{not json")
    result = cli.run("requests", "list", *(["--json"] if json_mode else []))
    assert result.code == 6, str(result)
    line = result.error_line()
    assert damaged in line and damaged_run in line and "damaged" in line
    if json_mode:
        assert [r["request_id"] for r in json.loads(result.out)] == [good]
    else:
        assert good[:8] in result.out and good_run[:8] in result.out
        assert damaged[:8] not in result.out
        corrupt_request_data(cli.db, good, "{not json")  # nothing readable left
        result = cli.run("requests", "list")
        assert result.code == 6 and len(result.err.splitlines()) == 2, str(result)
        assert "No pending requests" not in result.out, str(result)  # (it is not empty)


@pytest.mark.parametrize(
    ("column", "value"),
    [("status", "zzz"), ("created_at", "x"), ("superstep", "abc"), ("lease_expires_at", "soon")],
)
def test_one_damaged_run_row_leaves_the_other_runs_requests_listed(
    tmp_path: Path, column: str, value: str
) -> None:
    """A damaged run row (its status, a time) hid every run's requests: each run is read on
    its own then, its damage said on stderr (outside tester 114)."""
    cli = Cli(tmp_path)
    damaged_run, _ = cli.start_paused()
    good_run, good = cli.start_paused()
    with sqlite3.connect(cli.db) as raw:
        raw.execute(f"UPDATE runs SET {column} = ? WHERE run_id = ?", (value, damaged_run))
    result = cli.run("requests", "list", "--json")
    assert result.code == 6, str(result)
    assert damaged_run in result.error_line() and "damaged" in result.error_line(), str(result)
    assert [r["request_id"] for r in json.loads(result.out)] == [good], str(result)
    listed = cli.run("requests", "list")
    assert listed.code == 6 and good[:8] in listed.out and good_run[:8] in listed.out


@pytest.mark.parametrize("status", ["pendinX", "", "Pending"])
def test_a_request_whose_status_is_damaged_is_named_not_left_out(
    tmp_path: Path, status: str
) -> None:
    """A request row whose status is none of the four was in no status's list: ``requests
    list`` left it out without a word (outside tester 115). It is named, the rest listed."""
    cli = Cli(tmp_path)
    damaged_run, damaged = cli.start_paused()
    _, good = cli.start_paused()
    with sqlite3.connect(cli.db) as raw:
        raw.execute("UPDATE requests SET status = ? WHERE request_id = ?", (status, damaged))
    for argv in (["requests", "list", "--json"], ["requests", "list"]):
        result = cli.run(*argv)
        assert result.code == 6, str(result)
        said = result.error_line()
        assert damaged_run in said and damaged in said and "is damaged" in said, str(result)
        assert good[:8] in result.out and damaged[:8] not in result.out, str(result)
    with sqlite3.connect(cli.db) as raw:  # (read, not repaired or dropped)
        assert raw.execute("SELECT count(*) FROM requests").fetchone()[0] == 2


@pytest.mark.parametrize("argv", [["resume"], ["resume", "--approve"], ["runs", "show"]])
def test_a_run_whose_request_status_is_damaged_says_so_before_it_asks_anything(
    tmp_path: Path, argv: list[str]
) -> None:
    """``resume`` paused the run again on a request whose status was damaged, offering
    ``respond`` commands that then failed; ``runs show`` showed it as waiting; an answer whose
    row was damaged was ignored (outside tester 118). Each names the damage, exit 6, and the
    run is left as it was: not leased, not answered."""
    cli = Cli(tmp_path)
    run_id, request_id = cli.start_paused()
    with sqlite3.connect(cli.db) as raw:
        raw.execute("UPDATE requests SET status = 'PENDING' WHERE request_id = ?", (request_id,))
    result = cli.run(*argv, run_id)
    assert result.code == 6, str(result)
    said = result.error_line()
    assert run_id in said and request_id in said and "is damaged" in said, str(result)
    assert "workflow-engine respond" not in result.out, str(result)
    with sqlite3.connect(cli.db) as raw:
        owner, status = raw.execute(
            "SELECT owner, status FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
    assert owner is None and status == "idle_with_pending_requests", (owner, status)


@pytest.mark.parametrize(
    ("value", "code", "said"),
    [
        ({"$float": "x"}, 6, "$float"),  # not a valid encoding: damage
        # a class the code does not register: its code changed (or damage): stranded
        ({"$type": "no.such.Type", "data": {}}, 5, "no.such.Type"),
    ],
)
def test_a_request_row_with_a_malformed_value_is_one_line(
    tmp_path: Path, value: Any, code: int, said: str
) -> None:
    cli = Cli(tmp_path)
    _, request_id = cli.start_paused()
    corrupt_request_data(cli.db, request_id, json.dumps(value))
    result = cli.run("respond", request_id, "--approve")
    assert result.code == code, str(result)
    assert said in result.error_line()


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "handoff", "-m", "hi", "--reply", ""],
        ["demo", "handoff", "-m", "hi", "--reply", "ok", "--reply", "  "],
        ["demo", "handoff", "-m", "   "],
        ["demo", "handoff", "-m", ""],
        ["demo", "handoff", "-m", "\u200b\ufeff "],  # invisible: a zero-width space, a BOM
        ["demo", "handoff", "-m", "hi", "--reply", "\u2060"],  # a word joiner
    ],
)
def test_a_blank_message_or_reply_is_refused_before_a_run_starts(
    tmp_path: Path, argv: list[str]
) -> None:
    """``--reply ''`` was refused only when the run reached the prompt it answered: exit 2,
    with a run left paused behind it (outside tester 106); a blank ``-m`` was a message."""
    cli = Cli(tmp_path)
    result = cli.run(*argv)
    assert result.code == 2 and result.out == "", str(result)
    assert result.err.startswith("error: ") and "blank" in result.err, str(result)
    assert len(result.err.splitlines()) == 1, str(result)
    assert not cli.db.exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    "message", ["\u200b", " \ufeff ", "   ", "\u3164\u3164", "\u2800", "\ufe0f", "\u115f"]
)
def test_a_blank_message_answer_is_refused_however_it_is_blank(
    tmp_path: Path, message: str
) -> None:
    """``respond --message $'\\u200b'`` was stored as the user's message where ``'   '`` was
    refused (outside tester 113); through the Python API it was a message too."""
    from workflow_engine.executors import HandoffUserResponse

    cli = Cli(tmp_path)
    cli.expect(3, "demo", "handoff", "-m", "hello", "--detach")
    [asked] = cli.json("requests", "list", "--json")
    result = cli.run("respond", asked["request_id"], "--message", message)
    assert result.code == 2 and "blank" in result.error_line(), str(result)
    [still] = cli.json("requests", "list", "--json")
    assert still["request_id"] == asked["request_id"]  # nothing stored
    with pytest.raises(ValueError, match="not empty"):
        HandoffUserResponse(message=message)


def test_ids_typed_in_capitals_or_of_the_wrong_kind_are_found_or_explained(
    paused: tuple[Cli, str, str],
) -> None:
    """``runs show A34B`` was "no run" for a run whose id starts a34b; a request's id given
    where a run's goes said only "no run" (outside tester 106)."""
    cli, run_id, request_id = paused
    shown = cli.expect(0, "runs", "show", run_id[:8].upper())
    assert shown.out.startswith(f"Run {run_id} "), str(shown)
    before = store_state(cli.db)
    wrong = cli.run("resume", request_id[:8].upper())
    assert wrong.code == 4, str(wrong)
    said = (
        f"error: no run {request_id[:8].upper()!r}: that is the id of a request of run {run_id!r}; "
    )
    # (what to do depends on whether another test of this module answered it already)
    assert wrong.error_line() in (
        said + "answer it with respond, then resume that run",
        said + "resume that run",
    ), str(wrong)
    # and the other way round: a run's id where a request's goes (outside tester 113)
    swapped = cli.run("respond", run_id[:8], "--approve")
    assert swapped.code == 4, str(swapped)
    line = swapped.error_line()
    assert line.startswith(f"error: no request {run_id[:8]!r}: that is the id of run {run_id!r}")
    assert store_state(cli.db) == before


def test_the_command_respond_prints_stands_on_a_line_of_its_own(tmp_path: Path) -> None:
    """ "answer stored; continue with `workflow-engine resume ...`" pasted whole into a shell
    ran the backticks as a command substitution (outside tester 106)."""
    cli = Cli(tmp_path)
    run_id, request_id = cli.start_paused()
    said = cli.expect(0, "respond", request_id, "--reject").out
    assert said == (
        f"answer stored; continue with:\n  workflow-engine resume {run_id} --db {cli.db}\n"
    ), said


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "handoff"],
        ["demo", "handoff", "--json", "--approve", "-m", "refund 12345"],
        ["demo", "handoff", "--detach", "-m", "refund 12345"],
        ["resume", "nosuchrun"],
    ],
)
def test_a_closed_stdin_is_no_terminal_not_a_traceback(tmp_path: Path, argv: list[str]) -> None:
    """``demo ... <&-`` (cron, a daemon's child): ``sys.stdin`` is None, and asking whether it
    was a terminal was a traceback, exit 1 (outside tester 113). It is no terminal: the demo
    runs as without one, and an unknown run is one line."""
    cli = Cli(tmp_path)
    proc = subprocess.run(
        [str(ENGINE), *argv, "--db", str(cli.db)],
        capture_output=True,
        text=True,
        env=cli.env,
        cwd=cli.cwd,
        timeout=TIMEOUT,
        check=False,
        preexec_fn=lambda: os.close(0),
    )
    assert "Traceback" not in proc.stderr and "Error:" not in proc.stderr, proc.stderr
    expected = 4 if argv[0] == "resume" else 3 if "--detach" in argv else 0  # (3: paused)
    assert proc.returncode == expected, proc.stderr
    if argv[0] == "demo" and "--detach" not in argv:
        assert cli.ledger() != []  # the refund: approved (no one to ask), made once


def test_an_answer_of_another_kind_says_which_flags_answer_the_request(tmp_path: Path) -> None:
    """``respond ID --message hi`` to a tool call's approval said "expected
    ToolApprovalResponseContent: approved: Field required" (outside tester 113)."""
    cli = Cli(tmp_path)
    _, approval = cli.start_paused()
    before = store_state(cli.db)
    for flags in (["--message", "hi"], ["--end"]):
        wrong = cli.run("respond", approval, *flags)
        assert wrong.code == 2, str(wrong)
        line = wrong.error_line()
        assert "asks to approve submit_refund(" in line and "--approve" in line, line
        assert "--reject; nothing was stored" in line, line
    assert store_state(cli.db) == before
    talk = Cli(tmp_path / "talk")
    talk.expect(3, "demo", "handoff", "-m", "hello", "--detach")
    [asked] = talk.json("requests", "list", "--json")
    wrong = talk.run("respond", asked["request_id"], "--approve")
    assert wrong.code == 2, str(wrong)
    assert "asks for your next message to triage_agent: answer it with --message TEXT or --end" in (
        wrong.error_line()
    )


def test_run_ids_of_other_cases_are_never_taken_for_one_another(tmp_path: Path) -> None:
    """Of runs named ``Order-1`` and ``order-1``, ``runs show ORDER-1`` (and ``cancel``)
    silently took the second: only hex -- the ids the engine makes -- is looked up in lower
    case too (outside tester 112)."""
    import anyio

    from tests.integration.workflows import stepper_workflow
    from workflow_engine import Runtime
    from workflow_engine.storage import SqliteStore

    cli = Cli(tmp_path)

    async def make() -> None:
        runtime = Runtime(SqliteStore(cli.db))
        runtime.register(stepper_workflow)
        for run_id in ("Order-1", "order-1"):
            await runtime.run("stepper", 1, run_id=run_id)
        await runtime.close()

    anyio.run(make)
    before = store_state(cli.db)
    for argv in (["runs", "show", "ORDER-1"], ["cancel", "ORDER-1"]):
        wrong = cli.run(*argv)
        assert wrong.code == 4 and "no run 'ORDER-1'" in wrong.error_line(), str(wrong)
    assert cli.expect(0, "runs", "show", "Order-1").out.startswith("Run Order-1 ")
    assert store_state(cli.db) == before


@pytest.mark.parametrize(
    "run_id",
    ["$(touch PWNED)", "my order", "-rf", "tab\tid", "right\u202eleft", "it's `x`", "new\nline"],
)
def test_a_printed_command_names_a_hostile_run_id_as_one_shell_word(
    tmp_path: Path, run_id: str
) -> None:
    """A run id is the application's to choose (an AG-UI client's thread id is in its run's),
    and the commands printed to continue a run named it bare: pasted, ``$(touch PWNED)`` ran,
    ``my order`` was two arguments, ``-rf`` an option (outside tester 191). Each printed
    command, pasted into bash as printed, names the run and runs nothing else."""
    import anyio

    from workflow_engine import Runtime
    from workflow_engine.storage import SqliteStore
    from workflow_engine_cli.demos.review_loop import build_workflow

    cli = Cli(tmp_path)

    async def make() -> str:
        runtime = Runtime(SqliteStore(cli.db))
        runtime.register(build_workflow)
        paused = await runtime.run("review_loop", "a topic", run_id=run_id)
        await runtime.close()
        return paused.pending_requests[0].request_id

    request_id = anyio.run(make)
    env = {**cli.env, "PATH": f"{ENGINE.parent}{os.pathsep}{cli.env.get('PATH', '')}"}
    env["LC_ALL"] = "C"  # (outside a UTF-8 locale bash read $'\u202e' as text: tester 195)

    def pasted(line: str) -> subprocess.CompletedProcess[str]:
        assert line.startswith("  workflow-engine "), line
        return subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, env=env, cwd=cli.cwd,
            stdin=subprocess.DEVNULL, timeout=TIMEOUT, check=False,
        )  # fmt: skip

    # a pause, as `resume` without a terminal prints it: how to answer, how to continue
    paused = cli.run("resume", "--db", str(cli.db), "--", run_id, db=False)
    said = (paused.out + paused.err).splitlines()
    # no line of it is forged by the id (a newline in it printed raw: outside tester 195)
    assert not any(line.startswith("line") for line in said), said
    continue_with = said[said.index("then continue with:") + 1]
    again = pasted(continue_with)
    assert again.returncode == 3, (continue_with, again.stderr)  # the same run, paused
    assert continue_with in (again.stdout + again.stderr).splitlines(), again.stdout
    # an answer stored, and how to apply it (`respond`, then `runs show`)
    answered = cli.expect(0, "respond", request_id, "--data", '{"approved": true}')
    [apply_with] = [line for line in answered.out.splitlines() if line.startswith("  ")]
    shown = cli.expect(0, "runs", "show", "--db", str(cli.db), "--", run_id, db=False)
    shown = shown.out.splitlines()
    assert shown[shown.index("then: apply it with:") + 1] == apply_with, shown
    done = pasted(apply_with)
    assert done.returncode in (0, 3), (apply_with, done.stderr)
    assert not (cli.cwd / "PWNED").exists()
    record = cli.expect(0, "runs", "show", "--json", "--db", str(cli.db), "--", run_id, db=False)
    assert json.loads(record.out)["answered_requests"] == []  # applied


def test_an_inbox_that_cannot_be_read_prints_no_json_list(tmp_path: Path) -> None:
    """With the ``requests`` table's root page damaged, ``requests list --json`` printed a
    whole ``[]`` -- "nothing waits", to a script reading stdout -- then failed, exit 6
    (outside tester 191). Nothing read: no list, as ``runs list --json`` does."""
    cli = Cli(tmp_path)
    cli.start_paused()
    damage_the_root_of(cli.db, "requests")
    for args in (["requests", "list"], ["requests", "list", "--json"]):
        failed = cli.run(*args)
        assert failed.code == 6, str(failed)
        assert failed.out == "", str(failed)
        assert "damaged" in failed.error_line() or "malformed" in failed.error_line()


def damage_the_root_of(db: Path, table: str) -> None:
    """Overwrite the head of ``table``'s root page (its b-tree's header) with garbage."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,))
        (page,) = root.fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    with open(db, "r+b") as file:
        file.seek((page - 1) * size)
        file.write(bytes(range(256)) * 2)


def test_a_damaged_table_is_said_before_the_demo_asks_and_before_serve_listens(
    tmp_path: Path,
) -> None:
    """The demo asked for the first message on a database whose ``requests`` table was
    damaged, ran three agent turns with it, then said so, exit 6; ``serve`` listened and would
    have failed requests (outside tester 191): each reads the first entry of every table and
    index first."""
    from tests.integration.cli_harness import PtySession

    cli = Cli(tmp_path)
    cli.start_paused()
    damage_the_root_of(cli.db, "requests")
    demo = PtySession(["demo", "handoff", "--db", str(cli.db)], cli.env, cli.cwd)
    try:
        assert demo.wait() == 6, demo.text
        assert "You:" not in demo.text, demo.text
        assert "is damaged" in demo.text and "requests" in demo.text, demo.text
    finally:
        demo.close()
    served = cli.run("serve", "--port", "0")
    assert served.code == 6, str(served)
    assert "(its table requests)" in served.error_line()


def test_check_tables_leaves_others_tables_alone_and_decodes_the_first_entry(
    tmp_path: Path,
) -> None:
    """An operator's partial index (no plain ORDER BY can use it) or a table whose name needs
    quoting made ``check_tables`` call a healthy database damaged, and ``serve`` refused to
    start; damage inside the first entry of a table (a column's type byte) went unseen
    (outside tester 196)."""
    import anyio

    from workflow_engine import StoreCorruptError
    from workflow_engine.storage import SqliteStore

    cli = Cli(tmp_path)
    cli.start_paused()
    with sqlite3.connect(cli.db) as conn:
        conn.execute("CREATE INDEX app_open ON runs(updated_at) WHERE status != 'idle'")
        # (typed over two lines in the sqlite3 shell: 198)
        conn.execute("CREATE INDEX app_idle ON requests(created_at)\nWHERE(status = 'x')")
        conn.execute('CREATE TABLE "app""notes" (x)')
    conn.close()

    async def check() -> None:
        async with SqliteStore(cli.db) as store:
            await store.check_tables()

    anyio.run(check)
    with sqlite3.connect(cli.db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (page,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'requests'"
        ).fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    data = bytearray(cli.db.read_bytes())
    start = (page - 1) * size
    assert data[start] == 0x0D  # a table leaf: its one cell is the pending request's row
    (cell,) = struct.unpack(">H", data[start + 8 : start + 10])
    at = start + cell
    for _ in range(2):  # past the payload's size and the rowid (varints)
        while data[at] & 0x80:
            at += 1
        at += 1
    header_size = data[at]  # (one byte: a few columns)
    assert header_size < 0x80 and data[at + 2] < 0x80  # the 2nd column's type is one byte
    data[at + 2] = 10  # the record's second column: serial type 10 (reserved)
    cli.db.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError, match=r"\(its table requests\)"):
        anyio.run(check)


@pytest.mark.parametrize("run_id", [":warning:", "a]b[c", "x[/]y"])
def test_the_closed_pipe_message_names_a_run_id_of_markup_as_written(
    tmp_path: Path, run_id: str
) -> None:
    """The message said when the reader of the output went away printed the run id through
    rich's markup: ``x[/]y`` crashed it, ``:warning:`` became an emoji in the command to
    paste, and ``a]b[c`` swallowed the command (outside testers 195, 199)."""
    import anyio

    from workflow_engine import Runtime
    from workflow_engine.storage import SqliteStore
    from workflow_engine_cli.demos.review_loop import build_workflow

    cli = Cli(tmp_path)

    async def make() -> None:
        runtime = Runtime(SqliteStore(cli.db))
        runtime.register(build_workflow)
        await runtime.run("review_loop", "a topic", run_id=run_id)
        await runtime.close()

    anyio.run(make)
    quoted = shlex.quote(run_id)
    line = f"{ENGINE} resume --db {cli.db} -- {quoted} | (exec 0<&-; true)"
    done = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, env=cli.env, cwd=cli.cwd,
        stdin=subprocess.DEVNULL, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    said = " ".join(done.stderr.split())
    assert f"Output closed: run {run_id} stopped where it was." in said, done.stderr
    assert f"Continue with: workflow-engine resume {quoted} --db {cli.db}" in said, done.stderr


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("[::1", "is not an IPv6 address (write it as ::1 or [::1])"),
        ("::1]", "is not an IPv6 address"),
        ("[[::1]]", "is not an IPv6 address"),
        ("", "is empty"),
        ("local host", "is not an IP address or a host name"),
        ("-x.example", "is not an IP address or a host name"),
        ("127.0.0.1:8000", "holds a port: give the host alone, the port with --port"),
        ("[::1]:8000", "holds a port"),
        ("http://127.0.0.1", "is a URL: give the host alone"),
        ("[127.0.0.1]", "is not an IPv6 address (brackets hold one, as in [::1])"),
        ("224.0.0.1", "is a multicast address (224.0.0.1), not one of this machine's"),
        ("255.255.255.255", "is the broadcast address"),
    ],
)
def test_serve_refuses_a_host_that_is_no_address_before_it_listens(
    tmp_path: Path, host: str, said: str
) -> None:
    """``serve --host '[::1'`` (a bracket missing) reached the socket: "cannot listen on
    [[::1]:8000", exit 7 -- as if the address were busy (outside tester 199); a host with a
    port was told it is no IPv6 address, and a multicast or broadcast address was bound and
    its URL logged, a URL no one can reach (tester 200)."""
    cli = Cli(tmp_path)
    result = cli.run("serve", "--host", host, "--port", "0")
    assert result.code == 2, str(result)
    assert f"--host {host!r} {said}" in result.error_line(), str(result)


def _serve_with_hosts(tmp_path: Path, hosts: str, *args: str) -> subprocess.Popen[str]:
    """``serve`` in a mount namespace of its own whose /etc/hosts holds ``hosts``."""
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(hosts)
    serve = [str(ENGINE), "serve", *args, "--db", str(tmp_path / "runs.db")]
    script = f'mount --bind {hosts_file} /etc/hosts && exec "$@"'
    return subprocess.Popen(
        ["unshare", "-m", "sh", "-c", script, "sh", *serve],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_decides_on_a_token_by_the_address_a_name_binds(tmp_path: Path) -> None:
    """``serve --host any.localhost`` was taken for loopback by its name and served without
    a token on every interface, the hosts file saying 0.0.0.0 (outside tester 200). The
    address a name resolves to decides; a name with an IPv6 address alone is bound there
    (it was bound as IPv4, and failed)."""
    public = _serve_with_hosts(tmp_path, "0.0.0.0 any.localhost\n", "--host", "any.localhost")
    try:
        out, err = public.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # (it serves: not left running after the test)
        public.kill()
        out, err = public.communicate()
    assert public.returncode == 2, (out, err)
    assert "binding any.localhost (0.0.0.0) exposes the server beyond this machine" in err, err
    only_v6 = _serve_with_hosts(tmp_path, "::1 v6only\n", "--host", "v6only", "--port", "0")
    try:
        deadline = time.monotonic() + 30
        said = ""
        while "AG-UI endpoints" not in said and time.monotonic() < deadline:
            assert only_v6.stderr is not None
            said += only_v6.stderr.readline()
            assert only_v6.poll() is None, said
        port = int(re.search(r"http://\[::1\]:(\d+)/support", said)[1])  # type: ignore[index]
        assert httpx.get(f"http://[::1]:{port}/health", timeout=10).status_code == 200
    finally:
        only_v6.terminate()
        only_v6.communicate(timeout=30)


def _serves_a_post_at_the_url_it_logs(tmp_path: Path, host: str, url_start: str) -> None:
    """``serve --host HOST`` without a token logs its endpoints at a URL starting with
    ``url_start``, and answers a POST there."""
    db = str(tmp_path / "db")
    serve = [str(ENGINE), "serve", "--host", host, "--port", "0", "--db", db]
    server = subprocess.Popen(serve, stderr=subprocess.PIPE, text=True, env=Cli(tmp_path).env)
    try:
        said = ""
        deadline = time.monotonic() + 30
        while "AG-UI endpoints" not in said and time.monotonic() < deadline:
            assert server.stderr is not None
            line = server.stderr.readline()
            assert line or server.poll() is None, said
            said += line
        found = re.search(r"AG-UI endpoints: (http://\S+)/support", said)
        assert found and found[1].startswith(url_start), said
        body = {
            "threadId": "t",
            "runId": "r",
            "messages": [{"id": "m", "role": "user", "content": "hi"}],
        }
        reply = httpx.post(f"{found[1]}/support", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_serve_logs_a_url_its_guard_answers_for_a_loopback_name_it_does_not_know(
    tmp_path: Path,
) -> None:
    """``serve --host 127.1`` (or the machine's own name, resolving to 127.0.0.1) logged
    ``http://127.1:PORT``, and every POST to that URL was refused ``host_not_allowed``: without
    a token only loopback names are answered (outside tester 203). It logs the address."""
    _serves_a_post_at_the_url_it_logs(tmp_path, "127.1", "http://127.0.0.1:")


def test_serve_takes_an_ipv4_loopback_address_written_as_ipv6_for_loopback(
    tmp_path: Path,
) -> None:
    """``::ffff:127.0.0.1`` is 127.0.0.1, which Python 3.11 does not read as loopback: ``serve
    --host`` refused it without a token ("exposes the server beyond this machine"), and a
    request to ``http://[::ffff:127.0.0.1]:PORT`` was refused ``host_not_allowed`` (outside
    tester 207). It is served, and answered, as loopback."""
    _serves_a_post_at_the_url_it_logs(tmp_path, "::ffff:127.0.0.1", "http://[::ffff:127.0.0.1]:")
