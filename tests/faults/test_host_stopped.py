"""A host process stopped with SIGTERM mid-task hands its task back at once.

Proves, with real `amc cloud serve` and `amc host run` processes on virtual phones: the stopped
attempt ends with the host's own retryable result ("stopped: the host stopped"), not by its
lease, and the task's next attempt runs on another connected host before that lease would have
run out. And with the cloud down while the host stops: the result is kept in the host's outbox
and delivered by its next start.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from datetime import timedelta
from pathlib import Path

from amc.v1 import types_pb2
from host.devices.adb_driver import DUMP_COMMAND
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.devices.virtual.phone import VirtualPhone
from tests.support.processes import (
    AmcProcess,
    Fleet,
    dark_theme_running,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)

STOPPED = "stopped: the host stopped"
#: Far longer than the test waits: a task that comes back only by its lease fails the test.
LEASE_S = 300
LONG_LEASE = {"AMC_CLOUD_DEFAULT_LEASE_SECONDS": str(LEASE_S)}


async def test_a_stopped_host_hands_its_task_to_another_host_at_once(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki, cloud_env=LONG_LEASE)
    address = fleet.address
    cloud = fleet.cloud().start()
    # Slow steps on host a: the task is still under way once host b is up.
    host_a = fleet.host("a", settle_delay_s=6.0)
    host_b = fleet.host("b")
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        host_a.start()
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")  # 3 more 6 s steps to go
        host_b.start()
        await wait_connected(ops, {"a", "b"})
        still = await wait_task(ops, task_id, lambda t: True)
        assert (still.status, still.host_id) == (types_pb2.TASK_STATUS_RUNNING, "a"), still
        assert host_a.stop() == 0, host_a.output()
        done = await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED,
            what="succeeded on host b",
        )
        first, second = done.attempts
        assert (first.host_id, first.status, first.failure_reason) == (
            "a",
            types_pb2.TASK_STATUS_FAILED,
            STOPPED,
        )
        assert (second.host_id, second.status) == ("b", types_pb2.TASK_STATUS_SUCCEEDED)
        # Handed back by the host, not swept: the next attempt began inside the first's lease
        # (its last renewal granted it LEASE_S more).
        lease_end = first.last_renewed_at.ToDatetime() + timedelta(seconds=LEASE_S)
        assert second.started_at.ToDatetime() < lease_end
        assert "handing 1 attempt(s) back to the cloud" in host_a.output()
    finally:
        if ops is not None:
            await ops.close()
        host_a.kill()
        host_b.stop()
        cloud.stop()


async def test_a_host_stopped_while_the_cloud_is_down_delivers_its_result_at_next_start(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki, cloud_env=LONG_LEASE)
    address = fleet.address

    def start_host(settle_delay_s: float) -> AmcProcess:
        return fleet.host("a", settle_delay_s=settle_delay_s).start()

    cloud = fleet.cloud().start()
    a: AmcProcess | None = None
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        a = start_host(6.0)  # slow steps: the task is still under way when it stops
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")  # 3 more 6 s steps to go
        cloud.kill()
        assert a.stop() == 0, a.output()
        outbox = sqlite3.connect(tmp_path / "host-a" / "outbox.sqlite3")
        try:
            kept = outbox.execute("SELECT task_id, attempt FROM results").fetchall()
        finally:
            outbox.close()
        assert kept == [(task_id, 1)]
        cloud = fleet.cloud().start()
        # The next start only delivers the kept result and runs attempt 2: its pace is not
        # what is tested (at 6 s a step it took ~20 s of the test).
        a = start_host(0.05)
        done = await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED,
            what="succeeded after the restarts",
        )
        first, second = done.attempts
        assert (first.host_id, first.status, first.failure_reason) == (
            "a",
            types_pb2.TASK_STATUS_FAILED,
            STOPPED,
        )
        assert second.status == types_pb2.TASK_STATUS_SUCCEEDED
    finally:
        if ops is not None:
            await ops.close()
        if a is not None:
            a.kill()
        cloud.stop()


async def test_a_second_sigterm_stops_a_host_waiting_for_the_cloud_at_once(
    tmp_path: Path, fault_pki: Path
) -> None:
    """The cloud is frozen (SIGSTOP: the stream stays open, nothing is answered) while host a
    stops: it waits for the answer to its result up to its grace, 10 minutes here; a second
    SIGTERM ends the wait, and the result stays on disk for the next start."""
    fleet = Fleet(tmp_path, fault_pki, cloud_env=LONG_LEASE)
    address = fleet.address
    cloud = fleet.cloud().start()
    patient = {
        "AMC_HOST_STOP_GRACE_S": "600",
        # The frozen cloud's stream is not given up on while the host waits.
        "AMC_HOST_KEEPALIVE_TIME_S": "600",
        "AMC_HOST_KEEPALIVE_TIMEOUT_S": "600",
    }
    a = fleet.host("a", settle_delay_s=6.0, extra=patient)
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        a.start()
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")  # 3 more 6 s steps to go
        assert cloud.proc is not None
        cloud.proc.send_signal(signal.SIGSTOP)
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        while "for the cloud to answer 1 result(s)" not in a.output():
            assert a.alive(), a.output()
            await asyncio.sleep(0.1)
        a.proc.send_signal(signal.SIGTERM)
        assert a.proc.wait(60) == 0, a.output()
        assert "stopping with 1 result(s) the cloud has not answered" in a.output()
        outbox = sqlite3.connect(tmp_path / "host-a" / "outbox.sqlite3")
        try:
            kept = outbox.execute("SELECT task_id, attempt FROM results").fetchall()
        finally:
            outbox.close()
        assert kept == [(task_id, 1)]
    finally:
        if cloud.proc is not None and cloud.alive():
            cloud.proc.send_signal(signal.SIGCONT)
        if ops is not None:
            await ops.close()
        a.kill()
        cloud.stop()


async def test_a_host_stopped_while_its_phone_sits_on_a_look_exits_at_once(
    tmp_path: Path, fault_pki: Path
) -> None:
    """The phone (behind the test's own adb server) sits on every `uiautomator dump`, with the
    host's dump timeout raised past the test (a slow phone's setting): SIGTERM mid-look. The
    host hands the attempt back and exits (status 0). Before, the look the stop abandoned went
    on in the phone's worker thread, and the process's exit waited for that thread (Python
    joins executor threads at exit) as long as the call could take: SIGKILLed."""
    phone = VirtualPhone("emulator-5554")
    adb = ThreadedAdbServer([phone])
    port = adb.start()
    phone.stall_service(f"shell:{DUMP_COMMAND}", 600.0, count=1000)
    fleet = Fleet(tmp_path, fault_pki, cloud_env=LONG_LEASE)
    cloud = fleet.cloud().start()
    wedged = {
        "AMC_HOST_DEVICE_SOURCE": "adb",
        "AMC_HOST_ADB_PORT": str(port),
        "AMC_HOST_DUMP_TIMEOUT_S": "600",
        "AMC_HOST_HIERARCHY_DEADLINE_S": "1200",
    }
    host = fleet.host("a", extra=wedged)
    ops = None
    try:
        await wait_serving(fleet.address, fault_pki)
        ops = operator(fleet.address, fault_pki)
        host.start()
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")  # its first look sits on the phone
        assert host.stop() == 0, host.output()
        ended = await wait_task(ops, task_id, lambda t: t.status == types_pb2.TASK_STATUS_QUEUED)
        assert ended.attempts[0].failure_reason == STOPPED, ended.attempts[0]
    finally:
        if ops is not None:
            await ops.close()
        host.kill()
        cloud.stop()
        await asyncio.to_thread(adb.stop)
