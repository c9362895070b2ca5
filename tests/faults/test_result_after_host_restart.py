"""A host finishes a task while the cloud is down, and is killed before the cloud is back.

Real `amc` processes: a cloud on a SQLite file, a direct-transport host (it plans itself, so it
goes on while the cloud is away) on virtual phones. The cloud is stopped mid-task, the host
finishes the attempt, is SIGKILLed and started again on its data folder, and only then does the
cloud come back.

- The restarted host delivers the result the killed one kept: the task ends with it, as its one
  attempt, and no phone runs the task a second time.
- A host killed during the retention pass that follows a finished attempt (a slow one: many
  files to delete) still delivers that attempt's result: the result was handed over first.
- A result whose lease was meanwhile taken over (the lease ran out while the host was away,
  another host ran the task's next attempt) is refused by the cloud, and the restarted host
  drops it with a log line instead of sending it for ever.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path

from google.protobuf import duration_pb2

from amc.v1 import lease_service_pb2, task_service_pb2, types_pb2
from cloud.store import states
from host.outbox import OutboxStore
from host.timeline.store import INTERRUPTED, TimelineStore
from tests.support.many_files import fill_with_links
from tests.support.processes import (
    TERMINAL,
    AmcProcess,
    Fleet,
    operator,
    wait_connected,
    wait_serving,
    wait_task,
)
from tests.support.waiting import until

WITHIN = 90.0


def _attempts_on(host_dir: Path, task_id: str) -> dict[int, str]:
    """The host's own timeline: each attempt of the task it ran, with its status there."""
    db = host_dir / "task_progress.sqlite3"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT attempt, status FROM tasks WHERE task_id = ?", (task_id,)
        ).fetchall()
    return {int(a): str(s) for a, s in rows}


def _held_results(host_dir: Path) -> int:
    """Results the host keeps for the cloud (its outbox file)."""
    db = host_dir / "outbox.sqlite3"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM results").fetchone()
    return int(count)


async def _finish_while_down(fleet: Fleet, lease_s: int) -> tuple[AmcProcess, AmcProcess, str, int]:
    """Start a cloud and host a, give a a task, stop the cloud at its first step, wait for a to
    finish the attempt, SIGKILL a and start it again (while the cloud is still down). Returns
    the stopped cloud, the restarted host, the task id and where the restarted host's log
    starts."""
    cloud = fleet.cloud("cloud-1").start()
    # Slow steps (~1 s each): the task is still running when the cloud goes.
    first = fleet.host("a", settle_delay_s=1.0, transport="direct")
    await wait_serving(fleet.address, fleet.pki_dir)
    ops = operator(fleet.address, fleet.pki_dir)
    try:
        first.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                max_attempts=3,
                lease_duration=duration_pb2.Duration(seconds=lease_s),
            )
        )
        task_id = submitted.task.task_id
        await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_RUNNING and t.progress.step_index >= 1,
            what="running on host a",
        )
    finally:
        await ops.close()
    cloud.stop()
    host_dir = fleet.workdir / "host-a"
    await until(
        lambda: _attempts_on(host_dir, task_id).get(1) == "succeeded",
        within=WITHIN,
        what="host a finished attempt 1 with the cloud down",
    )
    first.kill()
    log_from = len(first.output())
    again = fleet.host("a", settle_delay_s=1.0, transport="direct").start()
    await until(
        lambda: "lease stream lost" in again.output()[log_from:],
        within=WITHIN,
        what="the restarted host tried the cloud that is still down",
    )
    return cloud, again, task_id, log_from


async def test_a_result_kept_across_a_host_restart_ends_the_task_once(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki)
    # A lease longer than the outage: the restarted host's hello finds it live.
    cloud, again, task_id, _ = await _finish_while_down(fleet, lease_s=120)
    ops = None
    try:
        cloud = fleet.cloud("cloud-2").start()
        await wait_serving(fleet.address, fault_pki)
        ops = operator(fleet.address, fault_pki)
        done = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, within=WITHIN)
        assert done.status == types_pb2.TASK_STATUS_SUCCEEDED, done
        assert [(a.attempt, a.host_id) for a in done.attempts] == [(1, "a")], done.attempts
        assert done.attempts[0].status == types_pb2.TASK_STATUS_SUCCEEDED, done.attempts[0]
        # No phone ran it again: the host's timeline knows attempt 1 only.
        assert _attempts_on(tmp_path / "host-a", task_id) == {1: "succeeded"}
        await until(lambda: _held_results(tmp_path / "host-a") == 0, what="the result let go")
    finally:
        if ops is not None:
            await ops.close()
        again.stop()
        cloud.stop()


async def test_a_kept_result_whose_lease_was_taken_over_is_refused_and_dropped(
    tmp_path: Path, fault_pki: Path
) -> None:
    fleet = Fleet(tmp_path, fault_pki)
    # A lease that runs out while host a is away, and outlasts its few remaining steps (~1 s
    # each, ~5 s in all on a loaded machine): the host stops an attempt whose lease ran out by
    # its own clock. The cloud back gives the live lease a new term, which this test waits out.
    cloud, again, task_id, log_from = await _finish_while_down(fleet, lease_s=15)
    again.kill()  # a stays away while the cloud is back
    other = fleet.host("b")
    ops = None
    try:
        cloud = fleet.cloud("cloud-2").start()
        await wait_serving(fleet.address, fault_pki)
        ops = operator(fleet.address, fault_pki)
        other.start()
        # Attempt 1's lease runs out (no host renews it) and host b runs attempt 2.
        done = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, within=WITHIN)
        assert [(a.attempt, a.host_id) for a in done.attempts] == [(1, "a"), (2, "b")]
        assert done.attempts[0].failure_reason == states.LEASE_EXPIRED, done.attempts[0]
        again = fleet.host("a", settle_delay_s=1.0, transport="direct").start()
        await until(
            lambda: f"result of {task_id}/1 dropped" in again.output()[log_from:],
            within=WITHIN,
            what="host a dropped its refused result",
        )
        await until(lambda: _held_results(tmp_path / "host-a") == 0, what="the result let go")
        after = await wait_task(ops, task_id, lambda t: t.status in TERMINAL)
        assert after.status == done.status == types_pb2.TASK_STATUS_SUCCEEDED
        assert [a.status for a in after.attempts] == [a.status for a in done.attempts]
    finally:
        if ops is not None:
            await ops.close()
        again.stop()
        other.stop()
        cloud.stop()


def _old_task_with_many_files(host_dir: Path) -> None:
    """A finished task in the host's timeline, its folder full of files: with
    AMC_HOST_RETENTION_MAX_TASKS=1 it is kept at start and deleted once the next one ends."""
    store = TimelineStore(host_dir / "task_progress.sqlite3", host_dir / "artifacts")
    try:
        store.start_task("old-task", 1, "an old goal", "emulator-5554")
        store.finish_task("old-task", 1, "succeeded", "done long ago")
        folder = store.artifacts.resolve(store.artifacts.task_dir_name("old-task", 1))
        folder.mkdir(parents=True)
        fill_with_links(folder)  # so many that deleting them outlasts the kill
    finally:
        store.close()


async def test_a_host_killed_in_the_retention_pass_after_a_task_delivers_its_result(
    tmp_path: Path, fault_pki: Path
) -> None:
    """The result used to reach the lease client (and its file) only after the retention pass:
    killed while it deleted files, the host lost the result, its next process named nothing,
    the cloud released the lease and the task ran again as attempt 2."""
    fleet = Fleet(tmp_path, fault_pki)
    host_dir = tmp_path / "host-a"
    _old_task_with_many_files(host_dir)
    keep_one = {"AMC_HOST_RETENTION_MAX_TASKS": "1"}
    cloud = fleet.cloud("cloud-1").start()
    first = fleet.host("a", transport="direct", extra=keep_one)
    again: AmcProcess | None = None
    await wait_serving(fleet.address, fault_pki)
    ops = operator(fleet.address, fault_pki)
    try:
        first.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                max_attempts=3,
                lease_duration=duration_pb2.Duration(seconds=120),
            )
        )
        task_id = submitted.task.task_id
        await until(
            lambda: _attempts_on(host_dir, task_id).get(1) == "succeeded",
            within=WITHIN,
            what="host a finished attempt 1",
        )
        first.kill()  # the retention pass is deleting the old task's files now
        again = fleet.host("a", transport="direct", extra=keep_one).start()
        done = await wait_task(ops, task_id, lambda t: t.status in TERMINAL, within=WITHIN)
        assert done.status == types_pb2.TASK_STATUS_SUCCEEDED, done
        assert [(a.attempt, a.host_id) for a in done.attempts] == [(1, "a")], done.attempts
        assert _attempts_on(host_dir, task_id) == {1: "succeeded"}
    finally:
        await ops.close()
        first.stop()
        if again is not None:
            again.stop()
        cloud.stop()


def _ended_and_kept_at(host_dir: Path, task_id: str) -> tuple[datetime, datetime]:
    """When the host's timeline says attempt 1 ended, and when its result was kept."""
    with sqlite3.connect(f"file:{host_dir / 'task_progress.sqlite3'}?mode=ro", uri=True) as conn:
        (ended,) = conn.execute(
            "SELECT finished_at FROM tasks WHERE task_id = ? AND attempt = 1", (task_id,)
        ).fetchone()
    with sqlite3.connect(f"file:{host_dir / 'outbox.sqlite3'}?mode=ro", uri=True) as conn:
        (kept,) = conn.execute(
            "SELECT created_at FROM results WHERE task_id = ? AND attempt = 1", (task_id,)
        ).fetchone()
    return datetime.fromisoformat(ended), datetime.fromisoformat(kept)


async def test_a_host_keeps_a_result_before_its_timeline_says_the_attempt_ended(
    tmp_path: Path, fault_pki: Path
) -> None:
    """The timeline said "succeeded" a moment before the result was kept: a host killed in that
    moment had recorded the attempt as done while no result reached the cloud, which released
    the lease when the next process connected and ran the task again (seen with the outbox
    held by another writer, which stretches the moment). The cloud is down here, so the
    result stays kept and both times can be read."""
    fleet = Fleet(tmp_path, fault_pki)
    host_dir = tmp_path / "host-a"
    cloud = fleet.cloud().start()
    host = fleet.host("a", settle_delay_s=1.0, transport="direct")
    await wait_serving(fleet.address, fault_pki)
    ops = operator(fleet.address, fault_pki)
    try:
        host.start()
        await wait_connected(ops, {"a"})
        submitted = await ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme",
                max_attempts=3,
                lease_duration=duration_pb2.Duration(seconds=120),  # outlives the outage
            )
        )
        task_id = submitted.task.task_id
        await wait_task(
            ops,
            task_id,
            lambda t: t.status == types_pb2.TASK_STATUS_RUNNING and t.progress.step_index >= 1,
            what="running on host a",
        )
    finally:
        await ops.close()
    try:
        cloud.stop()
        await until(
            lambda: _attempts_on(host_dir, task_id).get(1) == "succeeded",
            within=WITHIN,
            what="host a finished attempt 1 with the cloud down",
        )
        await until(lambda: _held_results(host_dir) == 1, what="the result kept")
        ended, kept = _ended_and_kept_at(host_dir, task_id)
        assert kept <= ended, (kept, ended)
    finally:
        host.stop()
        cloud.stop()


async def test_an_attempt_whose_result_was_kept_ends_as_its_result_says_at_the_next_start(
    tmp_path: Path, fault_pki: Path
) -> None:
    """A process killed after keeping a result and before writing the attempt's end (the
    timeline row still "running", as that process left it): the next start ends the row as
    the result says, not "interrupted", and sends the result (the cloud is down here)."""
    host_dir = tmp_path / "host-a"
    store = TimelineStore(host_dir / "task_progress.sqlite3", host_dir / "artifacts")
    store.start_task("t-kept", 1, "Turn on dark theme", "emulator-5554", lease_id="L1")
    store.start_task("t-lost", 1, "Turn on dark theme", "emulator-5556", lease_id="L2")
    store.close()
    outbox = OutboxStore(host_dir / "outbox.sqlite3")
    result = lease_service_pb2.TaskResult(
        task_id="t-kept",
        attempt=1,
        lease_id="L1",
        status=types_pb2.TASK_STATUS_SUCCEEDED,
        summary="'Dark theme' is on",
    )
    outbox.keep_result("t-kept", 1, "emulator-5554", result.SerializeToString())
    outbox.close()
    host = Fleet(tmp_path, fault_pki).host("a").start()  # its cloud is never started
    try:
        await until(
            lambda: "lease stream lost" in host.output(), within=WITHIN, what="host a started"
        )
        assert _attempts_on(host_dir, "t-kept") == {1: "succeeded"}
        assert _attempts_on(host_dir, "t-lost") == {1: INTERRUPTED}
        assert _held_results(host_dir) == 1
    finally:
        host.stop()
