"""The Node example host on screens of several windows: what covers the app (a permission prompt,
an "isn't responding" dialog, the notification shade, the keyboard), as the Python host names it.

Real parts: `amc cloud serve` (SQLite, mTLS, offline planner) as its own process, the virtual
phone served over the adb protocol, and host.js as its own process. What host.js sends is
compared with what the Python host's perception makes of the same `uiautomator dump --windows`
(host/perception/hierarchy.py `parse_scene`, planner/observation.py `observation_from_scene`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from amc.v1 import types_pb2
from host.devices.virtual.apps.launcher import LAUNCHER_PACKAGE
from host.devices.virtual.apps.notes import PKG as NOTES
from host.devices.virtual.layout import Node, finalize
from host.devices.virtual.phone import Surface, VirtualPhone
from host.devices.virtual.state import Note
from host.perception.hierarchy import parse_scene
from planner.observation import observation_from_scene
from planner.scene import Element
from tests.node.test_node_host import _one_task, node

__all__ = ["node"]


def _keyboard_up(phone: VirtualPhone) -> None:
    assert phone.launch(NOTES)
    phone.tap(926, 2114)  # New note
    phone.tap(540, 784)  # the note's body: the keyboard comes up
    assert phone.keyboard_shown()


_SCENES: dict[str, tuple[Callable[[VirtualPhone], None], types_pb2.Overlay.ValueType]] = {
    "permission-prompt": (
        lambda phone: phone.show_permission_prompt("com.android.contacts"),
        types_pb2.OVERLAY_PERMISSION_PROMPT,
    ),
    "app-not-responding": (
        lambda phone: phone.show_anr("com.android.chrome", "Chrome"),
        types_pb2.OVERLAY_APP_NOT_RESPONDING,
    ),
    "notification-shade": (lambda phone: phone.open_shade(), types_pb2.OVERLAY_NOTIFICATION_SHADE),
    "keyboard": (_keyboard_up, types_pb2.OVERLAY_KEYBOARD),
}


@pytest.mark.parametrize("scene", list(_SCENES))
async def test_the_node_host_names_what_covers_the_app_as_the_python_host_does(
    node: str, tmp_path: Path, scene: str
) -> None:
    """A permission prompt, an "isn't responding" dialog, the shade or the keyboard over the
    app: the Python host names it in `ScreenObservation.overlays`, so the model knows the app is
    out of reach until it deals with it. host.js sent no overlays at all: the model read the
    prompt's Allow button as part of the app. It now names them as the Python host does.
    And the app in front is the covering window's, as the Python host says it: host.js took
    the focused window's title for a package ("NotificationShade" with the shade down) or
    sent none (an "Application Not Responding: …" window)."""
    phone = VirtualPhone("emulator-5554")
    show, overlay = _SCENES[scene]
    show(phone)
    python = observation_from_scene(
        parse_scene(phone.dump_windows(), package=phone.current_package())
    )
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    seen = decisions[0].observation
    assert list(python.overlays) == [overlay]
    assert list(seen.overlays) == list(python.overlays)
    assert seen.foreground_package == python.foreground_package


async def test_the_node_host_names_the_app_in_front_on_the_phones_own_display(
    node: str, tmp_path: Path
) -> None:
    """A phone with a second display (a cast or presentation screen, a foldable's cover
    screen): from Android 10 `dumpsys window` names each display's focus in its own block, and
    lists the other display's first. host.js took the first focus it found and told the cloud
    the presentation app on the second display was in front of the phone it drives. As the
    Python host does (host/devices/adb_driver.py `parse_current_window`), it now reads display
    0's block."""
    phone = VirtualPhone("emulator-5554")
    phone.multi_display = True
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    seen = decisions[0].observation
    assert seen.foreground_package == "com.android.launcher3"
    assert seen.foreground_activity.startswith("com.android.launcher3/")


async def test_the_node_host_does_not_name_the_app_that_hung_hours_ago_in_front(
    node: str, tmp_path: Path
) -> None:
    """For two hours after an "isn't responding" dialog, `dumpsys window` opens with its LAST
    ANR section: the focus of that moment. host.js took it for the current one and told the
    cloud the app that hung was in front. As the Python host does (host/devices/adb_driver.py
    `without_last_anr`), it now reads the live sections after it."""
    phone = VirtualPhone("emulator-5554")
    assert phone.launch("com.android.settings")
    phone.show_anr("com.android.settings", "Settings")
    phone.prompts.clear()  # the dialog is gone; the snapshot stays
    phone.press_key("home")
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    seen = decisions[0].observation
    assert seen.foreground_package == "com.android.launcher3"
    assert seen.foreground_activity.startswith("com.android.launcher3/")


async def test_the_node_host_dumps_android_4_1_without_the_windows_option(
    node: str, tmp_path: Path
) -> None:
    """Android 4.1-4.2's `uiautomator dump` takes its first argument for the file: `dump
    --windows /dev/tty` tried to write `/--windows` and printed no tree, so every look went on
    without one. As the Python host does (host/devices/adb_driver.py `PLAIN_DUMP_COMMAND`),
    host.js now dumps such a phone without the option."""
    phone = VirtualPhone("emulator-5554")
    phone.sdk = 16
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    seen = decisions[0].observation
    assert not seen.ui_tree_missing, said
    assert seen.elements


@pytest.mark.parametrize("glitches", [4, 5], ids=["settles-at-the-last-try", "never-settles"])
async def test_the_node_host_rides_out_dumps_with_a_null_root_as_the_python_host_does(
    node: str, tmp_path: Path, glitches: int
) -> None:
    """`uiautomator dump` answers "ERROR: null root node returned by UiTestAutomationBridge."
    while a window changes, several times in a row on a busy phone. host.js tried three times
    back to back and then ended the attempt as a host error, not retryable: the task failed for
    good for a screen that was settling. As the Python host does (host/perception/perceive.py
    `scene_from_dump`), it now tries five times with a growing pause; and when the phone
    answered every try with such an error, the step goes on without a UI tree, the model told
    why (`ui_tree_missing`), and the planner decides (here the offline planner, shown nothing,
    gives up)."""
    phone = VirtualPhone("emulator-5554")
    phone.glitch_dumps("null_root", glitches)
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    first = decisions[0].observation
    assert (first.screen_width, first.screen_height) == (1080, 2400)
    assert first.foreground_package == "com.android.launcher3"
    if glitches < 5:
        assert not first.ui_tree_missing
        assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
        assert phone.state.flag("dark_theme")
    else:
        assert "null root node returned by UiTestAutomationBridge" in first.ui_tree_missing
        assert not first.elements
        assert decisions[0].tool_name == "complete", said
        assert "host error" not in final.attempts[0].failure_reason, said


async def test_the_node_host_reads_a_dump_with_raw_quotes_as_the_python_host_does(
    node: str, tmp_path: Path
) -> None:
    """Some OEM dumpers leave `"`, `&` and `<` in texts unescaped (`text="Say "hi" & <wave>"`).
    host.js's parser ended the value at the first raw `"`: the note was shown to the model as
    `Say ` and the rest of its text was lost, with nothing said about the dump. As the Python
    host does (host/perception/dump_text.py `repair_dump`), a quote that no attribute or tag
    end follows is now kept in the text, and `ui_tree_repaired` says the dump was repaired."""
    phone = VirtualPhone("emulator-5554")
    phone.unescaped_dumps = True
    phone.state.notes.append(Note(title='Say "hi" & <wave>', body=""))
    assert phone.launch(NOTES)
    python = observation_from_scene(
        parse_scene(phone.dump_windows(), package=phone.current_package())
    )
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    seen = decisions[0].observation
    assert 'Say "hi" & <wave>' in [e.text for e in python.elements]
    assert [e.text for e in seen.elements] == [e.text for e in python.elements]
    assert "unescaped '&', '<' or '\"'" in python.ui_tree_repaired
    assert seen.ui_tree_repaired == python.ui_tree_repaired


async def test_a_look_without_a_tree_says_the_screen_as_the_phones_own_display_is_turned(
    node: str, tmp_path: Path
) -> None:
    """Without a dump to say how the screen is turned, host.js took the first `orientation=`
    of `dumpsys display`: with a second display attached (listed first, upright) a phone held
    sideways was reported upright, 1080x2400, and the model read every point against the wrong
    screen. As the Python host does (host/devices/screen_size.py), it now reads display 0's
    viewport."""
    phone = VirtualPhone("emulator-5554")
    phone.multi_display = True
    phone.rotate(1)
    phone.glitch_dumps("null_root", 5)
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    first = decisions[0].observation
    assert first.ui_tree_missing, said
    assert (first.screen_width, first.screen_height) == (2400, 1080)
    assert first.rotation == types_pb2.ROTATION_90


class _PopupPhone(VirtualPhone):
    """A phone whose app shows a popup that does not take the focus (a long-press menu, an
    autocomplete list: a window of the app's own package over its activity, which keeps the
    focus), as `uiautomator dump --windows` lists it."""

    def surfaces(self) -> list[Surface]:
        shown = super().surfaces()
        popup = Node("android.widget.ListView", (100, 900, 700, 1200)).add(
            Node(
                "android.widget.TextView", (100, 900, 700, 1050), text="Add to home", clickable=True
            ),
            Node(
                "android.widget.TextView", (100, 1050, 700, 1200), text="App info", clickable=True
            ),
        )
        root = finalize(popup)
        shown.insert(
            1,
            Surface(
                "dialog", LAUNCHER_PACKAGE, "PopupWindow", "TYPE_APPLICATION", 2, root, False, 150
            ),
        )
        return shown


async def test_the_node_host_shows_a_popup_over_the_focused_window_as_the_python_host_does(
    node: str, tmp_path: Path
) -> None:
    """A popup that does not take the focus (a long-press menu, an autocomplete list) is a
    window of its own over the focused activity. host.js showed the model the focused window
    alone: the popup's items never reached it, and a tap on what it showed under the popup
    landed on the popup. It now shows the windows the Python host shows of the same dump."""
    phone = _PopupPhone("emulator-5554")

    def shown(e: Element | types_pb2.UiElement) -> tuple[str, tuple[int, ...]]:
        b = e.bounds
        return (e.text, (b.left, b.top, b.right, b.bottom))

    expected = [
        shown(e) for e in parse_scene(phone.dump_windows(), package=LAUNCHER_PACKAGE).elements
    ]
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    assert [shown(e) for e in decisions[0].observation.elements] == expected
    assert {"Add to home", "App info"} <= {text for text, _ in expected}


class _ShareSheetPhone(VirtualPhone):
    """A phone with Android 13+'s share sheet up over the app: an activity of
    `com.android.intentresolver` (translucent, the screen's size) with the focus, as
    `uiautomator dump --windows` lists it."""

    def surfaces(self) -> list[Surface]:
        shown = super().surfaces()
        shown[0].focused = False
        w, h = self.geometry.width, self.geometry.height
        sheet = Node("android.widget.FrameLayout", (0, 0, w, h)).add(
            Node("android.widget.Button", (100, 1650, 400, 1850), text="Messages", clickable=True),
            Node("android.widget.Button", (500, 1650, 800, 1850), text="Copy", clickable=True),
        )
        chooser = Surface(
            "app",
            "com.android.intentresolver",
            "ChooserActivity",
            "TYPE_APPLICATION",
            2,
            finalize(sheet),
            False,
            160,
            activity="com.android.intentresolver.ChooserActivity",
            focused=True,
        )
        shown.insert(1, chooser)
        return shown


async def test_the_node_host_hides_the_app_under_another_apps_activity_as_the_python_host_does(
    node: str, tmp_path: Path
) -> None:
    """Android 13+'s share sheet is another app's activity over the app, with the focus (a tap
    above the sheet closes it). host.js hid only the focused app's own windows under it, so
    the app's buttons behind the sheet were sent as in reach beside the share targets, and a
    tap meant for one of them landed on the sheet. As the Python host does (`_past_app_dialog`),
    any app's focused activity now hides the app windows it lies within."""
    phone = _ShareSheetPhone("emulator-5554")
    expected = [
        e.text for e in parse_scene(phone.dump_windows(), package=LAUNCHER_PACKAGE).elements
    ]
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    assert expected == ["Messages", "Copy"]
    assert [e.text for e in decisions[0].observation.elements] == expected


async def test_the_node_host_keeps_the_app_below_a_floating_keyboard_as_the_python_host_does(
    node: str, tmp_path: Path
) -> None:
    """A floating keyboard (Gboard's, Samsung Keyboard's floating mode) sits mid-screen.
    host.js took every keyboard to reach down to the screen's bottom, so the note editor's
    Save and Discard below it were cut to slivers beside it or left out, though the screen
    shows them whole and a tap reaches them. As the Python host does (`parse_scene`), a
    keyboard ending well above the bottom now covers only itself."""
    phone = VirtualPhone("emulator-5554")
    phone.floating_keyboard = True
    _keyboard_up(phone)

    def shown(e: Element | types_pb2.UiElement) -> tuple[str, tuple[int, ...]]:
        b = e.bounds
        return (e.text, (b.left, b.top, b.right, b.bottom))

    expected = [shown(e) for e in parse_scene(phone.dump_windows(), package=NOTES).elements]
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Leave this app")

    assert decisions, said
    assert {"Save", "Discard"} <= {text for text, _ in expected}
    assert [shown(e) for e in decisions[0].observation.elements] == expected


async def test_the_node_host_reads_a_dump_miuis_runtime_prints_a_stack_trace_before(
    node: str, tmp_path: Path
) -> None:
    """On Xiaomi, Redmi and POCO phones MIUI's runtime prints a FileNotFoundException for
    theme_compatibility.xml as `uiautomator` starts, before the XML on the same stream.
    host.js parsed from the first `<`, the one of `FileInputStream.<init>` in the trace: no
    look on such a phone had a tree. It now parses from the dump's `<?xml` (or `<hierarchy`),
    and the model sees what the Python host sees of the same screen."""
    phone = VirtualPhone("emulator-5554")
    phone.miui_theme_trace = True
    python = observation_from_scene(
        parse_scene(phone.dump_windows(), package=phone.current_package())
    )
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    first = decisions[0].observation
    assert not first.ui_tree_missing, said
    assert [e.text for e in first.elements] == [e.text for e in python.elements]
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
