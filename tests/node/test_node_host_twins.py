"""The Node example host never taps a phone's twin after the adb server restarts.

Cheap phones share one serial, so host.js reaches each by adb's transport id. `adb
kill-server` and a new server number the transports afresh, in the order it finds the phones:
a transport id read before the restart may name the twin after it. Real parts: `amc cloud
serve` (SQLite, mTLS, offline planner), two virtual phones with one serial on the virtual adb
server, and host.js as its own process. Compared with the Python host (host/devices/
adb_restarts.py, tests/host/test_adb_restart.py).
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from amc.v1 import fleet_service_pb2, types_pb2
from host.devices.registry import RENUMBERED_REASON
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import Rig, cloud_and_phone, start_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_phones import _first_attempt, _phones, _task_and_quick_host
from tests.node.test_node_host_stop import _said
from tests.support.waiting import until

__all__ = ["node"]

#: What the Python host says, once, of an adb server that refuses to be watched
#: (host/devices/adb_restarts.py, `ServerWatch._track`).
REFUSED_WATCH = (
    "refused host:track-devices: the host cannot see it restart, so it lists no phones while "
    "unwatched (phones sharing a serial would be told apart by transport ids a new server may "
    "have handed to their twin)"
)


async def _restarted_after_first_tap(
    node: str, rig: Rig, tmp_path: Path, a: VirtualPhone, b: VirtualPhone
) -> tuple[
    VirtualPhone, VirtualPhone, str, types_pb2.Task, dict[str, types_pb2.DeviceState.ValueType]
]:
    """Runs host.js's one task on twins `a` and `b`, the adb server restarted right after the
    task's first tap (the new server numbering the two the other way round): the phone tapped,
    its twin, what the host said, the task and the phones as the cloud then knows them."""
    restarted: list[VirtualPhone] = []

    def restart_after_tap(phone: VirtualPhone) -> None:
        # Runs on the virtual server's shell thread, right after the phone's first tap.
        if not restarted:
            restarted.append(phone)
            rig.adb.restart()  # the two swap transport ids

    for phone in (a, b):
        phone.interrupt_after(1, functools.partial(restart_after_tap, phone))
    task_id, host = await _task_and_quick_host(node, rig, tmp_path, max_attempts=2)

    async def restart_seen() -> None:
        await until(lambda: bool(restarted), 60, "the first tap and the adb restart")

    said, final, phones = await _first_attempt(rig, host, task_id, restart_seen)
    tapped = restarted[0]
    return tapped, b if tapped is a else a, said, final, phones


async def test_no_tap_reaches_a_same_serial_twin_after_the_adb_server_restarts(
    node: str, tmp_path: Path
) -> None:
    """The adb server restarts right after the first tap of a task on one of two phones that
    share a serial, and the new server numbers the two the other way round. host.js kept
    switching to the transport id it had read before: the rest of the task looked at and
    tapped the twin. As the Python host does, a transport id of an adb server run that ended is
    never used: the step fails, the attempt ends retryable, and the phone's old id is OFFLINE
    saying why (its twins are listed again under new ids)."""
    a, b = VirtualPhone("R58M"), VirtualPhone("R58M")
    # On two screens, so whichever phone the task runs on, its twin's screen asks for a tap
    # toward the goal too: a step that looked at the twin tapped it.
    b.launch("com.android.settings")
    async with cloud_and_phone(tmp_path, a, HOST_ID, more=[b]) as rig:
        tapped, twin, said, final, phones = await _restarted_after_first_tap(
            node, rig, tmp_path, a, b
        )
        hosts = (await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
        reasons = {d.serial: d.reason for h in hosts if h.host_id == HOST_ID for d in h.devices}
    assert len(tapped.taps) == 1, said
    assert twin.taps == [], said  # before: the twin took every tap after the restart
    assert final.attempts[0].status == types_pb2.TASK_STATUS_FAILED, said
    assert final.status == types_pb2.TASK_STATUS_QUEUED, said  # retryable
    old = final.attempts[0].device_serial
    assert phones[old] == types_pb2.DEVICE_STATE_OFFLINE, (phones, said)
    assert "adb server restarted" in final.attempts[0].failure_reason, said
    assert reasons[old] == RENUMBERED_REASON, (reasons, said)
    # The twins are listed again, under ids of the new adb server run.
    assert sum(state == types_pb2.DEVICE_STATE_ONLINE for state in phones.values()) == 2, phones


async def test_twins_on_named_usb_ports_keep_their_ids_and_no_tap_reaches_the_other(
    node: str, tmp_path: Path
) -> None:
    """The same restart, with adb naming each twin's USB port (Linux, macOS). host.js kept the
    ids it had given by transport id, so after the restart each id (and its device) named the
    other phone. A USB port names the phone across adb runs: the two keep their
    `serial@usb:<port>` ids, both ONLINE, and the attempt's next step fails retryable instead
    of reaching the twin through the old transport id."""
    a, b = VirtualPhone("R58M"), VirtualPhone("R58M")
    a.usb_port, b.usb_port = "1-1", "1-2"
    b.launch("com.android.settings")
    async with cloud_and_phone(tmp_path, a, HOST_ID, more=[b]) as rig:
        tapped, twin, said, final, phones = await _restarted_after_first_tap(
            node, rig, tmp_path, a, b
        )
    assert len(tapped.taps) == 1, said
    assert twin.taps == [], said
    assert final.attempts[0].status == types_pb2.TASK_STATUS_FAILED, said
    assert final.status == types_pb2.TASK_STATUS_QUEUED, said  # retryable
    assert "adb server restarted" in final.attempts[0].failure_reason, said
    online = types_pb2.DEVICE_STATE_ONLINE
    assert phones == {"R58M@usb:1-1": online, "R58M@usb:1-2": online}, said


async def test_no_phone_is_listed_while_the_adb_server_refuses_to_be_watched(
    node: str, tmp_path: Path
) -> None:
    """An adb server that refuses `host:track-devices` from the start (one too busy to watch,
    a proxy in front of adb that serves no such request). host.js listed its phones all the
    same: a restart of that server then went unseen, and a tap for one twin could reach the
    other through a transport id the new server had renumbered. As the Python host does
    (`ServerWatch`), it lists no phone until it can watch the server, saying why once, in the
    Python host's words; watched at last, it lists them."""
    phone = VirtualPhone("emulator-5554")
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        rig.adb.refuse_tracking(1_000_000)
        host = await start_host(
            node,
            rig,
            HOST_ID,
            tmp_path / "host-data",
            tasks=None,
            AMC_HOST_DEVICE_POLL_INTERVAL_S="0.2",
        )
        said: list[str] = []
        try:

            async def connected() -> bool:
                hosts = (
                    await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
                ).hosts
                return any(h.host_id == HOST_ID and h.connected for h in hosts)

            await until(connected, 60, "the host's hello")
            hello = await _phones(rig)  # the hello follows the host's first poll
            assert hello == {}  # before: the phone, listed by an unwatched server
            await asyncio.wait_for(_said(host, REFUSED_WATCH, said), 60)
            lists = rig.adb.lists_answered
            with rig.adb._lock:  # the server takes being watched from now on
                rig.adb._refusing_tracks = 0

            async def listed() -> bool:
                return await _phones(rig) == {phone.serial: types_pb2.DEVICE_STATE_ONLINE}

            await until(listed, 60, "the phone listed once watched")
        finally:
            host.kill()
            _, err = await host.communicate()
            said.append(err.decode())
    log = "".join(said)
    assert lists == 0, log  # no list was asked for while unwatched
    assert log.count("refused host:track-devices") == 1, log
    assert f"the adb server at 127.0.0.1:{rig.adb_port} {REFUSED_WATCH}" in log, log
