"""What the uiautomator2 driver types is told nowhere: not in a log line, not in an error.

The real uiautomator2 library drives the virtual phone's emulated on-device server over the
adb protocol. uiautomator2 puts each JSON-RPC call's params into its errors and its debug
lines, and those params are the typed text of `setText` and `setClipboard` (a password the
task types); its AdbKeyboard broadcast carries the text in base64 on a shell command line.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest

from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.perception.hierarchy import parse_scene

SERIAL = "emulator-5554"
#: A password a task types.
TYPED = "hunter2-Zoë-4711"
#: uiautomator2's own keyboard (the helper APK's AdbKeyboard IME).
HELPER_APK = "com.github.uiautomator"


@pytest.fixture
def served() -> Iterator[tuple[ThreadedAdbServer, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone])
    server.start()
    yield server, phone
    server.stop()


def _told(text: str) -> bool:
    """Whether `text` tells the typed password, as typed or as the AdbKeyboard's base64."""
    return TYPED in text or base64.b64encode(TYPED.encode()).decode() in text


def _focus_a_field(d: U2Driver) -> None:
    """Open the contacts editor and focus its first field."""
    d.launch_app("com.android.contacts")
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    create = next(e for e in scene.elements if "Create contact" in (e.text, e.content_desc))
    d.tap(*create.bounds.center)
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    d.tap(*next(e for e in scene.elements if "EditText" in e.class_name).bounds.center)


@pytest.mark.parametrize("keyboard", ["clipboard", "adb_keyboard"])
def test_uiautomator2s_debug_lines_never_carry_the_typed_text(
    served: tuple[ThreadedAdbServer, VirtualPhone],
    caplog: pytest.LogCaptureFixture,
    keyboard: str,
) -> None:
    """uiautomator2 logs every JSON-RPC request with its params ("http request POST
    /jsonrpc/0 {… 'setClipboard', 'params': (None, '<text>')}") and every shell command
    ("shell: am broadcast -a ADB_KEYBOARD_INPUT_TEXT --es text <base64>") at DEBUG: a host
    run with AMC_LOG_LEVEL=DEBUG wrote every typed password to its log."""
    server, phone = served
    if keyboard == "adb_keyboard":
        phone.installed.add(HELPER_APK)
    d = U2Driver(SERIAL, port=server.port)
    _focus_a_field(d)
    caplog.set_level(logging.DEBUG)
    d.input_text(TYPED)
    page = phone.current_page()
    assert page.focus is not None and page.fields[page.focus] == TYPED
    assert not _told(caplog.text)
    assert logging.getLogger("uiautomator2.core").isEnabledFor(logging.WARNING)
