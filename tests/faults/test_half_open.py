"""A half-open connection: the link between host and cloud goes silent without closing.

A loopback TCP proxy sits between them and, mid-task, stops forwarding in both directions while
keeping both sockets open (a dead NAT entry, a pulled cable behind a switch). TCP alone would not
notice for many minutes. With short gRPC keepalive settings on both ends this proves that both
sides drop the dead connection within the keepalive bound, the host reconnects on its own, and the
task it held is resumed under its live lease (same attempt) and finishes.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from amc.v1 import task_service_pb2, types_pb2
from host.agent.lease_pause import PAUSED_SUMMARY
from tests.support.figures import record
from tests.support.processes import (
    Fleet,
    host_process,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import until

KEEPALIVE_TIME_S = 1.0
KEEPALIVE_TIMEOUT_S = 2.0
#: keepalive time + timeout is the bound; the rest is scheduling slack on a busy machine (5 s
#: was once not enough for the host near the end of a CI run beside another worker's processes;
#: TCP alone would take many minutes, so the bound still tells keepalive from no keepalive).
NOTICE_BOUND_S = KEEPALIVE_TIME_S + KEEPALIVE_TIMEOUT_S + 10.0


async def test_half_open_connection_is_noticed_and_host_reconnects(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(
        tmp_path,
        fault_pki,
        cloud_env={
            "AMC_CLOUD_KEEPALIVE_TIME_SECONDS": str(KEEPALIVE_TIME_S),
            "AMC_CLOUD_KEEPALIVE_TIMEOUT_SECONDS": str(KEEPALIVE_TIMEOUT_S),
            "AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS": "0.5",
        },
    )
    address = fleet.address
    cloud = fleet.cloud()
    proxy = TcpProxy([("127.0.0.1", fleet.port)]).start()
    host = host_process(
        tmp_path,
        "a",
        cloud_address=proxy.address,
        pki_dir=fault_pki,
        settle_delay_s=0.7,
        extra={
            "AMC_HOST_KEEPALIVE_TIME_S": str(KEEPALIVE_TIME_S),
            "AMC_HOST_KEEPALIVE_TIMEOUT_S": str(KEEPALIVE_TIMEOUT_S),
        },
    )
    ops = None
    try:
        cloud.start()
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)  # the operator talks to the cloud directly
        host.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn off Bluetooth", lease_duration=Duration(seconds=15)
            )
        )
        task_id = submitted.task.task_id
        await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_RUNNING and t.progress.step_index >= 1,
            what="running",
        )
        frozen = proxy.blackhole()
        assert frozen, "no open connection to freeze"
        cut_at = time.monotonic()

        await until(
            lambda: all(link.client_gone_at is not None for link in frozen),
            within=NOTICE_BOUND_S,
            what="host dropping the dead connection",
        )
        host_noticed = max(link.client_gone_at or 0 for link in frozen) - cut_at
        await until(
            lambda: all(link.server_gone_at is not None for link in frozen),
            within=NOTICE_BOUND_S,
            what="cloud dropping the dead connection",
        )
        cloud_noticed = max(link.server_gone_at or 0 for link in frozen) - cut_at
        record("half_open", "host noticed the silent link", host_noticed)
        record("half_open", "cloud noticed the silent link", cloud_noticed)
        assert host_noticed <= NOTICE_BOUND_S
        assert cloud_noticed <= NOTICE_BOUND_S

        await until(
            lambda: bool(proxy.links_since(cut_at)), within=30, what="host opening a new connection"
        )
        await wait_connected(ops, {"a"})
        record("half_open", "silence to host reconnected", time.monotonic() - cut_at)
        done = await wait_task(
            ops, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED, what="succeeded"
        )
        assert done.attempt == 1  # resumed under its live lease, not run again
        assert [a.attempt for a in done.attempts] == [1]
    finally:
        if ops is not None:
            await ops.close()
        host.stop()
        cloud.stop()
        proxy.stop()


def _read(workdir: Path, host_id: str, query: str, *args: object) -> tuple[object, ...] | None:
    """One row of the host's own timeline, None before it holds one (or its tables)."""
    conn = sqlite3.connect(workdir / f"host-{host_id}" / "task_progress.sqlite3")
    try:
        row: tuple[object, ...] | None = conn.execute(query, args).fetchone()
        return row
    except sqlite3.OperationalError:  # not created yet
        return None
    finally:
        conn.close()


def _progress(workdir: Path, host_id: str, task_id: str, attempt: int) -> str:
    """The attempt's latest progress line in the host's own timeline ("" before any)."""
    query = "SELECT progress_summary FROM tasks WHERE task_id = ? AND attempt = ?"
    row = _read(workdir, host_id, query, task_id, attempt)
    return "" if row is None else str(row[0])


def _steps(workdir: Path, host_id: str, task_id: str, attempt: int) -> int:
    """How many steps of the attempt the host's own timeline records."""
    query = "SELECT count(*) FROM steps WHERE task_id = ? AND attempt = ?"
    row = _read(workdir, host_id, query, task_id, attempt)
    return 0 if row is None else int(str(row[0]))


def _attempt_row(workdir: Path, host_id: str, task_id: str, attempt: int) -> tuple[str, str] | None:
    """(status, summary) of an attempt in the host's own timeline, if it holds it yet."""
    conn = sqlite3.connect(workdir / f"host-{host_id}" / "task_progress.sqlite3")
    try:
        row = conn.execute(
            "SELECT status, summary FROM tasks WHERE task_id = ? AND attempt = ?",
            (task_id, attempt),
        ).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return None
    finally:
        conn.close()
    return None if row is None else (str(row[0]), str(row[1]))


async def test_a_host_whose_renewals_go_unanswered_pauses_and_stops_when_refused(
    tmp_path: Path, fault_pki: Path
) -> None:
    """The link goes silent for longer than the lease and the host's keepalive takes longer
    than that to notice (its defaults: 10 s + 10 s; here 300 s + 300 s against a 4 s lease,
    beyond any test's length however loaded the machine). The link goes silent as soon as the
    task is under way on host a, and host b starts only then: the cloud's lease runs out and it
    hands the task to host b. Host a, which plans itself (direct transport), must do nothing
    more on its phone once its lease runs out by its own clock, though its stream still looks
    open: it pauses the attempt (a cloud that was down would give the lease a new term). When
    the dead link is finally dropped, host a reconnects, its hello names the attempt, the
    cloud refuses it, and the attempt stops, no step taken since the pause. Before the lease
    was watched by the host's clock, it stopped only once its stream was gone (the keepalive)
    and 2 s more: it kept tapping its phone while b ran the same task on another, both at once.
    """
    fleet = Fleet(tmp_path, fault_pki)
    address = fleet.address
    cloud = fleet.cloud()
    proxy = TcpProxy([("127.0.0.1", fleet.port)]).start()
    slow_keepalive = {"AMC_HOST_KEEPALIVE_TIME_S": "300", "AMC_HOST_KEEPALIVE_TIMEOUT_S": "300"}
    a = host_process(
        tmp_path,
        "a",
        cloud_address=proxy.address,
        pki_dir=fault_pki,
        settle_delay_s=1.0,
        transport="direct",
        extra=slow_keepalive,
    )
    b = fleet.host("b", transport="direct")
    ops = None
    try:
        cloud.start()
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        a.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Create a contact named Ann Lee with phone 555-0100",
                lease_duration=Duration(seconds=4),
                max_attempts=3,
            )
        )
        task_id = submitted.task.task_id
        await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_RUNNING and t.progress.step_index >= 1,
            what="running on a",
        )
        # Frozen at once, and host b started only then: started before, its start-up (long on
        # a loaded machine) let host a finish the task inside its lease.
        frozen = proxy.blackhole()
        assert frozen, "no open connection to freeze"
        b.start()
        await wait_connected(ops, {"a", "b"})

        await wait_task(
            ops,
            task_id,
            lambda t: t.attempt == 2 and t.host_id == "b",
            what="attempt 2 handed to b",
        )
        await until(
            lambda: _progress(tmp_path, "a", task_id, 1).endswith(PAUSED_SUMMARY),
            60,
            "host a pausing attempt 1",
        )
        # Paused by its lease, not by noticing the dead link (which it has not yet).
        assert all(link.client_gone_at is None for link in frozen)
        assert (_attempt_row(tmp_path, "a", task_id, 1) or ("",))[0] == "running"
        steps = _steps(tmp_path, "a", task_id, 1)
        proxy.cut(frozen)  # the link dropped at last: host a connects again, and is refused
        await until(
            lambda: (_attempt_row(tmp_path, "a", task_id, 1) or ("running",))[0] != "running",
            60,
            "host a stopping attempt 1",
        )
        assert _attempt_row(tmp_path, "a", task_id, 1) == (
            "cancelled",
            "stopped: the lease was revoked",
        )
        assert _steps(tmp_path, "a", task_id, 1) == steps  # nothing done since the pause
        # Stopped, host a exits by itself (a send left on the dead link once held it for its
        # 30 s deadline, and it was SIGKILLed after AmcProcess.stop's 15 s).
        assert a.stop() == 0, a.output()[-2000:]
    finally:
        if ops is not None:
            await ops.close()
        proxy.stop()
        a.stop()
        b.stop()
        cloud.stop()
