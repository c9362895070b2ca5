"""Phones sharing a serial across an adb server restart: `adb kill-server` and a new server number
the transports afresh, so the id a driver holds may name the other phone now. The host sends
nothing through an id of a server run that ended (`host.devices.adb_restarts`), and the device
poll lists such phones under new ids, the old ones OFFLINE with the reason.

Real adbutils against the virtual adb server, whose `restart` cuts every connection (as the old
server's process ending does) and hands the ids out in another order.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from amc.v1 import types_pb2
from host.devices import adb_restarts
from host.devices.adb_restarts import RENUMBERED
from host.devices.base import DeviceGone, Driver
from host.devices.registry import RENUMBERED_REASON, RENUMBERED_USB_REASON, DeviceRegistry
from host.devices.u2_driver import U2Driver
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.runner import driver_factory
from host.settings import HostSettings

#: The serial cheap phones ship with, all of them the same.
CLONE = "0123456789ABCDEF"


@pytest.mark.parametrize("driver", ["adbutils", "uiautomator2"])
def test_a_tap_meant_for_one_clone_never_lands_on_the_other_after_adb_restarts(
    driver: str,
) -> None:
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    made: list[Driver] = []
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port)
        make = driver_factory(HostSettings(adb_port=server.port, driver=driver), registry)

        def driver_for(serial: str) -> Driver:
            made.append(make(serial))
            return made[-1]

        try:
            _tap_around_a_restart(server, registry, driver_for, a, b)
        finally:
            for each in made:
                if isinstance(each, U2Driver):
                    each._reset()  # its server's streams and uiautomator2 Device


def _tap_around_a_restart(
    server: ThreadedAdbServer,
    registry: DeviceRegistry,
    driver_for: Callable[[str], Driver],
    a: VirtualPhone,
    b: VirtualPhone,
) -> None:
    registry.refresh()
    a_tid, b_tid = server.server.transport_id(a), server.server.transport_id(b)
    a_id = f"{CLONE}@t{a_tid}"
    assert {d.serial for d in registry.devices()} == {a_id, f"{CLONE}@t{b_tid}"}
    on_a = driver_for(a_id)
    on_a.tap(10, 20)
    assert (a.taps, b.taps) == ([(10, 20)], [])

    server.restart()  # a new server finds b first: b is a's old transport id now
    assert server.server.transport_id(b) == a_tid

    with pytest.raises(DeviceGone) as raised:
        on_a.tap(30, 40)
    assert raised.value.state == RENUMBERED
    assert "adb server restarted" in str(raised.value)
    assert (a.taps, b.taps) == ([(10, 20)], [])  # before: b took the tap meant for a

    # The runner reports the phone as the driver found it; the next poll lists the phones
    # under new ids, and the old ones stay OFFLINE with the reason.
    registry.mark_offline(a_id, RENUMBERED)
    registry.refresh()
    old = registry.get(a_id)
    assert old is not None
    assert old.to_proto().state == types_pb2.DEVICE_STATE_OFFLINE
    assert old.to_proto().reason == RENUMBERED_REASON
    online = {d.serial for d in registry.devices() if d.online}
    assert online == {f"{CLONE}@r1t{server.server.transport_id(p)}" for p in (a, b)}
    driver_for(f"{CLONE}@r1t{a_tid}").tap(50, 60)  # b's new id: a's old transport id
    assert (a.taps, b.taps) == ([(10, 20)], [(50, 60)])


def test_the_poll_after_an_adb_restart_says_why_the_old_ids_went_offline() -> None:
    """No driver had noticed the restart: the poll itself sees the server's new run."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        before = {d.serial for d in registry.devices()}
        server.restart()
        changes = registry.refresh()
        gone = {i.serial: i for i, kind in changes if kind == "offline"}
        assert set(gone) == before
        assert {i.adb_reason for i in gone.values()} == {RENUMBERED_REASON}
        assert {i.serial for i, kind in changes if kind == "online"}.isdisjoint(before)


def test_a_phone_with_its_own_serial_keeps_its_id_across_an_adb_restart() -> None:
    phone = VirtualPhone("own-serial-1")
    with ThreadedAdbServer([phone]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        server.restart()
        assert registry.refresh() == []
        assert [(d.serial, d.online) for d in registry.devices()] == [("own-serial-1", True)]
        driver_factory(HostSettings(adb_port=server.port), registry)(phone.serial).tap(1, 2)
        assert phone.taps == [(1, 2)]


def test_clones_on_named_usb_ports_are_found_again_under_their_ids_after_adb_restarts() -> None:
    """Where adb names each phone's USB port (Linux), the port tells the clones apart: after
    the restart each keeps its id, and a driver made for it then (the next attempt's) reaches
    the phone the id named before, under its new transport id. One made before still sends
    nothing: the id it holds is of the run that ended."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    a.usb_port, b.usb_port = "1-1", "1-2"
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port)
        make = driver_factory(HostSettings(adb_port=server.port), registry)
        registry.refresh()
        a_id, b_id = f"{CLONE}@usb:1-1", f"{CLONE}@usb:1-2"
        assert {d.serial for d in registry.devices()} == {a_id, b_id}
        before = make(a_id)
        server.restart()  # b takes a's old transport id
        registry.refresh()
        assert {d.serial for d in registry.devices() if d.online} == {a_id, b_id}
        found = registry.get(a_id)
        assert found is not None and found.transport_id == server.server.transport_id(a)
        with pytest.raises(DeviceGone):
            before.tap(1, 1)
        make(a_id).tap(2, 2)
        assert (a.taps, b.taps) == ([(2, 2)], [])


def _tap_after_restart_lands_nowhere(
    server: ThreadedAdbServer, registry: DeviceRegistry, a: VirtualPhone, b: VirtualPhone
) -> None:
    """The poll's ids are the live server's; a driver made for phone a before a restart
    that gives b a's id sends nothing."""
    a_id = f"{CLONE}@t{server.server.transport_id(a)}"
    found = registry.get(a_id)
    assert found is not None and found.online
    on_a = driver_factory(HostSettings(adb_port=server.port), registry)(a_id)
    server.restart()  # b takes a's old transport id
    with pytest.raises(DeviceGone):
        on_a.tap(7, 7)
    assert (a.taps, b.taps) == ([], [])


def test_ids_listed_while_the_server_refused_to_be_watched_are_not_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server refused `host:track-devices` while the poll listed its phones: a restart
    then would go unseen, so the poll takes no ids from that list (before: it labelled them
    with the run before, the next watch made counted no new run, and after a restart a tap
    for phone a landed on its twin b). It says why once."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    with ThreadedAdbServer([a, b]) as server:
        server.server.refuse_tracking(4)  # both looks of two polls
        registry = DeviceRegistry(port=server.port)
        assert registry.refresh() == []
        assert registry.refresh() == []
        assert registry.devices() == []
        refused = [r for r in caplog.records if "refused host:track-devices" in r.getMessage()]
        assert len(refused) == 1 and refused[0].levelname == "WARNING"
        registry.refresh()  # watched now
        _tap_after_restart_lands_nowhere(server, registry, a, b)


def test_a_watch_connection_made_after_a_time_unwatched_counts_a_new_run() -> None:
    """The watch lost its connection (a drop, a connect that timed out) and a server answers
    again: whether it is the same one is unknown, so ids read before are not trusted."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        a_id = f"{CLONE}@t{server.server.transport_id(a)}"
        on_a = driver_factory(HostSettings(adb_port=server.port), registry)(a_id)
        adb_restarts.watch("127.0.0.1", server.port).close()  # as if never connected
        server.server.refuse_tracking(1)  # the first look after finds the server unwatched
        server.restart()  # b takes a's old transport id
        with pytest.raises(DeviceGone):
            on_a.tap(7, 7)
        with pytest.raises(DeviceGone):
            on_a.tap(7, 7)  # watched again: still the run before's id
        assert (a.taps, b.taps) == ([], [])


@pytest.mark.parametrize("restart_first", [False, True])
def test_a_clone_keeps_its_id_across_an_adb_list_outage(restart_first: bool) -> None:
    """The same adb server, its lists failing for a poll (no restart): every phone keeps its
    id when they come back, also after an earlier restart (before: the OFFLINE entry dropped
    the run its id was read in, and the phone came back under a new id)."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port, offline_after_failed_polls=1)
        b.unplug()
        registry.refresh()
        if restart_first:
            server.restart()  # a new adb server finds a alone
            registry.refresh()
        b.replug()
        registry.refresh()
        before = {d.serial for d in registry.devices() if d.online}
        assert len(before) == 2
        server.fail_device_lists(1)
        registry.refresh()
        assert not [d for d in registry.devices() if d.online]
        registry.refresh()
        assert {d.serial for d in registry.devices() if d.online} == before


def test_a_clone_on_a_usb_port_a_driver_found_renumbered_is_told_it_keeps_its_id() -> None:
    """A driver's `Renumbered` for a phone whose id names its USB port: the reason is not the
    one for phones adb names no port of (it said "adb named no USB port")."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    a.usb_port, b.usb_port = "1-1", "1-2"
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        a_id = f"{CLONE}@usb:1-1"
        server.restart()
        registry.refresh()
        assert registry.mark_offline(a_id, RENUMBERED)
        found = registry.get(a_id)
        assert found is not None
        assert found.adb_reason == RENUMBERED_USB_REASON != RENUMBERED_REASON
        registry.refresh()
        found = registry.get(a_id)
        assert found is not None and found.online and found.adb_reason == ""


@pytest.mark.parametrize("usb", [True, False])
def test_a_clone_unplugged_before_an_adb_restart_is_not_said_to_be_renumbered(usb: bool) -> None:
    """A phone already missing from the lists when the adb server restarted was not
    renumbered by it, and one on a named USB port keeps its id: it stays OFFLINE with no
    reason (before: both were given the reason that its id may be its twin's now)."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    if usb:
        a.usb_port, b.usb_port = "1-1", "1-2"
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        b_id = f"{CLONE}@usb:1-2" if usb else f"{CLONE}@t{server.server.transport_id(b)}"
        b.unplug()
        registry.refresh()
        gone = registry.get(b_id)
        assert gone is not None and not gone.online and gone.adb_reason == ""
        server.restart()
        registry.refresh()
        gone = registry.get(b_id)
        assert gone is not None and not gone.online and gone.adb_reason == ""


def test_closing_the_registry_closes_its_adb_watch_connection() -> None:
    """`close()` left the `host:track-devices` connection open on the adb server until the
    watch was garbage-collected."""
    phone = VirtualPhone("own-serial-1")
    with ThreadedAdbServer([phone]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        assert _eventually(lambda: server.server.open_connections() == 1)  # the watch
        registry.close()
        assert _eventually(lambda: server.server.open_connections() == 0)


def _eventually(condition: Callable[[], bool], limit_s: float = 10.0) -> bool:
    """Whether `condition` holds within `limit_s` (the server's loop closes its end of a
    connection on its own thread)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_clone_adb_may_not_open_is_named_by_its_usb_port_too() -> None:
    """adb names a phone's USB port in every state (append_transport prints the devpath
    whatever the state): a twin first listed "no permissions" (no udev rule for it yet) gets
    its port id at once, the one it keeps across adb restarts (the virtual server named no
    port in that state, and the twin was `@t<id>` for good)."""
    a, b = VirtualPhone(CLONE), VirtualPhone(CLONE)
    a.usb_port, b.usb_port = "1-1", "1-2"
    b.set_adb_state("no permissions")
    with ThreadedAdbServer([a, b]) as server:
        registry = DeviceRegistry(port=server.port)
        registry.refresh()
        assert {d.serial for d in registry.devices()} == {f"{CLONE}@usb:1-1", f"{CLONE}@usb:1-2"}
        b.set_adb_state("device")
        server.restart()
        registry.refresh()
        assert {d.serial for d in registry.devices() if d.online} == {
            f"{CLONE}@usb:1-1",
            f"{CLONE}@usb:1-2",
        }


def test_the_idle_watch_connection_is_probed_so_a_silently_dropped_one_is_noticed() -> None:
    """A remote adb server's watch connection sits idle while no phone changes; a NAT or
    firewall that forgot it drops it without a word, and the server's restart then reached no
    one. TCP keepalive probes it (the drop itself needs a real NAT: the options the kernel
    probes with are what is checked here, on a real connection to the virtual server)."""
    with ThreadedAdbServer([VirtualPhone("virt-1")]) as server:
        watch = adb_restarts.watch("127.0.0.1", server.port)
        assert watch.watched_run() is not None
        sock = watch._box[0]
        assert sock is not None
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux: probed after seconds, not two hours
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) <= 60
            probes = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
            interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
            assert probes * interval <= 60
        watch.close()
