"""A tiny OpenAI-compatible chat-completions server on 127.0.0.1, for testing OpenAIChatClient.

It speaks the real wire format (JSON and server-sent-event streaming, with tool calls): when the
newest message is the user's and tools are offered, it calls the first tool with the digits it
finds; after a tool result it answers with text quoting the result.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    last = messages[-1]
    tools = body.get("tools") or []
    if last["role"] == "tool":
        return {"content": f"The tool said: {last['content']}", "tool_calls": None}
    if tools:
        said = last.get("content") or ""
        digits = re.findall(r"\d+", said)
        tool = tools[0]["function"]
        props = list(tool["parameters"].get("properties", {}))
        arguments = {p: (digits[i] if i < len(digits) else "x") for i, p in enumerate(props)}
        # "... #args:<text>": the call's arguments as that text, JSON or not (a model's slip)
        raw = said.split("#args:", 1)[1] if "#args:" in said else json.dumps(arguments)
        # "... #id:<id>": the call's id (a server numbering its calls from 0 in each reply)
        named = re.search(r"#id:(\S+)", said)
        return {
            "content": None,
            "tool_calls": [
                {
                    "id": named[1] if named else f"call_{len(messages)}",
                    "type": "function",
                    "function": {"name": tool["name"], "arguments": raw},
                }
            ],
        }
    return {"content": f"echo: {last.get('content')}", "tool_calls": None}


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")


def refusals(body: dict[str, Any]) -> list[str]:
    """What OpenAI's API refuses in a request (HTTP 400), of what the engine could send: a tool
    name or call id it does not take, an assistant message with neither text nor calls, a
    tool result that answers no call of the assistant message before it, an array schema with
    ``prefixItems`` and no ``items``."""
    said: list[str] = []
    for tool in body.get("tools") or []:
        name = tool["function"]["name"]
        if not _NAME.fullmatch(name):
            said.append(f"tools: name {name!r} does not match '^[a-zA-Z0-9_-]{{1,64}}$'")
        said += [f"tools: {name}: {x}" for x in _schema_refusals(tool["function"]["parameters"])]
    open_calls: set[str] = set()
    for i, message in enumerate(body["messages"]):
        if message["role"] == "assistant":
            calls = message.get("tool_calls") or []
            if not message.get("content") and not calls:
                said.append(f"messages[{i}]: assistant message with neither content nor tool_calls")
            for call in calls:
                if not _CALL_ID.fullmatch(call["id"]):
                    said.append(f"messages[{i}]: tool call id {call['id']!r} is not a valid id")
                if not _NAME.fullmatch(call["function"]["name"]):
                    said.append(f"messages[{i}]: tool call name {call['function']['name']!r}")
            open_calls = {call["id"] for call in calls}
        elif message["role"] == "tool" and message["tool_call_id"] not in open_calls:
            said.append(f"messages[{i}]: tool message answers no preceding tool call")
    return said


def _schema_refusals(schema: Any) -> list[str]:
    if isinstance(schema, list):
        return [x for item in schema for x in _schema_refusals(item)]
    if not isinstance(schema, dict):
        return []
    said = [x for value in schema.values() for x in _schema_refusals(value)]
    if ("prefixItems" in schema or schema.get("type") == "array") and "items" not in schema:
        said.append("array schema missing items")
    return said


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAIServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length))
        self.server.requests.append(body)
        refused = refusals(body)
        if refused:  # (as OpenAI's API answers: 400, its error's shape)
            error = {"message": "; ".join(refused), "type": "invalid_request_error"}
            self._send_json(400, {"error": error})
            return
        reply = _reply(body)
        completion_id = f"chatcmpl-{len(self.server.requests)}"
        if not body.get("stream"):
            payload = {
                "id": completion_id,
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", **reply},
                        "finish_reason": "tool_calls" if reply["tool_calls"] else "stop",
                    }
                ],
            }
            self._send_json(200, payload)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
            self.wfile.write(sse_chunk(delta, finish, model=body["model"], id=completion_id))

        chunk({"role": "assistant"})
        if reply["content"]:
            for word in re.findall(r"\S+\s*", reply["content"]):
                chunk({"content": word})
        for index, call in enumerate(reply["tool_calls"] or []):
            arguments = call["function"]["arguments"]
            head = {"index": index, "id": call["id"], "type": "function"}
            chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"]}}]})
            half = len(arguments) // 2
            for part in (arguments[:half], arguments[half:]):
                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
        chunk({}, "tool_calls" if reply["tool_calls"] else "stop")
        self.wfile.write(b"data: [DONE]\n\n")


def sse_chunk(
    delta: dict[str, Any], finish: str | None = None, *, model: str = "m", id: str = "c1"
) -> bytes:
    """One ``chat.completion.chunk`` server-sent event of a streamed reply, as the wire has
    it (for the fake endpoints of the tests)."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    event = {"id": id, "object": "chat.completion.chunk", "created": 0, "model": model}
    return f"data: {json.dumps({**event, 'choices': [choice]})}\n\n".encode()


class FakeOpenAIServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        # polled every 10 ms: shutdown() waits for the next poll (0.5 s by default, per test)
        self._thread = threading.Thread(target=self.serve_forever, args=(0.01,), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
