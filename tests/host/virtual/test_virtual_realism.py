"""The virtual phone looks like a phone: real-sized trees with SDK 34's attributes, system
windows, a keyboard that covers the screen, interruptions tests can throw at any step, a time
picker, a Compose screen, a German phone and vendor launchers, and the shell tools and adb
services the peers' own test suites use."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import adbutils
import pytest
import uiautomator2 as u2

from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.keyboard import PACKAGE as IME
from host.devices.virtual.layout import Node
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.shell import Shell
from host.devices.virtual.state import NOTIFICATIONS, permission_key

_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")


def _shade(phone: VirtualPhone) -> str:
    """The shade as it is now (a plain read, so mypy does not keep an earlier narrowing)."""
    return phone.shade


def run(phone: VirtualPhone, line: str) -> tuple[str, int]:
    out = Shell(phone).run(line)
    return out.combined.decode(), out.code


def tap(phone: VirtualPhone, node: Node | None) -> None:
    assert node is not None
    x1, y1, x2, y2 = node.bounds
    phone.tap((x1 + x2) // 2, (y1 + y2) // 2)


def test_trees_are_real_sized_with_sdk34_attributes() -> None:
    phone = VirtualPhone("real-1")
    home = ET.fromstring(phone.dump_hierarchy())
    nodes = list(home.iter("node"))
    assert 29 <= len(nodes) <= 98  # what real launchers dump
    assert all({"drawing-order", "hint"} <= set(n.attrib) for n in nodes)
    assert [n for n in nodes if n.get("NAF") == "true"]  # an unlabelled clickable view
    phone.launch("com.android.settings")
    settings = list(ET.fromstring(phone.dump_hierarchy()).iter("node"))
    assert len(settings) >= 50
    assert [n for n in settings if n.get("bounds", "").count(",") and _zero(n.get("bounds", ""))]
    assert {n.get("resource-id") for n in settings} >= {
        "android:id/content",
        "android:id/statusBarBackground",
        "android:id/navigationBarBackground",
    }


def _zero(bounds: str) -> bool:
    m = _BOUNDS.fullmatch(bounds)
    assert m
    x1, y1, x2, y2 = (int(v) for v in m.groups())
    return x1 == x2 or y1 == y2


def test_every_window_in_the_windows_dump() -> None:
    phone = VirtualPhone("real-2")
    phone.launch("com.android.contacts")
    tap(phone, phone.find("Create contact"))
    root = ET.fromstring(phone.dump_windows())
    assert root.tag == "displays"
    windows = {w.get("type"): w for w in root.iter("window")}
    assert set(windows) == {"TYPE_APPLICATION", "TYPE_INPUT_METHOD", "TYPE_SYSTEM"}
    ime = windows["TYPE_INPUT_METHOD"]
    assert ime.find("hierarchy/node") is not None
    assert ime.find("hierarchy/node").get("package") == IME  # type: ignore[union-attr]
    # A plain dump shows the focused window only: never the keyboard.
    assert IME not in phone.dump_hierarchy()
    roots = ET.fromstring(phone.dump_window_roots())
    packages = [n.get("package") for n in roots.findall("node")]
    assert packages[0] == "com.android.contacts" and IME in packages
    assert all(n.get("visible-to-user") == "true" for n in roots.iter("node"))


def test_the_keyboard_comes_with_a_focused_field_and_covers_the_screen() -> None:
    phone = VirtualPhone("real-3")
    phone.launch("com.amc.notes")
    tap(phone, phone.find("New note"))
    assert phone.keyboard_shown()  # the editor asks for it
    save = phone.find("Save")
    assert save is not None
    # A tap meant for Save lands on the keyboard (its space bar): it types into the title.
    tap(phone, save)
    assert phone.state.notes == []
    assert phone.current_page().fields == {"title": " "}
    phone.input_text("Groceries")
    phone.press_key("BACK")  # Back hides the keyboard first
    assert not phone.keyboard_shown()
    assert phone.page_stack() == ["main", "editor"]
    tap(phone, phone.find("Save"))
    assert [n.title for n in phone.state.notes] == ["Groceries"]
    # The Compose screen exports no resource ids.
    phone.push("editor")
    dump = ET.fromstring(phone.dump_hierarchy())
    compose = [n for n in dump.iter("node") if n.get("package") == "com.amc.notes"]
    content = next(n for n in compose if n.get("resource-id") == "android:id/content")
    assert all(not n.get("resource-id") for n in content.iter("node") if n is not content)
    assert any(n.get("class") == "androidx.compose.ui.platform.ComposeView" for n in compose)


def test_a_permission_prompt_on_first_start_and_at_any_step() -> None:
    phone = VirtualPhone("real-4")
    key = permission_key("com.android.deskclock", NOTIFICATIONS)
    del phone.state.permissions[key]
    phone.launch("com.android.deskclock")
    assert phone.focused_package() == "com.android.permissioncontroller"
    assert phone.find("Allow Clock to send you notifications?") is not None
    phone.press_key("BACK")  # dismissing it is a "no"
    assert phone.state.permissions[key] == "denied"
    assert phone.focused_package() == "com.android.deskclock"
    phone.interrupt_after(2, lambda: phone.show_permission_prompt("com.android.contacts"))
    phone.press_key("HOME")
    assert not phone.prompts
    phone.press_key("HOME")
    assert phone.prompts  # thrown right after the second event
    tap(phone, phone.find("Allow"))
    assert phone.state.permissions[permission_key("com.android.contacts", NOTIFICATIONS)] == (
        "granted"
    )


def test_system_ui_not_responding_and_the_shade() -> None:
    phone = VirtualPhone("real-5")
    phone.launch("com.android.settings")
    phone.show_anr()
    assert phone.focused_package() == "android"
    tap(phone, phone.find("Network & internet"))  # under the dialog: out of reach
    assert phone.page_stack() == ["main"]
    tap(phone, phone.find("Wait"))
    assert not phone.prompts
    phone.swipe(540, 40, 540, 1200)  # pull the shade down from the status bar
    assert phone.shade == "notifications"
    tile = phone.find("Internet")
    assert tile is not None and tile.checked
    tap(phone, tile)
    assert phone.state.settings["wifi"] is False  # a tile is a real switch
    phone.press_key("BACK")
    assert _shade(phone) == ""  # read afresh: the key press changed it
    phone.open_shade()
    phone.show_anr()
    tap(phone, phone.find("Close app"))  # System UI restarts: the shade is gone
    assert (phone.shade, phone.prompts) == ("", [])


def test_a_toast_is_drawn_but_never_dumped() -> None:
    phone = VirtualPhone("real-6")
    plain = phone.screenshot()
    phone.show_toast("Backup complete", 60.0)
    assert "Backup complete" not in phone.dump_hierarchy()
    assert "Backup complete" not in phone.dump_windows()
    drawn = phone.screenshot()
    box = (0, phone.height - 420, phone.width, phone.height - 310)
    assert drawn.crop(box).tobytes() != plain.crop(box).tobytes()
    assert phone.last_toast == "Backup complete"


def test_the_time_picker_steps_spins_and_takes_typed_values() -> None:
    phone = VirtualPhone("real-7")
    phone.launch("com.android.deskclock")
    tap(phone, phone.find("Add alarm"))
    assert phone.find("06") is not None and phone.find("00") is not None
    tap(phone, phone.find("07"))  # the next value under the hour
    picker = next(n for n in phone.screen().walk() if n.resource_id == "android:id/minute")
    x = (picker.bounds[0] + picker.bounds[2]) // 2
    phone.swipe(x, picker.bounds[3] - 20, x, picker.bounds[3] - 20 - 2 * 180)  # spin by two
    minute_input = [
        n for n in phone.screen().walk() if n.resource_id.endswith("numberpicker_input")
    ]
    assert [n.text for n in minute_input] == ["07", "02"]
    tap(phone, minute_input[1])
    phone.input_text("45")  # the tapped value is selected: typing replaces it
    tap(phone, phone.find("Alarm name"))  # focus leaves the picker: the value is taken
    phone.input_text("Gym")
    phone.press_key("BACK")
    tap(phone, phone.find("Save"))
    assert [(a.hour, a.minute, a.label) for a in phone.state.alarms] == [(7, 45, "Gym")]


def test_a_german_phone_and_a_vendor_launcher() -> None:
    phone = VirtualPhone("real-8", locale="de-DE", launcher="com.google.android.apps.nexuslauncher")
    assert phone.find("Einstellungen") is not None
    assert "com.google.android.apps.nexuslauncher:id/workspace" in phone.dump_hierarchy()
    out, _ = run(phone, "dumpsys window | grep mFocusedApp")
    assert "com.google.android.apps.nexuslauncher/" in out
    phone.launch("com.android.settings")
    assert phone.find("Netzwerk & Internet") is not None
    assert run(phone, "getprop persist.sys.locale")[0] == "de-DE\n"


def test_shell_tools_answer_as_a_phone_does() -> None:
    phone = VirtualPhone("real-9")
    assert run(phone, "cmd uimode night yes")[0] == "Night mode: yes\n"
    assert phone.state.settings["dark_theme"] is True
    assert run(phone, "cmd uimode night")[0] == "Night mode: yes\n"
    run(phone, "cmd statusbar expand-settings")
    assert phone.shade == "quick_settings"
    run(phone, "cmd statusbar collapse")
    assert run(phone, "settings get system screen_brightness")[0] == "128\n"
    run(phone, "settings put system screen_brightness 200")
    assert run(phone, "settings get system screen_brightness") == ("200\n", 0)
    assert run(phone, "settings get system screen_off_timeout")[0] == "30000\n"
    run(phone, "log -p w -t AmcTest hello there")
    log, code = run(phone, "logcat -d -v time")
    assert code == 0 and re.search(r"W/AmcTest\(\s*\d+\): hello there", log)
    run(phone, "logcat -c")
    assert "AmcTest" not in run(phone, "logcat -d")[0]
    phone.launch("com.android.calculator2")
    ps, _ = run(phone, "ps -A")
    assert ps.splitlines()[0].split()[:3] == ["USER", "PID", "PPID"]
    assert "com.android.calculator2" in ps and "system_server" in ps
    pid, _ = run(phone, "pidof com.android.calculator2")
    run(phone, f"kill {pid.strip()}")
    assert "com.android.calculator2" not in phone.running_packages()
    assert run(phone, "kill 1")[1] == 1  # not the shell's to kill
    assert run(phone, "which input screencap") == ("/system/bin/input\n/system/bin/screencap\n", 0)
    assert run(phone, "which nosuchtool")[1] == 1
    assert "inet 192.168.1.23/24" in run(phone, "ip addr show dev wlan0")[0]
    phone.state.settings["wifi"] = False
    assert "inet " not in run(phone, "ip addr show dev wlan0")[0]
    assert "mInputShown=false" in run(phone, "dumpsys input_method")[0]
    assert "mWakefulness=Awake" in run(phone, "dumpsys power")[0]
    assert "showing=false" in run(phone, "dumpsys window policy")[0]


def test_logcat_follows_the_log_over_adb() -> None:
    phone = VirtualPhone("real-10")
    with ThreadedAdbServer([phone]) as server:
        device = adbutils.AdbClient("127.0.0.1", server.port, socket_timeout=20).device(
            phone.serial
        )
        stream = device.shell("logcat -v brief", stream=True)
        try:
            reader = stream.conn.makefile("r", encoding="utf-8")
            device.shell(["log", "-p", "i", "-t", "Follow", "one more line"])
            for line in reader:  # the log keeps coming: the reader never waits for the end
                if "Follow" in line:
                    assert line.startswith("I/Follow(")
                    break
        finally:
            stream.close()


# adbutils' own framebuffer() never closes the connection it opens (third-party noise).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_framebuffer_and_forwarding_over_adb() -> None:
    phone = VirtualPhone("real-11")
    with ThreadedAdbServer([phone]) as server:
        device = adbutils.AdbClient("127.0.0.1", server.port, socket_timeout=20).device(
            phone.serial
        )
        image = device.framebuffer()
        assert image.size == (1080, 2400)
        assert image.convert("RGB").tobytes() == phone.screenshot().tobytes()
        port = device.forward_port(9008)
        assert [(f.local, f.remote) for f in device.forward_list()] == [(f"tcp:{port}", "tcp:9008")]
        device.reverse("tcp:12345", "tcp:4000")
        assert [(r.remote, r.local) for r in device.reverse_list()] == [("tcp:12345", "tcp:4000")]


def test_uiautomator2_opens_the_shade_and_reads_toasts() -> None:
    phone = VirtualPhone("real-12")
    with ThreadedAdbServer([phone]) as server:
        d = u2.connect(adbutils.AdbClient("127.0.0.1", server.port).device(phone.serial))
        try:
            d.open_notification()
            assert phone.shade == "notifications"
            assert d(description="Internet").exists  # selectors see every window
            d.press("back")
            d.open_quick_settings()
            assert _shade(phone) == "quick_settings"
            d.press("back")
            d.clear_toast()
            phone.show_toast("Saved")
            assert d.last_toast == "Saved"
            assert d.last_traversed_text is None
            d.screen_off()
            assert not phone.awake
            d.screen_on()
            assert phone.awake
        finally:
            d.stop_uiautomator()


@pytest.mark.parametrize("glitch", ["idle", "null_root", "empty"])
def test_dump_glitches_as_uiautomator_prints_them(glitch: str) -> None:
    phone = VirtualPhone("real-13")
    phone.glitch_dumps(glitch)  # type: ignore[arg-type]
    out, _ = run(phone, "uiautomator dump /sdcard/x.xml")
    expected = {
        "idle": "ERROR: could not get idle state.",
        "null_root": "ERROR: null root node returned by UiTestAutomationBridge.",
        "empty": "UI hierchary dumped to: /sdcard/x.xml",
    }[glitch]
    assert expected in out
