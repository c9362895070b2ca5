"""The real adbutils client against the virtual adb server: every call goes over the socket."""

from __future__ import annotations

import asyncio
import io
import re
import socket
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import adbutils
import pytest
from PIL import Image

from host.devices import adb_transport
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer, VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.devices.virtual.u2_agent import DEFAULT_PORT, U2Agent
from tests.host.virtual.virtual_adb_script import AdbScript

ATTRS = [
    "index",
    "text",
    "resource-id",
    "class",
    "package",
    "content-desc",
    "checkable",
    "checked",
    "clickable",
    "enabled",
    "focusable",
    "focused",
    "scrollable",
    "long-clickable",
    "password",
    "selected",
    "bounds",
    "drawing-order",
    "hint",
]


def test_version_and_device_list(client: adbutils.AdbClient) -> None:
    assert client.server_version() == 41
    assert [(d.serial, d.state) for d in client.list()] == [
        ("virt-1", "device"),
        ("virt-2", "device"),
    ]
    long = {d.serial: d.tags for d in client.list(extended=True)}
    assert long["virt-2"]["model"] == "amc_tiny"
    assert long["virt-1"]["transport_id"] != long["virt-2"]["transport_id"]
    assert [d.serial for d in client.device_list()] == ["virt-1", "virt-2"]


def test_host_serial_queries(device: adbutils.AdbDevice) -> None:
    assert device.get_state() == "device"
    assert device.get_serialno() == "virt-1"
    assert "shell_v2" in device.get_features().split(",")


def test_shell_output_and_exit_codes(device: adbutils.AdbDevice) -> None:
    assert device.shell("echo hello world") == "hello world"
    v1 = device.shell2("ls /no/such/dir")
    assert v1.returncode == 1
    assert "No such file or directory" in v1.output
    v2 = device.shell2("echo out; echo err >&2; exit 3", v2=True)
    assert (v2.returncode, v2.stdout, v2.stderr) == (3, "out\n", "err\n")
    missing = device.shell2("frobnicate --now", v2=True)
    assert missing.returncode == 127
    assert missing.stderr == "/system/bin/sh: frobnicate: not found\n"
    assert device.shell2("false || echo fallback && true").output == "fallback\n"
    assert device.shell("echo \"$HOME\" '$HOME'") == "/ $HOME"


def test_props_and_window_size(client: adbutils.AdbClient, device: adbutils.AdbDevice) -> None:
    assert device.prop.model == "amc virtual phone"
    assert device.getprop("ro.build.version.sdk") == "34"
    assert device.shell("wm size") == "Physical size: 1080x2400"
    assert tuple(device.window_size()) == (1080, 2400)
    assert tuple(client.device("virt-2").window_size()) == (720, 1600)


def test_screenshot_is_png_of_screen_size(client: adbutils.AdbClient) -> None:
    for serial, size in (("virt-1", (1080, 2400)), ("virt-2", (720, 1600))):
        d = client.device(serial)
        assert d.screenshot().size == size
        raw = d.shell("screencap -p", encoding=None)
        assert raw.startswith(b"\x89PNG\r\n\x1a\n")
        img = Image.open(io.BytesIO(raw))
        img.verify()
    # exec-out is the binary-safe channel drivers use for screenshots
    conn = client.device("virt-1").open_transport()
    conn.send_command("exec-out:screencap -p")
    conn.check_okay()
    data = conn.read_until_close(encoding=None)
    conn.close()
    assert isinstance(data, bytes)
    assert Image.open(io.BytesIO(data)).size == (1080, 2400)


def test_dump_and_pull_give_real_format_xml(device: adbutils.AdbDevice, tmp_path: Path) -> None:
    out = device.shell("uiautomator dump /sdcard/window_dump.xml")
    assert out == "UI hierchary dumped to: /sdcard/window_dump.xml"
    local = tmp_path / "dump.xml"
    device.sync.pull("/sdcard/window_dump.xml", local)
    text = local.read_text(encoding="utf-8")
    assert text.startswith(
        "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\"><node "
    )
    assert device.shell("cat /sdcard/window_dump.xml") == text
    root = ET.fromstring(text)
    nodes = list(root.iter("node"))
    assert len(nodes) >= 8
    for node in nodes:
        # SDK 34's order; AOSP's dumper puts NAF="true" first on unlabelled clickable views.
        assert [a for a in node.attrib if a != "NAF"] == ATTRS
        assert next(iter(node.attrib)) in ("NAF", "index")
        assert re.fullmatch(r"\[\d+,\d+\]\[\d+,\d+\]", node.attrib["bounds"])
        assert node.attrib["package"] == "com.android.launcher3"
    assert {n.attrib["text"] for n in nodes} >= {"Settings", "Contacts", "Clock", "Calculator"}
    # adbutils' own helper (rm; dump && echo success; sync RECV) works as well
    assert ET.fromstring(device.dump_hierarchy()).tag == "hierarchy"


def test_sync_push_stat_list_and_missing_file(device: adbutils.AdbDevice) -> None:
    device.sync.push(b"hello phone", "/data/local/tmp/note.txt")
    assert device.sync.read_text("/data/local/tmp/note.txt") == "hello phone"
    assert device.sync.stat("/data/local/tmp/note.txt").size == 11
    assert "note.txt" in [f.path for f in device.sync.list("/data/local/tmp")]
    device.shell("rm /data/local/tmp/note.txt")
    assert not device.sync.exists("/data/local/tmp/note.txt")
    with pytest.raises(adbutils.AdbError):
        device.sync.read_bytes("/data/local/tmp/note.txt")


def test_tap_on_settings_icon_opens_settings(device: adbutils.AdbDevice) -> None:
    script = AdbScript(device)
    assert device.app_current().package == "com.android.launcher3"
    script.tap("Settings")
    current = device.app_current()
    assert (current.package, current.activity) == (
        "com.android.settings",
        "com.android.settings.Settings",
    )


def test_input_text_back_and_home(device: adbutils.AdbDevice, phone: VirtualPhone) -> None:
    script = AdbScript(device)
    script.launch("com.android.contacts")
    script.tap("Create contact")
    script.type("Miles O'Brien & co")
    script.key("KEYCODE_ENTER")
    script.type("555 0123")
    script.key("67")  # KEYCODE_DEL
    assert phone.current_page().fields == {"name": "Miles O'Brien & co", "phone": "555 012"}
    assert script.center(text="Miles O'Brien & co") is not None
    # The editor opened with the keyboard up: the first Back hides it, as on a phone.
    assert phone.keyboard_shown()
    device.keyevent("KEYCODE_BACK")
    assert not phone.keyboard_shown()
    assert phone.page_stack() == ["main", "editor"]
    device.keyevent("KEYCODE_BACK")
    assert phone.page_stack() == ["main"]
    device.keyevent("KEYCODE_HOME")
    assert device.app_current().package == "com.android.launcher3"
    device.app_start("com.android.contacts")
    assert phone.page_stack() == ["main"]


def test_swipe_scrolls_the_settings_list(device: adbutils.AdbDevice) -> None:
    script = AdbScript(device)
    script.launch("com.android.settings")
    assert script.center(text="About phone") is None
    assert script.center(text="Network & internet") is not None
    for _ in range(3):
        script.scroll_down()
    assert script.center(text="About phone") is not None
    assert script.center(text="Network & internet") is None


def test_long_press_is_a_swipe_that_does_not_move(device: adbutils.AdbDevice) -> None:
    script = AdbScript(device)
    point = script.center(text="Settings")
    assert point is not None
    device.shell(f"input swipe {point[0]} {point[1]} {point[0]} {point[1]} 800")
    assert device.app_current().package == "com.android.launcher3"  # icon: shortcuts, no launch
    device.shell(f"input swipe {point[0]} {point[1]} {point[0]} {point[1]} 100")
    assert device.app_current().package == "com.android.settings"  # short: a tap


def test_app_start_stop_and_am_start(device: adbutils.AdbDevice, phone: VirtualPhone) -> None:
    device.app_start("com.android.deskclock")
    assert device.app_current().package == "com.android.deskclock"
    device.app_stop("com.android.deskclock")
    assert device.app_current().package == "com.android.launcher3"
    out = device.shell("am start -n com.android.settings/.Settings\\$DisplaySettingsActivity")
    assert out.startswith("Starting: Intent { cmp=com.android.settings/")
    assert phone.page_stack() == ["display"]
    assert device.app_current().activity == "com.android.settings.SubSettings"
    assert "mResumedActivity" in device.shell("dumpsys activity activities")
    monkey = device.shell2("monkey -p com.example.nothing -c android.intent.category.LAUNCHER 1")
    assert "No activities found" in monkey.output
    assert monkey.returncode != 0


# adbutils' open_transport() does not close its socket when the server answers FAIL (as a real
# adb server does for a vanished serial); the leaked socket is reported when it is collected.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)
def test_unplug_drops_in_flight_command_and_device(
    adb_server: ThreadedAdbServer, client: adbutils.AdbClient, device: adbutils.AdbDevice
) -> None:
    started = threading.Event()
    outcome: dict[str, BaseException | None] = {}

    def long_command() -> None:
        started.set()
        try:
            device.shell2("sleep 30", v2=True)
            outcome["error"] = None
        except (adbutils.AdbError, EOFError, OSError) as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=long_command)
    worker.start()
    started.wait(5)
    # wait until the command's connection is bound to the phone before pulling the cable
    for _ in range(500):
        if adb_server.server.connections("virt-1"):
            break
        threading.Event().wait(0.01)
    adb_server.unplug("virt-1")
    worker.join(10)
    assert not worker.is_alive()
    assert outcome["error"] is not None
    assert [d.serial for d in client.list()] == ["virt-2"]
    with pytest.raises(adbutils.AdbError, match="not found"):
        device.shell("echo hi")
    assert client.device("virt-2").shell("echo still here") == "still here"
    adb_server.replug("virt-1")
    assert device.shell("echo back") == "back"


def test_several_phones_are_independent_and_concurrent(phones: list[VirtualPhone]) -> None:
    fleet = [VirtualPhone(f"fleet-{i}") for i in range(4)]
    packages = [
        "com.android.settings",
        "com.android.contacts",
        "com.android.deskclock",
        "com.android.calculator2",
    ]
    with ThreadedAdbServer(fleet) as server:
        client = adbutils.AdbClient(host="127.0.0.1", port=server.port, socket_timeout=20)
        errors: list[BaseException] = []

        def work(serial: str, package: str) -> None:
            try:
                d = client.device(serial)
                for _ in range(3):
                    d.app_start(package)
                    assert d.app_current().package == package
                    assert d.screenshot().size == (1080, 2400)
                    d.keyevent("KEYCODE_HOME")
                d.app_start(package)
            except BaseException as exc:  # collected and re-raised in the test thread
                errors.append(exc)

        threads = [
            threading.Thread(target=work, args=(p.serial, pkg))
            for p, pkg in zip(fleet, packages, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert [p.current_package() for p in fleet] == packages


def test_cable_pulled_on_the_phone_itself(client: adbutils.AdbClient, phone: VirtualPhone) -> None:
    before = {d.serial: d.tags["transport_id"] for d in client.list(extended=True)}
    phone.unplug()  # not through the server: it still notices
    assert [d.serial for d in client.list()] == ["virt-2"]
    phone.replug()
    after = {d.serial: d.tags["transport_id"] for d in client.list(extended=True)}
    assert set(after) == {"virt-1", "virt-2"}
    assert after["virt-1"] != before["virt-1"]  # a reconnect is a new transport
    assert client.device("virt-1").shell("echo ok") == "ok"


def test_dump_glitches_look_like_a_settling_screen(
    device: adbutils.AdbDevice, phone: VirtualPhone
) -> None:
    phone.glitch_dumps("idle")
    out = device.shell("uiautomator dump /sdcard/x.xml")
    assert out == "ERROR: could not get idle state."
    phone.glitch_dumps("empty", count=2)
    assert device.dump_hierarchy().endswith('<hierarchy rotation="0" />')
    assert device.dump_hierarchy().endswith('<hierarchy rotation="0" />')
    assert len(ET.fromstring(device.dump_hierarchy())) == 1  # back to normal


async def test_stopping_the_server_ends_a_running_command_and_leaves_no_task(
    phones: list[VirtualPhone],
) -> None:
    """A command still running when the server stops (here the uiautomator agent that the real
    uiautomator2 client starts and leaves running) is ended and waited for: its worker left
    pending on a loop about to close was destroyed later by the collector, in another test, as
    "Task was destroyed but it is pending"."""
    server = VirtualAdbServer(phones)
    port = await server.start()
    try:
        size = await asyncio.to_thread(lambda: U2Driver("virt-1", port=port).screen_size())
        assert size == (1080, 2400)
    finally:
        await server.stop()
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert left == []


def test_phones_sharing_a_serial_are_each_reached_by_transport_id_only() -> None:
    """Cheap phones ship with one serial: adb lists each, refuses the serial as ambiguous
    ("more than one device", its acquire_one_transport) and reaches each by transport id.
    (Through `adb_transport`: adbutils' own calls leave a refused socket open.)"""
    serial = "0123456789ABCDEF"
    first, second = VirtualPhone(serial), VirtualPhone(serial)
    second.state.settings["dark_theme"] = True
    with ThreadedAdbServer([first, second]) as server:
        client = adb_transport.Client("127.0.0.1", server.port)
        listed = client.list(extended=True)
        assert [d.serial for d in listed] == [serial, serial]
        tids = [d.transport_id for d in listed]
        assert tids == [server.server.transport_id(first), server.server.transport_id(second)]
        with pytest.raises(adbutils.AdbError, match="more than one device"):
            adb_transport.run(client, serial, "shell:echo hi")
        with pytest.raises(adbutils.AdbError, match="more than one device"):
            adb_transport.state(client, serial)
        answers = [
            adb_transport.run(client, serial, "shell:cmd uimode night", transport_id=tid)
            for tid in tids
        ]
        assert answers == [b"Night mode: no\n", b"Night mode: yes\n"]
        assert adb_transport.state(client, serial, transport_id=tids[1]) == "device"
        second.unplug()
        assert adb_transport.run(client, serial, "shell:echo hi") == b"hi\n"


def test_a_phone_added_under_a_listed_serial_takes_its_place() -> None:
    """Swapping the phone behind a serial (the flow benchmark gives each task a fresh phone)
    replaced it; once the server kept phones that share a serial, the new one was listed beside
    the old, the serial became ambiguous and the benchmark's tasks for it were never placed.
    A phone added under a listed serial takes its place; sharing one is asked for."""
    serial = "virtual-1"
    old, new = VirtualPhone(serial), VirtualPhone(serial)
    new.state.settings["dark_theme"] = True
    with ThreadedAdbServer([old]) as server:
        client = adb_transport.Client("127.0.0.1", server.port)
        server.server.add_phone(new)
        assert [d.serial for d in client.list(extended=True)] == [serial]
        assert adb_transport.run(client, serial, "shell:cmd uimode night") == b"Night mode: yes\n"
        server.server.add_phone(VirtualPhone(serial), share_serial=True)
        assert [d.serial for d in client.list(extended=True)] == [serial, serial]


def test_a_connection_through_a_forward_ends_when_the_adb_server_stops() -> None:
    """A stopping adb server ends the connections its forwards carry, as a killed adb server
    does. Ours closed each forward's listener only (asyncio's `Server.close()` leaves accepted
    connections open before Python 3.12.1), so a connection to the phone's agent outlived the
    server's loop: the client never heard the end, and the collector later reported the socket
    unclosed (a ResourceWarning) at the setup of some other test on that worker."""
    phone = VirtualPhone("fwd-1")
    phone.tcp_services[DEFAULT_PORT] = U2Agent(phone)  # the agent, as uiautomator2 starts it
    server = ThreadedAdbServer([phone])
    server.start()
    try:
        device = adbutils.AdbClient("127.0.0.1", server.port, socket_timeout=20).device(
            phone.serial
        )
        port = device.forward_port(DEFAULT_PORT)
        agent = socket.create_connection(("127.0.0.1", port), timeout=20)
        agent.sendall(b"GET /ping HTTP/1.1\r\n")  # a request the agent is still reading
        # Round trips through the server's loop, which accepts the connection meanwhile.
        assert [f.local for f in device.forward_list()] == [f"tcp:{port}"]
        assert [f.local for f in device.forward_list()] == [f"tcp:{port}"]
    finally:
        server.stop()
    with agent:
        assert agent.recv(100) == b""


DUMP_WITH_PID = "shell:echo $$; exec uiautomator dump --windows /dev/tty"


def test_a_late_exec_head_leaves_the_program_running_and_comes_first(
    device: adbutils.AdbDevice, phone: VirtualPhone
) -> None:
    """`delay_exec_heads`: the pid `echo $$` printed has not reached the client while the
    dumper it `exec`ed already runs; a client that hangs up meanwhile gets none of it and the
    dumper runs on (the Node host's abandoned look, tests/node). When it comes, it comes
    before the dump."""
    phone.hang_dumps(60)
    phone.delay_exec_heads(60)
    conn = device.open_transport()
    conn.send_command(DUMP_WITH_PID)
    conn.check_okay()
    for _ in range(1000):
        if phone.dumper is not None:
            break
        threading.Event().wait(0.01)
    dumper = phone.dumper
    assert dumper is not None
    conn.conn.setblocking(False)
    with pytest.raises(BlockingIOError):
        conn.conn.recv(64)  # the pid is still on its way
    conn.close()
    assert phone.dumper is dumper  # the hang-up did not end it
    assert device.shell(f"kill {dumper.pid}") == ""
    for _ in range(1000):
        if phone.dumper is None:
            break
        threading.Event().wait(0.01)
    assert phone.dumper is None

    phone.delay_exec_heads(0.2)
    conn = device.open_transport()
    conn.send_command(DUMP_WITH_PID)
    conn.check_okay()
    out = conn.read_until_close()
    conn.close()
    pid, _, dump = out.partition("\n")
    assert pid.isdigit(), out
    assert dump.startswith("<?xml") and dump.rstrip().endswith("dumped to: /dev/tty"), out


@pytest.mark.parametrize("state", ["unauthorized", "offline", "authorizing", "connecting"])
def test_a_phone_that_never_connected_is_listed_without_product_model_or_device(
    state: str,
) -> None:
    """adb's append_transport prints `product:`, `model:` and `device:` only when the phone
    sent them (its CNXN banner); a phone adb has no authorized connection with sent none, so
    `adb devices -l` shows its serial, state, USB port and transport id alone. The virtual
    server tagged such phones with their model, which a real adb server never does."""
    phone = VirtualPhone("virt-1")
    phone.usb_port = "1-1.2"
    phone.set_adb_state(state)  # type: ignore[arg-type]
    with ThreadedAdbServer([phone]) as server:
        client = adbutils.AdbClient(host="127.0.0.1", port=server.port)
        (listed,) = client.list(extended=True)
        tid = server.server.transport_id(phone)
        assert (listed.serial, listed.state) == ("virt-1", state)
        assert listed.tags == {"usb": "1-1.2", "transport_id": str(tid)}
        phone.set_adb_state("device")
        (listed,) = client.list(extended=True)
        assert listed.tags["model"] == phone.model.replace(" ", "_")
