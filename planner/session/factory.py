"""Building a SessionPlanner from the planner settings, so the integrator wires one call.

Session mode reuses every `AMC_PLANNER_*` setting the compact planner reads (provider, model,
thinking, effort, budget, max tokens, keys, base URLs, retries, timeout) through the same
vendor adapter (`planner.vendors.make_adapter`); the session knobs are `AMC_PLANNER_MODE` and
`AMC_PLANNER_SESSION_*`.
"""

from __future__ import annotations

from typing import Literal

from planner.session.config import SessionConfig
from planner.session.planner import SessionPlanner
from planner.session.store import SessionStore
from planner.settings import PlannerSettings
from planner.vendors import ModelAdapter, PlannerMode, ThinkingSink, make_adapter

SessionProvider = Literal["anthropic", "openai-responses"]


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


def session_config(settings: PlannerSettings) -> SessionConfig:
    """`AMC_PLANNER_SESSION_KEEP_SCENES`, `…_KEEP_REASONING_TURNS`, `…_FOREIGN_REASONING`,
    `…_STREAM` and the output limit."""
    return SessionConfig(
        keep_scenes=settings.session_keep_scenes,
        keep_reasoning_turns=settings.session_keep_reasoning_turns,
        foreign_reasoning=settings.session_foreign_reasoning,
        stream=settings.session_stream,
        max_tokens=settings.effective_max_tokens,
    )


async def open_session_planner(
    settings: PlannerSettings,
    *,
    store: SessionStore,
    task_id: str,
    attempt: int,
    on_thinking: ThinkingSink | None = None,
    config: SessionConfig | None = None,
    adapter: ModelAdapter | None = None,
) -> SessionPlanner:
    """A SessionPlanner for one task attempt, with its stored conversation loaded.

    `adapter` shares one adapter (and its SDK connection pool) across many planners — the cloud
    opens a planner per Decide call; without it the planner makes and owns its own.
    """
    session_provider(settings)  # refuses offline with the reason
    return await SessionPlanner.open(
        store=store,
        task_id=task_id,
        attempt=attempt,
        adapter=adapter or make_adapter(settings),
        owns_adapter=adapter is None,
        config=config or session_config(settings),
        on_thinking=on_thinking,
    )


class SessionPlanners:
    """Opens session planners for one service (the cloud's Decide), sharing one adapter.

    Raises ValueError at construction when the settings' provider cannot keep a conversation
    (offline), so a service knows up front whether it offers session mode at all.
    """

    def __init__(self, settings: PlannerSettings, adapter: ModelAdapter | None = None) -> None:
        self.settings = settings
        self.provider = session_provider(settings)
        self._owns_adapter = adapter is None
        self.adapter = adapter or make_adapter(settings)

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
            adapter=self.adapter,
            on_thinking=on_thinking,
        )

    async def aclose(self) -> None:
        if self._owns_adapter:
            await self.adapter.aclose()
