"""`Planner`: one decision per step, with the forced retry and one corrective retry.

The flow of a decision:
1. Ask with `tool_choice=auto` (thinking as configured) so rationale and thinking can appear.
2. No tool call at all → ask once more with a forced tool choice and no thinking (the only
   combination Anthropic accepts); `forced_retry` is recorded. The first answer's text and thinking
   are kept: they are the model's judgement for this step even though it did not act on it.
3. The tool call is unusable (unknown tool, missing purpose/expected outcome, invalid arguments,
   an element id not on screen, a point off screen) → one corrective turn: the answer goes back
   verbatim with a tool_result error saying what was wrong. Still unusable → `PlannerError`.
Usage and latency add up over every call the decision needed.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from planner.decision import Decision, ThinkingBlock, Usage
from planner.errors import PlannerError, ToolCallError
from planner.history import WorldEvent
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.providers.base import (
    AssistantTurn,
    Message,
    Provider,
    ProviderRequest,
    ProviderResponse,
    ToolChoice,
    ToolResultTurn,
    UserTurn,
)
from planner.scene import Scene
from planner.settings import PlannerSettings
from planner.tools import TOOLS, ParsedToolCall, parse_tool_call


class Planner:
    """Builds prompts, calls a provider and turns the answer into a validated `Decision`."""

    def __init__(self, provider: Provider, settings: PlannerSettings | None = None) -> None:
        self.provider = provider
        self.settings = settings or PlannerSettings()

    async def aclose(self) -> None:
        await self.provider.aclose()

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        """The next action for `goal` on `scene`, given the compact `history` of earlier steps."""
        user_prompt = build_user_prompt(
            goal, scene, history, history_window=self.settings.history_window
        )
        return await self.decide_from_prompts(
            SYSTEM_PROMPT,
            user_prompt,
            element_ids=[e.element_id for e in scene.elements],
            screen_size=(scene.screen_width, scene.screen_height),
            screenshot=screenshot if self.settings.send_screenshot else None,
        )

    async def decide_from_prompts(
        self,
        system_prompt: str,
        user_prompt: str,
        element_ids: Collection[str] | None = None,
        screen_size: tuple[int, int] | None = None,
        screenshot: bytes | None = None,
    ) -> Decision:
        """The same decision from ready-made prompts (the cloud's Decide service uses this).

        `element_ids`/`screen_size` say what the model was shown so a call on something that is
        not there is caught; None skips that check.
        """
        ids = frozenset(element_ids) if element_ids is not None else None
        messages: list[Message] = [UserTurn(user_prompt, screenshot)]
        usage = Usage()
        texts: list[str] = []
        thinking: list[ThinkingBlock] = []
        forced = False
        corrective = 0
        started = time.monotonic()
        model = ""
        while True:
            response = await self._call(system_prompt, messages, "auto", usage)
            model = response.model or model
            texts += response.text
            thinking += response.thinking
            if not response.tool_calls:
                forced = True
                response = await self._call(system_prompt, messages, "required", usage)
                model = response.model or model
                texts += response.text
                thinking += response.thinking
            try:
                parsed = self._parse(response, ids, screen_size)
                break
            except ToolCallError as err:
                if corrective >= 1:
                    raise PlannerError(
                        f"planner: {self.provider.name} gave an unusable tool call twice: {err}"
                    ) from None
                corrective += 1
                messages = self._corrective_turns(messages, response, str(err))
        rationale = "\n".join(t.strip() for t in texts if t.strip()) or None
        return Decision(
            tool_name=parsed.tool_name,
            arguments=parsed.arguments,
            action=parsed.action,
            purpose=parsed.purpose,
            expected_outcome=parsed.expected_outcome,
            rationale=rationale,
            thinking=thinking,
            usage=usage,
            provider=self.provider.name,
            model=model or self.settings.resolved_model,
            latency_s=time.monotonic() - started,
            forced_retry=forced,
            system_prompt=system_prompt,
            user_prompt=user_prompt,
            corrective_retries=corrective,
        )

    async def _call(
        self, system: str, messages: list[Message], tool_choice: ToolChoice, usage: Usage
    ) -> ProviderResponse:
        # Thinking only when every earlier answer in the conversation started with thinking:
        # Anthropic rejects a thinking turn whose previous tool_use turn carried none.
        thinking_ok = tool_choice == "auto" and all(
            m.response.thinking for m in messages if isinstance(m, AssistantTurn)
        )
        response = await self.provider.complete(
            ProviderRequest(
                system=system,
                messages=list(messages),
                tools=TOOLS,
                tool_choice=tool_choice,
                thinking=thinking_ok,
            )
        )
        usage.add(response.usage)
        return response

    @staticmethod
    def _parse(
        response: ProviderResponse,
        ids: frozenset[str] | None,
        screen_size: tuple[int, int] | None,
    ) -> ParsedToolCall:
        if not response.tool_calls:
            raise ToolCallError("no tool call; call exactly one tool")
        call = response.tool_calls[0]
        if len(response.tool_calls) > 1:
            raise ToolCallError(
                f"{len(response.tool_calls)} tool calls; call exactly one tool per turn"
            )
        arguments: Any = call.arguments if call.arguments is not None else call.raw_arguments
        return parse_tool_call(call.name, arguments, element_ids=ids, screen_size=screen_size)

    @staticmethod
    def _corrective_turns(
        messages: list[Message], response: ProviderResponse, error: str
    ) -> list[Message]:
        """Answer every tool call of the bad response: the first with the error, others skipped."""
        turns: list[Message] = list(messages)
        if response.tool_calls or response.text or response.thinking:
            turns.append(AssistantTurn(response))
        note = f"That tool call was rejected: {error}. Fix it and call exactly one tool."
        if response.tool_calls:
            for i, call in enumerate(response.tool_calls):
                turns.append(
                    ToolResultTurn(call.id, note if i == 0 else "not executed", is_error=True)
                )
        else:
            turns.append(UserTurn(note))
        return turns


def make_planner(settings: PlannerSettings | None = None) -> Planner:
    """A Planner with the provider the settings (or the environment) select."""
    from planner.providers import make_provider

    settings = settings or PlannerSettings()
    return Planner(make_provider(settings), settings)
