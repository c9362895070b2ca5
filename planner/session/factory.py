"""Building a SessionPlanner from the planner settings, so the integrator wires one call.

Session mode reuses every `AMC_PLANNER_*` setting the compact planner reads (provider, model,
thinking, effort, budget, max tokens, keys, base URLs, retries, timeout). The session knobs
(`AMC_PLANNER_MODE`, `AMC_PLANNER_SESSION_*`) are read from the settings object when it has
them and fall back to `SessionConfig`'s defaults until `planner/settings.py` declares them.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai

from planner.providers.clients import anthropic_client, openai_client
from planner.session.config import PlannerMode, SessionConfig, SessionProvider, ThinkingConfig
from planner.session.planner import SessionPlanner
from planner.session.store import SessionStore
from planner.session.streaming import ThinkingSink
from planner.settings import PlannerSettings


def planner_mode(settings: PlannerSettings) -> PlannerMode:
    """`AMC_PLANNER_MODE`: "compact" (default) or "session"."""
    mode = getattr(settings, "mode", None) or "compact"
    if mode not in ("compact", "session"):
        raise ValueError(f"AMC_PLANNER_MODE must be compact or session, got {mode!r}")
    return "session" if mode == "session" else "compact"


def session_provider(settings: PlannerSettings) -> SessionProvider:
    """Session mode speaks Anthropic Messages or OpenAI Responses; the offline provider has no
    conversation to keep, so it stays on the compact planner."""
    provider = settings.resolved_provider
    if provider == "anthropic":
        return "anthropic"
    if provider == "openai":
        return "openai-responses"
    raise ValueError(
        "session mode needs the anthropic or openai provider (offline is compact only)"
    )


def thinking_config(settings: PlannerSettings) -> ThinkingConfig:
    return ThinkingConfig(
        mode=settings.thinking_mode,
        effort=settings.effort,
        budget_tokens=settings.thinking_budget_tokens,
    )


def session_config(settings: PlannerSettings) -> SessionConfig:
    """`AMC_PLANNER_SESSION_KEEP_SCENES`, `…_KEEP_REASONING_TURNS`, `…_FOREIGN_REASONING`,
    `…_STREAM` when the settings class declares them (as `session_keep_scenes`, …)."""
    defaults = SessionConfig()
    values: dict[str, Any] = {
        "keep_scenes": getattr(settings, "session_keep_scenes", defaults.keep_scenes),
        "keep_reasoning_turns": getattr(
            settings, "session_keep_reasoning_turns", defaults.keep_reasoning_turns
        ),
        "foreign_reasoning": getattr(
            settings, "session_foreign_reasoning", defaults.foreign_reasoning
        ),
        "stream": bool(getattr(settings, "session_stream", defaults.stream)),
        "max_tokens": settings.effective_max_tokens,
    }
    return SessionConfig(**values)


def make_session_client(
    settings: PlannerSettings, provider: SessionProvider
) -> anthropic.AsyncAnthropic | openai.AsyncOpenAI:
    if provider == "anthropic":
        return anthropic_client(settings)
    return openai_client(settings)


async def open_session_planner(
    settings: PlannerSettings,
    *,
    store: SessionStore,
    task_id: str,
    attempt: int,
    on_thinking: ThinkingSink | None = None,
    config: SessionConfig | None = None,
    client: anthropic.AsyncAnthropic | openai.AsyncOpenAI | None = None,
) -> SessionPlanner:
    """A SessionPlanner for one task attempt, with its stored conversation loaded.

    `client` shares one SDK client (and its connection pool) across many planners — the cloud
    opens a planner per Decide call; without it the planner makes and owns its own.
    """
    provider = session_provider(settings)
    return await SessionPlanner.open(
        store=store,
        task_id=task_id,
        attempt=attempt,
        provider=provider,
        model=settings.resolved_model,
        client=client or make_session_client(settings, provider),
        owns_client=client is None,
        thinking=thinking_config(settings),
        config=config or session_config(settings),
        on_thinking=on_thinking,
    )


class SessionPlanners:
    """Opens session planners for one service (the cloud's Decide), sharing one SDK client.

    Raises ValueError at construction when the settings' provider cannot keep a conversation
    (offline), so a service knows up front whether it offers session mode at all.
    """

    def __init__(self, settings: PlannerSettings) -> None:
        self.settings = settings
        self.provider = session_provider(settings)
        self._client = make_session_client(settings, self.provider)

    async def open(
        self,
        store: SessionStore,
        task_id: str,
        attempt: int,
        *,
        on_thinking: ThinkingSink | None = None,
    ) -> SessionPlanner:
        """The planner of one attempt with its stored conversation loaded (or continued from
        the latest earlier attempt); live thinking goes to `on_thinking` when streaming."""
        return await open_session_planner(
            self.settings,
            store=store,
            task_id=task_id,
            attempt=attempt,
            client=self._client,
            on_thinking=on_thinking,
        )

    async def aclose(self) -> None:
        await self._client.close()
