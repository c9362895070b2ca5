"""The uiautomator2 driver through the Driver interface, against the virtual phone's emulated
on-device agent (pushed and started over the adb protocol exactly as on a real phone), and the
whole agent loop on it."""

from __future__ import annotations

import gc
import io
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import adbutils
import pytest
from PIL import Image

from host.devices import adb_transport
from host.devices.adb_driver import AdbDriver
from host.devices.base import (
    BridgeHeld,
    DeviceBusy,
    DeviceError,
    DeviceGone,
    ScreenshotError,
    ScreenUnavailable,
)
from host.devices.u2_driver import U2Driver, utf8_pieces
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.apps.base import PhoneApi
from host.devices.virtual.apps.stub import StubApp
from host.devices.virtual.layout import Node
from host.devices.virtual.phone import AdbState, VirtualPhone
from host.devices.virtual.state import Page
from host.devices.virtual.widgets import Geometry
from host.perception.hierarchy import parse_scene
from host.perception.perceive import Perceiver

SERIAL = "emulator-5554"


@pytest.fixture
def served() -> Iterator[tuple[ThreadedAdbServer, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone])
    server.start()
    yield server, phone
    server.stop()


def test_driver_interface_end_to_end(served: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    assert d.screen_size() == (1080, 2400)
    assert d.screenshot_png()[:4] == b"\x89PNG"
    d.launch_app("com.android.settings")
    assert d.current_app() == "com.android.settings"
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    display = next(e for e in scene.elements if e.text == "Display")
    d.tap(*display.bounds.center)
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    dark = next(e for e in scene.elements if e.text == "Dark theme")
    d.tap(*dark.bounds.center)
    assert phone.state.settings["dark_theme"] is True
    d.press_key("back")
    d.press_key("home")
    assert d.current_app() == "com.android.launcher3"
    d.launch_app("com.android.contacts")
    d.terminate_app("com.android.contacts")
    assert d.current_app() != "com.android.contacts"


def test_unplugged_phone_is_device_gone(served: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    server, _ = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    server.unplug(SERIAL)
    with pytest.raises(DeviceGone):
        d.dump_hierarchy()


def test_a_phone_unplugged_mid_launch_is_gone(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The adb server ends a vanished phone's shell stream cleanly, and uiautomator2 reads
    the cut `monkey` run as "shell output invalid": the launch failed as a plain DeviceError
    (a step error naming adb internals) instead of a phone that disconnected. The cable is
    pulled while the phone launches the app (the virtual phone's launch is wrapped only to
    time the unplug; nothing of the host is replaced)."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    launch = phone.launch

    def unplugged_while_launching(package: str) -> bool:
        server.unplug(SERIAL)
        return launch(package)

    phone.launch = unplugged_while_launching  # type: ignore[method-assign]
    with pytest.raises(DeviceGone, match=SERIAL):
        d.launch_app("com.android.settings")


def test_text_is_exact_and_delete_erases(served: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    """send_keys (clipboard + paste here: no AdbKeyboard installed) types any text exactly, and
    press("delete") reaches the phone as KEYCODE_DEL."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.launch_app("com.android.contacts")
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    create = next(e for e in scene.elements if "Create contact" in (e.text, e.content_desc))
    d.tap(*create.bounds.center)
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    d.tap(*next(e for e in scene.elements if "EditText" in e.class_name).bounds.center)
    page = phone.current_page()
    assert page.focus is not None
    for text in ["a%sb c'd\"e&f", "%%s%s%", "$HOME `id` $(id) ;|<>*?~# ", "Zoë ✓"]:
        phone.clear_text()
        d.input_text(text)
        assert page.fields[page.focus] == text
    d.press_key("delete")
    d.press_key("delete")
    assert page.fields[page.focus] == "Zoë"


def test_a_long_text_arrives_whole_through_the_adb_keyboard_on_small_adb_packets(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """With uiautomator2's AdbKeyboard installed, send_keys sends the whole text as base64
    in one `am broadcast` shell request; adbd before Android 7 opens none longer than 4096
    bytes, so a 10 KiB text dropped the connection and typed nothing. It now goes in pieces."""
    server, phone = served
    phone.adbd_max_payload = 4096
    phone.installed.add("com.github.uiautomator")  # the helper APK with the AdbKeyboard IME
    d = U2Driver(SERIAL, port=server.port)
    d.launch_app("com.android.contacts")
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    create = next(e for e in scene.elements if "Create contact" in (e.text, e.content_desc))
    d.tap(*create.bounds.center)
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    d.tap(*next(e for e in scene.elements if "EditText" in e.class_name).bounds.center)
    text = ('Zoë\'s "plan" & 100% ✓ 東京 $HOME; ' * 400)[:10240]
    d.input_text(text)
    page = phone.current_page()
    assert page.focus is not None
    assert page.fields[page.focus] == text
    assert d.keyboard_package() == "com.github.uiautomator"  # typed through its broadcast


def test_utf8_pieces_cut_between_characters() -> None:
    assert utf8_pieces("aé✓b", 3) == ["aé", "✓", "b"]
    assert utf8_pieces("", 3) == []
    assert "".join(utf8_pieces("東京" * 999, 2048)) == "東京" * 999


class _DeepApp(StubApp):
    """A screen nested like a WebView or React Native page: its button sits 80 levels down."""

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del phone, page
        frame = (0, geo.top, geo.width, geo.bottom)
        leaf = Node(
            "android.widget.Button", (100, 1000, 600, 1150), text="Deep button", clickable=True
        )
        node = leaf
        for _ in range(80):
            node = Node("android.view.ViewGroup", frame, children=[node])
        return [node]


def test_deep_trees_are_dumped_past_uiautomator2s_default_depth(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = served
    app = _DeepApp("com.example.deep", "Deep", "com.example.deep.Main", (0, 0, 0))
    phone.apps[app.package] = app
    assert phone.launch(app.package)
    d = U2Driver(SERIAL, port=server.port)
    # uiautomator2's own default (50 levels) loses the button; the driver asks for more.
    assert "Deep button" not in d._d().dump_hierarchy()
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    button = next(e for e in scene.elements if e.text == "Deep button")
    assert button.clickable


def test_a_tree_too_deep_for_the_servers_stack_is_dumped_at_uiautomator2s_depth(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A tree deeper than the server's stack holds overflows its dumper's recursion
    (-32001 "java.lang.StackOverflowError", openatx/uiautomator2#691), and asking for 120
    levels (for WebView and React Native screens) reaches it where uiautomator2's own 50 do
    not. That was a plain DeviceError: the attempt ended failed for good, and every later one
    on that screen. The dump is asked again at uiautomator2's depth, the deeper nodes left out."""
    server, phone = served
    app = _DeepApp("com.example.deep", "Deep", "com.example.deep.Main", (0, 0, 0))
    phone.apps[app.package] = app
    assert phone.launch(app.package)
    phone.u2_stack_levels = 70
    d = U2Driver(SERIAL, port=server.port)
    xml = d.dump_hierarchy()
    assert 'package="com.example.deep"' in xml and "Deep button" not in xml
    assert parse_scene(xml, d.screen_size(), d.current_app()).package == "com.example.deep"


def test_a_dump_that_throws_mid_walk_is_busy_and_retried(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The agent's dumper throws a NullPointerException when a node vanishes mid-dump; the
    library raises RPCUnknownError carrying it. A passing failure, retried like an idle-state
    error."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    size = d.screen_size()
    phone.glitch_dumps("npe")
    with pytest.raises(DeviceBusy, match="NullPointerException"):
        d.dump_hierarchy()
    phone.glitch_dumps("npe", 2)
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)


def test_a_dump_the_server_answers_null_is_busy_and_retried(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A server whose dumper caught an exception it only logs answers the dump with null
    (older openatx servers end `dumpWindowHierarchy` with `return null`). uiautomator2 then
    fails inside its own empty-dump check with a TypeError, which no driver error covered:
    the attempt ended failed for good ("TypeError: argument of type 'NoneType' is not
    iterable"). It is now a passing failure, retried like an empty dump."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    size = d.screen_size()
    phone.u2_dump_nulls = 1
    with pytest.raises(DeviceBusy, match="no hierarchy"):
        d.dump_hierarchy()
    phone.u2_dump_nulls = 2
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)


def _agent_pids(phone: VirtualPhone) -> list[int]:
    return [p.pid for p in phone.processes.spawned() if p.name == "app_process"]


def test_a_u2_server_that_dies_mid_call_is_busy_and_restarted(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The on-phone server dies mid-call (the library raises http.client.RemoteDisconnected)
    while adb still lists the phone: a passing failure, not a disconnection; the next call
    starts a new server."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    size = d.screen_size()
    first = _agent_pids(phone)
    phone.crash_u2_agent()
    with pytest.raises(DeviceBusy, match="uiautomator2's server") as raised:
        d.dump_hierarchy()
    assert not isinstance(raised.value, DeviceGone)
    phone.crash_u2_agent()
    with pytest.raises(DeviceBusy):
        d.tap(10, 10)
    phone.crash_u2_agent()
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)
    assert _agent_pids(phone) and _agent_pids(phone) != first


@pytest.mark.parametrize("trouble", ["ui_automation_lost", "http_500"])
def test_a_broken_u2_server_is_restarted_for_a_later_driver(
    served: tuple[ThreadedAdbServer, VirtualPhone], trouble: str
) -> None:
    """The server an earlier attempt's driver started breaks while it still answers /ping:
    it lost its UiAutomation connection (every call fails "UiAutomation not connected!"), or
    it answers every call with an HTTP error (NanoHTTPD's 500). uiautomator2 restarts only a
    server its own Device started, so each call of a later driver failed as a plain
    DeviceError, the task failed for good, and so did every later task on the phone. Now it
    is a busy phone whose server is stopped, and the retry starts a working one."""
    server, phone = served
    U2Driver(SERIAL, port=server.port).screen_size()  # an earlier attempt starts the server
    d = U2Driver(SERIAL, port=server.port)
    size = d.screen_size()
    d.tap(1, 1)  # this driver has talked to the server
    first = _agent_pids(phone)
    if trouble == "ui_automation_lost":
        phone.lose_u2_automation()
        words = "lost its UiAutomation connection"
    else:
        phone.break_u2_agent(500)
        words = "answered HTTP request failed: 500"
    with pytest.raises(DeviceBusy, match=words):
        d.dump_hierarchy()
    scene, _ = Perceiver(retries=2, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)
    assert _agent_pids(phone) and _agent_pids(phone) != first


def test_a_u2_server_out_of_memory_is_busy_and_restarted(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A long-running server runs out of heap: every call answers -32001
    "java.lang.OutOfMemoryError" until it restarts (openatx/android-uiautomator-server#64,
    openatx/uiautomator2#1052), while it still answers /ping. A screenshot failed as a plain
    DeviceError, which ended the attempt failed for good, and so did every later task on the
    phone (the server stayed up); a dump was tried again against the same server until the
    look gave up on its tree. Now it is a busy phone whose server is stopped, and the next
    call starts a working one."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    size = d.screen_size()
    d.tap(1, 1)  # the server is up
    first = _agent_pids(phone)
    phone.exhaust_u2_memory()
    with pytest.raises(DeviceBusy, match="out of memory"):
        d.screenshot_png()
    assert d.screenshot_png()[:4] == b"\x89PNG"
    second = _agent_pids(phone)
    assert second and second != first
    phone.exhaust_u2_memory()
    scene, _ = Perceiver(retries=2, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)
    assert _agent_pids(phone) and _agent_pids(phone) != second


_LINKER_WARNING = (
    "WARNING: linker: /system/lib/libhwui.so: unused DT entry: type 0x6ffffffe arg 0x2d8c"
)


def test_a_server_that_gives_no_screenshot_is_read_with_screencap_on_an_old_phone() -> None:
    """uiautomator2's takeScreenshot answers null on Android 4-6 (openatx/uiautomator2#1027),
    and the library's fallback asks `dumpsys SurfaceFlinger --display-id`, which those
    releases do not know: every screenshot failed "No display found" as a plain DeviceError,
    so every task on such a phone failed for good. The driver now takes `screencap` as the adb
    driver does, past the linker's warning printed before the PNG."""
    phone = VirtualPhone(SERIAL)
    phone.sdk = 23
    with ThreadedAdbServer([phone]) as server:
        d = U2Driver(SERIAL, port=server.port)
        d.screen_size()
        phone.u2_screenshot_null = True
        phone.screencap_linker_warning = _LINKER_WARNING
        png = d.screenshot_png()
        with Image.open(io.BytesIO(png)) as shot:
            assert shot.convert("RGB").tobytes() == phone.screencap_image().convert("RGB").tobytes()


def test_a_server_whose_screenshot_throws_is_read_with_screencap(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2's server can fail every takeScreenshot with a JSON-RPC error (built
    against java.util.Base64, it throws NoClassDefFoundError on Android 7 builds:
    openatx/uiautomator2#1008). That was a plain DeviceError at every look's first step, so
    every task on such a phone failed for good. It is taken with `screencap`, as a null
    screenshot is."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    phone.u2_screenshot_error = "java.lang.NoClassDefFoundError"
    png = d.screenshot_png()
    with Image.open(io.BytesIO(png)) as shot:
        assert shot.convert("RGB").tobytes() == phone.screencap_image().convert("RGB").tobytes()


def test_a_phone_unplugged_mid_screencap_is_gone(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The screencap taken for a server that gave no screenshot ends cleanly when the cable
    is pulled (the adb server closes the stream): it was "screencap returned no PNG", an
    unreadable screenshot, so the attempt ended as a screen the phone cannot show and the
    phone stayed listed online. adb is asked, as the adb driver asks it (the virtual phone's
    capture is wrapped only to time the unplug)."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    phone.u2_screenshot_null = True
    capture = phone.screencap_png

    def unplugged_while_capturing() -> bytes:
        server.unplug(SERIAL)
        return capture()

    phone.screencap_png = unplugged_while_capturing  # type: ignore[method-assign]
    with pytest.raises(DeviceGone, match=SERIAL):
        d.screenshot_png()


def test_screencap_output_over_the_size_a_look_reads_is_no_screenshot(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The `screencap` taken for a server that gave no screenshot was read whole however
    much the phone wrote (the adb driver's has a cap). Past the most a look reads it is a
    `ScreenshotError` naming that size, and the next one under the size is read as before."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    phone.u2_screenshot_null = True
    whole = d.screenshot_png()
    assert d.screenshot_max_bytes == AdbDriver(SERIAL, port=server.port).screenshot_max_bytes
    d.screenshot_max_bytes = len(whole) // 2
    with pytest.raises(ScreenshotError, match=rf"over the {len(whole) // 2} bytes a look reads"):
        d.screenshot_png()
    d.screenshot_max_bytes = len(whole)
    assert d.screenshot_png() == whole


def test_a_garbled_screencap_behind_a_null_server_screenshot_is_no_black_screen(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The library's fallback (adbutils' screenshot) turns a capture it cannot read into a
    black image of the screen's size: the look went on with a black screenshot (to the model,
    the timeline and OCR) as if it were the screen. Now it is an unreadable screenshot, as
    with the adb driver (the attempt ends retryable)."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    phone.u2_screenshot_null = True
    phone.garble_screenshots("garbage", 2)
    with pytest.raises(ScreenshotError, match="unreadable screenshot"):
        Perceiver(None, retry_delay_s=0).perceive(d, with_ocr=False)


@pytest.mark.parametrize("server_shot", [True, False])
def test_a_screenshot_whose_header_declares_an_absurd_size_is_unreadable(
    served: tuple[ThreadedAdbServer, VirtualPhone], server_shot: bool
) -> None:
    """A garbled capture whose header reads as 60000x60000 pixels: Pillow refuses to open it
    (DecompressionBombError, which is no OSError), and the u2 driver let that through: the
    agent loop ended the task failed for good ("DecompressionBombError: …") instead of an
    unreadable screenshot, which ends the attempt retryable and counts against the phone.
    Both the server's JPEG and the `screencap` PNG behind a null one."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    phone.u2_screenshot_null = not server_shot
    phone.garble_screenshots("huge", 2)
    with pytest.raises(ScreenshotError, match="unreadable screenshot"):
        Perceiver(None, retry_delay_s=0).perceive(d, with_ocr=False)


def test_a_server_screenshot_that_is_no_base64_is_unreadable(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The server's `takeScreenshot` answers a text that does not decode as base64 (here a
    JPEG's base64 cut one character past a whole group): the decoder's ValueError got out of
    the driver, and the agent loop ended the task failed for good instead of an unreadable
    screenshot, which ends the attempt retryable and counts against the phone."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    phone.u2_screenshot_text = "/9j/4AAQSkZJRgABAQ"[:17]
    with pytest.raises(ScreenshotError, match=r"unreadable screenshot .*base64"):
        d.screenshot_png()
    with pytest.raises(ScreenshotError, match="unreadable screenshot"):
        Perceiver(None, retry_delay_s=0).perceive(d, with_ocr=False)


@contextmanager
def _bridge_held(server: ThreadedAdbServer, phone: VirtualPhone) -> Iterator[None]:
    """A `uiautomator dump` that hangs on the phone, holding its accessibility bridge, for
    the block's duration (then killed)."""
    client = adb_transport.Client("127.0.0.1", server.port)
    phone.hang_dumps(60.0)
    dumping = threading.Thread(
        target=adb_transport.run,
        args=(client, SERIAL, "shell:uiautomator dump /data/local/tmp/held.xml", 90.0),
    )
    dumping.start()
    try:
        until = time.monotonic() + 30
        while phone.dumper is None and time.monotonic() < until:
            time.sleep(0.05)
        assert phone.dumper is not None
        yield
    finally:
        if phone.dumper is not None:
            adb_transport.run(client, SERIAL, f"shell:kill {phone.dumper.pid}", 10.0)
        dumping.join(timeout=30)


def _launch_readers() -> int:
    """uiautomator2's threads that read a started server's output until its stream ends."""
    return sum(t.name == "wait_adb_conn" for t in threading.enumerate())


def test_a_u2_server_that_does_not_come_up_leaves_no_connection_open(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2 keeps the stream of the server it launches in the Device it is making; a
    server that does not come up fails that Device's making, so nothing closed the stream:
    one socket left to the garbage collector per failed connect (a ResourceWarning, an open
    file descriptor until then, on a host retrying a phone for hours). The driver now closes
    it."""
    server, phone = served
    readers = _launch_readers()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with _bridge_held(server, phone):
            try:
                U2Driver(SERIAL, port=server.port, bridge_wait_s=1.0).screen_size()
            except DeviceError:
                pass  # not kept: its traceback would keep the stream alive
            else:
                raise AssertionError("the server came up beside another UiAutomation client")
        until = time.monotonic() + 30
        while _launch_readers() > readers and time.monotonic() < until:
            time.sleep(0.05)
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_a_u2_server_that_cannot_start_beside_another_ui_automation_client_says_who_to_stop(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """While another UiAutomation client holds the accessibility bridge (here a `uiautomator
    dump` that hangs), uiautomator2's server dies at start with "… already registered!". The
    driver's error was "connect failed on …:" and the server's whole log and Java stack
    trace, which became the task's summary; it now says what holds the phone and what to do,
    as the adb driver's does for its dumps."""
    server, phone = served
    with _bridge_held(server, phone):
        with pytest.raises(BridgeHeld, match="another UiAutomation client") as raised:
            U2Driver(SERIAL, port=server.port, bridge_wait_s=0.5).screen_size()
        message = str(raised.value)
        del raised  # its traceback would keep uiautomator2's objects alive
    assert "\tat " not in message  # no Java stack trace
    assert "still did after 0.5 s" in message


def test_a_u2_server_waits_for_a_bridge_another_client_lets_go_of(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Another tool's UiAutomation client mostly ends soon (its dump or its session
    finishing), but the server's start beside it failed the call, and the task, for good.
    The start is now tried again for a bounded time, and gets the bridge once it is free."""
    server, phone = served
    client = adb_transport.Client("127.0.0.1", server.port)
    phone.hang_dumps(1.0)  # a dump of another tool's that ends by itself
    dumping = threading.Thread(
        target=adb_transport.run,
        args=(client, SERIAL, "shell:uiautomator dump /data/local/tmp/other.xml", 30.0),
    )
    d = U2Driver(SERIAL, port=server.port, bridge_wait_s=30)
    dumping.start()
    try:
        until = time.monotonic() + 30
        while phone.dumper is None and time.monotonic() < until:
            time.sleep(0.05)
        assert phone.dumper is not None
        assert d.screen_size() == (1080, 2400)
        assert "Settings" in d.dump_hierarchy()
    finally:
        dumping.join(timeout=30)
        d._reset()


@pytest.mark.parametrize("maker", ["com.lbe.security.miui", "com.example.made.up.permissions"])
def test_a_makers_own_permission_prompt_covers_the_app(maker: str) -> None:
    """MIUI shows runtime permission prompts from its own package; a maker's prompt amc has no
    package name for (the second one is made up) is still told by its `permission_allow…` /
    `permission_deny…` button ids. uiautomator2's dump says no window types, so only these
    tell the prompt from an app."""
    phone = VirtualPhone(SERIAL, permission_package=maker)
    with ThreadedAdbServer([phone]) as server:
        d = U2Driver(SERIAL, port=server.port)
        d.launch_app("com.android.contacts")
        phone.show_permission_prompt("com.android.contacts")
        scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    assert scene.overlays == ["permission_prompt"]
    assert {e.package for e in scene.elements} == {maker}


def test_launching_an_app_that_is_not_installed_fails(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """monkey prints "** No activities found to run, monkey aborted." for a package the phone
    does not have; both drivers read that as a failed launch, not a launched app."""
    server, phone = served
    for d in (U2Driver(SERIAL, port=server.port), AdbDriver(SERIAL, port=server.port)):
        with pytest.raises(DeviceError, match=r"cannot launch com\.example\.notinstalled"):
            d.launch_app("com.example.notinstalled")
    assert phone.current_package() == "com.android.launcher3"


def test_a_wedged_uiautomator2_server_times_out_as_a_busy_phone(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2 sets its 300 s `http_timeout` on an `HTTPConnection` whose `connect` it
    overrides with a socket from adb, so the timeout never reached the socket: a call to an
    on-phone server that hangs (connection open, no answer) blocked its step, and its worker
    thread, for good. Now every JSON-RPC read is bounded by the driver's timeout, and a call
    that runs out of it is `DeviceBusy` (the phone is there; the next call starts the server
    again) instead of a hang. (The thread's join is a safety net for the test run only.)"""
    import threading

    server, phone = served
    d = U2Driver(SERIAL, port=server.port, rpc_timeout_s=0.5)
    assert d.screen_size() == (1080, 2400)
    phone.hang_u2_agent(3.0)
    raised: list[BaseException] = []

    def dump() -> None:
        try:
            d.dump_hierarchy()
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=dump, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "a call to a wedged uiautomator2 server never returned"
    assert len(raised) == 1 and isinstance(raised[0], DeviceBusy), raised
    assert "timed out" in str(raised[0])
    assert d.screen_size() == (1080, 2400)  # the next call starts the server again


def test_taps_and_swipes_on_the_screens_edge_work_where_dumpsys_display_names_no_rotation(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2 takes a coordinate below 1 for a fraction of the screen (`pos_rel2abs`),
    so for a 0 it first reads the screen's size through adbutils' `window_size`, whose
    rotation comes from `dumpsys display`; on builds whose dump names none
    (openatx/adbutils#22) that failed "rotation get failed": a tap on the left or top edge
    and a swipe down from the top (the notification shade) failed on such a phone, where
    the adb driver's worked. Now the driver's pixels go to the server as they are."""
    server, phone = served
    phone.display_dump_orientation = False
    d = U2Driver(SERIAL, port=server.port)
    d.tap(0, 1200)
    d.tap(540, 0)
    d.swipe(540, 0, 540, 1600, 300)
    assert phone.shade, "the swipe down from the top edge did not open the shade"


def test_a_shell_command_the_phone_does_not_answer_is_busy_as_in_the_adb_driver(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2's `shell` turns every adb error into its `AdbShellError` (uiautomator2
    3.x `base.py`: `except adbutils.AdbError as e: raise AdbShellError(e)`), adbutils'
    `AdbTimeout` too (an `AdbError`). A phone that took `dumpsys window` and never answered
    failed the u2 driver's look at the current app as a plain `DeviceError`, not counted
    toward the phone's health as a step left unanswered, where the adb driver says
    `DeviceBusy` "timed out" for the same stall. Both now say the same."""
    server, phone = served
    for d in (
        U2Driver(SERIAL, port=server.port, rpc_timeout_s=0.5),
        AdbDriver(SERIAL, port=server.port, timeout_s=0.5),
    ):
        assert d.screen_size() == (1080, 2400)
        phone.stall_service("shell:dumpsys window", 600.0)
        with pytest.raises(DeviceBusy, match="timed out") as raised:
            d.current_window()
        assert not isinstance(raised.value, DeviceGone)
        assert SERIAL in str(raised.value)
        assert d.current_app() == "com.android.launcher3"  # the next call is answered


@pytest.mark.parametrize(
    ("service", "step"),
    [
        ("shell:toybox md5sum", "toybox md5sum"),
        ("sync:", "sync: push"),
        ("shell:CLASSPATH=", "start of uiautomator2's server"),
        ("tcp:9008", "tcp:9008 connection"),
    ],
)
def test_a_stuck_phone_fails_uiautomator2s_first_connect_naming_the_step(
    served: tuple[ThreadedAdbServer, VirtualPhone], service: str, step: str
) -> None:
    """uiautomator2's first connect checks `u2.jar`'s md5sum (adbutils waits 600 s for a
    shell), pushes the jar (a sync with no timeout at all), starts its server and opens the
    `tcp:9008` forward (600 s for the OKAY): a phone whose adbd took the request and never
    answered held the connect, and the phone's lane, for ten minutes or for good. Each step
    now waits the driver's timeout at most and fails `DeviceBusy` naming the phone and the
    step. (The thread's join is a safety net for the test run only.)"""
    import threading

    server, phone = served
    phone.stall_service(service, 600.0)
    d = U2Driver(SERIAL, port=server.port, rpc_timeout_s=0.5)
    raised: list[BaseException] = []

    def connect() -> None:
        try:
            d.screen_size()
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), f"uiautomator2's connect never returned ({service} stuck)"
    assert len(raised) == 1 and isinstance(raised[0], DeviceBusy), raised
    assert not isinstance(raised[0], DeviceGone)
    assert SERIAL in str(raised[0]) and step in str(raised[0]), raised[0]
    assert d.screen_size() == (1080, 2400)  # the next call connects


@pytest.mark.parametrize("adb_state", ["unauthorized", "offline", "authorizing", "connecting"])
def test_both_drivers_say_what_adb_lists_an_unreachable_phone_as(
    served: tuple[ThreadedAdbServer, VirtualPhone], adb_state: AdbState
) -> None:
    """adb refuses every request for a phone it lists as unauthorized ("device
    unauthorized. … check for a confirmation dialog on your device") or offline; both drivers
    called that "disconnected". Now the error carries the state and says what to do. So for
    the states a phone passes through as it is plugged in (adb's "device still authorizing"
    while it tries its keys, "device still connecting" before the phone's adbd answered),
    which the drivers called "disconnected … not listed" of a phone adb lists."""
    server, phone = served
    for d in (U2Driver(SERIAL, port=server.port), AdbDriver(SERIAL, port=server.port)):
        d.screen_size()
        phone.set_adb_state(adb_state)
        with pytest.raises(DeviceGone) as raised:
            d.tap(10, 10)
        assert raised.value.state == adb_state
        assert f"phone {SERIAL} is {adb_state} in adb (tap)" in str(raised.value)
        assert "disconnected" not in str(raised.value)
        phone.set_adb_state("device")


def test_uiautomator2_devices_are_not_kept_for_every_connect(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2 registers an atexit hook (`stop_uiautomator`) for every Device it makes
    and never removes it, so each Device stayed alive for the life of the process: one for
    every reset after a timed-out or dropped call, and one for every attempt's driver. A
    host up for days piled them up. At most one per phone (the one that started the server
    now running, so the server is stopped when the host exits) is kept now."""
    import gc

    import uiautomator2 as u2

    server, phone = served

    def devices() -> int:
        gc.collect()
        return sum(isinstance(o, u2.Device) for o in gc.get_objects())

    before = devices()
    for _ in range(3):  # an attempt's driver each
        d = U2Driver(SERIAL, port=server.port, rpc_timeout_s=0.3)
        assert d.screen_size() == (1080, 2400)
        for _ in range(2):  # a reset after a timeout, then one after a dropped call
            phone.hang_u2_agent(1.0)
            with pytest.raises(DeviceBusy, match="timed out"):
                d.dump_hierarchy()
            assert d.screen_size() == (1080, 2400)
            phone.crash_u2_agent()
            with pytest.raises(DeviceBusy, match="uiautomator2's server"):
                d.dump_hierarchy()
            assert d.screen_size() == (1080, 2400)
    del d
    assert devices() - before <= 1


def test_a_u2_server_killed_midway_through_its_answer_is_busy_and_restarted(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The on-phone server dies while it writes an answer (the low-memory killer taking it
    during a big dump): the body ends short of its Content-Length, uiautomator2 parses what
    came, and its `JSONDecodeError` (no driver error covered it) left the driver as it was
    and failed the task ("JSONDecodeError: …") instead of being retried. It is the same passing
    failure as a server that dies before it answers: busy, retried within the look, the
    server started again."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    size = d.screen_size()
    first = _agent_pids(phone)
    phone.crash_u2_agent(mid_answer=True)
    with pytest.raises(DeviceBusy, match="uiautomator2's server") as raised:
        d.dump_hierarchy()
    assert not isinstance(raised.value, DeviceGone)
    phone.crash_u2_agent(mid_answer=True)
    scene, _ = Perceiver(retries=3, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)
    assert _agent_pids(phone) and _agent_pids(phone) != first


def test_a_gone_phone_keeps_no_uiautomator2_device(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The Device that started a phone's server keeps its exit hook (see above), so a phone
    unplugged for good (a serial used once: an emulator, adb over Wi-Fi) kept its Device, and
    its dead launch stream, for the life of the host. Once a call finds the phone gone the
    driver lets it go."""
    import gc

    import uiautomator2 as u2

    server, _ = served

    def devices() -> int:
        gc.collect()
        return sum(isinstance(o, u2.Device) for o in gc.get_objects())

    before = devices()
    d = U2Driver(SERIAL, port=server.port)
    assert d.screen_size() == (1080, 2400)
    server.unplug(SERIAL)
    with pytest.raises(DeviceGone):
        d.dump_hierarchy()
    del d
    assert devices() - before <= 0


def test_a_later_attempts_driver_restarts_a_wedged_server_it_did_not_start(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Each attempt makes its own driver; the server an earlier attempt's driver started runs
    on, and the later driver's Device only talks to it. A call of the later driver that timed
    out reset only its own Device, which had no server to stop, so the wedged server was
    kept instead of started again."""
    server, phone = served
    U2Driver(SERIAL, port=server.port).screen_size()
    later = U2Driver(SERIAL, port=server.port, rpc_timeout_s=0.5)
    assert later.screen_size() == (1080, 2400)
    first = _agent_pids(phone)
    phone.hang_u2_agent(2.0)
    with pytest.raises(DeviceBusy, match="timed out"):
        later.dump_hierarchy()
    assert later.screen_size() == (1080, 2400)
    assert _agent_pids(phone) and _agent_pids(phone) != first


def test_the_current_app_is_display_zeros_when_another_display_has_focus(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2's `app_current` (adbutils') finds no focus in `dumpsys window windows`
    from Android 10 on, and falls back to `dumpsys activity`, which lists the focused
    display's task first: with a cast or cover screen in front it named that display's app,
    so a look and a launch's check saw an app the phone's own screen does not show. It is
    now read as the adb driver reads it: display 0's focus in `dumpsys window`."""
    server, phone = served
    phone.multi_display = True
    d = U2Driver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    listed = adbutils.AdbClient(host="127.0.0.1", port=server.port).device(SERIAL)
    assert listed.app_current().package == "com.example.presentation"  # the trap is there
    assert d.current_app() == "com.android.settings"
    assert d.current_window() == "com.android.settings/com.android.settings.Settings"
    assert d.current_window() == AdbDriver(SERIAL, port=server.port).current_window()


_OTHER_PROGRAM = """
import sys, adbutils, uiautomator2 as u2
d = u2.connect(adbutils.AdbClient(host="127.0.0.1", port=int(sys.argv[1])).device(sys.argv[2]))
print("started" if d._process is not None else "reused", flush=True)
sys.stdin.read()
"""


def test_a_broken_u2_server_another_program_started_is_named_not_restarted(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2 reuses a server that answers `/ping` and stops only one its own Device
    started. When another program's server (another host's, weditor's, a script's) lost its
    UiAutomation, every call waited 10 s for a stop that never happened and failed
    `DeviceBusy` "the next call starts the server again", which it never did: the task
    looked at a dead server for all its attempts. Now the error says that another program
    started the server and how to free the phone, and ends the attempt retryable, without
    first polling the server for 10 s to quit (uiautomator2's stop of a server its Device
    did not start kills nothing, and `/ping` answers all along)."""
    server, phone = served
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROGRAM, str(server.port), SERIAL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "started"
        d = U2Driver(SERIAL, port=server.port)
        assert d.screen_size() == (1080, 2400)
        phone.lose_u2_automation()
        pings = phone.u2_pings
        with pytest.raises(ScreenUnavailable, match="started by another program") as raised:
            d.dump_hierarchy()
        assert "com.wetest.uia2.Main" in str(raised.value)
        # One look whether the server is up before uiautomator2's retry, none while waiting
        # for a stop that never happens.
        assert phone.u2_pings - pings <= 1
        del raised
    finally:
        other.communicate("", timeout=60)


#: What uiautomator2's server printed as it died at start on a custom ROM
#: (openatx/uiautomator2#1076), cut after its cause.
_LAUNCH_CRASH = (
    "java.lang.reflect.InvocationTargetException\n"
    "\tat java.lang.reflect.Method.invoke(Native Method)\n"
    "\tat com.wetest.uia2.Main.runServer(Main.java:49)\n"
    "\tat com.wetest.uia2.Main.main(Main.java:30)\n"
    "Caused by: java.lang.UnsatisfiedLinkError: No implementation found for "
    "java.lang.String android.util.UtilConfig.GetInfo()\n"
)


def test_a_u2_server_that_dies_at_start_is_the_phones_condition(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2's server dies as it starts (a ROM it cannot run on, openatx/uiautomator2
    #1076): uiautomator2 raises LaunchUiAutomationError("server quit unexpectly", its output),
    which the driver passed on as a plain `DeviceError`, so the agent loop ended the task
    failed for good ("DeviceError: connect failed …") and never counted it against the phone.
    It is the phone's condition: `ScreenUnavailable` (the attempt ends retryable and the
    phone's health counts it), saying the server did not start and why."""
    server, phone = served
    phone.u2_launch_crash = _LAUNCH_CRASH
    d = U2Driver(SERIAL, port=server.port)
    with pytest.raises(ScreenUnavailable) as raised:
        d.dump_hierarchy()
    message = str(raised.value)
    assert f"uiautomator2's server did not start on {SERIAL}" in message
    assert "java.lang.UnsatisfiedLinkError" in message
    phone.u2_launch_crash = ""
    assert any(e.text == "Settings" for e in parse_scene(d.dump_hierarchy()).elements)


def test_a_phone_too_full_for_the_u2_jar_says_so(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2 pushes its jar to a phone that lacks it; on a full phone adbd answers the
    push FAIL "write failed: No space left on device". adbutils' push raises AdbError("FAIL")
    and leaves that reason unread, so the driver said "connect failed on …: FAIL", a plain
    `DeviceError` that ended the task failed for good and never counted against the phone.
    Now it names the reason and what to do, as `ScreenUnavailable` (the phone's condition)."""
    server, phone = served
    phone.storage_left = 100
    d = U2Driver(SERIAL, port=server.port)
    with pytest.raises(ScreenUnavailable) as raised:
        d.dump_hierarchy()
    message = str(raised.value)
    assert "write failed: No space left on device" in message, message
    assert "free some space on the phone" in message
    phone.storage_left = None
    assert any(e.text == "Settings" for e in parse_scene(d.dump_hierarchy()).elements)


@pytest.mark.parametrize(
    "head",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n",  # BadStatusLine: another program on the server's port
        b"HTTP/1.1 2",  # BadStatusLine: the server died writing its status line
        b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 70000 + b"\r\n\r\n",  # LineTooLong
    ],
    ids=["not-http", "cut-status-line", "line-too-long"],
)
def test_an_answer_that_is_not_http_is_busy_and_the_server_restarted(
    served: tuple[ThreadedAdbServer, VirtualPhone], head: bytes
) -> None:
    """What `http.client` cannot read as an HTTP answer raises its own errors, which
    uiautomator2 passes on as they are (its `_http_request` maps only requests' errors): a
    `BadStatusLine` or `LineTooLong` left the driver unmapped and failed the task as a host
    error, where the `IncompleteRead` of an answer cut short is a busy phone, retried. It is
    the same now: busy, the message naming what came, the server started again."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    size = d.screen_size()
    first = _agent_pids(phone)
    phone.garble_u2_agent(head)
    with pytest.raises(DeviceBusy, match="its answer was not HTTP") as raised:
        d.dump_hierarchy()
    assert not isinstance(raised.value, DeviceGone)
    assert len(str(raised.value)) < 1000, raised.value
    scene, _ = Perceiver(retries=1, retry_delay_s=0).scene_from_dump(d, size, None)
    assert any(e.text == "Settings" for e in scene.elements)
    assert _agent_pids(phone) and _agent_pids(phone) != first


def test_typing_where_the_clipboard_is_refused_installs_nothing_and_says_what_to_do(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """uiautomator2's `send_keys` (3.7.1, `Device.send_keys`), with no AdbKeyboard on the
    phone, types through the clipboard and, on any failure of that, installs its helper app
    (`_setup_ime`: `adb install app-uiautomator.apk`) and selects its keyboard: a phone whose
    operator allowed no installs got an app mid-task. Now nothing is installed: the step fails
    saying why and what the operator can do. The refusal is the one a ROM gives the shell user
    (openatx/uiautomator2#1029), thrown by the virtual phone's agent as the real one's
    jsonrpc4j resolver does; uiautomator2 and adbutils are the real ones."""
    server, phone = served
    d = U2Driver(SERIAL, port=server.port)
    d.launch_app("com.android.contacts")
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    create = next(e for e in scene.elements if "Create contact" in (e.text, e.content_desc))
    d.tap(*create.bounds.center)
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    d.tap(*next(e for e in scene.elements if "EditText" in e.class_name).bounds.center)
    phone.fail_u2_call(
        "setClipboard", "java.lang.SecurityException", "Package android does not belong to 2000"
    )
    with pytest.raises(DeviceError) as raised:
        d.input_text("Zoë")
    assert not isinstance(raised.value, DeviceBusy), raised.value  # the phone answered
    message = str(raised.value)
    assert "java.lang.SecurityException" in message, message  # why the clipboard failed
    assert "com.github.uiautomator" in message and "adb -s emulator-5554 install" in message
    assert "com.github.uiautomator" not in phone.installed
    page = phone.current_page()
    assert page.focus is not None and not page.fields.get(page.focus)  # nothing typed


def test_a_dump_over_the_size_a_look_reads_is_no_tree_not_parsed(
    served: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The adb driver refuses a dump over `dump_max_bytes` (a runaway list, a corrupt tree);
    uiautomator2's went on to be parsed whole in the one host process that drives every
    phone. Over the size it is now busy too (the look retries, then goes on from the
    screenshot with the reason), and the next dump under it is read as before. (The HTTP
    answer itself is still read whole by uiautomator2's client before the check.)"""
    server, _ = served
    d = U2Driver(SERIAL, port=server.port)
    d.screen_size()
    whole = d.dump_hierarchy()
    d.dump_max_bytes = len(whole.encode()) // 2
    with pytest.raises(DeviceBusy, match=rf"over the {d.dump_max_bytes} bytes a look reads"):
        d.dump_hierarchy()
    scene = Perceiver(None, retries=2, retry_delay_s=0).perceive(d, with_ocr=False).scene
    assert not scene.elements and "over the" in scene.tree_missing
    d.dump_max_bytes = len(whole.encode())
    assert d.dump_hierarchy() == whole
    assert U2Driver(SERIAL).dump_max_bytes == AdbDriver(SERIAL).dump_max_bytes
