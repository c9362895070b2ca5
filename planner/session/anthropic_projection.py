"""Session items → the `messages` array of an Anthropic Messages request.

The rules this module exists to keep (each one a known failure mode elsewhere):

- One model turn is ONE assistant message: thinking and redacted_thinking blocks first, then the
  text, then the tool_use — never split into several assistant messages, never reordered among
  themselves. Thinking goes back unmodified with its signature (also when the text is empty: a
  signature-only block is valid and must be kept); redacted thinking goes back as
  `redacted_thinking` with its data; Anthropic reasoning with neither is dropped and counted.
- Signatures go back only to Anthropic. Reasoning another provider made is dropped, or sent as a
  plain text block, by setting (`foreign_reasoning`).
- The tool results of a turn form one user message whose tool_result blocks come first, followed
  by the new observation.
- With thinking on, the assistant message before the last set of tool results must start with
  a thinking block. If that turn has none Anthropic would accept (another provider made it, or
  the forced retry ran without thinking), the turn and its results are sent as plain text, so
  the request no longer ends inside a tool loop instead of failing.
- Context budget: thinking of earlier turns may be omitted (`keep_reasoning_turns`), never that
  of the last turn; old observations are condensed (`keep_scenes`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from planner.session.items import Reasoning, SessionItem, ToolResult
from planner.session.turns import (
    ModelTurn,
    SessionHistoryError,
    UserSide,
    condense_old_observations,
    reasoning_kept_turns,
    segment,
)

ForeignReasoning = Literal["drop", "text"]


@dataclass(slots=True)
class ProjectionStats:
    """What a projection left out or changed, so it can be logged instead of happening silently."""

    unsigned_dropped: int = 0
    foreign_dropped: int = 0
    foreign_as_text: int = 0
    budget_stripped: int = 0
    condensed_observations: int = 0
    loops_closed_as_text: int = 0
    orphan_reasoning_dropped: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "unsigned_dropped": self.unsigned_dropped,
            "foreign_dropped": self.foreign_dropped,
            "foreign_as_text": self.foreign_as_text,
            "budget_stripped": self.budget_stripped,
            "condensed_observations": self.condensed_observations,
            "loops_closed_as_text": self.loops_closed_as_text,
            "orphan_reasoning_dropped": self.orphan_reasoning_dropped,
        }


@dataclass(slots=True)
class AnthropicProjection:
    """The `messages` of the request plus what was left out."""

    messages: list[dict[str, Any]]
    stats: ProjectionStats = field(default_factory=ProjectionStats)


def foreign_reasoning_text(reasoning: Reasoning) -> str:
    """How another provider's reasoning reads as plain text (its signature never travels)."""
    return f"[earlier reasoning by {reasoning.provider}]\n{reasoning.readable}"


def call_as_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call rendered as text, for a turn that cannot be sent as a tool_use."""
    args = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    return f"[called tool {name} with {args}]"


def result_as_text(name: str, result: ToolResult) -> str:
    """A tool result rendered as text, paired with `call_as_text`."""
    status = "error" if result.is_error else "result"
    return f"[{status} of tool {name}]\n{result.output}"


def _has_deliverable_thinking(turn: ModelTurn) -> bool:
    return any(
        r.provider == "anthropic" and (bool(r.signature) or bool(r.redacted_data))
        for r in turn.reasoning
    )


def _reasoning_blocks(
    turn: ModelTurn, *, keep: bool, foreign: ForeignReasoning, stats: ProjectionStats
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(thinking blocks, foreign reasoning as text blocks) for one turn."""
    thinking: list[dict[str, Any]] = []
    as_text: list[dict[str, Any]] = []
    for r in turn.reasoning:
        if not keep:
            stats.budget_stripped += 1
        elif r.provider != "anthropic":
            if foreign == "text" and r.readable:
                as_text.append({"type": "text", "text": foreign_reasoning_text(r)})
                stats.foreign_as_text += 1
            else:
                stats.foreign_dropped += 1
        elif r.signature:
            thinking.append({"type": "thinking", "thinking": r.text, "signature": r.signature})
        elif r.redacted_data:
            thinking.append({"type": "redacted_thinking", "data": r.redacted_data})
        else:
            stats.unsigned_dropped += 1
    return thinking, as_text


def project_anthropic(
    items: Sequence[SessionItem],
    *,
    thinking: bool,
    foreign_reasoning: ForeignReasoning = "drop",
    keep_scenes: int | None = None,
    keep_reasoning_turns: int | None = None,
) -> AnthropicProjection:
    """Project a session onto Anthropic `messages`. Raises SessionHistoryError when the history
    itself is malformed (a tool call without a result, two model turns in a row)."""
    stats = ProjectionStats()
    budgeted, stats.condensed_observations = condense_old_observations(items, keep_scenes)
    segments = segment(budgeted)
    if not segments or not isinstance(segments[0], UserSide):
        raise SessionHistoryError("a session must start with a user observation")
    kept = reasoning_kept_turns(segments, keep_reasoning_turns)

    # The turn the last tool results answer: with thinking on it must open with thinking.
    close_index: int | None = None
    last = segments[-1]
    if isinstance(last, UserSide) and last.results and len(segments) >= 2:
        tail = segments[-2]
        assert isinstance(tail, ModelTurn)
        if thinking and not _has_deliverable_thinking(tail):
            close_index = len(segments) - 2

    messages: list[dict[str, Any]] = []
    text_calls: dict[str, str] = {}  # call id -> tool name, for calls rendered as text
    pending: dict[str, str] = {}  # call id -> tool name, waiting for a tool_result
    for index, seg in enumerate(segments):
        if isinstance(seg, UserSide):
            content: list[dict[str, Any]] = []
            texts: list[dict[str, Any]] = []
            for item in seg.items:
                if isinstance(item, ToolResult):
                    if item.call_id in text_calls:
                        texts.append(
                            {"type": "text", "text": result_as_text(text_calls[item.call_id], item)}
                        )
                        continue
                    if item.call_id not in pending:
                        raise SessionHistoryError(
                            f"tool result for {item.call_id!r} answers no tool call of the "
                            "previous turn"
                        )
                    pending.pop(item.call_id)
                    block: dict[str, Any] = {
                        "type": "tool_result",
                        "tool_use_id": item.call_id,
                        "content": item.output,
                    }
                    if item.is_error:
                        block["is_error"] = True
                    content.append(block)
                elif item.text:
                    texts.append({"type": "text", "text": item.text})
            if pending:
                raise SessionHistoryError(f"tool call(s) without a result: {sorted(pending)}")
            _append(messages, "user", content + texts)
            continue

        if pending:
            raise SessionHistoryError(
                f"model turn {seg.turn_id!r} follows tool call(s) without a result: "
                f"{sorted(pending)}"
            )
        think, foreign_text = _reasoning_blocks(
            seg, keep=index in kept, foreign=foreign_reasoning, stats=stats
        )
        text_blocks = [{"type": "text", "text": t.text} for t in seg.texts if t.text]
        if index == close_index:
            stats.loops_closed_as_text += 1
            calls = [
                {"type": "text", "text": call_as_text(c.name, c.arguments)} for c in seg.tool_calls
            ]
            text_calls.update({c.call_id: c.name for c in seg.tool_calls})
            _append(messages, "assistant", think + foreign_text + text_blocks + calls)
            continue
        uses = [
            {"type": "tool_use", "id": c.call_id, "name": c.name, "input": c.arguments}
            for c in seg.tool_calls
        ]
        pending.update({c.call_id: c.name for c in seg.tool_calls})
        _append(messages, "assistant", think + foreign_text + text_blocks + uses)
    if pending:
        raise SessionHistoryError(f"tool call(s) without a result: {sorted(pending)}")
    return AnthropicProjection(messages, stats)


def _append(messages: list[dict[str, Any]], role: str, content: list[dict[str, Any]]) -> None:
    """Add a message. Empty content adds nothing; two user sides that meet (the model turn
    between them had nothing left to send) become one message; two assistant messages in a
    row would split or merge model turns, which is exactly what must never happen."""
    if not content:
        return
    if messages and messages[-1]["role"] == role:
        if role == "assistant":
            raise SessionHistoryError("two model turns follow each other without a user turn")
        messages[-1]["content"].extend(content)
        return
    messages.append({"role": role, "content": content})
