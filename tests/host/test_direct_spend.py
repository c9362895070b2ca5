"""The direct transport's own budget check counts what a failed decision's answered calls cost:
the provider billed them, and a step that failed while planning was temporarily impossible is
asked again in the same attempt (`host.agent.planning_wait`). Real Anthropic SDK against the fake
Messages server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from host.planner_client import DirectPlanner
from planner.budget import Budget, FleetDay
from planner.decision import Usage
from planner.errors import BudgetExhausted, PlannerUnavailable
from planner.planner import Planner
from planner.session.config import SessionConfig
from planner.session.planner import SessionPlanner
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    FakeModelServer,
    ScriptedTurn,
    anthropic_error,
    anthropic_message,
    text,
    thinking,
    tool_use,
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


async def test_a_stream_the_provider_broke_off_counts_toward_the_direct_budget(
    fake_server: FakeModelServer, tmp_path: Path
) -> None:
    """Session mode streams: the provider fails the stream after message_start reported 500
    input tokens (and 1 output). The step fails as temporarily impossible and is asked again
    in the same attempt; under a 400-token cap the planner refuses before any call, having
    counted what the broken stream reported."""
    fake_server.script_anthropic(
        ScriptedTurn(
            [thinking("Settings is open."), tool_use("tap", {"element_id": "e17"})],
            usage={
                "input_tokens": 500,
                "output_tokens": 300,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
            fail=("overloaded_error", "Overloaded"),
        )
    )
    settings = PlannerSettings(
        provider="anthropic",
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=fake_server.anthropic_base_url,
        model="claude-sonnet-4-6",
        mode="session",
        thinking="adaptive",
        max_retries=0,
    )
    session = await SessionPlanner.open(
        store=SqliteSessionStore(tmp_path / "sessions.sqlite3"),
        task_id="t1",
        attempt=1,
        adapter=make_adapter(settings),
        owns_adapter=True,
        config=SessionConfig(stream=True),
    )
    direct = DirectPlanner(session, budget=Budget(max_tokens=400))
    try:
        with pytest.raises(PlannerUnavailable, match="overloaded_error"):
            await direct.decide("Turn on dark theme", settings_main())
        with pytest.raises(BudgetExhausted, match="501 tokens of the task's 400"):
            await direct.decide("Turn on dark theme", settings_main())
    finally:
        await session.aclose()
    assert len(fake_server.requests) == 1, "no model call past the cap"


async def test_the_fleet_s_day_counts_the_host_s_calls_a_renewal_had_not_seen_yet(
    fake_server: FakeModelServer,
) -> None:
    """A daily cap of 1,500 tokens, 600 spent when the attempt was assigned. After the first
    call (600) a renewal says the day still stands at 600: the host had not shipped its call
    yet. The host counts it all the same: the second call is made (1,200 of 1,500 before it),
    the third is refused at 1,800 ("of the fleet's daily 1,500"), as Decide would refuse it.
    Then a renewal that counts both calls and another host's 100 tokens: still refused."""
    launch = tool_use(
        "launch_app",
        {"package_name": "com.android.settings", "purpose": "open", "expected_outcome": "open"},
    )
    fake_server.script_anthropic(
        *[anthropic_message(launch, input_tokens=500, output_tokens=100) for _ in range(3)]
    )
    settings = PlannerSettings(
        provider="anthropic",
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=fake_server.anthropic_base_url,
        model="claude-sonnet-4-6",
        max_retries=0,
    )
    planner = Planner(make_adapter(settings), settings)
    day = FleetDay()
    cap = Budget(max_tokens=1500)
    day.heard(cap, "2026-12-05", Usage(500, 100))  # the assignment's word
    direct = DirectPlanner(planner, fleet_day=day)
    try:
        await direct.decide("Open settings", settings_main())
        day.heard(cap, "2026-12-05", Usage(500, 100))  # a renewal before the call was shipped
        await direct.decide("Open settings", settings_main())
        with pytest.raises(BudgetExhausted, match=r"1,800 tokens of the fleet's daily 1,500 "):
            await direct.decide("Open settings", settings_main())
        day.heard(cap, "2026-12-05", Usage(1600, 300))  # shipped, and another host's 100
        with pytest.raises(BudgetExhausted, match=r"1,900 tokens of the fleet's daily 1,500 "):
            await direct.decide("Open settings", settings_main())
        day.heard(cap, "2026-12-06", Usage())  # a new UTC day: the cap is not spent
        assert day.refusal() is None
    finally:
        await planner.aclose()
    assert len(fake_server.requests) == 2, "no model call past the daily cap"
