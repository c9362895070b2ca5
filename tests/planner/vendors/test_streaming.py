"""Streamed turns: deltas accumulate into the committed item; live thinking goes out separately."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from planner.conversation.items import AssistantText, Reasoning, ToolCall, UserObservation
from planner.decision import Usage
from planner.errors import UnreadableAnswer
from planner.session.config import SessionConfig
from planner.session.planner import SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.vendors.anthropic.messages import AnthropicStreamAccumulator, items_from_message
from planner.vendors.base import TextInThinking, Turn
from planner.vendors.failures import StreamError
from planner.vendors.openai import OpenAIAdapter
from planner.vendors.openai.responses import ResponsesStreamAccumulator, items_from_response
from planner.vendors.streaming import IncompleteStream, event_dict, fetch_response
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    ScriptedTurn,
    function_call,
    message,
    reasoning,
    text,
)


def _anthropic_events() -> list[dict[str, Any]]:
    return [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": [],
                "usage": {"input_tokens": 5, "output_tokens": 1},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "The list "},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "shows Display."},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "SIG/part1+"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "part2=="},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "RED"},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "text_delta", "text": "Open it."},
        },
        {"type": "content_block_stop", "index": 2},
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "tap", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": '{"element_'},
        },
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": 'id": "e4"}'},
        },
        {"type": "content_block_stop", "index": 3},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 42},
        },
        {"type": "message_stop"},
    ]


def test_anthropic_deltas_accumulate_and_live_text_is_forwarded() -> None:
    live: list[str] = []
    acc = AnthropicStreamAccumulator(live.append)
    for event in _anthropic_events():
        acc.feed(event)
    message = acc.message()
    assert live == ["The list ", "shows Display."]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 5, "output_tokens": 42}
    items = items_from_message(message)
    assert items[0] == Reasoning(
        "anthropic", "msg_1", text="The list shows Display.", signature="SIG/part1+part2=="
    )
    assert items[1] == Reasoning("anthropic", "msg_1", redacted_data="RED")
    assert items[3] == ToolCall("anthropic", "msg_1", "toolu_1", "tap", {"element_id": "e4"})


def _blocks_streamed(blocks: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """A Messages stream of `blocks` ((type, text): thinking, redacted, text, server, tool), each
    readable block's text in two deltas."""
    events: list[dict[str, Any]] = [_anthropic_events()[0]]
    for i, (kind, said) in enumerate(blocks):
        if kind == "thinking":
            start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": part} for part in (said[:1], said[1:])]
            deltas.append({"type": "signature_delta", "signature": f"SIG{i}"})
        elif kind == "redacted":
            start, deltas = {"type": "redacted_thinking", "data": "RED"}, []
        elif kind == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": said}]
        elif kind == "server":  # a server tool's call: a block the planner does not read
            start = {"type": "server_tool_use", "id": f"srvtoolu_{i}", "name": "web_search"}
            start["input"] = {}
            deltas = [{"type": "input_json_delta", "partial_json": '{"query": "dark theme"}'}]
        else:
            start = {"type": "tool_use", "id": f"toolu_{i}", "name": "tap", "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": '{"element_id": "e4"}'}]
        events.append({"type": "content_block_start", "index": i, "content_block": start})
        events += [{"type": "content_block_delta", "index": i, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": i})
    events.append({"type": "message_delta", "delta": {"stop_reason": "end_turn"}})
    events.append({"type": "message_stop"})
    return events


@pytest.mark.parametrize("mode", ["none", "last", "all"])
@pytest.mark.parametrize(
    "blocks",
    [
        [("thinking", "Display holds it. "), ("thinking", "Opened; tap Display."), ("tool", "")],
        [("thinking", "Tap Display."), ("tool", "")],
        [("thinking", "a1 "), ("thinking", "b2 "), ("thinking", "Tap it."), ("tool", "")],
        [("redacted", ""), ("thinking", "Tap it."), ("tool", "")],
        [("thinking", "a1 "), ("thinking", "no call yet")],
        [("thinking", "a1 "), ("thinking", "b2 "), ("text", "Tap it."), ("tool", "")],
        [("thinking", "a1 "), ("thinking", "b2 "), ("tool", ""), ("text", "Tapped.")],
        [("thinking", "a1 "), ("thinking", "b2 "), ("tool", ""), ("thinking", "c3")],
        [("thinking", "a1 "), ("thinking", "Tap it."), ("server", ""), ("tool", "")],
        [("thinking", "a1 "), ("server", ""), ("thinking", "Tap it."), ("tool", "")],
        [("server", ""), ("thinking", "Tap it."), ("tool", "")],
    ],
)
def test_live_thinking_is_the_thinking_the_turn_records(
    blocks: list[tuple[str, str]], mode: TextInThinking
) -> None:
    """On the models that return the text they write before a call in a thinking block
    (Claude Opus/Sonnet 5.5), the live view showed that text as thinking, where the decision
    records it as the rationale (`Turn.said`): the live view is the recorded thinking, a
    blank line between two blocks."""
    live: list[str] = []
    acc = AnthropicStreamAccumulator(live.append, mode)
    for event in _blocks_streamed(blocks):
        acc.feed(event)
    message = acc.message()
    turn = Turn("msg_1", items_from_message(message), Usage(), "m", "end_turn")
    turn.text_in_thinking = mode
    assert "".join(live) == "\n\n".join(r.readable for r in turn.thought if r.readable)


def test_an_interrupted_anthropic_stream_commits_nothing() -> None:
    acc = AnthropicStreamAccumulator()
    for event in _anthropic_events()[:5]:  # thinking and its signature, but no block stop
        acc.feed(event)
    with pytest.raises(IncompleteStream):
        acc.message()


def test_responses_items_come_from_output_item_done() -> None:
    live: list[str] = []
    acc = ResponsesStreamAccumulator(live.append)
    done_item = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Plan: tap."}],
        "encrypted_content": "ENC-final",
    }
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "tap",
        "arguments": '{"x":1,"y":2}',
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1", "output": []}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**done_item, "encrypted_content": "ENC-partial"},
        },
        {"type": "response.reasoning_summary_text.delta", "delta": "Plan: "},
        {"type": "response.reasoning_summary_text.delta", "delta": "tap."},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.output_item.done", "output_index": 1, "item": call},
        {
            "type": "response.completed",
            "response": {"id": "resp_1", "model": "m", "output": [], "usage": {}},
        },
    ]
    for event in events:
        acc.feed(event)
    items = items_from_response(acc.response())
    assert live == ["Plan: ", "tap."]
    assert items[0] == Reasoning(
        "openai",
        "resp_1",
        encrypted_content="ENC-final",
        item_id="rs_1",
        summary=("Plan: tap.",),
        wire=done_item,
    )
    assert items[1] == ToolCall(
        "openai", "resp_1", "call_1", "tap", {"x": 1, "y": 2}, '{"x":1,"y":2}', "fc_1", call
    )

    cut = ResponsesStreamAccumulator()
    for event in events[:5]:
        cut.feed(event)
    with pytest.raises(IncompleteStream):
        cut.response()


@pytest.mark.parametrize(
    "event",
    [
        {"type": "error", "sequence_number": 2, "code": "rate_limit_exceeded", "message": "slow"},
        {
            "type": "error",
            "sequence_number": 2,
            "error": {"type": "tokens", "code": "rate_limit_exceeded", "message": "slow"},
        },
    ],
    ids=["flat", "nested"],
)
def test_responses_error_event_is_read_flat_or_nested(event: dict[str, Any]) -> None:
    """A proxy may pass the live API's nested error event through to the accumulator."""
    acc = ResponsesStreamAccumulator()
    with pytest.raises(StreamError) as info:
        acc.feed(event)
    assert info.value.code == "rate_limit_exceeded"
    assert "slow" in str(info.value)


class _Unreadable(Exception):
    """What the test's accumulator raises on the first event it is fed."""


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_stream_the_accumulator_cannot_read_is_closed(
    fake_server: FakeModelServer, vendor: str
) -> None:
    """A stream left because its first event could not be read (`feed` raised) was never
    closed: its HTTP response stayed open, half read, holding a connection of the client's
    pool until the stream was collected. Real SDKs against the fake server; the stream the
    SDK returned is checked after the call failed."""
    opened: list[Any] = []
    if vendor == "anthropic":
        fake_server.script_anthropic(ScriptedTurn([text("Opening Display.")]))
        client: Any = anthropic.AsyncAnthropic(
            api_key=ANTHROPIC_KEY, base_url=fake_server.anthropic_base_url, max_retries=0
        )
        send = client.messages.create
        params: dict[str, Any] = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 512,
            "messages": [{"role": "user", "content": "Screen: settings"}],
        }
    else:
        fake_server.script_responses(ScriptedTurn([message("Opening Display.")]))
        client = openai.AsyncOpenAI(
            api_key=OPENAI_KEY, base_url=fake_server.openai_base_url, max_retries=0
        )
        send = client.responses.create
        params = {
            "model": "gpt-4.1",
            "input": [{"role": "user", "content": "Screen: settings"}],
            "store": False,
        }

    async def create(**asked: Any) -> Any:
        stream = await send(**asked)
        opened.append(stream)
        return stream

    def feed(event: Any) -> None:
        raise _Unreadable(f"cannot read {type(event).__name__}")

    try:
        with pytest.raises(UnreadableAnswer, match="_Unreadable"):
            await fetch_response(create, params, vendor, (feed, dict), retries=0)
    finally:
        await client.close()
    (stream,) = opened
    assert stream.response.is_closed


def _resetting_client(http: Any) -> Any:
    """A client of `http` (httpx for the OpenAI SDK, httpx2 for Anthropic's) over the SDK's
    own transport, real HTTP to the fake server, on which a response closed before its body
    was read to its end resets its connection as it closes: the real close runs, then the
    error a reset raises (a response read to its end closes as usual)."""

    class ResetAtClose(http.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, body: Any) -> None:
            self._body = body
            self._read = False

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self._body:
                yield chunk
            self._read = True

        async def aclose(self) -> None:
            await self._body.aclose()
            if not self._read:
                raise http.ReadError("[Errno 104] Connection reset by peer")

    class Transport(http.AsyncHTTPTransport):  # type: ignore[misc]
        async def handle_async_request(self, request: Any) -> Any:
            response = await super().handle_async_request(request)
            return http.Response(
                response.status_code,
                headers=response.headers,
                stream=ResetAtClose(response.stream),
                extensions=response.extensions,
            )

    return http.AsyncClient(transport=Transport())


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_stream_that_fails_to_close_keeps_the_error_it_failed_with(
    fake_server: FakeModelServer, vendor: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing a stream in `fetch_response`'s `finally` raised when its connection reset at
    close, and that error replaced the PlannerError the call was failing with: the caller got
    a bare ReadError instead of UnreadableAnswer. The close failure is logged at debug now.
    Real SDKs against the fake server; the stream is left half read (its first event cannot
    be read), and its connection resets as it closes."""
    if vendor == "anthropic":
        fake_server.script_anthropic(ScriptedTurn([text("Opening Display.")]))
        client: Any = anthropic.AsyncAnthropic(
            api_key=ANTHROPIC_KEY,
            base_url=fake_server.anthropic_base_url,
            max_retries=0,
            http_client=_resetting_client(httpx2),
        )
        create = client.messages.create
        params: dict[str, Any] = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 512,
            "messages": [{"role": "user", "content": "Screen: settings"}],
        }
    else:
        fake_server.script_responses(ScriptedTurn([message("Opening Display.")]))
        client = openai.AsyncOpenAI(
            api_key=OPENAI_KEY,
            base_url=fake_server.openai_base_url,
            max_retries=0,
            http_client=_resetting_client(httpx),
        )
        create = client.responses.create
        params = {
            "model": "gpt-4.1",
            "input": [{"role": "user", "content": "Screen: settings"}],
            "store": False,
        }

    def feed(event: Any) -> None:
        raise _Unreadable(f"cannot read {type(event).__name__}")

    caplog.set_level(logging.DEBUG, logger="planner.vendors.streaming")
    try:
        with pytest.raises(UnreadableAnswer, match="_Unreadable"):
            await fetch_response(create, params, vendor, (feed, dict), retries=0)
    finally:
        await client.close()
    assert "closing a provider stream failed: ReadError" in caplog.text


async def test_a_cancelled_stream_stays_cancelled_when_its_close_fails(
    fake_server: FakeModelServer,
) -> None:
    """Cancelled while it waits for the rest of a stream, the Anthropic SDK closes the
    response in its stream's `finally`; a close that fails there (the connection reset as it
    closed) replaced the CancelledError, which `fetch_response` then read as a broken stream:
    a cancelled Decide came back UNAVAILABLE. Real SDK and HTTP transport against the fake
    server (the stream held after its first delta), the close failing as `_resetting_client`
    makes it."""
    release = threading.Event()
    fake_server.script_anthropic(
        ScriptedTurn([text("Opening Display.")], hold=release, hold_after="content_block_delta")
    )
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY,
        base_url=fake_server.anthropic_base_url,
        max_retries=0,
        http_client=_resetting_client(httpx2),
    )
    acc = AnthropicStreamAccumulator()
    delta = asyncio.Event()

    def feed(event: Any) -> None:
        acc.feed(event)
        if event_dict(event).get("type") == "content_block_delta":
            delta.set()

    params: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": "Screen: settings"}],
    }
    call = asyncio.create_task(
        fetch_response(client.messages.create, params, "anthropic", (feed, acc.message), retries=0)
    )
    try:
        await delta.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    finally:
        release.set()
        await client.close()


@pytest.mark.parametrize("item_events", [False, (0, 1)], ids=["no-item-events", "some-items"])
async def test_a_responses_item_streamed_without_events_is_taken_from_the_completed_response(
    fake_server: FakeModelServer, tmp_path: Path, item_events: bool | tuple[int, ...]
) -> None:
    """A compatible server that streams no `response.output_item.*` events, only the terminal
    `response.completed` with the whole output, or streams them for some items only (here the
    reasoning and the text, not the call): the output the events left out used to be lost (the
    answer read as one without a call, asked again, then failed)."""
    intent = {"purpose": "go back", "expected_outcome": "the previous screen shows"}
    fake_server.script_responses(
        ScriptedTurn(
            [
                reasoning("The back key returns."),
                message("Going back."),
                function_call("press_key", {"key": "back", **intent}),
            ],
            item_events=item_events,
        ),
    )
    client = openai.AsyncOpenAI(
        api_key=OPENAI_KEY, base_url=fake_server.openai_base_url, max_retries=0
    )
    planner = await SessionPlanner.open(
        store=SqliteSessionStore(tmp_path / "s.sqlite"),
        task_id="t1",
        attempt=1,
        adapter=OpenAIAdapter(client, model="gpt-5"),
        owns_adapter=True,
        config=SessionConfig(stream=True),
    )
    try:
        decision = await planner.decide("screen 1")
        kept = [type(i) for i in planner.history]
    finally:
        await planner.aclose()
    assert (decision.tool_name, decision.arguments["key"]) == ("press_key", "back")
    assert decision.rationale == "Going back."
    assert kept == [UserObservation, Reasoning, AssistantText, ToolCall]
    assert len(fake_server.requests) == 1 and fake_server.pending == 0


def test_a_server_tools_block_before_the_call_does_not_hide_the_models_text() -> None:
    """With "last", the model's text is the readable thinking block directly before its
    call. A server tool's call between them (kept, sent back as received) hid it: the
    decision had no rationale and showed the text as thinking."""
    blocks = [("thinking", "a1 "), ("thinking", "Tap it."), ("server", ""), ("tool", "")]
    live: list[str] = []
    acc = AnthropicStreamAccumulator(live.append, "last")
    for event in _blocks_streamed(blocks):
        acc.feed(event)
    turn = Turn("msg_1", items_from_message(acc.message()), Usage(), "m", "end_turn")
    turn.text_in_thinking = "last"
    assert [r.readable for r in turn.said] == ["Tap it."]
    assert "".join(live) == "a1 "
