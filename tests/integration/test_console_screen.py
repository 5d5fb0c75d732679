"""What a person sees: the installed ``workflow-engine`` in an 80-column pseudo-terminal, read
through a terminal emulator (pyte) from the rendered screen.

The byte stream is not enough: agent text that is printed and then erased by a spinner's redraw
is in the bytes but not on the screen, which is how the demo once hid everything the agents said
while every byte-level test passed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.integration.cli_harness import (
    ENGINE,
    SLOW_REPLY,
    Cli,
    PtySession,
    ScreenSession,
    SlowModel,
    assert_in_doubt_asked,
    flat,
    run_concurrently,
    wait_until_blocked_on_a_fifo,
)
from workflow_engine_cli._app import STOP_GRACE_SECONDS
from workflow_engine_cli._registry import open_runtime

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

REFUND = "I want a refund for order 12345"
SPINNER = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
APPROVE = "Approve? [y]es / [n]o / [e]dit arguments:"

# What the agents say before the approval, each on its own screen line(s), in this order.
BEFORE_APPROVAL = [
    "triage_agent: I'll hand you to our refunds specialist.",
    "↪ handoff to refund_agent",
    "refund_agent: Let me look up order 12345.",
    '→ lookup_order_details({"order_id": "12345"})',
    "← lookup_order_details:",
    "refund_agent: I found order 12345. I'll submit a refund for the full amount.",
    "→ submit_refund(",
    "Approval needed: submit_refund(",
]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture
def sessions() -> Iterator[list[ScreenSession]]:
    opened: list[ScreenSession] = []
    yield opened
    for session in opened:
        session.close()


def open_screen(
    sessions: list[ScreenSession], cli: Cli, *args: str, env: dict[str, str] | None = None
) -> ScreenSession:
    session = ScreenSession([*args, "--db", str(cli.db)], {**cli.env, **(env or {})}, cli.cwd)
    sessions.append(session)
    return session


def in_order(screen: list[str], expected: list[str]) -> None:
    """Each expected text on the screen, in this order (a wrapped line still matches)."""
    text = flat("\n".join(screen))
    at = 0
    for item in expected:
        found = text.find(flat(item), at)
        assert found >= 0, f"{item!r} not on the screen after position {at}:\n" + "\n".join(screen)
        at = found + len(flat(item))


def assert_clean(screen: list[str], columns: int = 80) -> None:
    """No spinner left behind, nothing wider than the window, no traceback."""
    for row in screen:
        assert not SPINNER & set(row), f"spinner left on the screen: {row!r}"
        assert len(row) <= columns
    assert "Traceback" not in "\n".join(screen)


def start_demo(sessions: list[ScreenSession], cli: Cli) -> ScreenSession:
    demo = open_screen(sessions, cli, "demo", "handoff")
    demo.expect_screen("You:")
    demo.send(REFUND)
    demo.expect_screen(APPROVE)
    demo.settle()
    return demo


# --- the demo, approved, rejected, edited -------------------------------------------------------


def test_demo_approved_shows_every_agent_line(cli: Cli, sessions: list[ScreenSession]) -> None:
    demo = start_demo(sessions, cli)
    screen = demo.screen()
    in_order(screen, [*BEFORE_APPROVAL, APPROVE])
    assert cli.ledger() == []  # nothing happens before the user says yes
    # the agent's sentence is one screen line, whole, starting at the left edge
    assert "refund_agent: Let me look up order 12345." in screen

    demo.send("y")
    assert demo.wait() == 0, demo.screen_text()
    screen = demo.screen()
    in_order(
        screen,
        [
            *BEFORE_APPROVAL,
            f"{APPROVE} y",
            '← submit_refund: "Refund of 89.99 for order 12345 submitted."',
            "refund_agent: Refund of 89.99 for order 12345 submitted. case complete.",
            "✓ conversation completed (last agent: refund_agent)",
            "finished.",
        ],
    )
    assert_clean(screen)
    [refund] = cli.ledger()
    assert (refund["kind"], refund["amount"]) == ("refund", 89.99)


@pytest.mark.parametrize("name", ["banking", "transfer"])
def test_an_agents_last_reply_is_said_once(
    cli: Cli, sessions: list[ScreenSession], name: str
) -> None:
    """The run's output is the agent's reply, which the screen had just shown: a summary line
    said it again (outside tester 177)."""
    demo = open_screen(sessions, cli, "demo", name)
    demo.expect_screen("You:")
    demo.send("")  # (the sample message)
    demo.expect_screen("Approve?")
    demo.send("y")
    assert demo.wait() == 0, demo.screen_text()
    rows = [row for row in demo.screen() if row]
    [finished] = [i for i, row in enumerate(rows) if row.endswith(" finished.")]
    agent, _, reply = rows[finished - 1].partition(": ")  # the reply, then the run's end
    assert agent in ("bank_agent", "banking_assistant") and reply, demo.screen_text()
    assert not [row for row in rows if row.startswith("✓") and reply in row], demo.screen_text()


def test_end_ends_the_chat_at_a_terminal_too(cli: Cli, sessions: list[ScreenSession]) -> None:
    """``--end``: end the conversation when no ``--reply`` is left -- it asked for a reply at a
    terminal anyway (outside tester 142)."""
    demo = open_screen(sessions, cli, "demo", "handoff", "-m", "hi", "--end")
    assert demo.wait() == 0, demo.screen_text()
    screen = demo.screen_text()
    assert "conversation ended by user" in flat(screen), screen
    assert "/end to finish" not in screen, screen


def test_a_blank_reply_is_asked_again_not_taken_for_the_end(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """A stray space at the reply prompt ended the conversation for good, where the API
    refuses such a reply (outside tester 177): it is asked again; Enter alone ends it."""
    demo = open_screen(sessions, cli, "demo", "handoff", "-m", "hi")
    demo.expect_screen("You (empty or /end to finish):")
    demo.send("   ")
    said = "A blank reply is no message: press Enter alone (or type /end) to finish."
    demo.expect_screen(f"{said} You (empty or /end to finish):")  # asked again
    assert "conversation ended" not in demo.screen_text()
    demo.send("")
    assert demo.wait() == 0, demo.screen_text()
    assert "conversation ended by user" in flat(demo.screen_text())


def test_an_approval_is_never_answered_by_type_ahead(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """A paste of two lines at the first prompt: the second ("yes") must not answer the
    approval that appears later, which the person has not seen yet (outside tester)."""
    demo = open_screen(sessions, cli, "demo", "handoff")
    demo.expect_screen("You:")
    demo.send_raw(f"{REFUND}\ryes\r".encode())
    demo.expect_screen(APPROVE)
    demo.settle()
    assert f"{APPROVE} yes" not in flat(demo.screen_text())
    assert cli.ledger() == []  # the refund waits for an answer typed after the question
    demo.send("y")
    assert demo.wait() == 0, demo.screen_text()
    assert len(cli.ledger()) == 1


def test_an_answer_the_store_refuses_says_how_to_continue(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """The answer typed at the approval prompt cannot be stored (another writer holds the
    database past the store's patience): the screen says so once and names the command that
    asks again; nothing was approved (outside tester: the command was missing here)."""
    import sqlite3

    demo = start_demo(sessions, cli)
    blocker = sqlite3.connect(cli.db, isolation_level=None, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        demo.send("y")
        code = demo.wait()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    text = flat(demo.screen_text())
    assert code == 6, text
    assert text.count("stayed locked by another writer") == 1, text
    # the command on a line of its own, whole (after "continue with:", not in backticks)
    assert "continue with: workflow-engine resume" in text, text
    assert cli.ledger() == []


def test_an_answer_given_elsewhere_meanwhile_stands_and_the_run_goes_on(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """At the approval prompt while another terminal rejected the call: the ``y`` typed here
    ended the command with "already answered with a different value", exit 5, and nothing
    said how to go on (outside tester 113). The other answer stands, said as it is (the screen
    read as if the ``y`` had been sent: tester 172); the run goes on."""
    demo = start_demo(sessions, cli)
    [asked] = cli.json("requests", "list", "--json")
    cli.expect(0, "respond", asked["request_id"], "--reject")
    demo.send("y")
    demo.expect_screen("You (empty or /end to finish):")
    in_order(
        demo.screen(),
        [APPROVE, "another answer was stored meanwhile, and stands", "rejected"],
    )
    said = flat(demo.screen_text())
    assert "and stands -- approve submit_refund(" in said and "): rejected" in said, said
    demo.send("/end")
    assert demo.wait() == 0, demo.screen_text()
    assert cli.ledger() == []  # rejected: no refund


@pytest.mark.parametrize("answer_there", ["--approve", "--reject"])
def test_an_answer_given_after_another_terminal_finished_the_run_says_so(
    cli: Cli, sessions: list[ScreenSession], answer_there: str
) -> None:
    """At the approval prompt while another terminal answered and resumed the run to its end:
    the ``y`` typed here said the run was "idle; nothing to resume", exit 5 (outside tester
    113). It says the run was continued elsewhere and finished; exit 0."""
    demo = start_demo(sessions, cli)
    [asked] = cli.json("requests", "list", "--json")
    cli.expect(0, "respond", asked["request_id"], answer_there)
    cli.expect(0, "resume", asked["run_id"], "--end")
    [run] = cli.json("runs", "list", "--json")
    assert run["status"] == "idle", run
    demo.send("y")
    assert demo.wait() == 0, demo.screen_text()
    said = flat(demo.screen_text())
    assert f"Run {asked['run_id']} was continued elsewhere, and finished there." in said, said
    assert "nothing to resume" not in said, said


def at_the_approval_prompt(sessions: list[ScreenSession], cli: Cli) -> ScreenSession:
    """The demo asked for the refund's approval, on its controlling terminal (there the line
    discipline makes Ctrl-C a SIGINT)."""
    demo = ScreenSession(
        ["demo", "handoff", "--db", str(cli.db)], cli.env, cli.cwd, controlling=True
    )
    sessions.append(demo)
    demo.expect_screen("You:")
    demo.send(REFUND)
    demo.expect_screen(APPROVE)
    demo.settle()
    return demo


@pytest.mark.parametrize("key", [b"\x04", b"\x03"])  # Ctrl-D (end of input), Ctrl-C
@pytest.mark.parametrize("resumed_there", [True, False])
def test_leaving_a_prompt_another_terminal_answered_offers_no_answer_that_fails(
    cli: Cli, sessions: list[ScreenSession], key: bytes, resumed_there: bool
) -> None:
    """Ctrl-D or Ctrl-C at the approval prompt after another terminal answered it (and
    maybe continued the run to its end): the pause block offered ``respond`` commands that
    then failed, for a run that had finished (outside tester 118)."""
    demo = at_the_approval_prompt(sessions, cli)
    [asked] = cli.json("requests", "list", "--json")
    cli.expect(0, "respond", asked["request_id"], "--reject")
    if resumed_there:
        cli.expect(0, "resume", asked["run_id"], "--end")
    demo.send_raw(key)
    code = demo.wait()
    said = flat(demo.screen_text())
    assert "workflow-engine respond" not in said, said
    if resumed_there:
        assert code == 0, said
        assert f"Run {asked['run_id']} was continued elsewhere, and finished there." in said
    else:
        assert code == 3, said
        assert "answered meanwhile from elsewhere: that answer stands" in said, said
        assert f"workflow-engine resume {asked['run_id']}" in said, said
        resumed = cli.expect(0, "resume", asked["run_id"], "--end")
        assert "rejected" in resumed.out, resumed.out


def test_approval_prompt_fits_a_40_column_window(cli: Cli, sessions: list[ScreenSession]) -> None:
    """In a narrow window the prompt is the short one, whole on one screen line with the
    answer (the long one would leave its last characters alone on the next line)."""
    session = ScreenSession(["demo", "handoff", "--db", str(cli.db)], cli.env, cli.cwd, columns=40)
    sessions.append(session)
    session.expect_screen("You:")
    session.send(REFUND)
    session.expect_screen("Approve? [y/n/e]:")
    session.settle()
    # the edit prompt too: its explanation wrapped between words, a short prompt to type at
    # (the long one broke mid-word at the window's edge, outside tester)
    session.send("e")
    session.expect_screen("JSON:")
    session.settle()
    rows = [row.rstrip() for row in session.screen()]
    assert rows[-1].strip() == "JSON:", rows
    assert any(row.strip().startswith("Arguments to change, as JSON") for row in rows), rows
    assert all(row == "" or not row[-1].isalpha() or len(row) < 40 for row in rows), rows
    session.send("")  # back to the question
    session.expect_screen("Approve? [y/n/e]:")
    session.settle()
    session.send("y")
    assert session.wait() == 0, session.screen_text()
    screen = session.screen()
    assert "Approve? [y/n/e]: y" in [row.rstrip() for row in screen], screen
    assert APPROVE not in flat("\n".join(screen))
    assert_clean(screen, columns=40)
    assert len(cli.ledger()) == 1


def test_a_window_narrower_than_twenty_columns_shows_every_word_whole(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """Text was wrapped at 20 columns at least: in a window of 16 the terminal folded every
    line again and cut words everywhere (``I'`` / ``ll``: outside tester 214). Lines are
    wrapped at the window's width however narrow, and continuation lines drop the speaker's
    indent when it would leave too little room."""
    session = ScreenSession(
        ["demo", "handoff", "--approve", "-m", REFUND, "--db", str(cli.db)],
        cli.env,
        cli.cwd,
        columns=16,
    )
    sessions.append(session)
    assert session.wait() == 0, session.screen_text()
    rows = session.screen()
    words = {word for row in rows for word in row.split()}
    said = "I'll hand you to our refunds specialist. I found order 12345."
    assert all(word in words for word in said.split()), rows


def test_in_a_window_too_narrow_for_the_prompt_the_question_has_a_line_of_its_own(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """At 16 columns ``Approve? [y/n/e]:`` broke mid-word at the window's edge, and the answer
    landed out of place (outside tester 217): the question is a line, the choices the
    prompt."""
    session = ScreenSession(["demo", "handoff", "--db", str(cli.db)], cli.env, cli.cwd, columns=16)
    sessions.append(session)
    session.expect_screen("You:")
    session.send(REFUND)
    session.expect_screen("[y/n/e]:")
    session.settle()
    rows = session.screen()
    assert [rows[-2].strip(), rows[-1].strip()] == ["Approve?", "[y/n/e]:"], rows
    session.send("y")
    assert session.wait() == 0, session.screen_text()
    assert "[y/n/e]: y" in [row.strip() for row in session.screen()]
    assert len(cli.ledger()) == 1


def test_a_prompt_asked_again_fits_the_window_as_it_is_now(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """The approval prompt's form was chosen once, at the first asking: narrowed meanwhile,
    the window got the long form again after a wrong answer, folded, its ``:`` alone on a
    line (outside tester 214)."""
    demo = at_the_approval_prompt(sessions, cli)
    demo.resize(40)
    demo.send("maybe")
    demo.expect_screen("or e (edit its arguments)")
    demo.settle()
    assert demo.screen()[-1].rstrip() == "Approve? [y/n/e]:", demo.screen()
    demo.send("y")
    assert demo.wait() == 0, demo.screen_text()


def test_demo_rejected_shows_the_reply_before_asking(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    demo = start_demo(sessions, cli)
    demo.send("n")
    demo.expect_screen("You (empty or /end to finish):")
    demo.settle()
    # what the agent just said is on the screen when the user is asked to answer it
    in_order(
        demo.screen(),
        [
            *BEFORE_APPROVAL,
            f"{APPROVE} n",
            "← submit_refund: error: The user rejected this tool call; it was not executed.",
            "refund_agent: Okay, I did not submit the refund. Is there anything else I can do?",
            "You (empty or /end to finish):",
        ],
    )
    demo.send("/end")
    assert demo.wait() == 0, demo.screen_text()
    screen = demo.screen()
    in_order(screen, ["You (empty or /end to finish): /end", "conversation ended by user"])
    assert_clean(screen)
    assert cli.ledger() == []


def test_demo_edited_arguments_are_asked_again_until_valid(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    demo = start_demo(sessions, cli)
    demo.send("e")
    edit = "Arguments to change, as JSON (empty: back):"
    demo.expect_screen(edit)
    demo.send('{"amount": "lots"}')
    demo.expect_screen("Input should be a valid number")
    demo.expect_prompt(edit)  # (asked again: what is typed before it is dropped)
    demo.send("{oops")
    demo.expect_screen("not JSON")
    demo.expect_prompt(edit)
    demo.send("")  # back to the question, which still accepts y/n/e
    demo.settle()
    assert demo.screen()[-1] == APPROVE
    demo.send("maybe")
    demo.expect_screen("answer y (run it), n (do not run it) or e (edit its arguments)")
    demo.expect_prompt(APPROVE)
    demo.send("e")
    demo.settle()
    demo.send('{"amount": 50}')
    assert demo.wait() == 0, demo.screen_text()
    screen = demo.screen()
    in_order(
        screen,
        [
            "Approval needed: submit_refund(",
            f"{APPROVE} e",
            '{"amount": "lots"}',
            "invalid arguments for tool 'submit_refund': amount: Input should be a valid number",
            "{oops",
            "not JSON",
            f"{APPROVE} maybe",
            f"{APPROVE} e",
            '{"amount": 50}',
            # what runs, not only the model's call further up (outside tester)
            'runs as: submit_refund({"order_id": "12345", "amount": 50,',
            '← submit_refund: "Refund of 50.00 for order 12345 submitted."',
            "refund_agent: Refund of 50.00 for order 12345 submitted. case complete.",
        ],
    )
    assert_clean(screen)
    [refund] = cli.ledger()
    assert refund["amount"] == 50.0


@pytest.mark.parametrize("key", [b"\x04", b"\x03"])  # Ctrl-D (end of input), Ctrl-C
def test_ctrl_d_or_c_at_a_prompt_leaves_the_run_paused(
    cli: Cli, sessions: list[ScreenSession], key: bytes
) -> None:
    """Both say how to continue, request by request (Ctrl-C said only "Interrupted: run ...
    keeps its last checkpoint", of a run that was paused: outside tester 113)."""
    demo = at_the_approval_prompt(sessions, cli)
    demo.send_raw(key)
    assert demo.wait() == 3, demo.screen_text()
    screen = demo.screen()
    said = [APPROVE, "is paused, waiting for input.", "asks: approve submit_refund("]
    in_order(screen, [*said, "--approve", "--reject", "workflow-engine resume"])
    assert "Interrupted" not in demo.screen_text()
    assert_clean(screen)
    [pending] = cli.json("requests", "list")
    assert pending["what"].startswith("approve submit_refund(")


# --- the review demo: any request type -----------------------------------------------------------


def test_review_prompt_shows_the_shape_and_asks_again(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    review = open_screen(sessions, cli, "demo", "review", "-m", "durable workflows")
    review.expect_screen("Answer (JSON):")
    review.settle()
    in_order(
        review.screen(),
        [
            "Request review is waiting for an answer:",
            "topic: durable workflows",
            "version: 1",
            "text: A short note about durable workflows.",
            'answer as JSON: {"approved": true|false, "feedback"?: "text"}',
            "approved: publish this version as it is?",
            "Answer (JSON):",
        ],
    )
    # each answer once the prompt is asked again: keys typed before it are dropped (a flake:
    # the second answer, sent as the error appeared, was lost in 1 CI run of many)
    review.send("yes")
    review.expect_screen("not JSON")
    review.expect_prompt("Answer (JSON):")
    review.send('{"approved": "maybe"}')
    review.expect_screen("Input should be a valid boolean")
    review.expect_prompt("Answer (JSON):")
    review.send('{"approved": false, "feedback": "add an example"}')
    review.expect_screen("version: 2")
    review.expect_prompt("Answer (JSON):")  # (sent as "version: 2" showed, it could be dropped)
    review.send('{"approved": true}')
    assert review.wait() == 0, review.screen_text()
    screen = review.screen()
    in_order(
        screen,
        [
            "Answer (JSON): yes",
            'not JSON (Expecting value at column 1); expected {"approved": true|false,',
            "approved: Input should be a valid boolean",
            "text: A short note about durable workflows. (revised: add an example)",
            "output: Published v2: A short note about durable workflows. (revised: add an",
        ],
    )
    assert flat("\n".join(screen)).count("Published v2") == 1  # shown once, not again at the end
    assert_clean(screen)


# --- a real model streaming slowly: text and spinner take turns --------------------------------


def open_slow_demo(sessions: list[ScreenSession], cli: Cli, model: SlowModel) -> ScreenSession:
    """The support demo on ``model``, started with a message (no first prompt)."""
    url = f"http://127.0.0.1:{model.server_address[1]}/v1"
    return open_screen(
        sessions, cli, "demo", "handoff", "-m", "My headphones arrived broken",
        "--model", "slow", "--base-url", url, "--api-key", "k",
    )  # fmt: skip


def test_streamed_text_stays_while_the_spinner_works(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    with SlowModel() as model:
        demo = open_slow_demo(sessions, cli, model)
        demo.expect_screen("You (empty or /end to finish):")
        demo.settle()
        assert any(frame.encode() in demo.raw for frame in SPINNER)  # it did spin meanwhile
        screen = demo.screen()
        in_order(screen, ["You: My headphones arrived broken", f"triage_agent: {SLOW_REPLY}"])
        assert screen[-3].startswith("triage_agent: Thank you for writing.")  # wrapped, whole
        demo.send("/end")
        assert demo.wait() == 0, demo.screen_text()
    assert_clean(demo.screen())


def test_the_spinner_leaves_nothing_behind_in_a_very_narrow_window(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """Under 20 columns every frame was written 19 columns wide, wrapped, and left a line
    behind: within seconds the screen was all spinner lines (outside tester 113)."""
    with SlowModel(think=1.5) as model:
        url = f"http://127.0.0.1:{model.server_address[1]}/v1"
        demo = ScreenSession(
            ["demo", "handoff", "-m", "hi", "--model", "slow", "--base-url", url,
             "--api-key", "k", "--db", str(cli.db)],
            cli.env, cli.cwd, columns=15,
        )  # fmt: skip
        sessions.append(demo)
        demo.expect_screen("finish):")
        assert any(frame.encode() in demo.raw for frame in SPINNER)  # it did spin meanwhile
        left = [row for row in demo.screen() if SPINNER & set(row)]
        assert left == [], demo.screen_text()
        demo.send("/end")
        assert demo.wait() == 0, demo.screen_text()


def test_a_reply_cut_off_fails_the_turn_and_says_the_resume_whole(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """The model's server stopped mid-reply, its stream ending with the connection: the half
    reply was stored as the agent's whole one and the run asked for the user's answer to it.
    The turn fails, and the command that retries it is written whole -- it was broken at the
    window's edge, so a copy of it ran ``--db`` without its path (outside tester 177)."""
    db = tmp_path / "a-database-path-long-enough-to-reach-the-edge" / "runs.db"
    db.parent.mkdir()
    with SlowModel(think=0.2, broken=True) as model:
        url = f"http://127.0.0.1:{model.server_address[1]}/v1"
        demo = ScreenSession(
            ["demo", "handoff", "-m", "hi", "--model", "slow", "--base-url", url,
             "--api-key", "k", "--db", str(db)],
            cli.env, cli.cwd, columns=60,
        )  # fmt: skip
        sessions.append(demo)
        assert demo.wait() == 1, demo.screen_text()
    said = demo.screen_text()
    assert "broke off its reply mid-stream" in flat(said), said
    (run_id,) = re.findall(r"Run ([0-9a-f]{32}) ended failed", flat(said))
    assert f"workflow-engine resume {run_id} --db {db}".encode() in demo.raw, said


def test_keys_typed_while_an_agent_works_are_not_echoed_into_its_text(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """Keys pressed while an agent spoke were discarded before the next prompt, but the
    terminal had echoed them in the middle of the agent's text (outside tester). What is
    typed at the prompt is still shown."""
    with SlowModel(per_word=0.12) as model:
        demo = open_slow_demo(sessions, cli, model)
        demo.expect_screen("triage_agent: Thank you")  # streaming, a word at a time
        demo.send_raw(b"zqxj-typed-early")
        demo.expect_screen("You (empty or /end to finish):")
        demo.settle()
        assert "zqxj" not in demo.screen_text()
        demo.send_raw(b"/end")
        demo.settle()
        assert "/end" in demo.screen_text()  # echoed at the prompt, as typed
        demo.send_raw(b"\r")
        assert demo.wait() == 0, demo.screen_text()
    assert "zqxj" not in demo.screen_text()
    assert_clean(demo.screen())


def test_keys_typed_after_a_stop_and_fg_are_not_echoed_either(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """Stopped (Ctrl-Z) and continued (``fg``) while an agent spoke: the shell had set the
    terminal to echo, keys typed then landed in the agent's text, and the text went on from
    column 0 after the shell's ``fg`` line (outside tester 208). Echo is off again, and the
    text goes on from a line of its own, at its indent."""
    import signal
    import termios

    with SlowModel(per_word=0.12) as model:
        demo = open_slow_demo(sessions, cli, model)
        demo.expect_screen("triage_agent: Thank you")
        demo.proc.send_signal(signal.SIGSTOP)
        time.sleep(0.3)
        settings = termios.tcgetattr(demo.master)  # as a shell sets it while it has it
        settings[3] |= termios.ECHO
        termios.tcsetattr(demo.master, termios.TCSANOW, settings)
        with open(f"/proc/{demo.proc.pid}/fd/1", "w") as screen:
            screen.write("\r\n$ fg\r\n")  # (what the shell writes before it continues it)
        demo.proc.send_signal(signal.SIGCONT)
        time.sleep(0.3)
        demo.send_raw(b"zqxj-typed-after-fg")
        demo.expect_screen("You (empty or /end to finish):")
        demo.settle()
        text = demo.screen_text()
        assert "zqxj" not in text, text
        after = text.split("$ fg", 1)[1].splitlines()[1]
        assert after.startswith(" " * len("triage_agent: ")) and after.strip(), text
        demo.send_raw(b"/end\r")
        assert demo.wait() == 0, demo.screen_text()


def test_a_terminated_run_leaves_the_terminal_echoing(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """Echo is off while an agent works; SIGTERM (from ``timeout``, a script: no shell restores
    the terminal after it) left it off for whatever ran next in that terminal (review). SIGTERM
    now stops the command as Ctrl-C does (exit 3), the terminal set back on the way out."""
    import signal
    import termios

    with SlowModel(think=30) as model:
        demo = open_slow_demo(sessions, cli, model)
        demo.expect_screen("is working")
        assert not termios.tcgetattr(demo.master)[3] & termios.ECHO  # hidden while it works
        demo.proc.send_signal(signal.SIGTERM)
        assert demo.wait() == 3, demo.screen_text()
    assert termios.tcgetattr(demo.master)[3] & termios.ECHO


def test_a_run_in_a_shells_background_is_not_stopped_by_the_terminal(tmp_path: Path) -> None:
    """``workflow-engine demo ... &`` from an interactive shell: setting the terminal from the
    background stopped the job ("Stopped (tty output)") before it ran (review). Detached, it
    runs to its pause; asking, it runs up to the question (which needs the terminal)."""
    import os
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: an interactive shell on the pseudo-terminal, with job control
        os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], {**os.environ, "PS1": "$ "})
    said = b""

    def read_until(text: bytes, seconds: float) -> None:
        nonlocal said
        deadline = time.monotonic() + seconds
        while text not in said and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    said += os.read(fd, 65536)
                except OSError:
                    break

    def job_state() -> bytes:
        """What ``jobs`` says of the job once it stopped or ended."""
        nonlocal said
        for _ in range(60):
            said = b""
            os.write(fd, b"jobs -l; echo JOBS-END\n")
            read_until(b"JOBS-END\r\n", 5)
            if b"Stopped" in said or b"Done" in said or b"Exit" in said:
                return said
            time.sleep(0.5)
        return said

    engine = Path(sys.executable).parent / "workflow-engine"
    demo = f"{engine} demo handoff -m 'I want a refund for order 12345'"
    try:
        detached = tmp_path / "detached.txt"
        os.write(fd, f"{demo} --detach --db {tmp_path / 'a.db'} > {detached} 2>&1 &\n".encode())
        state = job_state()
        assert b"Exit 3" in state, state  # paused, as in the foreground
        assert "is paused, waiting for input" in detached.read_text()
        asking = tmp_path / "asking.txt"
        os.write(fd, f"{demo} --db {tmp_path / 'b.db'} > {asking} 2>&1 &\n".encode())
        state = job_state()
        assert b"Stopped" in state, state  # stopped at the question: it needs the terminal
        assert "Approval needed: submit_refund(" in asking.read_text()  # not stopped before it
    finally:
        os.write(fd, b"kill -9 %1 %2 2>/dev/null; exit\n")
        read_until(b"exit", 2)
        os.close(fd)
        os.waitpid(pid, 0)


def test_with_its_output_in_a_file_the_approval_is_still_asked_on_the_screen(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``demo > file`` at a terminal: every prompt, the approval included, went into the file,
    the screen stayed blank, and a blind ``y`` approved a refund no one had seen (outside
    tester). The questions go to the terminal (stderr); the transcript to the file."""
    log = tmp_path / "transcript.txt"
    argv = ["demo", "handoff", "--db", str(cli.db)]
    demo = ScreenSession(argv, cli.env, cli.cwd, stdout=log)
    sessions.append(demo)
    demo.expect_screen("You:")
    demo.send("I want a refund for order 12345")
    demo.expect_screen("Approve?")
    assert "submit_refund(" in flat(demo.screen_text())  # what is approved, on the screen
    demo.send("y")
    assert demo.wait() == 0, demo.screen_text()
    written = log.read_text()
    assert "refund_agent: Refund of 89.99 for order 12345 submitted." in written
    assert "Approve?" not in written and "finished" in written
    # the person's side too, in order: the file read as a conversation without it (outside
    # tester 191: neither the typed message nor the decision was in it)
    in_order(
        [written],
        ["You: I want a refund for order 12345", "Approval: submit_refund(", ") approved"],
    )


def test_with_its_output_in_a_file_a_reply_is_asked_with_its_question_on_the_screen(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``demo > file``: the agent's question went into the file, and the screen asked "You
    (empty or /end to finish):" of nothing it showed (outside tester 172)."""
    log = tmp_path / "transcript.txt"
    demo = ScreenSession(["demo", "handoff", "--db", str(cli.db)], cli.env, cli.cwd, stdout=log)
    sessions.append(demo)
    demo.expect_screen("You:")
    demo.send("hello")
    demo.expect_screen("You (empty or /end to finish):")
    in_order(demo.screen(), ["triage_agent:", "What can I do for you?", "You (empty"])
    demo.send("please refund my order 12345")
    demo.expect_screen("Approve?")
    demo.send("n")
    demo.expect_prompt("You (empty or /end to finish):")
    demo.send("/end")
    assert demo.wait() == 0, demo.screen_text()
    written = log.read_text()
    assert "What can I do for you?" in written
    # the person's side too (outside tester 191: the typed reply and the decision were not)
    in_order(
        [written],
        [
            "You: hello",
            "What can I do for you?",
            "You: please refund my order 12345",
            "Approval: submit_refund(",
            ") rejected",
        ],
    )


def test_with_its_output_in_a_file_the_transcript_keeps_what_each_answer_answered(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``demo review > file``: the file kept the person's answers -- ``Answer: {"approved":
    false, ...}`` twice -- but not the drafts they judged (outside tester 195). The request
    and its data go to the file too, before the answer."""
    log = tmp_path / "transcript.txt"
    demo = ScreenSession(["demo", "review", "--db", str(cli.db)], cli.env, cli.cwd, stdout=log)
    sessions.append(demo)
    demo.expect_screen("You:")
    demo.send("")
    demo.expect_prompt("Answer (JSON):")
    demo.send('{"approved": false, "feedback": "shorter"}')
    demo.expect_screen("version: 2")
    demo.expect_prompt("Answer (JSON):")
    demo.send('{"approved": true}')
    assert demo.wait() == 0, demo.screen_text()
    written = log.read_text()
    assert "answer as JSON" not in written  # (how to answer: for the screen only)
    in_order(
        [written],
        [
            "Request review is waiting for an answer:",
            "version: 1",
            "text: A short note about durable workflows.",
            'Answer: {"approved": false, "feedback": "shorter"}',
            "Request review is waiting for an answer:",
            "version: 2",
            "(revised: shorter)",
            'Answer: {"approved": true}',
            "Published v2",
        ],
    )


def test_with_its_output_in_a_file_a_message_typed_as_the_prompt_shows_is_read(
    cli: Cli, tmp_path: Path
) -> None:
    """With output in a file the prompt is written to the terminal before the read, and the
    type-ahead was dropped after it: a message typed the moment ``You:`` showed was echoed,
    then dropped -- the demo waited on (outside tester 154: 7 of 10 scripted runs, 10 of 10
    here). Typed by a script the instant the prompt's bytes arrive, three times."""
    import pty
    import select

    for attempt in range(3):
        master, slave = pty.openpty()
        log = (tmp_path / f"transcript{attempt}.txt").open("wb")
        argv = [str(ENGINE), "demo", "handoff", "--db", str(tmp_path / f"runs{attempt}.db")]
        demo = subprocess.Popen(
            argv, stdin=slave, stdout=log, stderr=slave, env=cli.env, start_new_session=True
        )
        os.close(slave)
        seen = b""
        try:
            deadline = time.monotonic() + 30
            while b"You:" not in seen and time.monotonic() < deadline:
                if select.select([master], [], [], 1)[0]:
                    seen += os.read(master, 4096)
            os.write(master, b"I want a refund for order 12345\r")  # (at once)
            while b"Approve?" not in seen and time.monotonic() < deadline:
                if select.select([master], [], [], 1)[0]:
                    seen += os.read(master, 4096)
            assert b"Approve?" in seen, seen.decode(errors="replace")[-300:]
        finally:
            demo.kill()
            demo.wait()
            os.close(master)
            log.close()


@pytest.mark.parametrize("redirected", ["stdout", "stderr"])
def test_a_terminal_closed_at_a_prompt_leaves_how_to_continue_in_the_log(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path, redirected: str
) -> None:
    """``demo > log`` at the approval prompt, then the window closed: the read from the hung-up
    terminal failed (EIO) instead of ending the input, and the log kept nothing of how to
    continue (outside tester 113). It ends as Ctrl-D does: the log says it, request by
    request. With ``demo 2> log`` what says how to continue went to the closed terminal
    (stdout), and the log kept nothing (outside tester 177): it goes to the log, in plain
    lines (tester 179: with escape codes)."""
    log = tmp_path / "log.txt"
    argv = ["demo", "handoff", "-m", REFUND, "--db", str(cli.db)]
    demo = ScreenSession(argv, cli.env, cli.cwd, controlling=True, **{redirected: log})
    sessions.append(demo)
    demo.expect_screen("Approve?")
    time.sleep(0.3)  # (in the line editor)
    demo.hang_up()
    assert demo.proc.wait(timeout=STOP_GRACE_SECONDS + 10) == 3
    written = log.read_text()
    assert "\x1b" not in written, written
    said = ["is paused, waiting for input.", "asks: approve submit_refund(", "--approve"]
    in_order(written.splitlines(), [*said, "--reject", "workflow-engine resume"])


@pytest.mark.parametrize("presses", [1, 3, "SIGTERM"])
def test_ctrl_c_while_an_agent_works_names_the_run_to_resume(
    cli: Cli, sessions: list[ScreenSession], presses: int | str
) -> None:
    """Pressed several times in a row (an impatient person), Ctrl-C still ends with the line
    that says how to continue; it used to exit 130 without it (outside tester). SIGTERM (a
    process manager, ``timeout``) stops the command the same way: it died (exit 143) with the
    run's lease left to the dead process (outside tester 58)."""
    with SlowModel(think=30) as model:
        demo = open_slow_demo(sessions, cli, model)
        demo.expect_screen("is working")
        if presses == "SIGTERM":
            os.kill(demo.proc.pid, signal.SIGTERM)
        for n in range(presses if isinstance(presses, int) else 0):
            if n:
                time.sleep(0.03)
            demo.interrupt()
        assert demo.wait() == 3, demo.screen_text()
    [run] = cli.json("runs", "list", "--json")
    screen = demo.screen()
    in_order(
        screen, [f"Interrupted: run {run['run_id']}", f"workflow-engine resume {run['run_id']}"]
    )
    # whole and copyable: with the database it was given (it was left out, outside tester)
    # (one line, which the 80-column terminal wraps: compared without the wrapping)
    said = "".join("".join(screen).split())
    assert (
        "".join(f"Continue with: workflow-engine resume {run['run_id']} --db {cli.db}".split())
        in said
    )
    assert "RUN_ID" not in "\n".join(screen)
    assert_clean(screen)
    assert run["status"] == "in_progress" and run["worker"] is None  # no one works on it now
    assert "interrupted" in cli.expect(0, "runs", "list").out  # what the table says


@pytest.mark.parametrize("when", ["an agent works", "it asks for approval"])
def test_closing_the_terminal_gives_the_run_back(
    cli: Cli, sessions: list[ScreenSession], when: str
) -> None:
    """Closing the terminal window (SIGHUP, every write failing from then on) killed the
    command with the run's lease left to the dead process: another terminal's ``resume`` was
    refused as busy until the lease ran out. It stops now as on Ctrl-C (exit 3): the run
    keeps its last checkpoint, no one holds it, and it continues elsewhere to its end."""
    with SlowModel(think=30) as model:
        url = f"http://127.0.0.1:{model.server_address[1]}/v1"
        slow = ["-m", "My headphones arrived broken", "--model", "slow", "--base-url", url]
        model_args = [*slow, "--api-key", "k"] if when == "an agent works" else ["-m", REFUND]
        demo = ScreenSession(
            ["demo", "handoff", *model_args, "--db", str(cli.db)],
            cli.env,
            cli.cwd,
            controlling=True,
        )
        sessions.append(demo)
        demo.expect_screen("is working" if when == "an agent works" else APPROVE)
        demo.hang_up()
        assert demo.proc.wait(timeout=15) == 3
    [run] = cli.json("runs", "list", "--json")
    assert run["worker"] is None  # no one works on it now
    if when == "an agent works":
        assert run["status"] == "in_progress"
        return
    assert run["status"] == "idle_with_pending_requests"
    done = cli.expect(0, "resume", run["run_id"], "--approve")
    assert "Refund of 89.99 for order 12345 submitted." in done.out


def approve_a_refund_that_hangs(
    sessions: list[ScreenSession],
    cli: Cli,
    *,
    controlling: bool = False,
    stdout: Path | None = None,
) -> ScreenSession:
    """The demo with its refund approved and blocked in its thread: the ledger is a FIFO no
    one reads (the tool first reads it; a writer opening and closing it lets that through,
    then its append waits for a reader). ``controlling``: the window is the process's
    controlling terminal (closing it hangs the process up); ``stdout``: a file instead of it
    (``> log``: then the spinner is not on the screen, and a moment is waited instead)."""
    os.mkfifo(cli.ledger_path)
    argv = ["demo", "handoff", "-m", REFUND, "--db", str(cli.db)]
    demo = ScreenSession(argv, cli.env, cli.cwd, controlling=controlling, stdout=stdout)
    sessions.append(demo)
    demo.expect_screen(APPROVE)
    demo.send("y")
    if stdout is None:
        demo.expect_screen("is working")
    else:
        demo.settle()
        wait_until_blocked_on_a_fifo(demo.proc.pid)  # (the call under way, on the FIFO)
    return demo


def stop_twice(demo: ScreenSession) -> None:
    """Ctrl-C (it waits for the step under way), Ctrl-C again (it stops waiting): exit 3."""
    demo.interrupt()
    demo.expect_screen("stopping")
    demo.interrupt()
    assert demo.wait(timeout=15) == 3, demo.screen_text()


def test_one_ctrl_c_waits_for_the_call_and_says_nothing_is_left_running(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """Ctrl-C once while the approved refund is blocked (the ledger is a FIFO), then the ledger
    lets it through: the command waits for it and ends. It must not claim a call was still
    running -- an idle worker thread of an earlier call is not one -- and ``resume`` goes on
    without asking: the refund is recorded, made once."""
    demo = approve_a_refund_that_hangs(sessions, cli)
    demo.interrupt()
    demo.expect_screen("stopping")
    written: list[bytes] = []
    # the tool reads the ledger (a writer lets the read end), then appends (a reader takes it)
    with open(cli.ledger_path, "wb"):
        pass
    reader = threading.Thread(target=lambda: written.append(cli.ledger_path.read_bytes()))
    reader.start()
    assert demo.wait(timeout=15) == 3, demo.screen_text()
    reader.join(timeout=15)
    assert b'"kind": "refund"' in written[0]
    said = flat(demo.screen_text())
    assert "Interrupted: run" in said
    assert "A call was still running" not in said, said
    os.unlink(cli.ledger_path)
    [run] = cli.json("runs", "list", "--json")
    done = cli.expect(0, "resume", run["run_id"])
    assert "In doubt" not in done.out and "(InDoubtEffect)" not in done.out
    assert not cli.ledger()  # (the FIFO took the refund: it was not made again)


def test_sigterm_while_a_tool_hangs_says_the_wait_ends_by_itself(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """SIGTERM (``timeout``, a process manager) while the approved refund hangs: the spinner
    said "Ctrl-C again stops waiting", to no one there to press it, and not that the wait ends
    by itself (outside tester 156). It says how long it waits at most (on 80 columns, beside
    the seconds it has waited); Ctrl-C still ends it."""
    demo = approve_a_refund_that_hangs(sessions, cli)
    demo.proc.send_signal(signal.SIGTERM)
    waits = f"stopping: a step under way finishes first · {STOP_GRACE_SECONDS:g} s at most"
    demo.expect_screen(f"{waits} (Ctrl-C: now)")
    demo.interrupt()
    assert demo.wait(timeout=15) == 3, demo.screen_text()
    assert "A call was still running" in flat(demo.screen_text())
    os.unlink(cli.ledger_path)


def test_ctrl_c_twice_while_a_tool_hangs_in_a_thread_ends_the_command(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """The approved refund blocks in its thread (the ledger is a FIFO no one reads). Ctrl-C
    waits for it; a second Ctrl-C printed how to continue, then the process never ended: the
    interpreter waited for the thread at exit, with Ctrl-C ignored (outside tester 61). It
    ends now (exit 3), and the call is asked about when the run is continued."""
    demo = approve_a_refund_that_hangs(sessions, cli)
    demo.interrupt()
    # what it waits for, and how to stop waiting (the spinner said "is working" on)
    demo.expect_screen("stopping: a step under way finishes first · Ctrl-C again stops waiting")
    demo.interrupt()
    assert demo.wait(timeout=15) == 3, demo.screen_text()
    [run] = cli.json("runs", "list", "--json")
    # (it said only how to continue: nothing about the call it left behind, tester 64)
    said = flat(demo.screen_text())
    assert "A call was still running: it may yet complete. `resume` asks whether it did." in said
    in_order(demo.screen(), [f"Continue with: workflow-engine resume {run['run_id']}"])
    shown = flat(cli.expect(0, "runs", "show", run["run_id"]).out)
    assert "⚠ in doubt: refund_agent's call submit_refund(" in shown, shown
    assert "`resume` asks whether it happened" in shown
    # the inbox has no request yet, but says that a question is coming (it said "No pending
    # requests." alone, tester 69)
    inbox = flat(cli.expect(0, "requests", "list").out)
    assert "No pending requests." in inbox
    assert f"interrupted: run {run['run_id']} (support)" in inbox, inbox
    assert "⚠ in doubt: refund_agent's call submit_refund(" in inbox, inbox
    assert "`resume` asks whether it happened" in inbox
    # (its worker may only be frozen past its lease: then the call may still complete, tester 74)
    assert "a process frozen past its lease, which may still complete it" in inbox, inbox
    assert cli.json("requests", "list") == []  # (--json lists requests alone)
    os.unlink(cli.ledger_path)
    asked = cli.expect(3, "resume", run["run_id"])
    assert_in_doubt_asked(asked.out)
    assert "(InDoubtEffect)" in asked.out
    # in a narrow window each command to paste is written whole (tester 67: a newline inside
    # one ran it as two)
    narrow = ScreenSession(
        ["resume", run["run_id"], "--no-interactive", "--db", str(cli.db)],
        cli.env,
        cli.cwd,
        columns=40,
    )
    sessions.append(narrow)
    assert narrow.wait() == 3, narrow.text
    commands = [line.strip() for line in narrow.text.splitlines() if "workflow-engine" in line]
    assert any(
        c.startswith("workflow-engine respond ") and c.endswith(str(cli.db)) for c in commands
    )
    assert f"workflow-engine resume {run['run_id']} --db {cli.db}" in commands, narrow.text
    # the question waits: shown as a question, not as its fields (tester 67)
    shown = flat(cli.expect(0, "runs", "show", run["run_id"]).out)
    assert "In doubt: refund_agent's call submit_refund(" in shown, shown
    listed = flat(cli.expect(0, "requests", "list").out)
    assert "did it happen? refund_agent's call submit_refund(" in listed, listed
    # pasted as printed, the answer runs (it was `true|false`: malformed JSON, tester 69)
    [no] = [c for c in commands if '"happened": false' in c]
    answered = subprocess.run(
        [str(ENGINE), *shlex.split(no)[1:]], capture_output=True, text=True, env=cli.env
    )
    assert answered.returncode == 0, answered


@pytest.mark.parametrize(
    ("key", "code"), [("Ctrl-C", 130), ("Ctrl-D", 0), ("SIGTERM", 143), ("SIGHUP", 129)]
)
def test_leaving_the_demos_first_prompt(
    cli: Cli, sessions: list[ScreenSession], key: str, code: int
) -> None:
    """Ctrl-C at the first prompt exited 0, as if the demo had run (outside tester 65): a
    script could not tell an abort. It is 130, as for a command SIGINT ended; Ctrl-D (no
    message) stays 0. SIGTERM and SIGHUP killed it inside the line editor, which left the
    terminal without echo (tester 67): they end it as they would any program, the terminal
    restored. None starts a run."""
    # (the terminal's own Ctrl-C: its line discipline signals the foreground group)
    demo = ScreenSession(
        ["demo", "handoff", "--db", str(cli.db)], cli.env, cli.cwd, controlling=True
    )
    sessions.append(demo)
    demo.expect_screen("You:")
    if key.startswith("SIG"):
        time.sleep(0.3)  # (in the line editor)
        demo.proc.send_signal(getattr(signal, key))
    else:
        demo.send_raw(b"\x03" if key == "Ctrl-C" else b"\x04")
    assert demo.wait() == code, demo.screen_text()
    if key != "SIGHUP":  # (its terminal is gone: nothing is written to it)
        assert "Nothing started." in demo.screen_text()
    assert "Traceback" not in demo.screen_text()
    modes = termios.tcgetattr(demo.master)[3]
    assert modes & termios.ECHO and modes & termios.ICANON, "the terminal was left raw"
    assert not cli.db.exists()


@pytest.mark.parametrize("where", ["under-a-file", "a-damaged-file"])
def test_a_database_it_cannot_use_is_said_before_the_first_message(
    cli: Cli, sessions: list[ScreenSession], where: str
) -> None:
    """The demo asked for the first message, then said the database could not be used: what
    the person typed was lost (outside tester 106). It says so before asking; a new file
    is still not created before a message is sent (see above)."""
    if where == "under-a-file":
        (cli.cwd / "plain").write_text("not a directory")
        db = cli.cwd / "plain" / "runs.db"
        said = "/plain is not a directory"
    else:
        db = cli.cwd / "damaged.db"
        db.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
        said = "damaged.db is damaged"
    demo = ScreenSession(["demo", "handoff", "--db", str(db)], cli.env, cli.cwd)
    sessions.append(demo)
    assert demo.wait() == 6, demo.screen_text()
    screen = demo.screen_text().replace("\n", "")  # (a long path wraps)
    assert screen.startswith("error: ") and said in screen, screen
    assert "You:" not in screen and "Traceback" not in screen


def test_sigterm_at_a_prompt_of_a_background_job_stops_at_once(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """A script's background job (SIGINT ignored) at the approval prompt: SIGTERM waited the
    whole grace for a step under way -- there was none (tester 67). It stops at once."""
    demo = ScreenSession(
        ["demo", "handoff", "-m", REFUND, "--db", str(cli.db)],
        cli.env,
        cli.cwd,
        sigint_ignored=True,
    )
    sessions.append(demo)
    demo.expect_screen(APPROVE)
    time.sleep(0.3)
    began = time.monotonic()
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.wait(timeout=STOP_GRACE_SECONDS + 10) == 3, demo.screen_text()
    assert time.monotonic() - began < STOP_GRACE_SECONDS / 2, demo.screen_text()
    [run] = cli.json("runs", "list", "--json")
    assert run["status"] == "idle_with_pending_requests" and run["worker"] is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_sent_as_the_approval_prompt_shows_stops_at_once(
    cli: Cli, signum: int
) -> None:
    """A SIGTERM sent the moment ``Approve?`` showed was ignored in 2 runs of 3
    (outside tester 154): it arrived after Python last looked for signals and before the line
    editor's wait began, and its handler ran only at the next signal -- a second SIGTERM. Sent
    at once, six times over, each stops the demo, the run paused and its lease given back."""
    for attempt in range(6):
        # (the bytes as they come, no terminal emulator between: the signal follows at once)
        demo = PtySession(
            ["demo", "handoff", "-m", REFUND, "--db", str(cli.db)], cli.env, cli.cwd,
            controlling=True,
        )  # fmt: skip
        try:
            demo.expect("Approve?")
            demo.proc.send_signal(signum)
            assert demo.wait(timeout=STOP_GRACE_SECONDS / 2) == 3, (attempt, demo.text)
        finally:
            demo.close()
    runs = cli.json("runs", "list")
    assert len(runs) == 6, runs
    assert all(r["status"] == "idle_with_pending_requests" and r["worker"] is None for r in runs)


@pytest.mark.parametrize("happened", [True, False])
def test_a_call_in_doubt_is_asked_as_a_question(
    cli: Cli, sessions: list[ScreenSession], happened: bool
) -> None:
    """The refund cut off (Ctrl-C twice while it hung), ``resume`` at a terminal: it showed a
    red ✗ failure, then the question's fields -- step keys included -- and asked for raw JSON
    (outside tester 65). It says what was cut off and the key to look it up by, and asks y/n;
    yes takes the result as text and the refund is not made again, no makes it again."""
    demo = approve_a_refund_that_hangs(sessions, cli)
    stop_twice(demo)
    os.unlink(cli.ledger_path)
    [run] = cli.json("runs", "list", "--json")
    resume = open_screen(sessions, cli, "resume", run["run_id"])
    resume.expect_screen("Did it happen? [y]es / [n]o (it runs again):")
    said = flat(resume.screen_text())
    assert "In doubt: refund_agent's call submit_refund({" in said
    assert "Look it up in the service it called by its idempotency key: " in said
    assert "✗" not in said and "step_key" not in said
    resume.send("maybe")
    resume.expect_screen("answer y (it happened: it is not run again) or n (it runs again)")
    if happened:
        resume.send("y")
        resume.expect_screen("Its result, as JSON or text (empty: not known):")
        resume.send("[refund RF-7] made by hand")  # (text that starts like JSON)
        resume.expect_screen('text starting with [ goes in quotes: "..."')
        resume.send("refund RF-7 made by hand")
    else:
        resume.send("n")
    assert resume.wait() == 0, resume.screen_text()
    in_order(resume.screen(), [f"Run {run['run_id']} finished."])
    refunds = [e for e in cli.ledger() if e["kind"] == "refund"]
    assert len(refunds) == (0 if happened else 1), refunds
    if happened:
        assert '← submit_refund: "refund RF-7 made by hand"' in resume.screen_text()


def test_with_its_output_in_a_file_a_call_in_doubt_is_in_the_transcript_with_its_answer(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``resume > file`` of a run whose refund was cut off: the file said "Did it happen?
    no" of nothing it showed -- the call and the key to look it up by were on the screen
    only (outside tester 195). Both go to the file, before the answer."""
    demo = approve_a_refund_that_hangs(sessions, cli)
    stop_twice(demo)
    os.unlink(cli.ledger_path)
    [run] = cli.json("runs", "list", "--json")
    log = tmp_path / "transcript.txt"
    argv = ["resume", run["run_id"], "--db", str(cli.db)]
    resume = ScreenSession(argv, cli.env, cli.cwd, stdout=log)
    sessions.append(resume)
    resume.expect_screen("Did it happen? [y]es / [n]o (it runs again):")
    resume.send("n")
    assert resume.wait() == 0, resume.screen_text()
    written = flat(log.read_text())
    in_order(
        [written],
        [
            "In doubt: refund_agent's call submit_refund({",
            "Look it up in the service it called by its idempotency key: ",
            "Did it happen? no",
            f"Run {run['run_id']} finished.",
        ],
    )


def test_resume_json_says_a_call_in_doubt_as_such_not_as_a_failure(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """``resume --json`` at the question about a cut-off refund printed an ``executor_failed``
    line (code ``effect_in_doubt``) before the ``request_info``: a program reading the lines
    took the run for failed (outside tester 67). The step is said as ``effect_in_doubt``."""
    demo = approve_a_refund_that_hangs(sessions, cli)
    stop_twice(demo)
    os.unlink(cli.ledger_path)
    [run] = cli.json("runs", "list", "--json")
    paused = cli.expect(3, "resume", run["run_id"], "--json")
    lines = [json.loads(line) for line in paused.out.strip().splitlines()]
    types = [line["type"] for line in lines]
    assert "executor_failed" not in types, types
    [doubt] = [line for line in lines if line["type"] == "effect_in_doubt"]
    assert doubt["executor_id"] == "refund_agent" and doubt["error"]["code"] == "effect_in_doubt"
    assert "/refund_agent/" in doubt["step_key"], doubt
    assert types.index("effect_in_doubt") < types.index("request_info")
    assert types[-1] == "paused"
    assert not os.path.exists(cli.ledger_path)  # nothing ran again


@pytest.mark.parametrize("how", ["cancel", "a cancel stored while it ran", "--json"])
def test_a_run_cancelled_with_a_call_in_doubt_says_so(
    cli: Cli, sessions: list[ScreenSession], how: str
) -> None:
    """The approved refund was cut off (Ctrl-C twice while it hung), then the run was cancelled:
    by ``cancel`` on the stopped run, or by a ``cancel`` from another terminal while the demo
    held the run, which the next ``resume`` honours before anything runs. Either way it ended
    ``cancelled`` and no one was ever told the refund might have been made (outside tester
    65). Both say so now, with the key to look the refund up by, and so does ``runs show``."""
    demo = approve_a_refund_that_hangs(sessions, cli)
    [run] = cli.json("runs", "list", "--json")
    run_id = run["run_id"]
    if how != "cancel":
        stored = cli.expect(0, "cancel", run_id)
        assert "cancelling: the worker executing it ends it cancelled" in stored.out
    stop_twice(demo)
    os.unlink(cli.ledger_path)
    if how == "--json":  # (tester 66: the JSON lines said nothing of it)
        ended = cli.expect(1, "resume", run_id, "--json")
        last = json.loads(ended.out.strip().splitlines()[-1])
        assert last["type"] == "effects_in_doubt" and last["run_id"] == run_id, ended.out
        [effect] = last["effects"]
        assert effect["executor_id"] == "refund_agent"
        assert effect["description"]["tool"] == "submit_refund"
        assert effect["idempotency_key"].startswith(f"{run_id}:")
        return
    if how == "cancel":
        said = cli.expect(0, "cancel", run_id)
        assert f"Run {run_id} cancelled." in said.out
        again = cli.expect(5, "cancel", run_id)  # said again, not only by the cancel that did it
        assert "already cancelled" in again.error_line()
        assert "⚠ in doubt: refund_agent's call submit_refund(" in flat(again.out)
    else:
        waits = flat(cli.expect(0, "runs", "show", run_id).out)  # (tester 67: "resume asks")
        assert "a cancel waits: `resume` ends the run cancelled without asking" in waits, waits
        said = cli.expect(1, "resume", run_id)
        assert f"Run {run_id} ended cancelled." in said.out
    told = flat(said.out)
    assert "⚠ in doubt: refund_agent's call submit_refund(" in told, said.out
    assert "was cancelled before anyone said whether it happened" in told
    [key] = re.findall(r"by its idempotency key: (\S+)", told)
    assert key.startswith(f"{run_id}:")
    shown = cli.expect(0, "runs", "show", run_id)
    assert "⚠ in doubt: refund_agent's call submit_refund(" in flat(shown.out)
    # in a narrow window the key is written whole: a newline inside it cut what a person
    # copies in two (tester 66); the window folds it, and copying gives it back whole
    narrow = ScreenSession(
        ["runs", "show", run_id, "--db", str(cli.db)], cli.env, cli.cwd, columns=40
    )
    sessions.append(narrow)
    assert narrow.wait() == 0
    assert any(line.strip() == key for line in narrow.text.splitlines()), narrow.text
    [effect] = cli.json("runs", "show", run_id, "--json")["effects_in_doubt"]
    assert effect["idempotency_key"] == key
    assert effect["executor_id"] == "refund_agent"


def test_closing_the_terminal_while_a_tool_hangs_ends_the_command(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """SIGHUP acted as a first Ctrl-C, which waits for the approved call; on a closed terminal
    no one can press the second, so a call that hung kept the process and its run for good
    (outside tester 64). After the grace it stops waiting, as the second Ctrl-C would."""
    demo = approve_a_refund_that_hangs(sessions, cli, controlling=True)
    demo.hang_up()
    assert demo.proc.wait(timeout=STOP_GRACE_SECONDS + 15) == 3
    [run] = cli.json("runs", "list", "--json")
    assert run["worker"] is None
    os.unlink(cli.ledger_path)
    asked = cli.expect(3, "resume", run["run_id"])
    assert_in_doubt_asked(asked.out)


def test_a_terminal_closed_while_a_tool_hangs_leaves_how_to_continue_in_the_log(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``demo > log``, the window closed while the approved call hangs: the lines saying how
    to continue went to stderr, the closed terminal, and the log kept nothing of them
    (outside tester 114). They go to the log."""
    log = tmp_path / "transcript.txt"
    demo = approve_a_refund_that_hangs(sessions, cli, controlling=True, stdout=log)
    demo.hang_up()
    assert demo.proc.wait(timeout=STOP_GRACE_SECONDS + 15) == 3
    written = log.read_text()
    [run] = cli.json("runs", "list", "--json")
    assert f"Continue with: workflow-engine resume {run['run_id']}" in flat(written), written
    os.unlink(cli.ledger_path)


def json_refund_that_hangs(
    sessions: list[ScreenSession], cli: Cli, log: Path, *, controlling: bool = False
) -> ScreenSession:
    """``demo --approve --json > log`` with the approved refund blocked in its thread (the
    ledger is a FIFO no one reads), once the stream says the call was made."""
    os.mkfifo(cli.ledger_path)
    argv = ["demo", "handoff", "--approve", "-m", REFUND, "--db", str(cli.db), "--json"]
    demo = ScreenSession(argv, cli.env, cli.cwd, controlling=controlling, stdout=log)
    sessions.append(demo)
    deadline = time.monotonic() + 30
    while '"submit_refund"' not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    wait_until_blocked_on_a_fifo(demo.proc.pid)  # (the call under way, on the FIFO)
    return demo


def test_a_terminal_closed_while_a_tool_hangs_keeps_a_json_log_json(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``demo --json > log``, the window closed while the approved call hangs: how to continue
    went into the log as a line of text among the JSON lines, which broke a program reading
    them (outside tester 113). It is an ``interrupted`` JSON line."""
    log = tmp_path / "events.jsonl"
    demo = json_refund_that_hangs(sessions, cli, log, controlling=True)
    demo.hang_up()
    assert demo.proc.wait(timeout=STOP_GRACE_SECONDS + 15) == 3
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every one JSON
    [run] = cli.json("runs", "list", "--json")
    assert lines[-1] == {
        "type": "interrupted",
        "run_id": run["run_id"],
        "call_running": True,
        "continue_with": f"workflow-engine resume {run['run_id']} --db {cli.db}",
    }, lines[-3:]
    os.unlink(cli.ledger_path)


def test_a_first_ctrl_c_of_a_json_stream_says_on_the_terminal_what_it_waits_for(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``demo --json > log``, Ctrl-C while the approved call hangs: the terminal showed
    nothing until the second press (outside tester 118). The first says what it waits for,
    on stderr; the stream stays JSON."""
    log = tmp_path / "events.jsonl"
    demo = json_refund_that_hangs(sessions, cli, log)
    demo.interrupt()
    demo.expect_screen("stopping: a step under way finishes first")
    demo.interrupt()
    assert demo.wait(timeout=15) == 3, demo.screen_text()
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every one JSON
    assert lines[-1]["type"] == "interrupted", lines[-3:]
    os.unlink(cli.ledger_path)


def test_a_terminal_closed_with_two_hang_ups_still_lets_the_call_finish(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """A closed terminal's SIGHUP comes from the kernel and from the shell it ran: the second
    was taken for a second Ctrl-C, so the approved call was cut off at once and left in doubt
    (outside tester 113: 2 closes in 6). The call gets its grace: it finishes, is recorded,
    and ``resume`` does not ask whether it happened."""
    import threading

    demo = approve_a_refund_that_hangs(sessions, cli, controlling=True)
    demo.hang_up()
    time.sleep(0.5)  # (the first one handled)
    demo.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    written: list[str] = []

    def let_the_call_finish() -> None:  # (the refund reads the ledger, then appends to it)
        cli.ledger_path.open("w").close()  # what it reads: nothing
        written.append(cli.ledger_path.read_text())  # what it appends

    reader = threading.Thread(target=let_the_call_finish, daemon=True)
    reader.start()  # well within the grace
    assert demo.proc.wait(timeout=STOP_GRACE_SECONDS + 15) == 3
    reader.join(timeout=10)
    assert written, "the call was cut off: it never appended to the ledger"
    assert [json.loads(line)["kind"] for line in written[0].splitlines()] == ["refund"], written
    os.unlink(cli.ledger_path)
    resumed = cli.run("resume", json.loads(cli.run("runs", "list", "--json").out)[0]["run_id"])
    assert "InDoubtEffect" not in resumed.out and "Did it happen" not in resumed.out, resumed.out
    assert resumed.code == 0, str(resumed)


def test_a_resume_of_a_run_another_terminal_executes_is_one_line(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """Refused as busy, ``resume`` printed ``resuming run ...`` first, as if it had begun."""
    with SlowModel(think=30) as model:
        demo = open_slow_demo(sessions, cli, model)
        demo.expect_screen("is working")
        [run] = cli.json("runs", "list", "--json")
        busy = cli.expect(5, "resume", run["run_id"], "--offline")
        assert "being executed by another worker" in busy.error_line()
        assert busy.out == ""


# --- plain lines: NO_COLOR ----------------------------------------------------------------------


def test_no_color_means_plain_lines(cli: Cli, sessions: list[ScreenSession]) -> None:
    demo = open_screen(sessions, cli, "demo", "handoff", "-m", REFUND, env={"NO_COLOR": "1"})
    demo.expect_screen(APPROVE)
    demo.send("y")
    assert demo.wait() == 0, demo.screen_text()
    assert b"\x1b" not in demo.raw  # no colour, no cursor movement, no spinner
    in_order(demo.screen(), [*BEFORE_APPROVAL, "case complete", "finished."])


def test_no_color_means_plain_help(cli: Cli, sessions: list[ScreenSession]) -> None:
    """The commands' help on a terminal kept rich's bold and dim under ``NO_COLOR`` (outside
    tester 208)."""
    for argv in (["--help"], ["runs", "list", "--help"], ["demo", "--help"]):
        helped = ScreenSession(argv, {**cli.env, "NO_COLOR": "1"}, cli.cwd)
        sessions.append(helped)
        assert helped.wait() == 0, helped.screen_text()
        assert b"Usage:" in helped.raw and b"\x1b" not in helped.raw, (argv, helped.raw[:300])


def test_a_listing_s_notes_wrap_between_words_in_a_narrow_window(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """The notes under ``requests list`` were folded mid-word by the terminal at 40 columns
    ("lists the / m all"), the table above them wrapped between words (outside tester 208)."""
    for n in range(3):
        cli.expect(3, "demo", "handoff", "-m", f"refund order {n}", "--detach")
    listed = ScreenSession(
        ["requests", "list", "--limit", "1", "--db", str(cli.db)], cli.env, cli.cwd, columns=40
    )
    sessions.append(listed)
    assert listed.wait() == 0, listed.screen_text()
    screen = listed.screen()
    at = next(i for i, row in enumerate(screen) if row.startswith("(2 newer not shown:"))
    assert screen[at].rstrip().endswith("--limit 0 lists") and screen[at + 1] == " them all)", (
        listed.screen_text()
    )


def test_no_color_still_wraps_words_at_the_terminals_width(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """``NO_COLOR`` turned wrapping off as well: words and paths broke mid-word at the edge of
    the window (outside tester 65). Wrapping writes only spaces and newlines."""
    with SlowModel(per_word=0.0) as model:
        url = f"http://127.0.0.1:{model.server_address[1]}/v1"
        demo = open_screen(
            sessions, cli, "demo", "handoff", "-m", "My headphones arrived broken",
            "--model", "slow", "--base-url", url, "--api-key", "k", env={"NO_COLOR": "1"},
        )  # fmt: skip
        demo.expect_screen("You (empty or /end to finish):")
        demo.send("/end")
        demo.wait()
    assert b"\x1b" not in demo.raw
    rows = demo.screen()
    for word in f"triage_agent: {SLOW_REPLY}".split():
        assert any(word in row.split() for row in rows), (word, "\n".join(rows))


# --- tables and ids at 80 columns ---------------------------------------------------------------

RUN_A = "abc12345" + "0" * 24
RUN_B = "abc12345" + "1" * 24


async def _paused_runs(db: Path, run_ids: list[str]) -> None:
    """Support runs with chosen ids, each paused at its refund approval."""
    runtime = open_runtime(db, workflows=["support"])
    try:
        for run_id in run_ids:
            await runtime.start("support", REFUND, run_id=run_id)
            await runtime.resume(run_id)
    finally:
        await runtime.close()


def _table(session: ScreenSession) -> list[str]:
    assert session.wait() == 0, session.screen_text()
    screen = session.screen()
    assert_clean(screen)
    return screen


@pytest.mark.parametrize("columns", [40, 60])
def test_narrow_windows_list_one_block_per_row(
    cli: Cli, sessions: list[ScreenSession], columns: int
) -> None:
    """No row is folded by the terminal: a status or a date split across screen lines cannot
    be read, so a window too narrow for the columns gets ``HEADER  value`` blocks."""
    cli.expect(3, "demo", "handoff", "-m", REFUND, "--detach")
    [run] = cli.json("runs", "list", "--json")
    [request] = cli.json("requests", "list")
    for command in (["runs", "list"], ["requests", "list"]):
        session = ScreenSession([*command, "--db", str(cli.db)], cli.env, cli.cwd, columns=columns)
        sessions.append(session)
        screen = _table(session)
        rows = [row.rstrip() for row in screen if row.strip()]
        assert all(len(row) < columns for row in rows), rows  # nothing reached the edge
        words = {word for row in rows for word in row.split()}
        assert run["run_id"][:8] in words  # ids and statuses whole on one screen line
        if command == ["runs", "list"]:
            assert "idle_with_pending_requests" in words
            assert any(re.search(r"2\d{3}-\d\d-\d\d \d\d:\d\d:\d\d", row) for row in rows)
        else:
            assert request["request_id"][:8] in words
            assert "approve submit_refund({" in flat("\n".join(rows))


@pytest.mark.slow  # several processes in turn: `make test` runs it, `make test-fast` not
def test_tables_show_whole_ids_and_statuses_at_80_columns(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    anyio.run(_paused_runs, cli.db, [RUN_A, RUN_B])
    cli.expect(0, "demo", "handoff", "-m", REFUND, "--approve")

    runs = _table(open_screen(sessions, cli, "runs", "list"))
    assert re.split(r"\s{2,}", runs[0]) == ["RUN", "WORKFLOW", "STATUS", "STEP", "UPDATED (UTC)"]
    rows = [re.split(r"\s{2,}", row) for row in runs[1:]]
    # the two runs share 8 characters, so their short ids take one more
    assert [row[:3] for row in rows[:2]] == [
        ["abc123450", "support", "idle_with_pending_requests"],
        ["abc123451", "support", "idle_with_pending_requests"],
    ]
    finished = rows[2]
    assert len(finished[0]) == 8 and finished[1:3] == ["support", "idle"]

    requests = _table(open_screen(sessions, cli, "requests", "list"))
    assert re.split(r"\s{2,}", requests[0]) == ["REQUEST", "RUN", "WORKFLOW", "WAITING FOR"]
    starts = [row for row in requests[1:] if not row.startswith(" ")]
    assert len(starts) == 2
    column = requests[0].index("WAITING FOR")
    for row in requests[1:]:  # only the last column wraps, under its own heading
        if row.startswith(" "):
            assert row[:column].strip() == "" and row[column] != " "
    pending = cli.json("requests", "list")
    for row, full in zip(starts, pending, strict=True):
        request_id, run_id, workflow, *_ = re.split(r"\s{2,}", row)
        assert full["request_id"].startswith(request_id) and len(request_id) >= 8
        assert full["run_id"].startswith(run_id) and workflow == "support"
    second = requests.index(starts[1])
    waiting_for = flat(" ".join(row[column:] for row in requests[1:second]))
    assert second > 2  # wrapped, not cut
    assert waiting_for.startswith("approve submit_refund({")
    assert waiting_for.endswith('"reason": "customer request"})')

    # what the table shows is what the user types
    shown_request = re.split(r"\s{2,}", starts[0])[0]
    answered = cli.expect(0, "respond", shown_request, "--approve")
    assert f"workflow-engine resume {pending[0]['run_id']}" in answered.out
    done = cli.expect(0, "resume", "abc123450")
    assert f"Run {RUN_A} finished." in done.out
    shown = cli.expect(0, "runs", "show", "abc123450", "--json")
    assert json.loads(shown.out)["status"] == "idle"


def test_an_ambiguous_prefix_lists_the_candidates(cli: Cli) -> None:
    anyio.run(_paused_runs, cli.db, [RUN_A, RUN_B])
    ambiguous = [["resume", "abc1"], ["runs", "show", "abc12345"], ["cancel", "abc"]]
    unknown = [["resume", "abd"], ["runs", "show", "abd"]]
    results = run_concurrently([(cli, command, True) for command in ambiguous + unknown])
    for result in results[: len(ambiguous)]:
        assert result.code == 2, str(result)
        line = result.error_line()
        assert "is ambiguous" in line
        assert RUN_A in line and RUN_B in line
    for result in results[len(ambiguous) :]:  # no run starts with it: as for a whole id
        assert result.code == 4, str(result)
        assert "no run 'abd'" in result.error_line()
    assert [r["status"] for r in cli.json("runs", "list")] == ["idle_with_pending_requests"] * 2


def test_a_reply_is_asked_with_the_question_when_the_screen_does_not_show_it(
    cli: Cli, sessions: list[ScreenSession]
) -> None:
    """``resume`` of a run paused at a reply asked "You (empty or /end to finish):" alone --
    the agent's question was said in another session (outside tester 172). It is said before
    the prompt; when the demo itself just streamed it, it is not said twice."""
    cli.expect(3, "demo", "handoff", "-m", "hello", "--detach")
    [asked] = cli.json("requests", "list", "--json")
    question = "What can I do for you?"
    assert question in json.dumps(asked), asked
    resumed = open_screen(sessions, cli, "resume", asked["run_id"])
    resumed.expect_screen("You (empty or /end to finish):")
    in_order(resumed.screen(), ["triage_agent:", question, "You (empty or /end to finish):"])
    resumed.send("/end")
    assert resumed.wait() == 0, resumed.screen_text()

    demo = open_screen(sessions, cli, "demo", "handoff")
    demo.expect_screen("You:")
    demo.send("hello")
    demo.expect_screen("You (empty or /end to finish):")
    demo.settle()
    assert flat(demo.screen_text()).count(flat(question)) == 1, demo.screen_text()
    demo.send("/end")
    assert demo.wait() == 0, demo.screen_text()


def test_with_json_an_answer_that_stood_is_said_on_the_terminal_not_in_the_json(
    cli: Cli, sessions: list[ScreenSession], tmp_path: Path
) -> None:
    """``--json``: the line saying another answer stood went to stdout, plain text among the
    JSON lines (outside tester 173). It goes where the prompts go."""
    log = tmp_path / "lines.jsonl"
    argv = ["demo", "handoff", "--json", "--db", str(cli.db)]
    demo = ScreenSession(argv, cli.env, cli.cwd, stdout=log)
    sessions.append(demo)
    demo.expect_screen("You:")
    demo.send(REFUND)
    demo.expect_screen("Approve?")
    demo.settle()
    [asked] = cli.json("requests", "list", "--json")
    cli.expect(0, "respond", asked["request_id"], "--reject")
    demo.send("y")
    demo.expect_screen("and stands --")
    demo.expect_screen("You (empty or /end to finish):")
    demo.send("/end")
    assert demo.wait() == 0, demo.screen_text()
    lines = log.read_text().splitlines()
    assert lines and all(line.startswith("{") for line in lines), lines
