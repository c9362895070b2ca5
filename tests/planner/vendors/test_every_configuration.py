"""Every planner configuration a user can choose, against fakes that refuse what the providers
document as invalid (`tests/support/fakes/`): each model profile, each thinking setting it
takes, compact mode with a screenshot and session mode over a task long enough to pass a
context checkpoint, each with an answer without a tool call (so the retry, forced or nudged,
is sent too). Not one request may be refused.

Real SDKs against the fake server; the transport to the model is the same adapter on the
direct and the cloud transport (the cloud's Decide builds it from the same settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planner.errors import PlannerConfigError
from planner.model_profiles import PROFILES, resolve
from planner.planner import Planner
from planner.session.factory import open_session_planner, session_config
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    ScriptedTurn,
    anthropic_message,
    chat_completion,
    function_call,
    message,
    openai_tool_call,
    reasoning,
    text,
    thinking,
    tool_use,
)
from tests.support.screenshots import phone_png

#: A model of each profile, as a user names it.
MODELS = {
    "claude-budget": "claude-sonnet-4-5-20250929",
    "claude-opus-4": "claude-opus-4-1",
    "claude-opus-4.5": "claude-opus-4-5",
    "claude-4.6": "claude-sonnet-4-6",
    "claude-adaptive-only": "claude-opus-4-7",
    "claude-5": "claude-opus-5",
    "claude-always-thinks": "claude-mythos-5",
    "claude-opus-5.5": "claude-opus-5-5",
    "claude-sonnet-5.5": "claude-sonnet-5-5",
    "claude-progress-updates": "claude-fable-5-1",
    "claude-newer": "claude-opus-9",
    "anthropic-unknown": "claude-in-house-tuned",
    "gpt-4.1": "gpt-4.1-mini",
    "gpt-4o": "gpt-4o",
    "gpt-5-chat": "gpt-5-chat-latest",
    "openai-reasoning": "gpt-5-mini",
    "gpt-5-pro": "gpt-5-pro",
    "gpt-5.1": "gpt-5.1",
    "gpt-5.1-codex-max": "gpt-5.1-codex-max",
    "gpt-5.2+": "gpt-5.4",
    "gpt-5.6": "gpt-5.6-sol",
    "gpt-5.1-codex": "gpt-5.1-codex",
    "gpt-5.1-codex-mini": "gpt-5.1-codex-mini",
    "gpt-5.x-codex": "gpt-5.3-codex",
    "gpt-5.x-pro": "gpt-5.5-pro",
    "gpt-6": "gpt-6-sol",
    "gpt-6-astra": "gpt-6.2-sol",
    "gpt-5.x-chat": "gpt-5.1-chat-latest",
    "openai-o-series": "o4-mini",
    "openai-o-series-pro": "o3-pro",
    "openai-o-series-text": "o3-mini",
    "o1-mini": "o1-mini",
    "openai-unknown": "in-house-gpt",
}


def configurations() -> list[Any]:
    """(profile, model, thinking) for every thinking setting each profile takes (a model
    without function tools is refused at start: tests/planner/test_model_profiles.py)."""
    out = []
    for name, profile in PROFILES.items():
        if not profile.tools:
            continue
        modes = (["off"] if profile.thinking_off is not None else []) + sorted(
            profile.thinking_modes
        )
        for mode in modes:
            out.append(pytest.param(name, MODELS[name], mode, id=f"{name}-{mode}"))
    return out


def test_every_profile_has_a_model_here() -> None:
    assert set(MODELS) == set(PROFILES)


#: The anthropic SDK warns of a model it knows to be deprecated (Claude Opus 4.5); a user may
#: still choose it until it is retired.
DEPRECATED = "ignore:The model .* is deprecated:DeprecationWarning"
INTENT = {"purpose": "go back", "expected_outcome": "the previous screen shows"}
#: Steps of the session task: past the first checkpoint (at twice `keep_scenes`, 6 by default).
STEPS = 14


def settings_for(server: FakeModelServer, model: str, mode: str, **more: Any) -> PlannerSettings:
    vendor = "anthropic" if model.startswith("claude") else "openai"
    values: dict[str, Any] = {
        "provider": vendor,
        "model": model,
        "thinking": mode,
        "anthropic_api_key": ANTHROPIC_KEY,
        "anthropic_base_url": server.anthropic_base_url,
        "openai_api_key": OPENAI_KEY,
        "openai_base_url": server.openai_base_url,
        "max_retries": 0,
        **more,
    }
    if mode == "budget":
        values["thinking_budget_tokens"] = 2048
    return PlannerSettings(**values)


def script(server: FakeModelServer, n: int, *, call: bool) -> None:
    """One answer on each wire format (the one the adapter uses takes it), with reasoning (left
    out by the fake where the request does not think), text and, with `call`, a tool call."""
    calls = [("press_key", {"key": "back", **INTENT})] if call else []
    server.script_anthropic(
        anthropic_message(
            thinking(f"thought {n}"), text(f"step {n}"), *(tool_use(*c) for c in calls)
        )
    )
    server.script_responses(
        ScriptedTurn(
            [reasoning(f"thought {n}"), message(f"step {n}"), *(function_call(*c) for c in calls)]
        )
    )
    server.script_openai(chat_completion(f"step {n}", *(openai_tool_call(*c) for c in calls)))


@pytest.mark.filterwarnings(DEPRECATED)
@pytest.mark.parametrize(("profile", "model", "mode"), configurations())
async def test_compact_with_a_screenshot(
    fake_server: FakeModelServer, profile: str, model: str, mode: str
) -> None:
    settings = settings_for(fake_server, model, mode, send_screenshot=True)
    assert resolve(settings).name == profile
    if not PROFILES[profile].vision:  # refused at start, before any call
        with pytest.raises(PlannerConfigError, match="AMC_PLANNER_SEND_SCREENSHOT=false"):
            make_adapter(settings)
        assert fake_server.requests == []
        return
    script(fake_server, 1, call=False)  # asked again: forced or nudged, as the profile says
    script(fake_server, 2, call=True)
    planner = Planner(make_adapter(settings), settings)
    try:
        decision = await planner.decide(
            "Turn on dark theme", settings_main(), screenshot=phone_png(1080, 2400, noisy_rows=4)
        )
    finally:
        await planner.aclose()
    assert fake_server.rejections == []
    assert decision.tool_name == "press_key" and decision.forced_retry
    first = fake_server.requests[0].body
    images = [
        part
        for m in first.get("messages") or first.get("input") or []
        for part in (m.get("content") if isinstance(m.get("content"), list) else [])
        if part.get("type") in ("image", "image_url", "input_image")
    ]
    assert len(images) == 1


@pytest.mark.filterwarnings(DEPRECATED)
@pytest.mark.parametrize(("profile", "model", "mode"), configurations())
async def test_a_long_session(
    fake_server: FakeModelServer, tmp_path: Path, profile: str, model: str, mode: str
) -> None:
    settings = settings_for(fake_server, model, mode)
    assert resolve(settings).name == profile
    for n in range(1, STEPS + 1):
        if n == 3:
            script(fake_server, 100, call=False)  # one answer without a call, mid-task
        script(fake_server, n, call=True)
    planner = await open_session_planner(
        settings,
        store=SqliteSessionStore(tmp_path / "host.sqlite"),
        task_id="t1",
        attempt=1,
        config=session_config(settings),
    )
    try:
        for n in range(1, STEPS + 1):
            decision = await planner.decide(f"screen {n}: Settings, Display, Sound")
            assert decision.tool_name == "press_key", decision
            await planner.record_tool_result("pressed back")
    finally:
        await planner.aclose()
    assert fake_server.rejections == []
    assert len(fake_server.requests) == STEPS + 1
