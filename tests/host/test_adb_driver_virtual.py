"""The adbutils driver and the device registry against the virtual phone over the adb protocol."""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import adbutils
import pytest

from amc.v1 import types_pb2
from host.agent.actions import execute
from host.devices.adb_driver import (
    AdbDriver,
    escape_input_text,
    input_text_commands,
    parse_current_package,
    shell_lines,
)
from host.devices.base import DeviceBusy, DeviceError, DeviceGone
from host.devices.registry import DeviceRegistry
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import AdbState, VirtualPhone
from host.perception.hierarchy import parse_scene

SERIAL = "emulator-5554"


@pytest.fixture
def adb() -> Iterator[tuple[ThreadedAdbServer, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone, VirtualPhone("emulator-5556")])
    server.start()
    yield server, phone
    server.stop()


def _element(driver: AdbDriver, text: str) -> tuple[int, int]:
    scene = parse_scene(driver.dump_hierarchy(), driver.screen_size(), driver.current_app())
    el = next(e for e in scene.elements if e.text == text or e.content_desc == text)
    return el.bounds.center


def test_basic_queries(adb: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    assert d.screen_size() == (phone.width, phone.height)
    png = d.screenshot_png()
    assert png.startswith(b"\x89PNG")
    xml = d.dump_hierarchy()
    assert xml.startswith("<?xml")
    assert d.current_app() == phone.current_package()


def test_launch_tap_back_and_stop(adb: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    assert d.current_app() == "com.android.settings"
    d.tap(*_element(d, "Display"))
    assert "Dark theme" in d.dump_hierarchy()
    d.press_key("back")
    assert phone.current_package() == "com.android.settings"
    d.swipe(540, 1800, 540, 600, 200)
    d.long_press(540, 1200, 600)
    d.terminate_app("com.android.settings")
    assert d.current_app() != "com.android.settings"
    with pytest.raises(DeviceError):
        d.launch_app("com.example.$(reboot)")


def test_text_input_with_shell_specials(adb: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    server, _ = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.contacts")
    d.tap(*_element(d, "Create contact"))
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    field = next(e for e in scene.elements if "EditText" in e.class_name)
    d.tap(*field.bounds.center)
    text = 'Ann O\'Neil & co 100% "x"'
    d.input_text(text)
    assert text in d.dump_hierarchy().replace("&amp;", "&").replace("&quot;", '"').replace(
        "&apos;", "'"
    )


def _focus_contact_name(d: AdbDriver) -> None:
    """Open a new contact and focus its first text field."""
    d.launch_app("com.android.contacts")
    d.tap(*_element(d, "Create contact"))
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    field = next(e for e in scene.elements if "EditText" in e.class_name)
    d.tap(*field.bounds.center)


def _focused_text(d: AdbDriver) -> str:
    """The focused field's text in a dump pulled over adb (raw: the scene strips whitespace)."""
    root = ET.fromstring(d.dump_hierarchy())
    return next(n.get("text", "") for n in root.iter("node") if n.get("focused") == "true")


# Strings `input text` gets wrong when typed naively: `%s` (Android types a space for it),
# `%` next to a space or an `s`, shell quoting, expansion, globbing and comment characters.
TRICKY_TEXTS = [
    "a%sb c'd\"e&f",
    "%s",
    "%%s%s%",
    "100% sure, 5%s",
    "s%",
    "p%ss w%rd%",
    "$HOME ${X} `id` $(id) \\n \\%s",
    "x;y|z&&w>o<i (g) {b} [c]*?!~#^ ~u #c",
    "  two  spaces ",
]


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_typed_text_arrives_exactly(adb: tuple[ThreadedAdbServer, VirtualPhone], text: str) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    _focus_contact_name(d)
    d.input_text(text)
    page = phone.current_page()
    assert page.focus is not None
    assert page.fields[page.focus] == text
    assert _focused_text(d) == text


# 10 KiB of text with every kind `input text` must escape or split, as a chat message or a
# pasted document would be.
LONG_TEXT = ("".join(TRICKY_TEXTS) * 200)[:10240]


def test_a_long_text_arrives_whole_on_a_phone_with_small_adb_packets(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """adbd before Android 7 opens no request longer than its 4096-byte packet; the whole
    text went in one `shell:` request, which the adb server could not open ("destination
    oversized"): the connection dropped, the step failed with "Unknown data: b''" and nothing
    was typed. It now goes in `input text` commands that each fit."""
    server, phone = adb
    phone.adbd_max_payload = 4096
    d = AdbDriver(SERIAL, port=server.port)
    _focus_contact_name(d)
    d.input_text(LONG_TEXT)
    page = phone.current_page()
    assert page.focus is not None
    assert page.fields[page.focus] == LONG_TEXT


def test_long_text_commands_fit_one_request_each() -> None:
    lines = shell_lines(input_text_commands(LONG_TEXT))
    assert len(lines) > 3
    assert all(len(f"shell:{line}; echo --amc-shell-end--") < 4096 - 1 for line in lines)
    assert shell_lines(["a", "b"]) == ["a && b"]


def test_delete_key_erases_characters(adb: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    """KEY_DELETE from a planner action runs through the agent loop's executor as KEYCODE_DEL."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    _focus_contact_name(d)
    d.input_text("Ada Lovelacex")
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    delete = types_pb2.Action(
        press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_DELETE),
        purpose="erase",
        expected_outcome="shorter",
    )
    assert execute(d, delete, scene).ok
    d.press_key("delete")
    assert _focused_text(d) == "Ada Lovelac"
    for _ in range(20):  # more presses than characters: the field ends empty, nothing else moves
        d.press_key("delete")
    page = phone.current_page()
    assert page.focus is not None
    assert page.fields[page.focus] == ""  # (a dump shows the hint text of an empty field)
    assert phone.current_package() == "com.android.contacts"


def test_delete_key_with_nothing_focused_does_nothing(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.launch_app("com.android.settings")
    before = d.dump_hierarchy()
    d.press_key("delete")
    assert d.current_app() == "com.android.settings"
    assert d.dump_hierarchy() == before
    assert phone.current_page().name == "main"


def test_escape_input_text() -> None:
    assert escape_input_text("a b") == "a%sb"
    assert escape_input_text("50%") == "50%"
    assert escape_input_text("$HOME;rm") == "\\$HOME\\;rm"


def test_input_text_splits_between_percent_and_s() -> None:
    assert input_text_commands("a%sb") == ["input text a%", "input text sb"]
    assert input_text_commands("%s%s") == ["input text %", "input text s%", "input text s"]
    assert input_text_commands("100% x") == ["input text 100%%sx"]


def test_current_package_parsing() -> None:
    line = "  mCurrentFocus=Window{8e3c u0 com.android.settings/com.android.settings.Settings}"
    assert parse_current_package(line) == "com.android.settings"
    assert parse_current_package("nothing here") == ""


def test_unplugged_phone_is_device_gone(adb: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    server, _ = adb
    d = AdbDriver(SERIAL, port=server.port)
    d.screen_size()
    server.unplug(SERIAL)
    with pytest.raises(DeviceGone, match=SERIAL):
        d.dump_hierarchy()
    with pytest.raises(DeviceGone):
        d.tap(1, 1)


def test_a_phone_unplugged_mid_action_is_gone_not_done(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Pulling the cable ends the phone's adb streams cleanly (the adb server closes their
    sockets), so a command in flight read as one that finished: a swipe (a tap, a key, typed
    text) cut short was reported done, and its step recorded as a success on a phone that had
    gone. Now the driver notices the shell never finished and asks adb: `DeviceGone`. The
    other phone on the same server carries on."""
    server, _ = adb
    d = AdbDriver(SERIAL, port=server.port)
    outcome: list[DeviceError | None] = []

    def swipe() -> None:
        try:
            d.swipe(500, 1500, 500, 500, 60_000)  # the phone takes a minute over it
            outcome.append(None)
        except DeviceError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=swipe, daemon=True)
    worker.start()
    while not server.server.connections(SERIAL) and worker.is_alive():
        time.sleep(0.01)  # until the swipe's stream is open
    server.unplug(SERIAL)
    worker.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], DeviceGone), outcome
    other = AdbDriver("emulator-5556", port=server.port)
    other.tap(10, 10)
    assert other.screen_size() == (1080, 2400)


def test_a_phone_unplugged_mid_screenshot_is_gone(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A screencap whose stream the unplug ended (cleanly, as the adb server closes it) was
    "screencap returned no PNG": a plain DeviceError, so the task failed as a phone fault
    instead of a phone that disconnected. The cable is pulled while the phone captures (the
    virtual phone's capture is wrapped only to time the unplug; nothing of the host is
    replaced)."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    capture = phone.screencap_png

    def unplugged_while_capturing() -> bytes:
        server.unplug(SERIAL)
        return capture()

    phone.screencap_png = unplugged_while_capturing  # type: ignore[method-assign]
    with pytest.raises(DeviceGone, match=SERIAL):
        d.screenshot_png()


def test_registry_reports_a_phone_still_booting_offline_until_it_has_booted(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """adb lists a phone as "device" as soon as its adbd runs, well before a booting phone's
    system services are up (`sys.boot_completed` unset). The registry reported it ONLINE, the
    cloud gave it tasks, and each attempt ended at its first look (a phone that rebooted
    mid-task was offered again within seconds, its task's attempts spent on a phone that could
    not run them). It is OFFLINE, as the contract says of a rebooting phone, until it has
    booted, with no event per poll meanwhile."""
    server, phone = adb
    phone.system_server_down = True
    registry = DeviceRegistry(port=server.port)
    seen: list[tuple[str, str]] = []
    registry.add_listener(lambda info, kind: seen.append((info.serial, kind)))
    registry.refresh()
    booting = registry.get(SERIAL)
    assert booting is not None and booting.state == types_pb2.DEVICE_STATE_OFFLINE
    other = registry.get("emulator-5556")
    assert other is not None and other.state == types_pb2.DEVICE_STATE_ONLINE
    seen.clear()
    assert registry.refresh() == []  # still booting: no change, no event
    phone.system_server_down = False
    registry.refresh()
    booted = registry.get(SERIAL)
    assert booted is not None and booted.state == types_pb2.DEVICE_STATE_ONLINE
    assert seen == [(SERIAL, "online")]


def test_a_phone_adb_may_not_open_is_reported_offline_with_what_fixes_it(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """On Linux without a udev rule for the phone adb lists it as `no permissions (…); see
    […]`; adbutils splits the line at spaces, so the registry read the state "no" and
    reported the phone OFFLINE with no reason: its operator saw "offline" next to a phone
    that was plugged in. It is OFFLINE with the fix as its reason (cloud and console), and a
    driver's request for it is a gone phone saying the same, not a plain failure."""
    server, phone = adb
    registry = DeviceRegistry(port=server.port)
    registry.refresh()
    phone.set_adb_state("no permissions")
    listed = {i.serial: i.state for i in adbutils.AdbClient(port=server.port).list()}
    assert listed[SERIAL] == "no"  # as adbutils reads the real server's line
    registry.refresh()
    info = registry.get(SERIAL)
    assert info is not None and info.state == types_pb2.DEVICE_STATE_OFFLINE
    reported = info.to_proto()
    assert reported.state == types_pb2.DEVICE_STATE_OFFLINE
    assert "adb has no permission for this USB device" in reported.reason
    assert "udev rule" in reported.reason and "plugdev" in reported.reason
    with pytest.raises(DeviceGone, match="adb has no permission for this USB device"):
        AdbDriver(SERIAL, port=server.port).screen_size()
    phone.set_adb_state("device")
    registry.refresh()
    back = registry.get(SERIAL)
    assert back is not None and back.online and back.to_proto().reason == ""


@pytest.mark.parametrize(
    ("adb_state", "reason"),
    [
        # Not its USB debugging prompt: a phone showing that is listed "unauthorized".
        ("authorizing", "adb is checking its key with the phone"),
        ("connecting", "adb is connecting to the phone"),
    ],
)
def test_a_phone_adb_is_still_authorizing_or_connecting_is_offline_saying_so(
    adb: tuple[ThreadedAdbServer, VirtualPhone], adb_state: AdbState, reason: str
) -> None:
    """The states a phone passes through as it is plugged in were OFFLINE with no reason:
    a phone stuck in one (adb's key check with it never finishing, an adbd that never
    answers) read as one with a bad cable. Each now says what adb waits for, also
    when a driver's failed request is what reported it."""
    server, phone = adb
    registry = DeviceRegistry(port=server.port)
    registry.refresh()
    phone.set_adb_state(adb_state)
    registry.refresh()
    info = registry.get(SERIAL)
    assert info is not None
    assert info.to_proto().state == types_pb2.DEVICE_STATE_OFFLINE
    assert info.to_proto().reason == reason
    phone.set_adb_state("device")
    registry.refresh()
    assert registry.mark_offline(SERIAL, adb_state)  # as the runner reports a DeviceGone
    marked = registry.get(SERIAL)
    assert marked is not None and marked.to_proto().reason == reason
    registry.refresh()
    back = registry.get(SERIAL)
    assert back is not None and back.online and back.to_proto().reason == ""


def test_registry_notices_vanish_and_return(adb: tuple[ThreadedAdbServer, VirtualPhone]) -> None:
    server, _ = adb
    registry = DeviceRegistry(port=server.port)
    seen: list[tuple[str, str]] = []
    registry.add_listener(lambda info, kind: seen.append((info.serial, kind)))
    registry.refresh()
    assert [d.serial for d in registry.devices()] == ["emulator-5554", "emulator-5556"]
    assert all(d.state == types_pb2.DEVICE_STATE_ONLINE for d in registry.devices())
    assert registry.devices()[0].model != ""
    seen.clear()
    server.unplug(SERIAL)
    registry.refresh()
    assert seen == [(SERIAL, "offline")]
    info = registry.get(SERIAL)
    assert info is not None
    assert info.state == types_pb2.DEVICE_STATE_OFFLINE
    assert registry.refresh() == []  # no change, no event
    server.replug(SERIAL)
    for _ in range(50):
        if registry.refresh():
            break
        time.sleep(0.02)
    assert seen[-1] == (SERIAL, "online")


def test_a_phone_gone_longer_than_the_setting_is_forgotten_unless_held(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """The registry kept every serial it ever saw, as OFFLINE, for good: on a host where
    phones come and go under new serials the list only grew. A phone adb has not listed for
    `forget_after_s` is now forgotten (one an attempt holds is kept); one back is new again."""
    server, _ = adb
    now = [0.0]
    registry = DeviceRegistry(port=server.port, forget_after_s=3600.0, clock=lambda: now[0])
    seen: list[tuple[str, str]] = []
    registry.add_listener(lambda info, kind: seen.append((info.serial, kind)))
    registry.refresh()
    server.unplug(SERIAL)
    server.unplug("emulator-5556")
    registry.refresh()
    now[0] = 3599.0
    registry.refresh()
    assert {d.serial for d in registry.devices()} == {SERIAL, "emulator-5556"}
    now[0] = 3600.0
    registry.refresh(held={"emulator-5556"})
    assert [d.serial for d in registry.devices()] == ["emulator-5556"]
    assert (SERIAL, "forgotten") in seen
    registry.refresh()
    assert registry.devices() == []
    server.replug(SERIAL)
    for _ in range(50):
        if registry.refresh():
            break
        time.sleep(0.02)
    assert [(d.serial, d.online) for d in registry.devices()] == [(SERIAL, True)]
    assert seen[-1] == (SERIAL, "online")


def test_an_adb_server_down_longer_than_the_setting_forgets_no_phone() -> None:
    """An adb server that was unreachable (stopped, restarting) for longer than
    `forget_after_s` made the registry forget every phone, although all were still plugged
    in: each poll without a list counted as one more poll they were missing from. Phones are
    OFFLINE while adb cannot be asked, and forgotten only for being missing from lists adb
    answered (counted from the first of those)."""
    phones = [VirtualPhone(SERIAL), VirtualPhone("emulator-5556")]
    server = ThreadedAdbServer(phones)
    port = server.start()
    now = [0.0]
    registry = DeviceRegistry(port=port, forget_after_s=3600.0, clock=lambda: now[0])
    seen: list[tuple[str, str]] = []
    registry.add_listener(lambda info, kind: seen.append((info.serial, kind)))
    try:
        registry.refresh()
        server.stop()
        registry.refresh()
        assert [d.online for d in registry.devices()] == [False, False]
        now[0] = 7200.0
        registry.refresh()
        assert [d.serial for d in registry.devices()] == [SERIAL, "emulator-5556"]
        assert not [kind for _, kind in seen if kind == "forgotten"], seen
        server = ThreadedAdbServer(phones[1:])  # back on its port, one phone unplugged meanwhile
        server.start(port=port)
        registry.refresh()
        assert [(d.serial, d.online) for d in registry.devices()] == [
            (SERIAL, False),
            ("emulator-5556", True),
        ]
        now[0] = 7200.0 + 3599.0
        registry.refresh()
        assert SERIAL in {d.serial for d in registry.devices()}
        now[0] = 7200.0 + 3600.0
        registry.refresh()
        assert [d.serial for d in registry.devices()] == ["emulator-5556"]
        assert seen[-1] == (SERIAL, "forgotten")
    finally:
        server.stop()


def test_an_adb_outage_does_not_count_toward_forgetting_a_phone_missing_before_it() -> None:
    """A phone already missing from adb's lists when the adb server went away was counted
    missing through the whole outage (from the first list without it), so it was forgotten
    as soon as lists came back after an outage longer than `forget_after_s`, having been
    seen missing for much less. Only the time between lists adb answered counts now."""
    phones = [VirtualPhone(SERIAL), VirtualPhone("emulator-5556")]
    server = ThreadedAdbServer(phones)
    port = server.start()
    now = [0.0]
    registry = DeviceRegistry(port=port, forget_after_s=3600.0, clock=lambda: now[0])
    try:
        registry.refresh()
        server.unplug(SERIAL)
        registry.refresh()  # missing from t=0
        now[0] = 1000.0
        registry.refresh()  # 1000 s missing
        server.stop()
        for t in (2000.0, 8000.0):  # the outage: no lists
            now[0] = t
            registry.refresh()
        server = ThreadedAdbServer(phones)  # back on its port, the phone still unplugged
        server.start(port=port)
        now[0] = 9000.0
        registry.refresh()
        now[0] = 9000.0 + 2599.0  # 1000 + 2599 s missing from lists adb answered
        registry.refresh()
        assert SERIAL in {d.serial for d in registry.devices()}
        now[0] = 9000.0 + 2600.0
        registry.refresh()
        assert [d.serial for d in registry.devices()] == ["emulator-5556"]
    finally:
        server.stop()


def test_no_adb_server_means_no_phones_and_no_stray_daemon() -> None:
    # adbutils would run `adb start-server` (on 5037) when nothing listens; we check first.
    registry = DeviceRegistry(port=1)
    assert registry.refresh() == []
    assert registry.devices() == []
    with pytest.raises(DeviceGone, match="no adb server"):
        AdbDriver(SERIAL, port=1).tap(1, 1)


def test_screen_size_follows_a_resolution_change(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A resolution change while the host runs (`wm size WxH`, a maker's resolution setting,
    `wm size reset`) reaches the driver's next look: a size read once would clip or stretch
    every scene after it."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port)
    assert d.screen_size() == (1080, 2400)
    d._shell("wm size 720x1600", "test")
    assert "Override size: 720x1600" in d._shell("wm size", "test")
    assert d.screen_size() == (720, 1600)
    scene = parse_scene(d.dump_hierarchy(), d.screen_size(), d.current_app())
    assert max(e.bounds.right for e in scene.elements) <= 720
    assert max(e.bounds.bottom for e in scene.elements) <= 1600
    phone.rotate(1)
    assert d.screen_size() == (1600, 720)
    phone.rotate(0)
    phone.set_display_size((1440, 3200))  # grows past the first size too
    assert d.screen_size() == (1440, 3200)
    d._shell("wm size reset", "test")
    assert d.screen_size() == (1080, 2400)
    assert "Override size" not in d._shell("wm size", "test")


def test_a_dump_that_timed_out_is_stopped_before_the_retry(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """A `uiautomator dump` the host gave up on keeps running on the phone, holding the
    accessibility bridge: the driver stops it, so the retry dumps instead of failing with
    "… already registered!"; uiautomator2's server process is left alone."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port, timeout_s=0.5)
    # uiautomator2's server, as its agent runs (`app_process`) and as older ones did.
    for name in ("app_process", "com.github.uiautomator"):
        phone.processes.spawn(name, "shell", threading.Event())
    phone.hang_dumps(20.0)
    with pytest.raises(DeviceBusy):
        d.dump_hierarchy()
    assert phone.dumper is None
    assert d.dump_hierarchy().startswith("<?xml")
    names = {line.split()[-1] for line in d._shell("ps -A", "test").splitlines()}
    assert {"app_process", "com.github.uiautomator"} <= names
    assert "uiautomator" not in names


def test_a_stuck_dump_is_stopped_by_its_own_pid_only(
    adb: tuple[ThreadedAdbServer, VirtualPhone],
) -> None:
    """Another `uiautomator` runs on the phone beside the host's (another tool's dump or
    test run driving the same phone). The host's dump hangs and times out: the driver ends
    its own dumper, by the pid its shell printed before `exec`ing it, as the Node host does.
    Before, it killed every process `pidof uiautomator` named, the other tool's too."""
    server, phone = adb
    d = AdbDriver(SERIAL, port=server.port, timeout_s=0.5)
    other = phone.processes.spawn("uiautomator", "shell", threading.Event())
    phone.hang_dumps(20.0)
    with pytest.raises(DeviceBusy):
        d.dump_hierarchy()
    assert phone.dumper is None, "the host's own dumper was stopped"
    assert not other.stop.is_set(), "the other tool's uiautomator was killed"
    assert str(other.pid) in d._shell("pidof uiautomator", "test").split()
    assert d.dump_hierarchy().startswith("<?xml")


def test_phones_sharing_a_serial_keep_their_own_ids_and_are_driven_by_transport_id() -> None:
    """adb lists both phones under the one serial and refuses it ("more than one device"):
    the registry collapsed them into one phone whose every command failed as "disconnected".
    Each now has its id while its transport lives (also once the other one left), and both
    drivers reach it by transport id."""
    serial = "0123456789ABCDEF"
    first, second = VirtualPhone(serial), VirtualPhone(serial)
    second.state.settings["dark_theme"] = True
    with ThreadedAdbServer([first, second, VirtualPhone("emulator-5554")]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        ids = {p: f"{serial}@t{server.server.transport_id(p)}" for p in (first, second)}
        assert [d.serial for d in registry.devices()] == [*ids.values(), "emulator-5554"]
        for phone, key in ids.items():
            info = registry.get(key)
            assert info is not None and info.online and info.shared
            assert info.adb_serial == serial and info.model == "amc virtual phone"
            want = "yes" if phone is second else "no"
            adb = AdbDriver(key, port=server.port, transport_id=info.address)
            assert adb._shell("cmd uimode night", "night").strip() == f"Night mode: {want}"
            u2 = U2Driver(key, port=server.port, transport_id=info.address, adb_serial=serial)
            try:
                u2.launch_app("com.android.settings")
                assert u2.current_app() == "com.android.settings"
            finally:
                u2._reset()
        plain = registry.get("emulator-5554")
        assert plain is not None and plain.address is None
        second.unplug()
        registry.refresh()
        info = registry.get(ids[first])
        assert info is not None and info.online and not info.shared
        assert AdbDriver(ids[first], port=server.port, transport_id=info.address).current_app()
        gone = registry.get(ids[second])
        assert gone is not None and not gone.online
