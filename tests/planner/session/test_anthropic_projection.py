"""The exact Anthropic `messages` a session becomes: one assistant message per model turn."""

from __future__ import annotations

from typing import Any

import pytest

from planner.session.anthropic_projection import project_anthropic
from planner.session.items import (
    AssistantText,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)
from planner.session.turns import SessionHistoryError


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
    assert projection.stats.loops_closed_as_text == 0


def test_thinking_goes_first_even_if_items_arrived_interleaved() -> None:
    items: list[SessionItem] = [
        UserObservation("s"),
        AssistantText("anthropic", "m", "text first"),
        Reasoning("anthropic", "m", text="t", signature="S"),
        ToolCall("anthropic", "m", "toolu_1", "get_ui_tree", {}),
        ToolResult("toolu_1", "[]"),
    ]
    [_, assistant, _] = project_anthropic(items, thinking=True).messages
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "tool_use"]


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
    assert projection.stats.loops_closed_as_text == 1


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


def test_budget_strips_old_thinking_and_condenses_old_scenes_but_keeps_the_last_turn() -> None:
    projection = project_anthropic(_history(), thinking=True, keep_scenes=1, keep_reasoning_turns=1)
    msgs: list[dict[str, Any]] = projection.messages
    assert msgs[0]["content"] == [{"type": "text", "text": "page 1"}]
    assert msgs[2]["content"][1] == {"type": "text", "text": "page 2"}
    assert msgs[4]["content"][1] == {"type": "text", "text": "scene 3"}
    assert [b["type"] for b in msgs[1]["content"]] == ["text", "tool_use"]
    assert msgs[3]["content"][0] == {"type": "thinking", "thinking": "", "signature": "SIG-ONLY"}
    assert projection.stats.budget_stripped == 2
    assert projection.stats.condensed_observations == 2


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
