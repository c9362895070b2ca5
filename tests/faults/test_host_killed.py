"""A host process killed with SIGKILL mid-task: the lease runs out, another host finishes the task.

Proves: no goodbye is needed for the cloud to take work back; the task's second attempt runs on
another host; exactly one result is recorded (attempt 1 ended by expiry, attempt 2 succeeded).
"""

from __future__ import annotations

import time
from pathlib import Path

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


async def test_sigkilled_host_task_is_reassigned_and_finishes_once(
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
    ).start()
    # Slow steps on host a (a wide "mid-task" to kill it in), quick ones on host b.
    host_a = host_process(
        tmp_path, "a", cloud_address=address, pki_dir=fault_pki, settle_delay_s=3.0
    )
    host_b = host_process(tmp_path, "b", cloud_address=address, pki_dir=fault_pki)
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        host_a.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=3)
        )
        task_id = submitted.task.task_id
        await wait_task(
            ops,
            task_id,
            lambda t: (
                t.status == types_pb2.TASK_STATUS_RUNNING
                and t.host_id == "a"
                and t.progress.step_index >= 2
            ),
            what="running on host a at step 2",
        )
        # Host b is up and idle before a dies, so what is measured is the lease, not a start-up.
        host_b.start()
        await wait_connected(ops, {"a", "b"})
        still = await wait_task(ops, task_id, lambda t: True)
        assert still.status == types_pb2.TASK_STATUS_RUNNING, "finished before the kill"
        assert still.host_id == "a"
        host_a.kill()
        killed_at = time.monotonic()
        reassigned = await wait_task(
            ops, task_id, lambda t: t.attempt == 2, what="attempt 2 assigned"
        )
        record("host_killed", "SIGKILL to attempt 2 assigned", time.monotonic() - killed_at)
        assert reassigned.host_id == "b"
        done = await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED,
            what="succeeded",
        )
        record("host_killed", "SIGKILL to task succeeded", time.monotonic() - killed_at)
        assert [a.attempt for a in done.attempts] == [1, 2]
        first, second = done.attempts
        assert first.host_id == "a"
        assert first.status != types_pb2.TASK_STATUS_SUCCEEDED
        assert "expired" in first.failure_reason.lower(), first
        assert second.host_id == "b"
        assert second.status == types_pb2.TASK_STATUS_SUCCEEDED
        assert sum(a.status == types_pb2.TASK_STATUS_SUCCEEDED for a in done.attempts) == 1
        assert done.host_id == "b"
        assert done.attempt == 2
    finally:
        if ops is not None:
            await ops.close()
        host_a.kill()
        host_b.stop()
        cloud.stop()
