"""Run the real ``workflow-engine`` executable the way a user does: plain pipes or a PTY.

``Cli`` runs one command per call with its own SQLite file and demo ledger (no terminal: stdin
is /dev/null). ``PtySession`` drives the interactive mode through a pseudo-terminal, with a
timeout on every read so that a hang fails the test instead of blocking it. ``ScreenSession``
is a PTY of a given size behind a terminal emulator (pyte): tests read the rendered screen, as a
person would, rather than the bytes -- text that is printed and then erased is not on it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyte

from tests.integration.fake_openai import sse_chunk

# The console script installed next to the interpreter running the tests (.venv/bin).
ENGINE = Path(sys.executable).parent / "workflow-engine"
TIMEOUT = 30.0  # per command
READ_TIMEOUT = 20.0  # per PTY read

# CSI (colours, cursor), OSC (titles, links) and charset escapes, then carriage returns.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text).replace("\r", "")


def flat(text: str) -> str:
    """Whitespace collapsed, so that matching ignores where the terminal wrapped a line."""
    return " ".join(text.split())


def assert_in_doubt_asked(out: str) -> None:
    """``out`` asks whether the demo's approved refund, cut off, happened (and gives its key)."""
    said = flat(out)
    assert "refund_agent's call submit_refund(" in said, out
    assert "started before the run stopped (a crash, a kill, an interruption; " in said, out
    assert "by its idempotency key: " in said, out
    assert "(InDoubtEffect)" in said, out


def base_env(ledger: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "WORKFLOW_ENGINE_", "PYTEST_"))
    }
    # The scripted (offline) agents, a wide console and the demo's outside system.
    env.update(COLUMNS="200", WORKFLOW_ENGINE_DEMO_LEDGER=str(ledger), PYTHONIOENCODING="utf-8")
    env.pop("NO_COLOR", None)
    env.pop("FORCE_COLOR", None)
    return env


@dataclass
class Result:
    args: tuple[str, ...]
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"$ workflow-engine {' '.join(self.args)}\n-> exit {self.code}\n{self.out}{self.err}"

    def error_line(self) -> str:
        """The one clear error line on stderr (and no traceback anywhere)."""
        assert "Traceback" not in self.out + self.err, str(self)
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert len(lines) == 1, str(self)
        assert lines[0].startswith("error: "), str(self)
        return lines[0]


class Cli:
    """``workflow-engine`` against one test's SQLite file and ledger."""

    def __init__(self, tmp_path: Path) -> None:
        assert ENGINE.exists(), f"console script not installed: {ENGINE}"
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.db = tmp_path / "runs.db"
        self.ledger_path = tmp_path / "ledger.jsonl"
        self.env = base_env(self.ledger_path)
        self.cwd = tmp_path

    def run(self, *args: str, db: bool = True) -> Result:
        argv = [str(ENGINE), *args, *(["--db", str(self.db)] if db else [])]
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=self.env,
            cwd=self.cwd,
            timeout=TIMEOUT,
            check=False,
        )
        return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)

    def expect(self, code: int, *args: str, db: bool = True) -> Result:
        """Run; assert the exit code and that nothing printed a traceback (JSON may hold a
        failed run's recorded one)."""
        result = self.run(*args, db=db)
        assert result.code == code, str(result)
        printed = result.err if "--json" in args else result.out + result.err
        assert "Traceback" not in printed, str(result)
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.expect(0, *args, "--json").out)

    def ledger(self) -> list[dict[str, Any]]:
        if not self.ledger_path.exists():
            return []
        return [json.loads(line) for line in self.ledger_path.read_text().splitlines() if line]

    def start_paused(self, message: str = "I want a refund for order 12345") -> tuple[str, str]:
        """A demo run stopped at its first approval: (run id, request id)."""
        result = self.expect(3, "demo", "handoff", "-m", message, "--detach", "--json")
        lines = [json.loads(line) for line in result.out.strip().splitlines()]
        assert all("type" in line for line in lines), str(result)  # every line typed
        paused = lines[-1]
        assert paused["type"] == "paused" and paused["run_id"] == paused["paused"], str(result)
        assert len(paused["requests"]) == 1, str(result)
        return paused["paused"], paused["requests"][0]


def run_concurrently(jobs: Sequence[tuple[Cli, Sequence[str], bool]]) -> list[Result]:
    """Independent commands (each with its own database) at once: (cli, args, with --db)."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(lambda job: job[0].run(*job[1], db=job[2]), jobs))


def wait_until_blocked_on_a_fifo(pid: int, timeout: float = 30.0) -> None:
    """Wait until a thread of process ``pid`` waits to open a FIFO: the approved tool call is
    under way, blocked on the FIFO ledger. (A fixed half-second sleep for it was a guess that a
    loaded machine could prove wrong.)"""
    deadline = time.monotonic() + timeout
    while True:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                if (task / "wchan").read_text() == "wait_for_partner":
                    return
            except OSError:  # (a thread that ended meanwhile)
                continue
        if time.monotonic() >= deadline:
            raise AssertionError(f"process {pid}: no thread waits on a FIFO within {timeout:g} s")
        time.sleep(0.02)


class PtySession:
    """One ``workflow-engine`` process whose stdin/stdout/stderr are a pseudo-terminal."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        *,
        term: str = "dumb",
        size: tuple[int, int] | None = None,  # (columns, lines)
        stdout: Path | None = None,  # a file instead of the terminal (``> file``)
        stderr: Path | None = None,  # a file instead of the terminal (``2> file``)
        controlling: bool = False,  # the terminal is the process's controlling terminal
        sigint_ignored: bool = False,  # started as a script's background job (``cmd &``) is
    ) -> None:
        master, slave = os.openpty()
        if size is not None:  # what the program's get_terminal_size() will see
            columns, lines = size
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.master = master
        self.raw = b""
        out = stdout.open("wb") if stdout is not None else None
        err = stderr.open("wb") if stderr is not None else None
        # by default the child leads a session of its own, with no controlling terminal shared
        # with the test runner; ``controlling``: it leads one whose controlling terminal is this
        # PTY (util-linux ``setsid --ctty``), so closing the window hangs it up as a real one
        self.proc = subprocess.Popen(
            ["setsid", "--ctty", str(ENGINE), *args] if controlling else [str(ENGINE), *args],
            stdin=slave,
            stdout=out if out is not None else slave,
            stderr=err if err is not None else slave,
            env={**env, "TERM": term},
            cwd=cwd,
            close_fds=True,
            start_new_session=not controlling,  # (setsid needs to not lead a group already)
            preexec_fn=_ignore_sigint if sigint_ignored else None,
        )
        os.close(slave)  # ours; the master sees EOF once the child is gone
        for mine in (out, err):
            if mine is not None:
                mine.close()  # the child has its own

    @property
    def text(self) -> str:
        return strip_ansi(self.raw.decode("utf-8", errors="replace"))

    def _read(self, deadline: float) -> bool:
        """Read what is available before the deadline; False at EOF."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        if not chunk:
            return False
        self.raw += chunk
        self._received(chunk)
        return True

    def _received(self, chunk: bytes) -> None:
        """Hook for subclasses: every chunk of output, in order."""

    def expect(self, pattern: str, timeout: float = READ_TIMEOUT) -> str:
        """Read until the output (after ``start``) contains ``pattern``; returns that output."""
        deadline = time.monotonic() + timeout
        while True:
            if flat(pattern) in flat(self.text):
                return self.text
            if time.monotonic() >= deadline:
                raise AssertionError(f"no {pattern!r} within {timeout:g} s; got:\n{self.text}")
            if not self._read(deadline):
                raise AssertionError(f"exited before {pattern!r}; got:\n{self.text}")

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def interrupt(self) -> None:
        """What Ctrl-C does on a terminal: SIGINT to the foreground process group (the child
        leads its own session here, without a controlling terminal to send it). Nothing is
        typed: writing the ``^C`` a terminal echoes into the PTY typed it as input, and a
        prompt's readline that read those keys could miss the signal that came with them."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def send_raw(self, data: bytes) -> None:
        """Keys as bytes, e.g. ``b"\x04"`` (Ctrl-D) or ``b"\x03"`` (Ctrl-C)."""
        os.write(self.master, data)

    def wait(self, timeout: float = READ_TIMEOUT) -> int:
        """Read to EOF, then reap; the exit code."""
        deadline = time.monotonic() + timeout
        while self._read(deadline):
            if time.monotonic() >= deadline:
                raise AssertionError(f"still running after {timeout:g} s; got:\n{self.text}")
        return self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))

    def hang_up(self) -> None:
        """What closing the terminal window does: the master side goes away, the kernel sends
        SIGHUP to the session (``controlling`` only) and the process's writes fail from then."""
        os.close(self.master)
        self.master = -1

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        if self.master >= 0:
            os.close(self.master)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ScreenSession(PtySession):
    """A PTY of ``columns`` by ``lines`` behind a terminal emulator: ``screen()`` is what a
    person sees (lines scrolled off the top included), not the byte stream."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        *,
        columns: int = 80,
        lines: int = 40,
        term: str = "xterm-256color",
        stdout: Path | None = None,
        stderr: Path | None = None,
        controlling: bool = False,
        sigint_ignored: bool = False,
    ) -> None:
        self._screen = pyte.HistoryScreen(columns, lines, history=10_000)
        self._stream = pyte.ByteStream(self._screen)
        # the window size comes from the PTY: COLUMNS/LINES would override it
        env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
        super().__init__(
            args,
            env,
            cwd,
            term=term,
            size=(columns, lines),
            stdout=stdout,
            stderr=stderr,
            controlling=controlling,
            sigint_ignored=sigint_ignored,
        )

    def _received(self, chunk: bytes) -> None:
        self._stream.feed(chunk)

    def resize(self, columns: int, lines: int = 40) -> None:
        """Resize the window, as a person dragging its edge: the PTY's size, then SIGWINCH to
        the program (the emulator does not reflow what is already on the screen)."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self._screen.resize(lines, columns)
        self.proc.send_signal(signal.SIGWINCH)

    def screen(self) -> list[str]:
        """Every rendered line, from the oldest scrolled-off one to the bottom of the window,
        without trailing blanks."""
        columns = self._screen.columns
        scrolled = [
            "".join(line[x].data for x in range(columns)) for line in self._screen.history.top
        ]
        rows = [*scrolled, *self._screen.display]
        rows = [row.rstrip() for row in rows]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def screen_text(self) -> str:
        return "\n".join(self.screen())

    def expect_screen(self, text: str, timeout: float = READ_TIMEOUT) -> list[str]:
        """Read until ``text`` is on the screen (whitespace collapsed, so a wrapped sentence
        still matches); returns the screen."""
        deadline = time.monotonic() + timeout
        while True:
            if flat(text) in flat(self.screen_text()):
                return self.screen()
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"no {text!r} on the screen within {timeout:g} s; screen:\n"
                    + self.screen_text()
                )
            if not self._read(deadline):
                raise AssertionError(f"exited before {text!r}; screen:\n{self.screen_text()}")

    def expect_prompt(self, prompt: str, timeout: float = READ_TIMEOUT) -> list[str]:
        """Read until the screen ends with ``prompt``: a prompt asked again (after an error
        said above it) is shown only once the keys typed before it were dropped (a prompt
        reads only what is typed after it), so what is sent after this is read."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.screen() if line.strip()]
            if lines and lines[-1].strip() == prompt.strip():
                return self.screen()
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"the screen does not end with {prompt!r} after {timeout:g} s; screen:\n"
                    + self.screen_text()
                )
            self._read(min(deadline, time.monotonic() + 0.1))

    def settle(self, quiet: float = 0.3, timeout: float = READ_TIMEOUT) -> None:
        """Read until no output arrived for ``quiet`` seconds (a prompt waits for input)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = len(self.raw)
            if not self._read(min(deadline, time.monotonic() + quiet)):
                return
            if len(self.raw) == before:
                return


# --- a real model streaming slowly ---------------------------------------------------------------

SLOW_REPLY = (
    "Thank you for writing. I am sorry the headphones arrived broken; let me see what we can "
    "do about order 12345 for you today."
)


class SlowModel(ThreadingHTTPServer):
    """An OpenAI-compatible endpoint that thinks for a while, then streams its answer a word at
    a time, slowly enough for the spinner to tick before and while it speaks. ``broken``: it
    stops after three words and closes the connection, which ends its stream (a server
    stopped mid-reply)."""

    def __init__(self, think: float = 0.6, per_word: float = 0.05, broken: bool = False) -> None:
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                if broken:
                    self.send_header("connection", "close")
                self.end_headers()
                time.sleep(model.think)
                words = re.findall(r"\S+\s*", SLOW_REPLY)
                for word in words[:3] if broken else words:
                    self.chunk({"content": word})
                    time.sleep(model.per_word)
                if broken:
                    self.close_connection = True
                    return
                self.chunk({}, "stop")
                self.wfile.write(b"data: [DONE]\n\n")

            def chunk(self, delta: dict[str, Any], finish: str | None = None) -> None:
                self.wfile.write(sse_chunk(delta, finish, model="slow"))
                self.wfile.flush()

        super().__init__(("127.0.0.1", 0), Handler)
        self.think, self.per_word = think, per_word
        self.thread = threading.Thread(target=self.serve_forever, args=(0.01,), daemon=True)

    def __enter__(self) -> SlowModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
