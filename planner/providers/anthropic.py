"""Anthropic Messages API through the official SDK (`AsyncAnthropic(base_url=...)`).

`tool_choice` is `auto` with parallel tool use disabled, so the model may write its rationale and
think before the one tool call. Thinking is configured, not tied to a model generation: `adaptive`
(with an optional effort in `output_config`) or `budget` (`enabled` + `budget_tokens`, max_tokens
above the budget, the interleaved-thinking beta header). A request with `tool_choice="required"`
(the planner's forced retry) becomes `{type: any}` and never carries thinking: the API rejects
thinking with a forced tool choice.
"""

from __future__ import annotations

import base64
from typing import Any

import anthropic

from planner.decision import ThinkingBlock, Usage
from planner.providers.base import (
    AssistantTurn,
    ProviderRequest,
    ProviderResponse,
    ToolCall,
    ToolResultTurn,
    UserTurn,
    image_media_type,
)
from planner.providers.clients import anthropic_client
from planner.providers.failures import planner_error
from planner.settings import PlannerSettings

INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"


def _assistant_blocks(message: Any) -> list[dict[str, Any]]:
    """The answer's content as request params, unmodified: same order, signatures, redactions."""
    blocks: list[dict[str, Any]] = []
    for block in message.content:
        if block.type == "thinking":
            blocks.append(
                {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
            )
        elif block.type == "redacted_thinking":
            blocks.append({"type": "redacted_thinking", "data": block.data})
        elif block.type == "text":
            blocks.append({"type": "text", "text": block.text})
        elif block.type == "tool_use":
            blocks.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            )
    return blocks


class AnthropicProvider:
    """Claude through the official SDK; the SDK retries 429/5xx `max_retries` times."""

    def __init__(self, settings: PlannerSettings) -> None:
        self._settings = settings
        self._client = anthropic_client(settings)

    @property
    def name(self) -> str:
        return "anthropic"

    async def aclose(self) -> None:
        await self._client.close()

    def _messages(self, request: ProviderRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for turn in request.messages:
            if isinstance(turn, UserTurn):
                content: list[dict[str, Any]] = []
                if turn.screenshot:
                    content.append(
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": image_media_type(turn.screenshot),
                                "data": base64.b64encode(turn.screenshot).decode("ascii"),
                            },
                        }
                    )
                content.append({"type": "text", "text": turn.text})
                self._append(out, "user", content)
            elif isinstance(turn, AssistantTurn):
                raw = turn.response.raw_assistant
                self._append(out, "assistant", list(raw) if isinstance(raw, list) else [])
            elif isinstance(turn, ToolResultTurn):
                self._append(
                    out,
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": turn.call_id,
                            "content": turn.content,
                            "is_error": turn.is_error,
                        }
                    ],
                )
        return out

    @staticmethod
    def _append(out: list[dict[str, Any]], role: str, content: list[dict[str, Any]]) -> None:
        # Consecutive user blocks (a tool_result then a note) belong in one message; an assistant
        # turn is never split or merged, so its thinking stays in the message it came from.
        if role == "user" and out and out[-1]["role"] == "user":
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": content})

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        settings = self._settings
        forced = request.tool_choice == "required"
        kwargs: dict[str, Any] = {
            "model": settings.resolved_model,
            "system": request.system,
            "messages": self._messages(request),
            "tools": [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ],
            "tool_choice": {"type": "any" if forced else "auto", "disable_parallel_tool_use": True},
            "max_tokens": settings.max_tokens,
        }
        mode = settings.thinking_mode if request.thinking and not forced else "off"
        if mode == "adaptive":
            kwargs["thinking"] = {"type": "adaptive"}
            if settings.effort:
                kwargs["output_config"] = {"effort": settings.effort}
        elif mode == "budget" and settings.thinking_budget_tokens is not None:
            kwargs["thinking"] = {
                "type": "enabled",
                "budget_tokens": settings.thinking_budget_tokens,
            }
            kwargs["max_tokens"] = settings.effective_max_tokens
            kwargs["extra_headers"] = {"anthropic-beta": INTERLEAVED_THINKING_BETA}
        try:
            message = await self._client.messages.create(**kwargs)
        except anthropic.APIError as err:
            raise planner_error(err, "Anthropic", retries=settings.max_retries) from err
        return self._normalize(message)

    @staticmethod
    def _normalize(message: Any) -> ProviderResponse:
        text: list[str] = []
        thinking: list[ThinkingBlock] = []
        calls: list[ToolCall] = []
        for block in message.content:
            if block.type == "thinking":
                thinking.append(ThinkingBlock(text=block.thinking))
            elif block.type == "redacted_thinking":
                thinking.append(ThinkingBlock(text="", redacted=True))
            elif block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                args = block.input if isinstance(block.input, dict) else None
                calls.append(ToolCall(id=block.id, name=block.name, arguments=args))
        u = message.usage
        details = getattr(u, "output_tokens_details", None)
        usage = Usage(
            input_tokens=u.input_tokens or 0,
            output_tokens=u.output_tokens or 0,
            cache_read_input_tokens=u.cache_read_input_tokens or 0,
            cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
            thinking_tokens=getattr(details, "thinking_tokens", 0) or 0,
        )
        return ProviderResponse(
            text=text,
            thinking=thinking,
            tool_calls=calls,
            usage=usage,
            model=message.model,
            stop_reason=message.stop_reason,
            raw_assistant=_assistant_blocks(message),
        )
