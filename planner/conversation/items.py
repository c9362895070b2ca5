"""The typed items every conversation with a model is made of, and their exact JSON form.

Both planning modes speak in these items: a compact decision is a short conversation kept in
memory (the prompt, and the model's answer plus a correction when one is needed); a session is a
long one kept in a store. What the user side said (an observation, a tool result) and what one
model turn produced (reasoning, text, tool calls) are items, not provider messages: each
vendor's projection (`planner/vendors/`) turns the same list into its own wire format, so a
session survives a provider switch and a restart. Reasoning is stored exactly as the provider
returned it — Anthropic signatures, redacted data and OpenAI encrypted content are opaque
strings that must go back byte for byte — so nothing here ever rewrites them, and the JSON form
maps each field one to one.
One more item, `ContextCheckpoint`, is never sent: it records a context-budget decision so that
every later request renders the history the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

#: Who made an assistant item ("offline" for the built-in heuristic, whose turns are never kept).
ProviderName = Literal["anthropic", "openai", "offline"]


@dataclass(frozen=True, slots=True)
class UserObservation:
    """What the user side said: a screen observation, or an instruction (a nudge to call a tool).

    `condensed` is the short form used once the observation is older than the last K scenes
    (the context budget); instructions are never condensed.
    """

    text: str
    condensed: str | None = None
    kind: Literal["observation", "instruction"] = "observation"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """One reasoning block of one model turn, as received.

    Anthropic: `text` + `signature` (a thinking block; the text may be empty when the model was
    asked to omit it), or `redacted_data` (a redacted_thinking block). OpenAI Responses:
    `item_id` + `summary` + `encrypted_content` (`text` holds the reasoning text when the API
    returned any). `provider` is who made it: a signature is only ever sent back to its maker.
    `model` (Anthropic) is the configured model whose call made it: Claude signatures are bound
    to the model that wrote them, so after a model change they go to no other (None: recorded
    before models were kept, taken as the current model's).
    `wire` (Responses) is the output item exactly as received, sent back verbatim.
    """

    provider: ProviderName
    turn_id: str
    text: str = ""
    signature: str | None = None
    redacted_data: str | None = None
    encrypted_content: str | None = None
    item_id: str | None = None
    summary: tuple[str, ...] = ()
    wire: dict[str, Any] | None = None
    model: str | None = None

    @property
    def readable(self) -> str:
        """Text a person (or another provider, as plain text) can read: thinking or summary."""
        return self.text or "\n".join(self.summary)


@dataclass(frozen=True, slots=True)
class AssistantText:
    """Text the model wrote in a turn (the rationale). For Responses, `item_id` is the message
    item's id and `wire` the whole message item as received (with its `phase`, which newer
    models need back); a message with several text parts gives one item per part, same wire.

    An Anthropic one with a `wire` and no text is a content block of a type this code does not
    read (`server_tool_use`, `web_search_tool_result`, a type newer than it: `opaque`), kept
    in its place in the turn and sent back to Anthropic as received: the API wants an
    assistant turn back complete. An item, not a type of its own, so a replica that does not
    know it reads it as an empty text and leaves it out, as it did before. Its `model` is the
    configured model whose call made it, as for `Reasoning`: such a block may be bound to that
    model as a thinking signature is, so it goes back to no other."""

    provider: ProviderName
    turn_id: str
    text: str
    item_id: str | None = None
    wire: dict[str, Any] | None = None
    model: str | None = None

    @property
    def opaque(self) -> bool:
        """A content block kept as received, not text (see the class)."""
        return self.provider == "anthropic" and self.wire is not None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call of a turn. `raw_arguments` keeps the Responses JSON string exactly as sent.

    A sensitive `input_text` value is masked before the call is committed (it is executed from
    the decision, never stored), so `arguments` here may differ from what was executed; the
    Responses `wire` item carries the same masked arguments.
    `cut_off`: the answer reached the output token limit, so the arguments may be cut off
    mid-way: never executed (`planner.deciding`). Kept with the call so that a step resumed
    from the stored conversation (its decision failed on a write after the turn was kept)
    knows it too; stored only when set, so other calls' JSON is as before.
    """

    provider: ProviderName
    turn_id: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str | None = None
    item_id: str | None = None
    wire: dict[str, Any] | None = None
    cut_off: bool = False


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one tool call, sent back to the model on the user side."""

    call_id: str
    output: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ContextCheckpoint:
    """A durable context-budget decision: from here on, observations before item index
    `keep_from` are sent in their condensed form and reasoning made before this checkpoint is
    no longer sent to Anthropic.

    It is an item (stored, never sent) rather than a rule recomputed each step because the
    request prefix must stay byte-identical between checkpoints: Claude models with preserved
    thinking bind every thinking block to everything before it, so a sliding window that
    condensed one more observation each step would invalidate the thinking after it.
    """

    keep_from: int


SessionItem = (
    UserObservation | Reasoning | AssistantText | ToolCall | ToolResult | ContextCheckpoint
)
AssistantItem = Reasoning | AssistantText | ToolCall

_TYPE_OF: dict[type[Any], str] = {
    UserObservation: "user_observation",
    Reasoning: "reasoning",
    AssistantText: "assistant_text",
    ToolCall: "tool_call",
    ToolResult: "tool_result",
    ContextCheckpoint: "context_checkpoint",
}


def item_type(item: SessionItem) -> str:
    """The item's type name in its JSON form ("reasoning", "tool_call", …)."""
    return _TYPE_OF[type(item)]


def is_assistant(item: SessionItem) -> bool:
    """True for what a model turn produced (reasoning, text, tool call)."""
    return isinstance(item, Reasoning | AssistantText | ToolCall)


def unanswered_calls(items: Sequence[SessionItem]) -> list[str]:
    """Call ids of tool calls that have no result yet, oldest first."""
    pending: dict[str, None] = {}
    for item in items:
        if isinstance(item, ToolCall):
            pending[item.call_id] = None
        elif isinstance(item, ToolResult):
            pending.pop(item.call_id, None)
    return list(pending)


def item_to_dict(item: SessionItem) -> dict[str, Any]:
    """The JSON-ready form: `{"type": ..., **fields}`; every string field is kept verbatim.

    A reasoning item's or a kept block's model travels in its provider
    ("anthropic/claude-opus-4-8"), not as a key of its own: replicas from before it was
    recorded fail on a key they do not know, and during a rolling deploy they read what newer
    ones wrote. To them such an item is another provider's reasoning, which every version
    leaves out (or sends as text), or an empty text, left out, instead of failing the step; to
    this version it is the model's own (`item_from_dict`)."""
    out: dict[str, Any] = {"type": _TYPE_OF[type(item)]}
    for f in fields(item):
        value = getattr(item, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    if isinstance(item, _MODEL_IN_PROVIDER):
        model = out.pop("model")
        if model:
            out["provider"] = f"{item.provider}/{model}"
    if isinstance(item, ToolCall) and not item.cut_off:
        del out["cut_off"]
    return out


_CLASS_OF: dict[str, type[Any]] = {name: cls for cls, name in _TYPE_OF.items()}
#: The items whose model travels in their provider (`item_to_dict`).
_MODEL_IN_PROVIDER = (Reasoning, AssistantText)


def item_from_dict(data: dict[str, Any]) -> SessionItem:
    """Inverse of `item_to_dict`. Raises ValueError on an unknown type or a missing field.

    Fields this version does not know are left out: items are shared by every replica of a
    deployment, so during a rolling deploy one may read an item a newer replica wrote."""
    kind = data.get("type")
    cls = _CLASS_OF.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown session item type {kind!r}")
    known = {f.name for f in fields(cls)}
    values = {k: v for k, v in data.items() if k in known}
    if cls is Reasoning:
        values["summary"] = tuple(values.get("summary", ()))
    if cls in _MODEL_IN_PROVIDER:
        provider, _, model = str(values.get("provider", "")).partition("/")
        if model:
            values["provider"], values["model"] = provider, model
    try:
        item: SessionItem = cls(**values)
    except TypeError as err:
        raise ValueError(f"session item of type {kind!r} is malformed: {err}") from None
    return item


def dumps_item(item: SessionItem) -> str:
    """One item as compact JSON. `ensure_ascii=False` keeps the text readable; JSON string
    escaping is lossless either way, so signatures and encrypted content load back identical."""
    return json.dumps(item_to_dict(item), ensure_ascii=False, separators=(",", ":"))


def loads_item(text: str) -> SessionItem:
    """Inverse of `dumps_item`."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("a session item must be a JSON object")
    return item_from_dict(data)
