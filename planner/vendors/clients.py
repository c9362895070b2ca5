"""The official SDK clients, built one way from the planner settings for every planning mode.

A missing key is refused here, with the setting to fix, rather than by the SDK at the first call.
"""

from __future__ import annotations

import anthropic
import openai

from planner.errors import PlannerAuthError
from planner.settings import PlannerSettings


def anthropic_client(settings: PlannerSettings) -> anthropic.AsyncAnthropic:
    key = settings.anthropic_api_key.get_secret_value() if settings.anthropic_api_key else ""
    if not key:
        raise PlannerAuthError(
            "planner: no Anthropic API key configured (set AMC_PLANNER_ANTHROPIC_API_KEY)"
        )
    return anthropic.AsyncAnthropic(
        api_key=key,
        base_url=settings.anthropic_base_url,
        max_retries=settings.max_retries,
        timeout=settings.timeout_s,
    )


def openai_client(settings: PlannerSettings) -> openai.AsyncOpenAI:
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else ""
    if not key:
        raise PlannerAuthError(
            "planner: no OpenAI API key configured (set AMC_PLANNER_OPENAI_API_KEY)"
        )
    return openai.AsyncOpenAI(
        api_key=key,
        base_url=settings.openai_base_url,
        max_retries=settings.max_retries,
        timeout=settings.timeout_s,
    )
