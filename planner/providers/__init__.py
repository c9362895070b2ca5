"""Model providers behind one protocol: Anthropic, OpenAI (official SDKs) and the offline agent."""

from __future__ import annotations

from planner.providers.base import Provider, ProviderRequest, ProviderResponse, ToolCall
from planner.settings import PlannerSettings

__all__ = ["Provider", "ProviderRequest", "ProviderResponse", "ToolCall", "make_provider"]


def make_provider(settings: PlannerSettings) -> Provider:
    """The provider `settings` select (see `PlannerSettings.resolved_provider`).

    Raises `PlannerAuthError` when a real provider is selected without its API key, so a
    misconfiguration shows up at start-up rather than at the first step.
    """
    name = settings.resolved_provider
    if name == "anthropic":
        from planner.providers.anthropic import AnthropicProvider

        return AnthropicProvider(settings)
    if name == "openai":
        from planner.providers.openai import OpenAIProvider

        return OpenAIProvider(settings)
    from planner.providers.offline import OfflineProvider

    return OfflineProvider()
