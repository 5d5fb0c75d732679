"""OpenAIChatClient against a real HTTP server on loopback that speaks chat completions."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.integration.fake_openai import FakeOpenAIServer, refusals, sse_chunk
from workflow_engine import DefinitionError, WorkflowBuilder, WorkflowRunState
from workflow_engine.executors import (
    Agent,
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    HandoffBuilder,
    MessageCountingChatReducer,
    OpenAIChatClient,
    tool,
)

pytestmark = pytest.mark.anyio


@tool(approval_mode="always_require")
def submit_refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} for {order_id}"


async def test_plain_and_streaming_responses_with_tool_calls() -> None:
    with FakeOpenAIServer() as server:
        client = OpenAIChatClient("test-model", base_url=server.base_url, api_key="k")
        reply = await client.get_response(
            [ChatMessage.user("refund order 42 for 10")], tools=[submit_refund.spec]
        )
        (call,) = reply.message.function_calls
        assert call.name == "submit_refund" and call.arguments == {
            "order_id": "42",
            "amount": "10",
        }
        updates = [
            u
            async for u in client.get_streaming_response(
                [ChatMessage.user("refund order 7 for 3")], tools=[submit_refund.spec]
            )
        ]
        assert {u.kind for u in updates} == {"function_call"}
        assert len(updates) == 3  # name, then the arguments in two deltas
        sent = server.requests[0]
        assert sent["model"] == "test-model"
        assert sent["tools"][0]["function"]["parameters"]["required"] == ["order_id", "amount"]


async def test_agent_in_a_workflow_over_http_with_approval() -> None:
    with FakeOpenAIServer() as server:
        client = OpenAIChatClient("m", base_url=server.base_url, api_key="k")
        agent = Agent("refunds", "You refund orders.", client, [submit_refund])
        wf = WorkflowBuilder(name="refunds", start=agent).build()
        paused = await wf.run("refund order 42 for 10")
        assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        (request,) = paused.pending_requests
        assert request.data.function_call.arguments == {"order_id": "42", "amount": "10"}
        done = await wf.run(
            checkpoint=paused.checkpoint, responses={request.request_id: {"approved": True}}
        )
        assert done.outputs[0].text == "The tool said: refunded 10.0 for 42"
        wire = server.requests[-1]["messages"]
        assert [m["role"] for m in wire] == ["system", "user", "assistant", "tool"]
        assert wire[2]["tool_calls"][0]["function"]["name"] == "submit_refund"
        assert wire[3]["tool_call_id"] == wire[2]["tool_calls"][0]["id"]


class BreaksOffMidReply(ThreadingHTTPServer):
    """An endpoint that streams the start of a reply, then drops the connection: a body said
    to be longer than what came, or (``framed=False``) one whose end is the connection's, as
    HTTP allows -- the stream then just ends, with no chunk saying the reply finished."""

    def __init__(self, framed: bool = True) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                if framed:
                    self.send_header("content-length", "100000")  # more than will come
                else:
                    self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(sse_chunk({"content": "Let me"}))
                self.wfile.flush()
                self.close_connection = True

        super().__init__(("127.0.0.1", 0), Handler)

    def __enter__(self) -> BreaksOffMidReply:
        threading.Thread(target=self.serve_forever, args=(0.01,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


@pytest.mark.parametrize("framed", [True, False])
async def test_a_reply_broken_off_mid_stream_names_the_endpoint_and_model(framed: bool) -> None:
    """It said only "Connection error." (outside tester 63): not which endpoint nor model. A
    stream whose end is the connection's was taken for the whole reply: the half reply was
    stored and the run went on (outside tester 177)."""
    with BreaksOffMidReply(framed) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        client = OpenAIChatClient("m", base_url=url, api_key="k")
        with pytest.raises(ConnectionError) as broke:
            async for _ in client.get_streaming_response([ChatMessage(role="user", text="hi")]):
                pass
    said = str(broke.value)
    assert f"{url}/ (model 'm') broke off its reply mid-stream" in said, said


@tool(name="look up.order")  # (a name a model's API refuses: a space and a dot)
def look_up_order(order_id: str, pair: tuple[int, str] | None = None, none: tuple[()] = ()) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


async def test_what_a_model_s_api_refuses_is_never_sent() -> None:
    """A strict fake of OpenAI's API (400 for what it refuses) was sent: a model's empty reply
    back as an assistant message with neither text nor calls (every later turn failed, for
    good), a tool named as no API takes (``handoff_to_Refund Agent``, ``<lambda>``), a tuple's
    schema without ``items``, and the long call ids of a client's history (outside testers 157
    and 158). Each is sent as the API takes it, and the model's calls come back under the
    tool's own name."""
    with FakeOpenAIServer() as server:
        client = OpenAIChatClient("m", base_url=server.base_url, api_key="k")
        agent = Agent("desk", "You look orders up.", client, [look_up_order])
        done = await WorkflowBuilder(name="desk", start=agent).build().run("where is 42")
        assert done.status is WorkflowRunState.IDLE, done
        assert done.outputs[0].text.startswith("The tool said: "), done.outputs
        [offered] = server.requests[0]["tools"]
        assert offered["function"]["name"].startswith("look_up_order_"), offered
        long_id = "support:a-thread-id-as-long-as-a-uuid-4b1e/0:call_1"
        call = FunctionCallContent(call_id=long_id, name="look up.order", arguments={})
        result = FunctionResultContent(call_id=long_id, name="look up.order", result="shipped")
        history = [
            ChatMessage.user("hello"),
            ChatMessage(role="assistant", contents=[]),  # (a model's empty reply)
            ChatMessage.user("where is 7"),
            ChatMessage(role="assistant", contents=[call]),
            ChatMessage(role="tool", contents=[result]),
        ]
        reply = await client.get_response(history, tools=[look_up_order.spec])
        assert reply.message.text == "The tool said: shipped", reply
    for sent in server.requests:  # (the fake answered 400 to anything it refuses)
        assert refusals(sent) == [], refusals(sent)


NOT_AN_OBJECT = ["{bad", "[1, 2]", '"text"', "null"]
NOT_KEPT = ['{"order_id": NaN}', '{"order_id": 1e999}', '{"order_id": "\\ud800"}']


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


@pytest.mark.parametrize("raw", NOT_AN_OBJECT + NOT_KEPT)
async def test_arguments_that_are_not_a_json_object_are_said_so_to_the_model(raw: str) -> None:
    """A model's call whose arguments were not a JSON object got "order_id: Field required;
    __unparsed__: Extra inputs are not permitted" as its result (outside tester 158), and a
    list or a string without streaming was a validation error of the client itself. The model
    is told they are not a JSON object, quoting them."""
    with FakeOpenAIServer() as server:
        client = OpenAIChatClient("m", base_url=server.base_url, api_key="k")
        agent = Agent("desk", "You look orders up.", client, [look_up_order])
        done = await WorkflowBuilder(name="desk", start=agent).build().run(f"look #args:{raw}")
        assert done.status is WorkflowRunState.IDLE, done
        [said] = [m for m in server.requests[-1]["messages"] if m["role"] == "tool"]
        assert "not a JSON object of arguments " in said["content"]
        assert "__unparsed__" not in said["content"]
        assert repr(raw) in said["content"], said
        # what is sent back is JSON: no NaN nor Infinity (they reached the model at every
        # later turn), and a lone surrogate no longer fails the run (outside tester 159)
        [sent] = [m for m in server.requests[-1]["messages"] if m.get("tool_calls")]
        arguments = sent["tool_calls"][0]["function"]["arguments"]
        assert isinstance(json.loads(arguments, parse_constant=_no_constant), dict), arguments
        assert "Infinity" not in arguments, arguments


async def test_a_call_id_a_model_used_before_is_not_used_again() -> None:
    """A server that numbers its calls from 0 in each reply gave a new call the id of one
    before it: the AG-UI stream sent the two as one call, its arguments run together, and a
    client's history could not be sent back (outside tester 159). A call id is unique in its
    conversation."""
    call = FunctionCallContent(call_id="call_1", name="look up.order", arguments={})
    result = FunctionResultContent(call_id="call_1", name="look up.order", result="shipped")
    history = [
        ChatMessage.user("where is 42"),
        ChatMessage(role="assistant", contents=[call]),
        ChatMessage(role="tool", contents=[result]),
        ChatMessage.user("and 7? #id:call_1"),
    ]
    with FakeOpenAIServer() as server:
        client = OpenAIChatClient("m", base_url=server.base_url, api_key="k")
        reply = await client.get_response(history, tools=[look_up_order.spec])
        streamed = [
            u async for u in client.get_streaming_response(history, tools=[look_up_order.spec])
        ]
    [again] = reply.message.function_calls
    assert again.call_id != "call_1", again
    assert {u.call_id for u in streamed if u.call_id} - {"call_1"}, streamed
    assert "call_1" not in {u.call_id for u in streamed}, streamed


async def test_a_call_a_reviewer_edited_reaches_the_model_as_it_ran() -> None:
    """The model was sent the call it proposed beside the result of the edited one: it read
    "refunded 4.0" as the outcome of its call for 10 (outside tester 158)."""
    with FakeOpenAIServer() as server:
        client = OpenAIChatClient("m", base_url=server.base_url, api_key="k")
        agent = Agent("refunds", "You refund orders.", client, [submit_refund])
        wf = WorkflowBuilder(name="refunds", start=agent).build()
        paused = await wf.run("refund order 42 for 10")
        (request,) = paused.pending_requests
        done = await wf.run(
            checkpoint=paused.checkpoint,
            responses={request.request_id: {"approved": True, "arguments": {"amount": 4}}},
        )
        assert done.outputs[0].text.endswith("refunded 4.0 for 42")  # (the fake echoes it)
        wire = server.requests[-1]["messages"]
        assert [m["role"] for m in wire] == ["system", "user", "assistant", "tool"]
        sent = json.loads(wire[2]["tool_calls"][0]["function"]["arguments"])
        assert sent == {"order_id": "42", "amount": 4}
        said = wire[3]["content"]
        assert said.endswith("refunded 4.0 for 42")
        assert "reviewer" in said and '"amount": "10"' in said  # what it proposed, changed
        # a rejected call and an approval without edits are sent as proposed
        paused = await wf.run("refund order 7 for 3")
        (request,) = paused.pending_requests
        await wf.run(
            checkpoint=paused.checkpoint, responses={request.request_id: {"approved": False}}
        )
        wire = server.requests[-1]["messages"]
        sent = json.loads(wire[2]["tool_calls"][0]["function"]["arguments"])
        assert sent == {"order_id": "7", "amount": "3"}
        assert "reviewer" not in wire[3]["content"]


@tool
def refund_now(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} for {order_id}"


async def test_a_long_conversation_reaches_the_model_as_its_reducer_picks_it() -> None:
    """A thread grows past a model's context window; with a reducer the model is sent the
    newest messages, never a tool result without its call (the fake refuses one, as OpenAI
    does)."""
    with FakeOpenAIServer() as server:
        client = OpenAIChatClient("m", base_url=server.base_url, api_key="k")
        reducer = MessageCountingChatReducer(3)
        agent = Agent("refunds", "You refund orders.", client, [refund_now], chat_reducer=reducer)
        conversation: list[ChatMessage] = []
        for n in range(1, 8):
            conversation.append(ChatMessage.user(f"refund order {n} for {n}"))
            conversation += (await agent.run(conversation)).messages
        assert len(conversation) == 7 * 4  # user, call, result, reply
        assert len(server.requests) == 7 * 2
        for i, body in enumerate(server.requests):
            wire = body["messages"]
            assert wire[0] == {"role": "system", "content": "You refund orders."}
            assert (3 if i > 1 else 1) <= len(wire) - 1 <= 4, wire
        last = server.requests[-1]["messages"]
        assert [m["role"] for m in last] == ["system", "user", "assistant", "tool"]
        assert last[1]["content"] == "refund order 7 for 7"


def test_an_agent_with_more_tools_than_the_api_takes_is_refused_when_defined() -> None:
    """OpenAI's API refuses a request offering more than 128 tools: such an agent failed at
    every turn (outside tester 159)."""

    def numbered(n: int) -> Any:
        def look(order_id: str) -> str:
            return order_id

        return tool(name=f"look_{n}")(look)

    client = OpenAIChatClient("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    tools = [numbered(n) for n in range(128)]
    Agent("many", "", client, tools)  # (128: the most it takes)
    with pytest.raises(DefinitionError, match="more than 128 tools"):
        Agent("too_many", "", client, [*tools, numbered(128)])
    full, other = Agent("full", "", client, tools), Agent("b", "", client)
    with pytest.raises(DefinitionError, match="a handoff's routes count as tools too"):
        HandoffBuilder(name="h", participants=[full, other]).add_handoff(full, [other]).build()
