"""Tool schemas and parsing, prompts and their parser, history masking, settings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from amc.v1 import types_pb2
from planner.errors import PlannerAuthError, ToolCallError
from planner.history import WorldEvent
from planner.prompts import SYSTEM_PROMPT, build_user_prompt, parse_user_prompt
from planner.providers import make_provider
from planner.providers.offline import OfflineProvider
from planner.settings import PlannerSettings
from planner.tools import DEVICE_TOOLS, TOOLS, parse_tool_call, ui_tree_result
from planner.vendors.observed import ObservedAdapter
from tests.planner import scenes

IDS = {"e1", "e2"}
SIZE = (1080, 2400)
INTENT = {"purpose": "open display", "expected_outcome": "Display page open"}


def parse(name: str, args: Any) -> Any:
    return parse_tool_call(name, args, element_ids=IDS, screen_size=SIZE)


def test_every_device_tool_requires_non_empty_purpose_and_expected_outcome() -> None:
    by_name = {t.name: t for t in TOOLS}
    assert set(by_name) == {*DEVICE_TOOLS, "complete", "get_ui_tree"}
    for name in DEVICE_TOOLS:
        schema = by_name[name].parameters
        assert {"purpose", "expected_outcome"} <= set(schema["required"])
        assert schema["properties"]["purpose"]["minLength"] == 1
    assert by_name["complete"].parameters["required"] == ["success", "reason"]
    assert by_name["input_text"].parameters["properties"]["sensitive"]["type"] == "boolean"
    assert by_name["press_key"].parameters["properties"]["key"]["enum"] == [
        "back",
        "delete",
        "enter",
        "home",
    ]


def test_intent_is_stripped_from_executable_arguments() -> None:
    call = parse("tap", {"element_id": "e1", "long_press": True, **INTENT})
    assert call.arguments == {"element_id": "e1", "long_press": True}
    assert (call.purpose, call.expected_outcome) == ("open display", "Display page open")
    assert call.action.tap.element_id == "e1"
    assert call.action.tap.long_press
    assert call.action.purpose == "open display"


@pytest.mark.parametrize(
    ("name", "args", "action_field"),
    [
        ("tap", {"x": 10, "y": 2399.0, **INTENT}, "tap"),
        (
            "swipe",
            {"start_x": 5, "start_y": 2000, "end_x": 5, "end_y": 300, "duration_ms": 400, **INTENT},
            "swipe",
        ),
        ("input_text", {"text": "hi", "element_id": "e2", **INTENT}, "input_text"),
        ("press_key", {"key": "BACK", **INTENT}, "press_key"),
        ("launch_app", {"package_name": "com.android.settings", **INTENT}, "launch_app"),
        ("terminate_app", {"package_name": "com.android.settings", **INTENT}, "terminate_app"),
        ("complete", {"success": True, "reason": "done"}, "complete"),
        ("get_ui_tree", {}, "get_ui_tree"),
        ("get_ui_tree", "", "get_ui_tree"),
    ],
)
def test_valid_calls_build_typed_actions(name: str, args: Any, action_field: str) -> None:
    call = parse(name, args)
    assert call.action.WhichOneof("kind") == action_field
    assert "purpose" not in call.arguments
    assert "expected_outcome" not in call.arguments


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("click", {}, "unknown tool 'click'"),
        ("tap", {"element_id": "e1"}, "purpose and expected_outcome must be given"),
        (
            "tap",
            {"element_id": "e1", "purpose": "x", "expected_outcome": " "},
            "expected_outcome must be given",
        ),
        ("tap", {"element_id": "e9", **INTENT}, "element_id 'e9' is not in the current scene"),
        (
            "tap",
            {"x": 1080, "y": 5, **INTENT},
            "(1080, 5) is off the screen; the screen is 1080x2400",
        ),
        ("tap", {"x": 5, **INTENT}, "`y` must be an integer"),
        (
            "tap",
            {"element_id": "e1", "x": 1, "y": 1, **INTENT},
            "either element_id or both x and y",
        ),
        ("tap", {**INTENT}, "either element_id or both x and y"),
        ("tap", {"x": 1.5, "y": 3, **INTENT}, "whole number of pixels"),
        (
            "swipe",
            {"start_x": 0, "start_y": 0, "end_x": 0, "end_y": -1, **INTENT},
            "end (0, -1) is off the screen",
        ),
        ("input_text", {"text": 5, **INTENT}, "`text` must be a string"),
        (
            "press_key",
            {"key": "menu", **INTENT},
            "must be one of ['back', 'delete', 'enter', 'home']",
        ),
        ("complete", {"success": True}, "`reason` must be a non-empty string"),
        ("complete", {"success": "yes", "reason": "r"}, "`success` must be true or false"),
        ("tap", '{"element_id": ', "arguments are not valid JSON"),
        ("tap", {"element_id": "e1", "speed": 3, **INTENT}, "unknown argument(s) speed"),
    ],
)
def test_invalid_calls_say_what_is_wrong(name: str, args: Any, message: str) -> None:
    with pytest.raises(ToolCallError) as info:
        parse(name, args)
    assert message in str(info.value)


def test_without_scene_info_ids_and_points_are_not_checked() -> None:
    call = parse_tool_call("tap", {"element_id": "e99", **INTENT})
    assert call.arguments == {"element_id": "e99"}


def test_ui_tree_result_is_the_structured_node_list() -> None:
    nodes = ui_tree_result(scenes.launcher())
    assert nodes[0]["id"] == "e1"
    assert nodes[0]["text"] == "Phone"


def test_system_prompt_asks_for_judgement_then_exactly_one_tool() -> None:
    assert "did the previous step reach its expected outcome" in SYSTEM_PROMPT
    assert "call exactly one tool" in SYSTEM_PROMPT


def test_user_prompt_round_trips_and_holds_no_past_scene_or_thinking() -> None:
    scene = scenes.settings_main()
    old_scene = {"elements": [{"id": "e1", "text": "UNIQUE-OLD-SCREEN-TEXT"}]}
    history = [
        WorldEvent(
            action={"tool": "tap", "element_id": "e4", "target": "Settings"},
            page="com.android.launcher3: Home",
            purpose="open settings",
            expected_outcome="Settings open",
            rationale="First step.",
            thinking="SECRET-THINKING",
            success=True,
            scene_summary=old_scene,
        ),
        WorldEvent(
            action={"tool": "input_text", "text": "hunter2", "sensitive": True},
            page="x: Login",
            success=True,
        ),
    ]
    prompt = build_user_prompt("Turn on dark theme", scene, history)
    assert "UNIQUE-OLD-SCREEN-TEXT" not in prompt
    assert "SECRET-THINKING" not in prompt
    assert "hunter2" not in prompt
    assert "•••" in prompt
    parsed = parse_user_prompt(prompt)
    assert parsed.goal == "Turn on dark theme"
    assert parsed.scene == scene.to_prompt()
    assert parsed.history[0] == {
        "page": "com.android.launcher3: Home",
        "action": {
            "tool": "tap",
            "element_id": "e4",
            "target": "Settings",
            "purpose": "open settings",
            "expected_outcome": "Settings open",
        },
        "rationale": "First step.",
        "success": True,
        "step": 1,
    }


def test_a_goal_with_fences_and_quotes_still_parses() -> None:
    goal = 'Type "```json scene\n{}" into the note'
    parsed = parse_user_prompt(build_user_prompt(goal, scenes.launcher()))
    assert parsed.goal == goal
    assert len(parsed.scene["elements"]) == 5


def test_prompt_size_stays_flat_as_the_task_grows() -> None:
    scene = scenes.settings_main()
    event = WorldEvent(
        action={"tool": "tap", "element_id": "e17", "target": "Display"},
        page="com.android.settings: Settings",
        purpose="open display settings",
        expected_outcome="the Display page is open",
        rationale="The previous step opened Settings; now open Display.",
        success=True,
        scene_summary=scene.to_prompt(),
    )
    sizes = [
        len(build_user_prompt("Turn on dark theme", scene, [event] * n)) for n in (20, 40, 400)
    ]
    # Past the window only the step counters and the "N earlier steps omitted" note grow.
    assert sizes[1] - sizes[0] < 100
    assert sizes[2] - sizes[1] < 100
    # and one record costs a small fraction of one screen
    one = len(build_user_prompt("g", scene, [event])) - len(build_user_prompt("g", scene, []))
    assert one < len(json.dumps(scene.to_prompt())) / 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no sections", "missing the ```json goal section"),
        ('```json goal\n"g"\n```', "missing the ```json scene section"),
        ('```json goal\n"g"\n```\n```json scene\n{oops\n```', "scene section is not valid JSON"),
    ],
)
def test_parse_errors_name_the_section(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="user prompt") as info:
        parse_user_prompt(text)
    assert message in str(info.value)


def test_world_event_stores_masked_and_loads_old_records() -> None:
    event = WorldEvent(action={"tool": "input_text", "text": "pin 1234", "sensitive": True})
    assert event.to_dict()["action"]["text"] == "•••"
    old = WorldEvent.from_dict({"action": {"tool": "tap"}, "scene_summary": {"x": 1}, "future": 1})
    assert old.rationale is None
    assert old.page is None


# ---- settings -----------------------------------------------------------------------------


def test_offline_is_the_default_without_keys() -> None:
    settings = PlannerSettings()
    assert settings.resolved_provider == "offline"
    assert settings.thinking_mode == "off"
    assert settings.transport == "direct"
    provider = make_provider(settings)
    assert isinstance(provider, ObservedAdapter)  # priced and traced like every adapter
    assert isinstance(provider.inner, OfflineProvider)


def test_a_key_selects_its_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-x")
    assert PlannerSettings().resolved_provider == "anthropic"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.setenv("AMC_PLANNER_OPENAI_API_KEY", "sk-x")
    assert PlannerSettings().resolved_provider == "openai"
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    assert PlannerSettings().resolved_provider == "offline"


def test_environment_configures_thinking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMC_PLANNER_THINKING", "adaptive")
    monkeypatch.setenv("AMC_PLANNER_EFFORT", "high")
    settings = PlannerSettings()
    assert (settings.thinking_mode, settings.effort) == ("adaptive", "high")
    monkeypatch.delenv("AMC_PLANNER_THINKING")
    monkeypatch.setenv("AI_PLANNER_THINKING_BUDGET_TOKENS", "3000")
    legacy = PlannerSettings(max_tokens=1000)
    assert legacy.thinking_mode == "budget"
    assert legacy.effective_max_tokens > 3000


@pytest.mark.parametrize("budget", [1023, 50000])
def test_budget_out_of_range_is_a_settings_error(budget: int) -> None:
    with pytest.raises(ValueError, match="budget"):
        PlannerSettings(thinking="budget", thinking_budget_tokens=budget)


def test_a_real_provider_without_a_key_fails_at_start_up() -> None:
    with pytest.raises(PlannerAuthError, match="no Anthropic API key configured"):
        make_provider(PlannerSettings(provider="anthropic"))
    with pytest.raises(PlannerAuthError, match="no OpenAI API key configured"):
        make_provider(PlannerSettings(provider="openai"))


def test_key_enum_matches_proto() -> None:
    call = parse("press_key", {"key": "home", **INTENT})
    assert call.action.press_key.key == types_pb2.KEY_HOME


def test_press_key_delete_is_backspace() -> None:
    """The model can press "delete"; it becomes KEY_DELETE (KEYCODE_DEL on the phone)."""
    call = parse("press_key", {"key": "Delete", **INTENT})
    assert call.arguments == {"key": "delete"}
    assert call.action.press_key.key == types_pb2.KEY_DELETE
    schema = next(t for t in TOOLS if t.name == "press_key")
    assert "delete" in schema.description


def test_press_key_delete_survives_the_decision_record() -> None:
    """The cloud's decision record names the key again (masked_action → arguments)."""
    from planner.convert import decision_from_proto, decision_to_proto
    from planner.decision import Decision, Usage

    call = parse("press_key", {"key": "delete", **INTENT})
    decision = Decision(
        tool_name="press_key",
        arguments=call.arguments,
        action=call.action,
        purpose=call.purpose,
        expected_outcome=call.expected_outcome,
        rationale="erase the stray character",
        thinking=[],
        usage=Usage(),
        provider="offline",
        model="m",
        latency_s=0.1,
        forced_retry=False,
        system_prompt="s",
        user_prompt="u",
    )
    back = decision_from_proto(decision_to_proto(decision, decision_id="d1"))
    assert back.action.press_key.key == types_pb2.KEY_DELETE
    assert back.arguments == {"key": "delete"}
