"""The exact Responses `input` a session becomes: reasoning, then its item, then the outputs."""

from __future__ import annotations

from planner.conversation.items import (
    AssistantText,
    ContextCheckpoint,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)
from planner.vendors.openai.responses_projection import project_responses, request_flags


def _history() -> list[SessionItem]:
    return [
        UserObservation("scene 1", condensed="page 1"),
        Reasoning("openai", "resp_1", encrypted_content="ENC1", item_id="rs_1", summary=("a",)),
        AssistantText("openai", "resp_1", "Opening settings.", item_id="msg_1"),
        ToolCall(
            "openai",
            "resp_1",
            "call_1",
            "tap",
            {"element_id": "e1"},
            '{"element_id": "e1"}',
            "fc_1",
        ),
        ToolResult("call_1", "tapped"),
        UserObservation("scene 2"),
        Reasoning("openai", "resp_2", encrypted_content="ENC2", item_id="rs_2"),
        ToolCall(
            "openai", "resp_2", "call_2", "press_key", {"key": "back"}, '{"key":"back"}', "fc_2"
        ),
        ToolResult("call_2", "no effect", is_error=True),
        UserObservation("scene 3"),
    ]


def test_exact_input_items_in_api_order() -> None:
    projection = project_responses(_history())
    assert projection.input == [
        {"role": "user", "content": [{"type": "input_text", "text": "scene 1"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "a"}],
            "encrypted_content": "ENC1",
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Opening settings.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "tap",
            "arguments": '{"element_id": "e1"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "tapped"},
        {"role": "user", "content": [{"type": "input_text", "text": "scene 2"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "ENC2"},
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_2",
            "name": "press_key",
            "arguments": '{"key":"back"}',
        },
        {"type": "function_call_output", "call_id": "call_2", "output": "Error: no effect"},
        {"role": "user", "content": [{"type": "input_text", "text": "scene 3"}]},
    ]
    assert request_flags(reasoning=True) == {
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    assert request_flags(reasoning=False) == {"store": False}


def test_reasoning_never_goes_without_its_following_item() -> None:
    items: list[SessionItem] = [
        UserObservation("s"),
        Reasoning("openai", "r", encrypted_content="E0", item_id="rs_0"),
        Reasoning("openai", "r", item_id="rs_1"),  # no encrypted content: cannot be sent
        ToolCall("openai", "r", "call_1", "get_ui_tree", {}, "{}", "fc_1"),
        ToolResult("call_1", "[]"),
        UserObservation("t"),
        Reasoning("openai", "r2", encrypted_content="E2", item_id="rs_2"),  # turn ended here
        UserObservation("Call a tool.", kind="instruction"),
    ]
    projection = project_responses(items)
    types = [i.get("type", "message") for i in projection.input]
    assert types == ["message", "function_call", "function_call_output", "message", "message"]
    assert projection.stats.unsigned_dropped == 1
    assert projection.stats.orphan_reasoning_dropped == 2
    # Its reasoning stayed out, so the call goes without the id the API ties to it ("Item
    # 'fc_1' of type 'function_call' was provided without its required 'reasoning' item").
    assert "id" not in projection.input[1]
    assert projection.input[1]["call_id"] == "call_1"


def test_items_after_reasoning_that_stays_out_go_without_their_ids() -> None:
    """A GPT-5 model asked without `reasoning` (thinking off) still reasons, and its reasoning
    comes back without encrypted content: the turn's message and call go back id-less."""
    wire_call = {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "tap"}
    items: list[SessionItem] = [
        UserObservation("s"),
        Reasoning("openai", "r", item_id="rs_2"),
        AssistantText("openai", "r", "tapping", item_id="msg_2"),
        ToolCall("openai", "r", "call_2", "tap", {}, "{}", "fc_2", wire=wire_call),
        ToolResult("call_2", "ok"),
    ]
    sent = project_responses(items).input
    assert sent[1] == {"role": "assistant", "content": "tapping"}
    assert sent[2] == {
        "type": "function_call",
        "call_id": "call_2",
        "name": "tap",
        "arguments": "{}",
    }
    # With its reasoning sent, the same turn goes back as it came.
    items[1] = Reasoning("openai", "r", encrypted_content="E", item_id="rs_2")
    sent = project_responses(items).input
    assert [i.get("id") for i in sent[1:4]] == ["rs_2", "msg_2", "fc_2"]


def test_budget_and_foreign_reasoning() -> None:
    items: list[SessionItem] = [
        UserObservation("scene 1", condensed="page 1"),
        Reasoning("anthropic", "m", text="thought", signature="SIG"),
        ToolCall("anthropic", "m", "toolu_1", "tap", {"x": 1, "y": 2}),
        ToolResult("toolu_1", "ok"),
        ContextCheckpoint(keep_from=5),
        *_history()[1:],
    ]
    projection = project_responses(items, foreign_reasoning="text")
    assert projection.input[0] == {
        "role": "user",
        "content": [{"type": "input_text", "text": "page 1"}],
    }
    assert projection.input[1] == {
        "role": "assistant",
        "content": "[earlier reasoning by anthropic]\nthought",
    }
    assert projection.input[2] == {
        "type": "function_call",
        "call_id": "toolu_1",
        "name": "tap",
        "arguments": '{"x":1,"y":2}',
    }
    assert "SIG" not in repr(projection.input)
    assert projection.stats.foreign_as_text == 1
    assert projection.stats.condensed_observations == 1
    dropped = project_responses(items, foreign_reasoning="drop")
    assert dropped.input[1]["type"] == "function_call"
    assert dropped.stats.foreign_dropped == 1


def test_budget_strips_reasoning_of_earlier_turns_only() -> None:
    projection = project_responses(_history(), keep_reasoning_turns=1)
    sent = [i.get("id") for i in projection.input if i.get("type") == "reasoning"]
    assert sent == ["rs_2"]
    assert projection.stats.budget_stripped == 1
    # The stripped turn's call goes without its id (the API ties it to the reasoning left out).
    assert [i.get("id") for i in projection.input if i.get("type") == "function_call"] == [
        None,
        "fc_2",
    ]


def test_items_received_whole_go_back_verbatim() -> None:
    """The message `phase` (and any field this code does not know) survives the round trip."""
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "phase": "commentary",
        "content": [{"type": "output_text", "text": "Tapping.", "annotations": []}],
    }
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "tap",
        "arguments": '{"x":1,"y":2}',
        "status": "completed",
        "namespace": "device",
    }
    items: list[SessionItem] = [
        UserObservation("s"),
        AssistantText("openai", "r", "Tapping.", "msg_1", message),
        ToolCall("openai", "r", "call_1", "tap", {"x": 1, "y": 2}, '{"x":1,"y":2}', "fc_1", call),
        ToolResult("call_1", "ok"),
    ]
    assert project_responses(items).input[1:3] == [message, call]


def test_a_replayed_reasoning_item_goes_back_without_its_status() -> None:
    """The item is echoed as received, but a reasoning item's `status` was refused on the way
    back by the API in the wild ("Unknown parameter: 'input[3].status'")."""
    wire = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "ENC1",
        "status": "completed",
    }
    items: list[SessionItem] = [
        UserObservation("s"),
        Reasoning("openai", "r", encrypted_content="ENC1", item_id="rs_1", wire=wire),
        ToolCall("openai", "r", "call_1", "get_ui_tree", {}, "{}", "fc_1"),
        ToolResult("call_1", "[]"),
    ]
    (sent,) = [i for i in project_responses(items).input if i.get("type") == "reasoning"]
    assert sent == {k: v for k, v in wire.items() if k != "status"}
