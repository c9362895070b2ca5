"""Late results: a host's result that arrives after its lease ran out, on both backends.

Accepted (and recorded as late) while no other attempt of the task has started, whether or not
the sweeper has ended the attempt yet, also when that expiry failed the task on its last
attempt; refused once another attempt started, after a cancel, past the deadline, and for the
outcomes that are not the task's own end (a cancel, a retryable failure). Then the same over a
real Lease stream: the ack says `late` and the task's attempt says `late_result`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from sqlalchemy import update

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.server import CloudServer
from cloud.store import flows, hosts, leases, states, tasks
from cloud.store.database import Store
from cloud.store.models import AttemptRow, TaskRow
from tests.cloud.cloud_harness import (
    ScriptedHost,
    columns_added,
    lapse,
    result,
    submit,
    wait_status,
)

HOST = "h1"


async def _claimed(store: Store, max_attempts: int = 3, serial: str = "p1") -> leases.Claimed:
    await tasks.submit(
        store,
        tasks.NewTask(goal="g", max_attempts=max_attempts, lease_seconds=30, timeout_seconds=3600),
    )
    claimed = await leases.claim(store, HOST, [serial], 0)
    assert claimed is not None
    return claimed


async def _lapse(store: Store, c: leases.Claimed) -> None:
    """The lease ran out (as if no renewal reached the cloud for a lease length)."""
    async with store.write() as session:
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.task_id == c.task_id, AttemptRow.attempt == c.attempt)
            .values(lease_expires_at=store.now() - dt.timedelta(seconds=1))
        )


async def _result(
    store: Store, c: leases.Claimed, status: str = states.SUCCEEDED, **kw: Any
) -> leases.ResultOut:
    return await leases.record_result(
        store, HOST, c.task_id, c.attempt, c.lease_id, status, "done", None, **kw
    )


async def _task(store: Store, task_id: str) -> tasks.TaskView:
    view = await tasks.get(store, task_id)
    assert view is not None
    return view


async def test_a_result_after_the_sweep_is_accepted_as_late(store: Store) -> None:
    c = await _claimed(store)
    await _lapse(store, c)
    (ended,) = await leases.sweep_expired(store)
    assert ended.task_status == states.QUEUED  # requeued: the next attempt may start any time
    out = await _result(store, c)
    assert (out.recorded, out.late, out.task_status) == (True, True, states.SUCCEEDED)
    view = await _task(store, c.task_id)
    assert view.task.status == states.SUCCEEDED and view.task.result_summary == "done"
    (attempt,) = view.attempts
    assert (attempt.status, attempt.late_result, attempt.failure_reason) == (
        states.SUCCEEDED,
        True,
        None,
    )
    # Nothing is left to hand out, and the same result again is a duplicate, still late.
    assert await leases.claim(store, HOST, ["p1"], 0) is None
    again = await _result(store, c)
    assert (again.recorded, again.duplicate, again.late) == (False, True, True)


async def test_a_result_before_the_sweep_is_accepted_as_late(store: Store) -> None:
    c = await _claimed(store)
    await _lapse(store, c)
    out = await _result(store, c, states.FAILED)
    assert (out.recorded, out.late, out.task_status) == (True, True, states.FAILED)
    assert await leases.sweep_expired(store) == []  # the attempt had ended: nothing to sweep
    (attempt,) = (await _task(store, c.task_id)).attempts
    assert (attempt.status, attempt.failure_reason, attempt.late_result) == (
        states.FAILED,
        "done",
        True,
    )


async def test_an_expiry_that_failed_the_last_attempt_gives_way_to_its_late_result(
    store: Store,
) -> None:
    c = await _claimed(store, max_attempts=1)
    await _lapse(store, c)
    await leases.sweep_expired(store)
    assert (await _task(store, c.task_id)).task.status == states.FAILED
    out = await _result(store, c)
    assert (out.recorded, out.late) == (True, True)
    assert (await _task(store, c.task_id)).task.status == states.SUCCEEDED


async def test_once_another_attempt_started_the_old_result_is_refused(store: Store) -> None:
    c = await _claimed(store)
    await _lapse(store, c)
    await leases.sweep_expired(store)
    second = await leases.claim(store, HOST, ["p2"], 0)
    assert second is not None and second.attempt == 2
    out = await _result(store, c)
    assert not out.recorded and out.revocation == leases.Revocation.SUPERSEDED
    view = await _task(store, c.task_id)
    assert view.task.status == states.ASSIGNED
    assert [a.late_result for a in view.attempts] == [False, False]
    assert view.attempts[0].failure_reason == states.LEASE_EXPIRED


async def test_no_late_result_after_a_cancel_a_deadline_or_for_another_outcome(
    store: Store,
) -> None:
    cancelled = await _claimed(store)
    await _lapse(store, cancelled)
    await leases.sweep_expired(store)
    await tasks.cancel(store, cancelled.task_id, "stop")
    assert not (await _result(store, cancelled)).recorded

    late = await _claimed(store, serial="p2")
    await _lapse(store, late)
    async with store.write() as session:
        await session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == late.task_id)
            .values(deadline=store.now() - dt.timedelta(seconds=1))
        )
    assert not (await _result(store, late)).recorded

    other = await _claimed(store, serial="p3")
    await _lapse(store, other)
    assert not (await _result(store, other, states.CANCELLED)).recorded
    assert not (await _result(store, other, states.FAILED, retryable=True)).recorded
    view = await _task(store, other.task_id)
    assert not view.attempts[0].late_result and view.task.status == states.ASSIGNED


async def test_a_late_result_over_the_lease_stream_is_acknowledged_as_late(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """The host goes away mid-task (its phone with it, so the requeued task waits), the lease
    runs out, it comes back and sends the result it finished meanwhile."""
    host = ScriptedHost(cloud.address, pki_dir, HOST)
    try:
        await host.connect(["p1"])
        task = (await submit(ops)).task
        a = (await host.next("assignment")).assignment
        await host.close()
        await lapse(cloud.store, task.task_id)
        queued = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_QUEUED)
        assert queued.attempts[0].failure_reason == "lease expired"

        host = ScriptedHost(cloud.address, pki_dir, HOST)
        await host.connect([])  # its phone is not back yet: the queued task stays queued
        await host.send(result(a, summary="dark theme is on"))
        ack = (await host.next("result_ack")).result_ack
        assert (ack.late, ack.duplicate) == (True, False)
        assert ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        done = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        (attempt,) = done.attempts
        assert attempt.late_result and attempt.status == types_pb2.TASK_STATUS_SUCCEEDED
        assert done.result_summary == "dark theme is on"
    finally:
        await host.close()


async def test_a_result_kept_across_a_restart_beats_the_next_attempt_of_its_task(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """The host dies mid-task holding its phone, the lease runs out and the task is requeued;
    the host's next process comes back with the phone idle, names the lease it kept a result
    for, and sends that result right after its hello. The hello's dispatch used to claim the
    task's next attempt (for this very phone) before the result was read: the result was
    refused as superseded and the task ran again."""
    host = ScriptedHost(cloud.address, pki_dir, HOST)
    try:
        await host.connect(["p1"], process_id="run-1")
        task = (await submit(ops)).task
        a = (await host.next("assignment")).assignment
        await host.close()
        await lapse(cloud.store, task.task_id)
        await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_QUEUED)

        host = ScriptedHost(cloud.address, pki_dir, HOST)
        held = lease_pb.HeldAssignment(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_serial="p1"
        )
        await host.connect(["p1"], held=[held], process_id="run-2")
        await host.send(result(a, summary="dark theme is on"))
        # What the hello settled comes first; the result's answer is an ack or a refusal
        # other than the hello's "expired".
        seen = [await host.next()]
        while seen[-1].WhichOneof("kind") != "result_ack" and (
            seen[-1].WhichOneof("kind") != "revoked"
            or seen[-1].revoked.reason == lease_pb.REVOKE_REASON_EXPIRED
        ):
            seen.append(await host.next())
        answer = seen[-1]
        assert answer.WhichOneof("kind") == "result_ack", seen
        assert answer.result_ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        assert [m.assignment.attempt for m in seen if m.WhichOneof("kind") == "assignment"] in (
            [],
            [1],
        )
        done = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        (attempt,) = done.attempts
        assert attempt.status == types_pb2.TASK_STATUS_SUCCEEDED
        assert done.result_summary == "dark theme is on"
    finally:
        await host.close()


async def test_a_new_process_keeps_the_lease_it_names_while_the_old_stream_is_still_open(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """The host's previous process died without its stream ending (a half-open connection the
    cloud has not noticed yet) and the next process names the lease it kept a result for. The
    old stream is superseded, and the leases granted on it used to be released with it, this
    one too: the result was refused (released) and the task ran again."""
    old = ScriptedHost(cloud.address, pki_dir, HOST)
    new = ScriptedHost(cloud.address, pki_dir, HOST)
    try:
        await old.connect(["p1"], process_id="run-1")
        task = (await submit(ops)).task
        a = (await old.next("assignment")).assignment
        held = lease_pb.HeldAssignment(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_serial="p1"
        )
        await new.connect(["p1"], held=[held], process_id="run-2")
        assert (await new.next("assignment")).assignment.resumed
        await new.send(result(a, summary="dark theme is on"))
        ack = (await new.next("result_ack")).result_ack
        assert ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        done = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        assert [x.attempt for x in done.attempts] == [1]
    finally:
        await old.close()
        await new.close()


async def test_a_revived_attempt_the_learning_loop_looked_at_is_handed_back_to_it(
    store: Store,
) -> None:
    """The learning loop looked at the attempt once its lease ran out (nothing to learn from
    an expiry) before the host came back with the result and the hello revived the lease: the
    success that then ends the attempt must be looked at again, as a late result's is."""
    c = await _claimed(store)
    await _lapse(store, c)
    await leases.sweep_expired(store)
    taken = await flows.claim_ended_attempt(store)
    assert taken is not None and taken[0].task_id == c.task_id
    await flows.mark_attempt(store, taken[0].id, "not succeeded")
    record = hosts.HelloRecord([], "sim/1", 0, "replica", "stream", "run-2")
    held = leases.HeldLease(c.task_id, c.attempt, c.lease_id)
    (settled,) = await leases.hellos(store, [leases.HelloIn(HOST, record, [held])])
    assert settled.checks is not None and settled.checks[0].live is not None  # revived
    out = await _result(store, c)
    assert (out.recorded, out.late, out.task_status) == (True, False, states.SUCCEEDED)
    again = await flows.claim_ended_attempt(store)
    assert again is not None and again[0].task_id == c.task_id


async def test_migration_0020_adds_the_hosts_held_leases_and_back(db_url: str) -> None:
    """Both backends: 0020 adds `hosts.held_leases` (NULL for the hosts already there), its
    downgrade drops it, and the schema matches the models again after the upgrade."""
    assert await columns_added(db_url, "hosts", "0019", "0020") == {"held_leases"}
