"""The command line's pure pieces: the terminal writer (read back through a pyte screen), short
ids and prefixes, and how stored data and JSON schemas are shown."""

from __future__ import annotations

import io
import time

import pyte
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflow_engine_cli import _term
from workflow_engine_cli._ids import AmbiguousIdError, match, short_ids
from workflow_engine_cli._term import Terminal, cell_width, clean, format_table
from workflow_engine_cli._views import describe_request, plain, shape


def rendered(raw: str, columns: int = 40, lines: int = 12) -> list[str]:
    screen = pyte.Screen(columns, lines)
    pyte.Stream(screen).feed(raw.replace("\n", "\r\n"))  # a tty's output translation
    rows = [row.rstrip() for row in screen.display]
    while rows and not rows[-1]:
        rows.pop()
    return rows


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> tuple[Terminal, io.StringIO]:
    monkeypatch.setenv("COLUMNS", "41")  # wraps at 40
    out = io.StringIO()
    return Terminal(out, live=True), out


# --- the terminal writer ------------------------------------------------------------------------


def test_streamed_words_wrap_whole_with_a_hanging_indent(
    live: tuple[Terminal, io.StringIO],
) -> None:
    term, out = live
    term.begin(("agent:", "bold cyan"), " ", indent=7)
    for delta in ["I found ord", "er 12345. I'll sub", "mit a refund for the full amo", "unt."]:
        term.write(delta)
    term.end()
    term.line("next line")
    assert rendered(out.getvalue()) == [
        "agent: I found order 12345. I'll submit",
        "       a refund for the full amount.",
        "next line",
    ]


def test_a_word_wider_than_the_line_is_broken(live: tuple[Terminal, io.StringIO]) -> None:
    term, out = live
    term.line("x:", " ", "a" * 50, indent=2)
    assert rendered(out.getvalue()) == ["x: " + "a" * 37, "  " + "a" * 13]


def test_the_spinner_never_erases_an_open_line(live: tuple[Terminal, io.StringIO]) -> None:
    term, out = live
    with term.working("thinking…"):
        term.line("first line")
        time.sleep(0.35)  # the spinner draws below it
        assert rendered(out.getvalue())[-1].endswith("thinking…")
        term.begin(("agent:", "bold"), " ")
        term.write("half a sentence ")
        time.sleep(0.35)  # a line is open: no spinner may draw over it
        term.write("and the rest.")
        term.end()
    assert rendered(out.getvalue()) == ["first line", "agent: half a sentence and the rest."]


def test_plain_mode_has_no_escapes_and_no_wrapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "20")
    out = io.StringIO()
    term = Terminal(out, live=False)
    with term.working():
        term.begin(("agent:", "bold cyan"), " ")
        term.write("a sentence far longer than twenty columns")
        term.end()
    assert out.getvalue() == "agent: a sentence far longer than twenty columns\n"


def test_text_from_a_model_cannot_drive_the_terminal(live: tuple[Terminal, io.StringIO]) -> None:
    term, out = live
    term.line("evil \x1b[2J\x1b[31mred\r\x07 text")
    assert "\x1b[2J" not in out.getvalue() and "\x07" not in out.getvalue()
    assert clean("a\tb\r\nc\x1b") == "a    b\nc\N{REPLACEMENT CHARACTER}"
    assert cell_width("日本") == 4


def test_tables_wrap_only_the_free_text_column() -> None:
    rows = [["abcdef012", "idle_with_pending_requests", "approve submit_refund(x) now"]]
    lines = format_table(["ID", "STATUS", "WHAT"], rows, width=60, wrap=["WHAT"])
    assert lines == [
        "ID         STATUS                      WHAT",
        "abcdef012  idle_with_pending_requests  approve",
        "                                       submit_refund(x) now",
    ]
    assert max(len(line) for line in lines) <= 60
    assert format_table(["A"], [["x y"]], width=0, wrap=["A"]) == ["A", "x y"]


def test_a_free_column_narrower_than_a_word_of_it_becomes_blocks() -> None:
    """At 60 columns the inbox's last column got 24, and ``submit_refund({"order_id":`` (26)
    broke inside, where a block had room for it whole (outside tester 142)."""
    call = 'approve submit_refund({"order_id": "12345", "amount": 89.99})'
    rows = [["e47518c5", "3fb7efe7", "support", call]]
    headers = ["REQUEST", "RUN", "WORKFLOW", "WAITING FOR"]
    lines = format_table(headers, rows, width=54, wrap=["WAITING FOR"])  # 24 left for it
    assert lines[0] == "REQUEST      e47518c5", lines  # blocks
    assert 'submit_refund({"order_id":' in "\n".join(lines), lines
    wide = format_table(headers, rows, width=59, wrap=["WAITING FOR"])
    assert wide[0].startswith("REQUEST   RUN"), wide  # a table where its words fit
    assert 'submit_refund({"order_id":' in wide[2], wide


def test_a_value_holding_a_newline_keeps_its_row_on_one_line() -> None:
    """A run id with a newline in it (``Runtime.start(run_id=...)`` takes any text) split its
    row in two (outside tester): ids show it escaped, as it can be typed; free text, a space."""
    rows = [["odd\nid", "first\nsecond \x1b[2J"], ["plain", "x"]]
    assert format_table(["ID", "WHAT"], rows, width=0, wrap=["WHAT"]) == [
        "ID       WHAT",
        "odd\\nid  first second \N{REPLACEMENT CHARACTER}[2J",
        "plain    x",
    ]


def test_a_table_too_wide_for_the_window_becomes_one_block_per_row() -> None:
    """Narrower than the ids and statuses need (or than a readable free column): blocks of
    ``HEADER  value``, every id and status whole on its own line."""
    rows = [
        ["abcdef012", "idle_with_pending_requests", "approve submit_refund(x) now"],
        ["fedcba987", "in_progress", "-"],
    ]
    for width in (56, 40):
        lines = format_table(["ID", "STATUS", "WHAT"], rows, width=width, wrap=["WHAT"])
        assert lines == [
            "ID      abcdef012",
            "STATUS  idle_with_pending_requests",
            "WHAT    approve submit_refund(x) now",
            "",
            "ID      fedcba987",
            "STATUS  in_progress",
            "WHAT    -",
        ], width
    narrow = format_table(["ID", "STATUS", "WHAT"], rows, width=30, wrap=["WHAT"])
    assert narrow[:5] == [
        "ID      abcdef012",
        # beside its label the status would be wider than the window, and the terminal would
        # fold it mid-word (outside tester): under it, whole
        "STATUS",
        "  idle_with_pending_requests",
        "WHAT    approve",
        "        submit_refund(x) now",
    ]
    assert all(len(line) <= 30 for line in narrow)
    # a word wider than the window still stays whole (the terminal folds it; a cut id could
    # not be copied)
    assert format_table(["ID", "STATUS"], [["a" * 40, "ok"]], width=30)[:2] == ["ID", "a" * 40]


def _rewrapped_by_line(text: str, width: int, *, break_words: bool) -> list[str]:
    """The wrapping rule, stated the slow way: a word joins the line if the line, with it,
    still fits; a word too wide for any line is cut (``break_words``) or left whole."""
    lines: list[str] = []
    current = ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if cell_width(candidate) <= width or (not current and not break_words):
            current = candidate
            continue
        if current:
            lines.append(current)
        while break_words and cell_width(word) > width:
            cut = next(
                (n for n in range(1, len(word) + 1) if cell_width(word[:n]) > width), len(word)
            )
            cut = max(cut - 1, 1)
            lines.append(word[:cut])
            word = word[cut:]
        current = word
    lines.append(current)
    return lines


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(["a", "bc", " ", "  ", "日", "e\u0301", "x" * 7]), max_size=30
    ).map("".join),
    width=st.integers(1, 12),
)
def test_cells_wrap_by_the_rule_whatever_their_words(text: str, width: int) -> None:
    assert _term._wrap(text, width, break_words=True) == _rewrapped_by_line(
        text, width, break_words=True
    )
    assert _term._wrap(text, width, break_words=False) == _rewrapped_by_line(
        text, width, break_words=False
    )


def test_a_long_cell_is_measured_once_per_character(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's 40 KB text took ``requests list`` 54 s to lay out (outside tester): the
    growing line was measured again for every word. Now each character is measured a bounded
    number of times, for any width."""
    measured = 0

    def counting(text: str) -> int:
        nonlocal measured
        measured += len(text)
        return cell_width(text)

    monkeypatch.setattr(_term, "cell_width", counting)
    text = " ".join(f"word{n}" for n in range(5_000))
    for width in (0, 80):
        measured = 0
        lines = format_table(["ID", "WHAT"], [["abc", text]], width=width, wrap=["WHAT"])
        assert " ".join(line.split("  ", 1)[-1].strip() for line in lines[1:]) == text
        assert measured <= 4 * len(text), (width, measured)
    measured = 0
    assert len(_term._records(["WHAT"], [[text]], 80, False)) > 300
    assert measured <= 4 * len(text)


# --- ids ----------------------------------------------------------------------------------------


def test_short_ids_are_unique_and_at_least_eight_characters() -> None:
    ids = ["abc123450000", "abc123451111", "ffff00001111", "abc1234"]
    assert short_ids(ids) == {
        "abc123450000": "abc123450",
        "abc123451111": "abc123451",
        "ffff00001111": "ffff0000",
        "abc1234": "abc1234",  # a whole id shorter than the minimum is itself
    }


def test_a_namespaced_id_is_shortened_after_its_namespace() -> None:
    """A server's run ids were shown as ``support:`` (one run) or ``support:f`` (outside
    tester 61): unique, and meaningless."""
    ids = ["support:f00dcafe-1234/0", "support:f00dcafe-1234/1", "support:t1/0", "a" * 32]
    assert short_ids(ids) == {
        "support:f00dcafe-1234/0": "support:f00dcafe-1234/0",
        "support:f00dcafe-1234/1": "support:f00dcafe-1234/1",
        "support:t1/0": "support:t1/0",
        "a" * 32: "a" * 8,
    }
    assert short_ids(["support:0123456789abcdef/0"]) == {
        "support:0123456789abcdef/0": "support:01234567"
    }


def test_a_prefix_names_one_id_or_is_reported() -> None:
    ids = ["abc123450000", "abc123451111", "ffff00001111"]
    assert match("run", "ffff", ids) == "ffff00001111"
    assert match("run", "abc123451", ids) == "abc123451111"
    assert match("run", "abc123450000", ids) == "abc123450000"
    assert match("run", "zzz", ids) == "zzz"  # unknown: the lookup reports it as not found
    with pytest.raises(AmbiguousIdError) as caught:
        match("run", "abc", ids)
    assert caught.value.matches == ["abc123450000", "abc123451111"]
    assert str(caught.value) == (
        "run id 'abc' is ambiguous: 2 runs start with it (abc123450000, abc123451111); "
        "type more of the id"
    )


# --- stored data and schemas --------------------------------------------------------------------


def test_tagged_json_reads_as_plain_json() -> None:
    stored = {
        "$type": "executors._content.ToolApprovalRequestContent",
        "data": {
            "id": "approval_call_3",
            "function_call": {"name": "submit_refund", "arguments": {"amount": 89.99}},
        },
    }
    assert describe_request(stored) == 'approve submit_refund({"amount": 89.99})'
    reply = {"$type": "x.HandoffUserInputRequest", "data": {"agent": "a", "message": "m"}}
    assert describe_request(reply) == "reply to a: m"
    assert describe_request({"$type": "x.Draft", "data": {"v": 1}}, "review") == 'review: {"v": 1}'
    assert plain({"$tuple": [1, {"$dict": {"$k": 2}}]}) == [1, {"$k": 2}]
    assert plain({"$items": [[1, "a"]]}) == {"1": "a"}


def test_schema_shapes() -> None:
    from pydantic import BaseModel, Field

    class Decision(BaseModel):
        approved: bool
        feedback: str = Field("", description="why")
        tags: list[str] = []
        level: int | None = None

    assert shape(Decision.model_json_schema()) == (
        '{"approved": true|false, "feedback"?: "text", "tags"?: ["text", …], '
        '"level"?: integer|null}'
    )
    assert shape({"enum": ["a", "b"]}) == '"a"|"b"'
    assert shape({}) == "…"


def test_a_terminal_that_reports_no_size_is_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """``script`` and some CI runners open a pseudo-terminal nobody sized (0x0)."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    from workflow_engine_cli._term import terminal_columns

    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        monkeypatch.delenv("COLUMNS", raising=False)
        with os.fdopen(os.dup(slave), "w") as stream:
            assert terminal_columns(stream) == 80
            monkeypatch.setenv("COLUMNS", "0")
            assert terminal_columns(stream) == 80
            monkeypatch.setenv("COLUMNS", "50")
            assert terminal_columns(stream) == 50
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize(
    ("data", "offered"),
    [
        ("InDoubtEffect", "--data '{\"happened\": false}'"),
        ("UserTurnRequest", "--data '\"<your reply>\"'"),
        ("ToolApprovalRequestContent", "--reject"),
        ("HandoffUserInputRequest", "--end"),
        ("an application's", "--data '<JSON>'"),
    ],
)
def test_a_pause_offers_the_flags_that_answer_its_request(data: str, offered: str) -> None:
    """An effect in doubt was offered --approve|--reject|--message, which it refuses; only
    --data answers it (outside tester)."""
    from workflow_engine import EffectResolution, ExternalRequest, InDoubtEffect
    from workflow_engine.executors import (
        FunctionCallContent,
        HandoffUserInputRequest,
        ToolApprovalRequestContent,
        UserTurnRequest,
    )
    from workflow_engine_cli._console import print_paused

    values = {
        "InDoubtEffect": InDoubtEffect(executor_id="bank", step="tool#0"),
        "UserTurnRequest": UserTurnRequest(agent_name="a", text="hi"),
        "ToolApprovalRequestContent": ToolApprovalRequestContent(
            id="c1", function_call=FunctionCallContent(call_id="c1", name="pay", arguments={})
        ),
        "HandoffUserInputRequest": HandoffUserInputRequest(agent="a", message="hi", turn=1),
        "an application's": {"question": "ok?"},
    }
    request = ExternalRequest("q1", "p", values[data], EffectResolution)
    out = io.StringIO()
    print_paused(Terminal(out, live=False), "r1", [request], json_mode=False)
    lines = out.getvalue().splitlines()
    assert f"  workflow-engine respond q1 {offered}" in lines, out.getvalue()  # whole: pasted
    assert "  workflow-engine resume r1" in lines, out.getvalue()
    if data == "InDoubtEffect":  # each answer a command that runs as pasted (tester 69)
        assert "  workflow-engine respond q1 --data '{\"happened\": true}'" in lines
    if data == "ToolApprovalRequestContent":  # (tester 74: `--approve|--reject` pasted is a
        assert "  workflow-engine respond q1 --approve" in lines  # pipe that approves)
    if data == "HandoffUserInputRequest":
        assert "  workflow-engine respond q1 --message '<your reply>'" in lines
    commands = [line for line in lines if "workflow-engine" in line]
    assert not any("|" in line for line in commands), out.getvalue()
    # an application's request also says which type answers it (its --data JSON's shape)
    named = "; answer: EffectResolution)" in out.getvalue()
    assert named is (offered == "--data '<JSON>'"), out.getvalue()
    # and the shape of that JSON (tester 76: a guess found it)
    shaped = '  answer as JSON: {"happened": true|false, "result"?: ' in out.getvalue()
    assert shaped is named, out.getvalue()


def test_a_lost_lease_is_said_once_by_the_commands_error_line() -> None:
    """A run whose lease was taken over printed the failure as a ``✗`` line, then again as the
    command's ``error:`` line (outside tester); other failures are shown as they happen."""
    from workflow_engine import ErrorDetails, LeaseLostError, WorkflowFailedEvent
    from workflow_engine_cli._console import EventPrinter

    out = io.StringIO()
    printer = EventPrinter(Terminal(out, live=False), json_mode=False, codec=None)
    lost = ErrorDetails.from_exception(LeaseLostError("run 'r': our lease was lost"))
    printer.show(WorkflowFailedEvent(lost))
    assert out.getvalue() == "" and printer.failure == "run 'r': our lease was lost"
    printer.show(WorkflowFailedEvent(ErrorDetails.from_exception(ValueError("bad input"))))
    assert out.getvalue() == "✗ bad input\n"


def test_an_output_that_is_a_dict_or_list_is_shown_as_json() -> None:
    """``runs show`` printed ``{'k': 'x'}``, Python's repr (outside tester)."""
    from workflow_engine_cli._views import describe_output

    assert describe_output({"k": "x", "n": [1, None, True]}) == '{"k": "x", "n": [1, null, true]}'
    assert describe_output(["é"]) == '["é"]' and describe_output("text") == "text"


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12))
def test_a_printed_path_is_one_shell_word_that_bash_reads_back(text: str) -> None:
    """A database path with a tab was printed with spaces, and one with a newline split the
    command (tester 77): the word printed is the path, to bash, whatever it holds."""
    import subprocess

    from workflow_engine_cli._hints import shell_quoted

    quoted = shell_quoted(text)
    assert not any(ord(c) < 32 or ord(c) == 127 for c in quoted)  # printed as it is
    if "\x00" in text:  # (no argument holds a NUL)
        return
    said = subprocess.run(
        ["bash", "-c", f"printf %s {quoted}"], capture_output=True, check=True
    ).stdout
    assert said == text.encode("utf-8")


@pytest.mark.anyio
async def test_a_second_handoff_of_a_turn_is_not_shown_as_taken(
    live: tuple[Terminal, io.StringIO],
) -> None:
    """A model that calls two handoffs in one turn: the first is taken, the second answered
    "not run" -- and the command line showed both as ``↪ handoff to``, the next agent speaking
    under the second one's name (outside tester 158). A handoff is shown as its result comes."""
    from workflow_engine.executors import Agent, HandoffBuilder, Rule, ScriptedChatClient, ToolCall
    from workflow_engine_cli._console import EventPrinter

    both = [ToolCall("handoff_to_refunds", {}), ToolCall("handoff_to_orders", {})]
    triage = Agent("triage", client=ScriptedChatClient([Rule(reply="Passing you on.", calls=both)]))
    refunds = Agent("refunds", client=ScriptedChatClient([Rule(reply="Refunds here.")]))
    orders = Agent("orders", client=ScriptedChatClient([Rule(reply="Orders here.")]))
    workflow = (
        HandoffBuilder(name="desk", participants=[triage, refunds, orders])
        .add_handoff(triage, [refunds, orders])
        .with_start_agent(triage)
        .build()
    )
    term, out = live
    printer = EventPrinter(term, json_mode=False, codec=None)
    async with workflow.run_stream("help") as stream:
        async for event in stream:
            printer.show(event)
    printer.finish()
    screen = rendered(out.getvalue(), columns=40, lines=30)
    handoffs = [line for line in screen if "↪ handoff to" in line]
    assert handoffs == ["  ↪ handoff to refunds"], screen
    assert any("handoff_to_orders: error: not run" in line for line in screen), screen
    assert any(line.startswith("refunds: Refunds here.") for line in screen), screen
