"""A host process killed with SIGKILL mid-task: the lease runs out, another host finishes the task.

Proves: no goodbye is needed for the cloud to take work back; the task's second attempt runs on
another host; exactly one result is recorded (attempt 1 ended by expiry, attempt 2 succeeded).
On both planner transports. And one host killed again and again while a batch runs (started
again each time, as a supervisor would): every task still succeeds, each with one reported
result; only the killed host's attempts end by expiry.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from amc.v1 import types_pb2
from cloud.store import states
from tests.support.figures import record
from tests.support.processes import (
    TERMINAL,
    AmcProcess,
    Fleet,
    dark_theme_running,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.task_batch import check_finished_once, submit, wait_finished, wait_tasks


@pytest.mark.parametrize("transport", ["cloud", "direct"])
async def test_sigkilled_host_task_is_reassigned_and_finishes_once(
    transport: str, tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki)
    address = fleet.address
    cloud = fleet.cloud().start()
    # Slow steps on host a (a wide "mid-task" to kill it in: host b's start-up, which took long
    # enough on a slow machine for 3 s steps to finish the task first), quick ones on host b.
    host_a = fleet.host("a", settle_delay_s=6.0, transport=transport)
    host_b = fleet.host("b", transport=transport)
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        host_a.start()
        await wait_connected(ops, {"a"})
        # Step 1 under way: three 6 s steps are left to kill it in (step 2 left two, and cost
        # one more step's wait).
        task_id = await dark_theme_running(ops, "a")
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
        figure = f"host_killed_{transport}"
        record(figure, "SIGKILL to attempt 2 assigned", time.monotonic() - killed_at)
        assert reassigned.host_id == "b"
        done = await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED,
            what="succeeded",
        )
        record(figure, "SIGKILL to task succeeded", time.monotonic() - killed_at)
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


KILLS = 3
BATCH = [
    "Turn on dark theme",
    "Turn off Wi-Fi",
    "Turn on airplane mode",
    "Turn on Do Not Disturb",
    "Turn off Bluetooth",
    "Turn off location",
]


async def test_a_host_killed_again_and_again_loses_no_task(tmp_path: Path, fault_pki: Path) -> None:
    """The only host (2 phones, cloud transport) is SIGKILLed whenever it runs something, three
    times, and started again each time, as a supervisor would: its killed attempts run out and
    come back to it; every task still succeeds with one reported result."""
    fleet = Fleet(tmp_path, fault_pki)
    address = fleet.address
    cloud = fleet.cloud().start()

    def host_a() -> AmcProcess:
        return fleet.host("a", phones=2, settle_delay_s=0.5)

    a = host_a()
    ops = None
    try:
        await wait_serving(address, fault_pki)
        ops = operator(address, fault_pki)
        a.start()
        await wait_connected(ops, {"a"})
        ids = await submit(ops, BATCH, max_attempts=KILLS + 2)
        started = time.monotonic()
        kills = 0
        killed: set[tuple[str, int]] = set()  # attempts of dead processes (until they run out)

        def live_work(ts: list[types_pb2.Task]) -> bool:
            return any(
                t.status == types_pb2.TASK_STATUS_RUNNING
                and (t.task_id, t.attempt) not in killed
                and t.progress.step_index >= 1
                for t in ts
            )

        while kills < KILLS:
            tasks = await wait_tasks(
                ops, ids, lambda ts: all(t.status in TERMINAL for t in ts) or live_work(ts), 90
            )
            if all(t.status in TERMINAL for t in tasks):
                break  # nothing left to interrupt
            a.kill()
            kills += 1
            killed |= {
                (t.task_id, t.attempt) for t in tasks if t.status != types_pb2.TASK_STATUS_SUCCEEDED
            }
            a = host_a().start()  # its supervisor starts it again at once
        final = await wait_finished(ops, ids, within=120)
        record("host_killed_repeatedly", "first task to last finished", time.monotonic() - started)
        failed = [t for t in final if t.status != types_pb2.TASK_STATUS_SUCCEEDED]
        assert not failed, [(t.goal, t.result_summary) for t in failed]
        check_finished_once("host_killed_repeatedly", final, {})
        # A killed attempt ends when its new process connects (released at once) or, should
        # that hello come late, when its lease runs out.
        ended = [
            x
            for t in final
            for x in t.attempts
            if "expired" in x.failure_reason or x.failure_reason == states.HOST_RESTARTED
        ]
        record("host_killed_repeatedly", "kills", kills, "kills")
        record("host_killed_repeatedly", "attempts ended by a kill", len(ended), "attempts")
        assert kills == KILLS and len(ended) >= KILLS
    finally:
        if ops is not None:
            await ops.close()
        a.kill()
        cloud.stop()
