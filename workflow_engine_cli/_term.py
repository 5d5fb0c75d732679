"""Writing for a person at a terminal: styled lines, agent text streamed in place, a spinner.

A :class:`Terminal` works in one of two modes, decided once by :func:`is_live`:

* **live** -- stdout is a terminal, ``TERM`` is not ``dumb`` and ``NO_COLOR`` is unset: colours,
  words wrapped at the terminal's width with continuation lines indented, and a spinner while a
  run works.
* **plain** -- the same words without any escape code, no spinner: pipes, files, CI logs, dumb
  terminals and ``NO_COLOR``. On a terminal (``NO_COLOR``, ``TERM=dumb``) words are still
  wrapped at its width -- wrapping writes only spaces and newlines; ``NO_COLOR`` broke words
  and paths in the middle. Never wrapped off a terminal, whose width is unknown.

The spinner never erases content: it draws only while no line is open (the cursor is at the
start of an empty line) and every write first erases exactly that line. A spinner redrawn over a
half-printed line is how agent text used to vanish from the screen.

Text from models and tools goes through :func:`clean` first, so it cannot move the cursor or
change the terminal's state with escape sequences of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

Part = str | tuple[str, str]
"""Text, or ``(text, style)`` where style is space-separated words from :data:`STYLES`."""

STYLES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}
_RESET = "\x1b[0m"
_ERASE_LINE = "\r\x1b[K"
_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
# C0 and C1 controls but \t and \n; the line and paragraph separators (a line break to many
# line readers); the bidirectional overrides and isolates (they reorder what is shown)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_TOKENS = re.compile(r"\n|[^\S\n]+|\S+")
_WORD_ROOM = 16
"""The fewest columns a continuation line leaves its words before it drops its indent."""


_PLAIN = [False]


def write_plainly() -> None:
    """From now on every :class:`Terminal` writes plain lines: the terminal hung up, and its
    output goes to a log (escape codes were written into it: outside tester 179)."""
    _PLAIN[0] = True


def is_live(stream: TextIO) -> bool:
    """Colours, wrapping and a spinner: only for a real terminal that wants them."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return _on_a_terminal(stream)


def _on_a_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def terminal_columns(stream: TextIO) -> int:
    """The terminal's width: ``COLUMNS`` if set (as for ``shutil.get_terminal_size``), else
    asked of the terminal ``stream`` is on (it may change between calls: a resized window)."""
    with contextlib.suppress(KeyError, ValueError):
        if (columns := int(os.environ["COLUMNS"])) > 0:
            return columns
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 80
    return columns if columns > 0 else 80  # a pseudo-terminal nobody sized reports 0


def clean(text: str) -> str:
    """``text`` with control characters (escape sequences, carriage returns) made visible and
    harmless; newlines stay, tabs become spaces."""
    text = text.replace("\r\n", "\n").replace("\t", "    ")
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", text)


def discard_typeahead() -> None:
    """Drop what the terminal holds that no one has read yet (nothing to do off a terminal:
    piped answers are meant to be read in order)."""
    if stdin_is_tty():
        import termios

        with contextlib.suppress(OSError, termios.error, ValueError):
            termios.tcflush(sys.stdin.fileno(), termios.TCIFLUSH)


def visible(text: str) -> str:
    """``text`` with every character that is not printable -- escape sequences, bell, NUL,
    carriage returns, line and paragraph separators, undecodable bytes -- written as an escape
    (``\\x1b``, ``\\u2028``), as ``repr`` shows them: nothing in an error line can act on the
    terminal or break the line, and the id it names can still be read (and typed) exactly."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def visible_word(text: str) -> str:
    """``visible(text)``, quoted as ``repr`` quotes it when it begins or ends with whitespace:
    on the screen that whitespace vanished (a run id ``"  lead"`` was shown as ``lead``, which
    names no run), so the id could not be typed back."""
    if text != text.strip():
        return repr(text)
    return visible(text)


def stdin_is_tty() -> bool:
    """stdin is a terminal -- so what is typed is echoed (not when it is closed: ``<&-`` leaves
    ``sys.stdin`` None, and every command that might ask failed with a traceback -- outside
    tester 113)."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def text_problem(text: str) -> str | None:
    """Why ``text`` is not real Unicode text (None: it is): a byte that was not UTF-8 (Python
    carries one as a lone surrogate U+DC80..U+DCFF) or another lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        if 0xDC80 <= code <= 0xDCFF:
            return f"byte 0x{code - 0xDC00:02x} is not UTF-8"
        return f"a lone surrogate U+{code:04X}"
    return None


def cell_width(text: str) -> int:
    """Columns ``text`` takes on a terminal (wide East Asian characters take two)."""
    if text.isascii():  # (a flag of the str: free) no wide or combining character then
        return len(text)
    width = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in "WF" else 1
    return width


def styled(text: str, style: str, *, live: bool) -> str:
    if not live or not style:
        return text
    codes = ";".join(STYLES[word] for word in style.split())
    return f"\x1b[{codes}m{text}{_RESET}"


_CONTINUED: list[Any] = [0, False]
"""How many times the job came back to the foreground after it was stopped (Ctrl-Z, then
``fg``) or sent to the background (``bg``): the shell wrote on the screen meanwhile, so a line
left open goes on from a line of its own; and whether the cursor may be in the middle of a
line then (the job wrote while in the background)."""


def note_continued(mid_line: bool = False) -> None:
    """The job is in the foreground again: see ``_CONTINUED``."""
    _CONTINUED[0] += 1
    _CONTINUED[1] = mid_line


_WORD_HOOK: list[Callable[[], None] | None] = [None]
"""Called before each word a terminal writes (``set_word_hook``)."""


def set_word_hook(hook: Callable[[], None] | None) -> Callable[[], None] | None:
    """Call ``hook`` before each word written from now on (the console's look at whether the
    job is back in the foreground); the hook it replaces."""
    before, _WORD_HOOK[0] = _WORD_HOOK[0], hook
    return before


class Terminal:
    """One output stream, written line by line or streamed word by word, thread-safe.

    ``line(...)`` writes a whole line; ``begin(...)`` opens a line that ``write(...)`` extends
    as text arrives and ``end()`` closes. Words are placed whole: a word that would cross the
    right edge starts the next line (at ``indent``), so the screen never shows a word cut in
    two unless it is wider than the terminal.
    """

    def __init__(self, out: TextIO | None = None, *, live: bool | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self._live = is_live(self.out) if live is None else live
        self._wraps = self._live or (live is None and _on_a_terminal(self.out))
        self._lock = threading.RLock()
        self._column = 0  # cursor column on the current screen line
        self._open = False  # a line was begun and not ended
        self._indent = 0  # where continuation lines of the open line start
        self._pad = 0  # spaces still to write before the next word (continuation indent)
        self._gap = ""  # whitespace between the last word written and the next
        self._word: list[tuple[str, str]] = []  # a streamed word that may not be complete yet
        self._status: str | None = None  # the spinner's label while working
        self._status_since = 0.0  # when the label last changed
        self._spinner_drawn = False
        self._continued = _CONTINUED[0]  # the stops it has seen (see ``_CONTINUED``)

    # --- writing ------------------------------------------------------------------------------

    @property
    def width(self) -> int:
        """Columns to wrap at (0: never wrap). One short of the terminal's width: writing the
        last column leaves some terminals in a deferred-wrap state we would rather not model."""
        if not self._wraps:
            return 0
        # (however narrow: wrapped at 20 in a window of 16, every line was folded again by the
        # terminal, and words were cut everywhere -- outside tester 214)
        return max(terminal_columns(self.out) - 1, 1)

    def _hanging(self, width: int) -> int:
        """Where continuation lines start: at the open line's indent, unless that leaves the
        words fewer than ``_WORD_ROOM`` columns (a narrow window): then at the left edge."""
        return self._indent if not width or width - self._indent >= _WORD_ROOM else 0

    @property
    def live(self) -> bool:
        """Whether it writes for a terminal (styles, a spinner) -- not once that terminal
        hung up and what it would show goes to a log instead (see ``write_plainly``)."""
        return self._live and not _PLAIN[0]

    def line(self, *parts: Part, indent: int = 2) -> None:
        """Write one whole line (closing any open one first)."""
        with self._lock:
            self.begin(*parts, indent=indent)
            self.end()

    def whole(self, text: str, style: str = "") -> None:
        """Write ``text`` as one line that is never broken: a key or an id a person copies
        (where the terminal folds it, copying still gives one string; a newline written at
        the window's edge would cut it in two)."""
        with self._lock:
            self.end()
            self._erase_spinner()
            self.out.write(styled(clean(text), style, live=self.live) + "\n")
            self.out.flush()

    def begin(self, *parts: Part, indent: int = 2) -> None:
        """Open a new line starting with ``parts``; continuation lines start at ``indent``."""
        with self._lock:
            self.end()
            self._open = True
            self._indent = indent
            for part in parts:
                self.write(*((part, "") if isinstance(part, str) else part))

    def write(self, text: str, style: str = "") -> None:
        """Append streamed ``text`` to the open line (opening one if needed)."""
        with self._lock:
            self._erase_spinner()
            self._open = True
            for token in _TOKENS.findall(clean(text)):
                if token == "\n":
                    self._place_word()
                    self._newline()
                elif token.isspace():
                    self._place_word()
                    self._gap += token
                else:
                    self._word.append((token, style))
            self.out.flush()

    def end(self) -> None:
        """Close the open line: write what is held back, then a newline."""
        with self._lock:
            self._erase_spinner()
            self._place_word()
            if self._column > 0:
                self.out.write("\n")
            self._column = self._pad = self._indent = 0
            self._gap = ""
            self._open = False
            self.out.flush()

    def ask(self, read: Callable[[str], str], *parts: Part) -> str:
        """Show a prompt and read one line; the answer's newline leaves the cursor at column 0.

        A line that is not text -- bytes that are not UTF-8, which stdin hands over as lone
        surrogates (see ``main``) -- is never returned: it is refused and the prompt repeats,
        until a real line, Ctrl-D or the end of the input (``EOFError``).
        """
        while True:
            try:
                answer = self._ask_once(read, parts)
                problem = text_problem(answer)
            except UnicodeDecodeError as exc:  # a stdin not set to surrogateescape
                problem = f"byte 0x{exc.object[exc.start]:02x} is not UTF-8"
                if not stdin_is_tty():  # nothing was echoed: the cursor is after the prompt
                    self.out.write("\n")
            if problem is None:
                return answer
            self.line((f"  that line is not text ({problem}); type it again", "red"), indent=4)

    def _ask_once(self, read: Callable[[str], str], parts: Sequence[Part]) -> str:
        to_readline = self.out is sys.stdout  # input() writes its prompt to stdout only
        with self._lock:
            self.end()
            prompt = "".join(
                self._prompt_part(*((p, "") if isinstance(p, str) else p), to_readline)
                for p in parts
            )
        if not to_readline:  # not ours to use: written here, without readline's markers
            # the type-ahead dropped before the prompt shows, not after: a message typed the
            # moment it showed was dropped, with output in a file (outside tester 154)
            discard_typeahead()
            self.out.write(prompt)
            self.out.flush()
            prompt = ""
        try:
            answer = read(prompt)
        except (EOFError, KeyboardInterrupt):
            # no Enter was echoed: the cursor is still after the prompt (a terminal that hung
            # up takes nothing more: the end of input is what matters, not this newline)
            with contextlib.suppress(OSError):
                self.out.write("\n")
                self.out.flush()
            raise
        finally:
            with self._lock:
                self._column = 0
        if not stdin_is_tty():  # (answers piped in: nothing echoed them -- the next line ran
            # on after the prompt, and a transcript kept no answer: outside tester 203)
            with contextlib.suppress(OSError):
                self.out.write(f"{clean(answer.rstrip(chr(13)))}\n")  # (a CRLF line's \r)
                self.out.flush()
        return answer

    def _prompt_part(self, text: str, style: str, to_readline: bool = True) -> str:
        text = clean(text)
        if not self.live or not style:
            return text
        # GNU readline counts every byte of the prompt as a column unless escapes are marked;
        # written anywhere else, the markers are bytes a terminal (emulator) may show or choke on
        marked = to_readline and "readline" in sys.modules
        mark = ("\x01", "\x02") if marked else ("", "")
        codes = ";".join(STYLES[word] for word in style.split())
        return f"{mark[0]}\x1b[{codes}m{mark[1]}{text}{mark[0]}{_RESET}{mark[1]}"

    def _place_word(self) -> None:
        """Write the held word: on this line if it fits after the gap, else on the next."""
        if not self._word:
            return
        hook = _WORD_HOOK[0]
        if hook is not None:
            hook()
        if self._continued != _CONTINUED[0]:  # back in front: the shell wrote a line (``fg``'s)
            self._continued = _CONTINUED[0]
            if self._column:
                if _CONTINUED[1]:  # (and this may have written after it, from the background)
                    self.out.write("\n")
                self._column, self._pad, self._gap = 0, self._hanging(self.width), ""
        pieces, self._word = self._word, []
        size = sum(cell_width(text) for text, _ in pieces)
        width = self.width
        room = width - max(self._column, self._pad)
        if width and self._column > self._hanging(width) and cell_width(self._gap) + size > room:
            self._newline()
        if self._column == 0 and self._pad:
            self.out.write(" " * self._pad)
            self._column, self._pad = self._pad, 0
        elif self._gap:
            self._emit(self._gap, "")
        self._gap = ""
        for text, style in pieces:
            self._emit(text, style)

    def _emit(self, text: str, style: str) -> None:
        """Write ``text``, breaking it (mid-word) only where it is wider than the line."""
        width = self.width
        run = ""
        for char in text:
            size = cell_width(char)
            if width and self._column + size > width:
                self.out.write(styled(run, style, live=self.live))
                run = ""
                self._newline()
                self.out.write(" " * self._pad)
                self._column, self._pad = self._pad, 0
            run += char
            self._column += size
        self.out.write(styled(run, style, live=self.live))

    def _newline(self) -> None:
        self.out.write("\n")
        self._column = 0
        self._pad = self._hanging(self.width)
        self._gap = ""

    # --- the spinner --------------------------------------------------------------------------

    @property
    def status(self) -> str | None:
        return self._status

    @status.setter
    def status(self, label: str) -> None:
        """A new label restarts the elapsed time: it counts for what the label names."""
        with self._lock:
            if self._status is not None and label != self._status:
                self._status = label
                self._status_since = time.monotonic()

    @contextmanager
    def working(self, label: str = "working…") -> Iterator[None]:
        """Show a spinner with ``label`` on its own line until the block ends (live mode only)."""
        if not self.live:
            yield
            return
        with self._lock:
            self._status = label
            self._status_since = time.monotonic()
        stop = threading.Event()
        spinner = threading.Thread(target=self._spin, args=(stop,), name="spinner", daemon=True)
        spinner.start()
        try:
            yield
        finally:
            stop.set()
            spinner.join()
            with self._lock:
                self._erase_spinner()
                self._status = None
                self.out.flush()

    def _spin(self, stop: threading.Event) -> None:
        frame = 0
        while not stop.wait(0.1):
            with self._lock:
                if not self.live:  # (the terminal hung up: a log gets no frames)
                    return
                if self._open or self._column or self._status is None:
                    continue  # a line is open: the arriving text is the progress
                elapsed = int(time.monotonic() - self._status_since)
                label = f"{_FRAMES[frame % len(_FRAMES)]} {self._status}"
                if elapsed >= 2:
                    label += f" {elapsed}s"
                # within the terminal's real width, not the wrapping's (at least 20): in a
                # narrower window each frame wrapped and left a line behind (tester 113)
                room = terminal_columns(self.out) - 1
                if room < 2:
                    continue
                label = _fitted(label, room)
                self.out.write(_ERASE_LINE + styled(label, "dim", live=True))
                self.out.flush()
                self._spinner_drawn = True
                frame += 1

    def _erase_spinner(self) -> None:
        if self._spinner_drawn:
            if self.live:  # (on the terminal it was drawn on, not in a log)
                self.out.write(_ERASE_LINE)
            self._spinner_drawn = False


def _fitted(text: str, cells: int) -> str:
    """The start of ``text`` that takes at most ``cells`` columns."""
    used = 0
    for at, char in enumerate(text):
        used += cell_width(char)
        if used > cells:
            return text[:at]
    return text


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    wrap: Sequence[str] = (),
    live: bool = False,
) -> list[str]:
    """Rows as aligned columns, two spaces apart, headers first (bold when ``live``).

    Each cell stays on its line (a newline in a value used to split the row). Only the columns
    named in ``wrap`` may be narrowed (to ``MIN_WRAP`` columns at least); they
    wrap onto continuation lines between words. All other cells (ids, statuses) are written
    whole -- a cut id cannot be copied. When the columns still do not fit in ``width`` (0: no
    limit), each row becomes a block of ``HEADER  value`` lines instead (see ``_records``).
    """
    # a cell is one line: free text's line breaks become spaces; anything else (ids, names)
    # has its unprintable characters escaped, so an id is shown as it can be typed back
    free = [h in wrap for h in headers]
    cells = [
        [clean(c).replace("\n", " ") if free[i] else visible_word(c) for i, c in enumerate(row)]
        for row in rows
    ]
    sizes = [[cell_width(c) for c in row] for row in cells]  # each cell measured once
    natural = [max([cell_width(h), *(row[i] for row in sizes)]) for i, h in enumerate(headers)]
    widths = list(natural)
    flexible = [i for i, h in enumerate(headers) if h in wrap]
    if width and flexible:
        fixed = sum(widths[i] for i in range(len(headers)) if i not in flexible)
        room = width - fixed - 2 * (len(headers) - 1)
        for i in flexible:
            # narrower than its longest word (up to ``WORD_ROOM``), a word would break inside
            # it: rows become blocks then (a tool's call, ``submit_refund({"order_id":``, was
            # cut at 24 columns where a block had room for it -- outside tester 142)
            longest = max((cell_width(w) for row in cells for w in row[i].split(" ")), default=0)
            floor = min(max(MIN_WRAP, longest), WORD_ROOM)
            widths[i] = min(natural[i], max(room // len(flexible), floor))
    if width and sum(widths) + 2 * (len(headers) - 1) > width:
        return _records(headers, cells, width, live)
    lines = [_table_line(list(headers), widths, "bold" if live else "", live)]
    for row, size in zip(cells, sizes, strict=True):
        if all(n <= w for n, w in zip(size, widths, strict=True)) and not any(
            c.startswith(" ") for c in row
        ):  # the usual row: it fits as it is (what wrapping it would give)
            lines.append(_table_line(row, widths, "", live, size))
            continue
        wrapped = [_wrap(cell, widths[i], break_words=True) for i, cell in enumerate(row)]
        for n in range(max(len(w) for w in wrapped)):
            cells_n = [w[n] if n < len(w) else "" for w in wrapped]
            lines.append(_table_line(cells_n, widths, "", live))
    return lines


MIN_WRAP = 20
"""The narrowest a wrapped column gets: narrower, words break mid-word, so rows become blocks."""
WORD_ROOM = 32
"""... and as wide as its longest word, up to this: a longer word breaks in a block too."""


def _records(headers: Sequence[str], cells: list[list[str]], width: int, live: bool) -> list[str]:
    """A table too wide for the window, one block per row: ``HEADER  value`` lines, a blank
    line between rows. Values wrap between words under their label; a word wider than the
    window (an id) stays whole and lets the terminal fold it."""
    label = max(cell_width(h) for h in headers) + 2
    lines: list[str] = []
    for n, row in enumerate(cells):
        if n:
            lines.append("")
        for header, cell in zip(headers, row, strict=True):
            longest = max(cell_width(word) for word in cell.split(" "))
            style = "bold" if live else ""
            # the value beside its label if each of its words fits there (with a shorter label
            # if need be); else under it, on lines of its own
            pad = next((p for p in (label, cell_width(header) + 2) if p + longest <= width), 0)
            if pad:
                parts = _wrap(cell, width - pad, break_words=False)
                lines.append((styled(header.ljust(pad), style, live=live) + parts[0]).rstrip())
                lines.extend((" " * pad + part).rstrip() for part in parts[1:])
                continue
            lines.append(styled(header, style, live=live))
            indent = 2 if 2 + longest <= width else 0
            lines.extend(
                (" " * indent + part).rstrip()
                for part in _wrap(cell, width - indent, break_words=False)
            )
    return lines


def _table_line(
    cells: list[str], widths: list[int], style: str, live: bool, sizes: list[int] | None = None
) -> str:
    if sizes is None:
        sizes = [cell_width(cell) for cell in cells]
    padded = [cell + " " * (w - n) for cell, w, n in zip(cells, widths, sizes, strict=True)]
    return styled("  ".join(padded).rstrip(), style, live=live)


def _wrap(text: str, width: int, *, break_words: bool) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken between words; a word wider than
    that is cut (``break_words``) or left whole on a line of its own.

    Linear in the text: each word is measured once and the line is kept as a list of words
    (re-measuring the growing line per word took minutes for a 40 KB cell)."""
    lines: list[str] = []
    words: list[str] = []  # the line being built
    used = 0  # its columns
    filled = False  # it has a character (else the next word starts it without a space)
    for word in text.split(" "):
        size = cell_width(word)
        if filled and used + 1 + size <= width:
            words.append(word)
            used += 1 + size
            continue
        if not filled and (size <= width or not break_words):
            words, used, filled = [word], size, bool(word)
            continue
        if filled:
            lines.append(" ".join(words))
        while break_words and size > width:
            cut = _fit(word, width)
            lines.append(word[:cut])
            size -= cell_width(word[:cut])
            word = word[cut:]
        words, used, filled = [word], size, bool(word)
    lines.append(" ".join(words))
    return lines


def _fit(text: str, width: int) -> int:
    """How many leading characters of ``text`` fit in ``width`` columns (at least one)."""
    used = 0
    for n, char in enumerate(text):
        used += cell_width(char)
        if used > width:
            return max(n, 1)
    return len(text)
