"""The OpenAI Chat Completions wire format (compact mode): items → messages, request body,
reply → items, usage.

`tool_choice="auto"` first so `message.content` (the rationale) can come with the tool call;
`"required"` for the forced retry. `parallel_tool_calls` is off (one action per step) where the
model takes the parameter; the o-series refuse it, and get none.
OpenAI-compatible reasoning servers return `message.reasoning_content`; it becomes a reasoning
item, and it is sent back on the assistant message of a follow-up turn, as some servers require.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from planner.conversation.items import (
    AssistantItem,
    AssistantText,
    Reasoning,
    SessionItem,
    ToolResult,
)
from planner.conversation.turns import ModelTurn, ProjectionStats, segment
from planner.decision import Usage
from planner.settings import THINKING_MAX_TOKENS
from planner.tools import ToolSpec
from planner.vendors.base import image_media_type
from planner.vendors.images import OPENAI_MAX_BASE64, fitted_or_noted
from planner.vendors.openai.calls import (
    CONTENT_FILTERED,
    arguments_text,
    function_call,
    sent_arguments,
)


def project_chat(
    system: str,
    items: Sequence[SessionItem],
    images: Mapping[int, bytes] | None = None,
    stats: ProjectionStats | None = None,
) -> list[dict[str, Any]]:
    """The `messages` array: the system prompt, then each item in order. A model turn is one
    assistant message (its text, tool calls and reasoning_content); a tool result is a `tool`
    message; an observation with a screenshot carries the image before its text (`stats`
    keeps the note sent in place of one that could not be made to fit)."""
    stats = stats if stats is not None else ProjectionStats()
    shots = {id(items[i]): data for i, data in (images or {}).items() if 0 <= i < len(items)}
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for seg in segment(items):
        if isinstance(seg, ModelTurn):
            out.append(_assistant(seg))
            continue
        for item in seg.items:
            if isinstance(item, ToolResult):
                content = f"ERROR: {item.output}" if item.is_error else item.output
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
            elif id(item) in shots:
                out.append(
                    {
                        "role": "user",
                        "content": [
                            _image_part(shots[id(item)], stats),
                            {"type": "text", "text": item.text},
                        ],
                    }
                )
            else:
                out.append({"role": "user", "content": item.text})
    return out


def _image_part(screenshot: bytes, stats: ProjectionStats) -> dict[str, Any]:
    """The screenshot as an image part within OpenAI's per-image limit, or a text part saying
    it was left out (`planner/vendors/images.py`)."""
    data = fitted_or_noted(screenshot, OPENAI_MAX_BASE64, "OpenAI", stats)
    if isinstance(data, str):
        return {"type": "text", "text": data}
    url = f"data:{image_media_type(data)};base64," + base64.b64encode(data).decode("ascii")
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant(turn: ModelTurn) -> dict[str, Any]:
    texts = [t.text for t in turn.texts if t.text.strip()]
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": sent_arguments(call)},
            }
            for call in turn.tool_calls
        ]
    reasoning = "".join(r.text for r in turn.reasoning if r.provider == "openai")
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def request_params(
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: Sequence[ToolSpec],
    forced: bool,
    max_tokens: int,
    reasoning_effort: str | None = None,
    parallel_tool_calls: bool = True,
) -> dict[str, Any]:
    """The request body; `reasoning_effort` only for reasoning models (the others reject the
    parameter; `none` asks one not to reason); `parallel_tool_calls: false` only where the model
    takes the parameter (extra calls are answered "not executed" either way)."""
    params: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in tools
        ],
        "tool_choice": "required" if forced else "auto",
        "max_completion_tokens": max_tokens,
    }
    if parallel_tool_calls:
        params["parallel_tool_calls"] = False
    if reasoning_effort is not None:
        params["reasoning_effort"] = reasoning_effort
    if reasoning_effort not in (None, "none"):
        # reasoning tokens count toward max_completion_tokens
        params["max_completion_tokens"] = max(max_tokens, THINKING_MAX_TOKENS)
    return params


def items_from_completion(completion: Mapping[str, Any]) -> list[AssistantItem]:
    """The first choice's message as items: reasoning_content, content (a string, or each text
    part of a list: `_content_parts`), tool calls."""
    turn_id = str(completion.get("id") or "")
    message = (completion.get("choices") or [{}])[0].get("message") or {}
    out: list[AssistantItem] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out.append(Reasoning("openai", turn_id, text=reasoning))
    out.extend(AssistantText("openai", turn_id, t) for t in _content_parts(message)[0] if t)
    for call in message.get("tool_calls") or []:
        function = call.get("function")
        if not isinstance(function, dict):
            continue
        out.append(
            function_call(
                turn_id,
                call_id=str(call.get("id") or ""),
                name=str(function.get("name") or ""),
                raw=arguments_text(function.get("arguments")),
            )
        )
    return out


def _content_parts(message: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The texts and the refusals of a message's `content`: a string (OpenAI's own answers),
    or a list of content parts, the form the API reference gives an assistant message's
    content (`{"type": "text", "text": …}`, `{"type": "refusal", "refusal": …}`) and some
    OpenAI-compatible servers answer in. Read only as a string, such a list was dropped: its
    rationale lost, a refusal in it read as "no tool call" and asked again. Other parts (a
    newer type, a server's own) hold nothing to read here."""
    content = message.get("content")
    if isinstance(content, str):
        return [content], []
    texts: list[str] = []
    refusals: list[str] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, Mapping):
            continue
        kind, value = part.get("type"), part.get(str(part.get("type")))
        if kind == "text" and isinstance(value, str):
            texts.append(value)
        elif kind == "refusal" and isinstance(value, str) and value.strip():
            refusals.append(value.strip())
    return texts, refusals


def raw_calls(completion: Mapping[str, Any]) -> list[Any]:
    """Each call's arguments string exactly as the model sent it (for execution only), in the
    order of the calls `items_from_completion` reads. A list, not keyed by id: an
    OpenAI-compatible server may send every call with the same (empty) id."""
    message = (completion.get("choices") or [{}])[0].get("message") or {}
    return [
        (call.get("function") or {}).get("arguments") or ""
        for call in message.get("tool_calls") or []
        if isinstance(call.get("function"), dict)
    ]


def refusal(completion: Mapping[str, Any]) -> str | None:
    """The first choice's `message.refusal` or a refusal part of its content (the model
    declined), or — for an answer the provider's content filter stopped (`finish_reason:
    "content_filter"`) — words saying so; None for an answer. Asked again unchanged, the
    filter stops it again: never retried.

    Only a refusal with words is one: some OpenAI-compatible servers send `"refusal": ""`
    beside every answer, its `tool_calls` included (OpenAI sends `null`), and read as a
    refusal that answer failed the decision with nothing run."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("refusal")
    if isinstance(text, str) and text.strip():
        return text.strip()
    parts = _content_parts(message)[1]  # a refusal part of a list content
    if parts:
        return "\n".join(parts)
    if choice.get("finish_reason") == "content_filter":
        return CONTENT_FILTERED + " (finish_reason content_filter)"
    return None


def stop_reason(completion: Mapping[str, Any]) -> str | None:
    choice = (completion.get("choices") or [{}])[0]
    reason = choice.get("finish_reason")
    return str(reason) if reason is not None else None


def usage_from(usage: Mapping[str, Any] | None) -> Usage:
    """Chat usage counts the prompt tokens read from the cache and those written to it inside
    `prompt_tokens`: they are reported apart, so each is priced once."""
    u = usage or {}
    prompt = u.get("prompt_tokens_details") or {}
    completion = u.get("completion_tokens_details") or {}
    cached = int(prompt.get("cached_tokens") or 0)
    written = int(prompt.get("cache_write_tokens") or 0)
    return Usage(
        input_tokens=int(u.get("prompt_tokens") or 0) - cached - written,
        output_tokens=int(u.get("completion_tokens") or 0),
        cache_read_input_tokens=cached,
        cache_creation_input_tokens=written,
        thinking_tokens=int(completion.get("reasoning_tokens") or 0),
    )
