"""A stored OpenAI call goes back with arguments a compatible server can parse, in Chat and in
Responses alike (`calls.sent_arguments`)."""

from __future__ import annotations

import json

from planner.conversation.items import SessionItem, ToolCall, ToolResult, UserObservation
from planner.vendors.openai.chat import project_chat
from planner.vendors.openai.responses_projection import project_responses

BROKEN = '{"element_id": "e17", "purpose": '


def _history(call: ToolCall) -> list[SessionItem]:
    return [UserObservation("screen 1"), call, ToolResult(call.call_id, "not valid JSON", True)]


def _old_form(raw: str | None) -> ToolCall:
    """A call as stored before unparseable arguments were kept as `{}`: the model's text."""
    wire = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "tap"}
    return ToolCall("openai", "r1", "c1", "tap", {}, raw, "fc_1", {**wire, "arguments": raw})


def _chat_arguments(call: ToolCall) -> str:
    (assistant,) = [m for m in project_chat("sys", _history(call)) if m["role"] == "assistant"]
    return str(assistant["tool_calls"][0]["function"]["arguments"])


def _responses_arguments(call: ToolCall) -> str:
    sent = project_responses(_history(call)).input
    (item,) = [i for i in sent if i.get("type") == "function_call"]
    return str(item["arguments"])


def test_stored_arguments_that_are_no_json_object_go_back_as_an_object() -> None:
    for raw in (BROKEN, "", "7", None):
        call = _old_form(raw)
        assert _chat_arguments(call) == "{}", raw
        assert _responses_arguments(call) == "{}", raw


def test_stored_json_object_arguments_go_back_byte_for_byte() -> None:
    raw = '{"element_id":  "e17", "purpose": "p\\u00e9"}'
    call = ToolCall("openai", "r1", "c1", "tap", json.loads(raw), raw, "fc_1")
    assert _chat_arguments(call) == raw
    assert _responses_arguments(call) == raw
