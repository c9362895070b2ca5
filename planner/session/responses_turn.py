"""One stateless OpenAI Responses call of a session, streamed or not, turned into session items."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import openai

from planner.decision import Usage
from planner.session.config import ThinkingConfig
from planner.session.items import AssistantItem, AssistantText, Reasoning, ToolCall
from planner.session.provider_turn import TurnResult, fetch_response, mask_sensitive
from planner.session.responses_projection import REQUEST_FLAGS
from planner.session.streaming import ResponsesStreamAccumulator, ThinkingSink
from planner.tools import ToolSpec


def request_params(
    *,
    model: str,
    system: str,
    input_items: list[dict[str, Any]],
    tools: Sequence[ToolSpec],
    thinking: ThinkingConfig,
    forced: bool,
    max_tokens: int,
) -> dict[str, Any]:
    """The request body: stateless (`store=false`, encrypted reasoning included)."""
    params: dict[str, Any] = {
        "model": model,
        "instructions": system,
        "input": input_items,
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in tools
        ],
        "tool_choice": "required" if forced else "auto",
        "parallel_tool_calls": False,
        "max_output_tokens": max_tokens,
        **{k: list(v) if isinstance(v, list) else v for k, v in REQUEST_FLAGS.items()},
    }
    if thinking.enabled:
        params["reasoning"] = {"effort": thinking.effort or "medium", "summary": "auto"}
    return params


def items_from_response(response: dict[str, Any]) -> list[AssistantItem]:
    """A response's output items as session items, in their order, nothing rewritten (the
    function-call arguments string is kept byte for byte, except a masked sensitive value and
    unreadable input_text arguments, which may hold the text)."""
    turn_id = str(response.get("id") or "")
    out: list[AssistantItem] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "reasoning":
            out.append(
                Reasoning(
                    "openai",
                    turn_id,
                    text="\n".join(c.get("text", "") for c in item.get("content") or []),
                    encrypted_content=item.get("encrypted_content"),
                    item_id=item.get("id"),
                    summary=tuple(s.get("text", "") for s in item.get("summary") or []),
                    wire=dict(item),
                )
            )
        elif kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    out.append(
                        AssistantText(
                            "openai", turn_id, part.get("text", ""), item.get("id"), dict(item)
                        )
                    )
        elif kind == "function_call":
            name = str(item.get("name") or "")
            raw = str(item.get("arguments") or "")
            try:
                parsed = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError:
                parsed = None
            args = parsed if isinstance(parsed, dict) else {}
            masked = mask_sensitive(name, args)
            if masked is not args or (name == "input_text" and not isinstance(parsed, dict)):
                # Unreadable input_text arguments may still hold the text: never keep them raw.
                raw = json.dumps(masked, ensure_ascii=False)
            out.append(
                ToolCall(
                    "openai",
                    turn_id,
                    str(item.get("call_id") or ""),
                    name,
                    masked,
                    raw_arguments=raw,
                    item_id=item.get("id"),
                    wire={**item, "arguments": raw},
                )
            )
    return out


def usage_from(usage: dict[str, Any] | None) -> Usage:
    u = usage or {}
    cached = (u.get("input_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
    return Usage(
        input_tokens=int(u.get("input_tokens") or 0),
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_input_tokens=int(cached),
        thinking_tokens=int(reasoning),
    )


async def responses_turn(
    client: openai.AsyncOpenAI,
    *,
    params: dict[str, Any],
    stream: bool,
    on_thinking: ThinkingSink | None = None,
) -> TurnResult:
    """Run one call; with `stream`, reasoning summary deltas go to `on_thinking` live."""
    acc = ResponsesStreamAccumulator(on_thinking)
    streamed = (acc.feed, acc.response) if stream else None
    response = await fetch_response(client.responses.create, params, "openai", streamed)
    return TurnResult(
        turn_id=str(response.get("id") or ""),
        items=items_from_response(response),
        usage=usage_from(response.get("usage")),
        model=str(response.get("model") or params["model"]),
        stop_reason=response.get("status"),
        request=params,
        raw_calls={
            str(i.get("call_id")): i.get("arguments")
            for i in response.get("output") or []
            if i.get("type") == "function_call"
        },
    )
