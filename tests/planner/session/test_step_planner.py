"""Session mode built from PlannerSettings, as the host uses it (`DirectPlanner` over a session)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from host.planner_client import DirectPlanner
from planner.decision import Decision
from planner.history import WorldEvent
from planner.session.factory import (
    open_session_planner,
    planner_mode,
    session_config,
    session_provider,
)
from planner.session.step_planner import condensed_text, observation_text
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    FakeModelServer,
    ScriptedTurn,
    thinking,
    tool_use,
)

INTENT = {"purpose": "open display", "expected_outcome": "the Display page shows"}


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as s:
        yield s


def _settings(server: FakeModelServer) -> PlannerSettings:
    return PlannerSettings(
        provider="anthropic",
        model="claude-test",
        thinking="budget",
        thinking_budget_tokens=1024,
        anthropic_api_key="test-key",
        anthropic_base_url=server.anthropic_base_url,
        max_retries=0,
    )


def test_mode_and_provider_mapping(server: FakeModelServer) -> None:
    settings = _settings(server)
    assert planner_mode(settings) == "compact"
    assert session_provider(settings) == "anthropic"
    assert session_provider(PlannerSettings(provider="openai")) == "openai-responses"
    with pytest.raises(ValueError, match="offline is compact only"):
        session_provider(PlannerSettings(provider="offline"))
    assert session_config(settings).max_tokens == settings.effective_max_tokens


def _event(decision: Decision, page: str, ok: bool) -> WorldEvent:
    event = WorldEvent.from_decision(decision, page=page, success=ok)
    event.scene_summary = {"page_after": "com.android.settings: Display"}
    return event


def test_the_goal_survives_condensing() -> None:
    scene = settings_main()
    assert "open display" in observation_text("open display", scene)
    assert condensed_text("open display", scene).startswith("Goal: open display\n")
    assert "Goal" not in condensed_text(None, scene)
    assert '"elements"' not in condensed_text(None, scene)


async def test_the_checkers_verdict_reaches_the_model_in_the_tool_result(
    server: FakeModelServer, tmp_path: Path
) -> None:
    """Session mode on the direct transport (the host's own path): the model reads "expected X
    — not met: <evidence>" in the result of the call it made, as the compact record says it."""
    server.anthropic_script.extend(
        [
            ScriptedTurn(
                [thinking("Display is e16."), tool_use("tap", {"element_id": "e16", **INTENT})]
            ),
            ScriptedTurn(
                [thinking("Not met."), tool_use("complete", {"success": False, "reason": "x"})]
            ),
        ]
    )
    step = DirectPlanner(
        await open_session_planner(
            _settings(server),
            store=SqliteSessionStore(tmp_path / "h.sqlite"),
            task_id="t",
            attempt=1,
        )
    )
    scene = settings_main()
    tap = await step.decide("open the display settings", scene, [])
    event = _event(tap, scene.page, True)
    event.verdict, event.evidence = (
        "not_met",
        "looked for page 'Display'; the screen shows 'Settings'",
    )
    await step.decide("open the display settings", scene, [event])
    await step.aclose()

    result = server.bodies("/v1/messages")[1]["messages"][-1]["content"][0]
    assert result["type"] == "tool_result"
    assert (
        "expected 'the Display page shows' — not met: looked for page 'Display'; "
        "the screen shows 'Settings'"
    ) in json.loads(result["content"])["verdict"]
