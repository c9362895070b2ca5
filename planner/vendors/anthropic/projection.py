"""Conversation items → the `messages` array of an Anthropic Messages request (both modes).

The rules this module exists to keep (each one a known failure mode elsewhere):

- One model turn is ONE assistant message, echoed exactly as the API returned it: thinking and
  redacted_thinking blocks (which the API puts first), then the text, then the tool_use — never
  split into several assistant messages, never reordered (a moved thinking block fails the
  signature check just like an edited one). Thinking goes back unmodified with its signature,
  also when its text is empty (a signature-only block is valid and must be kept); redacted
  thinking goes back as `redacted_thinking` with its data; Anthropic reasoning with neither is
  dropped and counted.
- Signatures go back only to Anthropic, and only to the model that wrote them (they are
  model-bound: a session continued on another Claude model was refused with "Invalid
  `signature` in `thinking` block"). Reasoning another provider or model made is dropped, or
  sent as a plain text block, by setting (`foreign_reasoning`).
- The tool results of a turn form one user message whose tool_result blocks come first, followed
  by the new observation.
- Append-only: the projection of a turn never depends on how many steps came after it, so the
  request prefix stays byte-identical from one step to the next. Claude models with preserved
  thinking bind each thinking block to everything before it (system, tools, earlier messages);
  a projection that re-rendered old turns would invalidate every later thinking block.
- With thinking on, a tool-calling turn without a thinking block Anthropic would accept
  (another provider made it, the forced retry ran without thinking, or its reasoning fell
  before a checkpoint) is always sent as plain text, with its results as text: the API requires
  the assistant message before the last tool results to start with thinking, and rendering such
  a turn the same way at every step keeps the prefix stable.
- Context budget (`ContextCheckpoint` items, placed by the planner): observations before the
  checkpoint's `keep_from` are condensed and reasoning made before the checkpoint is no longer
  sent — its prefix changed, so it would be rejected. Between checkpoints nothing old changes.
- With thinking off (the forced retry), no thinking block is sent at all.
- A call id the API would refuse (another server's "functions.tap:0") goes in a form it takes,
  the same at every step (`wire_id`); the conversation keeps the id as received.
- A content block of a type this code does not read (`server_tool_use`,
  `web_search_tool_result`, a newer one: `AssistantText.opaque`) goes back as received, in its
  place in the turn: dropped, the turn was not sent back complete. In a turn sent as text it is
  left out and counted, and so it is after a switch to another Claude model: it may be signed
  (a compaction summary is) and so bound to its model as thinking is, and the turn it completed
  lost its thinking to the switch anyway.
- No assistant message ends in a thinking block: the API refuses one ("The final block in an
  assistant message cannot be `thinking`"). A turn of thinking alone (an answer without a call
  that got the forced retry, one cut off at the output limit while thinking, thinking and a
  whitespace text) goes without its trailing thinking, or not at all: only the thinking of a
  tool-use turn must come back, and such a turn ends in its tool_use.
- A text block holding only whitespace (Claude does answer "\n\n") is not sent back: the API
  rejects it ("text content blocks must contain non-whitespace text"). Only the thinking blocks
  must come back unmodified, so leaving it out is allowed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.conversation.items import (
    AssistantText,
    Reasoning,
    SessionItem,
    ToolResult,
    UserObservation,
)
from planner.conversation.turns import (
    ForeignReasoning,
    ProjectionStats,
    SessionHistoryError,
    UserSide,
    apply_checkpoint,
    foreign_reasoning_text,
    segment,
)
from planner.vendors.base import image_media_type
from planner.vendors.images import ANTHROPIC_MAX_BASE64, ANTHROPIC_MAX_SIDE, fitted_or_noted


@dataclass(slots=True)
class AnthropicProjection:
    """The `messages` of the request plus what was left out."""

    messages: list[dict[str, Any]]
    stats: ProjectionStats = field(default_factory=ProjectionStats)


#: The tool_use ids the API takes (its own are `toolu_…`); others are refused with 400
#: "messages.N.content.M.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'".
_TAKEN_ID = re.compile(r"[a-zA-Z0-9_-]+")


#: The reasoning block types; none may end an assistant message.
_THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})


def wire_id(call_id: str) -> str:
    """`call_id` as the API takes it back in a tool_use block and its tool_result. An id of
    another form (an Anthropic-compatible server's or a proxy's, "functions.tap:0"; a call
    another provider made) was sent as it was, and the API refused every later request of the
    conversation. Such an id goes as its allowed characters plus a digest of the whole id: the
    same at every step (the request prefix stays byte-identical), and no two ids meet. The
    conversation keeps the id as received: the host names the call by it."""
    if _TAKEN_ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:16]
    return f"{re.sub(r'[^a-zA-Z0-9_-]', '_', call_id)}_{digest}"


def call_as_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call rendered as text, for a turn that cannot be sent as a tool_use."""
    args = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    return f"[called tool {name} with {args}]"


def result_as_text(name: str, result: ToolResult) -> str:
    """A tool result rendered as text, paired with `call_as_text`."""
    status = "error" if result.is_error else "result"
    return f"[{status} of tool {name}]\n{result.output}"


def _own(r: Reasoning | AssistantText, model: str | None) -> bool:
    """Reasoning (or a kept block) `model` may get back as received: Anthropic's, written by
    that model (an item recorded without its model counts as the current model's)."""
    return r.provider == "anthropic" and (model is None or r.model in (None, model))


def _deliverable(r: Reasoning, model: str | None) -> bool:
    return _own(r, model) and (bool(r.signature) or bool(r.redacted_data))


def _reasoning_block(
    r: Reasoning,
    *,
    model: str | None,
    valid: bool,
    foreign: ForeignReasoning,
    stats: ProjectionStats,
) -> dict[str, Any] | None:
    """The block one reasoning item becomes in a natively sent turn, or None."""
    if not _own(r, model):
        if foreign == "text" and r.readable:
            stats.foreign_as_text += 1
            return {"type": "text", "text": foreign_reasoning_text(r)}
        stats.foreign_dropped += 1
        return None
    if not valid:
        stats.budget_stripped += 1
        return None
    if r.signature:
        return {"type": "thinking", "thinking": r.text, "signature": r.signature}
    if r.redacted_data:
        return {"type": "redacted_thinking", "data": r.redacted_data}
    stats.unsigned_dropped += 1
    return None


def project_anthropic(
    items: Sequence[SessionItem],
    *,
    thinking: bool,
    model: str | None = None,
    foreign_reasoning: ForeignReasoning = "drop",
    images: Mapping[int, bytes] | None = None,
) -> AnthropicProjection:
    """Project a conversation onto Anthropic `messages` for `model` (None: any Claude model's
    thinking counts as its own). `images` attaches a screenshot to the observation at that
    item index (before its text). Raises SessionHistoryError when the
    history itself is malformed (a tool call without a result, two model turns in a row)."""
    stats = ProjectionStats()
    shots = {id(items[i]): data for i, data in (images or {}).items() if 0 <= i < len(items)}
    budget = apply_checkpoint(items)
    stats.condensed_observations = budget.condensed
    segments = segment(budget.items)
    if not segments or not isinstance(segments[0], UserSide):
        raise SessionHistoryError("a session must start with a user observation")

    messages: list[dict[str, Any]] = []
    text_calls: dict[str, str] = {}  # call id -> tool name, for calls rendered as text
    pending: dict[str, str] = {}  # call id -> tool name, waiting for a tool_result
    for seg in segments:
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
                        "tool_use_id": wire_id(item.call_id),
                        "content": item.output,
                    }
                    if item.is_error:
                        block["is_error"] = True
                    content.append(block)
                elif item.text:
                    if isinstance(item, UserObservation) and id(item) in shots:
                        texts.append(_image_block(shots[id(item)], stats))
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
        valid = thinking and seg.start > budget.checkpoint_at
        if not thinking:
            stats.thinking_off_dropped += sum(1 for r in seg.reasoning if _deliverable(r, model))
        sendable = valid and any(_deliverable(r, model) for r in seg.reasoning)
        out: list[dict[str, Any]] = []
        if thinking and seg.tool_calls and not sendable:
            stats.turns_as_text += 1
            for part in seg.items:
                if isinstance(part, Reasoning):
                    if not _own(part, model) and foreign_reasoning == "text" and part.readable:
                        out.append({"type": "text", "text": foreign_reasoning_text(part)})
                        stats.foreign_as_text += 1
                    elif not _own(part, model):
                        stats.foreign_dropped += 1
                    else:
                        stats.budget_stripped += 1
                elif isinstance(part, AssistantText):
                    if part.opaque:
                        stats.opaque_dropped += 1
                    elif part.text.strip():
                        out.append({"type": "text", "text": part.text})
                else:
                    out.append({"type": "text", "text": call_as_text(part.name, part.arguments)})
                    text_calls[part.call_id] = part.name
            _append(messages, "assistant", out)
            continue
        for part in seg.items:
            if isinstance(part, Reasoning):
                if not thinking and part.provider == "anthropic":
                    continue
                rendered = _reasoning_block(
                    part, model=model, valid=valid, foreign=foreign_reasoning, stats=stats
                )
                if rendered is not None:
                    out.append(rendered)
            elif isinstance(part, AssistantText):
                if part.opaque and part.wire is not None:
                    if _own(part, model) and _answerable(part.wire, seg.items):
                        out.append(dict(part.wire))
                    else:
                        stats.opaque_dropped += 1
                elif part.text.strip():
                    out.append({"type": "text", "text": part.text})
            else:
                out.append(
                    {
                        "type": "tool_use",
                        "id": wire_id(part.call_id),
                        "name": part.name,
                        "input": part.arguments,
                    }
                )
                pending[part.call_id] = part.name
        while out and out[-1]["type"] in _THINKING_TYPES:
            out.pop()  # a turn of thinking alone, or with nothing sendable after it
            stats.trailing_thinking_dropped += 1
        _append(messages, "assistant", out)
    if pending:
        raise SessionHistoryError(f"tool call(s) without a result: {sorted(pending)}")
    return AnthropicProjection(messages, stats)


def _answerable(block: Mapping[str, Any], turn: Sequence[Any]) -> bool:
    """Whether a block the planner does not read may go back as received. A server tool's
    call cut off by the output limit holds its partial input as text and has no result: the
    API takes an input only as an object and refuses a server tool's call without its result
    block in the same turn (anthropic-sdk-python#961), so such a call is left out."""
    if "input" in block and not isinstance(block["input"], dict):
        return False
    if not str(block.get("type", "")).endswith("tool_use") or "id" not in block:
        return True
    return any(
        isinstance(part, AssistantText)
        and part.wire is not None
        and part.wire.get("tool_use_id") == block["id"]
        for part in turn
    )


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


def _image_block(screenshot: bytes, stats: ProjectionStats) -> dict[str, Any]:
    """The screenshot as an image block within the API's 5 MB of base64 (re-encoded at the
    same size where needed) and 8,000 pixels a side, or a text block saying it was left out."""
    data = fitted_or_noted(
        screenshot, ANTHROPIC_MAX_BASE64, "Anthropic", stats, max_side=ANTHROPIC_MAX_SIDE
    )
    if isinstance(data, str):
        return {"type": "text", "text": data}
    return {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": image_media_type(data),
            "data": base64.b64encode(data).decode("ascii"),
        },
    }
