"""The phone's shell: POSIX-style parsing and the commands drivers rely on, without sockets."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import adbutils
import pytest

from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.shell import Shell
from host.devices.virtual.shell_parser import ShellSyntaxError, parse


def run(phone: VirtualPhone, line: str) -> tuple[str, int]:
    out = Shell(phone).run(line)
    return out.combined.decode(), out.code


def test_parser_quoting_operators_and_redirects() -> None:
    first, second, third = parse("echo 'a;b' \"c d\" e\\ f; ls /x 2>/dev/null && true")
    assert first.commands[0].argv == ["echo", "a;b", "c d", "e f"]
    assert second.commands[0].argv == ["ls", "/x"]
    assert second.commands[0].redirects[0].fd == 2
    assert third.connector == "&&"
    with pytest.raises(ShellSyntaxError):
        parse("echo 'unterminated")
    with pytest.raises(ShellSyntaxError):
        parse("| grep x")


def test_exit_status_variables_pipes_and_files() -> None:
    phone = VirtualPhone("s")
    assert run(phone, "nope; echo $?") == ("/system/bin/sh: nope: not found\n127\n", 0)
    assert run(phone, "false || echo rescued") == ("rescued\n", 0)
    assert run(phone, "false && echo never") == ("", 1)
    assert run(phone, "dumpsys window | grep mCurrentFocus")[0].startswith("  mCurrentFocus=")
    assert run(phone, "echo one > /sdcard/a.txt; echo two >> /sdcard/a.txt; cat /sdcard/a.txt") == (
        "one\ntwo\n",
        0,
    )
    assert run(phone, "cat /nope")[1] == 1
    assert run(phone, "sh -c 'exit 4'")[1] == 4
    assert run(phone, "FOO=bar echo x") == ("x\n", 0)
    assert run(phone, "toybox md5sum /sdcard/a.txt")[0].endswith("  /sdcard/a.txt\n")


def test_android_tools() -> None:
    phone = VirtualPhone("s")
    assert run(phone, "getprop ro.build.version.sdk") == ("34\n", 0)
    assert "[ro.product.model]: [amc virtual phone]" in run(phone, "getprop")[0]
    assert run(phone, "input keyevent KEYCODE_NOPE")[1] == 1
    assert run(phone, "input tap 1")[1] == 1
    run(phone, "am start -a android.settings.DISPLAY_SETTINGS")
    assert phone.page_stack("com.android.settings") == ["display"]
    run(phone, "settings put secure ui_night_mode 2")
    assert phone.state.settings["dark_theme"] is True
    assert run(phone, "settings get global wifi_on") == ("1\n", 0)
    run(phone, "svc wifi disable")
    assert phone.state.settings["wifi"] is False
    assert "package:com.android.deskclock" in run(phone, "pm list packages")[0]
    out, code = run(phone, "uiautomator dump /dev/tty")
    assert out.startswith("<?xml")
    assert out.endswith("UI hierchary dumped to: /dev/tty\n")
    assert code == 0
    assert run(phone, "pm install /data/local/tmp/none.apk")[1] == 1


def _new_contact(phone: VirtualPhone) -> None:
    """Open the new-contact editor, whose first field takes focus."""
    phone.launch("com.android.contacts")
    for node in ET.fromstring(phone.dump_hierarchy()).iter("node"):
        if "Create contact" in (node.get("text"), node.get("content-desc")):
            x1, y1, x2, y2 = (int(v) for v in re.findall(r"\d+", node.get("bounds", "")))
            phone.tap((x1 + x2) // 2, (y1 + y2) // 2)
            return
    raise AssertionError("no 'Create contact' on screen")


def _focused(phone: VirtualPhone) -> str:
    page = phone.current_page()
    assert page.focus is not None
    return page.fields.get(page.focus, "")


def test_input_text_types_a_space_for_percent_s_like_android() -> None:
    """AOSP's `input text` turns each `%s` into a space and has no escape for a literal one."""
    phone = VirtualPhone("s")
    _new_contact(phone)
    for arg, typed in [
        ("a%sb", "a b"),
        ("a%%sb", "a% b"),
        ("\\%s", " "),  # the shell drops the backslash before `input` sees the argument
        ("'%s%s'", "  "),
        ("50%", "50%"),
        ("s", "s"),
    ]:
        phone.clear_text()
        assert run(phone, f"input text {arg}") == ("", 0)
        assert _focused(phone) == typed, arg


def test_keyevent_del_erases_the_last_character() -> None:
    phone = VirtualPhone("s")
    run(phone, "input keyevent KEYCODE_DEL")  # nothing focused on the home screen: no effect
    assert phone.current_package() == "com.android.launcher3"
    _new_contact(phone)
    run(phone, "input text abcd")
    assert run(phone, "input keyevent KEYCODE_DEL && input keyevent 67") == ("", 0)
    assert _focused(phone) == "ab"
    run(phone, "input keyevent DEL DEL DEL")
    assert _focused(phone) == ""


def test_track_devices_reports_unplug(adb_server: ThreadedAdbServer) -> None:
    client = adbutils.AdbClient(host="127.0.0.1", port=adb_server.port, socket_timeout=10)
    events = client.track_devices()
    first = {next(events).serial, next(events).serial}
    assert first == {"virt-1", "virt-2"}
    adb_server.unplug("virt-2")
    gone = next(events)
    assert (gone.serial, gone.present, gone.status) == ("virt-2", False, "absent")
    adb_server.replug("virt-2")
    back = next(events)
    assert (back.serial, back.present) == ("virt-2", True)
    events.close()
