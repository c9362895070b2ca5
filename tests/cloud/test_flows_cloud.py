"""Learned flows in the cloud on both backends: the migration, the store's counts and
retirement, verdicts and judgements in the decision log, FlowService's answers and status
codes, and retrieval at assignment (a scripted host reads the flow from its Assignment, reports
a direct-transport replay with its result, and the learning loop counts it)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import event, inspect, select, text, update

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    flow_service_pb2,
    flow_service_pb2_grpc,
    lease_service_pb2,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from cloud.flows import retrieval
from cloud.flows.learning import AWAITING_SHIP, replay_result
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from cloud.store import convert, decisions, flows, leases, tasks
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.models import AttemptRow, DecisionRow
from host.agent.actions import execute
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.perceive import Perceiver
from planner.decision import Decision, Usage
from planner.observation import observation_from_scene
from planner.tools import Judgement
from tests.cloud.cloud_harness import (
    DRIVER_TEXT,
    ScriptedHost,
    channel,
    columns_added,
    failing_statements,
    lapse,
    logged_text,
    renewal,
    result,
    start_replicas,
    started,
    submit,
    tasks_stub,
    wait_status,
)
from tests.cloud.conftest import SettingsFactory
from tests.support.fakes import FakeModelServer, ScriptedTurn, anthropic_message, tool_use
from tests.support.flows import store_flow


def _columns(sync_conn: object, table: str) -> set[str]:
    return {c["name"] for c in inspect(sync_conn).get_columns(table)}


def _tables(sync_conn: object) -> set[str]:
    return set(inspect(sync_conn).get_table_names())


async def test_migration_0010_is_additive_and_reversible(db_url: str) -> None:
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        row = await store_flow(s)
        logged = await decisions.append(s, "h1", "t-1", 1, _decision())
        await downgrade(s.engine, "0009")
        async with s.engine.connect() as conn:
            assert "flows" not in await conn.run_sync(_tables)
            assert "verdict" not in await conn.run_sync(_columns, "decisions")
            assert "flow_state" not in await conn.run_sync(_columns, "attempts")
            assert "no_replay" not in await conn.run_sync(_columns, "tasks")
        await upgrade(s.engine)
        await check(s.engine)
        (old,) = (await decisions.list_page(s, "t-1", 0, 5, ""))[0]
        assert old.decision_id == logged.decision_id and old.verdict is None
        assert await flows.get(s, row.flow_id) is None  # the table went with the downgrade
    finally:
        await s.close()


def _decision(judged: Judgement | None = None) -> Decision:
    action = types_pb2.Action(purpose="open it", expected_outcome="the 'Display' page is open")
    action.tap.element_id = "e1"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e1"},
        action=action,
        purpose="open it",
        expected_outcome="the 'Display' page is open",
        rationale="r",
        thinking=[],
        usage=Usage(),
        provider="offline",
        model="m",
        latency_s=0.0,
        forced_retry=False,
        system_prompt="s",
        user_prompt="u",
        previous_step=judged,
        target_descriptor=types_pb2.ElementTarget(text="Display", alike_count=1),
    )


async def test_verdicts_and_judgements_are_kept_and_disagreement_is_said(store: Store) -> None:
    first = await decisions.append(store, "h1", "t-v", 1, _decision())
    report = types_pb2.ActionOutcome(
        step_index=1,
        executed=True,
        verdict=types_pb2.VERDICT_MET,
        evidence="looked for the 'Display' page: 'Display' is open",
    )
    assert await decisions.record_outcome(store, "t-v", 1, report)
    second = await decisions.append(
        store, "h1", "t-v", 1, _decision(Judgement("not_met", "still on Settings"))
    )
    assert await decisions.record_judgement(
        store, "t-v", 1, 1, Judgement("not_met", "still on Settings")
    )
    assert not await decisions.record_judgement(store, "t-v", 1, 1, Judgement("met", "later"))
    rows, _ = await decisions.list_page(store, "t-v", 0, 10, "")
    judged, judging = (convert.decision(r) for r in rows)
    assert judged.decision_id == first.decision_id and judging.decision_id == second.decision_id
    assert judged.verification.verdict == types_pb2.VERDICT_MET
    assert judged.verification.model.verdict == types_pb2.VERDICT_NOT_MET
    assert judged.verification.disagree and not judged.verification.checked_by_cloud
    assert judged.outcome.verdict == types_pb2.VERDICT_MET
    assert judged.target.text == "Display"
    assert judging.previous_step.note == "still on Settings"
    # the planner's memory of the step carries the verdict into the next prompt
    (step, _) = await decisions.attempt_steps(store, "t-v", 1)
    assert step.outcome is not None and step.outcome.verdict == "met"


async def test_counts_retire_a_flow_that_keeps_diverging_and_enable_restores_it(
    store: Store,
) -> None:
    row = await store_flow(store)
    again, created = await flows.add(store, convert.flow(row), row.fingerprint, "t-other", 1)
    assert not created and again.flow_id == row.flow_id  # the same path learned twice
    done = await flows.count_use(
        store, row.flow_id, completed=True, diverged_at=0, reason="", retire_after=2
    )
    assert done is not None and done.replays_completed == 1
    await flows.count_use(
        store, row.flow_id, completed=False, diverged_at=2, reason="x", retire_after=2
    )
    last = await flows.count_use(
        store, row.flow_id, completed=False, diverged_at=2, reason="y", retire_after=2
    )
    assert last is not None and last.status == flows.RETIRED
    assert last.divergences_by_step == {"2": 2} and last.last_divergence == "step 2: y"
    assert "retired after 2 divergences in a row" in last.status_reason
    assert [r.flow_id for r in await flows.active(store)] == []
    back = await flows.set_status(store, row.flow_id, flows.ACTIVE, "try again")
    assert back is not None and back.status == flows.ACTIVE and back.consecutive_divergences == 0
    assert await flows.set_status(store, "nope", flows.DISABLED, "x") is None


async def test_retrieval_keeps_its_candidates_until_a_flow_changes_here_or_they_age(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    """Retrieval parses the active flows once and keeps them (a dispatch burst with 1,000 flows
    read and parsed them 1,000 times): a flow this process adds, disables or enables is seen by
    the next retrieval; one another replica enables, within `CANDIDATES_TTL_S`; one another
    replica disables, at once (the flows chosen are checked at hand-out)."""
    clock = [1000.0]
    retriever = retrieval.Retriever(store, CloudSettings(pki_dir=tmp_path), clock=lambda: clock[0])
    goal = "Turn on dark theme"

    async def handed() -> list[str]:
        choice, _ = await retriever._choose("t-r", 1, goal, False)
        return choice.flow_ids

    assert await handed() == []
    row = await store_flow(store)  # learned here: seen at once
    assert await handed() == [row.flow_id]
    await flows.set_status(store, row.flow_id, flows.DISABLED, "operator")
    assert await handed() == []
    await flows.set_status(store, row.flow_id, flows.ACTIVE, "operator")
    assert await handed() == [row.flow_id]

    other = Store.from_url(db_url)  # another replica on the same database
    try:
        await flows.set_status(other, row.flow_id, flows.DISABLED, "operator elsewhere")
        choice, _ = await retriever._choose("t-r", 1, goal, False)
        assert choice.flow_ids == []  # the kept candidates still hold it: checked at hand-out
        assert choice.reason == f"flow {row.flow_id} scored 1.00 but is no longer active"
        assert await handed() == []  # read again after a withdrawn one: none active
        await flows.set_status(other, row.flow_id, flows.ACTIVE, "operator elsewhere")
        assert await handed() == []  # enabled elsewhere: not seen yet...
        clock[0] += retrieval.CANDIDATES_TTL_S
        assert await handed() == [row.flow_id]  # ...and within the bound
    finally:
        await other.close()


async def test_a_flow_disabled_on_another_replica_is_handed_to_no_new_attempt(
    store: Store, db_url: str, pki_dir: Path
) -> None:
    """Two cloud servers on one database. Replica A handed a flow out (its retrieval keeps the
    active flows for `CANDIDATES_TTL_S`), an operator disabled the flow through replica B, and
    A's next assignment still carried it: a direct-transport host replayed it until its first
    renewal named it withdrawn. No new attempt gets it now. A's retrieval clock stands still
    here, so the whole test is within the time its kept candidates serve."""
    row = await store_flow(store)
    async with start_replicas(db_url, pki_dir) as (a, b):
        assert a.retriever is not None
        a.retriever._clock = lambda: 1000.0
        ops_a = channel(a.address, pki_dir, "operator-ops")
        ops_b = channel(b.address, pki_dir, "operator-ops")
        host = ScriptedHost(a.address, pki_dir, "h1")
        try:
            await host.connect(["p1", "p2"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
            await submit(tasks_stub(ops_a), goal="Turn on dark theme")
            first = (await host.next("assignment")).assignment
            assert first.flow.flow_id == row.flow_id  # A keeps the active flows now
            await flow_service_pb2_grpc.FlowServiceStub(ops_b).SetFlowStatus(
                flow_service_pb2.SetFlowStatusRequest(
                    flow_id=row.flow_id, status=types_pb2.FLOW_STATUS_DISABLED, reason="wrong"
                )
            )
            second = (await submit(tasks_stub(ops_a), goal="Turn on dark theme")).task
            assignment = (await host.next("assignment")).assignment
            assert assignment.task_id == second.task_id
            assert not assignment.HasField("flow") and not assignment.alternatives
            reason, candidates = await _choice_on(store, second.task_id, 1)
            assert candidates == [] and reason is not None and "no longer active" in reason
        finally:
            await host.close()
            await ops_a.close()
            await ops_b.close()


async def submit_task(store: Store, goal: str, no_replay: bool = False) -> str:
    spec = tasks.NewTask(goal, 3, 30.0, 3600.0, no_replay=no_replay)
    return (await tasks.submit(store, spec))[0].task.task_id


async def _choice_on(store: Store, task_id: str, attempt: int) -> tuple[str | None, object]:
    async with store.read() as session:
        row = (
            await session.execute(
                select(AttemptRow.flow_reason, AttemptRow.flow_candidates).where(
                    AttemptRow.task_id == task_id, AttemptRow.attempt == attempt
                )
            )
        ).one()
    return row.flow_reason, row.flow_candidates


async def test_a_claim_writes_the_choice_that_needs_no_goal_and_leaves_the_rest(
    store: Store, tmp_path: Path
) -> None:
    """While no flow is active (and for a task that asked for no replay) the choice does not
    depend on the goal: the claim writes it on the attempt it creates and the assignment makes
    no second write. Otherwise, and for a later attempt (which may follow one that diverged),
    the claim leaves it to retrieval."""
    retriever = retrieval.Retriever(store, CloudSettings(pki_dir=tmp_path))
    first = await submit_task(store, "Turn on dark theme")
    claimed = await leases.claim(store, "h1", ["p1"], 2, await retriever.settle())
    assert claimed is not None and claimed.choice_recorded
    assert await _choice_on(store, first, 1) == (retrieval.NO_FLOW, [])

    row = await store_flow(store)  # a flow is active now: the goal matters
    second = await submit_task(store, "Turn on dark theme")
    claimed = await leases.claim(store, "h1", ["p2"], 2, await retriever.settle())
    assert claimed is not None and claimed.task_id == second and not claimed.choice_recorded
    assert await _choice_on(store, second, 1) == (None, None)
    await retriever.for_new_attempt(second, 1, claimed.goal, no_replay=False)
    reason, candidates = await _choice_on(store, second, 1)
    assert reason is not None and reason.startswith("score ") and candidates == [row.flow_id]

    third = await submit_task(store, "Turn on dark theme", no_replay=True)
    claimed = await leases.claim(store, "h1", ["p3"], 2, await retriever.settle())
    assert claimed is not None and claimed.task_id == third and claimed.choice_recorded
    assert await _choice_on(store, third, 1) == (retrieval.NO_REPLAY, [])

    settle = await retriever.settle()
    assert settle(2, False) is None  # a later attempt: retrieval looks for a divergence
    await flows.set_status(store, row.flow_id, flows.DISABLED, "operator")
    assert (await retriever.settle())(2, False) is None


async def test_flow_retrieval_the_database_fails_is_logged_without_the_driver_text(
    cloud: CloudServer, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await store_flow(cloud.store)  # a flow to look for: the claim leaves the choice open
        await host.connect(["p1"])
        with failing_statements(cloud.store, "UPDATE attempts SET flow"):
            task = (await submit(tasks_stub(ch), goal="Turn on dark theme")).task
            # The task runs with the model: no flows, and the host gets it all the same.
            assignment = (await host.next("assignment")).assignment
        assert assignment.task_id == task.task_id and not assignment.HasField("flow")
    finally:
        await host.close()
        await ch.close()
    logged = logged_text(caplog)
    assert f"flow retrieval for {task.task_id}/1 failed: database unavailable" in logged
    assert DRIVER_TEXT not in logged and "6543" not in logged


@pytest.fixture
async def flow_stub(cloud: CloudServer, pki_dir: Path) -> Any:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        yield flow_service_pb2_grpc.FlowServiceStub(ch)
    finally:
        await ch.close()


async def test_flow_service_answers_and_refuses_with_the_documented_codes(
    cloud: CloudServer, flow_stub: Any, pki_dir: Path
) -> None:
    row = await store_flow(cloud.store)
    listed = await flow_stub.ListFlows(flow_service_pb2.ListFlowsRequest())
    (listed_flow,) = listed.flows
    assert listed_flow.flow_id == row.flow_id and not listed_flow.embedding_text
    got = (await flow_stub.GetFlow(flow_service_pb2.GetFlowRequest(flow_id=row.flow_id))).flow
    assert [s.tool_name for s in got.steps] == ["tap", "tap", "tap"] and got.embedding_text
    off = await flow_stub.SetFlowStatus(
        flow_service_pb2.SetFlowStatusRequest(
            flow_id=row.flow_id, status=types_pb2.FLOW_STATUS_DISABLED, reason="wrong app"
        )
    )
    assert off.flow.status == types_pb2.FLOW_STATUS_DISABLED
    assert off.flow.status_reason == "disabled by operator ops: wrong app"
    only_active = await flow_stub.ListFlows(
        flow_service_pb2.ListFlowsRequest(statuses=[types_pb2.FLOW_STATUS_ACTIVE])
    )
    assert not only_active.flows
    for call, request, code, detail in [
        (
            flow_stub.GetFlow,
            flow_service_pb2.GetFlowRequest(flow_id="nope"),
            "NOT_FOUND",
            "flow nope",
        ),
        (flow_stub.GetFlow, flow_service_pb2.GetFlowRequest(), "INVALID_ARGUMENT", "flow_id"),
        # longer than any flow id: malformed, not missing (it was cut and answered NOT_FOUND)
        (
            flow_stub.GetFlow,
            flow_service_pb2.GetFlowRequest(flow_id=row.flow_id + "x" * 5000),
            "INVALID_ARGUMENT",
            "flow_id: at most 32 characters",
        ),
        (
            flow_stub.SetFlowStatus,
            flow_service_pb2.SetFlowStatusRequest(
                flow_id="f" * 33, status=types_pb2.FLOW_STATUS_ACTIVE
            ),
            "INVALID_ARGUMENT",
            "flow_id: at most 32 characters",
        ),
        (
            flow_stub.SetFlowStatus,
            flow_service_pb2.SetFlowStatusRequest(
                flow_id=row.flow_id, status=types_pb2.FLOW_STATUS_RETIRED
            ),
            "INVALID_ARGUMENT",
            "status",
        ),
        (
            flow_stub.ListFlows,
            flow_service_pb2.ListFlowsRequest(page_token="not-ours"),
            "INVALID_ARGUMENT",
            "page_token",
        ),
        (
            flow_stub.ListFlows,
            flow_service_pb2.ListFlowsRequest(page_size=501),
            "INVALID_ARGUMENT",
            "page_size",
        ),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(request)
        assert err.value.code().name == code
        assert (err.value.details() or "").startswith(detail)
    # hosts may not read or change flows
    host_channel = channel(cloud.address, pki_dir, "host-h1")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await flow_service_pb2_grpc.FlowServiceStub(host_channel).ListFlows(
                flow_service_pb2.ListFlowsRequest()
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await host_channel.close()


async def test_flows_changed_between_pages_are_listed_once_each(
    cloud: CloudServer, flow_stub: Any
) -> None:
    """ListFlows paged on the time a flow last changed: a flow turned off or on between two
    page reads moved to the head of the listing, so one not listed yet was skipped (and one
    listed already, had the change been an older flow's, came again). Every flow is listed
    exactly once however many change while an operator pages."""
    made = [
        (await store_flow(cloud.store, f"Turn on dark theme on phone {i}", f"t-{i}")).flow_id
        for i in range(6)
    ]
    listed: list[str] = []
    token = ""
    while True:
        page = await flow_stub.ListFlows(
            flow_service_pb2.ListFlowsRequest(page_size=2, page_token=token)
        )
        listed += [f.flow_id for f in page.flows]
        token = page.next_page_token
        if not token:
            break
        for flow_id in made:  # each flow, listed or not, changes between the page reads
            await flow_stub.SetFlowStatus(
                flow_service_pb2.SetFlowStatusRequest(
                    flow_id=flow_id, status=types_pb2.FLOW_STATUS_DISABLED, reason="paging"
                )
            )
    assert sorted(listed) == sorted(made), listed


async def _looked_at(store: Store, task_id: str, attempt: int) -> str | None:
    """The attempt's `flow_state` once the learning loop, which looks after the result was
    acknowledged, has looked at it (the last one read if it has not, for the assertion)."""
    state = None
    for _ in range(400):
        async with store.read() as session:
            state = await session.scalar(
                select(AttemptRow.flow_state).where(
                    AttemptRow.task_id == task_id, AttemptRow.attempt == attempt
                )
            )
        if state is not None and state not in flows.LOOKING:
            break
        await asyncio.sleep(0.05)
    return state


async def _flows_used(store: Store, flow_id: str, uses: int) -> Any:
    for _ in range(400):
        row = await flows.get(store, flow_id)
        if row is not None and row.uses >= uses:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError("the learning loop did not count the use")


async def test_a_direct_attempt_looked_at_again_for_its_shipped_log_is_counted_once(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A direct-transport host's result (with its replay report) can come before its shipped
    decisions: the learning loop counts the replay, waits for the log, and each decision shipped
    hands the attempt back to it. It learns then, but does not count the replay again (it did:
    one diverged attempt shipped in three batches retired its flow alone)."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        await submit(ops, goal="Turn on dark theme")
        a = (await host.next("assignment")).assignment
        assert a.flow.flow_id == row.flow_id
        report = result(a)
        report.result.replay.CopyFrom(_diverged_at_2(row.flow_id))
        await host.send(report)
        await host.next("result_ack")
        assert (await _flows_used(cloud.store, row.flow_id, 1)).divergences == 1
        ship = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        for n in range(3):  # the outbox catches up in three batches, none ending the log
            await _flow_state_is(cloud.store, a, "awaiting-ship")
            entry = decision_log_service_pb2.ShippedDecision(
                host_decision_id=f"d{n}", task_id=a.task_id, attempt=a.attempt,
                lease_id=a.lease_id, decision=types_pb2.Decision(
                    tool_name="press_key", action=types_pb2.Action(
                        press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_BACK)
                    ), provider="offline", model="m",
                ),
            )  # fmt: skip
            await ship.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]))
            assert cloud.learner is not None
            cloud.learner.wake.set()
        await _flow_state_is(cloud.store, a, "awaiting-ship")
        again = await flows.get(cloud.store, row.flow_id)
        assert again is not None
        assert (again.uses, again.divergences, again.status) == (1, 1, flows.ACTIVE)
    finally:
        await host.close()
        await host_ch.close()


async def test_a_complete_shipped_while_the_loop_reads_the_log_is_not_left_waiting(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host ships its last decisions as it sends its result, so the `complete` can land
    after the learning loop read the log and before it marked the attempt "awaiting-ship":
    the hand-back then found the attempt still taken and changed nothing, and no later
    decision ever came to wake it (the success was never learned)."""
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    read = decisions.attempt_rows
    shipped: list[str] = []

    async def read_then_ship(store: Store, task_id: str, attempt: int) -> list[Any]:
        rows = await read(store, task_id, attempt)
        if not shipped:  # the host's outbox catches up just after the loop looked
            done = _decision()
            done.tool_name, done.arguments = "complete", {"success": True, "reason": "done"}
            done.action = types_pb2.Action(complete=types_pb2.CompleteAction(success=True))
            await decisions.append_shipped(
                store, "h1", task_id, attempt, "last", done, None, retire_after=3
            )
            shipped.append(task_id)
        return rows

    monkeypatch.setattr(decisions, "attempt_rows", read_then_ship)
    try:
        await submit(ops, goal="Turn on dark theme")
        a = (await host.next("assignment")).assignment
        await host.send(result(a))
        await host.next("result_ack")
        await _flow_state_is(cloud.store, a, "no-flow")  # looked at again, with the whole log
        assert shipped == [a.task_id]
    finally:
        await host.close()


async def test_a_shipped_divergence_is_on_the_attempt_before_any_result(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A direct-transport host's replay that diverged is in its shipped log at once, but the
    attempt only learned of it from the result: an attempt that ends with none (the host
    crashed, the lease ran out) left the next attempt handed the same flow and the flow's
    divergence uncounted. The shipped handover is written on the attempt as it is logged."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        task = (await submit(ops, goal="Turn on dark theme")).task
        a = (await host.next("assignment")).assignment
        assert a.flow.flow_id == row.flow_id
        handover = types_pb2.Decision(
            tool_name="press_key", provider="offline", model="m", flow_id=row.flow_id,
            flow_step=2, replay_divergence="its target is not here",
            action=types_pb2.Action(press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_BACK)),
        )  # fmt: skip
        entry = decision_log_service_pb2.ShippedDecision(
            host_decision_id="h", task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id,
            decision=handover,
        )  # fmt: skip
        ship = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        await ship.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]))
        await ship.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]))
        assert await flows.diverged_before(cloud.store, task.task_id, 2) == 1
        async with cloud.store.read() as session:
            attempt = await session.scalar(
                select(AttemptRow).where(
                    AttemptRow.task_id == a.task_id, AttemptRow.attempt == a.attempt
                )
            )
        assert attempt is not None
        assert (attempt.flow_id, attempt.replay_diverged_step, attempt.replay_divergence) == (
            row.flow_id, 2, "its target is not here",
        )  # fmt: skip
    finally:
        await host.close()
        await host_ch.close()


async def test_a_shipped_handover_about_a_flow_the_attempt_was_not_handed_is_not_counted(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A shipped decision's replay handover was counted on whatever flow it named: a host could
    write divergences (which retire a flow) on a flow its attempt was never handed, as the
    Lease stream's replay report cannot. The decision is logged (the phone did the step);
    its handover, which the cloud cannot trust, is left out, as a result's replay report is."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        await submit(ops, goal="Call the pharmacy")
        a = (await host.next("assignment")).assignment
        assert not a.HasField("flow")
        await host.send(result(a))
        await host.next("result_ack")
        await _flow_state_is(cloud.store, a, "awaiting-ship")  # looked at: a handover is late
        handover = types_pb2.Decision(
            tool_name="press_key", provider="offline", model="m", flow_id=row.flow_id,
            flow_step=2, replay_divergence="its target is not here",
            action=types_pb2.Action(press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_BACK)),
        )  # fmt: skip
        entry = decision_log_service_pb2.ShippedDecision(
            host_decision_id="h", task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id,
            decision=handover,
        )  # fmt: skip
        ship = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        request = decision_log_service_pb2.ShipDecisionsRequest(entries=[entry])
        (ack,) = (await ship.ShipDecisions(request)).acks
        assert ack.step_index == 1
        flow = await flows.get(cloud.store, row.flow_id)
        assert flow is not None
        assert (flow.uses, flow.divergences, flow.status) == (0, 0, flows.ACTIVE)
        (logged,), _ = await decisions.list_page(cloud.store, a.task_id, a.attempt, 10, "")
        assert (logged.flow_id, logged.replay_divergence) == (None, None)
    finally:
        await host.close()
        await host_ch.close()


async def test_a_complete_shipped_again_after_a_database_failure_wakes_the_loop(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """The database fails after a shipped `complete` was inserted and before the attempt the
    learning loop left waiting was handed back (PostgreSQL restarting between the two writes:
    SQLSTATE 57P01, raised here by a trigger so it falls in that instant). The host's outbox
    sends the entry again; the cloud finds it logged and used to answer with that alone, so
    the attempt stayed "awaiting-ship" and its success was never learned."""
    if cloud.store.is_sqlite:
        pytest.skip("the failure is a PostgreSQL shutdown's (a trigger raising 57P01)")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        await submit(ops, goal="Turn on dark theme")
        a = (await host.next("assignment")).assignment
        await host.send(result(a))
        await host.next("result_ack")
        await _flow_state_is(cloud.store, a, "awaiting-ship")  # no decision shipped yet
        async with cloud.store.write() as session:
            for statement in (
                "CREATE FUNCTION amc_test_shutdown() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'terminating connection due to administrator command'"
                " USING ERRCODE = '57P01'; END $$",
                "CREATE TRIGGER amc_test_shutdown BEFORE UPDATE OF flow_state ON attempts FOR"
                " EACH ROW WHEN (NEW.flow_state = 'shipped') EXECUTE FUNCTION"
                " amc_test_shutdown()",
            ):
                await session.execute(text(statement))
        entry = decision_log_service_pb2.ShippedDecision(
            host_decision_id="last", task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id,
            decision=types_pb2.Decision(
                tool_name="complete", provider="offline", model="m",
                action=types_pb2.Action(complete=types_pb2.CompleteAction(success=True)),
            ),
        )  # fmt: skip
        ship = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        request = decision_log_service_pb2.ShipDecisionsRequest(entries=[entry])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ship.ShipDecisions(request)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        async with cloud.store.write() as session:
            await session.execute(text("DROP TRIGGER amc_test_shutdown ON attempts"))
        again = await ship.ShipDecisions(request)  # the outbox's next try
        assert again.acks[0].duplicate
        assert cloud.learner is not None
        cloud.learner.wake.set()
        await _flow_state_is(cloud.store, a, "no-flow")  # looked at again, with the whole log
    finally:
        await host.close()
        await host_ch.close()


def _handover(a: lease_service_pb2.Assignment, flow_id: str, hid: str, step: int) -> Any:
    """A shipped decision of `a`'s replay handing over to the model at flow step `step`."""
    return decision_log_service_pb2.ShippedDecision(
        host_decision_id=hid, task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id,
        decision=types_pb2.Decision(
            tool_name="press_key", provider="offline", model="m", flow_id=flow_id,
            flow_step=step, replay_divergence="its target is not here",
            action=types_pb2.Action(press_key=types_pb2.PressKeyAction(key=types_pb2.KEY_BACK)),
        ),
    )  # fmt: skip


async def test_a_divergence_shipped_after_the_loop_looked_counts_on_the_flow_once(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A host offline for longer than its lease ships its backlog when it is back: the attempt
    had ended (lease expired) and the learning loop had looked at it with no replay known, so
    the handover was written on the attempt but never counted on the flow (a flow diverging
    on every offline host was never retired). It counts once: not again when resent, nor for
    a second handover of the same attempt."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        await submit(ops, goal="Turn on dark theme", max_attempts=1)
        a = (await host.next("assignment")).assignment
        assert a.flow.flow_id == row.flow_id
        await lapse(cloud.store, a.task_id)
        # Swept here, or by the replica's own sweeper if it got there first.
        await leases.sweep_expired(cloud.store)
        ended = await wait_status(ops, a.task_id, types_pb2.TASK_STATUS_FAILED)
        assert ended.attempts[0].failure_reason == "lease expired"
        assert cloud.learner is not None
        cloud.learner.wake.set()
        await _flow_state_is(cloud.store, a, "ended")
        ship = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        first = decision_log_service_pb2.ShipDecisionsRequest(
            entries=[_handover(a, row.flow_id, "h", 2)]
        )
        await ship.ShipDecisions(first)
        await ship.ShipDecisions(first)  # a resend
        await ship.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(
                entries=[_handover(a, row.flow_id, "h2", 3)]
            )
        )
        counted = await flows.get(cloud.store, row.flow_id)
        assert counted is not None
        assert (counted.uses, counted.divergences, counted.consecutive_divergences) == (1, 1, 1)
        assert counted.divergences_by_step == {"2": 1}
        assert counted.last_divergence == "step 2: its target is not here"
    finally:
        await host.close()
        await host_ch.close()


async def test_a_divergence_shipped_while_the_loop_looks_counts_once(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog's handover lands after the loop took the ended attempt and before it
    counted it: the loop counts the attempt as it is when it counts, and the shipping, which
    found it taken and not counted yet, leaves the count to the loop (once, not twice)."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    read = decisions.attempt_rows
    shipped: list[str] = []

    async def read_then_ship(store: Store, task_id: str, attempt: int) -> list[Any]:
        rows = await read(store, task_id, attempt)
        if not shipped:  # the host is back just after the loop took the attempt
            handover = _decision()
            handover.flow_id, handover.flow_step = row.flow_id, 2
            handover.replay_divergence = "its target is not here"
            await decisions.append_shipped(
                store, "h1", task_id, attempt, "h", handover, None, retire_after=3
            )
            shipped.append(task_id)
        return rows

    monkeypatch.setattr(decisions, "attempt_rows", read_then_ship)
    try:
        await submit(ops, goal="Turn on dark theme", max_attempts=1)
        a = (await host.next("assignment")).assignment
        await lapse(cloud.store, a.task_id)
        await leases.sweep_expired(cloud.store)
        assert cloud.learner is not None
        cloud.learner.wake.set()
        await _flow_state_is(cloud.store, a, "ended")
        assert shipped == [a.task_id]
        counted = await flows.get(cloud.store, row.flow_id)
        assert counted is not None
        assert (counted.uses, counted.divergences, counted.divergences_by_step) == (1, 1, {"2": 1})
    finally:
        await host.close()


async def test_a_late_result_after_the_loop_looked_is_counted_and_looked_at_again(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A result that comes after its lease ran out is accepted (late) and can succeed the task,
    but the learning loop had looked at the lapsed attempt already and never did again: its
    replay report was not counted on the flow and its success was never learned. The late
    result hands the attempt back: counted once (its handover shipped afterwards adds nothing),
    then waiting for its shipped log like any direct success."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        await submit(ops, goal="Turn on dark theme", max_attempts=1)
        a = (await host.next("assignment")).assignment
        await lapse(cloud.store, a.task_id)
        await leases.sweep_expired(cloud.store)
        assert cloud.learner is not None
        cloud.learner.wake.set()
        await _flow_state_is(cloud.store, a, "ended")
        report = result(a)
        report.result.replay.CopyFrom(_diverged_at_2(row.flow_id))
        await host.send(report)
        answer = await host.next()
        if answer.WhichOneof("kind") == "revoked":  # the sweep's, before or after the result
            assert answer.revoked.reason == lease_service_pb2.REVOKE_REASON_EXPIRED, answer
            answer = await host.next()
        assert answer.WhichOneof("kind") == "result_ack", answer
        ack = answer.result_ack
        assert ack.late and ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        cloud.learner.wake.set()
        await _flow_state_is(cloud.store, a, "awaiting-ship")
        ship = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        await ship.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(
                entries=[_handover(a, row.flow_id, "h", 2)]
            )
        )
        counted = await flows.get(cloud.store, row.flow_id)
        assert counted is not None
        assert (counted.uses, counted.divergences, counted.divergences_by_step) == (1, 1, {"2": 1})
    finally:
        await host.close()
        await host_ch.close()


def _diverged_at_2(flow_id: str) -> types_pb2.FlowReplayReport:
    """A host's report of a replay that diverged at step 2 (after one replayed step)."""
    return types_pb2.FlowReplayReport(
        flow_id=flow_id, steps_replayed=1, diverged=True, diverged_at_step=2,
        reason="its target is not here",
    )  # fmt: skip


async def test_a_direct_replay_the_model_finished_is_not_counted_as_completed(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A direct-transport host's replay that stopped without a divergence (a switch already
    set, the flow withdrawn mid-replay) and was finished by the model: the cloud took a
    succeeded attempt with steps replayed and no divergence for a replay that ran to its end,
    counted it in `replays_completed`, reset the flow's run of divergences, and never learned
    from the run. The host now says whether its replay completed (`FlowReplayReport.completed`);
    a host that does not say is read as before."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    assert cloud.learner is not None

    async def attempt(report: types_pb2.FlowReplayReport) -> lease_service_pb2.Assignment:
        await submit(ops, goal="Turn on dark theme")
        a = (await host.next("assignment")).assignment
        assert a.flow.flow_id == row.flow_id
        done = result(a)
        done.result.replay.CopyFrom(report)
        await host.send(done)
        await host.next("result_ack")
        return a

    try:
        await attempt(_diverged_at_2(row.flow_id))
        assert (await _flows_used(cloud.store, row.flow_id, 1)).consecutive_divergences == 1
        stopped = types_pb2.FlowReplayReport(flow_id=row.flow_id, steps_replayed=2)
        stopped.completed = False
        a = await attempt(stopped)
        counted = await _flows_used(cloud.store, row.flow_id, 2)
        assert (counted.replays_completed, counted.consecutive_divergences) == (0, 1)
        # learned from once its host's log is in (a completed replay is "replayed": not learned)
        await _flow_state_is(cloud.store, a, AWAITING_SHIP)
        async with cloud.store.read() as session:
            kept = await session.scalar(
                select(AttemptRow.replay_completed).where(
                    AttemptRow.task_id == a.task_id, AttemptRow.attempt == a.attempt
                )
            )
        assert kept is False

        ran = types_pb2.FlowReplayReport(flow_id=row.flow_id, steps_replayed=3, completed=True)
        a = await attempt(ran)
        counted = await _flows_used(cloud.store, row.flow_id, 3)
        assert (counted.replays_completed, counted.consecutive_divergences) == (1, 0)
        await _flow_state_is(cloud.store, a, "replayed")
    finally:
        await host.close()


async def test_migration_0037_adds_why_a_replay_set_its_flow_aside_and_back(
    db_url: str,
) -> None:
    """Both backends: 0037 adds `decisions.flow_set_aside`, its downgrade drops it, and the
    schema matches the models again after the upgrade."""
    assert await columns_added(db_url, "decisions", "0036", "0037") == {"flow_set_aside"}


async def test_migration_0036_adds_whether_a_direct_replay_completed_and_back(
    db_url: str,
) -> None:
    """Both backends: 0036 adds `attempts.replay_completed`, its downgrade drops it, and the
    schema matches the models again after the upgrade."""
    assert await columns_added(db_url, "attempts", "0035", "0036") == {"replay_completed"}


async def _flow_state_is(store: Store, a: lease_service_pb2.Assignment, state: str) -> None:
    """Wait until the learning loop has left the attempt with `state` (at most 10 s)."""
    for _ in range(200):
        async with store.read() as session:
            found = await session.scalar(
                select(AttemptRow.flow_state).where(
                    AttemptRow.task_id == a.task_id, AttemptRow.attempt == a.attempt
                )
            )
        if found == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the attempt's learning mark is {found!r}, not {state!r}")


async def test_an_assignment_carries_the_flow_and_a_reported_replay_is_counted(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    row = await store_flow(cloud.store)
    await store_flow(cloud.store, goal="Turn off dark theme", task_id="t-off")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"])
    try:
        task = (await submit(ops, goal="Turn on dark theme")).task
        a = (await host.next("assignment")).assignment
        assert a.task_id == task.task_id
        assert a.flow.flow_id == row.flow_id and a.flow.score == 1.0
        assert a.flow.scorer == "lexical" and len(a.flow.steps) == 3
        assert not a.alternatives  # the "off" flow is the opposite goal
        report = result(a)
        report.result.replay.CopyFrom(
            types_pb2.FlowReplayReport(flow_id=row.flow_id, steps_replayed=3)
        )
        await host.send(report)
        assert (await host.next("result_ack")).result_ack.task_status == (
            types_pb2.TASK_STATUS_SUCCEEDED
        )
        counted = await _flows_used(cloud.store, row.flow_id, 1)
        assert counted.replays_completed == 1
        shown = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        assert got.attempts[0].flow.flow_id == row.flow_id
        assert got.attempts[0].flow.steps_replayed == 3
        assert shown.task_id == task.task_id

        # no replay on request; and a diverged report counts where it diverged
        plain = (await submit(ops, goal="Turn on dark theme", no_replay=True)).task
        b = (await host.next("assignment")).assignment
        assert b.task_id == plain.task_id and not b.HasField("flow")
        third = (await submit(ops, goal="Turn on dark theme")).task
        await host.send(result(b))
        await host.next("result_ack")
        c = (await host.next("assignment")).assignment
        assert c.task_id == third.task_id and c.flow.flow_id == row.flow_id
        diverged = result(c)
        diverged.result.replay.CopyFrom(_diverged_at_2(row.flow_id))
        await host.send(diverged)
        await host.next("result_ack")
        counted = await _flows_used(cloud.store, row.flow_id, 2)
        assert counted.divergences == 1 and counted.divergences_by_step == {"2": 1}
    finally:
        await host.close()
    assert isinstance(lease_service_pb2.Assignment().flow, types_pb2.Flow)


async def test_a_direct_hosts_renewal_names_a_handed_flow_disabled_since(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A direct-transport host replays the flows its assignment carried, and nothing on its
    lease stream said one was disabled (or retired) meanwhile: it replayed it to its end.
    Each renewal now names the attempt's handed flows that are no longer active."""
    row = await store_flow(cloud.store)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    try:
        await submit(ops, goal="Turn on dark theme")
        a = (await host.next("assignment")).assignment
        assert a.flow.flow_id == row.flow_id
        await host.send(renewal(a, step=1))
        assert list((await host.next("renewed")).renewed.withdrawn_flows) == []
        await flows.set_status(cloud.store, row.flow_id, flows.DISABLED, "the app changed")
        await host.send(renewal(a, step=2))
        assert list((await host.next("renewed")).renewed.withdrawn_flows) == [row.flow_id]
    finally:
        await host.close()


async def test_a_direct_hosts_renewal_of_an_attempt_without_flows_reads_no_flow(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """Renewals are the lease path's hot loop and nearly no attempt is handed a flow: the
    stream remembers what each assignment carried, so such a renewal reads nothing about
    flows (it read the attempt's handed flows at every renewal)."""
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    try:
        await submit(ops, goal="Turn on dark theme")
        a = (await host.next("assignment")).assignment
        assert not a.HasField("flow")
        event.listen(cloud.store.engine.sync_engine, "before_cursor_execute", seen)
        for step in (1, 2, 3):
            await host.send(renewal(a, step=step))
            assert list((await host.next("renewed")).renewed.withdrawn_flows) == []
    finally:
        event.remove(cloud.store.engine.sync_engine, "before_cursor_execute", seen)
        await host.close()
    assert not [s for s in statements if "flow_candidates" in s or "FROM flows" in s], statements


async def test_a_replay_report_is_left_out_unless_it_names_a_flow_the_attempt_was_handed(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A host's replay report is checked against the flows the cloud handed that attempt: one
    naming another flow (which would overwrite the attempt's record of its flow and count a
    divergence on a flow nobody replayed, even retire it) or a step the handed flow does not
    have is left out: the result is recorded (the phone did the work) and nothing is counted on
    any flow. A true report is counted on the handed flow."""
    row = await store_flow(cloud.store)
    other = await store_flow(cloud.store, goal="Turn off dark theme", task_id="t-off")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
    try:

        def false_reports(steps: int) -> list[types_pb2.FlowReplayReport]:
            return [
                _diverged_at_2(other.flow_id),
                types_pb2.FlowReplayReport(flow_id="f" * 40),
                types_pb2.FlowReplayReport(flow_id=row.flow_id, steps_replayed=steps + 1),
                types_pb2.FlowReplayReport(
                    flow_id=row.flow_id,
                    steps_replayed=1,
                    diverged=True,
                    diverged_at_step=steps + 2,
                    reason="?",
                ),
            ]

        for i in range(4):
            task = (await submit(ops, goal="Turn on dark theme")).task
            a = (await host.next("assignment")).assignment
            assert a.flow.flow_id == row.flow_id and not a.alternatives
            report = result(a)
            report.result.replay.CopyFrom(false_reports(len(a.flow.steps))[i])
            await host.send(report)
            ack = (await host.next("result_ack")).result_ack
            assert ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
            got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
            assert got.status == types_pb2.TASK_STATUS_SUCCEEDED
        task = (await submit(ops, goal="Turn on dark theme")).task
        a = (await host.next("assignment")).assignment
        report = result(a)
        report.result.replay.CopyFrom(_diverged_at_2(row.flow_id))
        await host.send(report)
        ack = (await host.next("result_ack")).result_ack
        assert ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        # The learning loop takes ended attempts oldest first: once it counted this one, it
        # has looked at the four before it, and counted none of their reports.
        counted = await _flows_used(cloud.store, row.flow_id, 1)
        assert (counted.uses, counted.divergences) == (1, 1)
        assert counted.divergences_by_step == {"2": 1}
        untouched = await flows.get(cloud.store, other.flow_id)
        assert untouched is not None and (untouched.uses, untouched.divergences) == (0, 0)
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        assert got.attempts[0].flow.flow_id == row.flow_id
    finally:
        await host.close()


@pytest.mark.parametrize("died", [flows.WORKING, flows.COUNTED])
async def test_an_attempt_left_taken_by_a_stopped_replica_is_taken_back_and_counted_once(
    make_settings: SettingsFactory, pki_dir: Path, died: str
) -> None:
    """A replica stopped while its learning loop looked at an attempt (killed mid-learn, or its
    closing mark failed while the database was away) left the attempt marked taken, and no
    replica ever looked at it again: its replay was never counted (`WORKING`) or its success
    never learned (`COUNTED`). Another replica takes it back once the mark is older than
    `flows.RECLAIM_AFTER` (not before: the first may still be at it), only one of two racing
    replicas gets it, and the replay is counted once whichever way it died."""
    async with started(make_settings()) as first:
        assert first.learner is not None
        looking = asyncio.Event()

        async def dies_here(attempt: AttemptRow, *, counted: bool = False) -> str:
            if died == flows.COUNTED:  # as `learn` counts, then stuck (an embedding call)
                await flows.count_attempt(
                    first.store, attempt.id, lambda now: replay_result(now, []), retire_after=3
                )
            looking.set()
            await asyncio.Event().wait()  # until the replica stops
            raise AssertionError("unreachable")

        first.learner.learn = dies_here  # type: ignore[method-assign]
        row = await store_flow(first.store)
        async with (
            ScriptedHost(first.address, pki_dir, "h1") as host,
            channel(first.address, pki_dir, "operator-ops") as ops_ch,
        ):
            await host.connect(["s1"])
            await submit(tasks_stub(ops_ch))
            a = (await host.next("assignment")).assignment
            assert a.flow.flow_id == row.flow_id
            report = result(a)
            report.result.replay.CopyFrom(
                types_pb2.FlowReplayReport(flow_id=row.flow_id, steps_replayed=3)
            )
            await host.send(report)
            await host.next("result_ack")
            await asyncio.wait_for(looking.wait(), 10)
    url = make_settings().database_url
    stores = [Store.from_url(url), Store.from_url(url)]
    second: CloudServer | None = None
    try:
        left = await flows.get(stores[0], row.flow_id)
        assert left is not None and left.uses == (1 if died == flows.COUNTED else 0)
        assert await flows.claim_ended_attempt(stores[0]) is None  # taken just now: left be
        await _taken_at(stores[0], a, stores[0].now() - flows.RECLAIM_AFTER * 2)
        got = await asyncio.gather(*(flows.claim_ended_attempt(s) for s in stores))
        (taken,) = [g for g in got if g is not None]  # one replica takes it back
        assert taken[0].task_id == a.task_id and taken[1] == (died == flows.COUNTED)
        assert taken[0].flow_state == (flows.RELOOK if taken[1] else flows.WORKING)
        if not taken[1]:  # the first was slow, not dead: both count, the use is counted once
            for _ in range(2):
                await flows.count_attempt(
                    stores[1], taken[0].id, lambda now: replay_result(now, []), retire_after=3
                )
        await _taken_at(stores[0], a, None)  # that one died too, before migration 0016
        second = await build_server(make_settings())
        await second.start()
        await _flow_state_is(second.store, a, "replayed")
        counted = await flows.get(second.store, row.flow_id)
        assert counted is not None
        assert (counted.uses, counted.replays_completed) == (1, 1)
    finally:
        if second is not None:
            await second.stop(0.5)
        for s in stores:
            await s.close()


async def _taken_at(
    store: Store, a: lease_service_pb2.Assignment, when: dt.datetime | None
) -> None:
    """What a replica that took the attempt at `when` (None: before migration 0016) left."""
    async with store.write() as session:
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.task_id == a.task_id, AttemptRow.attempt == a.attempt)
            .values(flow_taken_at=when)
        )


async def test_migration_0016_adds_when_the_loop_took_an_attempt_and_back(db_url: str) -> None:
    """Both backends: 0016 adds `attempts.flow_taken_at`, its downgrade drops it, and the
    schema matches the models again after the upgrade. (Read from each catalogue: SQLite's
    reflection warns about the expression index of 0015.)"""
    assert await columns_added(db_url, "attempts", "0015", "0016") == {"flow_taken_at"}


async def test_a_look_the_database_fails_is_taken_again_not_given_up(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """The database fails while the learning loop counts an attempt's replay (PostgreSQL
    restarting: SQLSTATE 57P01, raised once here by a trigger on the flow's count) and is back
    at once. The loop marked the attempt "error" for good: its replay was never counted, its
    success never learned. It now hands the attempt back and counts it on its next pass."""
    if cloud.store.is_sqlite:
        pytest.skip("the failure is a PostgreSQL shutdown's (a trigger raising 57P01)")
    row = await store_flow(cloud.store)
    async with cloud.store.write() as session:
        for statement in (
            "CREATE SEQUENCE amc_test_once",
            "CREATE FUNCTION amc_test_shutdown() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF nextval('amc_test_once') = 1 THEN RAISE EXCEPTION 'terminating"
            " connection due to administrator command' USING ERRCODE = '57P01'; END IF;"
            " RETURN NEW; END $$",
            "CREATE TRIGGER amc_test_shutdown BEFORE UPDATE OF uses ON flows FOR EACH ROW"
            " EXECUTE FUNCTION amc_test_shutdown()",
        ):
            await session.execute(text(statement))
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["s1"])
        await submit(ops)
        a = (await host.next("assignment")).assignment
        assert a.flow.flow_id == row.flow_id
        report = result(a)
        report.result.replay.CopyFrom(
            types_pb2.FlowReplayReport(flow_id=row.flow_id, steps_replayed=3)
        )
        await host.send(report)
        await host.next("result_ack")
        await _flow_state_is(cloud.store, a, "replayed")  # its next pass (after a pause)
        async with cloud.store.read() as session:
            assert await session.scalar(text("SELECT is_called FROM amc_test_once"))  # it failed
        counted = await flows.get(cloud.store, row.flow_id)
        assert counted is not None and (counted.uses, counted.replays_completed) == (1, 1)
    finally:
        await host.close()


async def _drive(
    planner: Any,
    a: Any,
    phone: VirtualPhone,
    *,
    outcomes: bool,
    skip_step: int = 0,
    after_step: Callable[[int], Awaitable[None]] | None = None,
) -> list[types_pb2.Decision]:
    """A host's loop against the real cloud's Decide on a virtual phone: perceive, decide,
    execute (except at `skip_step`: the tap lands but nothing happens, as under a dialog),
    and report each step's outcome only when `outcomes` (a host that does not know it sends
    none: after a restart, or written in another language); `after_step` runs after each
    step's action."""
    driver, perceiver = VirtualDriver(phone), Perceiver(ocr=None, retry_delay_s=0.0)
    made: list[types_pb2.Decision] = []
    outcome: types_pb2.ActionOutcome | None = None
    for step in range(1, 31):
        scene = perceiver.perceive(driver, False).scene
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scene),
            step_key=str(step),
        )
        if outcome is not None and outcomes:
            request.previous_outcome.CopyFrom(outcome)
        decision = (await planner.Decide(request)).decision
        made.append(decision)
        if decision.tool_name == "complete":
            return made
        ran = step == skip_step or execute(driver, decision.action, scene).ok
        outcome = types_pb2.ActionOutcome(step_index=decision.step_index, executed=ran)
        if after_step is not None:
            await after_step(step)
    raise AssertionError(f"no complete in 30 steps: {[d.tool_name for d in made]}")


async def _learn_dark_theme(
    cloud: CloudServer, host: ScriptedHost, planner: Any, ops_ch: grpc.aio.Channel
) -> tuple[Any, list[types_pb2.Decision]]:
    """One "Turn on dark theme" run on a fresh virtual phone, and the flow the cloud learned
    from it (with the run's decisions)."""
    await submit(tasks_stub(ops_ch), goal="Turn on dark theme")
    a = (await host.next("assignment")).assignment
    learned = await _drive(planner, a, VirtualPhone("v"), outcomes=True)
    await host.send(result(a, step=len(learned)))
    await host.next("result_ack")
    for _ in range(400):  # the learning loop runs after the result was acknowledged
        if await flows.active(cloud.store):
            break
        await asyncio.sleep(0.05)
    (row,) = await flows.active(cloud.store)
    return row, learned


async def test_a_flow_disabled_mid_replay_is_not_replayed_further(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """`amc flows disable` says "Stop replaying a flow": an attempt handed the flow before
    went on replaying it to its end, step after step, because Decide read the attempt's
    flows whatever their status. The next step after the disable is the model's now."""
    cloud = offline_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
    flow_ops: Any = flow_service_pb2_grpc.FlowServiceStub(ops_ch)
    try:
        await host.connect(["v"])
        row, _ = await _learn_dark_theme(cloud, host, planner, ops_ch)
        await submit(tasks_stub(ops_ch), goal="Turn on dark theme")
        b = (await host.next("assignment")).assignment
        assert b.flow.flow_id == row.flow_id

        async def disable_after_first(step: int) -> None:
            if step == 1:
                await flow_ops.SetFlowStatus(
                    flow_service_pb2.SetFlowStatusRequest(
                        flow_id=row.flow_id,
                        status=types_pb2.FLOW_STATUS_DISABLED,
                        reason="the Settings app changed",
                    )
                )

        phone = VirtualPhone("v")
        made = await _drive(planner, b, phone, outcomes=True, after_step=disable_after_first)
        assert made[0].mode == types_pb2.PLANNER_MODE_REPLAY
        assert [d.mode for d in made[1:]] == [types_pb2.PLANNER_MODE_COMPACT] * (len(made) - 1)
        assert phone.state.flag("dark_theme")
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()


async def test_a_replayed_step_whose_outcome_the_host_does_not_send_is_still_checked(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """A host may leave `previous_outcome` unset (it does not know it: restarted, or another
    language's host). The replay then checked nothing of the step it had just replayed and
    answered its `complete` with success: the flow's last tap landed on a screen where it did
    nothing, and the task succeeded with "'Dark theme' is on" while the switch was off."""
    cloud = offline_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
    try:
        await host.connect(["v"])
        row, learned = await _learn_dark_theme(cloud, host, planner, ops_ch)
        taps = sum(1 for d in learned if d.tool_name == "tap")

        await submit(tasks_stub(ops_ch), goal="Turn on dark theme")
        b = (await host.next("assignment")).assignment
        assert b.flow.flow_id == row.flow_id
        phone = VirtualPhone("v")
        replayed = await _drive(planner, b, phone, outcomes=False, skip_step=taps)
        handover = next((d for d in replayed if d.replay_divergence), None)
        assert handover is not None, [(d.mode, d.tool_name) for d in replayed]
        assert handover.flow_step == taps
        assert "not met" in handover.replay_divergence
        assert replayed[-1].mode != types_pb2.PLANNER_MODE_REPLAY
        assert phone.state.flag("dark_theme")
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()


async def test_a_run_whose_last_step_was_found_not_met_teaches_no_flow(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """The model claimed success right after a step the checker found not met (the tap on the
    'Dark theme' switch did nothing, the switch stayed off). The attempt succeeded on the
    model's word, and the learning loop made a flow of it: every replay then ended in
    `complete` with success on a screen where the last step had never been seen to work."""
    cloud = anthropic_cloud

    def tap(element_id: str, purpose: str, expected: str) -> ScriptedTurn:
        arguments = {"element_id": element_id, "purpose": purpose, "expected_outcome": expected}
        return anthropic_message(tool_use("tap", arguments))

    model.script_anthropic(
        tap("e3", "open 'Settings'", "the 'Settings' page is open"),
        tap("e25", "open 'Display'", "the 'Display' page is open"),
        tap("e14", "turn 'Dark theme' on", "the 'Dark theme' switch is on"),
        anthropic_message(tool_use("complete", {"success": True, "reason": "'Dark theme' is on"})),
    )
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
    try:
        await host.connect(["v"])
        await submit(tasks_stub(ops_ch), goal="Turn on dark theme")
        a = (await host.next("assignment")).assignment
        phone = VirtualPhone("v")
        made = await _drive(planner, a, phone, outcomes=True, skip_step=3)
        assert [d.tool_name for d in made] == ["tap", "tap", "tap", "complete"]
        assert not phone.state.flag("dark_theme")
        await host.send(result(a, step=len(made)))
        await host.next("result_ack")
        state = await _looked_at(cloud.store, a.task_id, a.attempt)
        assert state == "no-flow", state
        assert await flows.active(cloud.store) == []
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()


class _Restarted(Exception):
    """The host process died here (the test's stand-in for a kill mid-attempt)."""


async def test_a_host_restarted_mid_replay_does_not_count_a_divergence_against_the_flow(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """A host replaying a flow was restarted after its second step: the cloud released the
    lease (a new process of the host) and the task's next attempt, handed the same flow, began
    on the phone as the first left it, on 'Display'. The replay began at the flow's step 1,
    which wants the launcher: a handover at step 1 counted as a divergence, and three such
    restarts retired a flow that had nothing wrong with it. Now the replay sees that the screen
    is where a later step of the flow acts, and the model takes over without a divergence."""
    cloud = offline_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
    try:
        await host.connect(["v"], process_id="boot-1")
        row, _ = await _learn_dark_theme(cloud, host, planner, ops_ch)
        await submit(tasks_stub(ops_ch), goal="Turn on dark theme")
        first = (await host.next("assignment")).assignment
        assert first.flow.flow_id == row.flow_id
        phone = VirtualPhone("v")

        async def die_after_two(step: int) -> None:
            if step == 2:
                raise _Restarted

        with pytest.raises(_Restarted):
            await _drive(planner, first, phone, outcomes=True, after_step=die_after_two)
        mid = Perceiver(ocr=None, retry_delay_s=0.0).perceive(VirtualDriver(phone), False)
        assert mid.scene.page_title == "Display", mid.scene.page
        await host.close()

        host = ScriptedHost(cloud.address, pki_dir, "h1")  # the new process: holds nothing
        await host.connect(["v"], process_id="boot-2")
        second = (await host.next("assignment")).assignment
        assert (second.task_id, second.attempt) == (first.task_id, 2)
        assert second.flow.flow_id == row.flow_id  # the first attempt did not diverge
        made = await _drive(planner, second, phone, outcomes=False)
        assert made[0].mode == types_pb2.PLANNER_MODE_COMPACT
        assert not any(d.replay_divergence for d in made), made[0]
        # the step's record says the flow was set aside there, uncounted
        assert (made[0].flow_id, made[0].flow_step) == (row.flow_id, 3), made[0]
        assert made[0].flow_set_aside == "this screen is where its step 3 acts"
        assert not any(d.flow_id for d in made[1:]), made[1:]
        async with cloud.store.read() as session:  # and the cloud's decision log keeps it
            kept = (
                await session.execute(
                    select(DecisionRow.flow_id, DecisionRow.flow_set_aside)
                    .where(DecisionRow.task_id == second.task_id, DecisionRow.attempt == 2)
                    .order_by(DecisionRow.step_index)
                )
            ).first()
        assert kept is not None
        assert tuple(kept) == (row.flow_id, "this screen is where its step 3 acts")
        assert phone.state.flag("dark_theme")
        await host.send(result(second, step=len(made)))
        await host.next("result_ack")
        for _ in range(400):  # the learning loop looks after the result was acknowledged
            async with cloud.store.read() as session:
                looked = (
                    await session.execute(
                        select(AttemptRow.flow_state, AttemptRow.replay_diverged_step).where(
                            AttemptRow.task_id == second.task_id, AttemptRow.attempt == 2
                        )
                    )
                ).one()
            if looked.flow_state is not None and looked.flow_state not in flows.LOOKING:
                break
            await asyncio.sleep(0.05)
        assert looked.replay_diverged_step is None
        counted = await flows.get(cloud.store, row.flow_id)
        assert counted is not None and counted.status == flows.ACTIVE
        assert (counted.divergences, counted.consecutive_divergences) == (0, 0)
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()


async def test_phones_already_in_the_flows_end_state_do_not_retire_it(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """ "Turn on dark theme" on phones that had it on already: the replay stops at the flow's
    switch step (tapping it would turn it off) and the model completes. Each was counted as a
    divergence at that step, and three such phones in a row retired a flow that had nothing
    wrong with it: the phone's state, not a changed app. Now it is no divergence."""
    cloud = offline_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
    try:
        await host.connect(["v"])
        row, _ = await _learn_dark_theme(cloud, host, planner, ops_ch)
        for _ in range(3):  # flow_retire_after
            await submit(tasks_stub(ops_ch), goal="Turn on dark theme")
            a = (await host.next("assignment")).assignment
            # handed with the flow learned from the first such phone, which ends where the
            # switch is found on (its replay completes here, and hands over where it is off)
            assert row.flow_id in [a.flow.flow_id, *(f.flow_id for f in a.alternatives)]
            phone = VirtualPhone("v")
            phone.state.settings["dark_theme"] = True
            made = await _drive(planner, a, phone, outcomes=True)
            assert [d.mode for d in made[:2]] == [types_pb2.PLANNER_MODE_REPLAY] * 2
            assert not any(d.replay_divergence for d in made), made[2]
            assert phone.state.flag("dark_theme")
            await host.send(result(a, step=len(made)))
            await host.next("result_ack")
            await _looked_at(cloud.store, a.task_id, a.attempt)
        counted = await flows.get(cloud.store, row.flow_id)
        assert counted is not None
        assert counted.status == flows.ACTIVE, counted.status_reason
        assert counted.divergences == 0 and counted.uses >= 1
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()
