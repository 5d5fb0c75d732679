"""What a prompt makes of a line read in parts from a non-blocking stdin."""

from __future__ import annotations

import errno
import io
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflow_engine._input import is_blank
from workflow_engine_cli._console import _rejoined, interruptible_input
from workflow_engine_cli._term import Terminal


def _read_in_parts(parts: list[bytes], encoding: str) -> str:
    """The parts as stdin's text layer hands them over when each read finds only one."""
    return "".join(part.decode(encoding, "surrogateescape") for part in parts)


@pytest.mark.parametrize(
    ("encoding", "parts", "line"),
    [
        ("utf-8", [b"Caf\xc3", b"\xa9\n"], "Café\n"),
        ("utf-8", [b"\xf0", b"\x9f\x98\x80!\n"], "\U0001f600!\n"),
        ("utf-8", [b"\xf0\x9f", b"\x98", b"\x80\n"], "\U0001f600\n"),
        ("utf-8", [b"ok \xff", b" no\n"], "ok \udcff no\n"),  # (still no text: refused later)
        ("euc-jp", [b"\xc3", b"\xa9 x\n"], "辿 x\n"),  # (stdin's own encoding, not UTF-8)
    ],
)
def test_a_character_split_between_reads_is_put_together(
    monkeypatch: pytest.MonkeyPatch, encoding: str, parts: list[bytes], line: str
) -> None:
    """Tester 99: "Café" in two writes was refused as not text; tester 100: in another
    encoding than UTF-8, the rejoined bytes became another character."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(), encoding=encoding))
    assert _rejoined(_read_in_parts(parts, encoding)) == line


class _HungUp(io.TextIOBase):
    """A terminal whose window closed while its prompt waited: reading it fails with EIO, and
    so does writing to it after the prompt."""

    def __init__(self) -> None:
        self.written = 0

    def readline(self, size: int | None = -1) -> str:
        raise OSError(errno.EIO, "Input/output error")

    def write(self, text: str) -> int:
        self.written += 1
        if self.written > 1:
            raise OSError(errno.EIO, "Input/output error")
        return len(text)

    def isatty(self) -> bool:
        return False


def test_a_prompt_on_a_terminal_that_hung_up_ends_as_the_input_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window closed at the approval prompt: the read failed with EIO, which ended the
    command as a failure, and a ``> log`` kept nothing of how to continue (outside tester
    113). It is the end of the input (as Ctrl-D), also while the prompt's newline cannot be
    written: the run pauses and says how to continue where output still goes."""
    monkeypatch.setattr(sys, "stdin", _HungUp())
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with pytest.raises(EOFError):
        interruptible_input("Approve? ")
    with pytest.raises(EOFError):
        Terminal(_HungUp()).ask(interruptible_input, "Approve? ")


# --- what counts as a blank message -----------------------------------------------------------


def _blank_by_definition(text: str) -> bool:
    """The definition, character by character: white space, format and control characters (a
    NUL alone was a reply: outside tester 150), and what shows nothing alone."""
    import unicodedata

    from workflow_engine._input import _shows_nothing

    return all(
        c.isspace() or unicodedata.category(c) in ("Cf", "Cc") or _shows_nothing(ord(c))
        for c in text
    )


def test_control_characters_alone_are_blank() -> None:
    assert is_blank("\x00") and is_blank("\x00 \x07\x7f") and is_blank("\x00\u200b")
    assert not is_blank("\x00a")


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.characters(max_codepoint=127))
    | st.text(alphabet=" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\u200b\u3164\ufeff\u2800\u00a0x")
)
def test_a_blank_message_is_told_apart_the_same_way_with_or_without_the_ascii_shortcut(
    text: str,
) -> None:
    """ASCII text is told blank without looking characters up (importing ``unicodedata``
    cost a resumed chat turn ~0.3 ms); it must agree with the definition everywhere."""
    assert is_blank(text) == _blank_by_definition(text)


# --- keys typed while agents work ---------------------------------------------------------------


def test_keys_typed_while_agents_work_are_dropped_when_the_work_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A paste at the last approval prompt ("y", then a shell command) or keys typed while the
    agent said its last words: nothing asked after them, so they reached the shell once the
    run finished, and ran there (outside tester 142). A real pseudo-terminal: what is left
    unread on it when the work stops is dropped."""
    import os
    import pty
    import select

    from workflow_engine_cli._console import typed_keys_hidden

    master, slave = pty.openpty()
    terminal = open(slave, encoding="utf-8", closefd=False)  # noqa: SIM115 (closed below)
    try:
        monkeypatch.setattr(sys, "stdin", terminal)
        with typed_keys_hidden(True):
            os.write(master, b"echo LEAKED-INTO-SHELL\n")
            assert select.select([slave], [], [], 1.0)[0]  # (waiting to be read meanwhile)
        assert not select.select([slave], [], [], 0.2)[0], "typed keys were left to the shell"
    finally:
        terminal.close()
        os.close(slave)
        os.close(master)
