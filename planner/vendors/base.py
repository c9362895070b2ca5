"""What every model adapter speaks: one call in (`TurnRequest`), one model turn out (`Turn`).

A planning mode (compact or session) owns the conversation as items and the retry policy; an
adapter owns one vendor's wire formats: it projects the items onto the vendor's request, calls
the official SDK, parses the reply back into items and maps failures to planner errors. Both
modes go through the same adapter, so a request rule or a parsing fix lands once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from planner.conversation.items import (
    AssistantItem,
    AssistantText,
    Reasoning,
    SessionItem,
    ToolCall,
)
from planner.conversation.turns import ForeignReasoning, ProjectionStats
from planner.decision import ThinkingKind, Usage
from planner.model_profiles import RetryForm, ThinkingMode
from planner.secret_refs import stored
from planner.tools import ToolSpec, over_limit_noted

PlannerMode = Literal["compact", "session"]
TextInThinking = Literal["none", "last", "all"]
ThinkingSink = Callable[[str], None]
"""Receives live thinking text deltas while a streamed answer arrives (never stored as such)."""

#: What separates two thinking blocks in the live view.
BLOCK_BREAK = "\n\n"


class LiveBlocks:
    """The live thinking of one decision, fed to a sink block by block with a blank line
    between two blocks (of one answer, or of the decision's next call).

    The live view only appends deltas (the contract's `LiveThinking.delta`), so two blocks ran
    into one line ("…the theme.Now tap it."), where the decision records them apart."""

    def __init__(self, sink: ThinkingSink | None) -> None:
        self._sink = sink
        self._block: Hashable | None = None

    def show(self, block: Hashable, text: str) -> None:
        """Show `text`, a delta of `block` (any key, unique within the decision)."""
        if self._sink is None or not text:
            return
        if self._block is not None and block != self._block:
            self._sink(BLOCK_BREAK)
        self._block = block
        self._sink(text)


def live_blocks(sink: ThinkingSink | LiveBlocks | None) -> LiveBlocks:
    """`sink` as a decision's live view (one already made for the decision is kept)."""
    return sink if isinstance(sink, LiveBlocks) else LiveBlocks(sink)


@dataclass(frozen=True, slots=True)
class ThinkingConfig:
    """Reasoning as configured, vendor-neutral.

    Anthropic: `adaptive` sends `thinking: {type: adaptive}`, `budget` sends `thinking: {type:
    enabled, budget_tokens}` with the interleaved-thinking beta header, each with
    `output_config.effort` when an effort is set.
    OpenAI Responses: any mode but `off` sends `reasoning: {effort, summary: auto}`, without
    `summary` when `summaries` is False (an organisation OpenAI has not verified gets a 400 for
    asking for reasoning summaries).
    """

    mode: ThinkingMode = "off"
    effort: str | None = None
    budget_tokens: int | None = None
    summaries: bool = True

    def __post_init__(self) -> None:
        if self.mode == "budget" and (self.budget_tokens is None or self.budget_tokens < 1024):
            raise ValueError("thinking budget_tokens must be at least 1024")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


@dataclass(slots=True)
class RetrySpend:
    """What the calls of one decision took of its retries: how many, and how long they waited
    before them. Each call counted its own before, so a decision of three calls (a first
    answer, a retry without a tool call, a corrective turn) could make three times
    `AMC_PLANNER_MAX_RETRIES` retries and wait three times their limit; an operator's "retries"
    is the most one decision spends on transient failures."""

    taken: int = 0
    waited: float = 0.0


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One model call: the conversation so far, and how to ask.

    - `mode`: session requests go to the stateless OpenAI Responses API (encrypted reasoning
      round-trips), compact requests to Chat Completions unless the model's profile says it
      refuses the model's tool calls there (then Responses too); Anthropic uses Messages for both.
    - `forced`: the forced retry — the tool choice forces a tool call and thinking is off for
      this call (the only combination the providers accept).
    - `thinking`: False turns the configured thinking off for this call.
    - `images`: screenshots attached to the observation at that item index (compact mode only;
      they travel beside the items because items may be stored, screenshots never are).
    """

    system: str
    items: Sequence[SessionItem]
    tools: Sequence[ToolSpec]
    mode: PlannerMode = "compact"
    forced: bool = False
    thinking: bool = True
    max_tokens: int | None = None
    images: Mapping[int, bytes] = field(default_factory=dict)
    stream: bool = False
    on_thinking: ThinkingSink | LiveBlocks | None = None
    foreign_reasoning: ForeignReasoning = "drop"
    keep_reasoning_turns: int | None = None
    spent: RetrySpend | None = None
    """The retries the decision this call is part of took so far, shared by all its calls
    (`planner.deciding.decide`); None: this call has a budget of its own."""


@dataclass(slots=True)
class Turn:
    """One model response: its items in the order the vendor produced them (ready to be kept
    as received), usage, model and stop reason.

    The items carry a sensitive `input_text` value masked (it is executed, never kept or sent
    back); `raw_calls` holds each call's arguments exactly as the model sent them, for parsing
    and execution only, in the order of `tool_calls` (paired by position: an id may be empty,
    or repeated, in an answer from an OpenAI-compatible server or a proxy).
    """

    turn_id: str
    items: list[AssistantItem]
    usage: Usage
    model: str
    stop_reason: str | None
    raw_calls: list[Any] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)
    projection: ProjectionStats = field(default_factory=ProjectionStats)
    truncated: bool = False
    """The answer was cut off by the output token limit."""
    context_exceeded: bool = False
    """The answer stopped because the conversation filled the model's context window: no
    more output room helps, and asking again on top of it overflows again."""
    max_tokens: int | None = None
    """The output token limit the call was sent with (thinking included)."""
    output_limit: int | None = None
    """The model's own output limit (its profile's `max_output_tokens`; None: not known): a
    call asking for more is refused, so a raised limit stops there."""
    readable_thinking: Literal["full", "summarized"] = "summarized"
    """What readable reasoning text of this turn is: the model's own, or a summary."""
    refusal: str | None = None
    """The model declined to answer: why, in the provider's words (Anthropic's stop_details
    category and explanation, OpenAI's refusal text, or that OpenAI's content filter stopped
    the answer). None for an answer."""
    cut_short: str | None = None
    """The provider ended the answer unfinished for a reason more output room does not help
    with and that is no refusal (OpenAI Responses: `incomplete: max_messages`, `status
    cancelled`; Anthropic: `pause_turn`, a stop reason newer than this code): why. Nothing of
    it may run or be kept."""
    text_in_thinking: TextInThinking = "none"
    """Where the text the model wrote before its call is: "none" (nowhere: thinking blocks are
    thinking), "last" (the models with progress updates under the summarized display: in a
    thinking block of its own, the last before the call) or "all" (`between_tools`, or the
    `updates` display: reasoning comes back empty, and a readable block is a progress update,
    the text the model wrote before its call)."""

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [i for i in self.items if isinstance(i, ToolCall)]

    @property
    def reasoning(self) -> list[Reasoning]:
        return [i for i in self.items if isinstance(i, Reasoning)]

    @property
    def said(self) -> list[Reasoning]:
        """Reasoning blocks that hold the text the model wrote (its judgement and intent), on
        the models that return that text in thinking blocks (`text_in_thinking`). With "all",
        every readable one; with "last", only in an answer with a call and without a text
        block, the readable block directly before the call: the summarized display does not
        tell it from reasoning, and the model writes its judgement last."""
        if self.text_in_thinking == "all":
            return [r for r in self.reasoning if r.readable]
        if self.text_in_thinking == "none" or not self.tool_calls:
            return []
        if any(isinstance(i, AssistantText) and not i.opaque for i in self.items):
            return []
        read = self._read
        first_call = next(i for i, item in enumerate(read) if isinstance(item, ToolCall))
        last = read[first_call - 1] if first_call else None
        return [last] if isinstance(last, Reasoning) and last.readable else []

    @property
    def _read(self) -> list[AssistantItem]:
        """The items but blocks the planner does not read (server tools' calls and results,
        `AssistantText.opaque`): they may sit between the model's text and its call, and are
        not what it wrote."""
        return [i for i in self.items if not (isinstance(i, AssistantText) and i.opaque)]

    @property
    def thought(self) -> list[Reasoning]:
        """The turn's thinking: its reasoning blocks but those that hold its text (`said`). A
        lone block before the call ("last") stays too: it may as well be the model's only
        reasoning, and recorded as both nothing is lost either way."""
        said = self.said
        if self.text_in_thinking == "last" and said and said[0] is self._read[0]:
            said = []  # nothing was written before it
        return [r for r in self.reasoning if all(r is not s for s in said)]

    @property
    def thinking_kind(self) -> ThinkingKind:
        """What this turn's thinking gives a reader: readable text (full or summarized), a
        signature or encrypted content only (omitted by the provider), redacted, or none."""
        reasoning = self.thought
        if not reasoning:
            return "none"
        if any(r.readable for r in reasoning):
            return self.readable_thinking
        if any(r.redacted_data for r in reasoning):
            return "redacted"
        return "omitted"

    @property
    def text(self) -> str | None:
        """The text of the turn joined: the model's judgement of the last step and its intent
        (from the thinking blocks that hold it, on the models that return it there: `said`)."""
        said = {id(r) for r in self.said}
        parts = [
            i.text.strip() if isinstance(i, AssistantText) else i.readable.strip()
            for i in self.items
            if isinstance(i, AssistantText) or (isinstance(i, Reasoning) and id(i) in said)
        ]
        return "\n".join(p for p in parts if p) or None


@runtime_checkable
class ModelAdapter(Protocol):
    """A model behind one vendor's wire formats (or the offline heuristic)."""

    @property
    def name(self) -> str:
        """ "anthropic", "openai" or "offline"."""
        ...

    @property
    def model(self) -> str:
        """The configured model name."""
        ...

    @property
    def retry_form(self) -> RetryForm:
        """How an answer without a tool call is asked again (the model's profile decides)."""
        ...

    async def complete(self, request: TurnRequest) -> Turn:
        """One model call. Raises `planner.errors.PlannerError` subclasses on provider failure."""
        ...

    async def aclose(self) -> None:
        """Release the HTTP client."""
        ...


@runtime_checkable
class Probeable(Protocol):
    """An adapter that can check, with one cheap call, whether its provider answers (the
    vendor adapters; the offline provider is never down)."""

    async def probe(self) -> None:
        """Return when the provider answers; raise a planner error while it does not."""
        ...


def mask_sensitive(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments safe to keep or send back: a sensitive input_text value becomes the mask (a
    lone secret reference stays: `secret_refs.stored`),
    and an argument over its limit a note of its length (`planner.tools.over_limit_noted`).

    Anything but an explicit `false` counts as sensitive (`"true"`, `1`): such a call is then
    refused as invalid, but its arguments are kept before that, and a secret must not be.
    """
    sensitive = arguments.get("sensitive", False)
    if name == "input_text" and sensitive is not False and "text" in arguments:
        return {**arguments, "text": stored(arguments["text"])}
    return over_limit_noted(name, arguments)


def sendable(value: Any) -> Any:
    """`value` (decoded JSON) with each lone surrogate in its strings replaced by U+FFFD.

    JSON may escape half of a surrogate pair (`"\\ud83d"`) and Python's decoder keeps it, but
    the SDKs cannot encode such a string: a tool call kept with one could never be sent back,
    so its corrective turn failed with "'utf-8' codec can't encode character". The call as
    the model sent it still goes to parsing (`Turn.raw_calls`), which refuses it."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {sendable(k): sendable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [sendable(v) for v in value]
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def image_media_type(data: bytes) -> str:
    """PNG or JPEG by magic number (the two formats the Decide contract allows)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"
