"""The adb server stops while phones are driven: what the attempt and the registry say.
Real adbutils (and uiautomator2's client) against the virtual adb server."""

from __future__ import annotations

import pytest

from amc.v1 import types_pb2
from host.devices.base import DeviceGone
from host.devices.registry import DeviceRegistry
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.runner import driver_factory
from host.settings import HostSettings

SERIAL = "virt-down-1"


def test_a_phone_a_driver_found_gone_as_the_server_stopped_carries_the_server_reason() -> None:
    """The adb server stops under a step: the driver's call fails first and the runner marks
    the phone OFFLINE (`mark_offline`) before the next poll. That poll finds no server, yet
    the phone kept no reason: the cloud heard it "offline" with nothing naming the server,
    while its idle neighbours named it."""
    mine, idle = VirtualPhone(SERIAL), VirtualPhone("virt-down-2")
    server = ThreadedAdbServer([mine, idle])
    server.start()
    try:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        assert registry.get(SERIAL) is not None and registry.get(SERIAL).online  # type: ignore[union-attr]
    finally:
        server.stop()
    registry.mark_offline(SERIAL)  # as the runner does after the step's DeviceGone
    registry.refresh()
    said = f"the adb server at 127.0.0.1:{server.port} does not answer"
    for serial in (SERIAL, "virt-down-2"):
        info = registry.get(serial)
        assert info is not None and info.state == types_pb2.DEVICE_STATE_OFFLINE
        assert info.adb_down, serial
        assert info.to_proto().reason.startswith(said), (serial, info)


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_step_that_meets_no_adb_server_names_the_server(driver: str) -> None:
    """A step's call when no adb server answers: the attempt's summary is the DeviceGone's
    words only when it carries a state (`AgentLoop.run`: else "phone X disconnected"), so
    the result sent the operator to the phone's cable and named no server: the symptom the
    adb-server-unreachable outcome was to end. It must carry a state, name the server, and
    not say "disconnected"."""
    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone])
    server.start()
    made = driver_factory(HostSettings(adb_port=server.port, driver=driver))(SERIAL)
    try:
        made.screen_size()
    finally:
        server.stop()
    try:
        with pytest.raises(DeviceGone) as raised:
            made.tap(5, 5)
        said = str(raised.value)
        assert raised.value.state, said
        assert "disconnected" not in said, said
        assert "adb server" in said and "start-server" in said, said
    finally:
        if isinstance(made, U2Driver):
            made._reset()


def test_an_adb_server_behind_a_tunnel_whose_far_end_is_down_is_named_too() -> None:
    """A remote adb server reached through an SSH tunnel (`ssh -L 5037:…`, the case the
    reason's "mend the link to it" is for): with the server down, the tunnel's near end still
    accepts each connection and closes it at once, so `server_reachable` said yes, every list
    failed, and after `offline_after_failed_polls` the phones went OFFLINE with no reason, the
    outage was never logged as the server's, and attempts ended "phone lost"."""
    import socket
    import threading

    phone = VirtualPhone(SERIAL)
    server = ThreadedAdbServer([phone])
    port = server.start()
    registry = DeviceRegistry(port=port, offline_after_failed_polls=2, timeout_s=2.0)
    try:
        registry.refresh()
        assert registry.get(SERIAL) is not None and registry.get(SERIAL).online  # type: ignore[union-attr]
    finally:
        server.stop()
    tunnel = socket.socket()
    tunnel.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tunnel.bind(("127.0.0.1", port))
    tunnel.listen(16)
    stop = threading.Event()

    def accept_and_close() -> None:  # ssh's near end: the far connect was refused
        tunnel.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = tunnel.accept()
            except OSError:
                continue
            conn.close()

    near = threading.Thread(target=accept_and_close, daemon=True)
    near.start()
    try:
        for _ in range(3):
            registry.refresh()
        info = registry.get(SERIAL)
        assert info is not None and info.state == types_pb2.DEVICE_STATE_OFFLINE
        said = f"the adb server at 127.0.0.1:{port} does not answer"
        assert info.adb_down and info.to_proto().reason.startswith(said), info
    finally:
        stop.set()
        near.join(5)
        tunnel.close()


def test_the_server_reason_says_how_to_start_the_server_at_its_own_port() -> None:
    """`adb start-server` starts a server on 5037 (or ANDROID_ADB_SERVER_PORT), so for a
    host set to another port (`AMC_HOST_ADB_PORT`) the hint started a server the host never
    asks (checked with Debian's adb 29: `adb -P 5099 kill-server`, then `adb start-server`
    left 5099 closed). The command must name the port, and a remote server's host."""
    from host.devices.registry import no_adb_server_reason

    assert "`adb start-server`" in no_adb_server_reason("127.0.0.1", 5037)
    assert "`adb -P 5099 start-server`" in no_adb_server_reason("127.0.0.1", 5099)
    assert "on 10.0.0.7" in no_adb_server_reason("10.0.0.7", 5037)
