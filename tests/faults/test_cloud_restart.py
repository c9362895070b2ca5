"""The cloud process SIGKILLed mid-run and started again on the same SQLite database.

Proves: every host reconnects by itself (backoff, re-announcing what it holds), every task still
finishes, and no result the cloud had accepted before the crash is lost or changed.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.figures import record
from tests.support.processes import (
    AmcProcess,
    cloud_process,
    free_port,
    host_process,
    operator,
    wait_connected,
    wait_serving,
)
from tests.support.task_batch import (
    accepted,
    check_finished_once,
    mid_run,
    submit,
    wait_finished,
    wait_tasks,
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

    def new_cloud(name: str) -> AmcProcess:
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
        ids = await submit(ops, GOALS)
        before = accepted(await wait_tasks(ops, ids, mid_run))
        await ops.close()
        ops = None
        cloud.kill()
        killed_at = time.monotonic()

        cloud = new_cloud("cloud-2").start()
        await wait_serving(address, fault_pki)
        record("cloud_restart", "restarted cloud serving", time.monotonic() - killed_at)
        ops = operator(address, fault_pki)
        await wait_connected(ops, {"a", "b"})
        record("cloud_restart", "SIGKILL to both hosts reconnected", time.monotonic() - killed_at)
        final = await wait_finished(ops, ids)
        record("cloud_restart", "SIGKILL to every task finished", time.monotonic() - killed_at)
        check_finished_once("cloud_restart", final, before)
        for t in final:  # and the one attempt that reported carries the task's final status
            reported = [a for a in t.attempts if "lease expired" not in a.failure_reason]
            assert reported[0].status == t.status
    finally:
        if ops is not None:
            await ops.close()
        for h in hosts:
            h.stop()
        cloud.stop()
