"""A phone that leaves adb while the Node example host's attempt waits for its planner
(`AMC_HOST_PHONE_LOST_GRACE_S`), as the Python host ends it (tests/host/test_phone_lost.py).

Real parts: host.js as its own process against the in-test LeaseService of
tests/host/lease_fake.py over mTLS, a planner that never answers step 2, and a virtual phone
served over the adb protocol, unplugged while step 2 waits (or its adb server stopped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from amc.v1 import types_pb2
from host.devices.adb_errors import no_adb_server_reason
from host.devices.virtual.phone import VirtualPhone
from host.lease_client import adb_down_summary, phone_lost_summary
from tests.host.lease_fake import FakeCloud
from tests.node.rig import assigned_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_lease_pause import _Planner
from tests.support.waiting import until

__all__ = ["node"]

SERIAL = "emulator-5554"


async def test_a_phone_gone_past_the_grace_ends_its_waiting_attempt_phone_lost(
    node: str, tmp_path: Path
) -> None:
    """Unplugged while step 2 waits for a decision that never comes, and not back: once the
    grace (0.5 s) has passed, host.js ends the attempt FAILED, retryable, with the Python
    host's "phone lost" words. Before, no result came: the lease was renewed for as long as
    the planner kept the step waiting."""
    phone = VirtualPhone(SERIAL)
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    planner = _Planner()
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        [phone],
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S="0.1",
        AMC_HOST_PHONE_LOST_GRACE_S="0.5",
    ) as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        phone.unplug()
        await cloud.wait_for(lambda: cloud.results, 30)
    result = cloud.results[0]
    assert result.status == types_pb2.TASK_STATUS_FAILED, host.said
    assert result.retryable, host.said
    assert result.summary == phone_lost_summary(SERIAL, 0.5), host.said


async def test_an_adb_server_down_past_the_grace_ends_the_attempt_saying_so(
    node: str, tmp_path: Path
) -> None:
    """The adb server stops (killed, its link cut) while step 2 waits: every phone goes out
    of sight at once. Past the grace the attempt ends retryable saying the adb server did not
    answer, the host says so once (not as N phones lost), and the phone's OFFLINE reason names
    the server, as the Python host does. Before, the result read "phone lost" and nothing named
    the server."""
    phone = VirtualPhone(SERIAL)
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    planner = _Planner()
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        [phone],
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S="0.1",
        AMC_HOST_PHONE_LOST_GRACE_S="0.5",
    ) as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        server = f"the adb server at 127.0.0.1:{host.adb.port} does not answer"
        await host.adb.stop()
        await cloud.wait_for(lambda: cloud.results, 30)
        await cloud.wait_for(lambda: cloud.last_devices() and cloud.last_devices()[0].reason, 10)
        devices = cloud.last_devices()
    result = cloud.results[0]
    assert result.status == types_pb2.TASK_STATUS_FAILED, host.said
    assert result.retryable, host.said
    assert result.summary.startswith(
        f"adb server unreachable: {SERIAL} was out of sight for 0.5 s: "
    ), host.said
    assert server in result.summary, result.summary
    assert host.said.count(f"{server}:") == 1, host.said
    assert [(d.state, d.reason.startswith(server)) for d in devices] == [
        (types_pb2.DEVICE_STATE_OFFLINE, True)
    ], devices


async def test_a_phone_that_keeps_dropping_ends_its_attempt_at_its_fourth_drop(
    node: str, tmp_path: Path
) -> None:
    """A failing cable: the phone leaves adb and is back within the grace (30 s) again and
    again while step 2 waits. Three drops are waited out; the fourth ends the attempt at once,
    retryable, saying the phone is unsteady, as the Python host ends it (decision 0087). Before,
    every drop within the grace was forgiven and the attempt kept its task for good."""
    phone = VirtualPhone(SERIAL)
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    planner = _Planner()
    left = f"phone {SERIAL} left adb while an attempt runs on it"
    back = f"phone {SERIAL} is back in adb within the grace"
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        [phone],
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S="0.1",
        AMC_HOST_PHONE_LOST_GRACE_S="30",
    ) as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)

        def said(words: str, times: int) -> Callable[[], bool]:
            return lambda: host.text().count(words) == times

        for drop in range(1, 4):  # MAX_PHONE_DROPS
            phone.unplug()
            await until(said(left, drop), 20, f"drop {drop} seen")
            phone.replug()
            await until(said(back, drop), 20, f"return {drop} seen")
        assert not cloud.results, host.text()  # each drop waited out
        phone.unplug()
        await cloud.wait_for(lambda: cloud.results, 15)
    result = cloud.results[0]
    assert result.status == types_pb2.TASK_STATUS_FAILED, host.said
    assert result.retryable, host.said
    assert result.summary == (
        f"phone unsteady: {SERIAL} left adb 4 times during this attempt (the host waits out 3); "
        "check its cable, hub or Wi-Fi link"
    ), host.said


async def test_an_adb_server_down_names_how_to_start_the_server_on_its_port(
    node: str, tmp_path: Path
) -> None:
    """The adb server (on a port of its own, as the rig's and any second server's is) stops
    while step 2 waits: the phone's OFFLINE reason and the attempt's summary are the Python
    host's, word for word, whose start hint names the port (`adb -P PORT start-server`), as
    docs/deployment.md says of both hosts: plain `adb start-server` starts a server on 5037
    only, not the one the host asks."""
    phone = VirtualPhone(SERIAL)
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    planner = _Planner()
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        [phone],
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S="0.1",
        AMC_HOST_PHONE_LOST_GRACE_S="0.5",
    ) as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        port = host.adb.port
        await host.adb.stop()
        await cloud.wait_for(lambda: cloud.results, 30)
        await cloud.wait_for(lambda: cloud.last_devices() and cloud.last_devices()[0].reason, 10)
        devices = cloud.last_devices()
    assert port != 5037
    reason = no_adb_server_reason("127.0.0.1", port)
    assert f"`adb -P {port} start-server`" in reason
    assert [d.reason for d in devices] == [reason], devices
    assert cloud.results[0].summary == adb_down_summary(SERIAL, 0.5, reason), host.said
    assert f"start it with `adb -P {port} start-server`, or mend the link to it" in host.said


async def test_an_adb_server_that_goes_down_and_up_again_is_no_drop_of_the_phone(
    node: str, tmp_path: Path
) -> None:
    """The adb server (not the phone's cable) stops and answers again, four times, each
    within the grace, while step 2 waits: every phone leaves at once each time, which is no
    drop of the phone's, as the Python host counts it (host/lease_client.py, `_phone_seen`:
    `server_down`). The attempt goes on; "phone unsteady" would send the operator to a sound
    cable."""
    phone = VirtualPhone(SERIAL)
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    planner = _Planner()
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        [phone],
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S="0.1",
        AMC_HOST_PHONE_LOST_GRACE_S="30",
    ) as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        port = host.adb.port
        down = f"the adb server at 127.0.0.1:{port} does not answer:"
        up = f"the adb server at 127.0.0.1:{port} answers again"
        back = f"phone {SERIAL} is back in adb within the grace"

        def said(words: str, times: int) -> Callable[[], bool]:
            return lambda: host.text().count(words) == times or bool(cloud.results)

        for outage in range(1, 5):
            await host.adb.stop()
            await until(said(down, outage), 20, f"outage {outage}")
            await host.adb.start(port=port)
            await until(said(back, outage), 20, f"back {outage}")
            assert not cloud.results, (cloud.results, host.text())
            assert host.text().count(up) == outage
        await asyncio.sleep(1)
        assert not cloud.results, (cloud.results, host.text())


async def test_an_adb_server_that_lists_nothing_past_the_grace_ends_the_attempt_saying_so(
    node: str, tmp_path: Path
) -> None:
    """The adb server still accepts connections but hangs up on every device list (wedged, or
    the near end of a tunnel whose far server is down) while step 2 waits. Once its lists
    have failed three times in a row the Python host takes it as not answering
    (host/devices/registry.py, `refresh`: `down = not answered`): the phone's OFFLINE reason
    names the server and the attempt ends "adb server unreachable", not "phone lost", which
    sends the operator to a sound cable."""
    phone = VirtualPhone(SERIAL)
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    planner = _Planner()
    async with assigned_host(
        node,
        tmp_path,
        HOST_ID,
        cloud,
        planner,
        [phone],
        AMC_TASKS="1",
        AMC_HOST_DEVICE_POLL_INTERVAL_S="0.1",
        AMC_HOST_PHONE_LOST_GRACE_S="0.5",
    ) as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        port = host.adb.port
        host.adb.fail_device_lists(100_000)
        await cloud.wait_for(lambda: cloud.results, 30)
    reason = no_adb_server_reason("127.0.0.1", port)
    assert cloud.results[0].summary == adb_down_summary(SERIAL, 0.5, reason), host.said
