"""A batch of tasks carried through a fault, and the check that the fault lost or doubled none.

The fault tests that run load (cloud restart, PostgreSQL restart, replica killed) share these
steps: submit, wait until mid-run, note what was accepted, fault, wait, check each finished once.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from amc.v1 import task_service_pb2, types_pb2
from cloud.store import states
from console.client import OperatorClient
from host.lease_client import UNREACHABLE_SUMMARY
from tests.support.figures import record
from tests.support.processes import TERMINAL, get_task, wait_task

#: Goals the offline planner completes on a virtual phone, enough to keep three hosts busy.
GOALS = [
    "Turn on dark theme",
    "Turn off Wi-Fi",
    "Turn on airplane mode",
    "Turn on Do Not Disturb",
    "Turn off Bluetooth",
    "Turn off location",
] * 2

Accepted = dict[str, tuple[int, str, str]]
"""task id → (attempt, result summary, host) of a result the cloud had accepted."""


async def submit(ops: OperatorClient, goals: Iterable[str], **fields: Any) -> list[str]:
    """Submit one task a goal (`fields` go into every request); their ids in order."""
    return [
        (
            await ops.tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(goal=g, **fields))
        ).task.task_id
        for g in goals
    ]


def mid_run(tasks: list[types_pb2.Task]) -> bool:
    """Some results accepted and others still running: a fault now hits both kinds."""
    succeeded = sum(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in tasks)
    return succeeded >= 2 and any(t.status == types_pb2.TASK_STATUS_RUNNING for t in tasks)


async def wait_tasks(
    ops: OperatorClient,
    task_ids: list[str],
    predicate: Callable[[list[types_pb2.Task]], bool],
    within: float = 60.0,
) -> list[types_pb2.Task]:
    """Poll the whole batch until `predicate` holds for it, to time a fault against its state."""
    deadline = time.monotonic() + within
    while True:
        tasks = [await get_task(ops, t) for t in task_ids]
        if predicate(tasks):
            return tasks
        assert time.monotonic() < deadline, tasks
        await asyncio.sleep(0.05)


def accepted(tasks: list[types_pb2.Task]) -> Accepted:
    """The results the cloud has accepted so far, to compare with the final ones after a fault."""
    return {
        t.task_id: (t.attempt, t.result_summary, t.host_id)
        for t in tasks
        if t.status == types_pb2.TASK_STATUS_SUCCEEDED
    }


async def wait_finished(
    ops: OperatorClient, task_ids: list[str], within: float = 60.0
) -> list[types_pb2.Task]:
    """Every task in a final state (a restarting cloud's UNAVAILABLE is waited out)."""
    return [
        await wait_task(ops, t, lambda x: x.status in TERMINAL, within=within, what="terminal")
        for t in task_ids
    ]


def check_finished_once(test: str, final: list[types_pb2.Task], before: Accepted) -> int:
    """Assert the fault lost and doubled nothing; record the outcome; the count of retried tasks.

    "Finished" means a host reported a result. The offline planner may give up on a phone an
    interrupted attempt left half-way through a page; that is its verdict on the phone, not a
    lost lease, so it counts, but a lease running out (by the cloud's clock, or by the host's
    while the cloud was unreachable: an outage longer than the lease on a loaded machine), or
    released when a killed host's new process connected, never does. Exactly one attempt
    reports.
    """
    for t in final:
        if t.task_id in before:
            assert (t.attempt, t.result_summary, t.host_id) == before[t.task_id]
        assert t.status != types_pb2.TASK_STATUS_CANCELLED, t
        if t.status == types_pb2.TASK_STATUS_FAILED:
            assert "expired" not in t.result_summary.lower(), t
        # An attempt no host reported: its lease ran out, or a restarted host's new process
        # released what the dead one held.
        reported = [
            a
            for a in t.attempts
            if "lease expired" not in a.failure_reason
            and a.failure_reason not in (*states.RELEASED, UNREACHABLE_SUMMARY)
        ]
        assert [a.attempt for a in reported] == [t.attempt], t
    succeeded = sum(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in final)
    record(test, "tasks succeeded", succeeded, f"of {len(final)}")
    retried = sum(t.attempt > 1 for t in final)
    record(test, "tasks needing a second attempt", retried, "tasks")
    return retried


@dataclass(frozen=True, slots=True)
class Run:
    """One attempt as a host's own timeline recorded it: the ground truth of what ran on a phone."""

    task_id: str
    attempt: int
    host_id: str
    #: The host's word for how it ended ("succeeded", "failed", "cancelled", "running", …).
    status: str
    started: datetime
    #: Its last moment: when it finished, else its last step or update.
    ended: datetime

    def finished_before(self, other: Run) -> bool:
        """This run of the same task reached the task's end (succeeded or failed) before `other`
        began: `other` repeated work a host had finished."""
        return (
            self is not other
            and self.task_id == other.task_id
            and self.status in ("succeeded", "failed")
            and self.ended <= other.started
        )


def host_runs(workdir: Path, host_ids: Iterable[str]) -> list[Run]:
    """Every attempt the timelines of these hosts (`host_process` data dirs) hold."""
    runs: list[Run] = []
    for host_id in host_ids:
        conn = sqlite3.connect(workdir / f"host-{host_id}" / "task_progress.sqlite3")
        try:
            rows = conn.execute(
                "SELECT t.task_id, t.attempt, t.status, t.created_at,"
                " MAX(COALESCE(t.finished_at, t.updated_at), COALESCE(MAX(s.created_at), ''))"
                " FROM tasks t LEFT JOIN steps s ON s.task_id = t.task_id AND s.attempt = t.attempt"
                " GROUP BY t.task_id, t.attempt"
            ).fetchall()
        finally:
            conn.close()
        runs += [
            Run(
                task, attempt, host_id, status, datetime.fromisoformat(a), datetime.fromisoformat(b)
            )
            for task, attempt, status, a, b in rows
        ]
    return runs
