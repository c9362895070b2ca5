"""`AnthropicAdapter`: Claude through the official SDK, for both planning modes."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic

from planner.conversation.turns import ProjectionStats
from planner.decision import Billed
from planner.errors import PlannerError, UnreadableAnswer, carry_cut_off
from planner.model_profiles import ModelProfile, RetryForm, profile_for
from planner.vendors.anthropic.messages import (
    CONTEXT_EXCEEDED_STOP,
    AnthropicStreamAccumulator,
    Cache,
    cut_short,
    items_from_message,
    raw_calls,
    refusal,
    request_params,
    text_in_thinking,
    truncated,
    usage_from,
)
from planner.vendors.anthropic.projection import project_anthropic
from planner.vendors.base import TextInThinking, ThinkingConfig, Turn, TurnRequest
from planner.vendors.failures import probe_model, read_answer
from planner.vendors.streaming import Tries, call_timeout, fetch_response


class AnthropicAdapter:
    """Projects a conversation onto Messages, builds the request from the model's profile,
    calls the SDK (429/5xx asked again `retries` times, within bounded waits:
    `fetch_response`), and parses the reply into items."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        *,
        model: str,
        thinking: ThinkingConfig | None = None,
        max_tokens: int = 2048,
        retries: int = 2,
        profile: ModelProfile | None = None,
        prompt_cache: bool = True,
    ) -> None:
        # The SDK's own retries off: it would sleep as long as the provider's retry-after says
        # (planner/vendors/failures.py). The copy shares the client's connections.
        self.client = client.with_options(max_retries=0)
        self._model = model
        self.thinking = thinking or ThinkingConfig()
        self.max_tokens = max_tokens
        self.retries = retries
        self.profile = profile or profile_for(model, "anthropic")
        self.prompt_cache = prompt_cache and self.profile.prompt_cache

    @property
    def name(self) -> str:
        return "anthropic"

    @property
    def model(self) -> str:
        return self._model

    @property
    def retry_form(self) -> RetryForm:
        return self.profile.retry_form(self.thinking.enabled)

    def kept_text_in_thinking(self) -> TextInThinking:
        """Where a first call's answer carries the text the model wrote before its call, as
        this adapter would ask now (`text_in_thinking`). An answer rebuilt from the stored
        conversation (`planner.session.kept_answer`) reads its rationale by it, as it was
        read on arrival: else a model that writes its judgement in a thinking block recorded
        no rationale and that judgement as thinking."""
        params = request_params(
            model=self._model,
            system="",
            messages=[],
            tools=[],
            profile=self.profile,
            thinking=self.thinking,
            thinking_on=True,
            forced=False,
            max_tokens=self.max_tokens,
        )
        return text_in_thinking(params, self.profile)

    async def aclose(self) -> None:
        await self.client.close()

    async def probe(self) -> None:
        await probe_model(self.client, self._model, self.name)

    async def complete(self, request: TurnRequest) -> Turn:
        # A model that cannot run one call without thinking keeps it on; the projection then
        # sends an earlier turn that carries no thinking as text.
        wants = request.thinking or not self.profile.off_per_call
        thinking_on = self.thinking.enabled and wants and not request.forced
        projection = project_anthropic(
            request.items,
            thinking=thinking_on,
            model=self._model,
            foreign_reasoning=request.foreign_reasoning,
            images=request.images,
        )
        cache: Cache = "off"
        if self.prompt_cache:
            cache = "conversation" if request.mode == "session" else "prompt"
        params = request_params(
            model=self._model,
            system=request.system,
            messages=projection.messages,
            tools=request.tools,
            profile=self.profile,
            thinking=self.thinking,
            thinking_on=wants,
            forced=request.forced,
            max_tokens=request.max_tokens or self.max_tokens,
            cache=cache,
        )
        said = text_in_thinking(params, self.profile)
        acc = AnthropicStreamAccumulator(request.on_thinking, said)
        streamed = (acc.feed, acc.message) if request.stream else None
        try:
            message = await fetch_response(
                self.client.messages.create,
                params,
                self.name,
                streamed,
                retries=self.retries,
                call_seconds=call_timeout(self.client.timeout, params["max_tokens"]),
                tries=Tries.of(self.retries, request),
            )
        except (asyncio.CancelledError, PlannerError) as err:
            # A stream hung up on, or broken off by the provider (an `error` event, a dropped
            # connection), is billed for what the provider read all the same: its message_start
            # said so (and message_delta what it wrote so far); so is one whose events could
            # not be read (`UnreadableAnswer`), counted as that failure, not as a cut-off.
            reported = acc.reported()
            if reported is not None:
                model, usage = reported
                billed = Billed(self.name, model or self._model, usage_from(usage))
                carry_cut_off(err, billed, failed=isinstance(err, UnreadableAnswer))
            raise
        return read_answer(
            self.name,
            lambda: self._turn(message, params, projection.stats, said),
            lambda: Billed(
                self.name,
                str(message.get("model") or self._model),
                usage_from(message.get("usage")),
            ),
        )

    def _turn(
        self,
        message: dict[str, Any],
        params: dict[str, Any],
        stats: ProjectionStats,
        said: TextInThinking,
    ) -> Turn:
        stop = message.get("stop_reason")
        return Turn(
            turn_id=str(message.get("id") or ""),
            items=items_from_message(message, self._model),
            usage=usage_from(message.get("usage")),
            model=str(message.get("model") or self._model),
            stop_reason=stop,
            raw_calls=raw_calls(message),
            request=params,
            projection=stats,
            truncated=truncated(stop),
            context_exceeded=stop == CONTEXT_EXCEEDED_STOP,
            max_tokens=params["max_tokens"],
            output_limit=self.profile.max_output_tokens,
            readable_thinking=self.profile.readable_thinking,
            refusal=refusal(message),
            cut_short=cut_short(stop),
            text_in_thinking=said,
        )
