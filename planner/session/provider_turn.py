"""One model call of a session, whatever the provider: what it returns and how it fails.

A `TurnResult` holds the assistant items of one response in the order the provider produced
them, ready to be committed to the history as received. The one change made before committing
is masking a sensitive `input_text` value: it is executed from the decision, never stored or
sent back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai

from planner.decision import Usage
from planner.errors import (
    PlannerAuthError,
    PlannerError,
    PlannerRateLimited,
    PlannerRejected,
    PlannerUnavailable,
)
from planner.history import MASK
from planner.session.items import AssistantItem, ToolCall
from planner.session.streaming import IncompleteStream


@dataclass(slots=True)
class TurnResult:
    """One response: its items (as received), usage, model and stop reason."""

    turn_id: str
    items: list[AssistantItem]
    usage: Usage
    model: str
    stop_reason: str | None
    request: dict[str, Any] = field(default_factory=dict)
    raw_calls: dict[str, Any] = field(default_factory=dict)
    """call id → the arguments exactly as the model sent them (unmasked, for execution only)."""

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [i for i in self.items if isinstance(i, ToolCall)]


def mask_sensitive(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments safe to keep in the history: a sensitive input_text value becomes the mask.

    Anything but an explicit `false` counts as sensitive (`"true"`, `1`): such a call is then
    refused as invalid, but its arguments are stored before that, and a secret must not be.
    """
    sensitive = arguments.get("sensitive", False)
    if name == "input_text" and sensitive is not False and "text" in arguments:
        return {**arguments, "text": MASK}
    return arguments


def provider_error(err: Exception, provider: str) -> PlannerError:
    """An SDK failure as a planner error an operator can read."""
    label = "Anthropic" if provider == "anthropic" else "OpenAI"
    if isinstance(err, IncompleteStream):
        return PlannerUnavailable(f"planner: {label} stream broke off ({err})")
    if isinstance(err, anthropic.AuthenticationError | openai.AuthenticationError):
        return PlannerAuthError(f"planner: {label} rejected the API key")
    if isinstance(err, anthropic.RateLimitError | openai.RateLimitError):
        return PlannerRateLimited(f"planner: {label} rate limit persists after retries")
    if isinstance(err, anthropic.APIStatusError | openai.APIStatusError):
        if err.status_code >= 500:
            return PlannerUnavailable(f"planner: {label} failed ({err.status_code})")
        return PlannerRejected(f"planner: {label} rejected the request: {err.message}")
    if isinstance(err, anthropic.APIError | openai.APIError):
        return PlannerUnavailable(f"planner: {label} unreachable ({err})")
    return PlannerError(f"planner: {label} call failed: {err}")


async def fetch_response(
    create: Callable[..., Awaitable[Any]],
    params: dict[str, Any],
    provider: str,
    stream: tuple[Callable[[Any], None], Callable[[], dict[str, Any]]] | None,
) -> dict[str, Any]:
    """One call's response as a wire dict. With `stream` (feed, complete) each event goes to
    `feed` and the response is what `complete` builds once the stream has ended. Both SDKs
    stream the same way, so both providers share this path and fail with the same errors."""
    try:
        if stream is None:
            return dict((await create(**params)).to_dict())
        feed, complete = stream
        async for event in await create(**params, stream=True):
            feed(event)
        return complete()
    except Exception as err:
        raise provider_error(err, provider) from err
