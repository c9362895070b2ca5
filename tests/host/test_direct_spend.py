"""The direct transport's own budget check counts what a failed decision's answered calls cost:
the provider billed them, and a step that failed while planning was temporarily impossible is
asked again in the same attempt (`host.agent.planning_wait`). Real Anthropic SDK against the fake
Messages server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from host.planner_client import DirectPlanner
from planner.budget import Budget
from planner.errors import BudgetExhausted, PlannerUnavailable
from planner.planner import Planner
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    FakeModelServer,
    anthropic_error,
    anthropic_message,
    text,
)


@pytest.fixture
def fake_server() -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as server:
        yield server


async def test_a_failed_decision_s_billed_calls_count_toward_the_direct_budget(
    fake_server: FakeModelServer,
) -> None:
    """An answer without a tool call (600 tokens, billed), then the provider fails on the
    retry: the step fails as temporarily impossible. Asked again under a 500-token cap, the
    planner refuses before any call, having counted the 600 tokens."""
    fake_server.script_anthropic(
        anthropic_message(text("Let me look."), input_tokens=500, output_tokens=100),
        anthropic_error(500, "api_error", "Internal server error"),
    )
    settings = PlannerSettings(
        provider="anthropic",
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=fake_server.anthropic_base_url,
        model="claude-sonnet-4-6",
        max_retries=0,
    )
    planner = Planner(make_adapter(settings), settings)
    direct = DirectPlanner(planner, budget=Budget(max_tokens=500))
    try:
        with pytest.raises(PlannerUnavailable):
            await direct.decide("Turn on dark theme", settings_main())
        with pytest.raises(BudgetExhausted, match="600 tokens of the task's 500"):
            await direct.decide("Turn on dark theme", settings_main())
    finally:
        await planner.aclose()
    assert len(fake_server.requests) == 2, "no model call past the cap"
