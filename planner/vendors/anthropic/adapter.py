"""`AnthropicAdapter`: Claude through the official SDK, for both planning modes."""

from __future__ import annotations

import anthropic

from planner.vendors.anthropic.messages import (
    AnthropicStreamAccumulator,
    items_from_message,
    raw_calls,
    request_params,
    usage_from,
)
from planner.vendors.anthropic.projection import project_anthropic
from planner.vendors.base import ThinkingConfig, Turn, TurnRequest
from planner.vendors.streaming import fetch_response


class AnthropicAdapter:
    """Projects a conversation onto Messages, calls the SDK (which retries 429/5xx
    `retries` times), and parses the reply into items."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        *,
        model: str,
        thinking: ThinkingConfig | None = None,
        max_tokens: int = 2048,
        retries: int = 2,
    ) -> None:
        self.client = client
        self._model = model
        self.thinking = thinking or ThinkingConfig()
        self.max_tokens = max_tokens
        self.retries = retries

    @property
    def name(self) -> str:
        return "anthropic"

    @property
    def model(self) -> str:
        return self._model

    async def aclose(self) -> None:
        await self.client.close()

    async def complete(self, request: TurnRequest) -> Turn:
        thinking_on = self.thinking.enabled and request.thinking and not request.forced
        projection = project_anthropic(
            request.items,
            thinking=thinking_on,
            foreign_reasoning=request.foreign_reasoning,
            images=request.images,
        )
        params = request_params(
            model=self._model,
            system=request.system,
            messages=projection.messages,
            tools=request.tools,
            thinking=self.thinking,
            thinking_on=request.thinking,
            forced=request.forced,
            max_tokens=request.max_tokens or self.max_tokens,
            explicit_off=request.mode == "session",
        )
        acc = AnthropicStreamAccumulator(request.on_thinking)
        streamed = (acc.feed, acc.message) if request.stream else None
        message = await fetch_response(
            self.client.messages.create, params, self.name, streamed, retries=self.retries
        )
        return Turn(
            turn_id=str(message.get("id") or ""),
            items=items_from_message(message),
            usage=usage_from(message.get("usage")),
            model=str(message.get("model") or self._model),
            stop_reason=message.get("stop_reason"),
            raw_calls=raw_calls(message),
            request=params,
            projection=projection.stats,
        )
