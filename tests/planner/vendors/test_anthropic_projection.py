"""The exact Anthropic `messages` a session becomes: one assistant message per model turn."""

from __future__ import annotations

from typing import Any

import pytest

from planner.conversation.items import (
    AssistantText,
    ContextCheckpoint,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)
from planner.conversation.turns import (
    ForeignReasoning,
    SessionHistoryError,
    apply_checkpoint,
    next_checkpoint,
)
from planner.vendors.anthropic.projection import project_anthropic


def _history() -> list[SessionItem]:
    return [
        UserObservation("scene 1", condensed="page 1"),
        Reasoning("anthropic", "msg_1", text="look for settings", signature="SIG1+/="),
        Reasoning("anthropic", "msg_1", redacted_data="REDACTED1"),
        AssistantText("anthropic", "msg_1", "Settings is visible; open it."),
        ToolCall("anthropic", "msg_1", "toolu_1", "tap", {"element_id": "e1"}),
        ToolResult("toolu_1", "tapped"),
        UserObservation("scene 2", condensed="page 2"),
        Reasoning("anthropic", "msg_2", text="no signature here"),
        Reasoning("anthropic", "msg_2", text="", signature="SIG-ONLY"),
        AssistantText("anthropic", "msg_2", "Dark theme is on."),
        ToolCall("anthropic", "msg_2", "toolu_2", "complete", {"success": True, "reason": "on"}),
        ToolResult("toolu_2", "done", is_error=True),
        UserObservation("scene 3"),
    ]


def test_one_assistant_message_per_turn_with_thinking_text_tool_use() -> None:
    projection = project_anthropic(_history(), thinking=True)
    assert projection.messages == [
        {"role": "user", "content": [{"type": "text", "text": "scene 1"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "look for settings", "signature": "SIG1+/="},
                {"type": "redacted_thinking", "data": "REDACTED1"},
                {"type": "text", "text": "Settings is visible; open it."},
                {"type": "tool_use", "id": "toolu_1", "name": "tap", "input": {"element_id": "e1"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "tapped"},
                {"type": "text", "text": "scene 2"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "", "signature": "SIG-ONLY"},
                {"type": "text", "text": "Dark theme is on."},
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "complete",
                    "input": {"success": True, "reason": "on"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "done",
                    "is_error": True,
                },
                {"type": "text", "text": "scene 3"},
            ],
        },
    ]
    assert projection.stats.unsigned_dropped == 1
    assert projection.stats.turns_as_text == 0


def test_a_turn_is_echoed_in_the_order_the_api_produced_it() -> None:
    """Interleaved thinking stays where the API put it: moving a block breaks its signature."""
    items: list[SessionItem] = [
        UserObservation("s"),
        Reasoning("anthropic", "m", text="t1", signature="S1"),
        AssistantText("anthropic", "m", "Let me look."),
        Reasoning("anthropic", "m", text="t2", signature="S2"),
        ToolCall("anthropic", "m", "toolu_1", "get_ui_tree", {}),
        ToolResult("toolu_1", "[]"),
    ]
    [_, assistant, _] = project_anthropic(items, thinking=True).messages
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "thinking", "tool_use"]


def test_thinking_off_sends_no_thinking_blocks() -> None:
    projection = project_anthropic(_history(), thinking=False)
    sent = [b["type"] for m in projection.messages for b in m["content"]]
    assert "thinking" not in sent
    assert "redacted_thinking" not in sent
    assert projection.stats.thinking_off_dropped == 3


def _grown_history() -> list[list[SessionItem]]:
    """Snapshots of one session at each point a request is made."""
    steps: list[list[SessionItem]] = [
        [UserObservation("scene 1", condensed="p1")],
        [
            Reasoning("anthropic", "m1", text="a", signature="S1"),
            AssistantText("anthropic", "m1", "Looking."),
            UserObservation("Call a tool.", kind="instruction"),
        ],
        [  # forced retry: no thinking
            ToolCall("anthropic", "m2", "toolu_2", "press_key", {"key": "home"}),
            ToolResult("toolu_2", "ok"),
            UserObservation("scene 2", condensed="p2"),
        ],
        [
            Reasoning("openai", "r3", encrypted_content="E", item_id="rs_3", summary=("o",)),
            ToolCall("openai", "r3", "call_3", "tap", {"x": 1, "y": 1}, '{"x":1,"y":1}', "fc_3"),
            ToolResult("call_3", "ok"),
            UserObservation("scene 3", condensed="p3"),
        ],
        [
            Reasoning("anthropic", "m4", text="b", signature="S4"),
            ToolCall("anthropic", "m4", "toolu_4", "tap", {"element_id": "e1"}),
            ToolResult("toolu_4", "bad id", is_error=True),
        ],
        [
            Reasoning("anthropic", "m5", redacted_data="R5"),
            ToolCall("anthropic", "m5", "toolu_5", "tap", {"element_id": "e2"}),
            ToolResult("toolu_5", "ok"),
            UserObservation("scene 4", condensed="p4"),
        ],
    ]
    out: list[list[SessionItem]] = []
    items: list[SessionItem] = []
    for step in steps:
        items = [*items, *step]
        out.append(items)
    return out


@pytest.mark.parametrize("foreign", ["drop", "text"])
def test_projection_is_append_only(foreign: ForeignReasoning) -> None:
    """Every request starts with exactly the messages of the one before (its last user message
    may only grow): the prefix a thinking block is bound to never changes between checkpoints."""
    previous: list[dict[str, Any]] = []
    for items in _grown_history():
        messages = project_anthropic(items, thinking=True, foreign_reasoning=foreign).messages
        if previous:
            assert messages[: len(previous) - 1] == previous[:-1]
            last = previous[-1]
            grown = messages[len(previous) - 1]
            assert grown["role"] == last["role"] == "user"
            assert grown["content"][: len(last["content"])] == last["content"]
        previous = messages


def _switched_history() -> list[SessionItem]:
    return [
        UserObservation("scene 1"),
        Reasoning("openai", "resp_1", encrypted_content="ENC", item_id="rs_1", summary=("plan",)),
        AssistantText("openai", "resp_1", "Tapping.", item_id="msg_1"),
        ToolCall("openai", "resp_1", "call_1", "tap", {"x": 1, "y": 2}, '{"x":1,"y":2}', "fc_1"),
        ToolResult("call_1", "ok"),
        UserObservation("scene 2"),
    ]


def test_foreign_reasoning_is_dropped_and_the_open_loop_closed_as_text() -> None:
    projection = project_anthropic(_switched_history(), thinking=True, foreign_reasoning="drop")
    assert projection.messages == [
        {"role": "user", "content": [{"type": "text", "text": "scene 1"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Tapping."},
                {"type": "text", "text": '[called tool tap with {"x": 1, "y": 2}]'},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "[result of tool tap]\nok"},
                {"type": "text", "text": "scene 2"},
            ],
        },
    ]
    assert projection.stats.foreign_dropped == 1
    assert projection.stats.turns_as_text == 1


def test_foreign_reasoning_as_text_and_native_tool_use_without_thinking() -> None:
    projection = project_anthropic(_switched_history(), thinking=False, foreign_reasoning="text")
    assistant = projection.messages[1]
    assert assistant["content"] == [
        {"type": "text", "text": "[earlier reasoning by openai]\nplan"},
        {"type": "text", "text": "Tapping."},
        {"type": "tool_use", "id": "call_1", "name": "tap", "input": {"x": 1, "y": 2}},
    ]
    assert "ENC" not in repr(projection.messages)
    assert projection.stats.foreign_as_text == 1


def test_a_checkpoint_condenses_old_scenes_and_retires_earlier_thinking() -> None:
    history = _history()
    items = [*history[:6], ContextCheckpoint(keep_from=7), *history[6:]]
    projection = project_anthropic(items, thinking=True)
    assert projection.messages == [
        {"role": "user", "content": [{"type": "text", "text": "page 1"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Settings is visible; open it."},
                {"type": "text", "text": '[called tool tap with {"element_id": "e1"}]'},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "[result of tool tap]\ntapped"},
                {"type": "text", "text": "scene 2"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "", "signature": "SIG-ONLY"},
                {"type": "text", "text": "Dark theme is on."},
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "complete",
                    "input": {"success": True, "reason": "on"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "done",
                    "is_error": True,
                },
                {"type": "text", "text": "scene 3"},
            ],
        },
    ]
    assert projection.stats.budget_stripped == 2
    assert projection.stats.condensed_observations == 1
    assert projection.stats.turns_as_text == 1
    assert projection.stats.unsigned_dropped == 1


def test_next_checkpoint_cuts_in_steps() -> None:
    items: list[SessionItem] = []
    cuts: list[int | None] = []
    for n in range(8):
        cut = next_checkpoint(items, 2)
        cuts.append(cut)
        if cut is not None:
            items.append(ContextCheckpoint(cut))
        items.append(UserObservation(f"scene {n}"))
    # Full scenes grow to 4, then the cut keeps the last 2 (including the one being added).
    assert cuts == [None, None, None, None, 3, None, None, 7]
    assert apply_checkpoint(items).condensed == 6


def test_malformed_histories_are_refused() -> None:
    two_turns: list[SessionItem] = [
        UserObservation("s"),
        AssistantText("anthropic", "m1", "a"),
        AssistantText("anthropic", "m2", "b"),
    ]
    with pytest.raises(SessionHistoryError, match="two model turns"):
        project_anthropic(two_turns, thinking=False)
    unanswered: list[SessionItem] = [
        UserObservation("s"),
        ToolCall("anthropic", "m1", "toolu_1", "tap", {}),
        UserObservation("t"),
    ]
    with pytest.raises(SessionHistoryError, match="without a result"):
        project_anthropic(unanswered, thinking=False)


def test_a_server_tools_call_that_cannot_go_back_is_left_out() -> None:
    """A server tool's call is kept and sent back as received, with its result. One cut off
    by the output limit holds its partial input as text and has no result: the API takes an
    input only as an object, and refuses a server tool's call without its result in the turn
    ("`web_search` tool use with id … was found without a corresponding
    `web_search_tool_result` block", anthropic-sdk-python#961), so sent back it made the next
    call a 400. It is left out and counted; an answered one still goes back."""
    answered: dict[str, Any] = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}
    answered["input"] = {"query": "dark theme"}
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    cut: dict[str, Any] = {"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_search"}
    cut["input"] = '{"query": "android dar'
    unanswered = {**answered, "id": "srvtoolu_3"}
    history: list[SessionItem] = [
        UserObservation("scene 1"),
        Reasoning("anthropic", "msg_1", text="look it up", signature="SIG1"),
        *(AssistantText("anthropic", "msg_1", "", wire=b) for b in (answered, result, cut)),
        AssistantText("anthropic", "msg_1", "", wire=unanswered),
        ToolCall("anthropic", "msg_1", "toolu_1", "tap", {"element_id": "e1"}),
        ToolResult("toolu_1", "tapped"),
        UserObservation("scene 2"),
    ]
    projection = project_anthropic(history, thinking=True)
    sent = projection.messages[1]["content"]
    assert [b["type"] for b in sent] == [
        "thinking",
        "server_tool_use",
        "web_search_tool_result",
        "tool_use",
    ]
    assert sent[1] == answered
    assert projection.stats.opaque_dropped == 2
