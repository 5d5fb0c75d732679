"""A real ``workflow-engine serve`` process and a streaming AG-UI client for end-to-end tests.

``Server`` starts the command line on a free loopback port (waiting for ``/health``) and stops
it with terminate-then-kill. ``Client.post`` POSTs a ``RunAgentInput`` and reads the
Server-Sent-Events stream (keeping its bytes, ``Stream.raw``, for external validators); every
event is validated against the ag-ui-protocol models and the whole stream against AG-UI's
sequence rules (``check_sequence``), each stream on its own: a resumed run's stream must make
sense to a client that never saw the earlier ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from ag_ui.core import BaseEvent, Event, EventType
from pydantic import TypeAdapter

ROOT = Path(__file__).resolve().parents[2]
EVENT = TypeAdapter(Event)
START_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0
# Variables that would change what the demo server does (a real model, a token, another db).
SCRUBBED_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "WORKFLOW_ENGINE_TOKEN",
    "WORKFLOW_ENGINE_DB",
    "WORKFLOW_ENGINE_DEMO_LEDGER",
)


def cli() -> list[str]:
    """The installed ``workflow-engine`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("workflow-engine")
    if script.exists():
        return [str(script)]
    found = shutil.which("workflow-engine")
    assert found, "the workflow-engine console script is not installed"
    return [found]


def server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env["COLUMNS"] = "200"  # keep rich from wrapping messages we assert on
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """``workflow-engine serve --port <free> --db <db> [args...]`` as a subprocess."""

    db: Path
    log: Path
    args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        for _ in range(3):  # another process may grab the free port between probe and bind
            self.port = free_port()
            command = [*cli(), "serve", "--port", str(self.port), "--db", str(self.db)]
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    [*command, *self.args],
                    cwd=ROOT,
                    env=server_env(**self.env),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_healthy():
                return self
            self.stop()
        raise AssertionError(f"server did not start; log:\n{self.log.read_text()}")

    def _wait_healthy(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the client ---------------------------------------------------------------------------------


@dataclass
class Stream:
    """One POST's answer: the HTTP status and, for a stream, its validated events."""

    status: int
    headers: httpx.Headers
    events: list[BaseEvent]
    body: Any = None  # the JSON body of a non-stream answer
    raw: bytes = b""  # the stream as it came, keep-alive comments and all

    def of(self, kind: EventType) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    @property
    def last(self) -> Any:
        return self.events[-1]

    def custom(self, name: str) -> list[Any]:
        return [e for e in self.of(EventType.CUSTOM) if e.name == name]

    def text(self) -> str:
        return "".join(e.delta for e in self.of(EventType.TEXT_MESSAGE_CONTENT))

    def tool_names(self) -> list[str]:
        return [e.tool_call_name for e in self.of(EventType.TOOL_CALL_START)]

    def results(self) -> dict[str, str]:
        """tool call id -> content of its TOOL_CALL_RESULT."""
        return {e.tool_call_id: e.content for e in self.of(EventType.TOOL_CALL_RESULT)}

    @property
    def interrupts(self) -> list[Any]:
        outcome = self.finished.outcome
        assert outcome is not None and outcome.type == "interrupt", self.describe()
        return list(outcome.interrupts)

    @property
    def finished(self) -> Any:
        assert self.last.type == EventType.RUN_FINISHED, self.describe()
        return self.last

    @property
    def error_code(self) -> str | None:
        assert self.last.type == EventType.RUN_ERROR, self.describe()
        return self.last.code

    def describe(self) -> str:
        if not self.events:
            return f"HTTP {self.status}: {self.body!r}"
        return "\n".join(e.model_dump_json(by_alias=True)[:300] for e in self.events)


# What str.splitlines (and so httpx's line reader, among others) ends a line at, beyond CR/LF.
OTHER_LINE_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def sse_lines(raw: bytes) -> list[str]:
    """The lines of an SSE body: UTF-8, ended by CRLF, LF or CR. The body must hold no other
    character a line reader might end a line at, so that every client splits it as SSE does."""
    text = raw.decode("utf-8")
    found = OTHER_LINE_BREAKS.search(text)
    assert found is None, f"unescaped line break {found and found.group()!r} in the stream"
    return re.split(r"\r\n|\r|\n", text)


def parse_sse(lines: Iterator[str]) -> Iterator[str]:
    """The ``data`` of each SSE event; comments (``:`` lines, e.g. keep-alives) are ignored."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith(":"):
            continue
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        else:
            name = line.split(":", 1)[0]
            assert name in ("event", "id", "retry"), f"not an SSE line: {line!r}"
    if data:
        yield "\n".join(data)


@dataclass
class Client:
    base_url: str
    token: str | None = None

    def headers(self, **extra: str) -> dict[str, str]:
        headers = {"accept": "text/event-stream"}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token}"
        headers.update(extra)
        return headers

    def post(
        self,
        path: str,
        body: dict[str, Any] | bytes,
        *,
        headers: dict[str, str] | None = None,
        check: bool = True,
    ) -> Stream:
        """POST ``body`` and read the answer; a stream is validated event by event."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        request_headers = headers if headers is not None else self.headers()
        request_headers = {"content-type": "application/json", **request_headers}
        with (
            httpx.Client(base_url=self.base_url, timeout=30.0) as http,
            http.stream("POST", path, content=content, headers=request_headers) as response,
        ):
            if response.status_code != 200:
                response.read()
                try:
                    payload = response.json()
                except ValueError:
                    payload = response.text
                return Stream(response.status_code, response.headers, [], payload)
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = response.read()
        events = [EVENT.validate_json(d) for d in parse_sse(iter(sse_lines(raw)))]
        stream = Stream(200, response.headers, events, raw=raw)
        if check:
            check_sequence(stream.events)
            if isinstance(body, dict):
                first, last = stream.events[0], stream.events[-1]
                assert (first.thread_id, first.run_id) == (body["threadId"], body["runId"])
                if last.type == EventType.RUN_FINISHED:
                    assert (last.thread_id, last.run_id) == (body["threadId"], body["runId"])
        return stream

    def start(self, path: str, thread_id: str, text: str, **extra: Any) -> Stream:
        """A new user message on ``thread_id``."""
        return self.post(path, run_input(thread_id, [user(text)], **extra))

    def resume(self, path: str, thread_id: str, resume: Any, **extra: Any) -> Stream:
        return self.post(path, run_input(thread_id, [], resume=resume, **extra))

    def resume_forwarded(
        self, path: str, thread_id: str, resume: Any, messages: list[dict[str, Any]] | None = None
    ) -> Stream:
        """Resume the way CopilotKit-style clients do: in ``forwardedProps.command.resume``,
        often with the thread's messages again."""
        props = {"command": {"resume": resume}}
        return self.post(path, run_input(thread_id, messages or [], forwardedProps=props))


def user(text: str) -> dict[str, str]:
    return {"id": f"msg-{uuid.uuid4().hex[:8]}", "role": "user", "content": text}


def run_input(thread_id: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "threadId": thread_id,
        "runId": f"run-{uuid.uuid4().hex[:8]}",
        "messages": messages,
        **extra,
    }


def resolved(interrupt_id: str, payload: Any) -> list[dict[str, Any]]:
    """The list form of ``resume``."""
    return [{"interruptId": interrupt_id, "status": "resolved", "payload": payload}]


# --- AG-UI's sequence rules ---------------------------------------------------------------------


def check_sequence(events: Sequence[BaseEvent]) -> None:
    """AG-UI's sequence rules, within this one stream: RUN_STARTED first and RUN_FINISHED /
    RUN_ERROR last; every message, tool call and step opened before use and closed before the
    run ends, none opened twice; a tool call's arguments JSON; a TOOL_CALL_RESULT only for a
    call this stream started and ended; a ``parentMessageId`` only for a message it sent."""

    def where(i: int) -> str:
        return f"event {i} ({events[i].type.value}) in:\n" + "\n".join(
            f"{n:3} {e.model_dump_json(by_alias=True)[:200]}" for n, e in enumerate(events)
        )

    assert events, "empty stream"
    assert events[0].type == EventType.RUN_STARTED, where(0)
    open_text: set[str] = set()
    seen_text: set[str] = set()
    open_calls: set[str] = set()
    arguments: dict[str, str] = {}  # tool call id -> its ARGS so far
    open_steps: Counter[str] = Counter()
    ended = False
    for i, e in enumerate(events):
        assert not ended, f"event after the run ended: {where(i)}"
        t: Any = e
        match e.type:
            case EventType.RUN_STARTED:
                assert i == 0, where(i)
            case EventType.TEXT_MESSAGE_START:
                assert t.message_id not in seen_text, f"message restarted: {where(i)}"
                seen_text.add(t.message_id)
                open_text.add(t.message_id)
            case EventType.TEXT_MESSAGE_CONTENT:
                assert t.message_id in open_text, f"content outside its message: {where(i)}"
                assert t.delta, f"empty content: {where(i)}"
            case EventType.TEXT_MESSAGE_END:
                assert t.message_id in open_text, f"end of a message not open: {where(i)}"
                open_text.discard(t.message_id)
            case EventType.TOOL_CALL_START:
                assert t.tool_call_id not in arguments, f"tool call restarted: {where(i)}"
                parent = t.parent_message_id
                assert parent is None or parent in seen_text, f"unknown parent: {where(i)}"
                arguments[t.tool_call_id] = ""
                open_calls.add(t.tool_call_id)
            case EventType.TOOL_CALL_ARGS:
                assert t.tool_call_id in open_calls, f"args outside their call: {where(i)}"
                arguments[t.tool_call_id] += t.delta
            case EventType.TOOL_CALL_END:
                assert t.tool_call_id in open_calls, f"end of a call not open: {where(i)}"
                open_calls.discard(t.tool_call_id)
                if arguments[t.tool_call_id]:
                    json.loads(arguments[t.tool_call_id])  # ValueError: not JSON
            case EventType.TOOL_CALL_RESULT:
                assert t.tool_call_id in arguments, f"result of a call not started: {where(i)}"
                assert t.tool_call_id not in open_calls, f"result of an open call: {where(i)}"
            case EventType.STEP_STARTED:
                open_steps[t.step_name] += 1
            case EventType.STEP_FINISHED:
                assert open_steps[t.step_name] > 0, f"finished a step not open: {where(i)}"
                open_steps[t.step_name] -= 1
            case EventType.RUN_FINISHED | EventType.RUN_ERROR:
                assert not open_text, f"messages left open {open_text}: {where(i)}"
                assert not open_calls, f"tool calls left open {open_calls}: {where(i)}"
                assert not +open_steps, f"steps left open {dict(+open_steps)}: {where(i)}"
                ended = True
    assert ended, f"the stream ended without RUN_FINISHED or RUN_ERROR: {where(len(events) - 1)}"


@contextmanager
def in_process(app: Any) -> Iterator[int]:
    """``app`` served by a real uvicorn server on a free loopback port, in a thread of this
    process (an application mounting the endpoint, as users do); the port."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started, "the in-process server did not start"
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
