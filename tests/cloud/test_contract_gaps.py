"""Contract gaps between the cloud and the hosts that speak its protos, each against a real cloud
over mTLS (SQLite and PostgreSQL) driven by scripted host streams with hand-built messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from amc.v1 import lease_service_pb2 as lease_pb
from cloud import metrics
from cloud.server import CloudServer, build_server
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    lapse,
    renewal,
    result,
    submit,
    tasks_stub,
)
from tests.cloud.conftest import SettingsFactory
from tests.planner import scenes
from tests.support.fakes import FakeModelServer


async def _decisions(cloud: CloudServer, pki_dir: Path, task_id: str) -> list[Any]:
    """The task's decisions as an operator reads them (DecisionLogService)."""
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ch)
        request = decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        return list((await log.ListDecisions(request)).decisions)


def _refused(
    a: lease_pb.Assignment, refusal: lease_pb.AssignmentRefusal.ValueType
) -> lease_pb.LeaseRequest:
    """The Python host's answer to an assignment naming a phone it is running something on."""
    req = result(a, status=types_pb2.TASK_STATUS_FAILED, summary=f"phone {a.device_serial} is busy")
    req.result.retryable = True
    req.result.refusal = refusal
    return req


async def test_a_refused_assignment_costs_no_attempt_and_goes_to_another_phone(
    cloud: CloudServer, ops: Any, pki_dir: Any
) -> None:
    """A task allowed one attempt, handed to a phone the host is busy on: the refusal requeues
    it without using that attempt, and its next attempt goes to the host's other phone."""
    host = ScriptedHost(cloud.address, pki_dir, "h21")
    try:
        await host.connect(["p", "q"])
        task = (await submit(ops, max_attempts=1)).task
        first = (await host.next("assignment")).assignment
        await host.send(_refused(first, lease_pb.ASSIGNMENT_REFUSAL_PHONE_BUSY))
        ack = (await host.next("result_ack")).result_ack
        assert ack.task_status == types_pb2.TASK_STATUS_QUEUED
        second = (await host.next("assignment")).assignment
        assert (second.attempt, second.device_serial) == (
            2,
            "q" if first.device_serial == "p" else "p",
        )
        await host.send(result(second))
        assert (await host.next("result_ack")).result_ack.task_status == (
            types_pb2.TASK_STATUS_SUCCEEDED
        )
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        assert got.attempts[0].failure_reason == f"phone {first.device_serial} is busy"
    finally:
        await host.close()


def _requeued(cause: str) -> float:
    """How many attempts this process's replicas requeued for `cause` (the metric operators
    read)."""
    found = metrics.REGISTRY.get_sample_value("amc_cloud_attempts_requeued_total", {"cause": cause})
    return found or 0.0


async def test_a_refused_assignment_is_counted_as_a_refusal_not_a_retryable_result(
    cloud: CloudServer, ops: Any, pki_dir: Any
) -> None:
    """`amc_cloud_attempts_requeued{cause}` told a host refusing assignments (a phone it is busy
    on: nothing ran) apart from nothing: both were `retryable_result`, so a dashboard showed
    planning outages where a host was only refusing. A refusal has its own cause."""
    before = {c: _requeued(c) for c in ("refused", "retryable_result")}
    host = ScriptedHost(cloud.address, pki_dir, "h24")
    try:
        await host.connect(["p", "q"])
        await submit(ops)
        first = (await host.next("assignment")).assignment
        await host.send(_refused(first, lease_pb.ASSIGNMENT_REFUSAL_PHONE_BUSY))
        assert (await host.next("result_ack")).result_ack.task_status == (
            types_pb2.TASK_STATUS_QUEUED
        )
        second = (await host.next("assignment")).assignment
        failed = result(second, status=types_pb2.TASK_STATUS_FAILED, summary="planning stayed down")
        failed.result.retryable = True
        await host.send(failed)
        assert (await host.next("result_ack")).result_ack.task_status == (
            types_pb2.TASK_STATUS_QUEUED
        )
    finally:
        await host.close()
    after = {c: _requeued(c) - before[c] for c in before}
    assert after == {"refused": 1.0, "retryable_result": 1.0}


async def test_a_refusal_of_a_value_this_cloud_does_not_know_is_a_refusal(
    cloud: CloudServer, ops: Any, pki_dir: Any
) -> None:
    """A newer host's reason (proto3 enums are open) still costs the task no attempt."""
    host = ScriptedHost(cloud.address, pki_dir, "h22")
    try:
        await host.connect(["p", "q"])
        await submit(ops, max_attempts=1)
        first = (await host.next("assignment")).assignment
        await host.send(_refused(first, 99))  # type: ignore[arg-type]  # a newer host's value
        assert (await host.next("result_ack")).result_ack.task_status == (
            types_pb2.TASK_STATUS_QUEUED
        )
        assert (await host.next("assignment")).assignment.attempt == 2
    finally:
        await host.close()


async def test_a_refusal_in_the_old_form_still_uses_an_attempt(
    cloud: CloudServer, ops: Any, pki_dir: Any
) -> None:
    """A host from before refusals (a retryable FAILED alone) is read as before: the attempt
    counts, so a task allowed one fails."""
    host = ScriptedHost(cloud.address, pki_dir, "h23")
    try:
        await host.connect(["p", "q"])
        await submit(ops, max_attempts=1)
        first = (await host.next("assignment")).assignment
        await host.send(_refused(first, lease_pb.ASSIGNMENT_REFUSAL_UNSPECIFIED))
        assert (await host.next("result_ack")).result_ack.task_status == (
            types_pb2.TASK_STATUS_FAILED
        )
    finally:
        await host.close()


async def test_a_host_that_keeps_refusing_a_task_uses_its_attempts_after_three_refusals(
    cloud: CloudServer, ops: Any, pki_dir: Any
) -> None:
    """A host that refuses every assignment for its one phone (it thinks the phone busy, the
    cloud does not): each refusal was free, and the phone was offered again after every busy
    resync, so the task cycled through attempt numbers until its deadline. A task's first three
    refusals are free; a later one counts like any retryable end, so a task allowed one
    attempt fails on the fourth, with the host's reason."""
    host = ScriptedHost(cloud.address, pki_dir, "h27")
    try:
        await host.connect(["p"])
        task = (await submit(ops, max_attempts=1)).task
        after: list[types_pb2.TaskStatus.ValueType] = []
        while len(after) < 4 and after[-1:] != [types_pb2.TASK_STATUS_FAILED]:
            a = (await host.next("assignment")).assignment
            await host.send(_refused(a, lease_pb.ASSIGNMENT_REFUSAL_PHONE_BUSY))
            after.append((await host.next("result_ack")).result_ack.task_status)
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
    finally:
        await host.close()

    assert after == [types_pb2.TASK_STATUS_QUEUED] * 3 + [types_pb2.TASK_STATUS_FAILED]
    assert (got.status, got.result_summary) == (types_pb2.TASK_STATUS_FAILED, "phone p is busy")
    assert len(got.attempts) == 4


async def test_every_revoke_says_what_its_task_became(
    cloud: CloudServer, ops: Any, pki_dir: Any
) -> None:
    """Revoked.task_status, wherever a Revoked comes from: a renewal or a hello naming a lease
    whose result is recorded (FINISHED), the sweeper (EXPIRED), an operator's cancel; never
    for another host's lease."""
    host = ScriptedHost(cloud.address, pki_dir, "h24")
    other = ScriptedHost(cloud.address, pki_dir, "h25")
    try:
        await host.connect(["p"])
        await other.connect([])
        done = (await submit(ops)).task
        a = (await host.next("assignment")).assignment
        await host.send(result(a))
        await host.next("result_ack")
        await host.send(renewal(a))
        finished = (await host.next("revoked")).revoked
        assert (finished.reason, finished.task_status) == (
            lease_pb.REVOKE_REASON_FINISHED,
            types_pb2.TASK_STATUS_SUCCEEDED,
        )
        await other.send(renewal(a))
        theirs = (await other.next("revoked")).revoked
        assert (theirs.reason, theirs.task_status) == (
            lease_pb.REVOKE_REASON_PERMISSION_DENIED,
            types_pb2.TASK_STATUS_UNSPECIFIED,
        )

        swept = (await submit(ops)).task
        b = (await host.next("assignment")).assignment
        await lapse(cloud.store, swept.task_id)
        expired = (await host.next("revoked")).revoked
        assert (expired.reason, expired.task_status) == (
            lease_pb.REVOKE_REASON_EXPIRED,
            types_pb2.TASK_STATUS_QUEUED,
        )
        # Heard from again (a host silent since its lease ran out may be frozen: no new work).
        await host.send(lease_pb.LeaseRequest(outbox=types_pb2.OutboxBacklog()))
        c = (await host.next("assignment")).assignment  # its next attempt, on the freed phone
        assert (c.task_id, c.attempt) == (b.task_id, 2)
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=c.task_id, reason="no"))
        cancelled = (await host.next("revoked")).revoked
        assert (cancelled.reason, cancelled.task_status) == (
            lease_pb.REVOKE_REASON_CANCELLED,
            types_pb2.TASK_STATUS_ASSIGNED,
        )
        await host.close()

        again = ScriptedHost(cloud.address, pki_dir, "h24")
        host = again
        held = lease_pb.HeldAssignment(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_serial="p"
        )
        await again.connect(["p"], held=[held])
        at_hello = (await again.next("revoked")).revoked
        assert (at_hello.task_id, at_hello.reason, at_hello.task_status) == (
            done.task_id,
            lease_pb.REVOKE_REASON_FINISHED,
            types_pb2.TASK_STATUS_SUCCEEDED,
        )
    finally:
        await host.close()
        await other.close()


async def test_an_unknown_verdict_is_read_as_unspecified_and_recorded_as_unknown(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """A newer host's verdict (proto3 enums are open) no longer fails its step: Decide plans
    as if the host had run no checker, and the decision log says the verdict was unknown."""
    cloud = offline_cloud
    host = ScriptedHost(cloud.address, pki_dir, "h26")
    try:
        await host.connect(["p"])
        async with channel(cloud.address, pki_dir, "operator-ops") as ops_ch:
            await submit(tasks_stub(ops_ch))
        a = (await host.next("assignment")).assignment
        async with channel(cloud.address, pki_dir, "host-h26") as ch:
            stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
            request = planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
            )
            await stub.Decide(request)
            request.previous_outcome.CopyFrom(
                types_pb2.ActionOutcome(
                    step_index=1,
                    executed=True,
                    verdict=99,  # type: ignore[arg-type]  # a newer host's value
                    evidence="the newer checker's words",
                )
            )
            second = (await stub.Decide(request)).decision
        assert second.step_index == 2
        first = (await _decisions(cloud, pki_dir, a.task_id))[0]
    finally:
        await host.close()
    assert first.outcome.executed
    assert first.outcome.verdict == types_pb2.VERDICT_UNSPECIFIED
    said = (
        first.verification.evidence
        if first.verification.checked_by_cloud
        else first.outcome.evidence
    )
    assert said.startswith("the host's verdict 99 is not one this cloud knows; read as unspecified")


async def test_a_step_refused_for_a_spent_budget_still_records_the_last_outcome(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """The call that meets the spent budget carries how the previous step went: it is
    recorded on that step's decision first, then the call is refused as before."""
    cloud = offline_cloud
    host = ScriptedHost(cloud.address, pki_dir, "h27")
    try:
        await host.connect(["p"])
        async with channel(cloud.address, pki_dir, "operator-ops") as ops_ch:
            await submit(tasks_stub(ops_ch), budget=types_pb2.TaskBudget(max_tokens=1))
        a = (await host.next("assignment")).assignment
        async with channel(cloud.address, pki_dir, "host-h27") as ch:
            stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
            request = planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
            )
            await stub.Decide(request)  # nothing spent yet: planned, and the cap is passed
            request.previous_outcome.CopyFrom(
                types_pb2.ActionOutcome(step_index=1, executed=True, driver_output="tapped")
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Decide(request)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (refused.value.details() or "").startswith("budget exhausted: ")
        decisions = await _decisions(cloud, pki_dir, a.task_id)
    finally:
        await host.close()
    assert len(decisions) == 1
    assert (decisions[0].outcome.executed, decisions[0].outcome.driver_output) == (True, "tapped")


async def test_decides_permission_denied_says_who_refused_in_its_trailing_metadata(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch, pki_dir: Path
) -> None:
    """Decide answers PERMISSION_DENIED for two refusals a host must treat apart: the lease is
    another host's (this call was wrong), or the model provider refused the cloud's key (the
    cloud must be fixed). They differed only in the message text; the trailing metadata
    `amc-refused-by` now names which ("lease" or "provider"). Real parts: the cloud with the
    real Anthropic SDK against the fake provider, which answers 401 to the cloud's key."""
    fake = FakeModelServer(anthropic_key="sk-ant-another")  # not the key the cloud has
    fake.start()
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
    monkeypatch.setenv("AMC_PLANNER_MODEL", "claude-sonnet-4-6")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
    monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
    monkeypatch.delenv("AMC_PLANNER_MODE", raising=False)
    cloud = await build_server(make_settings())
    await cloud.start()
    host = ScriptedHost(cloud.address, pki_dir, "h22")
    try:
        async with (
            channel(cloud.address, pki_dir, "operator-ops") as ops_ch,
            channel(cloud.address, pki_dir, "host-h22") as own_ch,
            channel(cloud.address, pki_dir, "host-h23") as other_ch,
        ):
            await host.connect(["p"])
            await submit(tasks_stub(ops_ch))
            a = (await host.next("assignment")).assignment
            request = planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
                step_key="1",
            )
            answers = []
            for ch in (other_ch, own_ch):
                stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Decide(request)
                answers.append(err.value)
    finally:
        await host.close()
        await cloud.stop(0.5)
        fake.stop()

    stolen, refused = answers
    assert stolen.code() == refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "belongs to another host" in (stolen.details() or "")
    assert "rejected the API key" in (refused.details() or ""), refused.details()
    assert ("amc-refused-by", "lease") in tuple(stolen.trailing_metadata() or ())
    assert ("amc-refused-by", "provider") in tuple(refused.trailing_metadata() or ())


async def test_decide_refuses_an_attempt_its_host_plans_on_the_direct_transport(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """A host that said it plans itself (hello: DIRECT) could still call Decide on its
    attempt: the cloud planned and logged its own decisions among those the host shipped for
    the same attempt, for a host the dispatcher does not hold back while the provider fails.
    FAILED_PRECONDITION, before any planning; nothing is logged."""
    host = ScriptedHost(cloud.address, pki_dir, "h24")
    try:
        async with (
            channel(cloud.address, pki_dir, "operator-ops") as ops_ch,
            channel(cloud.address, pki_dir, "host-h24") as own_ch,
        ):
            await host.connect(["p"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
            await submit(tasks_stub(ops_ch), target=types_pb2.TaskTarget(host_id="h24"))
            a = (await host.next("assignment")).assignment
            stub: Any = planner_service_pb2_grpc.PlannerServiceStub(own_ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Decide(
                    planner_service_pb2.DecideRequest(
                        task_id=a.task_id,
                        attempt=a.attempt,
                        lease_id=a.lease_id,
                        observation=observation_from_scene(scenes.launcher()),
                        step_key="1",
                    )
                )
            assert (err.value.code(), err.value.details()) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"task {a.task_id!r} attempt 1 is planned by its host (direct transport): it "
                "ships its decisions (ShipDecisions)",
            )
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch)
            listed = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
            )
            assert list(listed.decisions) == []
    finally:
        await host.close()
