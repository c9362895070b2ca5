"""One adapter per model vendor (Anthropic, OpenAI) serving both planning modes.

Each vendor folder holds that vendor's wire formats — request building, reply parsing into the
one set of conversation items (`planner/conversation/items.py`), stream accumulation — and its
adapter; failures go through the one mapper (`failures.py`). Import `make_adapter` from here; the
SDKs are loaded only when an adapter is made, so an offline planner never loads them.
"""

from __future__ import annotations

from planner import model_profiles
from planner.decision import ThinkingKind
from planner.model_profiles import RetryForm
from planner.prices import PriceTable
from planner.settings import PlannerSettings
from planner.vendors.base import (
    ModelAdapter,
    PlannerMode,
    ThinkingConfig,
    ThinkingSink,
    Turn,
    TurnRequest,
    mask_sensitive,
)
from planner.vendors.observed import observed

__all__ = [
    "ModelAdapter",
    "PlannerMode",
    "RetryForm",
    "ThinkingConfig",
    "ThinkingKind",
    "ThinkingSink",
    "Turn",
    "TurnRequest",
    "make_adapter",
    "mask_sensitive",
    "thinking_config",
]


def thinking_config(settings: PlannerSettings) -> ThinkingConfig:
    """The configured thinking (`AMC_PLANNER_THINKING`, `…_EFFORT`, `…_THINKING_BUDGET_TOKENS`,
    `…_REASONING_SUMMARY`)."""
    return ThinkingConfig(
        mode=settings.thinking_mode,
        effort=settings.effort,
        budget_tokens=settings.thinking_budget_tokens,
        summaries=settings.reasoning_summary == "auto",
    )


def make_adapter(settings: PlannerSettings) -> ModelAdapter:
    """The adapter of the vendor the settings select (anthropic or openai).

    The request rules come from the model's profile (`planner/model_profiles.py`); a
    configuration the model cannot take raises `PlannerConfigError` (one line naming the setting
    to change), a missing API key `PlannerAuthError`, both before any call. ValueError for the
    offline provider (it is no vendor: see `planner.providers.make_provider`). The adapter comes
    observed (`planner/vendors/observed.py`: priced, traced), prices from
    `AMC_PLANNER_PRICES_FILE` over the defaults.
    """
    vendor = settings.resolved_provider
    if vendor == "offline":
        raise ValueError("'offline' is not a model vendor")
    profile = model_profiles.resolve(settings)
    model_profiles.check(profile, settings)
    return observed(
        _vendor_adapter(settings, vendor, profile), PriceTable.load(settings.prices_file)
    )


def _vendor_adapter(
    settings: PlannerSettings, vendor: str, profile: model_profiles.ModelProfile
) -> ModelAdapter:
    if vendor == "anthropic":
        from planner.vendors.anthropic import AnthropicAdapter
        from planner.vendors.clients import anthropic_client

        return AnthropicAdapter(
            anthropic_client(settings),
            model=settings.resolved_model,
            thinking=thinking_config(settings),
            max_tokens=settings.max_tokens,
            retries=settings.max_retries,
            profile=profile,
            prompt_cache=settings.prompt_cache,
        )
    if vendor == "openai":
        from planner.vendors.clients import openai_client
        from planner.vendors.openai import OpenAIAdapter

        return OpenAIAdapter(
            openai_client(settings),
            model=settings.resolved_model,
            thinking=thinking_config(settings),
            max_tokens=settings.max_tokens,
            retries=settings.max_retries,
            profile=profile,
        )
    raise ValueError(f"{vendor!r} is not a model vendor")
