"""A streamed run on the terminal, and the questions a paused run asks.

:func:`drive` resumes a run, shows its events and answers what it asks, until it finishes or
pauses with questions no one here can answer.

:class:`EventPrinter` turns a run's events into lines a person can follow: what each agent says
(streamed in place), the tools it calls and what they return, handoffs, failures. ``--json``
prints one JSON object per event instead.

:class:`AnswerPolicy` answers pending requests, from flags or by asking. Asking never crashes:
an answer that cannot be parsed or that the request refuses (pydantic's message) is explained
and asked again; Ctrl-D leaves the run paused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import aclosing, nullcontext
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from workflow_engine import (
    ExecutorFailedEvent,
    ExecutorInvokedEvent,
    ExternalRequest,
    InDoubtEffect,
    JsonCodec,
    RequestAlreadyAnsweredError,
    ResponseTypeError,
    RunInfo,
    Runtime,
    StorageError,
    StoreLockedError,
    StoreUnavailableError,
    WorkflowEvent,
    WorkflowFailedEvent,
    WorkflowOutputEvent,
    WorkflowRunState,
)
from workflow_engine._input import InputError, MalformedJsonError, is_blank, parse_json
from workflow_engine.executors import (
    AgentResponse,
    AgentRunUpdateEvent,
    HandoffOutcome,
    HandoffUserInputRequest,
    ToolApprovalRequestContent,
)

from ._exits import EXIT_DONE, EXIT_FAILED, EXIT_PAUSED, Exit, exit_code_for
from ._hints import DATA_PLACEHOLDER, REPLY_PLACEHOLDER, respond_command, resume_command
from ._term import (
    Part,
    Terminal,
    discard_typeahead,
    note_continued,
    set_word_hook,
    stdin_is_tty,
    visible,
)
from ._views import (
    compact,
    describe_output,
    describe_request,
    field_notes,
    in_doubt_said,
    shape,
)

_WHERE = re.compile(r"^run '[^']*', request '[^']*': ")  # said once already: the prompt is it
RESULT_CHARS = 400  # a tool result longer than this is shortened on screen (--json has it all)

Submit = Callable[[Any], Awaitable[None]]
"""Stores an answer; raises ``ResponseTypeError`` (with pydantic's message) for an invalid one."""


_APPROVE_CHOICES = "[y]es / [n]o / [e]dit arguments: "
_APPROVE_ROOM = len("Approve? ") + len(_APPROVE_CHOICES) + 4  # and the answer, on one line
_IN_DOUBT_CHOICES = "[y]es / [n]o (it runs again): "
_IN_DOUBT_ROOM = len("Did it happen? ") + len(_IN_DOUBT_CHOICES) + 4
_NARROW_ROOM = len("Did it happen? [y/n]: ") + 4
"""Narrower than this, a question is a line of its own and its prompt only the choices."""
_EDIT_PROMPT = "Arguments to change, as JSON (empty: back): "
_EDIT_ROOM = len(_EDIT_PROMPT) + 20  # and a short edit, on one line


class EventPrinter:
    """Prints a run's events as they stream: agent text live, tool calls, handoffs, results."""

    def __init__(self, term: Terminal, *, json_mode: bool, codec: JsonCodec | None) -> None:
        self.term = term
        self.json_mode = json_mode
        self.codec = codec
        self._speaker: str | None = None  # the agent whose line of text is open
        self.failure: str | None = None  # the last failure shown (not shown twice)
        self._calls: dict[str, dict[str, Any]] = {}
        self.outputs_shown: list[Any] = []  # so that the summary at the end does not repeat them
        self.said: dict[str, str] = {}  # agent -> the text of its latest message shown here

    def said_last(self, agent: str, text: str) -> bool:
        """Whether ``text`` is what ``agent`` last said here (white space aside)."""
        return "".join(self.said.get(agent, "").split()).endswith("".join(text.split()))

    def just_said(self, output: Any) -> bool:
        """Whether ``output`` is an agent's reply whose last message is the last thing that
        agent said on this screen: a summary line repeating it said it twice (outside tester
        177). A reply shown by an earlier process is still summed up."""
        if not isinstance(output, AgentResponse) or output.agent_name not in self.said:
            return False
        replies = [m.text for m in output.messages if m.role == "assistant" and m.text]
        return bool(replies) and self.said_last(output.agent_name, replies[-1])

    def _close_line(self) -> None:
        if self._speaker is not None:
            self.term.end()
            self._speaker = None

    def show(self, event: WorkflowEvent) -> None:
        if self.json_mode:
            print(json.dumps(event.to_dict(self.codec), default=str), flush=True)
            return
        if isinstance(event, ExecutorInvokedEvent):
            self.term.status = f"{event.executor_id} is working…"
        elif isinstance(event, AgentRunUpdateEvent):
            self._agent_update(event)
        elif isinstance(event, ExecutorFailedEvent | WorkflowFailedEvent):
            self._close_line()
            # the run's failure repeats the step's; a lost lease ends the command, whose error
            # line says it (it was said twice)
            said = event.error.message == self.failure or event.error.code == "lease_lost"
            # a step in doubt is not a failure: the run asks about it next (``_in_doubt``)
            said = said or event.error.code == "effect_in_doubt"
            if not said:
                self.term.line((f"✗ {event.error.message}", "bold red"))
            self.failure = event.error.message
        elif isinstance(event, WorkflowOutputEvent):
            self._close_line()
            if not isinstance(event.data, HandoffOutcome | AgentResponse):
                self.term.line(("output: ", "bold green"), describe_output(event.data))
                self.outputs_shown.append(event.data)

    def _agent_update(self, event: AgentRunUpdateEvent) -> None:
        if event.kind == "text":
            text = event.text
            if self._speaker != event.executor_id:
                self._close_line()
                prefix = f"{event.executor_id}:"
                indent = len(prefix) + 1 if len(prefix) < 24 else 2  # continue under the text
                self.term.begin((prefix, "bold cyan"), " ", indent=indent)
                self._speaker = event.executor_id
                text = text.lstrip()
                self.said[event.executor_id] = ""
            self.said[event.executor_id] += text
            self.term.write(text)
        elif event.kind == "function_call" and event.call_id:
            call = self._calls.setdefault(event.call_id, {"name": event.name, "args": ""})
            call["name"] = event.name or call["name"]
            call["args"] += event.arguments_delta
        elif event.kind == "message_end":
            self._close_line()
            for call in self._calls.values():
                name = call["name"] or "?"
                if not name.startswith("handoff_to_"):  # (a handoff: said once it is taken)
                    self.term.line((f"  → {name}({call['args']})", "yellow"), indent=4)
            self._calls.clear()
        elif event.kind == "function_result":
            name = event.name or ""
            if name.startswith("handoff_to_") and not event.error:
                # said as its result comes: a second handoff of one turn is not taken (its
                # result says so), and it was shown as taken (outside tester 158)
                target = name.removeprefix("handoff_to_")
                self.term.line(("  ↪ handoff to ", "magenta"), (target, "bold magenta"))
                return
            text = f"error: {event.error}" if event.error else compact(event.result)
            if len(text) > RESULT_CHARS:
                text = text[: RESULT_CHARS - 1] + "…"
            self.term.line((f"  ← {event.name or ''}: {text}", "dim"), indent=4)

    def finish(self) -> None:
        self._close_line()


def interruptible_input(prompt: str) -> str:
    """``input()`` that a single Ctrl-C interrupts, and that reads only what is typed after
    its prompt is shown.

    Under ``anyio.run`` asyncio's runner owns SIGINT and only cancels the main task, which a
    blocking ``input()`` never notices; restore Python's default handler while we wait. On a
    terminal, keys typed earlier -- while an agent was speaking, or the lines after the first of
    a paste -- are discarded first: an approval is answered by a person who saw the question,
    never by type-ahead.
    """
    if prompt:  # (none: the terminal wrote it, having dropped the type-ahead first)
        discard_typeahead()
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if _asked_to_stop():
            raise KeyboardInterrupt
        if sys.stdin is None:  # closed (``<&-``): nothing can be read, as at its end
            raise EOFError
        with _signals_interrupt_the_wait():
            return input(prompt) if not _stdin_nonblocking() else _patient_input(prompt)
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
        # the terminal hung up (its window closed): nothing more will be typed, as at the end
        # of input -- the run pauses and says how to continue, where output still goes (a
        # ``> log`` kept nothing of it: outside tester 113)
        raise EOFError from None
    finally:
        signal.signal(signal.SIGINT, previous)


def _asked_to_stop() -> bool:
    """The run was asked to stop (Ctrl-C, SIGTERM: its task is being cancelled) just before
    this prompt: no one should be asked -- the cancel would take effect only once answered."""
    import asyncio

    try:
        task = asyncio.current_task()
    except RuntimeError:  # (no event loop: the first message, before the run)
        return False
    return task is not None and task.cancelling() > 0


_POKE = signal.SIGURG
"""The signal that interrupts a prompt's wait (ignored by default, so harmless if late)."""

_POKE_EVERY = 0.02
"""Seconds between pokes, until the one that arrived first has been handled."""


@contextlib.contextmanager
def _signals_interrupt_the_wait() -> Iterator[None]:
    """While a prompt waits, a signal's handler runs as the signal arrives.

    Python runs a handler only when the interpreter next looks, and the line editor looks only
    when its wait is interrupted. A signal that arrived as the prompt was shown -- after Python
    last looked, before the wait began -- ran its handler only at the next signal: a SIGTERM
    sent the moment ``Approve?`` showed was ignored (outside tester 154: 2 runs of 3; 3 of 8
    scripted runs here). Each signal's arrival is written to a pipe (``set_wakeup_fd``) that a
    thread watches; it interrupts the wait with ``_POKE`` -- again, a moment later, until the poke's
    own handler has run (one that lands before the wait begins is lost the same way), and with
    it every handler pending. Whoever watched the wakeup descriptor before (an event loop) is
    told of each signal as before.
    """
    import select
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # (only the main thread's waits run handlers, and only it may set the fd)
        return
    watched, written = os.pipe()
    os.set_blocking(written, False)
    handled = [False]  # (set by the poke's handler: a lock taken in a handler can break)

    def poked(signum: int, frame: Any) -> None:
        handled[0] = True

    poke_before = signal.signal(_POKE, poked)
    told_before = signal.set_wakeup_fd(written, warn_on_full_buffer=False)
    main = threading.get_ident()

    def relay() -> None:
        owed = False  # a signal arrived whose handler has not run yet
        while True:
            ready, _, _ = select.select([watched], [], [], _POKE_EVERY if owed else None)
            if ready:
                arrived = os.read(watched, 256)
                if not arrived or 0 in arrived:  # (0: the prompt is over)
                    return
                signals = bytes(b for b in arrived if b != _POKE)
                if signals:
                    if told_before != -1:
                        with contextlib.suppress(OSError):
                            os.write(told_before, signals)
                    handled[0] = False
                    owed = True
            if owed and handled[0]:
                owed = False
            if owed:
                with contextlib.suppress(OSError, ValueError):
                    signal.pthread_kill(main, _POKE)

    watcher = threading.Thread(target=relay, name="prompt-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(told_before)
        signal.signal(_POKE, poke_before)
        os.write(written, b"\0")
        watcher.join()
        os.close(watched)
        os.close(written)


def _stdin_nonblocking() -> bool:
    """stdin is a descriptor another process (one sharing it: a parent, a tool in the same
    terminal) made non-blocking. ``input()`` then reads "nothing yet" as the end of input, and
    the person's answer was lost: the run was left paused as at Ctrl-D (tester 95)."""
    try:
        return not os.get_blocking(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def _patient_input(prompt: str) -> str:
    """``input(prompt)`` on a non-blocking stdin: wait until there is something to read, and
    read up to the end of the line (what arrives in parts is put together). The flag is left
    as it is: it belongs to every process sharing the descriptor."""
    import select

    sys.stdout.write(prompt.replace("\x01", "").replace("\x02", ""))  # (readline's markers)
    sys.stdout.flush()
    fd = sys.stdin.fileno()
    line = sys.stdin.readline()  # (a line read before may wait in stdin's own buffer)
    while not line.endswith("\n"):
        select.select([fd], [], [])  # ("" and a part of a line: what there is now)
        part = sys.stdin.readline()
        if not part:  # readable, yet nothing: the end
            if line:
                return _rejoined(line)  # the last line, without a newline, as input() reads it
            raise EOFError
        line += part
    return _rejoined(line)[:-1]


def _rejoined(text: str) -> str:
    """``text`` read in parts, decoded again as one: a character split between two reads
    arrives as lone surrogates (stdin's ``surrogateescape``), which together are the
    character (tester 99: "Café" in two writes was refused as not text). In stdin's own
    encoding, whatever it is (tester 100)."""
    encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
    try:
        return text.encode(encoding, "surrogateescape").decode(encoding, "surrogateescape")
    except (UnicodeError, LookupError):  # (a surrogate no byte stands for: left as read)
        return text


@contextlib.contextmanager
def typed_keys_hidden(asking: bool) -> Iterator[None]:
    """While agents work, keys typed at the terminal are not echoed: they are discarded before
    the next prompt anyway (``discard_typeahead``), and when the work stops, and echoed they
    landed in the middle of what the agents said on the screen. Only for a run that may ask
    (``asking``) in the terminal's foreground: a job sent to the background (``&``) must not
    touch the terminal, which would stop it. The settings come back when the work stops --
    Ctrl-C included, and SIGTERM or SIGHUP, which a wrapper (``timeout``, a script) sends
    without a shell restoring them."""
    fd = _foreground_terminal() if asking else None
    if fd is None:
        yield
        return
    import termios

    try:
        saved = termios.tcgetattr(fd)
        quiet = list(saved)
        quiet[3] &= ~termios.ECHO  # (the local modes)
        _set_terminal(fd, quiet)
    except (OSError, termios.error, ValueError):
        yield  # a terminal that refuses: keys are echoed as before
        return

    def restore() -> None:
        with contextlib.suppress(OSError, termios.error, ValueError):
            # what was typed meanwhile is dropped here too, not only before a prompt: after
            # the run's last answer it reached the shell, run as commands (tester 142)
            termios.tcflush(fd, termios.TCIFLUSH)
            _set_terminal(fd, saved)

    def restore_and_die(signum: int, frame: Any) -> None:
        restore()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def continued(signum: int, frame: Any) -> None:
        # stopped (Ctrl-Z) and continued: the shell set the terminal its way meanwhile, and
        # keys typed were echoed into the agents' text again (outside tester 208)
        note_continued()
        if _foreground_terminal() == fd:  # (``fg``; after ``bg``, see ``BackInFront``)
            with contextlib.suppress(OSError, termios.error, ValueError):
                _set_terminal(fd, quiet)

    handlers = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):  # (one of ours: left alone)
            handlers[sig] = signal.signal(sig, restore_and_die)
    if signal.getsignal(signal.SIGCONT) in (signal.SIG_DFL, None):
        handlers[signal.SIGCONT] = signal.signal(signal.SIGCONT, continued)
    front = BackInFront(fd, quiet)
    watching = threading.Event()
    watcher = threading.Thread(target=front.watch, args=(watching,), name="echo-off", daemon=True)
    watcher.start()
    before_a_word = set_word_hook(front.look)  # (and before each word written: see there)
    try:
        yield
    finally:
        set_word_hook(before_a_word)
        watching.set()
        watcher.join(timeout=1)
        restore()
        for sig, before in handlers.items():
            signal.signal(sig, before)


class BackInFront:
    """Turns echo off again when the job comes back to the foreground without being stopped
    first -- ``bg``, then ``fg``: no signal says so, and the shell turned echo on (outside
    tester 211) -- and notes that the shell wrote on the screen (``note_continued``). Looked
    at ten times a second while agents work (``watch``), and before each word written: a key
    typed in between was still echoed into the text (outside tester 212)."""

    def __init__(self, fd: int, quiet: list[Any]) -> None:
        self._fd, self._quiet = fd, quiet
        self._in_front = True
        self._lock = threading.Lock()

    def watch(self, done: threading.Event) -> None:
        while not done.wait(0.1):
            self.look()

    def look(self) -> None:
        import termios

        if not self._lock.acquire(blocking=False):  # (the other thread is looking)
            return
        try:
            now = os.tcgetpgrp(self._fd) == os.getpgrp()
            if now and not self._in_front and termios.tcgetattr(self._fd)[3] & termios.ECHO:
                note_continued(mid_line=True)
                # (from any thread, without ignoring SIGTTOU, which only the main thread may:
                # sent to the background again just now, the job stops, as any would)
                termios.tcsetattr(self._fd, termios.TCSANOW, self._quiet)
            self._in_front = now
        except (OSError, termios.error):
            pass
        finally:
            self._lock.release()


def _foreground_terminal() -> int | None:
    """stdin's descriptor when it is a terminal this process may set: the controlling terminal
    with this process in its foreground, or a terminal that is not its controlling one (no job
    control there to stop it)."""
    if not stdin_is_tty():
        return None
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        return None
    try:
        foreground = os.tcgetpgrp(fd)
    except OSError:  # ENOTTY: not this process's controlling terminal
        return fd
    return fd if foreground == os.getpgrp() else None


def _set_terminal(fd: int, attributes: list[Any]) -> None:
    """``tcsetattr``, with SIGTTOU ignored meanwhile: sent to the background between the check
    and the call, the process would otherwise be stopped by it."""
    import termios

    before = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        termios.tcsetattr(fd, termios.TCSANOW, attributes)
    finally:
        signal.signal(signal.SIGTTOU, before)


def enable_line_editing() -> None:
    """Arrow keys and history at the prompts (GNU readline, where Python has it)."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (importing it is what makes input() use it)


@dataclass
class AnswerPolicy:
    """How pending requests get answered: from flags, or by asking on the terminal."""

    interactive: bool
    approvals: str = "ask"  # ask | approve | reject
    replies: list[str] = field(default_factory=list)
    end_when_out_of_replies: bool = False
    term: Terminal = field(default_factory=Terminal)
    read: Callable[[str], str] = field(default=interruptible_input)
    stopped: bool = False
    """Ctrl-C was pressed at a prompt: no further request is asked about."""
    shown: EventPrinter | None = None
    """What the run showed as it streamed (``drive`` sets it): a question it did not show on
    the terminal asked on is said there before its prompt."""

    async def settle(self, request: ExternalRequest, submit: Submit) -> bool:
        """Answer ``request`` through ``submit``; False leaves it unanswered (the run pauses)."""
        data = request.data
        try:
            if isinstance(data, ToolApprovalRequestContent):
                return await self._approval(data, submit)
            if isinstance(data, HandoffUserInputRequest):
                return await self._user_input(data, submit)
            if isinstance(data, InDoubtEffect):
                return await self._in_doubt(data, submit)
            return await self._other(request, submit)
        except EOFError:  # Ctrl-D at a prompt: no answer now, the run waits
            self.term.end()
            return False
        except KeyboardInterrupt:
            # Ctrl-C at a prompt: the run is paused, nothing is under way -- say how to
            # continue it, request by request, as Ctrl-D does (it said only "Interrupted";
            # outside tester 113), and ask nothing more
            self.term.end()
            self.stopped = True
            return False

    def _ask(self, *prompt: Part) -> str:
        return self.term.ask(self.read, *prompt)

    def _asked(self, question: str, choices: str, width: int) -> str:
        """``question`` asked with its ``choices`` on one line; in a window too narrow for
        that, the question on a line of its own and the choices as the prompt (the prompt
        broke mid-word at the window's edge, and the answer landed out of place: tester
        217)."""
        if width and width < _NARROW_ROOM:
            self.term.line((question, "bold"))
            return self._ask(choices)
        return self._ask((f"{question} ", "bold"), choices)

    def _transcript(self) -> Terminal | None:
        """Where the run is written when that is not where the person is asked (``demo >
        log``), else None."""
        shown = self.shown
        if shown is not None and shown.term is not self.term and not shown.json_mode:
            return shown.term
        return None

    def _noted(self, *parts: Part, indent: int = 4) -> None:
        """The person's answer, in the run's transcript too when that is not where they were
        asked (``demo > log``: the file read as a conversation with the person's side left
        out -- their replies, their decisions; outside tester 191)."""
        transcript = self._transcript()
        if transcript is not None:
            transcript.line(*parts, indent=indent)

    def _problem(self, text: str) -> None:
        self.term.line((f"  {_WHERE.sub('', text)}", "red"), indent=4)

    async def _approval(self, request: ToolApprovalRequestContent, submit: Submit) -> bool:
        call = request.function_call
        shown = f"{call.name}({compact(call.arguments)})"
        if self.approvals in ("approve", "reject"):
            verdict = "approved" if self.approvals == "approve" else "rejected"
            self.term.line(("Approval: ", "bold"), f"{shown} {verdict}", indent=4)
            await submit({"approved": self.approvals == "approve"})
            return True
        if not self.interactive:
            return False
        self.term.line(("Approval needed: ", "bold yellow"), shown, indent=4)
        while True:
            # (asked again at the window's width now: it may have narrowed since -- tester 214)
            width = self.term.width  # 0: lines are not wrapped here
            choices = _APPROVE_CHOICES if not width or width >= _APPROVE_ROOM else "[y/n/e]: "
            choice = self._asked("Approve?", choices, width)
            choice = choice.strip().lower()
            if choice in ("y", "yes"):
                await submit({"approved": True})
                self._noted(("Approval: ", "bold"), f"{shown} approved")
                return True
            if choice in ("n", "no"):
                await submit({"approved": False})
                self._noted(("Approval: ", "bold"), f"{shown} rejected")
                return True
            if choice in ("e", "edit"):
                if await self._edit(call.name, call.arguments, submit):
                    return True
                continue
            self._problem("answer y (run it), n (do not run it) or e (edit its arguments)")

    async def _edit(self, tool: str, arguments: dict[str, Any], submit: Submit) -> bool:
        """Ask for edited arguments until the tool's schema accepts them; False: back out."""
        self.term.line(("  now: ", "dim"), compact(arguments), indent=4)
        told = False
        while True:
            width = self.term.width  # (now: see ``_approval``; 0: lines are not wrapped here)
            prompt = _EDIT_PROMPT
            if width and width < _EDIT_ROOM:  # narrow: the terminal would break it mid-word
                if not told:
                    self.term.line("  " + _EDIT_PROMPT.rstrip(), indent=2)  # (wrapped)
                    told = True
                prompt = "JSON: "
            raw = self._ask(prompt).strip()
            if not raw:
                return False
            try:
                edits = typed_json(raw, "the edit")
            except ValueError as exc:
                self._problem(str(exc))
                continue
            if not isinstance(edits, dict):
                self._problem(f'not a JSON object: write {{"name": value, ...}} for {tool}')
                continue
            try:
                await submit({"approved": True, "arguments": edits})
            except ResponseTypeError as exc:
                self._problem(str(exc))
                continue
            # what runs, beside the model's call shown above (edits override, the rest stays)
            edited = compact({**arguments, **edits})
            self.term.line(("  runs as: ", "dim"), f"{tool}({edited})", indent=4)
            self._noted(("Approval: ", "bold"), f"approved as {tool}({edited})")
            return True

    async def _user_input(self, request: HandoffUserInputRequest, submit: Submit) -> bool:
        if self.replies:
            reply = self.replies.pop(0)
            self.term.line(("You: ", "bold green"), reply, indent=5)
            await submit({"message": reply})
            return True
        if self.end_when_out_of_replies:  # (``--end``: at a terminal too -- tester 142)
            await submit({"end": True})
            return True
        if not self.interactive:
            return False
        if not self._showed(request.agent, request.message):
            # (a resumed run, or the run's text gone to a file: "You (...):" asked a reply to a
            # question not on the screen -- outside tester 172)
            self.term.line((f"{request.agent}: ", "bold cyan"), request.message)
        while True:
            typed = self._ask(("You", "bold green"), " (empty or /end to finish): ")
            reply = typed.strip()
            if typed and is_blank(typed):  # spaces, invisible characters: a stray key, which
                # ended the conversation for good (outside tester 177), as the API refuses it
                self.term.line(
                    "A blank reply is no message: press Enter alone (or type /end) to finish."
                )
                continue
            done = not reply or reply == "/end"
            await submit({"end": True} if done else {"message": reply})
            if not done:
                self._noted(("You: ", "bold green"), reply, indent=5)
            return True

    def _showed(self, agent: str, text: str) -> bool:
        """Whether ``agent``'s ``text`` is what it last said on the terminal asked on."""
        shown = self.shown
        return shown is not None and shown.term is self.term and shown.said_last(agent, text)

    async def _in_doubt(self, question: InDoubtEffect, submit: Submit) -> bool:
        """A step that started before the run stopped: did it happen? Asked as y/n, the way a
        person knows it (they looked it up by its key), never answered by ``--approve``."""
        if not self.interactive:
            return False
        show_in_doubt(self.term, question)
        if (transcript := self._transcript()) is not None:  # (what the answer below answers)
            show_in_doubt(transcript, question)
        while True:
            width = self.term.width  # (now: see ``_approval``)
            choices = _IN_DOUBT_CHOICES if not width or width >= _IN_DOUBT_ROOM else "[y/n]: "
            choice = self._asked("Did it happen?", choices, width).strip().lower()
            if choice in ("n", "no"):
                await submit({"happened": False})
                self._noted(("Did it happen? ", "bold"), "no")
                return True
            if choice in ("y", "yes"):
                break
            self._problem("answer y (it happened: it is not run again) or n (it runs again)")
        while True:
            raw = self._ask("Its result, as JSON or text (empty: not known): ").strip()
            try:  # (an object, a list or a quoted string is JSON; other words are text)
                result = typed_json(raw, "the result") if raw[:1] in ("{", "[", '"') else raw
            except ValueError as exc:  # (text that starts like JSON: say how to give it)
                self._problem(f'{exc}; text starting with {raw[0]} goes in quotes: "..."')
                continue
            await submit({"happened": True, "result": None if raw == "" else result})
            self._noted(("Did it happen? ", "bold"), f"yes{f', with {raw}' if raw else ''}")
            return True

    async def _other(self, request: ExternalRequest, submit: Submit) -> bool:
        """Any other request: show its data, ask in the form its response type suggests."""
        if not self.interactive:
            return False
        schema = _schema(request.response_type)
        kind = _answer_kind(schema)
        transcript = self._transcript()  # (the question too: "Answer: ..." alone said little)
        for term in [self.term] if transcript is None else [self.term, transcript]:
            term.line((f"Request {request.port_id}", "bold"), " is waiting for an answer:")
            for label, value in _fields(request.data):
                term.line(f"  {label}: " if label else "  ", value, indent=4)
        hint = {"bool": "y/n", "text": "text"}.get(kind, "JSON")
        if kind == "json" and schema:
            self.term.line(("  answer as JSON: ", "dim"), shape(schema), indent=4)
            for name, note in field_notes(schema):
                self.term.line((f"    {name}: {note}", "dim"), indent=6)
        while True:
            raw = self._ask(("Answer", "bold"), f" ({hint}): ").strip()
            try:
                value = _parse(raw, kind, schema)
            except ValueError as exc:
                self._problem(str(exc))
                continue
            try:
                await submit(value)
            except ResponseTypeError as exc:
                self._problem(str(exc))
                continue
            self._noted(("Answer: ", "bold"), raw)
            return True


def _schema(response_type: Any) -> dict[str, Any]:
    try:
        return TypeAdapter(response_type).json_schema()
    except Exception:  # a type pydantic cannot describe: no hint, the answer is still validated
        return {}


def _answer_kind(schema: dict[str, Any]) -> str:
    """``text`` (plain text is the answer), ``bool`` (y/n) or ``json``."""
    kind = schema.get("type")
    if kind == "string":
        return "text"
    if kind == "boolean":
        return "bool"
    return "json"


def _parse(raw: str, kind: str, schema: dict[str, Any]) -> Any:
    if kind == "text":
        if not raw:
            raise ValueError("type an answer (Ctrl-D leaves the run waiting)")
        return raw
    if kind == "bool":
        if raw.lower() in ("y", "yes", "true"):
            return True
        if raw.lower() in ("n", "no", "false"):
            return False
        raise ValueError("answer y or n")
    try:
        return typed_json(raw, "the answer")
    except ValueError as exc:
        expected = f"; expected {shape(schema)}" if schema else ""
        raise ValueError(f"{exc}{expected}") from None


def typed_json(raw: str, what: str) -> Any:
    """JSON typed at a prompt, bounded like every other input (depth, size, real text, no
    NaN); ``ValueError`` with a short reason (``not JSON (... at column N)``) otherwise."""
    try:
        return parse_json(raw, what=what)
    except MalformedJsonError as exc:
        try:
            json.loads(raw)  # only to say where: parse_json checked the depth already
        except json.JSONDecodeError as syntax:
            raise ValueError(f"not JSON ({syntax.msg} at column {syntax.colno})") from None
        except ValueError:
            pass
        raise ValueError(str(exc)) from None
    except InputError as exc:
        raise ValueError(str(exc)) from None


def _fields(data: Any) -> list[tuple[str, str]]:
    """A request's data as ``(label, value)`` lines: one per field of an object."""
    value = to_jsonable_python(data, fallback=str)
    if isinstance(value, dict) and value:
        return [(str(k), v if isinstance(v, str) else compact(v)) for k, v in value.items()]
    return [("", value if isinstance(value, str) else compact(value))]


# --- driving a run ----------------------------------------------------------------------------


async def drive(
    runtime: Runtime,
    run_id: str,
    policy: AnswerPolicy,
    *,
    json_mode: bool,
    detach: bool,
    term: Terminal,
) -> int:
    """Resume, stream, answer what the policy can, repeat; returns the exit code. A store that
    refuses a write on the way (a commit, an answer) is said once, with how to continue."""
    run = await runtime.store.get_run(run_id)
    codec = runtime.workflow(run.workflow_name).codec
    printer = EventPrinter(term, json_mode=json_mode, codec=codec)
    policy.shown = printer
    try:
        return await _drive(runtime, run_id, policy, printer, json_mode, detach, term)
    except StorageError as exc:
        if json_mode or not _worth_retrying(exc):
            raise
        if str(exc) != printer.failure:  # else its step's failure said it already
            term.line((f"✗ {exc}", "bold red"))
        # (the command whole on a line of its own: wrapped, a pasted one ran `--db` without
        # its path -- outside tester 195)
        term.line("Nothing committed is lost: once the storage is usable again, continue with:")
        term.whole(f"  {resume_command(run_id)}")
        raise Exit(exit_code_for(exc)) from None


async def _drive(
    runtime: Runtime,
    run_id: str,
    policy: AnswerPolicy,
    printer: EventPrinter,
    json_mode: bool,
    detach: bool,
    term: Terminal,
) -> int:
    while True:
        stream = runtime.resume_stream(run_id)
        try:
            async with aclosing(stream):
                hidden = typed_keys_hidden(policy.interactive and not detach)
                working = nullcontext() if json_mode else term.working()
                with hidden, working, stopping_said(term, json_mode):
                    async for event in stream:
                        printer.show(event)
        finally:
            printer.finish()
        result = stream.result
        assert result is not None
        if result.status is WorkflowRunState.IDLE:
            if not json_mode:
                for output in result.outputs:
                    if output not in printer.outputs_shown and not printer.just_said(output):
                        term.line((f"✓ {describe_output(output)}", "bold green"))
                term.line(f"Run {visible(run_id)} finished.")
            return EXIT_DONE
        if result.status is not WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
            cancelled = result.status is WorkflowRunState.CANCELLED
            # (a cancel stored while the run was stopped mid-step: what it leaves unknown)
            in_doubt = (await runtime.get_run(run_id)).effects_in_doubt if cancelled else []
            if json_mode:
                if in_doubt:  # typed like every line before it
                    effects = [e.model_dump(mode="json") for e in in_doubt]
                    line = {"type": "effects_in_doubt", "run_id": run_id, "effects": effects}
                    print(json.dumps(line), flush=True)
                return EXIT_FAILED
            term.line((f"Run {visible(run_id)} ended {result.status.value}.", "red"))
            if not cancelled:  # (the command whole, as "Continue with:" has it: broken at
                # the window's edge, a copy of it ran ``--db`` without its path -- tester 177)
                term.line("Resuming retries it:")
                term.whole(f"  {resume_command(run_id)}")
            for effect in in_doubt:
                show_in_doubt(term, effect, then=CANCELLED_WITHOUT_ASKING)
            return EXIT_FAILED
        waiting = []
        for request in result.pending_requests:

            async def submit(answer: Any, request_id: str = request.request_id) -> None:
                await runtime.respond(request_id, answer)

            if detach or policy.stopped:
                waiting.append(request)
                continue
            try:
                if not await policy.settle(request, submit):
                    waiting.append(request)
            except RequestAlreadyAnsweredError:
                # answered meanwhile from elsewhere (another terminal's ``respond``): that
                # answer stands, and the run goes on with it -- it said only "already answered
                # with a different value", exit 5 (outside tester 113); and says what it is:
                # the transcript read as if what was typed here had been sent (tester 172)
                from ._views import describe_answer

                stood = describe_answer(await runtime.get_request(request.request_id))
                policy.term.line(  # (where prompts go: with --json, not into the JSON lines)
                    ("  another answer was stored meanwhile, and stands -- ", "yellow"),
                    visible(stood),
                )
        # (another terminal may have answered too -- the same way, or another: it stands --
        # and continued the run to its end meanwhile: a pause block then offered commands that
        # fail, outside tester 118)
        info = await runtime.get_run(run_id)
        ended = _ended_elsewhere(info, json_mode, term)
        if ended is not None:
            return ended
        if waiting:
            pending = {r.request_id for r in info.pending_requests}  # (not answered meanwhile)
            left = [r for r in waiting if r.request_id in pending]
            if len(left) < len(waiting) and not json_mode:
                term.line(("  answered meanwhile from elsewhere: that answer stands", "yellow"))
            print_paused(term, run_id, left, json_mode)
            return EXIT_PAUSED


def _ended_elsewhere(info: RunInfo, json_mode: bool, term: Terminal) -> int | None:
    """The exit code when the run (``info``: as it is now), answered from elsewhere, was also
    continued there to its end (there is nothing left to resume: it said "idle; nothing to
    resume", exit 5 -- outside tester 113); None when it waits to be resumed here."""
    run_id = info.run_id
    if info.status not in (
        WorkflowRunState.IDLE,
        WorkflowRunState.CANCELLED,
        WorkflowRunState.FAILED,
    ):
        return None
    finished = info.status is WorkflowRunState.IDLE
    if json_mode:
        line = {"type": "ended_elsewhere", "run_id": run_id, "status": info.status.value}
        print(json.dumps(line), flush=True)
    elif finished:
        term.line(f"Run {visible(run_id)} was continued elsewhere, and finished there.")
    else:
        said = f"Run {visible(run_id)} was continued elsewhere, and ended {info.status.value}."
        term.line((said, "red"))
    return EXIT_DONE if finished else EXIT_FAILED


STOPPING = "stopping: a step under way finishes first · Ctrl-C again stops waiting"
_STOPPING_SAID = [STOPPING]  # what the first stop says (see ``stopped_from_outside``)


def stopped_from_outside(grace: float) -> None:
    """The stop under way was asked for by SIGTERM (a process manager, ``timeout``), not a
    Ctrl-C: the wait for a step under way ends by itself after ``grace`` seconds, which is
    what to say -- "Ctrl-C again stops waiting" told no one there that it would (outside
    tester 156)."""
    said = f"{grace:g} s at most (Ctrl-C: now)"
    _STOPPING_SAID[0] = f"stopping: a step under way finishes first · {said}"


@contextlib.contextmanager
def stopping_said(term: Terminal, json_mode: bool = False) -> Iterator[None]:
    """While agents work, the first Ctrl-C says what the command waits for: a step under way
    (an approved tool call) runs to its end before the run stops. The spinner went on saying
    "refund_agent is working…", with nothing to tell that a second Ctrl-C stops waiting.
    ``json_mode`` (no spinner; stdout is the JSON stream): said on stderr, as a line -- the
    terminal showed nothing at all until the second Ctrl-C (outside tester 118)."""
    import asyncio
    import threading

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    loop = asyncio.get_running_loop()

    def say_it_on_stderr() -> None:
        with contextlib.suppress(OSError, ValueError):
            print(_STOPPING_SAID[0], file=sys.stderr, flush=True)

    def first_press(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, previous)  # the next press goes on as it always did
        if json_mode:  # (not from a handler)
            loop.call_soon_threadsafe(say_it_on_stderr)
        else:
            loop.call_soon_threadsafe(setattr, term, "status", _STOPPING_SAID[0])
        previous(signum, frame)

    signal.signal(signal.SIGINT, first_press)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is first_press:
            signal.signal(signal.SIGINT, previous)


def _worth_retrying(exc: StorageError) -> bool:
    """A store that refused a write for a reason that passes (a full disk, a lock held too
    long, a file it could not write): the run can go on once that is fixed. Not a damaged
    record, a run another worker took, or one that does not exist."""
    return type(exc) is StorageError or isinstance(exc, StoreLockedError | StoreUnavailableError)


_ANSWER_FLAGS: dict[str, tuple[str, ...]] = {
    # one command per choice: ``--approve|--reject`` pasted as printed approved the call, the
    # shell reading ``|`` as a pipe (tester 74)
    "ToolApprovalRequestContent": ("--approve", "--reject"),
    # a placeholder pasted as printed is refused, not stored (``--message TEXT`` stored "TEXT"
    # as the customer's words for good, tester 76)
    "HandoffUserInputRequest": (f"--message '{REPLY_PLACEHOLDER}'", "--end"),
    "UserTurnRequest": (f"--data '\"{REPLY_PLACEHOLDER}\"'",),
    # a person says whether the effect happened (it was offered --approve, which is refused)
    "InDoubtEffect": ("--data '{\"happened\": true}'", "--data '{\"happened\": false}'"),
}
_ANY_ANSWER = (f"--data '{DATA_PLACEHOLDER}'",)  # an application's request: its answer, as JSON
_SAID_AS_ASKED = frozenset(
    {"ToolApprovalRequestContent", "HandoffUserInputRequest", "UserTurnRequest"}
)
"""The requests a pause block says in words (``asks:``): an approval's call, an agent's
question."""


CANCELLED_WITHOUT_ASKING = "the run was cancelled before anyone said whether it happened"
"""(Whether or not it had asked: "without asking" was false of a run cancelled while its
question waited -- outside tester 194.)"""
RESUME_ASKS = "`resume` asks whether it happened"


def show_in_doubt(term: Terminal, effect: InDoubtEffect, *, then: str = "") -> None:
    """A step in doubt, for a person: what it was, and the key to look its effect up by in
    the service it called (on a line of its own, whole: it is copied). ``then``: what becomes
    of the question (a run cancelled without asking it, one that asks it when resumed)."""
    said = in_doubt_said(effect)
    if then:
        term.line((f"⚠ in doubt: {said}; {then}.", "yellow"), indent=4)
    else:
        term.line(("In doubt: ", "bold yellow"), f"{said}.", indent=4)
    if effect.idempotency_key:
        term.line("  Look it up in the service it called by its idempotency key:", indent=4)
        term.whole(f"    {effect.idempotency_key}")


def print_paused(
    term: Terminal, run_id: str, pending: list[ExternalRequest], json_mode: bool
) -> None:
    if json_mode:
        ids = [r.request_id for r in pending]  # typed like every line before it
        print(json.dumps({"type": "paused", "run_id": run_id, "paused": run_id, "requests": ids}))
        return
    if not pending:  # (each answered from elsewhere meanwhile: the run waits for a resume)
        term.line((f"Run {visible(run_id)} is paused, its requests answered.", "bold"))
        term.line("Continue with:")
        term.whole(f"  {resume_command(run_id)}")
        return
    term.line((f"Run {visible(run_id)} is paused, waiting for input.", "bold"))
    for request in pending:
        asked = type(request.data).__name__
        schema = None
        if asked not in _ANSWER_FLAGS:  # an application's request: say what answers it
            expected = request.response_type
            asked += f"; answer: {getattr(expected, '__name__', None) or expected}"
            schema = _schema(expected)
        term.line(f"  request {request.request_id} ({asked})")
        if asked in _SAID_AS_ASKED:  # what would be approved, what the agent asked
            # (a reply's question was missing: outside tester 177)
            term.line(("  asks: ", "dim"), visible(describe_request(request.data)), indent=4)
        elif not isinstance(request.data, InDoubtEffect):  # what an application's asks about
            # (as the inbox shows it: a draft to review was said nowhere -- outside tester 208)
            said = describe_request(request.data, request.port_id)
            term.line(("  asks: ", "dim"), visible(said), indent=4)
        if schema:  # its JSON's shape: a guess did it before (tester 76)
            term.line(("  answer as JSON: ", "dim"), shape(schema), indent=4)
        if isinstance(request.data, InDoubtEffect):  # what is asked, and what to look it up by
            show_in_doubt(term, request.data)
    request_id = pending[0].request_id if len(pending) == 1 else "REQUEST_ID"
    # the flags that answer these requests (a reply to the customer is not approved), each
    # choice a command that runs as pasted (tester 69), whole on a line of its own: wrapped
    # between its words, a pasted command ran as two (tester 67: a newline after `--db`)
    choices = dict.fromkeys(
        flags for r in pending for flags in _ANSWER_FLAGS.get(type(r.data).__name__, _ANY_ANSWER)
    )
    term.line("Answer with one of:" if len(choices) > 1 else "Answer with:")
    for flags in choices:
        term.whole(f"  {respond_command(request_id, flags)}")
    term.line("then continue with:")
    term.whole(f"  {resume_command(run_id)}")


def make_policy(
    approve: bool | None, replies: list[str], end: bool, interactive: bool | None, term: Terminal
) -> AnswerPolicy:
    tty = stdin_is_tty() if interactive is None else interactive
    if tty and term.live:
        enable_line_editing()
    approvals = "ask" if approve is None else ("approve" if approve else "reject")
    return AnswerPolicy(
        interactive=tty,
        approvals=approvals,
        replies=list(replies),
        end_when_out_of_replies=end,
        term=term,
    )


def terminals(json_mode: bool) -> tuple[Terminal, Terminal]:
    """Where the run is shown, and where prompts and answers go: with ``--json`` stdout carries
    only JSON, so the conversation with the user moves to stderr; so it does when stdout goes
    to a file or a pipe while a person types at the terminal (``demo > log``): the questions
    went into the file, and a blind ``y`` approved a refund no one had seen."""
    shown = Terminal()
    if json_mode or (stdin_is_tty() and not sys.stdout.isatty() and sys.stderr.isatty()):
        return shown, Terminal(sys.stderr)
    return shown, shown
