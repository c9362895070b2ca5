"""Conversation items → the `input` array of a stateless OpenAI Responses request.

Stateless means `store=false`, with `include=["reasoning.encrypted_content"]` when the request
reasons (`request_flags`; a model without reasoning rejects the include: 400 "Encrypted content is
not supported with this model."): nothing is kept on OpenAI's side, so every earlier output item
goes back in `input`, unchanged
(the item as received when it was stored, `phase` and all — but a reasoning item's `status`;
rebuilt from its fields otherwise)
and in the order the API produced it — reasoning items with their id, summary and encrypted
content, then the message and function_call items that followed them — and after them the
function_call_output of each call. The API rejects a reasoning item sent without the item that
followed it ("…was provided without its required following item"), so a reasoning item is only
sent when its follower is; reasoning without encrypted content cannot be resolved with
store=false and is dropped and counted, and the items after it go without their ids (the API
refuses an item whose id it ties to a reasoning item that is not there). Another provider's
reasoning never travels as reasoning: it is dropped, or sent as plain assistant text, by
setting.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from planner.conversation.items import (
    AssistantItem,
    AssistantText,
    Reasoning,
    SessionItem,
    ToolCall,
)
from planner.conversation.turns import (
    ForeignReasoning,
    ModelTurn,
    ProjectionStats,
    SessionHistoryError,
    apply_checkpoint,
    foreign_reasoning_text,
    reasoning_kept_turns,
    segment,
)
from planner.vendors.base import image_media_type
from planner.vendors.images import OPENAI_MAX_BASE64, fitted_or_noted
from planner.vendors.openai.calls import sent_arguments

ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"


def request_flags(*, reasoning: bool) -> dict[str, Any]:
    """What makes a Responses request stateless: `store=false` always, and the encrypted
    reasoning included only when the request reasons — models without reasoning (GPT-4.1,
    GPT-4o, gpt-5-chat) answer the include with 400 "Encrypted content is not supported with
    this model.". Without the include a reasoning model's items come back without encrypted
    content; the projection then leaves them out (counted), and the conversation still works."""
    flags: dict[str, Any] = {"store": False}
    if reasoning:
        flags["include"] = [ENCRYPTED_REASONING]
    return flags


@dataclass(slots=True)
class ResponsesProjection:
    """The `input` of the request plus what was left out."""

    input: list[dict[str, Any]]
    stats: ProjectionStats = field(default_factory=ProjectionStats)


def _sendable(r: Reasoning, *, keep: bool, stats: ProjectionStats) -> bool:
    if not keep:
        stats.budget_stripped += 1
        return False
    if not r.encrypted_content or not r.item_id:
        stats.unsigned_dropped += 1
        return False
    return True


def _turn_items(
    turn: ModelTurn, *, keep: bool, foreign: ForeignReasoning, stats: ProjectionStats
) -> list[dict[str, Any]]:
    own = turn.provider == "openai"
    items = turn.items
    # Decide backwards: a reasoning item goes only if the item right after it goes too.
    send = [True] * len(items)
    for i in range(len(items) - 1, -1, -1):
        entry = items[i]
        if not isinstance(entry, Reasoning) or entry.provider != "openai":
            continue
        ok = _sendable(entry, keep=keep, stats=stats)
        if ok and (i + 1 >= len(items) or not send[i + 1]):
            stats.orphan_reasoning_dropped += 1
            ok = False
        send[i] = ok

    out: list[dict[str, Any]] = []
    # Once one of the turn's own reasoning items stays out, the items after it go without their
    # ids: the API ties an output item's id to the reasoning before it, and refuses the item
    # without it ("Item 'fc_…' of type 'function_call' was provided without its required
    # 'reasoning' item: 'rs_…'."). Without an id an item is taken as new content.
    paired = own
    i = 0
    while i < len(items):
        item: AssistantItem = items[i]
        if isinstance(item, Reasoning):
            if item.provider == "openai" and not send[i]:
                paired = False
            if item.provider != "openai":
                if not keep:
                    stats.budget_stripped += 1
                elif foreign == "text" and item.readable:
                    out.append({"role": "assistant", "content": foreign_reasoning_text(item)})
                    stats.foreign_as_text += 1
                else:
                    stats.foreign_dropped += 1
            elif send[i] and item.wire is not None:
                # As received but its `status`: a replayed reasoning item carrying one was
                # refused by the API in the wild ("Unknown parameter: 'input[3].status'").
                out.append({k: v for k, v in item.wire.items() if k != "status"})
            elif send[i]:
                out.append(
                    {
                        "type": "reasoning",
                        "id": item.item_id,
                        "summary": [{"type": "summary_text", "text": s} for s in item.summary],
                        "encrypted_content": item.encrypted_content,
                    }
                )
            i += 1
        elif isinstance(item, AssistantText):
            if paired and item.item_id:
                parts = [item]
                while (
                    i + len(parts) < len(items)
                    and isinstance(nxt := items[i + len(parts)], AssistantText)
                    and nxt.item_id == item.item_id
                ):
                    parts.append(nxt)
                if item.wire is not None:
                    out.append(dict(item.wire))
                    i += len(parts)
                    continue
                out.append(
                    {
                        "type": "message",
                        "id": item.item_id,
                        "role": "assistant",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": p.text, "annotations": []}
                            for p in parts
                        ],
                    }
                )
                i += len(parts)
            else:
                if item.text:
                    out.append({"role": "assistant", "content": item.text})
                i += 1
        else:
            out.append(_function_call(item, own=paired))
            i += 1
    return out


def _function_call(call: ToolCall, *, own: bool) -> dict[str, Any]:
    arguments = sent_arguments(call)
    if own and call.wire is not None:
        return {**call.wire, "arguments": arguments}
    out: dict[str, Any] = {"type": "function_call"}
    if own and call.item_id:
        out["id"] = call.item_id
    out.update({"call_id": call.call_id, "name": call.name, "arguments": arguments})
    return out


def project_responses(
    items: Sequence[SessionItem],
    *,
    foreign_reasoning: ForeignReasoning = "drop",
    keep_reasoning_turns: int | None = None,
    images: Mapping[int, bytes] | None = None,
) -> ResponsesProjection:
    """Project a session onto Responses `input` items (send with `request_flags`).

    `images` attaches a screenshot to the observation at that item index, before its text
    (compact mode; a kept session carries none).

    Observations before the latest checkpoint are condensed, as for Anthropic. Encrypted
    reasoning is not bound to its prefix, so `keep_reasoning_turns` may strip the reasoning of
    all but the last N turns at every step (the API ignores reasoning from before the last
    user message anyway); the following-item rule is kept either way.
    """
    stats = ProjectionStats()
    shots = {id(items[i]): data for i, data in (images or {}).items() if 0 <= i < len(items)}
    budget = apply_checkpoint(items)
    stats.condensed_observations = budget.condensed
    segments = segment(budget.items)
    kept = reasoning_kept_turns(segments, keep_reasoning_turns)
    out: list[dict[str, Any]] = []
    pending: set[str] = set()
    for index, seg in enumerate(segments):
        if isinstance(seg, ModelTurn):
            if pending:
                raise SessionHistoryError(f"tool call(s) without a result: {sorted(pending)}")
            out.extend(_turn_items(seg, keep=index in kept, foreign=foreign_reasoning, stats=stats))
            pending.update(c.call_id for c in seg.tool_calls)
            continue
        for result in seg.results:
            if result.call_id not in pending:
                raise SessionHistoryError(
                    f"tool result for {result.call_id!r} answers no tool call of the previous turn"
                )
            pending.discard(result.call_id)
            output = f"Error: {result.output}" if result.is_error else result.output
            out.append(
                {"type": "function_call_output", "call_id": result.call_id, "output": output}
            )
        if pending:
            raise SessionHistoryError(f"tool call(s) without a result: {sorted(pending)}")
        for obs in seg.observations:
            if obs.text:
                content: list[dict[str, Any]] = [{"type": "input_text", "text": obs.text}]
                if id(obs) in shots:
                    content.insert(0, _input_image(shots[id(obs)], stats))
                out.append({"role": "user", "content": content})
    if pending:
        raise SessionHistoryError(f"tool call(s) without a result: {sorted(pending)}")
    return ResponsesProjection(out, stats)


def _input_image(screenshot: bytes, stats: ProjectionStats) -> dict[str, Any]:
    """The screenshot as an input image within OpenAI's per-image limit, or input text saying
    it was left out (`planner/vendors/images.py`)."""
    data = fitted_or_noted(screenshot, OPENAI_MAX_BASE64, "OpenAI", stats)
    if isinstance(data, str):
        return {"type": "input_text", "text": data}
    url = f"data:{image_media_type(data)};base64," + base64.b64encode(data).decode("ascii")
    return {"type": "input_image", "image_url": url, "detail": "auto"}
