"""A half-open connection: the link between host and cloud goes silent without closing.

A loopback TCP proxy sits between them and, mid-task, stops forwarding in both directions while
keeping both sockets open (a dead NAT entry, a pulled cable behind a switch). TCP alone would not
notice for many minutes. With short gRPC keepalive settings on both ends this proves that both
sides drop the dead connection within the keepalive bound, the host reconnects on its own, and the
task it held is resumed under its live lease (same attempt) and finishes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from amc.v1 import task_service_pb2, types_pb2
from tests.support.figures import record
from tests.support.processes import (
    cloud_process,
    free_port,
    host_process,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.tcp_proxy import TcpProxy

KEEPALIVE_TIME_S = 1.0
KEEPALIVE_TIMEOUT_S = 2.0
#: keepalive time + timeout is the bound; the rest is scheduling slack on a busy machine.
NOTICE_BOUND_S = KEEPALIVE_TIME_S + KEEPALIVE_TIMEOUT_S + 5.0


async def _wait_for(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {within}s")
        await asyncio.sleep(0.05)


async def test_half_open_connection_is_noticed_and_host_reconnects(
    tmp_path: Path, fault_pki: Path
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    cloud = cloud_process(
        tmp_path,
        "cloud",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        pki_dir=fault_pki,
        port=port,
        extra={
            "AMC_CLOUD_KEEPALIVE_TIME_SECONDS": str(KEEPALIVE_TIME_S),
            "AMC_CLOUD_KEEPALIVE_TIMEOUT_SECONDS": str(KEEPALIVE_TIMEOUT_S),
            "AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS": "0.5",
        },
    )
    proxy = TcpProxy([("127.0.0.1", port)]).start()
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

        await _wait_for(
            lambda: all(link.client_gone_at is not None for link in frozen),
            NOTICE_BOUND_S,
            "host dropping the dead connection",
        )
        host_noticed = max(link.client_gone_at or 0 for link in frozen) - cut_at
        await _wait_for(
            lambda: all(link.server_gone_at is not None for link in frozen),
            NOTICE_BOUND_S,
            "cloud dropping the dead connection",
        )
        cloud_noticed = max(link.server_gone_at or 0 for link in frozen) - cut_at
        record("half_open", "host noticed the silent link", host_noticed)
        record("half_open", "cloud noticed the silent link", cloud_noticed)
        assert host_noticed <= NOTICE_BOUND_S
        assert cloud_noticed <= NOTICE_BOUND_S

        await _wait_for(
            lambda: bool(proxy.links_since(cut_at)), 30, "host opening a new connection"
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
