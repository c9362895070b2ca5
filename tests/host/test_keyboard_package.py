"""A keyboard whose package no hint names (Baidu's `com.baidu.input_mi`, WeChat's
`com.tencent.wetype`…) is known by the phone's `default_input_method` setting, read by both
drivers from the virtual phone presenting its keyboard under such a package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from host.devices.adb_driver import AdbDriver
from host.devices.base import DeviceBusy, DeviceGone
from host.devices.input_method import InputMethodCache, parse_input_method
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.shell import Shell
from host.perception.hierarchy import KEYBOARD_LABEL, parse_scene
from host.perception.perceive import Perceiver
from planner.scene import Scene

SERIAL = "emulator-5554"
BAIDU = "com.baidu.input_mi"
A = (
    'checkable="false" checked="false" enabled="true" focusable="false" focused="false" '
    'scrollable="false" long-clickable="false" password="false" selected="false"'
)


def _n(pkg: str, b: str, cls: str = "android.view.View", text: str = "", kids: str = "") -> str:
    return (
        f'<node index="0" text="{text}" resource-id="" class="{cls}" package="{pkg}" '
        f'content-desc="" clickable="true" {A} bounds="{b}">{kids}</node>'
    )


# uiautomator2's form: window roots side by side, no window types.
_APP = _n(
    "com.tencent.mm",
    "[0,0][1080,2400]",
    "android.widget.FrameLayout",
    kids=_n("com.tencent.mm", "[0,1500][1080,1600]", "android.widget.EditText")
    + _n("com.tencent.mm", "[900,2200][1080,2300]", "android.widget.Button", "Send"),
)
_KEYS = "".join(
    _n(BAIDU, f"[{i * 100},1500][{i * 100 + 90},1600]", text=k) for i, k in enumerate("qwertyuiop")
)
U2_DUMP = (
    "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">"
    + _APP
    + _n(BAIDU, "[0,1400][1080,2400]", "android.widget.FrameLayout", kids=_KEYS)
    + "</hierarchy>"
)


def test_u2_dump_keyboard_by_the_selected_input_method() -> None:
    """The hints alone miss Baidu's keyboard: its keys were tappable elements and the field
    and button under it stayed tappable. Named by the setting, it is one covering element."""
    before = parse_scene(U2_DUMP, (1080, 2400), "com.tencent.mm")
    assert not before.keyboard_shown  # the fallback: no hint names com.baidu.input_mi
    scene = parse_scene(U2_DUMP, (1080, 2400), "com.tencent.mm", BAIDU)
    assert scene.keyboard_shown and scene.overlays == ["keyboard"]
    # Left: the app's root above the keyboard, and the keyboard as one element.
    assert [(e.class_name, e.content_desc, e.package) for e in scene.elements] == [
        ("android.widget.FrameLayout", "", "com.tencent.mm"),
        ("android.widget.FrameLayout", KEYBOARD_LABEL, BAIDU),
    ]
    # The keyboard's own app in front (its settings screen) is not hidden as a keyboard.
    own = parse_scene(U2_DUMP.replace("com.tencent.mm", BAIDU), (1080, 2400), BAIDU, BAIDU)
    assert not own.keyboard_shown


def test_windows_dump_type_rules_over_the_setting() -> None:
    """`--windows` says each window's type: a TYPE_APPLICATION window of the keyboard's
    package (its settings screen) is an app, whatever the setting says."""
    app = _n(BAIDU, "[0,0][1080,2400]", "android.widget.FrameLayout", kids=_KEYS)
    dump = (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><displays><display id=\"0\">"
        '<window type="TYPE_APPLICATION" layer="1" bounds="[0,0][1080,2400]" active="true">'
        f'<hierarchy rotation="0">{app}</hierarchy></window></display></displays>'
    )
    scene = parse_scene(dump, (1080, 2400), "", BAIDU)
    assert not scene.keyboard_shown
    assert len(scene.elements) == 11


GBOARD = "com.google.android.inputmethod.latin"


def test_a_hinted_keyboards_own_app_in_front_is_an_app() -> None:
    """Gboard's (or SwiftKey's) settings screen in front: its package matches the keyboard
    hints, so its whole window collapsed into one "On-screen keyboard" element, even where
    `--windows` says TYPE_APPLICATION and the driver names it the foreground app. A task such
    as "turn off Gboard's key-press sound" could see nothing to tap. A window the dump types
    is a keyboard only as TYPE_INPUT_METHOD; an untyped one of the foreground app is the app."""
    settings = _n(
        GBOARD, "[0,0][1080,2400]", "android.widget.FrameLayout", kids=_KEYS.replace(BAIDU, GBOARD)
    )
    windows = (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><displays><display id=\"0\">"
        '<window type="TYPE_APPLICATION" layer="1" bounds="[0,0][1080,2400]" active="true">'
        f'<hierarchy rotation="0">{settings}</hierarchy></window></display></displays>'
    )
    for package in ("", GBOARD):
        scene = parse_scene(windows, (1080, 2400), package, GBOARD)
        assert not scene.keyboard_shown and len(scene.elements) == 11
    u2 = f'<?xml version="1.0"?><hierarchy rotation="0">{settings}</hierarchy>'
    scene = parse_scene(u2, (1080, 2400), GBOARD, GBOARD)
    assert not scene.keyboard_shown and len(scene.elements) == 11
    # Over another app, the same package is still the keyboard (the hints' fallback).
    assert parse_scene(
        U2_DUMP.replace(BAIDU, GBOARD), (1080, 2400), "com.tencent.mm"
    ).keyboard_shown


@pytest.mark.parametrize(
    ("output", "package"),
    [
        ("com.baidu.input_mi/.ImeService\n", BAIDU),
        ("com.tencent.wetype/com.tencent.wetype.plugin.hld.WxHldService\r\n", "com.tencent.wetype"),
        ("null\n", ""),
        ("", ""),
        ("/system/bin/sh: settings: inaccessible or not found\n", ""),
    ],
)
def test_parse_input_method(output: str, package: str) -> None:
    assert parse_input_method(output) == package


def test_the_setting_is_cached_a_minute_and_a_failed_read_is_no_keyboard() -> None:
    now = [0.0]
    answers: list[str | Exception] = [
        "com.lge.ime/.LgeImeImpl\n",
        DeviceBusy("timed out"),
        DeviceGone("unplugged"),
    ]
    reads: list[int] = []

    def read() -> str:
        reads.append(1)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cache = InputMethodCache("p", read, refresh_s=60.0, clock=lambda: now[0])
    assert cache.package() == "com.lge.ime"
    now[0] = 59.0
    assert cache.package() == "com.lge.ime" and len(reads) == 1
    now[0] = 60.0
    assert cache.package() == ""  # the read failed: the hints decide
    now[0] = 119.0
    assert cache.package() == "" and len(reads) == 2  # not asked again every step
    cache.forget()
    with pytest.raises(DeviceGone):
        cache.package()


@pytest.fixture
def baidu_phone() -> Iterator[tuple[ThreadedAdbServer, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    phone.keyboard_ime = f"{BAIDU}/.ImeService"
    server = ThreadedAdbServer([phone])
    server.start()
    yield server, phone
    server.stop()


def _note_editor(perceiver: Perceiver, d: U2Driver | AdbDriver) -> Scene:
    """Notes' editor, whose Save button lies under the keyboard it opens."""
    d.launch_app("com.amc.notes")
    scene = perceiver.perceive(d, with_ocr=False).scene
    d.tap(*next(e for e in scene.elements if e.content_desc == "New note").bounds.center)
    return perceiver.perceive(d, with_ocr=False).scene


def _assert_keyboard_covers(scene: Scene) -> None:
    assert scene.keyboard_shown
    keyboards = [e for e in scene.elements if e.content_desc == KEYBOARD_LABEL]
    assert [k.package for k in keyboards] == [BAIDU]
    assert not [e for e in scene.elements if e.package == BAIDU and e not in keyboards]
    assert "Save" not in {e.text for e in scene.elements}  # under the keyboard


def _sh(phone: VirtualPhone, line: str) -> str:
    return Shell(phone).run(line).combined.decode()


def test_virtual_phone_reports_its_keyboard(
    baidu_phone: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    _, phone = baidu_phone
    assert _sh(phone, "settings get secure default_input_method") == (f"{BAIDU}/.ImeService\n")
    assert f"mCurMethodId={BAIDU}/.ImeService" in _sh(phone, "dumpsys input_method")
    assert _sh(phone, "ime list -s") == f"{BAIDU}/.ImeService\n"
    assert VirtualDriver(phone).keyboard_package() == BAIDU


def test_u2_driver_sees_a_keyboard_no_hint_names(
    baidu_phone: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = baidu_phone
    d = U2Driver(SERIAL, port=server.port)
    assert d.keyboard_package() == BAIDU
    scene = _note_editor(Perceiver(retry_delay_s=0.0), d)
    assert phone.keyboard_shown()
    _assert_keyboard_covers(scene)


def test_adb_driver_reads_the_keyboard_too(
    baidu_phone: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, _ = baidu_phone
    d = AdbDriver(SERIAL, port=server.port)
    assert d.keyboard_package() == BAIDU
    _assert_keyboard_covers(_note_editor(Perceiver(retry_delay_s=0.0), d))


def test_a_failed_read_falls_back_to_the_hints(
    baidu_phone: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Reading the setting fails: perception still works, on the hints alone."""
    server, phone = baidu_phone
    phone.keyboard_ime = "com.google.android.inputmethod.latin/.LatinIME"

    class Broken(U2Driver):
        def keyboard_package(self) -> str:
            raise RuntimeError("settings crashed")

    scene = _note_editor(Perceiver(retry_delay_s=0.0), Broken(SERIAL, port=server.port))
    assert scene.keyboard_shown  # "inputmethod" in its package
