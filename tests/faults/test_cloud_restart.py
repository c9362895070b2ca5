"""The cloud process SIGKILLed mid-run and started again on the same SQLite database.

Proves: every host reconnects by itself (backoff, re-announcing what it holds), every task still
finishes, and no result the cloud had accepted before the crash is lost or changed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from tests.support.figures import record
from tests.support.processes import (
    TERMINAL,
    cloud_process,
    free_port,
    get_task,
    host_process,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)

GOALS = [
    "Turn on dark theme",
    "Turn off Wi-Fi",
    "Turn on airplane mode",
    "Turn on Do Not Disturb",
    "Enable battery saver",
    "Turn off Bluetooth",
    "Turn off location",
    "Turn on dark theme",
]


async def test_cloud_restart_loses_no_accepted_result(tmp_path: Path, fault_pki: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    db = f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}"

    def new_cloud(name: str):  # type: ignore[no-untyped-def]
        return cloud_process(tmp_path, name, database_url=db, pki_dir=fault_pki, port=port)

    cloud = new_cloud("cloud-1").start()
    hosts = [
        host_process(
            tmp_path, h, cloud_address=address, pki_dir=fault_pki, phones=2, settle_delay_s=0.3
        )
        for h in ("a", "b")
    ]
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        for h in hosts:
            h.start()
        await wait_connected(ops, {"a", "b"})
        ids = [
            (await ops.tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(goal=g))).task.task_id
            for g in GOALS
        ]
        # Mid-run: some results accepted, others still running.
        deadline = time.monotonic() + 60
        while True:
            tasks = [await get_task(ops, t) for t in ids]
            done = [t for t in tasks if t.status == types_pb2.TASK_STATUS_SUCCEEDED]
            running = [t for t in tasks if t.status == types_pb2.TASK_STATUS_RUNNING]
            if len(done) >= 2 and running:
                break
            assert time.monotonic() < deadline, tasks
            await asyncio.sleep(0.05)
        await ops.close()
        ops = None
        cloud.kill()
        killed_at = time.monotonic()
        accepted = {t.task_id: (t.attempt, t.result_summary, t.host_id) for t in done}

        cloud = new_cloud("cloud-2").start()
        await wait_serving(address, fault_pki)
        record("cloud_restart", "restarted cloud serving", time.monotonic() - killed_at)
        ops = operator(address, fault_pki)
        await wait_connected(ops, {"a", "b"})
        record("cloud_restart", "SIGKILL to both hosts reconnected", time.monotonic() - killed_at)
        final = [
            await wait_task(ops, t, lambda x: x.status in TERMINAL, what="terminal") for t in ids
        ]
        record("cloud_restart", "SIGKILL to every task finished", time.monotonic() - killed_at)
        # "Finished" means a host reported a result. The offline planner may give up on a phone
        # an interrupted attempt left half-way through a page; that is the planner's verdict on
        # the phone, not a lost lease, so it counts as finished, but never a lease running out.
        for t in final:
            reasons = [a.failure_reason.lower() for a in t.attempts]
            assert t.status != types_pb2.TASK_STATUS_CANCELLED, t
            if t.status == types_pb2.TASK_STATUS_FAILED:
                assert "expired" not in t.result_summary.lower(), (t.goal, reasons)
        record(
            "cloud_restart",
            "tasks succeeded",
            sum(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in final),
            f"of {len(final)}",
        )
        for t in final:
            if t.task_id in accepted:
                assert (t.attempt, t.result_summary, t.host_id) == accepted[t.task_id]
            # Exactly one result recorded: one attempt carries the task's final status.
            reported = [a for a in t.attempts if "lease expired" not in a.failure_reason]
            assert [a.attempt for a in reported] == [t.attempt], t
            assert reported[0].status == t.status
        record(
            "cloud_restart",
            "tasks needing a second attempt",
            sum(t.attempt > 1 for t in final),
            "tasks",
        )
    finally:
        if ops is not None:
            await ops.close()
        for h in hosts:
            h.stop()
        cloud.stop()
