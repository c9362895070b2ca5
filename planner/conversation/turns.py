"""Grouping a flat item list into turns, and the rules every vendor projection shares.

A model turn is every assistant item with the same `turn_id` that follows one another; the user
side between two model turns is one user turn. Projections work on these groups so that one
model turn always becomes one assistant message (Anthropic) or one contiguous run of output
items (Responses) — never split, never merged with another turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

from planner.conversation.items import (
    AssistantItem,
    AssistantText,
    ContextCheckpoint,
    ProviderName,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
)

OMITTED_SCENE = "(earlier screen omitted to save context)"

#: What happens to reasoning another provider made, after a provider switch: dropped, or sent
#: as plain text (its signature or encrypted content never travels to another provider).
ForeignReasoning = Literal["drop", "text"]


@dataclass(slots=True)
class ProjectionStats:
    """What a projection left out or changed, so it can be logged instead of happening silently."""

    unsigned_dropped: int = 0
    foreign_dropped: int = 0
    foreign_as_text: int = 0
    budget_stripped: int = 0
    condensed_observations: int = 0
    turns_as_text: int = 0
    orphan_reasoning_dropped: int = 0
    thinking_off_dropped: int = 0
    #: Content blocks of a type this code does not read (`AssistantText.opaque`) left out of a
    #: turn sent as text, and server tools' calls that cannot go back (cut off, no result).
    opaque_dropped: int = 0
    #: Thinking blocks that would have ended an assistant message (Anthropic refuses that),
    #: left out: a turn of thinking alone, without a tool call.
    trailing_thinking_dropped: int = 0
    #: The text sent in place of each screenshot that could not be made to fit the provider's
    #: image limit (`planner/vendors/images.py`): part of what the model was told, so the
    #: decision records it with the prompt.
    screenshot_notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        """Counts (a list counts its entries), fit for a log line."""
        return {
            f.name: len(v) if isinstance(v := getattr(self, f.name), list) else int(v)
            for f in fields(self)
        }


def foreign_reasoning_text(reasoning: Reasoning) -> str:
    """How another provider's (or model's) reasoning reads as plain text (its signature never
    travels)."""
    return f"[earlier reasoning by {reasoning.model or reasoning.provider}]\n{reasoning.readable}"


class SessionHistoryError(ValueError):
    """The history cannot be projected into a valid request (a bug in whoever built it)."""


@dataclass(slots=True)
class ModelTurn:
    """Every item one model response produced, in the order the provider produced them.

    `start` is the index of its first item in the history (to compare with checkpoints).
    """

    provider: ProviderName
    turn_id: str
    start: int
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
    """Group items into alternating user sides and model turns (checkpoints are skipped).

    Two model turns can follow each other directly only if something went wrong upstream (no
    user item between them); they stay two segments and the projection rejects them.
    """
    out: list[Segment] = []
    for index, item in enumerate(items):
        if isinstance(item, ContextCheckpoint):
            continue
        last = out[-1] if out else None
        if isinstance(item, UserObservation | ToolResult):
            if isinstance(last, UserSide):
                last.items.append(item)
            else:
                out.append(UserSide([item]))
        elif isinstance(last, ModelTurn) and last.turn_id == item.turn_id:
            last.items.append(item)
        else:
            out.append(ModelTurn(item.provider, item.turn_id, index, [item]))
    return out


@dataclass(frozen=True, slots=True)
class Budgeted:
    """The history as the latest checkpoint says to send it."""

    items: list[SessionItem]
    checkpoint_at: int  # index of the latest checkpoint, -1 if none
    condensed: int


def apply_checkpoint(items: Sequence[SessionItem]) -> Budgeted:
    """Condense every observation before the latest checkpoint's `keep_from`.

    Indexes are kept (items are replaced, not removed), so turn positions can be compared with
    `checkpoint_at`. Only user content changes here; instructions are short and always kept.
    """
    at, keep_from = -1, 0
    for index, item in enumerate(items):
        if isinstance(item, ContextCheckpoint):
            at, keep_from = index, item.keep_from
    out: list[SessionItem] = []
    condensed = 0
    for index, item in enumerate(items):
        if index < keep_from and isinstance(item, UserObservation) and item.kind == "observation":
            out.append(UserObservation(item.condensed or OMITTED_SCENE))
            condensed += 1
        else:
            out.append(item)
    return Budgeted(out, at, condensed)


def next_checkpoint(items: Sequence[SessionItem], keep_scenes: int | None) -> int | None:
    """Where a new checkpoint should cut, or None while the budget still holds.

    Called before a new observation is added. The full scenes since the last cut may grow to
    twice `keep_scenes`; then the cut moves so that only the last `keep_scenes` (counting the
    observation about to be added) stay full. Moving in steps rather than one scene at a time
    keeps the request prefix identical for `keep_scenes` steps in a row, which is what lets
    thinking blocks stay valid and prompt caches hit. Returns the `keep_from` index for a
    checkpoint appended now (followed by the new observation).
    """
    if keep_scenes is None:
        return None
    keep = max(1, keep_scenes)
    keep_from = 0
    for item in items:
        if isinstance(item, ContextCheckpoint):
            keep_from = item.keep_from
    full = [
        i
        for i, item in enumerate(items)
        if i >= keep_from and isinstance(item, UserObservation) and item.kind == "observation"
    ]
    if len(full) + 1 <= 2 * keep:
        return None
    previous = full[len(full) - (keep - 1) :] if keep > 1 else []
    # The checkpoint lands at len(items) and the new observation right after it.
    return previous[0] if previous else len(items) + 1


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
