"""The phone's shell: POSIX-style parsing and the commands drivers rely on, without sockets."""

from __future__ import annotations

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
