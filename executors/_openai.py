"""OpenAIChatClient: any OpenAI-compatible chat-completions endpoint.

Works with OpenAI, Azure OpenAI (its v1 endpoint), Ollama, vLLM and llama.cpp's server through the
``openai`` package (``pip install 'workflow-engine[openai]'``). Configure by arguments or by
``OPENAI_API_KEY``, ``OPENAI_BASE_URL`` and ``OPENAI_MODEL``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from workflow_engine._redaction import without_credentials

from ._clients import ChatResponse, ChatResponseUpdate
from ._content import (
    ChatMessage,
    FunctionCallContent,
    TextContent,
    approval_id,
    edited_arguments,
    model_call_id,
)
from ._tools import ToolSpec, call_arguments

DEFAULT_MODEL = "gpt-4o-mini"


class OpenAIChatClient:
    """A :class:`~executors.ChatClient` over the chat-completions wire format."""

    max_tools = 128
    """The most tools one request may offer (OpenAI's API refuses more): an agent with more is
    refused when it is defined, not at each of its turns."""

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        temperature: float | None = None,
        client: Any = None,
        timeout: float = 60.0,
    ) -> None:
        self.model = model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
        self.temperature = temperature
        if client is None:
            try:
                from openai import AsyncOpenAI
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ImportError(
                    "OpenAIChatClient needs the 'openai' package: "
                    "pip install 'workflow-engine[openai]'"
                ) from exc
            client = AsyncOpenAI(
                api_key=api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
                base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
                timeout=timeout,
            )
        self._client = client

    # --- wire format ----------------------------------------------------------------------------

    @staticmethod
    def to_wire(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        """Our messages as chat-completions messages (approval bookkeeping is not sent). Names
        and ids are sent as the API takes them (``wire_name``, ``model_call_id``); an assistant
        message that said nothing -- a model's empty reply -- is not sent: the API refuses one
        with neither text nor calls, and the conversation failed at every later turn. A call
        a reviewer edited is sent as it ran, its result saying what the model had proposed."""
        wire: list[dict[str, Any]] = []
        sent_calls: dict[str, tuple[FunctionCallContent, dict[str, Any]]] = {}  # by approval id
        proposed: dict[str, dict[str, Any]] = {}  # call id -> its arguments, a reviewer's edit
        for m in messages:
            if m.role == "tool" or m.function_results:
                for r in m.function_results:
                    call_id = model_call_id(r.call_id)
                    content = r.text
                    if r.call_id in proposed:
                        content = _EDITED.format(json.dumps(proposed[r.call_id])) + content
                    wire.append({"role": "tool", "tool_call_id": call_id, "content": content})
                continue
            if m.approval_requests or m.approval_responses:
                for answer in m.approval_responses:
                    # the call as it ran, not as proposed: the model read the result of the
                    # edited call as its own call's (outside tester 158)
                    was = sent_calls.get(answer.id or "")
                    if was is not None and answer.approved and answer.arguments:
                        call, sent_call = was
                        ran = edited_arguments(call, answer)
                        if ran != call.arguments:
                            sent_call["function"]["arguments"] = json.dumps(ran)
                            proposed[call.call_id] = call.arguments
                continue
            if m.role == "assistant":
                if not m.text and not m.function_calls:
                    continue
                entry: dict[str, Any] = {"role": "assistant", "content": m.text or None}
                if m.function_calls:
                    entry["tool_calls"] = calls = []
                    for c in m.function_calls:
                        sent: dict[str, Any] = {
                            "id": model_call_id(c.call_id),
                            "type": "function",
                            "function": {
                                "name": wire_name(c.name),
                                "arguments": json.dumps(c.arguments),
                            },
                        }
                        calls.append(sent)
                        sent_calls[approval_id(c.call_id)] = (c, sent)
                wire.append(entry)
            else:
                wire.append({"role": m.role, "content": m.text})
        return wire

    @staticmethod
    def tools_to_wire(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": wire_name(t.name),
                    "description": t.description,
                    "parameters": wire_schema(t.parameters),
                },
            }
            for t in tools
        ]

    def _request(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": self.to_wire(messages)}
        if tools:
            body["tools"] = self.tools_to_wire(tools)
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    # --- the protocol ---------------------------------------------------------------------------

    async def _create(self, body: dict[str, Any]) -> Any:
        """One chat-completions call; an unreachable endpoint is named in the error."""
        try:
            return await self._client.chat.completions.create(**body)
        except Exception as exc:
            if type(exc).__name__ not in ("APIConnectionError", "APITimeoutError"):
                raise
            raise ConnectionError(f"cannot reach {self._where()}: {exc}") from exc

    def _where(self) -> str:
        """The endpoint and model, as errors name them: the endpoint without a user, password,
        query string or fragment written into it (``OPENAI_BASE_URL``) -- errors are stored
        with the run and told to AG-UI clients (a password holding ``'`` reached them all:
        outside tester 200)."""
        endpoint = getattr(self._client, "base_url", None)
        if not endpoint:
            return f"the model endpoint (model {self.model!r})"
        return f"{without_credentials(str(endpoint))} (model {self.model!r})"

    async def _named_breaks(self, stream: Any) -> AsyncIterator[Any]:
        """The chunks of a streamed reply; a connection that breaks off mid-reply is named in
        the error, as an unreachable one is (it said only "Connection error.")."""
        chunks = aiter(stream)
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except Exception as exc:
                name = type(exc).__name__
                if name not in ("APIConnectionError", "APITimeoutError", "RemoteProtocolError"):
                    raise
                raise ConnectionError(
                    f"{self._where()} broke off its reply mid-stream: {exc}"
                ) from exc
            yield chunk

    async def get_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> ChatResponse:
        completion = await self._create(self._request(messages, tools))
        named = _named_back(tools)
        choice = completion.choices[0].message
        contents: list[Any] = []
        if choice.content:
            contents.append(TextContent(text=choice.content))
        used = _ids_in(messages)
        for index, call in enumerate(choice.tool_calls or []):
            arguments = call_arguments(call.function.arguments)
            call_id = _unique_call_id(call.id, index, used)
            name = named.get(call.function.name, call.function.name)
            contents.append(FunctionCallContent(call_id=call_id, name=name, arguments=arguments))
        message = ChatMessage(role="assistant", contents=contents, message_id=completion.id)
        return ChatResponse(messages=[message])

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[ChatResponseUpdate]:
        stream = await self._create({**self._request(messages, tools), "stream": True})
        named = _named_back(tools)
        call_ids: dict[int, str] = {}
        used = _ids_in(messages)
        finished = False
        async for chunk in self._named_breaks(stream):
            if not chunk.choices:
                continue
            finished = finished or chunk.choices[0].finish_reason is not None
            delta = chunk.choices[0].delta
            if delta.content:
                yield ChatResponseUpdate(kind="text", message_id=chunk.id or "", text=delta.content)
            for call in delta.tool_calls or []:
                call_id = call_ids.get(call.index)
                if call_id is None:
                    call_id = call_ids[call.index] = _unique_call_id(call.id, call.index, used)
                function = call.function
                yield ChatResponseUpdate(
                    kind="function_call",
                    message_id=chunk.id or "",
                    call_id=call_id,
                    name=named.get(function.name, function.name)
                    if function and function.name
                    else None,
                    arguments_delta=function.arguments if function and function.arguments else "",
                )
        if not finished:
            # a server that frames its stream by closing the connection, stopped mid-reply:
            # the stream just ended, and the half reply was kept as the model's whole one
            # (outside tester 177). OpenAI's API ends every reply with a chunk that says why
            # it ended; a server that never says so is told from one that stopped by nothing
            raise ConnectionError(
                f"{self._where()} broke off its reply mid-stream, or does not say when a reply "
                "ends: the stream ended with no chunk giving its finish_reason"
            )


_EDITED = "(A reviewer edited this call's arguments before it ran; you had proposed {}.)\n"
"""Said to the model before the result of a call that ran with a reviewer's edits (the call
itself is sent with the arguments it ran with)."""

_WIRE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A tool name OpenAI's API takes (and Anthropic's, Ollama's...)."""


def wire_name(name: str) -> str:
    """A tool's name as a model's API takes it: kept when it is one; otherwise each character
    it refuses as ``_``, shortened, with a digest of the whole name, so that two names never
    meet. An agent named "Refund Agent" gave the handoff tool ``handoff_to_Refund Agent``, a
    ``<lambda>`` or ``bestätigen`` was a tool's name: the API refused every turn of such a run
    (outside tester 158). The model's calls are read back under the tool's own name."""
    if _WIRE_NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:55] + "_" + digest


def wire_schema(schema: Any) -> Any:
    """A tool's parameters schema as the API takes it: an array schema with ``prefixItems``
    (a tuple) and no ``items`` was refused ("array schema missing items"); it gets ``items``
    allowing what its places allow (an empty tuple's: any, it holds none)."""
    if isinstance(schema, list):
        return [wire_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: wire_schema(value) for key, value in schema.items()}
    places = out.get("prefixItems")
    if isinstance(places, list) and places and "items" not in out:
        out["items"] = places[0] if len(places) == 1 else {"anyOf": places}
    elif out.get("type") == "array" and "items" not in out:  # (``tuple[()]``: no places)
        out["items"] = {}
    return out


def _named_back(tools: Sequence[ToolSpec]) -> dict[str, str]:
    """Each offered tool's wire name -> its own name (for the calls a model makes)."""
    return {wire_name(t.name): t.name for t in tools}


def _ids_in(messages: Sequence[ChatMessage]) -> set[str]:
    """The call ids the conversation holds: a model that numbers its calls from 0 in each reply
    gave a new call the id of an earlier one, and the AG-UI stream sent the two as one call
    (its arguments run together), which a client's history then could not send back (outside
    tester 159). A call id is unique in its conversation."""
    return {c.call_id for m in messages for c in m.function_calls}


def _unique_call_id(given: str | None, index: int, used: set[str]) -> str:
    """The model's call id if it gave a fresh one; otherwise a new unique one. Servers that
    omit ids (or repeat one within a reply) must not make two calls look like one; the reply is
    journaled, so a replay sees the same ids."""
    call_id = given or f"call_{uuid.uuid4().hex[:16]}"
    if call_id in used:
        call_id = f"{call_id}_{index}_{uuid.uuid4().hex[:8]}"
    used.add(call_id)
    return call_id
