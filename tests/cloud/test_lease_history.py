"""A task's lease history (TaskService.ListTaskEvents), renewal summaries and totals, over real
mTLS gRPC on SQLite and PostgreSQL: every kind of event is recorded where the change happens."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import task_service_pb2, types_pb2
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_ASSIGNED as ASSIGNED,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_CANCEL_REQUESTED as CANCEL_REQUESTED,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_CANCELLED as CANCELLED,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_DEADLINE_EXCEEDED as DEADLINE_EXCEEDED,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_EXPIRED as EXPIRED,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_REQUEUED as REQUEUED,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_RESULT as RESULT,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_RESUMED as RESUMED,
)
from amc.v1.task_service_pb2 import (
    LEASE_EVENT_KIND_REVOKED as REVOKED,
)
from cloud.server import CloudServer
from cloud.store import decisions
from planner.decision import Decision, Usage
from tests.cloud.cloud_harness import (
    DRIVER_TEXT,
    ScriptedHost,
    due,
    failing_statements,
    lapse,
    logged_text,
    renewal,
    result,
    submit,
    wait_status,
)


def secs(s: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(int(s * 1000))
    return d


async def events(ops: Any, task_id: str, attempt: int = 0) -> list[task_service_pb2.LeaseEvent]:
    response = await ops.ListTaskEvents(
        task_service_pb2.ListTaskEventsRequest(task_id=task_id, attempt=attempt)
    )
    return list(response.events)


def kinds(found: list[task_service_pb2.LeaseEvent]) -> list[tuple[int, int]]:
    """(attempt, kind) of each event, in order."""
    return [(e.attempt, e.kind) for e in found]


async def until_events(ops: Any, task_id: str, wanted: int, within: float = 10.0) -> list[Any]:
    """Poll until the task has at least `wanted` events (a bound, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        found = await events(ops, task_id)
        if len(found) >= wanted or loop.time() > end:
            return found
        await asyncio.sleep(0.05)


def _decision(tokens: int) -> Decision:
    action = types_pb2.Action(purpose="open it", expected_outcome="it opens")
    action.tap.element_id = "e1"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e1"},
        action=action,
        purpose="open it",
        expected_outcome="it opens",
        rationale="",
        thinking=[],
        forced_retry=False,
        usage=Usage(
            input_tokens=tokens,
            output_tokens=tokens // 10,
            cache_read_input_tokens=7,
            cache_creation_input_tokens=3,
            thinking_tokens=2,
        ),
        provider="offline",
        model="m",
        latency_s=0.1,
        system_prompt="s",
        user_prompt="u",
    )


async def test_a_finished_attempt_has_its_assignment_renewal_summary_result_and_totals(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p1"])
        # Longer than the harness's 2 s: its renewals come at once (far from expiry, so they
        # keep it), and on a loaded machine the rest of the attempt could outlast it.
        task = (await submit(ops, lease_duration=secs(30))).task
        assert task.totals.steps == 0 and task.totals.decisions == 0
        a = (await host.next("assignment")).assignment
        for step in (1, 2, 3):
            await host.send(renewal(a, step, f"step {step}"))
            await host.next("renewed")
        live = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        assert live.lease_expires_at == live.attempts[0].lease_expires_at
        assert live.HasField("lease_expires_at")
        for tokens in (100, 200):
            await decisions.append(cloud.store, "h1", task.task_id, 1, _decision(tokens))
        await host.send(result(a, summary="dark theme is on", step=4))
        await host.next("result_ack")

        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        (attempt,) = got.attempts
        assert not got.HasField("lease_expires_at")
        assert attempt.renewals == 3
        assert attempt.first_renewed_at.ToDatetime() <= attempt.last_renewed_at.ToDatetime()
        assert attempt.last_renewed_at.ToDatetime() <= attempt.ended_at.ToDatetime()
        totals = got.totals
        assert (totals.usage.input_tokens, totals.usage.output_tokens) == (300, 30)
        assert (totals.usage.cache_read_input_tokens, totals.usage.thinking_tokens) == (14, 4)
        assert totals.usage.cache_creation_input_tokens == 6
        assert (totals.decisions, totals.steps) == (2, 4)
        assert totals.run_time.ToTimedelta() <= totals.wall_time.ToTimedelta()
        assert totals.wall_time.ToTimedelta() == got.finished_at.ToDatetime() - (
            got.created_at.ToDatetime()
        )
        listed = (await ops.ListTasks(task_service_pb2.ListTasksRequest())).tasks
        assert [t.totals for t in listed if t.task_id == task.task_id] == [totals]

        history = await events(ops, task.task_id)
        assert kinds(history) == [(1, ASSIGNED), (1, RESULT)]
        assigned, finished = history
        assert (assigned.host_id, assigned.device_serial) == ("h1", "p1")
        assert assigned.task_status == types_pb2.TASK_STATUS_ASSIGNED
        assert finished.result_status == types_pb2.TASK_STATUS_SUCCEEDED
        assert finished.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        assert finished.reason == "dark theme is on"
        assert assigned.at.ToDatetime() <= finished.at.ToDatetime()
    finally:
        await host.close()


async def test_expiry_requeue_and_a_stale_host_revoked_once(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    first = ScriptedHost(cloud.address, pki_dir, "h3")
    second = ScriptedHost(cloud.address, pki_dir, "h4")
    stale = ScriptedHost(cloud.address, pki_dir, "h3")
    try:
        await first.connect(["p"])
        task = (await submit(ops, lease_duration=secs(120))).task
        a1 = (await first.next("assignment")).assignment
        await first.close()  # gone without a word: the lease runs out
        await lapse(cloud.store, task.task_id, attempt=1)
        await second.connect(["q"])
        a2 = (await second.next("assignment")).assignment
        assert a2.attempt == 2
        await stale.connect(["p"])
        for _ in range(3):  # the same refusal three times is one event
            await stale.send(renewal(a1, 9, "late"))
            assert (await stale.next("revoked")).revoked.reason == (
                lease_pb.REVOKE_REASON_SUPERSEDED
            )
        await second.send(result(a2))
        await second.next("result_ack")

        history = await events(ops, task.task_id)
        assert kinds(history) == [
            (1, ASSIGNED),
            (1, EXPIRED),
            (1, REQUEUED),
            (2, ASSIGNED),
            (1, REVOKED),
            (2, RESULT),
        ]
        expired, requeued, revoked = history[1], history[2], history[4]
        assert (expired.host_id, expired.reason) == ("h3", "lease expired")
        assert expired.task_status == types_pb2.TASK_STATUS_QUEUED
        assert "attempt 2 of 3" in requeued.reason
        assert (revoked.host_id, revoked.reason) == ("h3", "superseded")
        assert kinds(await events(ops, task.task_id, attempt=2)) == [(2, ASSIGNED), (2, RESULT)]
    finally:
        await stale.close()
        await first.close()
        await second.close()


async def test_a_revocation_the_database_fails_to_record_is_logged_without_the_driver_text(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = ScriptedHost(cloud.address, pki_dir, "h3")
    second = ScriptedHost(cloud.address, pki_dir, "h4")
    stale = ScriptedHost(cloud.address, pki_dir, "h3")
    try:
        await first.connect(["p"])
        task = (await submit(ops, lease_duration=secs(120))).task
        a1 = (await first.next("assignment")).assignment
        await first.close()
        await lapse(cloud.store, task.task_id, attempt=1)
        await second.connect(["q"])
        await second.next("assignment")
        await stale.connect(["p"])
        with failing_statements(cloud.store, "INSERT INTO lease_events"):
            await stale.send(renewal(a1, 9, "late"))
            # Best effort: the host is told all the same.
            assert (await stale.next("revoked")).revoked.reason == (
                lease_pb.REVOKE_REASON_SUPERSEDED
            )
    finally:
        await stale.close()
        await first.close()
        await second.close()
    logged = logged_text(caplog)
    assert f"recording the revocation of {task.task_id}/1 failed: database unavailable" in logged
    assert DRIVER_TEXT not in logged and "6543" not in logged


async def test_the_last_expiry_fails_the_task(cloud: CloudServer, ops: Any, pki_dir: Path) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "h5")
    try:
        await host.connect(["p"])
        task = (await submit(ops, lease_duration=secs(0.3), max_attempts=1)).task
        await host.next("assignment")
        await host.next("revoked")
        await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_FAILED)
        history = await events(ops, task.task_id)
        assert kinds(history) == [(1, ASSIGNED), (1, EXPIRED)]
        assert history[1].task_status == types_pb2.TASK_STATUS_FAILED
        assert "no attempts left (1 allowed)" in history[1].reason
    finally:
        await host.close()


async def test_a_cancel_records_the_operator_and_the_reason(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    queued = (await submit(ops, target=types_pb2.TaskTarget(host_id="nobody"))).task
    for person in ("x" * 65, "tab\there"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.CancelTask(
                task_service_pb2.CancelTaskRequest(task_id=queued.task_id, on_behalf_of=person)
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "on_behalf_of: at most 64 printable characters"
    response = await ops.CancelTask(
        task_service_pb2.CancelTaskRequest(
            task_id=queued.task_id, reason="wrong phone", on_behalf_of="alice"
        )
    )
    assert response.task.cancelled_by == "alice via ops"
    (cancelled,) = await events(ops, queued.task_id)
    assert (cancelled.attempt, cancelled.kind) == (0, CANCELLED)
    assert (cancelled.operator, cancelled.reason) == ("alice via ops", "wrong phone")

    host = ScriptedHost(cloud.address, pki_dir, "h6")
    try:
        await host.connect(["p"])
        task = (await submit(ops)).task
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a))
        await host.next("renewed")
        response = await ops.CancelTask(
            task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="not needed")
        )
        assert response.task.cancelled_by == "ops" and response.task.cancel_requested
        await host.next("revoked")
        # A second request tells the host again, keeps the first one's words, adds no event.
        await ops.CancelTask(
            task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="other words")
        )
        assert (await host.next("revoked")).revoked.message == "not needed"
        await host.send(result(a, status=types_pb2.TASK_STATUS_CANCELLED, summary="stopped"))
        await host.next("result_ack")
        history = await events(ops, task.task_id)
        assert kinds(history) == [(1, ASSIGNED), (1, CANCEL_REQUESTED), (1, RESULT)]
        requested, acknowledged = history[1], history[2]
        assert (requested.operator, requested.reason) == ("ops", "not needed")
        assert (requested.host_id, requested.device_serial) == ("h6", "p")
        assert requested.task_status == types_pb2.TASK_STATUS_RUNNING
        assert acknowledged.result_status == types_pb2.TASK_STATUS_CANCELLED
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        assert got.result_summary == "not needed" and got.cancelled_by == "ops"
    finally:
        await host.close()


async def test_a_cancel_the_host_never_acknowledges_ends_with_the_lease(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "h7")
    try:
        await host.connect(["p"])
        task = (await submit(ops, lease_duration=secs(120))).task
        await host.next("assignment")
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task.task_id))
        await lapse(cloud.store, task.task_id)
        await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_CANCELLED)
        history = await events(ops, task.task_id)
        assert kinds(history) == [
            (1, ASSIGNED),
            (1, CANCEL_REQUESTED),
            (1, EXPIRED),
            (1, CANCELLED),
        ]
        assert history[-1].operator == "ops"
        assert history[-1].reason == "cancelled by operator"
    finally:
        await host.close()


async def test_a_reconnected_host_resumes_and_a_deadline_ends_the_task(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "h8")
    again = ScriptedHost(cloud.address, pki_dir, "h8")
    try:
        await host.connect(["p"])
        task = (await submit(ops, lease_duration=secs(120), timeout=secs(300))).task
        a = (await host.next("assignment")).assignment
        await host.close()
        held = lease_pb.HeldAssignment(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_serial="p"
        )
        await again.connect(["p"], held=[held])
        assert (await again.next("assignment")).assignment.resumed
        await due(cloud.store, task.task_id)
        assert (await again.next("revoked")).revoked.reason == (
            lease_pb.REVOKE_REASON_DEADLINE_EXCEEDED
        )
        history = await until_events(ops, task.task_id, 3)
        assert kinds(history) == [(1, ASSIGNED), (1, RESUMED), (1, DEADLINE_EXCEEDED)]
        assert (history[1].host_id, history[1].device_serial) == ("h8", "p")
        assert history[2].task_status == types_pb2.TASK_STATUS_FAILED
        assert history[2].host_id == "h8"
    finally:
        await host.close()
        await again.close()


async def test_list_task_events_refuses_bad_requests_and_pages(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await events(ops, "no-such-task")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "task no-such-task not found"
    task = (await submit(ops, target=types_pb2.TaskTarget(host_id="nobody"))).task
    for request, detail in (
        (task_service_pb2.ListTaskEventsRequest(), "task_id: required"),
        (
            task_service_pb2.ListTaskEventsRequest(task_id=task.task_id, attempt=-1),
            "attempt: must be >= 0",
        ),
        (
            task_service_pb2.ListTaskEventsRequest(task_id=task.task_id, page_size=1001),
            "page_size: 0 to 1000",
        ),
        (
            task_service_pb2.ListTaskEventsRequest(task_id=task.task_id, page_token="bogus"),
            "page_token: not a page token from this server",
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.ListTaskEvents(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == detail

    host = ScriptedHost(cloud.address, pki_dir, "h9")
    try:
        await host.connect(["p"])
        running = (await submit(ops, target=types_pb2.TaskTarget(host_id="h9"))).task
        a = (await host.next("assignment")).assignment
        await host.send(result(a))
        await host.next("result_ack")
        pages: list[list[int]] = []
        token = ""
        while True:
            page = await ops.ListTaskEvents(
                task_service_pb2.ListTaskEventsRequest(
                    task_id=running.task_id, page_size=1, page_token=token
                )
            )
            pages.append([e.kind for e in page.events])
            token = page.next_page_token
            if not token:
                break
        assert pages == [[ASSIGNED], [RESULT]]
    finally:
        await host.close()


async def test_task_id_prefixes_find_tasks(ops: Any) -> None:
    first = (await submit(ops, target=types_pb2.TaskTarget(host_id="nobody"))).task
    second = (await submit(ops, target=types_pb2.TaskTarget(host_id="nobody"))).task
    for prefix in (first.task_id, first.task_id[:12], first.task_id[:12].upper()):
        listed = await ops.ListTasks(task_service_pb2.ListTasksRequest(task_id_prefix=prefix))
        assert [t.task_id for t in listed.tasks] == [first.task_id]
    common = ""
    for x, y in zip(first.task_id, second.task_id, strict=True):
        if x != y:
            break
        common += x
    listed = await ops.ListTasks(task_service_pb2.ListTasksRequest(task_id_prefix=common or "0"))
    if common:
        assert {first.task_id, second.task_id} <= {t.task_id for t in listed.tasks}
    for bad in ("xyz", "a" * 33, "%", "a_b"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.ListTasks(task_service_pb2.ListTasksRequest(task_id_prefix=bad))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "task_id_prefix: 1 to 32 hexadecimal digits"


async def test_a_success_after_a_cancel_ends_the_task_succeeded_and_says_the_cancel_came_too_late(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A host that finished its attempt before it read the operator's cancel sends SUCCEEDED:
    the live result wins (the work was done), the task ends SUCCEEDED with the host's summary.
    Before, nothing on the task's record said why a task an operator cancelled succeeded
    anyway; now its RESULT event says the cancel came too late (the cancel itself is its
    CANCEL_REQUESTED event)."""
    host = ScriptedHost(cloud.address, pki_dir, "h8")
    try:
        await host.connect(["p"])
        task = (await submit(ops)).task
        a = (await host.next("assignment")).assignment
        await ops.CancelTask(
            task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="not needed")
        )
        await host.next("revoked")
        await host.send(result(a, status=types_pb2.TASK_STATUS_SUCCEEDED, summary="all set"))
        await host.next("result_ack")
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        assert got.status == types_pb2.TASK_STATUS_SUCCEEDED
        assert got.result_summary == "all set"
        # The Task says it too: nothing is pending (cancel_requested is for a live task), and
        # who asked is kept; a second cancel is refused as for any ended task.
        assert not got.cancel_requested and got.cancelled_by == "ops"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task.task_id))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details() == f"task {task.task_id} already ended: succeeded"
        history = await events(ops, task.task_id)
        assert kinds(history) == [(1, ASSIGNED), (1, CANCEL_REQUESTED), (1, RESULT)]
        ended = history[2]
        assert ended.result_status == types_pb2.TASK_STATUS_SUCCEEDED
        assert ended.reason == "a cancel was asked, too late: the attempt had succeeded: all set"
    finally:
        await host.close()
