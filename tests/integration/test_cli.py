"""End to end: the ``workflow-engine`` command line as a user runs it.

Every test runs the installed executable in subprocesses against its own SQLite file and demo
ledger (``WORKFLOW_ENGINE_DEMO_LEDGER``: one JSON line per refund/replacement the outside system
received), and checks exit codes, what is printed and what reached the ledger. The interactive
mode is driven through a pseudo-terminal. Each process costs most of a second to start, so
commands that share nothing run concurrently, each against its own database.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.integration.cli_harness import (
    ENGINE,
    Cli,
    PtySession,
    SlowModel,
    assert_in_doubt_asked,
    flat,
    run_concurrently,
    wait_until_blocked_on_a_fifo,
)
from workflow_engine.storage import SqliteStore
from workflow_engine_cli._app import STOP_GRACE_SECONDS

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

REFUND = "I want a refund for order 12345"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


# --- 1. the demo, non-interactive ---------------------------------------------------------------

# (flags, what the output says, what reached the outside system: (kind, fields))
DEMO_PATHS: dict[str, tuple[list[str], list[str], list[tuple[str, dict[str, Any]]]]] = {
    "approve": (
        ["-m", REFUND, "--approve"],
        [
            "submit_refund",
            ") approved",
            "Refund of 89.99 for order 12345 submitted.",
            "case complete",
            "conversation completed (last agent: refund_agent)",
        ],
        [("refund", {"order_id": "12345", "amount": 89.99})],
    ),
    "reject": (
        ["-m", REFUND, "--reject", "--end"],
        [
            ") rejected",
            "The user rejected this tool call; it was not executed.",
            "Okay, I did not submit the refund.",
            "conversation ended by user",
        ],
        [],
    ),
    "replacement": (
        ["-m", "My lamp from order 24680 arrived broken", "--approve"],
        [
            "handoff to order_agent",
            "Replacement desk lamp for order 24680 is on its way.",
            "case complete",
        ],
        [("replacement", {"order_id": "24680", "item": "desk lamp"})],
    ),
    "both": (
        ["-m", "I want a refund and a replacement for order 12345", "--approve"],
        [
            "Refund of 89.99 for order 12345 submitted.",
            "handoff to order_agent",
            "Replacement wireless headphones for order 12345 is on its way.",
            "case complete",
        ],
        [
            ("refund", {"order_id": "12345", "amount": 89.99}),
            ("replacement", {"order_id": "12345", "item": "wireless headphones"}),
        ],
    ),
    "no-flags-no-terminal": (
        ["-m", REFUND],
        ["no terminal: approving tool calls", "Refund of 89.99", "case complete"],
        [("refund", {"order_id": "12345", "amount": 89.99})],
    ),
}


def test_demo_runs_to_the_end_without_a_terminal(tmp_path: Path) -> None:
    clis = {name: Cli(tmp_path / name) for name in DEMO_PATHS}
    results = run_concurrently(
        [(clis[name], ["demo", "handoff", *DEMO_PATHS[name][0]], True) for name in DEMO_PATHS]
    )
    for (name, (_, says, ledger)), result in zip(DEMO_PATHS.items(), results, strict=True):
        context = f"[{name}] {result}"
        assert result.code == 0, context
        assert result.err == "", context
        run_id = re.search(r"run (\w+) · workflow support", result.out)
        assert run_id, context
        assert f"Run {run_id[1]} finished." in result.out, context
        assert "\x1b" not in result.out, context  # no terminal: plain lines, no escape codes
        for text in says:
            assert text in result.out, f"{text!r} missing: {context}"
        if not ledger:
            assert "submitted." not in result.out, context
        entries = clis[name].ledger()
        assert [e["kind"] for e in entries] == [kind for kind, _ in ledger], context
        for entry, (_, fields) in zip(entries, ledger, strict=True):
            assert entry.items() >= fields.items(), context
            assert entry["key"].startswith(f"{run_id[1]}:"), context  # key: run + tool call


# --- 2. pause in one process, answer in a second, resume in a third -----------------------------


@pytest.mark.slow  # several processes in turn: `make test` runs it, `make test-fast` not
def test_a_paused_review_says_the_draft_it_asks_about(cli: Cli) -> None:
    """An application's request: the pause block named its type and how to answer it, never
    the draft to approve (outside tester 208). It says it as the inbox does."""
    paused = cli.expect(3, "demo", "review", "-m", "durable workflows", "--detach")
    said = '  asks: review: {"topic": "durable workflows", "version": 1, "text": "A short note'
    assert said in paused.out, paused.out
    assert '  answer as JSON: {"approved": true|false' in paused.out, paused.out


def test_detach_respond_resume_across_processes(cli: Cli) -> None:
    paused = cli.expect(3, "demo", "handoff", "-m", REFUND, "--detach")
    run_id = re.search(r"Run (\w+) is paused, waiting for input\.", paused.out)
    request_id = re.search(r"request (\S+) \(ToolApprovalRequestContent\)", paused.out)
    assert run_id and request_id, str(paused)
    run_id, request_id = run_id[1], request_id[1]
    assert f"workflow-engine respond {request_id} --approve" in paused.out  # copy, paste
    # what would be approved, without a `requests list` (outside tester 106)
    assert '  asks: approve submit_refund({"order_id": "12345", "amount": 89.99' in paused.out
    assert f"workflow-engine resume {run_id}" in paused.out
    assert cli.ledger() == []

    [pending] = cli.json("requests", "list")
    assert pending["request_id"] == request_id
    assert pending["run_id"] == run_id
    assert pending["workflow"] == "support"
    assert pending["what"].startswith("approve submit_refund(")
    for argument in ('"order_id": "12345"', '"amount": 89.99', '"reason": "customer request"'):
        assert argument in pending["what"]
    # and as data, not only display text (outside tester): the request as stored
    assert pending["port_id"] == "refund_agent"
    call = pending["data"]["data"]["function_call"]["data"]
    assert pending["data"]["$type"] == "ToolApprovalRequestContent"
    assert call["name"] == "submit_refund"
    assert call["arguments"] == {"order_id": "12345", "amount": 89.99, "reason": "customer request"}

    answered = cli.expect(0, "respond", request_id, "--approve")
    assert "answer stored" in answered.out
    assert f"workflow-engine resume {run_id}" in answered.out
    assert cli.ledger() == []  # an answer is stored; nothing runs until `resume`

    resumed = cli.expect(0, "resume", run_id)
    assert "Refund of 89.99 for order 12345 submitted." in resumed.out
    assert "case complete" in resumed.out
    assert f"Run {run_id} finished." in resumed.out
    [refund] = cli.ledger()
    assert refund["kind"] == "refund"
    assert refund["key"].startswith(f"{run_id}:")

    shown = cli.json("runs", "show", run_id)
    assert shown["run_id"] == run_id
    assert shown["status"] == "idle"
    assert shown["pending_requests"] == []
    assert shown["error"] is None
    assert shown["outputs"] == ["conversation completed (last agent: refund_agent)"]
    history = shown["history"]
    assert [h["seq"] for h in history] == list(range(len(history)))
    assert [h["superstep"] for h in history] == sorted(h["superstep"] for h in history)
    statuses = [h["status"] for h in history]
    assert "idle_with_pending_requests" in statuses
    assert statuses[-1] == "idle"
    assert shown["superstep"] == history[-1]["superstep"]

    again = cli.expect(5, "resume", run_id)
    line = again.error_line()
    assert run_id in line
    assert "nothing to resume" in line
    assert len(cli.ledger()) == 1  # still exactly once


def test_conversation_continues_across_processes(cli: Cli) -> None:
    # --reject without --end and no terminal: no one to ask, so the run pauses at "your turn".
    paused = cli.expect(3, "demo", "handoff", "-m", REFUND, "--reject")
    assert "(HandoffUserInputRequest)" in paused.out
    # the question is said, as an approval's call is (outside tester 177: it was missing)
    assert "asks: reply to refund_agent:" in flat(paused.out), paused.out
    [pending] = cli.json("requests", "list")
    assert pending["what"].startswith("reply to refund_agent:")
    assert "did not submit the refund" in pending["what"]

    still = cli.expect(3, "resume", pending["run_id"])  # no answer yet: paused again
    assert f"Run {pending['run_id']} is paused, waiting for input." in still.out

    cli.expect(0, "respond", pending["request_id"], "--message", "no thanks")
    done = cli.expect(0, "resume", pending["run_id"])
    assert "You're welcome. case complete." in done.out
    assert cli.ledger() == []


def test_a_reply_to_the_customer_is_not_approved(cli: Cli) -> None:
    """``respond --approve`` on the customer's turn was stored as an empty reply and ended the
    conversation; the pause even offered --approve|--reject (outside tester)."""
    paused = cli.expect(3, "demo", "handoff", "-m", "hello", "--detach")
    [pending] = cli.json("requests", "list")
    offered = [
        line.strip()
        for line in paused.out.splitlines()
        if line.startswith("  workflow-engine respond ")
    ]
    first = f"workflow-engine respond {pending['request_id']}"
    assert offered == [  # one command each
        f"{first} --message '<your reply>' --db {cli.db}",
        f"{first} --end --db {cli.db}",
    ], paused.out
    assert "--approve" not in paused.out, paused.out
    # pasted as printed, the placeholder is refused: it was stored as the customer's words,
    # for good (tester 76)
    pasted = subprocess.run(
        ["bash", "-c", offered[0].replace("workflow-engine", shlex.quote(str(ENGINE)), 1)],
        capture_output=True,
        text=True,
        env=cli.env,
    )
    assert pasted.returncode == 2, pasted
    assert "replace <your reply> with what to say; nothing was stored" in pasted.stderr
    assert cli.json("requests", "list") == [pending]
    for flag in ("--approve", "--reject"):
        refused = cli.expect(2, "respond", pending["request_id"], flag)
        said = "asks for your next message to triage_agent: answer it with --message TEXT or --end"
        assert said in refused.error_line(), str(refused)
    twice = cli.expect(
        2, "respond", pending["request_id"], "--message", "order 12345", "--message", "thanks"
    )
    assert twice.error_line() == "error: give --message once: a reply is one message"
    assert "answer stored" in cli.expect(0, "respond", pending["request_id"], "--end").out


def test_serve_help_names_the_extra_to_install(cli: Cli) -> None:
    """Rich took ``[server]`` in the help text for markup and dropped it (outside tester)."""
    shown = cli.expect(0, "serve", "--help").out
    assert "pip install 'workflow-engine[server]'" in " ".join(shown.split()), shown


@pytest.mark.parametrize(
    "command", [["demo"], ["resume"], ["respond"], ["cancel"], ["serve"], ["runs", "show"]]
)
def test_help_reads_as_paragraphs_at_80_columns(cli: Cli, command: list[str]) -> None:
    """The docstring's own line breaks were kept and the lines wrapped at the width as well:
    ``refuses (exit`` / ``2) saying why``, a word or two alone on a line (review)."""
    shown = subprocess.run(
        [str(ENGINE), *command, "--help"],
        capture_output=True,
        text=True,
        env={**cli.env, "COLUMNS": "80"},
        check=True,
    ).stdout
    shown = "\n".join(line.rstrip() for line in shown.splitlines())
    prose = shown.split("\n\n", 1)[1].split("╭")[0]  # after the usage line, before the boxes
    for paragraph in prose.split("\n\n"):
        lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
        for line, following in itertools.pairwise(lines):
            # a line wrapped at the width is full up to about the next word's length
            assert len(line) + len(following.split()[0]) >= 76, shown


def test_approve_and_reject_together_is_a_usage_error(cli: Cli) -> None:
    """The last of the two used to win silently: a refund approved or rejected by flag order
    (outside tester)."""
    for args in (["demo", "handoff", "-m", REFUND], ["resume", "abc"]):
        for flags in (["--approve", "--reject"], ["--reject", "--approve"]):
            refused = cli.expect(2, *args, *flags)
            assert refused.error_line() == "error: give --approve or --reject, not both"
            assert refused.out == ""


@pytest.mark.slow  # several processes in turn: `make test` runs it, `make test-fast` not
def test_answers_are_validated_and_cannot_change(cli: Cli) -> None:
    run_id, request_id = cli.start_paused()
    # what the paused run waits for, as the inbox says it (it named the request's type only:
    # outside tester 153)
    waits = cli.expect(0, "runs", "show", run_id).out
    said = f"waiting: {request_id} (ToolApprovalRequestContent: approve submit_refund("
    assert said in flat(waits), waits

    malformed = cli.expect(2, "respond", request_id, "--data", "{not json")
    assert "malformed JSON" in malformed.error_line()

    invalid = cli.expect(2, "respond", request_id, "--approve", "--arguments", '{"amount": -1}')
    line = invalid.error_line()
    assert "submit_refund" in line
    assert "amount" in line
    assert "greater than 0" in line

    wrong_type = cli.expect(2, "respond", request_id, "--data", '{"approved": "maybe"}')
    assert wrong_type.err.startswith("error: ")
    assert "approved" in wrong_type.err
    alone = cli.expect(2, "respond", request_id, "--arguments", '{"amount": 50}')
    assert "--arguments goes with --approve" in alone.error_line()

    edited = ["--approve", "--arguments", '{"amount": 50}']
    # an AG-UI interrupt's id, copied from a web client, names its request (tester 153)
    interrupt_id = f"{request_id}.{'ab' * 16}"
    assert "answer stored" in cli.expect(0, "respond", interrupt_id, *edited).out
    assert "already had this answer" in cli.expect(0, "respond", request_id, *edited).out
    conflict = cli.expect(5, "respond", request_id, "--reject")
    assert "already answered with a different value" in conflict.error_line()
    # answered, not applied: no view said that the run waits for `resume` (tester 74)
    [listed] = cli.expect(0, "runs", "list").out.splitlines()[1:]
    assert "idle_with_pending_requests, answered" in listed, listed
    [record] = cli.json("runs", "list")
    assert record["answers_waiting"] is True and record["status"] == "idle_with_pending_requests"
    shown = cli.json("runs", "show", run_id)
    assert shown["pending_requests"] == [] and shown["answered_requests"] == [request_id]
    stored_answer = shown["answers"][request_id]  # as stored (a ToolApprovalResponseContent)
    assert (stored_answer["approved"], stored_answer["arguments"]) == (True, {"amount": 50.0})
    said = cli.expect(0, "runs", "show", run_id).out.splitlines()
    # what it was answered, the edit included (it showed nothing of it before `resume`)
    asks = 'approve submit_refund({"order_id": "12345", "amount": 89.99, "reason": "customer '
    assert f"answered: {request_id} ({asks}" in "\n".join(said), said
    assert 'request"}): approved, with {"amount": 50.0}; not applied yet)' in " ".join(said)
    i = said.index("then: apply it with:")
    assert said[i + 1] == f"  workflow-engine resume {run_id} --db {cli.db}", said
    inbox = cli.expect(0, "requests", "list").out.splitlines()
    assert inbox[0] == "No pending requests.", inbox
    assert inbox[1:] == [
        f"answered: run {run_id} (support) has an answer to apply; apply it with:",
        f"  workflow-engine resume {run_id} --db {cli.db}",
    ], inbox

    done = cli.expect(0, "resume", run_id)
    assert "Refund of 50.00 for order 12345 submitted." in done.out
    # what it goes on with, before the call's result: only the result showed, run with
    # arguments no one saw (outside tester 153)
    applying = f'applying: {asks}request"}}): approved, with {{"amount": 50.0}}'
    assert applying in flat(done.out), done.out
    assert flat(done.out).index(applying) < flat(done.out).index("← submit_refund"), done.out
    [refund] = cli.ledger()
    assert refund["amount"] == 50.0  # the edited arguments, not the agent's 89.99
    # the same answer again (`50.0` is `50`, as JSON sees it): no `resume` to run any more (it
    # said "continue with `workflow-engine resume ...`", which refused, tester 74)
    again = ["--approve", "--arguments", '{"amount": 50.0}']
    said = cli.expect(0, "respond", request_id, *again).out
    assert said == f"already had this answer; run {run_id} has ended (idle)\n", said
    assert "answered" not in flat(cli.expect(0, "requests", "list").out)
    assert cli.json("runs", "list")[0]["answers_waiting"] is False
    assert cli.json("runs", "show", run_id)["answered_requests"] == []


def test_resume_json_says_each_answer_it_applies(cli: Cli) -> None:
    """``resume --json`` said nothing of the answers it went on with, where the text view says
    ``applying: ...`` (outside tester 159): each is a line of its own, first."""
    run_id, request_id = cli.start_paused()
    cli.expect(0, "respond", request_id, "--approve", "--arguments", '{"amount": 50}')
    done = cli.expect(0, "resume", run_id, "--json")
    lines = [json.loads(line) for line in done.out.strip().splitlines()]
    first = lines[0]
    assert (first["type"], first["run_id"], first["request_id"]) == ("applying", run_id, request_id)
    assert first["answer"]["approved"] is True and first["answer"]["arguments"] == {"amount": 50.0}


# --- 3. bad input: one clear error line, the documented exit code, no traceback -----------------

# (arguments, with --db, exit code, what the error line says); the database exists unless the
# case is about a missing one
BAD_INPUT: list[tuple[list[str], bool, int, str]] = [
    (["runs", "list"], True, 4, "no database at"),
    (["resume", "nope"], True, 4, "no run 'nope'"),
    (["runs", "show", "nope"], True, 4, "no run 'nope'"),
    (["respond", "nope", "--approve"], True, 4, "no request 'nope'"),
    (["respond", "nope", "--data", "{bad"], True, 2, "malformed JSON"),
    # a printed command pasted as it was: what to do, not "malformed JSON" (outside tester 153)
    (["respond", "nope", "--data", "<JSON>"], True, 2, "replace <JSON> with the answer, as JSON"),
    (["respond", "nope", "--data", '{"approved": true|false}'], True, 2, "write true or false"),
    (["respond", "nope"], True, 2, "exactly one of"),
    (["respond", "nope", "--approve", "--reject"], True, 2, "exactly one of"),
    (["respond", "nope", "--reject", "--arguments", "{}"], True, 2, "--arguments goes with"),
    (["demo", "nosuch"], True, 2, "no demo named 'nosuch'"),
    (["runs", "list", "--status", "bogus"], True, 2, "unknown status 'bogus'"),
    (["graph", "nope"], False, 4, "no workflow named 'nope'"),
    (["graph", "support", "--format", "svg"], False, 2, "--format must be mermaid or dot"),
    (["serve", "--log-level", "loud"], True, 2, "--log-level must be one of"),
]


def test_bad_input(tmp_path: Path) -> None:
    clis = [Cli(tmp_path / f"case{i}") for i in range(len(BAD_INPUT))]
    for c, (_, _, _, mentions) in zip(clis, BAD_INPUT, strict=True):
        if mentions != "no database at":
            anyio.run(_create_database, c.db)
    results = run_concurrently(
        [(c, args, db) for c, (args, db, _, _) in zip(clis, BAD_INPUT, strict=True)]
    )
    for c, (_, _, code, mentions), result in zip(clis, BAD_INPUT, results, strict=True):
        assert result.code == code, str(result)
        assert mentions in result.error_line(), str(result)
        assert result.out == "", str(result)
        assert c.ledger() == []


async def _create_database(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    async with SqliteStore(path):
        pass


# --- 4. graph and runs list ---------------------------------------------------------------------


def test_graph(cli: Cli) -> None:
    mermaid, dot = run_concurrently(
        [(cli, ["graph", "support", "--format", fmt], False) for fmt in ("mermaid", "dot")]
    )
    for result in (mermaid, dot):
        assert result.code == 0, str(result)
        assert result.err == "", str(result)

    assert mermaid.out.startswith("flowchart TD")
    for agent in ("triage_agent", "refund_agent", "order_agent"):
        assert f'n_{agent}["{agent}"]' in mermaid.out
    for source, target in [("triage", "refund"), ("refund", "order"), ("order", "triage")]:
        assert f"n_{source}_agent --> n_{target}_agent" in mermaid.out

    assert dot.out.startswith("digraph ")
    assert dot.out.rstrip().endswith("}")
    for agent in ("triage_agent", "refund_agent", "order_agent"):
        assert f'"{agent}" [shape=box' in dot.out
    assert '"triage_agent" -> "refund_agent";' in dot.out
    assert '"order_agent" -> "triage_agent";' in dot.out


@pytest.mark.slow  # several processes in turn: `make test` runs it, `make test-fast` not
def test_runs_list_and_cancel(cli: Cli) -> None:
    cli.expect(0, "demo", "handoff", "-m", REFUND, "--approve")
    paused_id, request_id = cli.start_paused()

    runs = cli.json("runs", "list")
    assert [(r["workflow"], r["status"]) for r in runs] == [
        ("support", "idle"),
        ("support", "idle_with_pending_requests"),
    ]
    assert runs[1]["run_id"] == paused_id
    assert runs[0]["created_at"] <= runs[1]["created_at"]
    assert all(r["superstep"] > 0 for r in runs)
    waiting = cli.json("runs", "list", "--status", "idle_with_pending_requests")
    assert [r["run_id"] for r in waiting] == [paused_id]

    assert f"Run {paused_id} cancelled." in cli.expect(0, "cancel", paused_id).out
    assert "was cancelled" in cli.expect(5, "respond", request_id, "--approve").error_line()
    refused = cli.expect(5, "resume", paused_id)
    assert "is already cancelled; nothing to resume" in refused.error_line()
    assert "resuming" not in refused.out  # refused, not announced first (outside tester)
    assert [r["status"] for r in cli.json("runs", "list")] == ["idle", "cancelled"]
    assert len(cli.ledger()) == 1  # the first run's refund only


def test_a_malformed_command_line_is_one_error_line_naming_the_help(cli: Cli) -> None:
    """Errors are one line on stderr, a mistyped option or command too (outside tester: typer
    drew a multi-line box); a group called with nothing still shows its help."""
    cases = [
        (("runs", "list", "--bogus"), "No such option: --bogus", "engine runs list --help"),
        (("nonsense",), "No such command 'nonsense'", "workflow-engine --help"),
        # named as the usage and the README name it (it said 'request_id', outside tester)
        (("respond",), "Missing argument 'REQUEST_ID'", "workflow-engine respond --help"),
        (("runs", "show"), "Missing argument 'RUN_ID'", "workflow-engine runs show --help"),
        # click names no command for these: the command line does
        (("runs", "list", "--status"), "'--status' requires an argument", "runs list --help"),
        (("respond", "abc", "--data"), "'--data' requires an argument", "respond --help"),
        (("respond", "abc", "--approve=1"), "does not take a value", "respond --help"),
    ]
    for args, says, hint in cases:
        line = cli.expect(2, *args, db=False).error_line()
        assert says in line and hint in line, line
        assert "╭" not in line
    shown = cli.expect(2, "runs", db=False)
    assert "list" in shown.out and "show" in shown.out and not shown.err.strip()


def test_the_database_option_goes_before_or_after_the_command(cli: Cli, tmp_path: Path) -> None:
    """``--db`` before the command, after it, or ``$WORKFLOW_ENGINE_DB``: the command's own
    option wins, then the one before it, then the environment (outside tester: ``workflow-engine
    --db X runs list`` was "No such option")."""
    paused_id, _ = cli.start_paused()
    elsewhere = str(tmp_path / "elsewhere.db")
    listed = json.loads(cli.expect(0, "--db", str(cli.db), "runs", "list", "--json", db=False).out)
    assert [r["run_id"] for r in listed] == [paused_id]
    both = cli.expect(0, "--db", elsewhere, "runs", "list", "--json", "--db", str(cli.db), db=False)
    assert [r["run_id"] for r in json.loads(both.out)] == [paused_id]
    assert "no database at" in cli.expect(4, "--db", elsewhere, "runs", "list", db=False).err
    # the commands printed to continue name the database; a mistyped one is not created
    paused = cli.expect(3, "demo", "handoff", "-m", REFUND, "--detach")
    run_id = paused.out.split("Run ")[1].split()[0]
    lines = [line.strip() for line in paused.out.splitlines()]
    assert f"workflow-engine resume {run_id} --db {cli.db}" in lines, paused.out
    stored = cli.expect(0, "respond", cli.start_paused()[1], "--approve")
    assert stored.out.endswith(f" --db {cli.db}\n"), stored.out
    assert "no database at" in cli.expect(4, "resume", "abc", "--db", elsewhere, db=False).err
    assert not Path(elsewhere).exists()
    # an empty file is no database either, and reading it leaves it empty (it used to get a
    # schema written into it by ``runs list``)
    empty = tmp_path / "empty.db"
    empty.touch()
    said = cli.expect(4, "--db", str(empty), "runs", "list", db=False).err
    assert "no database at" in said and "the file is empty" in said
    assert "no database at" in cli.expect(4, "requests", "list", "--db", str(empty), db=False).err
    assert empty.stat().st_size == 0 and sorted(os.listdir(tmp_path)).count("empty.db-wal") == 0
    # so is another program's SQLite file: it is read, never written (no tables of ours added,
    # not switched to WAL) -- outside tester 45
    foreign = tmp_path / "customers.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE customers (name TEXT)")
        conn.execute("INSERT INTO customers VALUES ('bob')")
    conn.close()
    before = foreign.read_bytes()
    for argv in (["runs", "list"], ["requests", "list"], ["runs", "show", "abc"]):
        said = cli.expect(4, "--db", str(foreign), *argv, db=False).err
        assert "another program's tables (customers)" in said, said
    assert foreign.read_bytes() == before
    assert not foreign.with_name("customers.db-wal").exists()
    # one with a table named like ours is still not ours; nor is one another program holds
    # locked, which cannot be read (it got our schema once the lock was gone -- tester 46)
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE runs (id TEXT)")
    conn.close()
    before = foreign.read_bytes()
    said = cli.expect(4, "--db", str(foreign), "runs", "list", db=False).err
    assert "another program's tables (customers, runs)" in said, said
    holder = sqlite3.connect(foreign, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        said = cli.expect(6, "--db", str(foreign), "runs", "list", db=False).err
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "another program holds it locked" in said, said
    assert foreign.read_bytes() == before
    cli.env["WORKFLOW_ENGINE_DB"] = elsewhere
    try:
        before = cli.expect(0, "--db", str(cli.db), "runs", "show", paused_id, db=False)
        assert paused_id in before.out
        assert "no database at" in cli.expect(4, "runs", "list", db=False).err
    finally:
        del cli.env["WORKFLOW_ENGINE_DB"]


# --- 5. interactive, through a pseudo-terminal --------------------------------------------------


@pytest.fixture
def pty_demo(cli: Cli) -> Iterator[PtySession]:
    session = PtySession(["demo", "handoff", "--db", str(cli.db)], cli.env, cli.cwd)
    try:
        yield session
    finally:
        session.close()


def test_interactive_approve(cli: Cli, pty_demo: PtySession) -> None:
    pty_demo.expect("You:")
    pty_demo.send(REFUND)
    pty_demo.expect("Approve? [y]es / [n]o / [e]dit arguments:")
    assert "Approval needed: submit_refund(" in flat(pty_demo.text)
    assert cli.ledger() == []  # nothing happens before the user says yes
    pty_demo.send("y")

    assert pty_demo.wait() == 0, pty_demo.text
    out = flat(pty_demo.text)
    assert "Refund of 89.99 for order 12345 submitted." in out
    assert "case complete" in out
    assert "Traceback" not in out
    [refund] = cli.ledger()
    assert (refund["kind"], refund["order_id"], refund["amount"]) == ("refund", "12345", 89.99)


def test_interactive_reject_and_end(cli: Cli, pty_demo: PtySession) -> None:
    pty_demo.expect("You:")
    pty_demo.send(REFUND)
    pty_demo.expect("Approve? [y]es / [n]o / [e]dit arguments:")
    pty_demo.send("n")
    pty_demo.expect("You (empty or /end to finish):")
    assert "Okay, I did not submit the refund." in flat(pty_demo.text)
    pty_demo.send("/end")

    assert pty_demo.wait() == 0, pty_demo.text
    out = flat(pty_demo.text)
    assert "conversation ended by user" in out
    assert "Traceback" not in out
    assert cli.ledger() == []


# --- 6. version, start-up imports, the server's logs and a busy port ----------------------------


def test_version(cli: Cli) -> None:
    result = cli.expect(0, "--version", db=False)
    assert result.out == f"workflow-engine {version('workflow-engine')}\n"


HEAVY = {"executors", "examples", "fastapi", "uvicorn", "openai", "rich", "networkx"}
RUNTIME = {"typer", "click", "pydantic", "pydantic_core", "anyio", "asyncio", "sqlalchemy"}
"""What the other commands load, and the listings and ``--version`` do without (``_quick``)."""
PROBE = """
import json, sys
out, args = sys.argv[1], json.loads(sys.argv[2])
sys.argv = ["workflow-engine", *args]
from workflow_engine_cli import main
try:
    main()
finally:
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)
"""


def loaded_by(cli: Cli, out: Path, argv: list[str]) -> tuple[str, set[str]]:
    """``workflow-engine ARGV`` run in a fresh interpreter: its output, and every module it
    imported."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), json.dumps(argv)],
        capture_output=True,
        text=True,
        env=cli.env,
        cwd=cli.cwd,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, set(json.loads(out.read_text()))


CTRL_C_WHILE_LOADING = """
import json, sys

module, args = sys.argv[1], json.loads(sys.argv[2])

class CtrlC:  # Ctrl-C pressed while the command line loads: at the import of ``module``
    def find_spec(self, name, path=None, target=None):
        if name == module:
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["workflow-engine", *args]
from workflow_engine_cli import main
main()
"""


@pytest.mark.parametrize(
    ("module", "args"),
    [("typer", ["--help"]), ("sqlite3", ["runs", "list"])],  # the commands; a quick listing
)
def test_ctrl_c_while_the_command_line_loads_is_a_quiet_exit(
    cli: Cli, module: str, args: list[str]
) -> None:
    """Pressed in the first ~50 ms it printed a traceback from inside ``import typer``
    (outside tester 61)."""
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_LOADING, module, json.dumps(args)],
        capture_output=True,
        text=True,
        env=cli.env,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stdout == proc.stderr == ""


def test_read_only_commands_do_not_load_agents_server_or_rich(cli: Cli, tmp_path: Path) -> None:
    """What makes them start fast (timing itself is measured, not asserted)."""
    cli.start_paused()
    for n, args in enumerate([["--version"], ["--help"], ["runs", "list"], ["requests", "list"]]):
        argv = [*args, "--db", str(cli.db)] if args[0] in ("runs", "requests") else args
        printed, modules = loaded_by(cli, tmp_path / f"modules{n}.json", argv)
        loaded = {m.split(".")[0] for m in modules}
        heavy = HEAVY - {"rich"} if args == ["--help"] else HEAVY  # typer formats help with rich
        assert loaded.isdisjoint(heavy), (args, sorted(loaded & heavy))
        if args in (["--version"], ["--help"]):
            assert "workflow_engine" not in loaded and "storage" not in loaded, args
        if args != ["--help"]:  # the listings and the version: not even the runtime's own
            assert loaded.isdisjoint(RUNTIME), (args, sorted(loaded & RUNTIME))
    assert "approve submit_refund(" in printed  # requests list still says what is waiting


def test_runs_show_loads_neither_typer_nor_the_event_loop(cli: Cli, tmp_path: Path) -> None:
    """``runs show`` works a run out without the command line's parser or the runtime's
    event loop: the checkpoint models (pydantic) and, for a run of a demo, its workflow."""
    run_id, request_id = cli.start_paused()
    argv = ["runs", "show", run_id, "--db", str(cli.db)]
    printed, modules = loaded_by(cli, tmp_path / "modules.json", argv)
    loaded = {m.split(".")[0] for m in modules}
    skipped = {"typer", "click", "asyncio", "sqlalchemy", "rich", "networkx", "fastapi"}
    assert loaded.isdisjoint(skipped), sorted(loaded & skipped)
    assert f"waiting: {request_id} (ToolApprovalRequestContent: approve submit_refund(" in printed


class ServerProcess:
    """``workflow-engine serve --port 0`` with its stderr (the log) collected line by line."""

    def __init__(
        self, cli: Cli, *args: str, port: int = 0, env: dict[str, str] | None = None
    ) -> None:
        self.proc = subprocess.Popen(
            [str(ENGINE), "serve", "--port", str(port), "--db", str(cli.db), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**cli.env, **(env or {})},
            cwd=cli.cwd,
        )
        self.log: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        assert self.proc.stderr is not None
        self._pumping = threading.Thread(target=self._pump, args=(self.proc.stderr,), daemon=True)
        self._pumping.start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)  # end of the log

    def rest(self) -> list[str]:
        """The whole log, once the process has ended."""
        while (line := self._lines.get(timeout=10)) is not None:
            self.log.append(line)
        return self.log

    def expect(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log:
                if found := re.search(pattern, line):
                    return found
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no {pattern!r} in the log:\n{''.join(self.log)}")
            self.log.append(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._pumping.join(timeout=10)
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()


def test_serve_logs_each_request_and_a_busy_port_is_one_error(cli: Cli) -> None:
    anyio.run(_create_database, cli.db)
    server = ServerProcess(cli)
    try:
        port = int(server.expect(r"AG-UI endpoints: http://127\.0\.0\.1:(\d+)/support")[1])
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        access = server.expect(r'uvicorn\.access: 127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200')
        assert re.match(r"\d\d:\d\d:\d\d INFO ", access.string)
        refund = {"id": "m1", "role": "user", "content": "I want a refund for order 12345"}
        body = {"threadId": "t1", "runId": "r1", "messages": [refund]}
        sent = httpx.post(f"http://127.0.0.1:{port}/support", json=body, timeout=30)
        assert sent.status_code == 200 and "RUN_FINISHED" in sent.text
        server.expect(r"workflow_engine_agui\S*: thread 't1': run \S+ paused with 1 interrupt")
        answer = {"interruptId": "nope", "status": "resolved", "payload": {"accepted": True}}
        bad = {**body, "runId": "r2", "messages": [], "resume": [answer]}
        httpx.post(f"http://127.0.0.1:{port}/support", json=bad, timeout=30)
        server.expect(r"WARNING workflow_engine_agui\S*: thread 't1': RUN_ERROR \w+")

        busy = cli.expect(7, "serve", "--port", str(port))
        line = busy.error_line()
        assert f"cannot listen on 127.0.0.1:{port}" in line
        assert "in use" in line
        assert busy.out == ""
    finally:
        assert server.stop() == 0, "".join(server.log)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_serve_answers_a_kept_alive_connection_at_once(cli: Cli, host: str) -> None:
    """Its listener was made with protocol 0, and asyncio sets TCP_NODELAY only on the
    connections of an IPPROTO_TCP one: Nagle's algorithm and the client's delayed ACK held
    every response on a kept-alive connection about 40 ms -- each request a browser or httpx
    sent after the first (outside tester 190). And the endpoints it logs for an IPv6 address
    are URLs a client takes (``http://::1:PORT`` is none)."""
    anyio.run(_create_database, cli.db)
    server = ServerProcess(cli, "--host", host)
    try:
        url = server.expect(r"AG-UI endpoints: (http://\S+)/support")[1]
        assert url.startswith("http://[::1]:" if host == "::1" else "http://127.0.0.1:"), url
        with httpx.Client(base_url=url, timeout=10) as client:
            took = []
            for _ in range(8):
                start = time.perf_counter()
                assert client.get("/health").status_code == 200
                took.append(time.perf_counter() - start)
        # (the fastest of them: with the stall every one after the first takes 40 ms or more)
        assert min(took[1:]) < 0.03, took
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_serve_stopped_by_sigterm_is_a_normal_stop(cli: Cli) -> None:
    """A process manager stops the server with SIGTERM: it drains as on Ctrl-C, logs that it
    stopped, and exits 0 (it exited 143, without the line: outside tester 58)."""
    anyio.run(_create_database, cli.db)
    server = ServerProcess(cli)
    try:
        server.expect(r"AG-UI endpoints: http://127\.0\.0\.1:(\d+)/support")
        server.proc.send_signal(signal.SIGTERM)  # (while it may still be starting)
        assert server.proc.wait(timeout=30) == 0, "".join(server.rest())
        assert any(line.rstrip().endswith("stopped") for line in server.rest()), server.log
    finally:
        server.stop()


def test_serve_stopped_by_a_second_ctrl_c_interrupts_its_runs_cleanly(cli: Cli) -> None:
    """Ctrl-C waits for the runs in flight to reach a pause; a second Ctrl-C made uvicorn quit
    at once: two tracebacks in the log, the client's stream cut off with no ``RUN_ERROR``, the
    store left unclosed (outside tester 59). It stops the runs where they are now: the client
    is told, the run keeps its last checkpoint with no one holding it, and the server stops."""
    anyio.run(_create_database, cli.db)
    with SlowModel(think=30) as model:
        url = f"http://127.0.0.1:{model.server_address[1]}/v1"
        env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "k", "OPENAI_MODEL": "slow"}
        server = ServerProcess(cli, env=env)
        try:
            port = int(server.expect(r"AG-UI endpoints: http://127\.0\.0\.1:(\d+)/support")[1])
            seen: list[str] = []

            def client() -> None:
                refund = {"id": "m1", "role": "user", "content": "My headphones arrived broken"}
                body = {"threadId": "t1", "runId": "r1", "messages": [refund]}
                with httpx.stream(
                    "POST", f"http://127.0.0.1:{port}/support", json=body, timeout=60
                ) as response:
                    for line in response.iter_lines():
                        if line.startswith("data:"):
                            seen.append(json.loads(line[5:])["type"])

            reader = threading.Thread(target=client)
            reader.start()
            server.expect(r"POST http://\S+/v1/chat/completions")  # the agent waits on it
            server.proc.send_signal(signal.SIGINT)
            server.expect(r"Waiting for connections to close")
            server.proc.send_signal(signal.SIGINT)
            assert server.proc.wait(timeout=30) == 0, "".join(server.rest())
            reader.join(timeout=30)
        finally:
            server.stop()
    log = "".join(server.rest())
    assert "Traceback" not in log and not re.search(r"^\S+ ERROR ", log, re.MULTILINE), log
    assert "interrupting 1 run(s) at their last checkpoint" in log
    assert log.rstrip().endswith("stopped"), log
    assert seen[0] == "RUN_STARTED" and seen[-1] == "RUN_ERROR", seen
    [run] = cli.json("runs", "list")
    assert run["status"] == "in_progress" and run["worker"] is None


def approve_a_refund_that_hangs(port: int) -> threading.Thread:
    """On the server at ``port``: a refund asked for, then approved by a client in a thread
    (returned, started), whose request stays open while the tool hangs on the FIFO ledger."""
    url = f"http://127.0.0.1:{port}/support"
    refund = {"id": "m1", "role": "user", "content": "I want a refund for order 12345"}
    body = {"threadId": "t1", "runId": "r1", "messages": [refund]}
    started = httpx.post(url, json=body, timeout=30).text
    [interrupt_id] = re.findall(r'"interrupts":\[\{"id":"([^"]+)"', started)
    answer = {"interruptId": interrupt_id, "status": "resolved", "payload": {"accepted": True}}
    resume = {**body, "runId": "r2", "messages": [], "resume": [answer]}

    def approve() -> None:
        with contextlib.suppress(httpx.HTTPError):  # cut off when the server quits
            httpx.post(url, json=resume, timeout=60)

    client = threading.Thread(target=approve)
    client.start()
    return client


def test_sigterm_stops_a_demo_started_with_sigint_ignored(cli: Cli) -> None:
    """A command a script starts in the background (``cmd &``) inherits SIGINT ignored. SIGTERM
    was turned into a SIGINT, which was lost: nothing stopped the demo but SIGKILL, its run
    held all along (outside tester 66). It stops as under SIGTERM anywhere: the step under
    way gets the grace, then the command ends (exit 3) and the call is asked about."""
    os.mkfifo(cli.ledger_path)  # the approved refund hangs on it
    demo = subprocess.Popen(
        [str(ENGINE), "demo", "handoff", "--approve", "-m", REFUND, "--db", str(cli.db)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=cli.env,
        cwd=cli.cwd,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert demo.stdout is not None
        seen = ""
        while "submit_refund" not in seen or "approved" not in seen:
            line = demo.stdout.readline().decode()
            assert line, seen
            seen += line
        wait_until_blocked_on_a_fifo(demo.pid)  # the call under way, blocked on the ledger
        demo.send_signal(signal.SIGINT)  # (a Ctrl-C at the terminal: ignored, as it should be)
        time.sleep(0.5)
        assert demo.poll() is None
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=STOP_GRACE_SECONDS + 15) == 3
        out = seen + demo.stdout.read().decode()
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.wait()
        if demo.stdout is not None:
            demo.stdout.close()
    assert "Traceback" not in out, out
    assert "A call was still running" in flat(out), out
    [run] = cli.json("runs", "list")
    assert run["worker"] is None, run  # the lease given back
    os.unlink(cli.ledger_path)
    asked = cli.expect(3, "resume", run["run_id"])
    assert_in_doubt_asked(asked.out)


def test_sighup_still_tells_a_log_file_how_to_continue(cli: Cli, tmp_path: Path) -> None:
    """SIGHUP sent everything to /dev/null, a script's log file too: it lost the run id and
    how to continue (tester 67). Only what went to the closed terminal is silenced."""
    os.mkfifo(cli.ledger_path)  # the approved refund blocks on it until let through below
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        demo = subprocess.Popen(
            [str(ENGINE), "demo", "handoff", "--approve", "-m", REFUND, "--db", str(cli.db)],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=cli.env,
            cwd=cli.cwd,
        )
    try:
        deadline = time.monotonic() + 60
        while "approved" not in out.read_text():
            assert demo.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        wait_until_blocked_on_a_fifo(demo.pid)
        demo.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        with open(cli.ledger_path, "wb"):  # the tool's read ends...
            pass
        taken: list[bytes] = []  # ...and its append finds a reader
        reader = threading.Thread(target=lambda: taken.append(cli.ledger_path.read_bytes()))
        reader.start()
        assert demo.wait(timeout=30) == 3
        reader.join(timeout=10)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    said = flat(err.read_text())
    [run] = cli.json("runs", "list")
    assert f"Interrupted: run {run['run_id']} keeps its last checkpoint." in said, said
    assert f"Continue with: workflow-engine resume {run['run_id']}" in said


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_before_any_run_started_ends_it_as_any_program(
    tmp_path: Path, signum: int, code: int
) -> None:
    """Stopped before a run had started, the command said "Interrupted before a run started."
    and exited 3, "resume continues it", with nothing to resume (tester 67)."""
    script = f"""
import os, anyio, typer
from workflow_engine_cli._app import _interruptible

async def body() -> int:
    os.kill(os.getpid(), {int(signum)})
    await anyio.sleep(10)
    return 0

try:
    _interruptible(body, [])
except typer.Exit as stop:  # (as the command line's app turns it into the exit code)
    raise SystemExit(stop.exit_code)
"""
    ended = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert ended.returncode == code, ended
    assert "Traceback" not in ended.stderr, ended.stderr
    if signum == signal.SIGTERM:
        assert "Interrupted before a run started." in ended.stderr


def test_serve_quits_on_a_third_ctrl_c_while_a_tool_hangs(cli: Cli) -> None:
    """An approved refund blocks in its thread (the ledger is a FIFO no one reads): nothing can
    cut it off, so the second Ctrl-C leaves that run executing. The third made uvicorn tear the
    app down with tracebacks, and the process still waited for the thread (outside tester 61).
    It quits now, exit 130, one line saying so; the call is asked about when continued."""
    anyio.run(_create_database, cli.db)
    os.mkfifo(cli.ledger_path)
    server = ServerProcess(cli, env={"PYTHONFAULTHANDLER": "1"})
    try:
        port = int(server.expect(r"AG-UI endpoints: http://127\.0\.0\.1:(\d+)/support")[1])
        client = approve_a_refund_that_hangs(port)
        wait_until_blocked_on_a_fifo(server.proc.pid)  # the tool in its thread, on the ledger
        for expected in ("Waiting for connections to close", "interrupting 1 run"):
            server.proc.send_signal(signal.SIGINT)
            server.expect(expected)
        server.proc.send_signal(signal.SIGINT)
        try:
            code = server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:  # (once in a loaded full run: say where it waits)
            server.proc.send_signal(signal.SIGABRT)  # every thread's stack, into the log
            server.proc.wait(timeout=10)
            log = "".join(server.rest())
            raise AssertionError(f"15 s after the third Ctrl-C:\n{log}") from None
        assert code == 130
        client.join(timeout=30)
    finally:
        server.stop()
    log = "".join(server.rest())
    assert "Traceback" not in log, log
    assert log.rstrip().endswith("quitting now: runs still executing stop where they are"), log
    # what a second Ctrl-C does here: uvicorn's own line said it quit (outside tester 156)
    assert "CTRL+C to force quit" not in log, log
    waiting = "Waiting for connections to close. (Ctrl-C or SIGTERM again stops the runs at "
    assert f"{waiting}their last checkpoint; a third quits)" in log, log
    os.unlink(cli.ledger_path)
    [run] = cli.json("runs", "list")
    asked = cli.expect(3, "resume", run["run_id"])
    assert_in_doubt_asked(asked.out)


@pytest.mark.parametrize("stop", ["SIGTERM x3", "SIGHUP"])
def test_serve_stopped_from_outside_while_a_tool_hangs_ends(cli: Cli, stop: str) -> None:
    """A third SIGTERM was ignored (only Ctrl-C quit), and after SIGHUP no one could press
    Ctrl-C at all: with a tool call hung in its thread, only SIGKILL ended the server (outside
    tester 64). A third SIGTERM quits as a third Ctrl-C does; after SIGHUP the server stops the
    runs, then quits, a grace apart."""
    anyio.run(_create_database, cli.db)
    os.mkfifo(cli.ledger_path)
    server = PtySession(["serve", "--port", "0", "--db", str(cli.db)], cli.env, cli.cwd,
                        controlling=True)  # fmt: skip
    try:
        found = re.search(r"http://127\.0\.0\.1:(\d+)/support", server.expect("/banking"))
        client = approve_a_refund_that_hangs(int(found[1]))
        wait_until_blocked_on_a_fifo(server.proc.pid)  # the tool in its thread, on the ledger
        if stop == "SIGHUP":
            server.hang_up()
        else:
            for _ in range(3):
                server.proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
        assert server.proc.wait(timeout=2 * STOP_GRACE_SECONDS + 15) == 130
        client.join(timeout=30)
    finally:
        server.close()
    os.unlink(cli.ledger_path)
    [run] = cli.json("runs", "list")
    asked = cli.expect(3, "resume", run["run_id"])
    assert_in_doubt_asked(asked.out)


def test_serve_in_a_terminal_that_closes_stops_normally(cli: Cli) -> None:
    """Closing the terminal the server runs in (SIGHUP) killed it on the spot, its runs' leases
    left to a dead process; it drains now, as on Ctrl-C or SIGTERM, and exits 0."""
    anyio.run(_create_database, cli.db)
    server = PtySession(["serve", "--port", "0", "--db", str(cli.db)], cli.env, cli.cwd,
                        controlling=True)  # fmt: skip
    try:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/support", server.expect("/banking"))[1])
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        server.hang_up()
        assert server.proc.wait(timeout=30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        server.close()


def test_serve_hung_up_keeps_logging_to_a_pipe(cli: Cli) -> None:
    """SIGHUP silenced stdout and stderr whatever they were: a log written to a file or a pipe
    stopped at "Application startup complete", the stop never said (outside tester 171). Only
    a terminal that hung up is silenced."""
    anyio.run(_create_database, cli.db)
    server = ServerProcess(cli)
    try:
        server.expect(r"AG-UI endpoints: http://127\.0\.0\.1:(\d+)/support")
        server.proc.send_signal(signal.SIGHUP)
        assert server.proc.wait(timeout=30) == 0
        said = "".join(server.rest())
    finally:
        server.stop()
    assert "Shutting down" in said and said.rstrip().endswith("stopped"), said


@pytest.mark.slow  # (the grace: 5 s)
def test_serve_stops_though_a_client_stalls_mid_upload(cli: Cli) -> None:
    """A client that sent half a request and then nothing kept ``serve`` from stopping after
    SIGTERM, and after a second, with no run in progress: only the client's going away ended
    it (outside tester 171). Such a connection gets a grace, then is closed."""
    from workflow_engine_cli._app import IDLE_CONNECTIONS_GRACE

    anyio.run(_create_database, cli.db)
    server = ServerProcess(cli)
    try:
        port = int(server.expect(r"AG-UI endpoints: http://127\.0\.0\.1:(\d+)/support")[1])
        body = json.dumps({"threadId": "t", "runId": "r", "messages": []}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stalled:
            head = (
                b"POST /support HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            stalled.sendall(head + body[:10])  # ... and nothing more
            time.sleep(0.5)
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=IDLE_CONNECTIONS_GRACE + 15) == 0
        said = "".join(server.rest())
    finally:
        server.stop()
    assert "closing 1 connection(s) that carry no run" in said, said
    assert said.rstrip().endswith("stopped"), said


def test_serve_listens_before_it_logs_its_endpoints() -> None:
    """The endpoints are logged while the app still starts (opens its store): a client that
    connects as soon as it reads them (a test, a health check) is queued, not refused. The
    socket used to be only bound until uvicorn's start-up ended; under load the gap refused
    the first request (the cause of a flaky run of the test above)."""
    from workflow_engine_cli._app import _listen

    sock = _listen(socket.AF_INET, "127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=5):
            accepted, _ = sock.accept()
            accepted.close()
    finally:
        sock.close()


def test_serve_log_level_warning_is_quiet(cli: Cli) -> None:
    anyio.run(_create_database, cli.db)
    with socket.socket() as probe:  # a free port (the server binds it a moment later)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ServerProcess(cli, "--log-level", "warning", port=port)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and server.proc.poll() is None
                time.sleep(0.1)
    finally:
        assert server.stop() == 0
    log = "".join(server.rest())
    assert "uvicorn.access" not in log and "AG-UI endpoints" not in log, log


def test_serve_refuses_a_database_it_cannot_use(cli: Cli) -> None:
    """A damaged file, or one a newer engine wrote: ``serve`` exits 6 with one line, as every
    other command does, instead of starting a server whose every request fails."""
    cli.db.write_bytes(os.urandom(10_000))
    damaged = cli.expect(6, "serve", "--port", "0")
    assert "is damaged" in damaged.error_line() and damaged.out == ""
    cli.db.unlink()
    anyio.run(_create_database, cli.db)
    with sqlite3.connect(cli.db) as raw:
        raw.execute("UPDATE we_schema SET version = version + 1")
    newer = cli.expect(6, "serve", "--port", "0")
    assert "newer" in newer.error_line()


async def _application_run(db: Path, name: str = "stepper") -> tuple[str, str]:
    """A paused run of a workflow the command line does not build (stepper: counts, then asks)
    and a finished one; their ids."""
    from tests.integration.workflows import stepper_workflow
    from workflow_engine import Runtime

    rt = Runtime(SqliteStore(db))
    rt.register(lambda: stepper_workflow(name=name))
    paused = await rt.run(name, 1)
    finished = await rt.run(name, 1)
    await rt.respond(finished.pending_requests[0].request_id, {"approved": True})
    await rt.resume(finished.run_id)
    await rt.close()
    return paused.run_id, finished.run_id


def test_runs_show_of_an_application_run_shows_its_values_as_stored(cli: Cli) -> None:
    paused, finished = anyio.run(_application_run, cli.db)
    waiting = cli.json("runs", "show", paused)
    listed = [r["request_id"] for r in cli.json("requests", "list") if r["run_id"] == paused]
    assert waiting["pending_requests"] == listed and len(listed) == 1
    assert waiting["decoded"] is False
    assert cli.json("runs", "show", finished)["outputs"] == [
        "done: seen=[1, 2, 3, 4, 5, 6] total=21"
    ]
    shown = cli.expect(0, "runs", "show", paused).out
    assert "values are shown as stored" in flat(shown) and f"waiting: {listed[0]}" in shown


async def _failed_run(db: Path) -> str:
    """A run whose handler raised, in a process of its own (as an application's worker)."""
    from tests.unit.test_runner import Boom
    from workflow_engine import Runtime, WorkflowBuilder

    def build() -> Any:
        boom = Boom("boom")
        return WorkflowBuilder("booms", start=boom).add_edge(boom, boom).build()

    rt = Runtime(SqliteStore(db))
    rt.register(build)
    failed = await rt.run("booms", 0)
    await rt.close()
    return failed.run_id


def test_runs_show_says_where_a_failed_run_s_error_was_raised(cli: Cli) -> None:
    """A run that failed elsewhere: ``runs show`` said its error's message, not where it was
    raised (outside tester 149); the traceback follows, to the handler's line."""
    run_id = anyio.run(_failed_run, cli.db)
    shown = cli.expect(0, "runs", "show", run_id).out
    assert "failed with: kaboom (executor_failed)" in shown
    assert "raised at (most recent call last):" in shown and "in explode" in shown
    assert 'raise RuntimeError("kaboom")' in shown
    assert "kaboom" in cli.json("runs", "show", run_id)["error"]["traceback"]


def test_runs_show_of_an_application_run_does_not_load_the_agents(cli: Cli, tmp_path: Path) -> None:
    paused, _ = anyio.run(_application_run, cli.db)
    argv = ["runs", "show", paused, "--db", str(cli.db)]
    printed, loaded = loaded_by(cli, tmp_path / "modules.json", argv)
    assert "waiting: " in printed and "values are shown as stored" in flat(printed)
    assert not [m for m in loaded if m.startswith("workflow_engine.executors")]


@pytest.mark.parametrize("name", ["stepper", "refunds (v2)"])
def test_acting_on_an_application_run_says_where_to_go(cli: Cli, name: str) -> None:
    paused, _ = anyio.run(_application_run, cli.db, name)
    for command in ("resume", "cancel"):
        refused = cli.expect(4, command, paused)
        line = refused.error_line()
        said = (
            f"error: workflow {name!r} is not one the command line builds (bank_transfer, "
            "banking, banking_assistant, review_loop, support): act on its runs from the "
            "application that defines it"
        )
        if command == "resume":
            assert line == said
        else:
            assert line == (
                f"{said}; no worker is executing run {paused!r}, so cancelling it takes a "
                "process that has its workflow"
            )
        assert refused.out == ""  # not "resuming run ..." first


def test_listing_and_naming_requests_does_not_read_old_answers(cli: Cli) -> None:
    """``requests list`` and a shortened request id read request ids, not every request's
    data and answer (a store with 10 MB answers took 14 s to list): a finished run's answer,
    damaged here, is not read; a command that reads it still says it is damaged."""
    done_run, done_request = cli.start_paused()
    cli.expect(0, "respond", done_request, "--approve")
    cli.expect(0, "resume", done_run)
    run_id, request_id = cli.start_paused("I want a refund for order 67890")
    with sqlite3.connect(cli.db) as raw:
        raw.execute("UPDATE requests SET answer = '{damaged' WHERE request_id = ?", (done_request,))

    [pending] = cli.json("requests", "list")
    assert pending["request_id"] == request_id
    listed = cli.expect(0, "requests", "list").out
    assert request_id[:8] in listed and "order_id" in listed
    answered = cli.expect(0, "respond", request_id[:8], "--approve")
    assert "answer stored" in answered.out
    assert f"Run {run_id} finished." in cli.expect(0, "resume", run_id[:8]).out
    damaged = cli.expect(6, "respond", done_request, "--approve").error_line()
    assert f"the answer to request {done_request!r} is damaged" in damaged, damaged


async def _long_draft(db: Path, words: int) -> str:
    """A review_loop run paused on a draft of ``words`` words; its id."""
    from workflow_engine import Runtime
    from workflow_engine_cli.demos.review_loop import build_workflow

    rt = Runtime(SqliteStore(db))
    rt.register(build_workflow)
    run_id = await rt.start("review_loop", " ".join(f"point{n}" for n in range(words)))
    await rt.resume(run_id)
    await rt.close()
    return run_id


def test_requests_list_shows_the_start_of_a_long_request(cli: Cli) -> None:
    """An inbox line shows a long request's first characters and says how to see the rest
    (a 10 MB draft printed 30 MB to the table, outside tester); ``--json`` has all of it."""
    anyio.run(_long_draft, cli.db, 20_000)
    out = cli.expect(0, "requests", "list").out
    assert "point50 " in out and "point19999" not in out
    assert "more characters: --json shows all)" in out and len(out) < 2_000
    [pending] = cli.json("requests", "list")
    assert "point19999" in pending["what"]


def test_runs_show_shows_the_start_of_a_long_output(cli: Cli) -> None:
    """A run's output line is cut like an inbox line (a 4 MB conversation was printed on one
    line, outside tester); ``--json`` has all of it."""
    run_id = anyio.run(_long_draft, cli.db, 20_000)
    cli.expect(0, "respond", cli.json("requests", "list")[0]["request_id"], "--approve")
    cli.expect(0, "resume", run_id)
    out = cli.expect(0, "runs", "show", run_id).out
    assert "output: Published v1: A short note about point0 " in out
    assert "point19999" not in out
    assert "more characters: --json shows all)" in out and len(out) < 3_000
    assert "point19999" in cli.json("runs", "show", run_id)["outputs"][0]


def test_a_database_missing_a_table_is_refused_at_open(cli: Cli) -> None:
    anyio.run(_create_database, cli.db)
    with sqlite3.connect(cli.db) as raw:
        raw.execute("DROP TABLE requests")
    for args in (["runs", "list"], ["serve", "--port", "0"]):
        line = cli.expect(6, *args).error_line()
        assert "is damaged: it has no table requests" in line, line


def test_a_store_that_refuses_a_write_says_once_how_to_continue(cli: Cli) -> None:
    """The store stays locked past its patience while ``resume`` runs (a full disk does the
    same, as a tester saw): the screen says it once and names the command that continues the
    run once the store is usable; that command then finishes it."""
    run_id, request_id = cli.start_paused()
    cli.expect(0, "respond", request_id, "--approve")
    blocker = sqlite3.connect(cli.db, isolation_level=None, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        refused = cli.expect(6, "resume", run_id)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    said = flat(refused.out + refused.err)
    assert said.count("stayed locked by another writer") == 1, str(refused)
    # the command whole on a line of its own (wrapped, a pasted one ran `--db` alone: 195)
    lines = refused.out.splitlines()
    i = lines.index("Nothing committed is lost: once the storage is usable again, continue with:")
    assert lines[i + 1] == f"  workflow-engine resume {run_id} --db {cli.db}", str(refused)
    done = cli.expect(0, "resume", run_id)
    assert "finished." in done.out
    assert len(cli.ledger()) == 1


async def _fork(db: Path, run_id: str, superstep: int) -> str:
    from workflow_engine_cli._registry import open_runtime

    runtime = open_runtime(db, workflows=["support"])
    try:
        return await runtime.fork(run_id, superstep)
    finally:
        await runtime.close()


def test_a_fork_no_one_ran_yet_is_shown_as_not_started(cli: Cli) -> None:
    """A fresh fork is in progress with no worker: it was listed as ``interrupted``, as if a
    process had stopped in it (outside tester). It is ``not_started``, says what it was forked
    from, and ``resume`` runs it."""
    run_id, _ = cli.start_paused()
    fork = anyio.run(_fork, cli.db, run_id, 0)
    listed = {r["run_id"]: r for r in cli.json("runs", "list")}
    assert listed[fork]["status"] == "in_progress" and listed[fork]["worker"] is None
    assert listed[fork]["started"] is False and listed[run_id]["started"] is True
    table = cli.expect(0, "runs", "list").out
    assert [line.split()[2] for line in table.splitlines()[1:]] == [
        "idle_with_pending_requests",
        "not_started",
    ], table
    assert [r["run_id"] for r in cli.json("runs", "list", "--status", "not_started")] == [fork]
    assert cli.json("runs", "list", "--status", "interrupted") == []
    shown = cli.json("runs", "show", fork)
    assert shown["parent_run_id"] == run_id and shown["started"] is False
    said = flat(cli.expect(0, "runs", "show", fork).out)
    assert f"Run {fork} · support · not_started · superstep 0" in said
    assert f"forked from: {run_id} at superstep 0" in said
    shown_lines = cli.expect(0, "runs", "show", fork).out.splitlines()
    assert "not started: run it with:" in shown_lines, shown_lines
    assert f"  workflow-engine resume {fork} --db {cli.db}" in shown_lines  # whole, to paste
    assert cli.json("runs", "show", run_id)["started"] is True
    cli.expect(3, "resume", fork, "--no-interactive")  # it runs, to the same approval
    shown = cli.json("runs", "show", fork)
    assert shown["status"] == "idle_with_pending_requests" and shown["started"] is True
    assert "not started" not in flat(cli.expect(0, "runs", "show", fork).out)


def test_printed_commands_name_the_database_by_its_absolute_path(cli: Cli, tmp_path: Path) -> None:
    """``--db runs.db`` was printed as given: pasted from another directory ("from another
    terminal", as the README says), the command found no database there (tester 76)."""
    paused = cli.expect(3, "demo", "handoff", "-m", REFUND, "--detach", "--db", "rel.db", db=False)
    printed = [line.strip() for line in paused.out.splitlines() if "workflow-engine" in line]
    assert printed and all(line.endswith(f"--db {cli.cwd / 'rel.db'}") for line in printed)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    respond = next(line for line in printed if " --approve " in line)
    pasted = subprocess.run(
        ["bash", "-c", respond.replace("workflow-engine", shlex.quote(str(ENGINE)), 1)],
        capture_output=True,
        text=True,
        env=cli.env,
        cwd=elsewhere,
    )
    assert pasted.returncode == 0 and "answer stored" in pasted.stdout, pasted

    # named by $WORKFLOW_ENGINE_DB (a relative path), the database was left out of them:
    # pasted elsewhere, or without the variable, they read another one (tester 77)
    env = {**cli.env, "WORKFLOW_ENGINE_DB": "from env.db"}
    argv = [str(ENGINE), "demo", "handoff", "-m", REFUND, "--detach"]
    paused = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cli.cwd)
    assert paused.returncode == 3, paused
    printed = [line.strip() for line in paused.stdout.splitlines() if "workflow-engine" in line]
    named = f"--db '{cli.cwd / 'from env.db'}'"
    assert printed and all(line.endswith(named) for line in printed), paused.stdout
    respond = next(line for line in printed if " --approve " in line)
    pasted = subprocess.run(
        ["bash", "-c", respond.replace("workflow-engine", shlex.quote(str(ENGINE)), 1)],
        capture_output=True,
        text=True,
        env=cli.env,  # (a terminal without the variable)
        cwd=elsewhere,
    )
    assert pasted.returncode == 0 and "answer stored" in pasted.stdout, pasted


def test_answers_piped_to_interactive_are_in_its_output(cli: Cli) -> None:
    """``printf ... | demo review --interactive > out``: nothing echoed the answers read from
    the pipe, so the output kept none of them and the next line ran on after each prompt
    ("You: run 5c56..."; outside tester 203). Each answer follows its prompt."""
    answers = 'durable workflows\n{"approved": false, "feedback": "shorter"}\n{"approved": true}\n'
    argv = [str(ENGINE), "demo", "review", "--interactive", "--db", str(cli.db)]
    done = subprocess.run(
        argv, input=answers, capture_output=True, text=True, env=cli.env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "You: durable workflows" in lines, done.stdout
    assert 'Answer (JSON): {"approved": false, "feedback": "shorter"}' in lines, done.stdout
    assert 'Answer (JSON): {"approved": true}' in lines, done.stdout
