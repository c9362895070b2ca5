"""OpenAI Chat Completions through the official SDK (`AsyncOpenAI(base_url=...)`).

`tool_choice="auto"` first so `message.content` (the rationale) can come with the tool call;
`"required"` for the planner's forced retry. `parallel_tool_calls` is off: one action per step.
OpenAI-compatible reasoning servers return `message.reasoning_content`; it becomes the thinking,
and it is sent back on the assistant message of a follow-up turn, as some servers require.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import openai

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
from planner.providers.clients import openai_client
from planner.providers.failures import planner_error
from planner.settings import PlannerSettings


class OpenAIProvider:
    """GPT (or any Chat Completions server) through the official SDK."""

    def __init__(self, settings: PlannerSettings) -> None:
        self._settings = settings
        self._client = openai_client(settings)

    @property
    def name(self) -> str:
        return "openai"

    async def aclose(self) -> None:
        await self._client.close()

    @staticmethod
    def _messages(request: ProviderRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": request.system}]
        for turn in request.messages:
            if isinstance(turn, UserTurn):
                if turn.screenshot:
                    url = f"data:{image_media_type(turn.screenshot)};base64," + base64.b64encode(
                        turn.screenshot
                    ).decode("ascii")
                    out.append(
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": url}},
                                {"type": "text", "text": turn.text},
                            ],
                        }
                    )
                else:
                    out.append({"role": "user", "content": turn.text})
            elif isinstance(turn, AssistantTurn):
                raw = turn.response.raw_assistant
                if isinstance(raw, dict):
                    out.append(raw)
            elif isinstance(turn, ToolResultTurn):
                content = f"ERROR: {turn.content}" if turn.is_error else turn.content
                out.append({"role": "tool", "tool_call_id": turn.call_id, "content": content})
        return out

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        settings = self._settings
        try:
            completion = await self._client.chat.completions.create(
                model=settings.resolved_model,
                messages=self._messages(request),  # type: ignore[arg-type]
                tools=[
                    {
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters,
                        },
                    }
                    for t in request.tools
                ],
                tool_choice=request.tool_choice,
                parallel_tool_calls=False,
                max_completion_tokens=settings.max_tokens,
            )
        except openai.APIError as err:
            raise planner_error(err, "OpenAI", retries=settings.max_retries) from err
        return self._normalize(completion)

    @staticmethod
    def _normalize(completion: Any) -> ProviderResponse:
        choice = completion.choices[0]
        message = choice.message
        calls: list[ToolCall] = []
        raw_calls: list[dict[str, Any]] = []
        for call in message.tool_calls or []:
            function = getattr(call, "function", None)
            if function is None:
                continue
            raw = function.arguments or ""
            try:
                parsed = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError:
                parsed = None
            calls.append(
                ToolCall(
                    id=call.id,
                    name=function.name,
                    arguments=parsed if isinstance(parsed, dict) else None,
                    raw_arguments=raw,
                )
            )
            raw_calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": function.name, "arguments": raw},
                }
            )
        reasoning = getattr(message, "reasoning_content", None)
        thinking = (
            [ThinkingBlock(text=reasoning)] if isinstance(reasoning, str) and reasoning else []
        )
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if raw_calls:
            assistant["tool_calls"] = raw_calls
        if thinking:
            assistant["reasoning_content"] = reasoning
        u = completion.usage
        prompt_details = getattr(u, "prompt_tokens_details", None)
        completion_details = getattr(u, "completion_tokens_details", None)
        cached = getattr(prompt_details, "cached_tokens", 0) or 0
        usage = Usage(
            input_tokens=((u.prompt_tokens or 0) - cached) if u else 0,
            output_tokens=(u.completion_tokens or 0) if u else 0,
            cache_read_input_tokens=cached,
            cache_creation_input_tokens=getattr(prompt_details, "cache_write_tokens", 0) or 0,
            thinking_tokens=getattr(completion_details, "reasoning_tokens", 0) or 0,
        )
        return ProviderResponse(
            text=[message.content] if message.content else [],
            thinking=thinking,
            tool_calls=calls,
            usage=usage,
            model=completion.model,
            stop_reason=choice.finish_reason,
            raw_assistant=assistant,
        )
