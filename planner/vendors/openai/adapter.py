"""`OpenAIAdapter`: GPT through the official SDK, for both planning modes.

Session mode speaks the stateless Responses API, whose encrypted reasoning round-trips between
the steps of a kept conversation. Compact mode (one self-contained request per step) speaks Chat
Completions, except for models whose profile says Chat Completions refuses their tool calls
(`chat_tools`: the GPT-5 family, which refuses function tools with reasoning there): those take
the same Responses request as session mode, over the compact conversation.

A session step is streamed (`TurnRequest.stream`) only so its thinking shows live, so it is
asked unstreamed where streaming cannot be had: a model that never streams (`streams` in its
profile: o1-pro, o3-pro, the GPT-5 Pro models), and a model OpenAI refuses to stream to this
organisation (400 naming `stream`: "Your organization must be verified to stream this model"),
which answers the same request unstreamed: asked again so within the step, and never streamed
again by this process (`_UNSTREAMED`), with one warning saying why the live view stays empty.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import openai

from planner.conversation.turns import ProjectionStats
from planner.decision import Billed, Usage
from planner.errors import PlannerError, PlannerParameterRejected, carry_cut_off
from planner.model_profiles import ModelProfile, RetryForm, profile_for
from planner.vendors.base import ThinkingConfig, Turn, TurnRequest
from planner.vendors.failures import (
    FailedResponse,
    UnusableAnswer,
    failed_response_wait,
    planner_error,
    probe_model,
    read_answer,
)
from planner.vendors.openai import chat, responses
from planner.vendors.openai.responses_projection import project_responses
from planner.vendors.streaming import Tries, call_timeout, fetch_response

log = logging.getLogger(__name__)

#: The models OpenAI refused to stream in this process (400 naming `stream`): the refusal is
#: the organisation's, not one request's, so every later call of the model is asked unstreamed.
_UNSTREAMED: set[str] = set()


class OpenAIAdapter:
    """Projects a conversation onto Chat Completions (compact) or Responses (session, and
    compact for models Chat Completions refuses tools to), calls
    the SDK (429/5xx asked again `retries` times, within bounded waits: `fetch_response`),
    and parses the reply into items."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        *,
        model: str,
        thinking: ThinkingConfig | None = None,
        max_tokens: int = 2048,
        retries: int = 2,
        profile: ModelProfile | None = None,
    ) -> None:
        # The SDK's own retries off: it would sleep as long as the provider's retry-after says
        # (planner/vendors/failures.py). The copy shares the client's connections.
        self.client = client.with_options(max_retries=0)
        self._model = model
        self.thinking = thinking or ThinkingConfig()
        self.max_tokens = max_tokens
        self.retries = retries
        self.profile = profile or profile_for(model, "openai")

    @property
    def name(self) -> str:
        return "openai"

    @property
    def model(self) -> str:
        return self._model

    @property
    def retry_form(self) -> RetryForm:
        return self.profile.retry_form(self.thinking.enabled)

    def _streams(self, request: TurnRequest) -> bool:
        """Whether this call streams: asked to, and the model can be streamed here."""
        return request.stream and self.profile.streams and self._model not in _UNSTREAMED

    def _stop_streaming(self, refused: PlannerParameterRejected) -> None:
        """Ask `model` unstreamed from now on, saying once why its thinking no longer shows."""
        if self._model in _UNSTREAMED:
            return
        _UNSTREAMED.add(self._model)
        log.warning(
            "planner: OpenAI refuses to stream %s (%s); its calls are asked unstreamed from "
            "now on: the decisions and their thinking are recorded as before, but the thinking "
            "is no longer shown live",
            self._model,
            refused,
        )

    @property
    def _effort(self) -> str | None:
        """The reasoning effort asked for, None for models without reasoning parameters. With
        thinking off, a reasoning model is asked for the least it takes (`off_effort`): left
        out, it reasons at its default effort, hidden and billed, within an answer's budget."""
        if not self.profile.reasoning:
            return None
        if not self.thinking.enabled:
            return self.profile.off_effort
        return self.thinking.effort or self.profile.default_effort

    async def aclose(self) -> None:
        await self.client.close()

    async def probe(self) -> None:
        await probe_model(self.client, self._model, self.name)

    async def complete(self, request: TurnRequest) -> Turn:
        if request.mode == "session" or not self.profile.chat_tools:
            return await self._responses(request)
        return await self._chat(request)

    async def _chat(self, request: TurnRequest) -> Turn:
        stats = ProjectionStats()
        params = chat.request_params(
            model=self._model,
            messages=chat.project_chat(request.system, request.items, request.images, stats),
            tools=request.tools,
            forced=request.forced,
            max_tokens=request.max_tokens or self.max_tokens,
            reasoning_effort=self._effort,
            parallel_tool_calls=self.profile.parallel_tool_calls,
        )
        completion = await fetch_response(
            self.client.chat.completions.create,
            params,
            self.name,
            None,
            retries=self.retries,
            call_seconds=call_timeout(self.client.timeout, params["max_completion_tokens"]),
            tries=Tries.of(self.retries, request),
        )
        return read_answer(
            self.name,
            lambda: self._chat_turn(completion, params, stats),
            lambda: Billed(
                self.name,
                str(completion.get("model") or self._model),
                chat.usage_from(completion.get("usage")),
            ),
        )

    def _chat_turn(
        self, completion: dict[str, Any], params: dict[str, Any], stats: ProjectionStats
    ) -> Turn:
        if not completion.get("choices"):
            # A compatible server (or a filter in front of one) answered without an answer:
            # read as one without a tool call it was asked again and again, then failed as
            # "an unusable tool call twice", which named nothing of this.
            raise UnusableAnswer("a Chat Completion with no choices (choices: [])")
        return Turn(
            turn_id=str(completion.get("id") or ""),
            items=chat.items_from_completion(completion),
            usage=chat.usage_from(completion.get("usage")),
            model=str(completion.get("model") or self._model),
            stop_reason=chat.stop_reason(completion),
            raw_calls=chat.raw_calls(completion),
            request=params,
            projection=stats,
            truncated=chat.stop_reason(completion) == "length",
            max_tokens=params["max_completion_tokens"],
            output_limit=self.profile.max_output_tokens,
            readable_thinking="full",
            refusal=chat.refusal(completion),
        )

    async def _responses(self, request: TurnRequest) -> Turn:
        projection = project_responses(
            request.items,
            foreign_reasoning=request.foreign_reasoning,
            keep_reasoning_turns=request.keep_reasoning_turns,
            images=request.images,
        )
        params = responses.request_params(
            model=self._model,
            system=request.system,
            input_items=projection.input,
            tools=request.tools,
            effort=self._effort,
            summaries=self.thinking.enabled and self.thinking.summaries,
            forced=request.forced,
            max_tokens=request.max_tokens or self.max_tokens,
        )
        failed_tries = Usage()  # what the tries answered as failed and asked again cost
        answered_model = ""
        tries = Tries.of(self.retries, request)  # one budget with `fetch_response`'s retries
        while True:
            acc = responses.ResponsesStreamAccumulator(request.on_thinking)
            streamed = (acc.feed, acc.response) if self._streams(request) else None
            try:
                try:
                    response = await fetch_response(
                        self.client.responses.create,
                        params,
                        self.name,
                        streamed,
                        retries=self.retries,
                        call_seconds=call_timeout(self.client.timeout, params["max_output_tokens"]),
                        tries=tries,
                    )
                    acc.check(response)
                    break
                except PlannerParameterRejected as refused:
                    # Refused before any answer: the same request, unstreamed, is answered.
                    if streamed is None or refused.param != "stream":
                        raise
                    self._stop_streaming(refused)
                    acc = responses.ResponsesStreamAccumulator(request.on_thinking)
                    continue
                except FailedResponse as failed:
                    # Not streamed: a failure the provider had (`server_error`, …) is asked
                    # again as its 500 would be, within the same budget of tries and waits. A
                    # stream that failed is not (its thinking may have been shown): it left
                    # `fetch_response` as a planner error already.
                    wait = failed_response_wait(failed, tries.taken, tries.waited)
                    if not tries.left() or wait is None:
                        raise planner_error(failed, self.name, retries=tries.taken) from None
                    reported = acc.reported()
                    if reported is not None:
                        answered_model = reported[0] or self._model
                        failed_tries.add(responses.usage_from(reported[1]))
                    acc = responses.ResponsesStreamAccumulator(request.on_thinking)  # counted
                    await tries.wait(wait)
            except (asyncio.CancelledError, PlannerError) as err:
                # A response that failed (`response.failed`, or `status: "failed"` not
                # streamed) may say what it cost: billed all the same, and counted as failed,
                # not cut off (only a failed response reports usage), with the failed tries
                # asked again before it.
                reported = acc.reported()
                if reported is not None:
                    answered_model = reported[0] or answered_model or self._model
                    failed_tries.add(responses.usage_from(reported[1]))
                if answered_model:
                    cost = Billed(self.name, answered_model, failed_tries)
                    carry_cut_off(err, cost, failed=True)
                raise

        def turn() -> Turn:
            made = self._responses_turn(response, params, projection.stats)
            made.usage.add(failed_tries)  # every answered try is billed
            return made

        def billed() -> Billed:
            usage = responses.usage_from(response.get("usage"))
            usage.add(failed_tries)
            return Billed(self.name, str(response.get("model") or self._model), usage)

        return read_answer(self.name, turn, billed)

    def _responses_turn(
        self, response: dict[str, Any], params: dict[str, Any], stats: ProjectionStats
    ) -> Turn:
        return Turn(
            turn_id=str(response.get("id") or ""),
            items=responses.items_from_response(response),
            usage=responses.usage_from(response.get("usage")),
            model=str(response.get("model") or self._model),
            stop_reason=response.get("status"),
            raw_calls=responses.raw_calls(response),
            request=params,
            projection=stats,
            truncated=responses.truncated(response),
            max_tokens=params["max_output_tokens"],
            output_limit=self.profile.max_output_tokens,
            readable_thinking=responses.readable_thinking(response),
            refusal=responses.refusal(response),
            cut_short=responses.cut_short(response),
        )
