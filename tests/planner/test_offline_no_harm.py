"""The offline planner does no harm: it touches a switch only when its goal names it, reads
on/off wherever the words sit, answers what the phone puts in the way without changing
anything, and judges success from the screen."""

from __future__ import annotations

from typing import Any

import pytest

from planner.history import WorldEvent
from planner.planner import Planner
from planner.providers.offline import OfflineProvider
from planner.providers.offline.goal import parse_goal
from planner.scene import Scene
from tests.planner import scenes
from tests.planner.scenes import H, W, el


async def decide(
    goal: str, scene: Scene, history: list[WorldEvent | dict[str, Any]] | None = None
) -> Any:
    return await Planner(OfflineProvider()).decide(goal, scene, history or [])


@pytest.mark.parametrize(
    ("goal", "explicit", "soft"),
    [
        ("Turn off Wi-Fi", False, None),
        ("Turn Wi-Fi off", False, None),
        ("Switch Data Saver on", True, None),
        ("Please switch Do Not Disturb on now", True, None),
        ("Disable Bluetooth", False, None),
        ("Stop using the 24-hour time format", False, None),
        ("I want dark mode", None, True),
        ("Show the battery percentage", None, True),
        ("Put the phone in airplane mode", None, True),
        ("Schalte das WLAN aus", False, None),
        ("Aktiviere den Energiesparmodus", True, None),
        ("Set an alarm for 7:30", None, None),
        ("Set an alarm for 7:30 on weekdays", None, None),
        ("Create a contact named Ada Lovelace with phone 555 0100", None, None),
    ],
)
def test_on_and_off_wherever_the_words_sit(
    goal: str, explicit: bool | None, soft: bool | None
) -> None:
    parsed = parse_goal(goal)
    assert (parsed.want_on, parsed.soft_on) == (explicit, soft)


def test_the_phone_in_a_goal_is_the_device_not_an_app() -> None:
    assert "phone" not in parse_goal("Put the phone in airplane mode").keywords


def test_a_goal_names_a_switch_only_by_all_its_telling_words() -> None:
    goal = parse_goal("Show the battery percentage")
    assert goal.names("Battery percentage")
    assert not goal.names("Battery Saver")
    assert parse_goal("I want dark mode").names("Dark theme")  # mode and theme: one thing
    assert parse_goal("Put the phone in airplane mode").names("Airplane mode")
    assert not parse_goal("Put the phone in airplane mode").names("Dark theme")


async def test_never_flips_a_switch_the_goal_does_not_name() -> None:
    only_saver = scenes.toggle_page("Battery", [("Battery Saver", False)])
    d = await decide("Show the battery percentage", only_saver)
    tapped = only_saver.element(d.arguments.get("element_id", ""))
    assert d.tool_name != "tap" or tapped is None or not _holds_switch(only_saver, tapped)
    both = scenes.toggle_page("Battery", [("Battery Saver", False), ("Battery percentage", False)])
    d = await decide("Show the battery percentage", both)
    assert d.tool_name == "tap"
    assert "Battery percentage" in d.purpose
    done = await decide(
        "Show the battery percentage",
        scenes.toggle_page("Battery", [("Battery Saver", False), ("Battery percentage", True)]),
    )
    assert (done.tool_name, done.arguments["success"]) == ("complete", True)


def _holds_switch(scene: Scene, tapped: Any) -> bool:
    b = tapped.bounds
    return any(
        e.checkable
        and b.left <= e.bounds.left
        and b.top <= e.bounds.top
        and b.right >= e.bounds.right
        and b.bottom >= e.bounds.bottom
        for e in scene.elements
    )


async def test_navigating_never_taps_a_row_that_holds_a_switch() -> None:
    page = scenes.toggle_page("Display", [("Adaptive brightness", True)])
    d = await decide("Change the brightness level", page)
    assert d.tool_name != "tap" or not _holds_switch(page, page.element(d.arguments["element_id"]))


def _dialog(package: str, overlay: str, title: str, buttons: list[str]) -> Scene:
    elements = [el(1, title, (100, 900, 980, 1000))]
    for i, label in enumerate(buttons):
        y = 1100 + i * 180
        elements.append(el(i + 2, label, (100, y, 980, y + 150), clickable=True))
    return Scene(elements, package, title, W, H, overlays=[overlay])


async def test_a_permission_prompt_is_declined_unless_the_goal_asks_to_allow() -> None:
    prompt = _dialog(
        "com.android.permissioncontroller",
        "permission_prompt",
        "Allow Clock to send you notifications?",
        ["Allow", "Don’t allow"],
    )
    d = await decide("Set an alarm for 6:45", prompt)
    assert d.tool_name == "tap"
    assert prompt.element(d.arguments["element_id"]).text == "Don’t allow"  # type: ignore[union-attr]
    allow = await decide("Allow Clock to send notifications", prompt)
    assert prompt.element(allow.arguments["element_id"]).text == "Allow"  # type: ignore[union-attr]


async def test_not_responding_is_answered_with_wait() -> None:
    anr = _dialog(
        "android", "app_not_responding", "System UI isn't responding", ["Close app", "Wait"]
    )
    d = await decide("Turn on Do Not Disturb", anr)
    assert anr.element(d.arguments["element_id"]).text == "Wait"  # type: ignore[union-attr]


async def test_the_shade_is_closed_unless_a_tile_the_goal_names_is_the_way() -> None:
    tiles = [
        el(
            1,
            "",
            (32, 220, 520, 390),
            checkable=True,
            checked=True,
            clickable=True,
            content_desc="Internet",
        ),
        el(
            2,
            "",
            (552, 220, 1048, 390),
            checkable=True,
            checked=False,
            clickable=True,
            content_desc="Airplane mode",
        ),
    ]
    shade = Scene(tiles, "com.android.systemui", "12:30", W, H, overlays=["notification_shade"])
    d = await decide("Set the font size to Large", shade)
    assert d.tool_name == "press_key" and d.arguments == {"key": "back"}
    tile = await decide("Turn on airplane mode", shade)
    assert tile.tool_name == "tap" and tile.arguments == {"element_id": "e2"}


async def test_the_keyboard_is_hidden_when_it_covers_save() -> None:
    scene = scenes.contact_editor(name="Ada Lovelace", phone="555 0100")
    scene.elements.pop(2)  # Save is under the keyboard: perception left it out
    scene.overlays.append("keyboard")
    d = await decide("Create a contact named Ada Lovelace with phone 555 0100", scene)
    assert d.tool_name == "press_key" and d.arguments == {"key": "back"}
    assert "keyboard" in d.purpose


async def test_a_delete_goal_never_taps_a_create_control() -> None:
    page = scenes.contacts_list(("Aaron Adams", "Bella Brook"))
    page.elements[1] = el(2, "", (0, 272, W, 2000), scrollable=True)
    d = await decide("Delete the contact Zeno Zanetti", page)
    assert d.tool_name == "swipe"  # not "Create contact": the target must be further down
