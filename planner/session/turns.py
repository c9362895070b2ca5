"""Grouping a flat item list into turns, and the context-budget rules both projections share.

A model turn is every assistant item with the same `turn_id` that follows one another; the user
side between two model turns is one user turn. Projections work on these groups so that one
model turn always becomes one assistant message (Anthropic) or one contiguous run of output
items (Responses) — never split, never merged with another turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.session.items import (
    AssistantItem,
    AssistantText,
    ProviderName,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)

OMITTED_SCENE = "(earlier screen omitted to save context)"


class SessionHistoryError(ValueError):
    """The history cannot be projected into a valid request (a bug in whoever built it)."""


@dataclass(slots=True)
class ModelTurn:
    """Every item one model response produced, in the order the provider produced them."""

    provider: ProviderName
    turn_id: str
    items: list[AssistantItem] = field(default_factory=list)

    @property
    def reasoning(self) -> list[Reasoning]:
        return [i for i in self.items if isinstance(i, Reasoning)]

    @property
    def texts(self) -> list[AssistantText]:
        return [i for i in self.items if isinstance(i, AssistantText)]

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [i for i in self.items if isinstance(i, ToolCall)]


@dataclass(slots=True)
class UserSide:
    """The user-side items between two model turns (tool results and observations)."""

    items: list[UserObservation | ToolResult] = field(default_factory=list)

    @property
    def results(self) -> list[ToolResult]:
        return [i for i in self.items if isinstance(i, ToolResult)]

    @property
    def observations(self) -> list[UserObservation]:
        return [i for i in self.items if isinstance(i, UserObservation)]


Segment = ModelTurn | UserSide


def segment(items: Sequence[SessionItem]) -> list[Segment]:
    """Group items into alternating user sides and model turns.

    Two model turns can follow each other directly only if something went wrong upstream (no
    user item between them); they stay two segments and the projection rejects them.
    """
    out: list[Segment] = []
    for item in items:
        if isinstance(item, UserObservation | ToolResult):
            last = out[-1] if out else None
            if isinstance(last, UserSide):
                last.items.append(item)
            else:
                out.append(UserSide([item]))
            continue
        last = out[-1] if out else None
        if isinstance(last, ModelTurn) and last.turn_id == item.turn_id:
            last.items.append(item)
        else:
            out.append(ModelTurn(item.provider, item.turn_id, [item]))
    return out


def condense_old_observations(
    items: Sequence[SessionItem], keep_scenes: int | None
) -> tuple[list[SessionItem], int]:
    """The items with every observation but the last `keep_scenes` replaced by its short form.

    Old observations become their `condensed` text (or a placeholder); instructions are short
    and always kept. Returns the new list and how many observations were condensed. Only user
    content changes here: no reasoning, tool call or tool result is touched.
    """
    indexes = [
        i
        for i, item in enumerate(items)
        if isinstance(item, UserObservation) and item.kind == "observation"
    ]
    old = set() if keep_scenes is None else set(indexes[: max(0, len(indexes) - keep_scenes)])
    out: list[SessionItem] = []
    for i, item in enumerate(items):
        if i in old and isinstance(item, UserObservation):
            out.append(UserObservation(item.condensed or OMITTED_SCENE, kind="observation"))
        else:
            out.append(item)
    return out, len(old)


def reasoning_kept_turns(segments: Sequence[Segment], keep_turns: int | None) -> set[int]:
    """Indexes (into `segments`) of the model turns whose reasoning is sent back.

    None keeps every turn's reasoning. Otherwise the last `keep_turns` model turns keep it
    (at least the last one: a provider may require the reasoning of the turn that is waiting
    for its tool result).
    """
    turn_indexes = [i for i, s in enumerate(segments) if isinstance(s, ModelTurn)]
    if keep_turns is None:
        return set(turn_indexes)
    keep = max(1, keep_turns)
    return set(turn_indexes[-keep:])
