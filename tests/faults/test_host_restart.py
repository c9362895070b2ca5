"""A host restarted after a SIGKILL, and a second process started with a host's certificate.

Both as real `amc` processes, with leases of a minute, so that nothing here can be explained by a
lease running out:

- Restart: host a is SIGKILLed mid-task and started again on the same data folder. Its new
  process's hello holds nothing, so the cloud releases the dead process's lease at once: the
  task runs again as attempt 2 on the restarted host within seconds, and attempt 1 reads
  "released: a new process of the host connected". The host's own timeline marks the attempt
  the dead process left "running" as interrupted. Stopped with SIGTERM instead, the same: the
  stop is not a result the next process delivers.
- Takeover: while host a runs a task, a second `amc host run` with a's certificate starts. The
  older process is told it was superseded and exits by itself (status 0, with a line saying
  why) instead of reconnecting; the newer one is never pushed out (no "lease stream lost" in
  its log) and finishes the task the older one was running (attempt 2): no assignment is lost.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from amc.v1 import task_service_pb2, types_pb2
from tests.support.figures import record
from tests.support.processes import (
    TERMINAL,
    Fleet,
    dark_theme_running,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.waiting import until

LEASE_S = "60"
RELEASED = "released: a new process of the host connected"


def _timeline_status(tmp_path: Path, name: str, task_id: str, attempt: int) -> str | None:
    db = tmp_path / name / "task_progress.sqlite3"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute(
            "SELECT status FROM tasks WHERE task_id=? AND attempt=?", (task_id, attempt)
        ).fetchone()
    return None if row is None else str(row[0])


async def test_a_restarted_host_gets_its_work_back_at_once(tmp_path: Path, fault_pki: Path) -> None:
    fleet = Fleet(tmp_path, fault_pki, cloud_env={"AMC_CLOUD_DEFAULT_LEASE_SECONDS": LEASE_S})
    address, cloud = fleet.address, fleet.cloud().start()
    first = fleet.host("a", settle_delay_s=2.0)
    again = fleet.host("a")  # attempt 2 at the usual pace: nothing to catch it in
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        first.start()
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")
        first.kill()
        killed_at = time.monotonic()
        again.start()
        second = await wait_task(
            ops, task_id, lambda t: t.attempt == 2, within=30, what="attempt 2 assigned"
        )
        record(
            "host_restarted",
            "SIGKILL + restart to attempt 2 assigned",
            time.monotonic() - killed_at,
        )
        assert second.host_id == "a"
        done = await wait_task(
            ops,
            task_id,
            lambda t: t.status in (types_pb2.TASK_STATUS_SUCCEEDED, types_pb2.TASK_STATUS_FAILED),
            what="finished",
        )
        assert done.status == types_pb2.TASK_STATUS_SUCCEEDED, done
        one, two = done.attempts
        assert one.failure_reason == RELEASED, one
        assert two.host_id == "a" and two.attempt == 2
        assert _timeline_status(tmp_path, "host-a", task_id, 1) == "interrupted"
        assert "marked 1 attempt(s) interrupted" in again.output()
    finally:
        if ops is not None:
            await ops.close()
        first.kill()
        again.stop()
        cloud.stop()


async def test_a_host_stopped_mid_task_runs_the_task_again_when_it_starts(
    tmp_path: Path, fault_pki: Path
) -> None:
    """SIGTERM (a deploy): the stopping host stops its task and hands it back (a retryable
    result, not CANCELLED, which would end the task): the next process runs it again."""
    fleet = Fleet(tmp_path, fault_pki, cloud_env={"AMC_CLOUD_DEFAULT_LEASE_SECONDS": LEASE_S})
    address, cloud = fleet.address, fleet.cloud().start()
    first = fleet.host("a", settle_delay_s=2.0)
    again = fleet.host("a")  # attempt 2 at the usual pace: nothing to catch it in
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        first.start()
        await wait_connected(ops, {"a"})
        task_id = await dark_theme_running(ops, "a")
        assert first.stop() == 0
        assert _timeline_status(tmp_path, "host-a", task_id, 1) == "cancelled"
        again.start()
        done = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, what="finished")
        assert done.status == types_pb2.TASK_STATUS_SUCCEEDED, done
        assert [a.attempt for a in done.attempts] == [1, 2]
        assert done.attempts[0].failure_reason == "stopped: the host stopped", done.attempts[0]
    finally:
        if ops is not None:
            await ops.close()
        first.kill()
        again.stop()
        cloud.stop()


async def test_a_second_process_with_the_same_certificate_takes_over_without_a_fight(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki, cloud_env={"AMC_CLOUD_DEFAULT_LEASE_SECONDS": LEASE_S})
    address, cloud = fleet.address, fleet.cloud().start()
    # The older process's steps are slow (its four take half a minute and more): the newer one
    # connects while it still runs the task. With 2 s steps, a loaded machine took longer to
    # start the newer process (13 s) than the older one took to finish the task, which then
    # had no attempt 2 to hand over.
    older = fleet.host("a", name="a-older", settle_delay_s=8.0)
    newer = fleet.host("a", name="a-newer")
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        older.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=3)
        )
        task_id = submitted.task.task_id
        await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_RUNNING and t.progress.step_index >= 1,
            what="running on the older process",
        )
        newer.start()
        started = time.monotonic()
        await until(lambda: not older.alive(), within=60, what="the older process exits")
        record(
            "host_takeover", "newer process start to older process gone", time.monotonic() - started
        )
        assert older.proc is not None and older.proc.returncode == 0
        assert "superseded by a newer process of host a" in older.output()
        assert "does not reconnect" in older.output()
        done = await wait_task(
            ops,
            task_id,
            lambda t: t.status in (types_pb2.TASK_STATUS_SUCCEEDED, types_pb2.TASK_STATUS_FAILED),
            what="finished",
        )
        assert [a.attempt for a in done.attempts] == [1, 2]
        assert done.attempts[0].failure_reason == RELEASED
        assert done.attempts[1].status == types_pb2.TASK_STATUS_SUCCEEDED, done.attempts[1]
        # The newer process was never pushed out: one stream, no reconnects.
        assert newer.alive()
        assert "lease stream lost" not in newer.output()
    finally:
        if ops is not None:
            await ops.close()
        older.kill()
        newer.stop()
        cloud.stop()
