"""One Anthropic Messages call of a session, streamed or not, turned into session items."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anthropic

from planner.decision import Usage
from planner.session.config import ThinkingConfig
from planner.session.items import AssistantItem, AssistantText, Reasoning, ToolCall
from planner.session.provider_turn import TurnResult, fetch_response, mask_sensitive
from planner.session.streaming import AnthropicStreamAccumulator, ThinkingSink
from planner.settings import ANSWER_ROOM_TOKENS
from planner.tools import ToolSpec

INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"


def request_params(
    *,
    model: str,
    system: str,
    messages: list[dict[str, Any]],
    tools: Sequence[ToolSpec],
    thinking: ThinkingConfig,
    forced: bool,
    max_tokens: int,
) -> dict[str, Any]:
    """The request body. The forced retry (`tool_choice: any`) runs with thinking disabled:
    that is the only combination every model accepts."""
    params: dict[str, Any] = {
        "model": model,
        "system": system,
        "messages": messages,
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in tools
        ],
        "tool_choice": {"type": "any" if forced else "auto", "disable_parallel_tool_use": True},
        "max_tokens": max_tokens,
    }
    if not forced and thinking.mode == "budget" and thinking.budget_tokens is not None:
        params["thinking"] = {"type": "enabled", "budget_tokens": thinking.budget_tokens}
        params["max_tokens"] = max(max_tokens, thinking.budget_tokens + ANSWER_ROOM_TOKENS)
        params["extra_headers"] = {"anthropic-beta": INTERLEAVED_THINKING_BETA}
    elif not forced and thinking.mode == "adaptive":
        params["thinking"] = {"type": "adaptive"}
        if thinking.effort:
            params["output_config"] = {"effort": thinking.effort}
    else:
        # Said explicitly: models with preserved thinking think adaptively when `thinking` is
        # left out, and some of them reject adaptive thinking with a forced tool_choice.
        params["thinking"] = {"type": "disabled"}
    return params


def items_from_message(message: dict[str, Any]) -> list[AssistantItem]:
    """A Messages response's content blocks as items, in their order, nothing rewritten."""
    turn_id = str(message.get("id") or "")
    out: list[AssistantItem] = []
    for block in message.get("content") or []:
        kind = block.get("type")
        if kind == "thinking":
            out.append(
                Reasoning(
                    "anthropic",
                    turn_id,
                    text=block.get("thinking") or "",
                    signature=block.get("signature") or None,
                )
            )
        elif kind == "redacted_thinking":
            out.append(Reasoning("anthropic", turn_id, redacted_data=block.get("data") or None))
        elif kind == "text":
            out.append(AssistantText("anthropic", turn_id, block.get("text") or ""))
        elif kind == "tool_use":
            name = str(block.get("name") or "")
            args = block.get("input")
            out.append(
                ToolCall(
                    "anthropic",
                    turn_id,
                    str(block.get("id") or ""),
                    name,
                    mask_sensitive(name, dict(args) if isinstance(args, dict) else {}),
                )
            )
    return out


def usage_from(usage: dict[str, Any] | None) -> Usage:
    u = usage or {}
    return Usage(
        input_tokens=int(u.get("input_tokens") or 0),
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_input_tokens=int(u.get("cache_read_input_tokens") or 0),
        cache_creation_input_tokens=int(u.get("cache_creation_input_tokens") or 0),
    )


async def anthropic_turn(
    client: anthropic.AsyncAnthropic,
    *,
    params: dict[str, Any],
    stream: bool,
    on_thinking: ThinkingSink | None = None,
) -> TurnResult:
    """Run one call. With `stream`, live thinking goes to `on_thinking` as it arrives and the
    committed turn is built from the completed stream only."""
    acc = AnthropicStreamAccumulator(on_thinking)
    streamed = (acc.feed, acc.message) if stream else None
    message = await fetch_response(client.messages.create, params, "anthropic", streamed)
    return TurnResult(
        turn_id=str(message.get("id") or ""),
        items=items_from_message(message),
        usage=usage_from(message.get("usage")),
        model=str(message.get("model") or params["model"]),
        stop_reason=message.get("stop_reason"),
        request=params,
        raw_calls={
            str(b.get("id")): b.get("input")
            for b in message.get("content") or []
            if b.get("type") == "tool_use"
        },
    )
