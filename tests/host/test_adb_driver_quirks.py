"""What real phones do that the plain happy path does not show, through the real adbutils
client against the virtual phone's adb server: a phone held sideways, a multi-display
screencap warning, `uiautomator dump --windows` failures, text `input` cannot type, and an adb
read that times out."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator

import adbutils
import pytest
from adbutils.errors import AdbError, AdbTimeout
from PIL import Image

from amc.v1 import types_pb2
from host.agent.actions import execute
from host.devices import adb_transport
from host.devices.adb_driver import DUMP_COMMAND, AdbDriver, dump_failure, png_from_screencap
from host.devices.adb_errors import is_gone
from host.devices.base import (
    BridgeHeld,
    DeviceBusy,
    DeviceError,
    DeviceGone,
    ScreenUnavailable,
)
from host.devices.registry import DeviceRegistry
from host.devices.screen_size import current_size, parse_rotation, parse_surface_orientation
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import DUMP_NPE_TRACE, VirtualPhone
from host.devices.virtual.state import Note
from host.perception.hierarchy import HierarchyError, parse_scene
from host.perception.perceive import Perceiver
from host.planner_client import DirectPlanner
from planner.history import WorldEvent
from planner.observation import observation_from_scene, scene_from_observation
from planner.planner import Planner
from planner.providers.offline import OfflineProvider
from planner.scene import Bounds, Scene
from tests.support.waiting import until

SERIAL = "emulator-5554"


@pytest.fixture
def adb() -> Iterator[tuple[ThreadedAdbServer, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone])
    server.start()
    yield server, phone
    server.stop()


def _shell(server: ThreadedAdbServer, cmd: str) -> str:
    device = adbutils.AdbClient(host="127.0.0.1", port=server.port).device(SERIAL)
    return str(device.shell(cmd))


def _scene(driver: AdbDriver) -> Scene:
    return Perceiver(retry_delay_s=0).perceive(driver, with_ocr=False).scene


# --- a phone held sideways -----------------------------------------------------------------------


def test_landscape_keeps_the_right_half_and_taps_it(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    assert d.screen_size() == (1080, 2400)
    phone.rotate(1)
    # `wm size` still says portrait, as on a real phone; the driver swaps it.
    assert "1080x2400" in _shell(server, "wm size")
    assert d.screen_size() == (2400, 1080)
    scene = _scene(d)
    assert (scene.screen_width, scene.screen_height, scene.rotation) == (2400, 1080, 1)
    d.tap(*next(e for e in scene.elements if e.text == "Network & internet").bounds.center)
    scene = _scene(d)
    airplane = next(
        e
        for e in scene.elements
        if e.resource_id == "android:id/switch_widget" and e.text == "OFF" and e.bounds.top > 700
    )
    # The switch sits at the far right of the landscape screen, past portrait's 1080.
    assert airplane.bounds.left > 1080
    assert phone.state.settings["airplane_mode"] is False
    d.tap(*airplane.bounds.center)
    assert phone.state.settings["airplane_mode"] is True
    phone.rotate(0)
    assert d.screen_size() == (1080, 2400)


def test_u2_driver_agrees_on_the_landscape_size(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    phone.rotate(3)
    assert U2Driver(SERIAL, port=server.port).screen_size() == (2400, 1080)
    assert AdbDriver(SERIAL, port=server.port).screen_size() == (2400, 1080)


@pytest.mark.parametrize("display_dump", ["without a rotation", "a second display first"])
def test_both_drivers_read_the_landscape_size_from_any_display_dump(
    adb: tuple[ThreadedAdbServer, VirtualPhone], display_dump: str
) -> None:
    """uiautomator2's window size is adbutils' `window_size()`, which takes the first
    `orientation=` in `dumpsys display`: on a build whose dump names none it failed
    "rotation get failed" (openatx/adbutils#22), a plain DeviceError that failed every look
    and the task for good; with a second display's viewport listed first (Android 14 lists an
    external one before the phone's own) it read that display's rotation, so a phone in
    landscape was taken as upright and taps landed elsewhere. The u2 driver now reads the
    size as the adb driver does (the phone's own viewport, then `dumpsys input`)."""
    server, phone = adb
    if display_dump == "without a rotation":
        phone.display_dump_orientation = False
    else:
        phone.multi_display = True
    phone.rotate(1)
    assert U2Driver(SERIAL, port=server.port).screen_size() == (2400, 1080)
    assert AdbDriver(SERIAL, port=server.port).screen_size() == (2400, 1080)


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_phone_without_wm_reads_its_size_from_its_display_dump(
    adb: tuple[ThreadedAdbServer, VirtualPhone], driver: str
) -> None:
    """A build that ships no `wm` (the shell prints "/system/bin/sh: wm: not found"): the
    size read failed "cannot read screen size", a plain DeviceError that failed every task
    on the phone for good. The size is now read from the default display's viewport in
    `dumpsys display` (already asked for its rotation), in the current rotation; a phone
    whose dump names no viewport either says which commands failed and what they printed."""
    server, phone = adb
    phone.missing_commands.add("wm")
    phone.set_display_size((720, 1600))
    make = AdbDriver if driver == "adbutils" else U2Driver
    assert make(SERIAL, port=server.port).screen_size() == (720, 1600)
    phone.rotate(1)
    d = make(SERIAL, port=server.port)
    assert d.screen_size() == (1600, 720)
    phone.missing_commands.add("dumpsys")
    with pytest.raises(DeviceError, match="wm: not found") as raised:
        d.screen_size()
    assert "dumpsys display" in str(raised.value) and "dumpsys: not found" in str(raised.value)


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_phone_that_turns_while_it_is_read_is_seen_in_its_new_orientation(
    adb: tuple[ThreadedAdbServer, VirtualPhone], driver: str
) -> None:
    """An app that asks for landscape turns the phone as it starts, often between the look's
    size read and its dump (the dumper waits for the turn to settle). The landscape dump was
    clipped to the portrait size: everything right of x=1080 (a row's switch, a player's
    controls) left out, and the model shown the portrait screenshot of the screen before.
    The look now reads the size and the screenshot again and lays the dump out at the size
    it was taken at."""
    server, phone = adb
    d = (AdbDriver if driver == "adbutils" else U2Driver)(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    phone.turn_at_next_dump(1)
    look = Perceiver(None, retry_delay_s=0).perceive(d, with_ocr=False)
    assert (look.scene.screen_width, look.scene.screen_height, look.scene.rotation) == (
        2400,
        1080,
        1,
    )
    assert max(e.bounds.right for e in look.scene.elements) > 1080
    with Image.open(io.BytesIO(look.screenshot_png)) as shot:
        assert shot.size == (2400, 1080)


def test_rotation_parsing() -> None:
    # Shaped like an Android 14 `dumpsys display` in landscape (abridged).
    out = (
        "DISPLAY MANAGER (dumpsys display)\n  mOnlyCore=false\n"
        "  mViewports=[DisplayViewport{type=EXTERNAL, valid=true, isActive=true, displayId=2, "
        "uniqueId='local:1', physicalPort=1, orientation=0, deviceWidth=1920, "
        "deviceHeight=1080}, DisplayViewport{type=INTERNAL, valid=true, isActive=true, "
        "displayId=0, uniqueId='local:0', physicalPort=0, orientation=1, "
        "logicalFrame=Rect(0, 0 - 2400, 1080), deviceWidth=2400, deviceHeight=1080}]\n"
    )
    assert parse_rotation(out) == 1
    assert parse_rotation("x orientation=3, y") == 3
    assert parse_rotation("Can't find service: display\n") is None
    assert parse_surface_orientation("  Viewport INTERNAL: ...\n    SurfaceOrientation: 3\n") == 3
    assert parse_surface_orientation("nothing") is None
    assert current_size((1080, 2400), 1) == (2400, 1080)
    assert current_size((1080, 2400), 2) == (1080, 2400)


# --- screencap on a phone with several displays --------------------------------------------------


def test_screenshot_behind_the_multi_display_warning(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    phone.multi_display = True
    device = adbutils.AdbClient(host="127.0.0.1", port=server.port).device(SERIAL)
    raw = device.shell("screencap -p", encoding=None)
    assert isinstance(raw, bytes)
    assert raw.startswith(b"[Warning] Multiple displays were found")
    png = AdbDriver(SERIAL, port=server.port).screenshot_png()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert Image.open(io.BytesIO(png)).size == (1080, 2400)


def test_windows_of_a_second_display_are_left_out(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    phone.multi_display = True
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    xml = d.dump_hierarchy()
    assert '<display id="2">' in xml and "Presentation screen" in xml
    scene = _scene(d)
    assert scene.package == "com.android.settings"
    assert "Presentation screen" not in [e.text for e in scene.elements]
    assert any(e.text == "Network & internet" for e in scene.elements)


def test_u2_dumps_of_a_second_displays_windows_are_left_out(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2's agent (androidx `dumpWindowHierarchy`, SDK 30+) dumps the roots of every
    display's windows side by side, each node saying its `display-id`, its bounds clipped to
    the default display's size: a cast or cover screen's window lies over the phone's own
    screen in the dump. Through the real uiautomator2 client against the virtual phone."""
    server, phone = adb
    phone.multi_display = True
    d = U2Driver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    xml = d.dump_hierarchy()
    assert 'display-id="2"' in xml and "Presentation screen" in xml
    scene = Perceiver(retry_delay_s=0).perceive(d, with_ocr=False).scene
    assert scene.package == "com.android.settings"
    assert "Presentation screen" not in [e.text for e in scene.elements]
    assert any(e.text == "Network & internet" for e in scene.elements)


def test_screencap_without_any_png_is_refused() -> None:
    with pytest.raises(DeviceError, match="returned no PNG"):
        png_from_screencap(SERIAL, b"/system/bin/sh: screencap: inaccessible or not found\n")


# --- `uiautomator dump --windows` failures --------------------------------------------------------


@pytest.mark.parametrize("glitch", ["no_windows", "killed", "aborted"])
def test_passing_dump_failures_are_busy_and_retried(
    adb: tuple[ThreadedAdbServer, VirtualPhone], glitch: str
) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    phone.glitch_dumps(glitch)  # type: ignore[arg-type]
    with pytest.raises(DeviceBusy):
        d.dump_hierarchy()
    phone.glitch_dumps(glitch, 2)  # type: ignore[arg-type]
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, d.screen_size(), None)
    assert any(e.text == "Settings" for e in scene.elements)


def test_no_windows_dump_prints_dumped_but_writes_nothing(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    phone.glitch_dumps("no_windows")
    out = _shell(server, "uiautomator dump --windows /data/local/tmp/w.xml")
    assert "dumped to: /data/local/tmp/w.xml" in out
    assert phone.files.read("/data/local/tmp/w.xml") is None
    phone.glitch_dumps("no_windows")
    with pytest.raises(DeviceBusy, match="wrote no file"):
        AdbDriver(SERIAL, port=server.port).dump_hierarchy()


def test_rootless_app_window_is_retried_not_an_empty_screen(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    phone.glitch_dumps("rootless_window")
    xml = d.dump_hierarchy()
    assert "<window" in xml and 'type="TYPE_APPLICATION"><hierarchy' not in xml
    with pytest.raises(HierarchyError, match="no tree yet"):
        parse_scene(xml, d.screen_size())
    phone.glitch_dumps("rootless_window", 2)
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, d.screen_size(), None)
    assert any(e.text == "Network & internet" for e in scene.elements)


def test_a_hung_app_under_its_anr_dialog_is_seen_and_wait_can_be_tapped(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A hung app's window has no tree for as long as it hangs (getRoot times out in the hung
    process) while its "isn't responding" dialog has one: the dialog is the scene, not a
    dump to retry until the task fails."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.chrome")
    phone.show_anr("com.android.chrome", "Chrome")
    assert 'type="TYPE_APPLICATION"></window>' in d.dump_hierarchy()
    scene = _scene(d)
    assert scene.overlays[0] == "app_not_responding"
    d.tap(*next(e for e in scene.elements if e.text == "Wait").bounds.center)
    scene = _scene(d)
    assert scene.overlays == [] and scene.package == "com.android.chrome"


@pytest.mark.parametrize("multi_display", [False, True])
def test_the_focus_frozen_at_the_last_anr_is_not_taken_for_the_current_one(
    adb: tuple[ThreadedAdbServer, VirtualPhone], multi_display: bool
) -> None:
    """`dumpsys window` opens with its LAST ANR section for hours after an "isn't
    responding" dialog: the focus of that moment, then a copy of the display contents. The
    app that hung was named the app in front long after the phone moved on. Through the real
    adbutils client against the virtual phone."""
    server, phone = adb
    phone.multi_display = multi_display
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    phone.show_anr("com.android.settings", "Settings")
    d.tap(*next(e for e in _scene(d).elements if e.text == "Wait").bounds.center)
    d.press_key("home")
    assert "WINDOW MANAGER LAST ANR" in _shell(server, "dumpsys window")
    assert d.current_app() == phone.launcher_package
    assert d.current_window().startswith(f"{phone.launcher_package}/")


def test_a_taken_accessibility_bridge_is_waited_for_then_named(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """ "… already registered!" (another UiAutomation client holds the accessibility bridge)
    failed the dump, and the task with it, for good at the first try, though the holder is
    mostly another tool's dump or session about to end. The dump now tries again for a
    bounded time; a holder that stays is named, as a screen the phone cannot show."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    phone.glitch_dumps("bridge_taken", 2)  # another tool's dumps, then it lets go
    scene, _ = Perceiver(retries=1, retry_delay_s=0).scene_from_dump(d, d.screen_size(), None)
    assert any(e.text == "Settings" for e in scene.elements)
    phone.glitch_every(1, "bridge_taken")  # a client that keeps it
    d = AdbDriver(SERIAL, port=server.port, bridge_wait_s=0.2)
    with pytest.raises(BridgeHeld, match=r"another UiAutomation client.*still did after 0\.2 s"):
        Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, d.screen_size(), None)


def test_a_build_without_uiautomator_is_named_with_the_driver_that_works(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Some makers' builds ship no `uiautomator` command: the shell answers "…: uiautomator:
    not found", and the task failed with that line quoted ("uiautomator dump failed on S:
    '/system/bin/sh: uiautomator: not found'"), which says neither what is wrong with the
    phone nor what to do. Not retried (no retry brings the command); the error says that the
    phone has none and that the uiautomator2 driver, which brings its own, can drive it."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    phone.missing_commands.add("uiautomator")
    with pytest.raises(DeviceError, match="has no `uiautomator` command") as raised:
        Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, d.screen_size(), None)
    assert not isinstance(raised.value, DeviceBusy)
    assert "AMC_HOST_DRIVER=uiautomator2" in str(raised.value)
    mksh = dump_failure(SERIAL, "/system/bin/sh: uiautomator: inaccessible or not found\n")
    assert mksh is not None and "has no `uiautomator` command" in str(mksh)
    scene, _ = Perceiver(retries=1).scene_from_dump(
        U2Driver(SERIAL, port=server.port), d.screen_size(), None
    )
    assert any(e.text == "Settings" for e in scene.elements)


def test_a_dumper_that_takes_its_first_argument_for_the_file_is_asked_without_windows(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Android 4.1-4.2's `uiautomator dump` takes its first argument for the file
    (DumpCommand's `new File(args[0])`): `dump --windows PATH` tried to write `/--windows`,
    failed (`/` is read-only), still said "dumped to: /--windows", and every look went on
    without a tree ("wrote no file"). The driver now dumps such a phone without the option.
    Through the real adbutils client against the virtual phone."""
    server, phone = adb
    phone.sdk = 16
    assert "dumped to: /--windows" in _shell(
        server, "uiautomator dump --windows /data/local/tmp/a.xml"
    )
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    for _ in range(2):
        scene = _scene(d)
        assert not scene.tree_missing
        assert any(e.text == "Network & internet" for e in scene.elements)


def test_dump_output_without_dumped_to_is_a_failure() -> None:
    assert dump_failure(SERIAL, "UI hierchary dumped to: /data/local/tmp/x.xml\n") is None
    # Not passing, but the phone's condition: the attempt ends retryable.
    for output in ("Segmentation fault\n", "uiautomator: inaccessible or not found\n"):
        failure = dump_failure(SERIAL, output)
        assert isinstance(failure, ScreenUnavailable) and not isinstance(failure, DeviceBusy)
    # Passing: the low-memory killer, a runtime abort, no output at all (the dumper died; its
    # trace went to logcat), and a trace of the exceptions a window changing under the dumper
    # throws.
    for output in (
        "Killed\n",
        "Aborted\n",
        "",
        " \n",
        DUMP_NPE_TRACE,
        "java.lang.IllegalStateException: x",
    ):
        assert isinstance(dump_failure(SERIAL, output), DeviceBusy), output


def _dump_files(server: ThreadedAdbServer) -> list[str]:
    return [name for name in _shell(server, "ls /data/local/tmp").split() if "amc-" in name]


def test_a_dump_that_dies_silently_is_busy_retried_and_leaves_no_file(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """AOSP's dumper dies with a NullPointerException in childNafCheck when a node vanishes
    mid-dump: the shell prints nothing, an empty file is left. A passing failure, retried."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    phone.glitch_dumps("npe")
    with pytest.raises(DeviceBusy, match="printed nothing"):
        d.dump_hierarchy()
    assert "NullPointerException" in _shell(server, "logcat -d")
    assert _dump_files(server) == []
    phone.glitch_dumps("npe", 2)
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, d.screen_size(), None)
    assert any(e.text == "Settings" for e in scene.elements)
    assert _dump_files(server) == []


@pytest.mark.parametrize("left", [0, 4096], ids=["empty file", "cut file"])
def test_a_dump_on_a_full_phone_says_its_storage_is_full(
    adb: tuple[ThreadedAdbServer, VirtualPhone], left: int
) -> None:
    """A phone whose storage is full still prints "dumped to" (the dumper logs the write
    error) and leaves an empty or cut file: the look was retried and went on without a tree
    "no windows listed yet" or "malformed hierarchy dump", so nobody freed the phone's
    storage and every look of every task on it went blind."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    phone.storage_left = left
    look = Perceiver(None, retries=2, retry_delay_s=0).perceive(d, with_ocr=False)
    assert "storage is full" in look.scene.tree_missing
    assert f"{left // 1024} KiB free" in look.scene.tree_missing
    assert _dump_files(server) == []


def test_a_phone_that_vanishes_mid_dump_is_gone_not_retried(
    adb: tuple[ThreadedAdbServer, VirtualPhone], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream cut by a vanishing phone reads as empty output too: adb's device state tells
    the two apart before the dump is retried. (The phone side is wrapped so that it unplugs
    itself while dumping; the client, the adb server and the driver are the real ones.)"""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    size = d.screen_size()
    dump_windows = phone.dump_windows

    def vanishing() -> str:
        phone.unplug()
        return dump_windows()

    monkeypatch.setattr(phone, "dump_windows", vanishing)
    with pytest.raises(DeviceGone, match=r"uiautomator dump: adb lists it as .*not found"):
        d.dump_hierarchy()
    phone.replug()
    with pytest.raises(DeviceGone):
        Perceiver(retries=5, retry_delay_s=0).scene_from_dump(d, size, None)


def test_a_rootless_system_window_alone_is_no_failure() -> None:
    xml = (
        '<?xml version="1.0" ?><displays><display id="0">'
        '<window title="StatusBar" type="TYPE_SYSTEM" active="false" focused="false" '
        'bounds="[0,0][1080,96]" />'
        '<window title="Settings" type="TYPE_APPLICATION" active="true" focused="true" '
        'bounds="[0,0][1080,2400]"><hierarchy rotation="0"><node text="Wi-Fi" '
        'package="com.android.settings" class="android.widget.TextView" '
        'bounds="[0,300][1080,400]" /></hierarchy></window></display></displays>'
    )
    assert [e.text for e in parse_scene(xml, (1080, 2400)).elements] == ["Wi-Fi"]


# --- text `input` cannot type ---------------------------------------------------------------------


def test_virtual_input_text_fails_on_non_ascii_as_a_phone_does(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    device = adbutils.AdbClient(host="127.0.0.1", port=server.port).device(SERIAL)
    phone.launch("com.amc.notes")
    result = device.shell2("input text Grüße")
    assert result.returncode == 255
    assert "java.lang.NullPointerException" in result.output


def _new_contact(d: AdbDriver) -> Scene:
    d.launch_app("com.android.contacts")
    scene = _scene(d)
    d.tap(*next(e for e in scene.elements if e.content_desc == "Create contact").bounds.center)
    return _scene(d)


def test_non_ascii_text_is_refused_without_echoing_it(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    scene = _new_contact(d)
    field = next(e for e in scene.elements if "EditText" in e.class_name)
    action = types_pb2.Action(
        input_text=types_pb2.InputTextAction(text="Grüße 你好", element_id=field.element_id)
    )
    result = execute(d, action, scene)
    assert not result.ok and result.error is not None
    assert "ASCII only" in result.error and "nothing was typed" in result.error
    assert "Grüße" not in result.error and "你好" not in result.error
    assert not any(phone.current_page().fields.values())
    d.input_text("plain ascii")
    assert "plain ascii" in phone.current_page().fields.values()


def test_input_output_reporting_a_failure_raises(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, _ = adb
    d = AdbDriver(SERIAL, port=server.port)
    with pytest.raises(DeviceError, match="Unknown keycode"):
        d._input("input keyevent KEYCODE_NOT_A_KEY", "press key")
    # Typed text never reaches the message, only the exception's class.
    with pytest.raises(DeviceError) as raised:
        d._input("input text Straße", "input text", quote=False)
    assert "java.lang.NullPointerException" in str(raised.value)
    assert "Stra" not in str(raised.value)


async def test_the_offline_planner_sees_the_failed_input_and_never_claims_success(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    planner = DirectPlanner(Planner(OfflineProvider()))
    history: list[WorldEvent] = []
    failed: list[str] = []
    for _ in range(8):
        scene = _scene(d)
        decision = await planner.decide(
            'Create a note titled "Grüße" that says "milk and eggs"', scene, history
        )
        assert not (decision.tool_name == "complete" and decision.arguments.get("success"))
        result = execute(d, decision.action, scene)
        if decision.tool_name == "input_text":
            assert not result.ok and result.error is not None
            failed.append(result.error)
        history.append(WorldEvent.from_decision(decision, page=scene.page, success=result.ok))
    assert failed and all("ASCII only" in e for e in failed)
    assert phone.state.notes == []


# --- a slow phone is not a gone phone -------------------------------------------------------------


def test_a_read_timeout_is_busy_not_disconnected(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port, timeout_s=0.5)
    # `input swipe` takes its duration on the phone: far longer than this driver's reads wait.
    with pytest.raises(DeviceBusy, match="timed out") as raised:
        d.swipe(500, 1500, 500, 500, 60_000)
    assert not isinstance(raised.value, DeviceGone)
    assert phone.online
    assert d.current_app() == phone.current_package()


def test_a_request_adb_closes_while_it_lists_the_phone_is_busy_not_gone(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """adbd closes a request before starting it while it cannot (restarting, out of
    processes); the adb server answers "closed" (`adb`: "error: closed") and still lists the
    phone. It was read as an unplugged phone: a look's dump was not retried, the attempt
    ended "phone … disconnected" and the host reported the phone offline; a tap ended it too.
    Now adb's device list decides, as for a stream cut short."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    size = d.screen_size()
    for service, call in (
        (f"shell:{DUMP_COMMAND}", d.dump_hierarchy),
        ("sync:", d.dump_hierarchy),  # the pull of the dump
        ("exec-out:screencap", d.screenshot_png),
        ("shell:input tap", lambda: d.tap(100, 200)),
    ):
        phone.close_service(service)
        with pytest.raises(DeviceBusy, match="closed") as raised:
            call()
        assert not isinstance(raised.value, DeviceGone), service
    phone.close_service(f"shell:{DUMP_COMMAND}", 2)
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)
    # A phone adb no longer lists is gone, whatever the request's failure said.
    server.unplug(SERIAL)
    with pytest.raises(DeviceGone):
        d.tap(100, 200)


def test_a_phone_that_refuses_injected_input_says_why(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Xiaomi, Redmi and POCO phones refuse `input` events until "USB debugging (Security
    settings)" is on. Android 11+ prints "Exception occurred while executing 'tap':" and the
    cause on the next line: the error quoted only the first line, so the operator (and the
    planner, retrying the tap) never learned why. It now names the SecurityException and the
    setting; typed text still stays out of the message."""
    server, phone = adb
    phone.refuse_injected_input = True
    d = AdbDriver(SERIAL, port=server.port)
    with pytest.raises(DeviceError) as tapped:
        d.tap(100, 200)
    assert not isinstance(tapped.value, DeviceGone)
    message = str(tapped.value)
    assert "java.lang.SecurityException" in message and "INJECT_EVENTS" in message
    assert "USB debugging (Security settings)" in message
    with pytest.raises(DeviceError) as typed:
        d.input_text("hunter2")
    assert "USB debugging (Security settings)" in str(typed.value)
    assert "hunter2" not in str(typed.value)


def test_timeouts_are_not_gone() -> None:
    assert not is_gone(AdbTimeout("adb read timeout"))
    assert not is_gone(TimeoutError("timed out"))
    assert is_gone(AdbError("device 'x' not found"))
    assert is_gone(ConnectionResetError("reset"))


# --- a device poll that fails ----------------------------------------------------------------


def test_a_failed_device_poll_keeps_the_last_states_for_a_while(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, _ = adb
    registry = DeviceRegistry(port=server.port, offline_after_failed_polls=3)
    seen: list[tuple[str, str]] = []
    registry.refresh()
    registry.add_listener(lambda info, kind: seen.append((info.serial, kind)))
    server.fail_device_lists(2)
    assert registry.refresh() == [] and registry.refresh() == []
    assert seen == []
    assert [d.online for d in registry.devices()] == [True]
    assert registry.refresh() == []  # the list answers again: still online, nothing to say
    # Three failures in a row: the phones are reported offline, and online when it answers.
    server.fail_device_lists(3)
    registry.refresh()
    registry.refresh()
    assert seen == []
    registry.refresh()
    assert seen == [(SERIAL, "offline")]
    registry.refresh()
    assert seen[-1] == (SERIAL, "online")


def test_a_device_poll_on_a_wedged_adb_server_fails_instead_of_hanging(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A real adb server whose USB thread is stuck (a phone on a bad cable or hub) accepts
    `host:devices` and never answers. The poll read it without any timeout: the host's
    startup poll (and every later one) blocked its worker thread for good, so the host never
    started, never noticed a phone leave, and could not shut down. Now the poll gives up after
    its timeout and counts as a failed one (the last states stand)."""
    import threading

    server, _ = adb
    registry = DeviceRegistry(port=server.port, timeout_s=0.5)
    registry.refresh()
    server.stall_device_lists(1)
    result: list[object] = []
    poll = threading.Thread(target=lambda: result.append(registry.refresh()), daemon=True)
    poll.start()
    poll.join(60)  # a safety net for the test run only: before the fix it never returned
    assert not poll.is_alive(), "the device poll hung on a wedged adb server"
    assert result == [[]]
    assert [d.online for d in registry.devices()] == [True]


def test_no_adb_server_is_a_refusal_not_a_daemon_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """adbutils answers a refused connection by running `adb start-server` (a daemon on the
    default port, whatever port the host was given) and leaves the refused socket open: in CI a
    phone's adb server going away mid-step started a real daemon and leaked two sockets. The
    host's client refuses instead and closes what it opened. (The spy only records: `adb` is
    never run here, before or after.)"""
    import gc
    import socket
    import warnings

    from adbutils import _adb
    from adbutils.errors import AdbConnectionError

    from host.devices import adb_transport

    started: list[object] = []
    monkeypatch.setattr(_adb.subprocess, "run", lambda *a, **k: started.append(a))
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = adb_transport.Client(host="127.0.0.1", port=port)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        with pytest.raises(AdbConnectionError, match="connect to adb server failed"):
            client.make_connection(timeout=1.0)
        with pytest.raises(AdbConnectionError):
            client.list()
        gc.collect()
    assert started == []


def test_the_focused_window_is_display_zeros_when_another_display_is_listed_first(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """From Android 10 `dumpsys window` names a focused window per display, and a second
    display (a cast or cover screen) that has focus may be listed first: the host took its
    window for the phone's, so a look and a launch's check named an app the phone's own
    screen does not show."""
    server, phone = adb
    phone.multi_display = True
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    out = (
        adbutils.AdbClient(host="127.0.0.1", port=server.port)
        .device(SERIAL)
        .shell("dumpsys window")
    )
    assert out.index("mDisplayId=2") < out.index("mDisplayId=0")  # the trap is there
    assert d.current_window() == "com.android.settings/com.android.settings.Settings"
    assert d.current_app() == "com.android.settings"


@pytest.mark.parametrize("driver", [AdbDriver, U2Driver])
def test_a_dump_with_unescaped_ampersands_is_read_and_said_to_be_repaired(
    adb: tuple[ThreadedAdbServer, VirtualPhone], driver: type[AdbDriver] | type[U2Driver]
) -> None:
    """Some ROMs' and apps' dumpers write "Network & internet" with a raw `&` (and a raw
    `<`), which no XML parser reads: every try failed as a malformed dump and the look went
    on without a tree, the planner left with the screenshot. The dump is now repaired (only
    those characters, only inside attribute values), the tree is seen with its texts as the
    screen shows them, and the observation says that the dump needed repair."""
    server, phone = adb
    phone.unescaped_dumps = True
    d = driver(SERIAL, port=server.port)
    try:
        d.launch_app("com.android.settings")
        scene = Perceiver(None, retries=2, retry_delay_s=0).perceive(d, with_ocr=False).scene
    finally:
        if isinstance(d, U2Driver):
            d._reset()
    assert not scene.tree_missing
    assert any(e.text == "Network & internet" for e in scene.elements)
    assert "unescaped '&'" in scene.tree_repaired
    observation = observation_from_scene(scene)
    assert observation.ui_tree_repaired == scene.tree_repaired
    assert scene_from_observation(observation).to_prompt()["ui_tree"].startswith("repaired")
    phone.unescaped_dumps = False
    assert not Perceiver(None).perceive(d, with_ocr=False).scene.tree_repaired


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_look_names_the_activity_in_front_as_the_node_host_does(
    adb: tuple[ThreadedAdbServer, VirtualPhone], driver: str
) -> None:
    """The Python host read the focused window (`package/activity`) at every look but never
    sent it: `foreground_activity` was always empty, while the Node host sends it for the same
    screen (its Settings page or a SubSettings one says more than the package alone)."""
    server, _phone = adb
    d = (AdbDriver if driver == "adbutils" else U2Driver)(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    scene = Perceiver(retry_delay_s=0).perceive(d, with_ocr=False).scene
    assert scene.activity == d.current_window()
    assert scene.activity.startswith("com.android.settings/")
    assert observation_from_scene(scene).foreground_activity == scene.activity


@pytest.mark.parametrize("driver", [AdbDriver, U2Driver])
def test_a_dump_with_raw_quotes_in_its_texts_is_read_and_said_to_be_repaired(
    adb: tuple[ThreadedAdbServer, VirtualPhone], driver: type[AdbDriver] | type[U2Driver]
) -> None:
    """The same OEM dumpers write a `"` in a text raw too (`text="Say "hi""`): the parse
    failed at every try and the look went on without a tree, though the phone answered. A
    quote that does not end the value (no attribute or tag end follows it) is now escaped."""
    server, phone = adb
    phone.unescaped_dumps = True
    phone.state.notes.append(Note(title='Say "hi" & <wave>', body=""))
    d = driver(SERIAL, port=server.port)
    try:
        d.launch_app("com.amc.notes")
        scene = Perceiver(None, retries=2, retry_delay_s=0).perceive(d, with_ocr=False).scene
    finally:
        if isinstance(d, U2Driver):
            d._reset()
    assert not scene.tree_missing
    assert any(e.text == 'Say "hi" & <wave>' for e in scene.elements)
    assert "unescaped" in scene.tree_repaired


@pytest.mark.parametrize(
    "value",
    ['Tap "Allow" to continue', 'ends with "quote"', '"', 'a" b', 'a="b', '"" and ""'],
)
def test_a_raw_quote_in_a_dumped_text_is_kept_as_the_phone_shows_it(value: str) -> None:
    """What a dumper that leaves `"` raw writes, read back as the text the screen shows."""
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?><hierarchy rotation="0">'
        f'<node index="0" text="{value}" resource-id="" class="android.widget.TextView" '
        'package="com.example" content-desc="" clickable="true" bounds="[0,0][100,100]" />'
        "</hierarchy>"
    )
    scene = parse_scene(xml, (1080, 2400), "com.example")
    assert [e.text for e in scene.elements] == [value]
    assert scene.tree_repaired


def test_a_floating_keyboard_hides_only_what_lies_under_it(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A floating keyboard (Gboard's, Samsung Keyboard's floating mode) sits mid-screen. The
    look took every keyboard to reach down to the navigation bar, so the app's buttons below
    it (a note's Save and Discard) were cut to slivers beside it, or left out when they lay
    within its width, though the screen shows them whole and a tap reaches them."""
    server, phone = adb
    phone.floating_keyboard = True
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.amc.notes")
    new = next(e for e in _scene(d).elements if e.content_desc == "New note")
    d.tap(*new.bounds.center)  # the editor opens with its title field focused
    scene = _scene(d)
    assert scene.keyboard_shown
    keyboard = next(e for e in scene.elements if e.package == phone.keyboard_package)
    for label in ("Save", "Discard"):
        node = phone.find(label)
        assert node is not None
        shown = Bounds(*node.bounds)
        assert shown.top >= keyboard.bounds.bottom  # below the keyboard, in plain view
        assert [e.bounds for e in scene.elements if e.text == label] == [shown]
    d.input_text("Milk")
    save = next(e for e in scene.elements if e.text == "Save")
    d.tap(*save.bounds.center)
    assert [n.title for n in phone.state.notes] == ["Milk"]


async def test_a_command_cut_short_by_adb_going_offline_is_not_taken_as_done(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """`adb: device offline` mid-command (a USB hiccup): the adb server closes the command's
    stream cleanly, and the phone is listed as "device" again a moment later. What had
    arrived read like a finished command, so a swipe cut short was reported done. Output
    without the end marker is now a passing failure (`DeviceBusy`) when adb lists the phone
    again, and `DeviceGone` while it does not."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.screen_size()
    swipe = asyncio.create_task(asyncio.to_thread(d.swipe, 540, 1800, 540, 600, 20_000))
    await until(lambda: server.server.connections(SERIAL) == 1, what="the swipe's shell running")
    server.server.cut_streams(SERIAL)
    with pytest.raises(DeviceBusy, match="cut short"):
        await swipe
    assert d.screen_size() == (1080, 2400)  # the phone is usable again
    # Offline when asked: gone, as before.
    swipe = asyncio.create_task(asyncio.to_thread(d.swipe, 540, 1800, 540, 600, 20_000))
    await until(lambda: server.server.connections(SERIAL) == 1, what="the next swipe running")
    phone.set_adb_state("offline")
    with pytest.raises(DeviceGone):
        await swipe


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
@pytest.mark.parametrize("linker_warning", ["", "WARNING: linker: libfoo.so has text relocations."])
def test_an_android_4_phone_is_captured_through_the_shell_byte_for_byte(
    driver: str, linker_warning: str
) -> None:
    """adbd before Android 5.0 has no `exec:` services: its service_to_fd
    (system/core/adb/services.c of KitKat) knows no such name, so handle_packet answers the
    OPEN with send_close, and the adb server fails the client's request with "closed"
    (sockets.c, local_socket_close_notify): the virtual phone's `old_adbd` answers so. Every
    `exec-out:screencap -p` failed that way, and such a phone had no screenshot. The drivers
    now capture it through `shell:`, whose pty wrote each "\\n" of the PNG as "\\r\\n"
    (Android before 7 ran every shell command on a pty), and undo that: also after a line
    printed before the PNG on the same pty (a linker warning), which the undo skipped (it
    looked for the translated signature at the start only) and the PNG came back broken."""
    phone = VirtualPhone(SERIAL)
    phone.sdk = 19  # Android 4.4
    phone.old_adbd = True
    phone.screencap_linker_warning = linker_warning
    phone.u2_screenshot_null = True  # uiautomator2's own capture gives none: its fallback
    with ThreadedAdbServer([phone]) as server:
        client = adb_transport.Client("127.0.0.1", server.port)
        with pytest.raises(AdbError, match="closed"):
            adb_transport.run(client, SERIAL, "exec-out:screencap -p")
        d: AdbDriver | U2Driver
        d = (
            AdbDriver(SERIAL, port=server.port)
            if driver == "adbutils"
            else U2Driver(SERIAL, port=server.port)
        )
        try:
            png = d.screenshot_png()
        finally:
            if isinstance(d, U2Driver):
                d._reset()
        assert png == phone.screencap_png()
