"""Direct-transport decisions and step screenshots shipped into the cloud, on both backends.

A scripted host holds a real lease from the real cloud (mTLS, every service) and ships what a
host on the direct transport ships: its decisions (DecisionLogService.ShipDecisions) and its
screenshots (ArtifactService.UploadStepScreenshot, directory store). Proves exactly-once
logging by the host's id, the cloud's step index, masking, the transport recorded, the lease
rule (own live or just-ended lease), the refusals with their codes and the field they name, the
retention of screenshots, and the outbox backlog on the lease stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import json
import subprocess
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from PIL import Image
from sqlalchemy import select

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    types_pb2,
)
from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import task_service_pb2 as task_pb
from cloud import wire
from cloud.artifacts.directory import DirectoryStore
from cloud.server import CloudServer, build_server
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.models import UnsettledCallRow
from export import dataset
from export.bundle import bundle_bytes, read_bundle
from export.cloud_source import run_from_cloud
from planner.convert import resumed_from_proto
from planner.decision import MAX_THINKING_BLOCKS, MAX_TYPED_TEXT, ResumedFrom
from tests.cloud.cloud_harness import ScriptedHost, channel, result, submit, tasks_stub
from tests.cloud.conftest import SettingsFactory
from tests.support.screenshots import bilevel_png, cut_jpeg, png_claiming, png_with_bad_data

SECRET = "hunter2-canary"
PHASE = artifact_service_pb2


def png(width: int = 108, height: int = 240, color: str = "navy") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def shipped(
    a: lease_pb.Assignment, host_decision_id: str, tool: str = "tap", **outcome: Any
) -> decision_log_service_pb2.ShippedDecision:
    """One decision as a direct-transport host ships it (`tool`: tap or a sensitive input)."""
    action = types_pb2.Action(purpose="open it", expected_outcome="it opens")
    if tool == "tap":
        action.tap.element_id = "e1"
        arguments: dict[str, object] = {"element_id": "e1"}
    else:  # sent unmasked on purpose: the cloud must mask it anyway
        action.input_text.text = SECRET
        action.input_text.sensitive = True
        arguments = {"text": SECRET, "sensitive": True}
    entry = decision_log_service_pb2.ShippedDecision(
        host_decision_id=host_decision_id,
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        decision=types_pb2.Decision(
            tool_name=tool,
            action=action,
            arguments_json=json.dumps(arguments),
            provider="offline",
            model="m",
            system_prompt="sys",
            user_prompt="screen",
            rationale="because",
            purpose="open it",
            expected_outcome="it opens",
            step_index=99,  # ignored: the cloud assigns it
            planner_transport=types_pb2.PLANNER_TRANSPORT_CLOUD,  # ignored too
        ),
    )
    if outcome:
        entry.outcome.CopyFrom(types_pb2.ActionOutcome(**outcome))
    return entry


@dataclass
class Held:
    """A host holding a lease, and its stubs."""

    cloud: CloudServer
    host: ScriptedHost
    assignment: lease_pb.Assignment
    decisions: Any
    artifacts: Any
    ops_decisions: Any
    ops_artifacts: Any
    ops_fleet: Any
    ops: Any


@pytest.fixture
async def held(cloud: CloudServer, pki_dir: Path) -> AsyncIterator[Held]:
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    ops = tasks_stub(ops_ch)
    try:
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        # The tests never renew: a lease longer than the fixture's 2 s default keeps a slow
        # machine's test from losing it halfway.
        await submit(
            ops, target=types_pb2.TaskTarget(host_id="h1"), lease_duration=Duration(seconds=120)
        )
        assignment = (await host.next("assignment")).assignment
        yield Held(
            cloud,
            host,
            assignment,
            decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch),
            artifact_service_pb2_grpc.ArtifactServiceStub(host_ch),
            decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch),
            artifact_service_pb2_grpc.ArtifactServiceStub(ops_ch),
            fleet_service_pb2_grpc.FleetServiceStub(ops_ch),
            ops,
        )
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()


async def ship(held: Held, *entries: decision_log_service_pb2.ShippedDecision) -> Any:
    return await held.decisions.ShipDecisions(
        decision_log_service_pb2.ShipDecisionsRequest(entries=list(entries))
    )


async def logged(held: Held) -> list[types_pb2.Decision]:
    reply = await held.ops_decisions.ListDecisions(
        decision_log_service_pb2.ListDecisionsRequest(task_id=held.assignment.task_id)
    )
    return list(reply.decisions)


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_shipped_decisions_are_logged_once_in_order_and_masked(held: Held) -> None:
    a = held.assignment
    seen = shipped(a, "d1")
    seen.decision.observation.CopyFrom(
        types_pb2.ScreenObservation(
            screen_width=1080,
            screen_height=2400,
            elements=[
                types_pb2.UiElement(
                    element_id="e1", text="Display", bounds=types_pb2.Rect(right=10, bottom=10)
                )
            ],
            ocr_blocks=[types_pb2.OcrBlock(text="Display", bounds=types_pb2.Rect(right=9))],
        )
    )
    judging = shipped(a, "d2", "input_text")  # the model's word on d1, as Decide records it
    judging.decision.previous_step.CopyFrom(
        types_pb2.StepJudgement(verdict=types_pb2.VERDICT_MET, note="Display opened")
    )
    first = await ship(held, seen, judging, shipped(a, "d3"))
    assert [(k.step_index, k.duplicate) for k in first.acks] == [(1, False), (2, False), (3, False)]
    # A resend (the answer was lost) and a later report of d2's outcome change nothing else.
    again = await ship(held, shipped(a, "d1"), shipped(a, "d2", "input_text", executed=True))
    assert [(k.decision_id, k.step_index, k.duplicate) for k in again.acks] == [
        (first.acks[0].decision_id, 1, True),
        (first.acks[1].decision_id, 2, True),
    ]
    # A second outcome for d2 is ignored: the first report wins.
    await ship(held, shipped(a, "d2", "input_text", executed=False, error="late"))

    rows = await logged(held)
    assert [(d.step_index, d.tool_name) for d in rows] == [
        (1, "tap"),
        (2, "input_text"),
        (3, "tap"),
    ]
    assert {d.planner_transport for d in rows} == {types_pb2.PLANNER_TRANSPORT_DIRECT}
    assert all(d.host_id == "h1" for d in rows)
    assert rows[1].HasField("outcome") and rows[1].outcome.executed
    assert rows[0].verification.model == types_pb2.StepJudgement(
        verdict=types_pb2.VERDICT_MET, note="Display opened"
    )
    assert not rows[1].verification.HasField("model")
    assert not rows[0].HasField("outcome")
    with_screens = await held.ops_decisions.ListDecisions(
        decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id, include_observation=True)
    )
    kept = with_screens.decisions[0].observation
    assert [e.text for e in kept.elements] == ["Display"] and not kept.ocr_blocks
    typed = rows[1]
    assert typed.action.input_text.text == "•••"
    assert json.loads(typed.arguments_json) == {"sensitive": True, "text": "•••"}
    assert SECRET not in str(rows)


async def test_ship_refusals_name_the_problem(
    held: Held, cloud: CloudServer, pki_dir: Path
) -> None:
    a = held.assignment
    bad_tool = shipped(a, "x1")
    bad_tool.decision.tool_name = "swipe"
    cases = [
        (shipped(a, "no spaces"), "entries[0].host_decision_id"),
        (bad_tool, "entries[0].decision.tool_name"),
        (decision_log_service_pb2.ShippedDecision(host_decision_id="x2"), "entries[0].task_id"),
    ]
    for entry, field in cases:
        error = await refused(ship(held, entry))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error.details().startswith(field), error.details()
    error = await refused(ship(held))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "entries: at least one (or failed_calls, or unsettled_calls)",
    )
    # A lease this host never held: FAILED_PRECONDITION; nothing is logged. (Among records
    # the cloud takes, it is refused alone: see ..._the_host_may_not_ship_into_is_refused_alone.)
    unknown = shipped(a, "x3")
    unknown.lease_id = "not-a-lease"
    error = await refused(ship(held, unknown))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details().startswith("entries[0]: lease 'not-a-lease'")
    assert await logged(held) == []
    # Another host's lease: PERMISSION_DENIED (and its existence is all it learns).
    other_ch = channel(cloud.address, pki_dir, "host-h2")
    try:
        other = decision_log_service_pb2_grpc.DecisionLogServiceStub(other_ch)
        error = await refused(
            other.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[unknown]))
        )
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        error = await refused(
            other.ShipDecisions(
                decision_log_service_pb2.ShipDecisionsRequest(entries=[shipped(a, "o1")])
            )
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "belongs to another host" in error.details()
    finally:
        await other_ch.close()
    # Operators read the log; they do not write into it.
    error = await refused(
        held.ops_decisions.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(entries=[shipped(a, "p1")])
        )
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    # An id reused for another attempt of another task is refused, naming the entry.
    await ship(held, shipped(a, "reused"))
    await submit(held.ops, target=types_pb2.TaskTarget(host_id="h1"))
    await held.host.send(result(a))
    await held.host.next("result_ack")
    b = (await held.host.next("assignment")).assignment
    error = await refused(ship(held, shipped(b, "reused")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("entries[0]: host_decision_id 'reused' already names")


async def test_a_cloud_planned_attempt_takes_no_shipped_decisions_or_failed_calls(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """The cloud logs and counts a cloud-transport attempt's decisions itself (Decide): what its
    host ships about it would sit among the cloud's own steps, claimed by the host, and count
    its calls twice. FAILED_PRECONDITION, naming the entry; nothing is logged or counted."""
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        ops = tasks_stub(ops_ch)
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_CLOUD)
        await submit(
            ops, target=types_pb2.TaskTarget(host_id="h1"), lease_duration=Duration(seconds=120)
        )
        a = (await host.next("assignment")).assignment
        for request, field in (
            (decision_log_service_pb2.ShipDecisionsRequest(entries=[shipped(a, "d1")]), "entries"),
            (
                decision_log_service_pb2.ShipDecisionsRequest(failed_calls=[failed_calls(a, "f1")]),
                "failed_calls",
            ),
        ):
            error = await refused(stub.ShipDecisions(request))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
            assert error.details() == (
                f"{field}[0]: task {a.task_id!r} attempt 1 is planned by the cloud (cloud "
                "transport): the cloud logs its decisions and counts its calls itself"
            )
        ops_log = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch)
        reply = await ops_log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
        )
        assert list(reply.decisions) == [] and list(reply.failed_calls) == []
        task = (await ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
        assert task.totals.usage.input_tokens == 0
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()


def failed_calls(
    a: lease_pb.Assignment, host_spend_id: str, input_tokens: int = 500
) -> decision_log_service_pb2.ShippedFailedCalls:
    """What a failed decision's answered calls cost, as a direct-transport host ships it."""
    return decision_log_service_pb2.ShippedFailedCalls(
        host_spend_id=host_spend_id,
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        provider="anthropic",
        model="claude-sonnet-4-6",
        usage=types_pb2.Usage(input_tokens=input_tokens, output_tokens=100, cost_usd=0.003),
        error="PlannerRefused",
    )


async def test_a_decision_with_more_thinking_blocks_than_the_log_keeps_is_logged_merged(
    held: Held,
) -> None:
    """A long tool loop can think in more blocks than the decision log keeps of a decision
    (64). Such a shipment was refused whole (INVALID_ARGUMENT "entries[0].decision.thinking:
    at most 64 blocks"), a final answer: the host set the step aside for good and the
    attempt's log never got it. It is logged (acked as any other), the blocks from the 64th
    on merged into the 64th after a line saying so."""
    a = held.assignment
    entry = shipped(a, "d1")
    texts = [f"thought {i}" for i in range(70)]
    entry.decision.thinking.extend(types_pb2.ThinkingBlock(text=t) for t in texts)
    entry.decision.thinking[65].CopyFrom(types_pb2.ThinkingBlock(redacted=True))
    reply = await ship(held, entry)
    assert [(k.step_index, k.duplicate) for k in reply.acks] == [(1, False)]
    (decision,) = await logged(held)
    blocks = [(b.text, b.redacted) for b in decision.thinking]
    assert len(blocks) == MAX_THINKING_BLOCKS
    assert blocks[:63] == [(t, False) for t in texts[:63]]
    merged = [*texts[63:65], "[redacted]", *texts[66:]]
    assert blocks[63] == (
        "[7 thinking blocks merged into this one: the decision log keeps at most 64 of a "
        "decision]\n\n" + "\n\n".join(merged),
        False,
    )


async def test_shipped_failed_calls_count_once_and_refusals_name_the_field(
    held: Held, cloud: CloudServer, pki_dir: Path
) -> None:
    """ShipDecisions' failed_calls: counted in the task's totals and GetSpend (no decision
    logged, none counted), once per host_spend_id however often resent; checked like entries
    (INVALID_ARGUMENT naming the field, the lease rule)."""
    a = held.assignment

    async def ship_failed(stub: Any, *records: decision_log_service_pb2.ShippedFailedCalls) -> Any:
        request = decision_log_service_pb2.ShipDecisionsRequest(failed_calls=list(records))
        return await stub.ShipDecisions(request)

    assert list((await ship_failed(held.decisions, failed_calls(a, "f1"))).acks) == []
    await ship_failed(held.decisions, failed_calls(a, "f1"))  # a resend: counted once
    await ship(held, shipped(a, "d1"))
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert task.totals.usage.input_tokens == 500
    assert task.totals.usage.cost_usd == pytest.approx(0.003)
    assert len(await logged(held)) == 1  # the decision; none for the failed calls
    spend = await held.ops_fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
    keyed = {(r.host_id, r.model): (r.decisions, r.usage.input_tokens) for r in spend.rows}
    assert keyed == {("h1", "m"): (1, 0), ("h1", "claude-sonnet-4-6"): (0, 500)}

    no_model = failed_calls(a, "x2")
    no_model.model = ""
    negative = failed_calls(a, "x3", input_tokens=-1)
    priceless = failed_calls(a, "x4")
    priceless.usage.cost_usd = float("nan")
    for record, field in (
        (failed_calls(a, "no spaces"), "failed_calls[0].host_spend_id"),
        (no_model, "failed_calls[0].model: required"),
        (negative, "failed_calls[0].usage: token counts must not be negative"),
        (priceless, "failed_calls[0].usage.cost_usd"),
    ):
        error = await refused(ship_failed(held.decisions, record))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error.details().startswith(field), error.details()
    unknown = failed_calls(a, "x5")
    unknown.lease_id = "not-a-lease"
    error = await refused(ship_failed(held.decisions, unknown))  # alone among others: refused
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details().startswith("failed_calls[0]: lease 'not-a-lease'")
    other_ch = channel(cloud.address, pki_dir, "host-h2")
    try:
        other = decision_log_service_pb2_grpc.DecisionLogServiceStub(other_ch)
        error = await refused(ship_failed(other, failed_calls(a, "o1")))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await other_ch.close()
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert task.totals.usage.input_tokens == 500, "nothing refused was counted"


def unsettled_call(
    a: lease_pb.Assignment, host_call_id: str, cost_usd: float = 0.16
) -> decision_log_service_pb2.ShippedUnsettledCall:
    """A model call of unknown cost, as a direct-transport host ships it."""
    return decision_log_service_pb2.ShippedUnsettledCall(
        host_call_id=host_call_id,
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        provider="anthropic",
        model="claude-sonnet-4-6",
        at_most=types_pb2.Usage(input_tokens=12_000, output_tokens=8_192, cost_usd=cost_usd),
    )


async def test_shipped_unsettled_calls_show_once_until_their_late_cost_settles_them(
    held: Held,
) -> None:
    """ShipDecisions' unsettled_calls: a direct host's calls of unknown cost show in GetTask
    as the cloud's own do (the attempt's and the task's `unsettled`), once per host_call_id
    however often resent, not in the totals; a failed_calls record naming one in
    `settles_calls` settles it as it is counted; checked like entries (INVALID_ARGUMENT naming
    the field)."""
    a = held.assignment
    get = task_pb.GetTaskRequest(task_id=a.task_id)

    async def ship_calls(*calls: decision_log_service_pb2.ShippedUnsettledCall) -> None:
        request = decision_log_service_pb2.ShipDecisionsRequest(unsettled_calls=list(calls))
        await held.decisions.ShipDecisions(request)

    await ship_calls(unsettled_call(a, "c1"), unsettled_call(a, "c2", cost_usd=0.04))
    await ship_calls(unsettled_call(a, "c1"))  # a resend: shown once
    task = (await held.ops.GetTask(get)).task
    assert task.totals.unsettled.calls == 2
    assert task.totals.unsettled.at_most.input_tokens == 24_000
    assert task.totals.unsettled.at_most.cost_usd == pytest.approx(0.2)
    (attempt,) = task.attempts
    assert attempt.unsettled.calls == 2
    assert task.totals.usage.input_tokens == 0

    late = failed_calls(a, "f1")
    late.settles_calls.append("c1")
    await held.decisions.ShipDecisions(
        decision_log_service_pb2.ShipDecisionsRequest(failed_calls=[late])
    )
    task = (await held.ops.GetTask(get)).task
    assert task.totals.unsettled.calls == 1
    assert task.totals.unsettled.at_most.cost_usd == pytest.approx(0.04)
    assert task.totals.usage.input_tokens == 500

    no_model = unsettled_call(a, "x1")
    no_model.model = ""
    negative = unsettled_call(a, "x2")
    negative.at_most.output_tokens = -1
    for call, field in (
        (unsettled_call(a, "no spaces"), "unsettled_calls[0].host_call_id"),
        (no_model, "unsettled_calls[0].model: required"),
        (negative, "unsettled_calls[0].at_most: token counts must not be negative"),
    ):
        error = await refused(ship_calls(call))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error.details().startswith(field), error.details()
    unknown = unsettled_call(a, "x3")
    unknown.lease_id = "not-a-lease"
    error = await refused(ship_calls(unknown))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details().startswith("unsettled_calls[0]: lease 'not-a-lease'")
    assert (await held.ops.GetTask(get)).task.totals.unsettled.calls == 1


async def test_an_unsettled_calls_wrong_start_is_recorded_as_unset_and_the_call_kept(
    held: Held,
) -> None:
    """An unsettled call's `started_at` is checked as a resumed decision's `answered_at` is:
    one before 2000 (a client's zero time), more than a day past the cloud's clock or with
    nanos past a second is recorded as unset (when the cloud recorded the call), and the call
    is kept. Before, the first two were recorded as sent (a call "started" in 1970 or years
    ahead) and the last failed the whole request as it was read."""
    a = held.assignment
    started = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    good = unsettled_call(a, "s1")
    good.started_at.FromDatetime(started)
    ahead = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    wrong = [
        Timestamp(seconds=0),
        Timestamp(seconds=int(dt.datetime(1999, 12, 31, tzinfo=dt.UTC).timestamp())),
        Timestamp(seconds=int(ahead.timestamp())),
        Timestamp(seconds=int(started.timestamp()), nanos=1_000_000_000),
    ]
    bad = []
    for n, at in enumerate(wrong):
        call = unsettled_call(a, f"s{n + 2}")
        call.started_at.CopyFrom(at)
        bad.append(call)
    before = dt.datetime.now(dt.UTC)
    await held.decisions.ShipDecisions(
        decision_log_service_pb2.ShipDecisionsRequest(unsettled_calls=[good, *bad])
    )
    after = dt.datetime.now(dt.UTC)
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert task.totals.unsettled.calls == 1 + len(wrong)
    async with held.cloud.store.read() as db:
        rows = (await db.scalars(select(UnsettledCallRow))).all()
    assert len(rows) == 1 + len(wrong)
    starts = sorted(r.started_at for r in rows)
    assert starts[0] == started
    for recorded in starts[1:]:  # when the cloud recorded it
        slack = dt.timedelta(seconds=1)
        assert before - slack <= recorded <= after + slack, recorded


async def test_a_resent_call_settled_in_its_own_request_stays_settled(held: Held) -> None:
    """A request carrying a call of unknown cost and the late failed_calls record that settles
    it (what a host shipping its backlog after an outage sends), sent again because its answer
    was lost (the cloud restarted after the write): the call stays settled and is counted once.
    Before, the resend recorded the call again (its marker was gone, so it looked new) while
    the record, a duplicate, settled nothing: "1 call, cost unknown" on the task for good."""
    a = held.assignment
    late = failed_calls(a, "f1")
    late.settles_calls.append("c1")
    request = decision_log_service_pb2.ShipDecisionsRequest(
        unsettled_calls=[unsettled_call(a, "c1"), unsettled_call(a, "c2")], failed_calls=[late]
    )
    for _ in range(2):  # the original and its resend
        await held.decisions.ShipDecisions(request)
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert task.totals.unsettled.calls == 1  # c2, never settled
    assert task.totals.usage.input_tokens == 500


async def test_a_call_shipped_after_its_record_settled_it_is_not_recorded_again(
    held: Held,
) -> None:
    """Resends out of order (a host that reconnected, in any language): a call of unknown cost
    shipped again after the failed_calls record that settles it was counted, or first shipped
    after it, is not recorded again; each record counts once. Before, the marker a settled call
    left was gone, so the late unsettled call looked new: "1 call, cost unknown" on the task for
    good beside its cost counted (migration 0031 keeps the host call ids taken)."""
    a = held.assignment

    async def send(
        *,
        calls: tuple[str, ...] = (),
        failed: decision_log_service_pb2.ShippedFailedCalls | None = None,
    ) -> None:
        request = decision_log_service_pb2.ShipDecisionsRequest(
            unsettled_calls=[unsettled_call(a, c) for c in calls],
            failed_calls=[failed] if failed is not None else [],
        )
        await held.decisions.ShipDecisions(request)

    late_c1 = failed_calls(a, "f1")
    late_c1.settles_calls.append("c1")
    late_c2 = failed_calls(a, "f2")
    late_c2.settles_calls.append("c2")
    await send(calls=("c1",))
    await send(failed=late_c1)
    await send(calls=("c1",))  # the first request's resend, after the record
    await send(failed=late_c2)  # c2's record before the call itself
    await send(calls=("c2",))
    await send(failed=late_c1)
    await send(calls=("c1", "c2"))
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert task.totals.unsettled.calls == 0
    assert task.totals.usage.input_tokens == 1000  # f1 and f2, once each


async def test_a_shipped_usage_out_of_range_is_refused_and_the_task_stays_readable(
    held: Held,
) -> None:
    """A shipped decision's usage was logged unchecked (and a failed_calls one checked only for
    negatives): a negative one lowered what the task had spent, a NaN cost failed INTERNAL, and
    tokens near 2**63 overflowed the totals, after which GetTask answered UNAVAILABLE on SQLite
    (the shipment itself INTERNAL on PostgreSQL). Each is INVALID_ARGUMENT naming the field, and
    nothing of the task already stored is lost."""
    a = held.assignment
    await ship(held, shipped(a, "d1"))
    await held.decisions.ShipDecisions(
        decision_log_service_pb2.ShipDecisionsRequest(failed_calls=[failed_calls(a, "f1")])
    )
    huge = 2**63 - 1
    cases = [
        (types_pb2.Usage(input_tokens=-1_000_000), "entries[0].decision.usage: token counts"),
        (types_pb2.Usage(cost_usd=-5.0), "entries[0].decision.usage.cost_usd"),
        (types_pb2.Usage(cost_usd=float("nan")), "entries[0].decision.usage.cost_usd"),
        (types_pb2.Usage(output_tokens=huge), "entries[0].decision.usage: token counts"),
        (types_pb2.Usage(cost_usd=1e308), "entries[0].decision.usage.cost_usd"),
    ]
    for i, (usage, field) in enumerate(cases):
        entry = shipped(a, f"u{i}")
        entry.decision.usage.CopyFrom(usage)
        error = await refused(ship(held, entry))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error.details().startswith(field), error.details()
    record = failed_calls(a, "f2")
    record.usage.input_tokens = huge
    error = await refused(
        held.decisions.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(failed_calls=[record, record])
        )
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.details().startswith("failed_calls[0].usage: token counts"), error.details()
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert task.totals.usage.input_tokens == 500
    assert task.totals.usage.cost_usd == pytest.approx(0.003)
    assert [d.step_index for d in await logged(held)] == [1]


async def test_a_shipped_replay_handover_out_of_bounds_is_refused_naming_the_field(
    held: Held,
) -> None:
    """A shipped decision's replay handover (flow_id, replay_divergence) was stored unchecked:
    a flow id longer than the cloud's 32 characters failed INTERNAL on PostgreSQL (its column
    is 32 wide; SQLite kept it), and a divergence of megabytes was stored whole. Both are
    INVALID_ARGUMENT naming the field, like the decision's other text; nothing is logged."""
    a = held.assignment
    long_flow = shipped(a, "h1")
    long_flow.decision.flow_id = "f" * 33
    long_flow.decision.flow_step = 2
    long_flow.decision.replay_divergence = "the screen differed"
    long_reason = shipped(a, "h2")
    long_reason.decision.flow_id = "f" * 32
    long_reason.decision.flow_step = 2
    long_reason.decision.replay_divergence = "x" * (64 * 1024 + 1)
    for entry, field in (
        (long_flow, "entries[0].decision.flow_id: 33 bytes; at most 32"),
        (long_reason, "entries[0].decision.replay_divergence: 65537 bytes; at most 65536"),
    ):
        error = await refused(ship(held, entry))
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await logged(held) == []


async def test_a_host_spend_id_reused_for_another_attempt_is_refused_not_dropped(
    held: Held,
) -> None:
    """A host_spend_id already counted for one attempt, sent again for another, was answered
    OK and counted nowhere: the second attempt's billed calls vanished from its task's totals
    (its budget) and the fleet's day. Like a reused host_decision_id, it is INVALID_ARGUMENT
    naming the record and the attempt the id already names."""
    a = held.assignment
    request = decision_log_service_pb2.ShipDecisionsRequest
    await held.decisions.ShipDecisions(request(failed_calls=[failed_calls(a, "f1")]))
    await submit(held.ops, target=types_pb2.TaskTarget(host_id="h1"))
    await held.host.send(result(a))
    await held.host.next("result_ack")
    b = (await held.host.next("assignment")).assignment
    again = failed_calls(a, "f1")  # a resend for the same attempt: acknowledged, counted once
    await held.decisions.ShipDecisions(request(failed_calls=[again]))
    error = await refused(
        held.decisions.ShipDecisions(request(failed_calls=[failed_calls(b, "f1")]))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.details() == (
        f"failed_calls[0]: host_spend_id 'f1' already names a record of task {a.task_id!r} "
        "attempt 1"
    )
    first = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert first.totals.usage.input_tokens == 500


async def test_a_shipped_judgement_or_target_out_of_bounds_is_refused_naming_the_field(
    held: Held,
) -> None:
    """A shipped decision's judgement of the previous step and its target were stored whole:
    one host's decision with a 3 MB note and a 3 MB target text made every ListDecisions of
    the task a 6 MB answer, over a gRPC client's default 4 MiB, so operators' tools got
    RESOURCE_EXHAUSTED for the task's whole log. They are held to the limits of what they
    come from (a model's text, the planner's target descriptor) and refused naming the field."""
    a = held.assignment
    long_note = shipped(a, "j1")
    long_note.decision.previous_step.CopyFrom(
        types_pb2.StepJudgement(verdict=types_pb2.VERDICT_MET, note="n" * (64 * 1024 + 1))
    )
    long_target = shipped(a, "j2")
    long_target.decision.target.CopyFrom(types_pb2.ElementTarget(text="t" * 257))
    long_id = shipped(a, "j3")
    long_id.decision.target.CopyFrom(types_pb2.ElementTarget(resource_id="r" * 257))
    for entry, field in (
        (long_note, "entries[0].decision.previous_step.note: 65537 bytes; at most 65536"),
        (long_target, "entries[0].decision.target.text: 257 bytes; at most 256"),
        (long_id, "entries[0].decision.target.resource_id: 257 bytes; at most 256"),
    ):
        error = await refused(ship(held, entry))
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await logged(held) == []


async def test_a_shipped_latency_retry_count_or_evidence_out_of_bounds_is_refused(
    held: Held,
) -> None:
    """A shipped decision's latency, corrective retry count and its outcome's evidence (the
    log's verification of the step) were stored as sent: a negative latency or retry count
    read back in every ListDecisions, a Duration with nanos of the other sign was added up,
    and a megabyte of evidence was logged whole where Decide takes 512 bytes."""
    a = held.assignment
    negative = shipped(a, "l1")
    negative.decision.latency.CopyFrom(Duration(seconds=-3))
    mixed = shipped(a, "l2")
    mixed.decision.latency.CopyFrom(Duration(seconds=2, nanos=-1))
    endless = shipped(a, "l3")
    endless.decision.latency.CopyFrom(Duration(seconds=86_401))
    retries = shipped(a, "l4")
    retries.decision.corrective_retries = -1
    many = shipped(a, "l5")
    many.decision.corrective_retries = 101
    evidence = shipped(a, "l6", executed=True, verdict=types_pb2.VERDICT_MET, evidence="e" * 513)
    for entry, field in (
        (negative, "entries[0].decision.latency: 0 s to 86,400 s"),
        (
            mixed,
            "entries[0].decision.latency: not a valid Duration (nanos -999,999,999 to"
            " 999,999,999, of the sign of seconds)",
        ),
        (endless, "entries[0].decision.latency: 0 s to 86,400 s"),
        (retries, "entries[0].decision.corrective_retries: 0 to 100"),
        (many, "entries[0].decision.corrective_retries: 0 to 100"),
        (evidence, "entries[0].outcome.evidence: 513 bytes; at most 512"),
    ):
        error = await refused(ship(held, entry))
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await logged(held) == []


async def test_a_shipped_decision_resumed_from_a_kept_answer_is_logged_as_resumed(
    held: Held,
) -> None:
    """A direct-transport host's decision that went on from an answer it kept before a write
    failed (its provider sent no turn id) is logged as resumed, by position; the decision
    shipped after it, which asked the model, is not. A turn id past 256 bytes or a negative
    position below 1 is refused, naming the field: so is a mark left at its defaults (a foreign
    client's empty `resumedFrom: {}`), which would have logged an asked decision as resumed at
    the conversation's first item (its first observation, where no answer begins). Before, the
    mark was dropped on logging."""
    a = held.assignment
    resumed, asked = shipped(a, "r1"), shipped(a, "r2")
    resumed.decision.resumed_from.CopyFrom(types_pb2.ResumedTurn(turn_id="", position=5))
    long_id, negative, empty = shipped(a, "r3"), shipped(a, "r4"), shipped(a, "r5")
    long_id.decision.resumed_from.turn_id = "t" * 257
    negative.decision.resumed_from.position = -1
    empty.decision.resumed_from.SetInParent()
    at_least_1 = "entries[0].decision.resumed_from.position: 1 or more (the answer's first item)"
    for entry, field in (
        (long_id, "entries[0].decision.resumed_from.turn_id: 257 bytes, at most 256"),
        (negative, at_least_1),
        (empty, at_least_1),
    ):
        error = await refused(ship(held, entry))
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, field)
    await ship(held, resumed, asked)
    first, second = await logged(held)
    assert first.HasField("resumed_from") and first.resumed_from.position == 5
    assert first.resumed_from.turn_id == ""
    assert not first.resumed_from.HasField("answered_at")  # the host did not say: not known
    assert not second.HasField("resumed_from")


async def test_when_a_kept_answer_was_answered_is_logged_and_a_wrong_time_dropped(
    held: Held,
) -> None:
    """A resumed decision's `answered_at` (when its session store kept the answer) is logged
    as shipped and listed back. One before 2000 (a client's zero time), more than a day past
    the cloud's clock (a host's clock running fast) or with nanos past a second is logged as
    "not known": the decision itself is kept. At first such a time was refused with
    INVALID_ARGUMENT, and a host sets a refused entry aside for good: a host a day fast lost
    every resumed decision, its rationale and its usage, over a note."""
    a = held.assignment
    answered = dt.datetime(2026, 3, 4, 5, 6, 7, 89_000, tzinfo=dt.UTC)
    entry = shipped(a, "w1")
    entry.decision.resumed_from.CopyFrom(types_pb2.ResumedTurn(turn_id="msg_1", position=3))
    entry.decision.resumed_from.answered_at.FromDatetime(answered)
    ahead = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    wrong = [
        Timestamp(seconds=0),
        Timestamp(seconds=int(dt.datetime(1999, 12, 31, tzinfo=dt.UTC).timestamp())),
        Timestamp(seconds=int(ahead.timestamp())),
        Timestamp(seconds=int(answered.timestamp()), nanos=1_000_000_000),
    ]
    bad = []
    for n, at in enumerate(wrong):
        one = shipped(a, f"w{n + 2}")
        one.decision.resumed_from.CopyFrom(types_pb2.ResumedTurn(turn_id="msg_2", position=3))
        one.decision.resumed_from.answered_at.CopyFrom(at)
        bad.append(one)
    await ship(held, entry, *bad)
    records = await logged(held)
    assert len(records) == 1 + len(wrong)
    assert records[0].resumed_from.answered_at.ToDatetime(tzinfo=dt.UTC) == answered
    assert resumed_from_proto(records[0]) == ResumedFrom("msg_1", 3, answered)
    for record in records[1:]:
        assert resumed_from_proto(record) == ResumedFrom("msg_2", 3, None)
        assert not record.resumed_from.HasField("answered_at")


async def test_a_resumed_decision_is_exported_as_resumed_from_the_decision_log(
    held: Held,
) -> None:
    """The cloud's export of a task (its decision log as ListDecisions gives it, on this
    backend) marks the step whose decision went on from a kept answer, in the dataset line
    (`resumed_from`: turn id and position) and the report, and reads it back so; the decision
    after it, which asked the model, is not marked. Before, the export dropped the mark."""
    a = held.assignment
    resumed, asked = shipped(a, "x1"), shipped(a, "x2")
    resumed.decision.resumed_from.CopyFrom(types_pb2.ResumedTurn(turn_id="msg_7", position=5))
    answered = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    resumed.decision.resumed_from.answered_at.FromDatetime(answered)
    await ship(held, resumed, asked)
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    run = await run_from_cloud(task, await logged(held))
    data = bundle_bytes(run)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        lines = [dataset.parse_line(x) for x in z.read("steps.jsonl").decode().splitlines()]
        html = z.read("report.html").decode()
    assert all(isinstance(x, dataset.StepRecord) for x in lines)
    assert [x.resumed_from for x in lines if isinstance(x, dataset.StepRecord)] == [
        dataset.ResumedRecord(turn_id="msg_7", position=5, answered_at="2026-03-04T05:06:07+00:00"),
        None,
    ]
    assert [s.resumed_from for s in read_bundle(data).steps] == [
        ResumedFrom("msg_7", 5, answered),
        None,
    ]
    assert html.count('data-field="resumed"') == 1


async def test_a_just_ended_lease_takes_shipments_until_the_window_closes(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    server = await build_server(make_settings(ship_window_seconds=5.0))
    await server.start()
    host = ScriptedHost(server.address, pki_dir, "h1")
    host_ch = channel(server.address, pki_dir, "host-h1")
    ops_ch = channel(server.address, pki_dir, "operator-ops")
    try:
        stub = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        await submit(tasks_stub(ops_ch), target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await host.send(result(a))
        await host.next("result_ack")
        request = decision_log_service_pb2.ShipDecisionsRequest(entries=[shipped(a, "late")])
        # Just ended: still this host's to ship for (its outbox may hold the last steps).
        reply = await stub.ShipDecisions(request)
        assert reply.acks[0].step_index == 1
        # Once the attempt ended longer ago than the window: refused for good.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        closed: grpc.aio.AioRpcError | None = None
        while closed is None:
            try:
                await stub.ShipDecisions(
                    decision_log_service_pb2.ShipDecisionsRequest(entries=[shipped(a, "later")])
                )
            except grpc.aio.AioRpcError as error:
                closed = error
                continue
            assert loop.time() < deadline, "the window never closed"
            await asyncio.sleep(0.2)
        assert closed.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "longer ago than the shipping window" in (closed.details() or "")
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()
        await server.stop(0.5)


async def upload(
    held: Held, phase: int, data: bytes, *, content_type: str = "image/png", **step: str
) -> Any:
    a = held.assignment
    return await held.artifacts.UploadStepScreenshot(
        artifact_service_pb2.UploadStepScreenshotRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            phase=phase,  # type: ignore[arg-type]
            content_type=content_type,
            data=data,
            marks=artifact_service_pb2.ActionMarks(
                target=types_pb2.Rect(left=1, top=2, right=30, bottom=40)
            ),
            **step,
        )
    )


async def fetch(held: Held, step: int, phase: int) -> tuple[Any, bytes]:
    a = held.assignment
    call = held.ops_artifacts.GetStepScreenshot(
        artifact_service_pb2.GetStepScreenshotRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            step_index=step,
            phase=phase,  # type: ignore[arg-type]
        )
    )
    chunks = [c async for c in call]
    return chunks[0].screenshot, b"".join(c.data for c in chunks)


async def test_step_screenshots_are_stored_listed_served_and_pruned(held: Held) -> None:
    a = held.assignment
    await ship(held, shipped(a, "s1"), shipped(a, "s2"))
    big = png(1080, 2400, "white")
    after = await upload(held, PHASE.SCREENSHOT_PHASE_AFTER, png(), host_decision_id="s1")
    before = await upload(held, PHASE.SCREENSHOT_PHASE_BEFORE, big, host_decision_id="s1")
    await upload(held, PHASE.SCREENSHOT_PHASE_BEFORE, png(color="red"), host_decision_id="s2")
    assert (before.screenshot.step_index, before.screenshot.width, before.screenshot.height) == (
        1,
        1080,
        2400,
    )
    assert after.screenshot.decision_id == before.screenshot.decision_id
    # Uploading again replaces (an outbox resend is harmless).
    await upload(held, PHASE.SCREENSHOT_PHASE_BEFORE, big, host_decision_id="s1")

    listed = await held.ops_artifacts.ListStepScreenshots(
        artifact_service_pb2.ListStepScreenshotsRequest(task_id=a.task_id, page_size=2)
    )
    rest = await held.ops_artifacts.ListStepScreenshots(
        artifact_service_pb2.ListStepScreenshotsRequest(
            task_id=a.task_id, page_token=listed.next_page_token
        )
    )
    order = [(s.step_index, s.phase) for s in [*listed.screenshots, *rest.screenshots]]
    assert order == [
        (1, PHASE.SCREENSHOT_PHASE_BEFORE),
        (1, PHASE.SCREENSHOT_PHASE_AFTER),
        (2, PHASE.SCREENSHOT_PHASE_BEFORE),
    ]
    meta, data = await fetch(held, 1, PHASE.SCREENSHOT_PHASE_BEFORE)
    assert data == big and meta.content_type == "image/png" and meta.size_bytes == len(big)
    assert (meta.marks.target.left, meta.marks.target.bottom) == (1, 40)

    # Retention: the task ends, its screenshots go with its decisions (objects, then rows).
    store = held.cloud.artifacts
    key = f"{a.task_id}/{a.attempt}/00001-before.png"
    assert await store.get(key) == big
    await held.host.send(result(a))
    await held.host.next("result_ack")
    assert await held.cloud.prune_screenshots(dt.timedelta(0)) == 3
    assert await store.get(key) is None
    error = await refused(fetch(held, 1, PHASE.SCREENSHOT_PHASE_BEFORE))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_a_screenshot_replaced_in_another_format_leaves_no_object_behind(
    held: Held,
) -> None:
    """A step's screenshot uploaded again replaces it, but the object's key ends in its format:
    a PNG replaced by a JPEG left the PNG in the artifact store, pointed to by no row, so the
    retention pass (which deletes the rows' objects) never deleted it and a screenshot outlived
    its task's log for good."""
    a = held.assignment
    await ship(held, shipped(a, "s1"))
    await upload(held, PHASE.SCREENSHOT_PHASE_BEFORE, png(), host_decision_id="s1")
    shot = io.BytesIO()
    Image.new("RGB", (108, 240), "navy").save(shot, format="JPEG")
    await upload(
        held,
        PHASE.SCREENSHOT_PHASE_BEFORE,
        shot.getvalue(),
        content_type="image/jpeg",
        host_decision_id="s1",
    )
    meta, data = await fetch(held, 1, PHASE.SCREENSHOT_PHASE_BEFORE)
    assert (meta.content_type, data) == ("image/jpeg", shot.getvalue())
    await held.host.send(result(a))
    await held.host.next("result_ack")
    assert await held.cloud.prune_screenshots(dt.timedelta(0)) == 1
    store = held.cloud.artifacts
    for extension in ("png", "jpg"):
        assert await store.get(f"{a.task_id}/{a.attempt}/00001-before.{extension}") is None


@contextlib.contextmanager
def undeletable(path: Path) -> Iterator[None]:
    """Make one file of a real directory store impossible to delete while its folder stays
    writable (the immutable attribute: root, or CAP_LINUX_IMMUTABLE, on a file system that has
    it); a folder made read-only would refuse the upload beside it as well."""
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if made.returncode:
        pytest.skip(f"cannot make a file undeletable here: {made.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


async def test_a_replaced_screenshot_that_failed_to_delete_goes_with_the_retention_pass(
    held: Held,
) -> None:
    """A PNG replaced by a JPEG whose delete failed (the store refused it) was named by no
    row any more, so no retention pass ever deleted it: the screenshot outlived its task's
    log for good. The pass deletes every format's object of an expired step."""
    a = held.assignment
    await ship(held, shipped(a, "s1"))
    await upload(held, PHASE.SCREENSHOT_PHASE_BEFORE, png(), host_decision_id="s1")
    store = held.cloud.artifacts
    assert isinstance(store, DirectoryStore)
    old = f"{a.task_id}/{a.attempt}/00001-before.png"
    shot = io.BytesIO()
    Image.new("RGB", (108, 240), "navy").save(shot, format="JPEG")
    with undeletable(store.path(old)):
        await upload(
            held,
            PHASE.SCREENSHOT_PHASE_BEFORE,
            shot.getvalue(),
            content_type="image/jpeg",
            host_decision_id="s1",
        )
        assert await store.get(old) is not None, "the delete did not fail"
    meta, data = await fetch(held, 1, PHASE.SCREENSHOT_PHASE_BEFORE)
    assert (meta.content_type, data) == ("image/jpeg", shot.getvalue())
    await held.host.send(result(a))
    await held.host.next("result_ack")
    assert await held.cloud.prune_screenshots(dt.timedelta(0)) == 1
    # This task's folder only: the store is the test session's, other tests' objects are in it.
    left = list((store.root / a.task_id).rglob("*"))
    assert not [p for p in left if p.is_file()], f"an object outlived the retention pass: {left}"


async def test_screenshot_refusals_name_the_field(
    held: Held, cloud: CloudServer, pki_dir: Path
) -> None:
    a = held.assignment
    await ship(held, shipped(a, "r1"))
    before = PHASE.SCREENSHOT_PHASE_BEFORE
    jpeg = io.BytesIO()
    Image.new("RGB", (10, 10)).save(jpeg, format="JPEG")
    cases: list[tuple[Any, str]] = [
        (
            upload(held, before, png(), content_type="image/gif", host_decision_id="r1"),
            "content_type: image/png or image/jpeg",
        ),
        (
            upload(held, before, jpeg.getvalue(), host_decision_id="r1"),
            "content_type: image/png but the data is JPEG",
        ),
        (
            upload(held, before, b"\x89PNG\r\n\x1a\nnot really", host_decision_id="r1"),
            "data: not a readable image",
        ),
        (
            upload(held, before, b"x" * (8 * 1024 * 1024 + 1), host_decision_id="r1"),
            "data: 8388609 bytes; at most 8388608",
        ),
        (upload(held, 0, png(), host_decision_id="r1"), "phase:"),
        (
            upload(held, before, png()),
            "decision_id: one of decision_id and host_decision_id is required",
        ),
    ]
    for call, start in cases:
        error = await refused(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error.details().startswith(start), error.details()
    # A decision the cloud has not logged (yet): ship it first.
    error = await refused(upload(held, before, png(), host_decision_id="never-shipped"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ship the decision first" in error.details()
    # Another host may not upload into this attempt.
    other_ch = channel(cloud.address, pki_dir, "host-h2")
    try:
        other = artifact_service_pb2_grpc.ArtifactServiceStub(other_ch)
        error = await refused(
            other.UploadStepScreenshot(
                artifact_service_pb2.UploadStepScreenshotRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    host_decision_id="r1",
                    phase=before,
                    content_type="image/png",
                    data=png(),
                )
            )
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await other_ch.close()
    # Operators read screenshots; unknown tasks are NOT_FOUND.
    error = await refused(
        held.ops_artifacts.ListStepScreenshots(
            artifact_service_pb2.ListStepScreenshotsRequest(task_id="nope")
        )
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_a_damaged_oversized_or_bomb_screenshot_is_refused_and_nothing_is_stored(
    held: Held,
) -> None:
    """`Image.verify()` decodes nothing: a JPEG cut in half and a PNG with valid CRCs around
    broken data were accepted, and every export of their task failed. A 1-bit PNG of a few KB
    claiming 8000 x 8000 was accepted and cost each export hundreds of MB. A PNG claiming over
    Pillow's bomb limit was an INTERNAL "retry later" that a host resends forever. Each is an
    INVALID_ARGUMENT naming `data`, and nothing reaches the store."""
    a = held.assignment
    await ship(held, shipped(a, "d1"))
    before = PHASE.SCREENSHOT_PHASE_BEFORE
    cases = [
        (cut_jpeg(), "image/jpeg", "data: not a readable image (OSError: image file is truncated"),
        (png_with_bad_data(), "image/png", "data: not a readable image (OSError: "),
        (bilevel_png(8000, 8000), "image/png", "data: 8000x8000 pixels; at most 8192 a side"),
        (bilevel_png(9000, 100), "image/png", "data: 9000x100 pixels; at most 8192 a side"),
        (
            png_claiming(20000, 20000),
            "image/png",
            "data: not a readable image (DecompressionBombError: ",
        ),
    ]
    for data, content_type, start in cases:
        error = await refused(
            upload(held, before, data, content_type=content_type, host_decision_id="d1")
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (start, error)
        assert error.details().startswith(start), error.details()
    listed = await held.ops_artifacts.ListStepScreenshots(
        artifact_service_pb2.ListStepScreenshotsRequest(task_id=a.task_id)
    )
    assert list(listed.screenshots) == []
    # The largest screenshot taken still is.
    edge = await upload(held, before, bilevel_png(8192, 4880), host_decision_id="d1")
    assert (edge.screenshot.width, edge.screenshot.height) == (8192, 4880)


async def test_the_outbox_backlog_reaches_the_fleet_view(held: Held) -> None:
    oldest = types_pb2.OutboxBacklog(items=7, decisions=3, refused=1)
    oldest.oldest_at.FromDatetime(dt.datetime(2026, 1, 2, 3, 4, 5))
    await held.host.send(lease_pb.LeaseRequest(outbox=oldest))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        hosts = await held.ops_fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
        host = next(h for h in hosts.hosts if h.host_id == "h1")
        if host.outbox.items == 7:
            break
        assert loop.time() < deadline, host
        await asyncio.sleep(0.05)
    assert (host.outbox.decisions, host.outbox.refused) == (3, 1)
    assert host.outbox.oldest_at.ToDatetime() == dt.datetime(2026, 1, 2, 3, 4, 5)
    assert host.outbox.HasField("reported_at")
    # A report out of range is read within range, never refused (tests/cloud/test_host_reports.py).


async def test_migration_0009_up_and_down(db_url: str) -> None:
    """0009 is additive: its columns, index and table go with its downgrade, and come back."""
    import sqlalchemy

    def shape(c: sqlalchemy.Connection) -> tuple[set[str], set[str], set[str]]:
        inspector = sqlalchemy.inspect(c)
        return (
            set(inspector.get_table_names()),
            {col["name"] for col in inspector.get_columns("decisions")},
            {col["name"] for col in inspector.get_columns("hosts")},
        )

    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        await downgrade(s.engine, "0008")
        async with s.engine.connect() as conn:
            tables, decision_cols, host_cols = await conn.run_sync(shape)
        assert "step_screenshots" not in tables
        assert not {"planner_transport", "host_decision_id"} & decision_cols
        assert not {c for c in host_cols if c.startswith("outbox_")}
        await upgrade(s.engine)
        async with s.engine.connect() as conn:
            tables, decision_cols, host_cols = await conn.run_sync(shape)
        assert "step_screenshots" in tables
        assert {"planner_transport", "host_decision_id"} <= decision_cols
        assert "outbox_items" in host_cols
        await check(s.engine)
    finally:
        await s.close()


async def test_a_shipped_verdict_this_cloud_does_not_know_is_recorded_as_unknown(
    held: Held,
) -> None:
    """A newer direct-transport host's verdict (proto3 enums are open) is kept as not judged,
    and the log says why, as Decide records one (it was dropped without a word)."""
    entry = shipped(held.assignment, "d1", executed=True, evidence="the newer checker's words")
    entry.outcome.verdict = 99  # type: ignore[assignment]  # a newer host's value
    await ship(held, entry)
    [row] = await logged(held)
    assert row.outcome.verdict == types_pb2.VERDICT_UNSPECIFIED
    assert row.outcome.evidence == (
        "the host's verdict 99 is not one this cloud knows; read as unspecified: "
        "the newer checker's words"
    )


async def test_a_shipped_text_to_type_is_logged_whole_or_refused_never_cut(held: Held) -> None:
    """What the host typed, over the 64 KiB the decision log keeps of the model's other texts:
    kept whole (before, it was cut, and the record said another text than the phone got); over
    what a record can hold twice (the action and its arguments), refused naming the field."""
    a = held.assignment
    long = "typed " * 20_000  # 120,000 bytes
    entry = shipped(a, "t1", "input_text")
    entry.decision.action.input_text.text = long
    entry.decision.action.input_text.sensitive = False
    entry.decision.arguments_json = json.dumps({"text": long})
    await ship(held, entry)
    [row] = await logged(held)
    assert row.action.input_text.text == long
    assert json.loads(row.arguments_json)["text"] == long

    huge = shipped(a, "t2", "input_text")
    huge.decision.action.input_text.text = "x" * (MAX_TYPED_TEXT + 1)
    huge.decision.action.input_text.sensitive = False
    error = await refused(ship(held, huge))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"entries[0].decision.action.input_text.text: {MAX_TYPED_TEXT + 1} bytes;"
        f" at most {MAX_TYPED_TEXT}",
    )
    assert len(await logged(held)) == 1


async def test_a_record_the_cloud_cannot_take_is_refused_alone_and_the_others_are_taken(
    held: Held,
) -> None:
    """A polyglot host (the protos, no amc code) ships a decision typing more than a record
    keeps among good ones. The whole call was refused (INVALID_ARGUMENT): a client that never
    resends a refused call lost every other record of it, one that resends lost them for ever.
    The call is answered OK, the others are logged and counted, and the reply names the refused
    record (its list, index, id and reason); a resend gets the same answer, nothing twice."""
    a = held.assignment
    huge = shipped(a, "t2", "input_text")
    huge.decision.action.input_text.text = "x" * (MAX_TYPED_TEXT + 1)
    huge.decision.action.input_text.sensitive = False
    bad_spend = failed_calls(a, "f2")
    bad_spend.usage.input_tokens = -1
    request = decision_log_service_pb2.ShipDecisionsRequest(
        entries=[shipped(a, "t1"), huge, shipped(a, "t3")],
        failed_calls=[failed_calls(a, "f1"), bad_spend],
        unsettled_calls=[unsettled_call(a, "u1")],
    )
    typed = (
        f"entries[1].decision.action.input_text.text: {MAX_TYPED_TEXT + 1} bytes;"
        f" at most {MAX_TYPED_TEXT}"
    )
    refusals = [
        decision_log_service_pb2.ShipRefusal(
            field="entries", index=1, record_id="t2", reason=typed, code="INVALID_ARGUMENT"
        ),
        decision_log_service_pb2.ShipRefusal(
            field="failed_calls",
            index=1,
            record_id="f2",
            reason="failed_calls[1].usage: token counts must not be negative",
            code="INVALID_ARGUMENT",
        ),
    ]
    for resend in (False, True):
        reply = await held.decisions.ShipDecisions(request)
        assert list(reply.refused) == refusals
        assert [(k.host_decision_id, k.step_index, k.duplicate) for k in reply.acks] == [
            ("t1", 1, resend),
            ("t2", 0, False),
            ("t3", 2, resend),
        ]
        assert reply.acks[1].decision_id == ""
        rows = await logged(held)
        assert [(r.step_index, r.tool_name) for r in rows] == [(1, "tap"), (2, "tap")]
        task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
        assert task.totals.usage.input_tokens == 500  # f1 counted once, f2 not at all
        assert task.totals.unsettled.calls == 1


async def test_a_record_holding_a_nul_is_refused_alone_and_the_others_are_taken(
    held: Held,
) -> None:
    """A NUL in one record's text (a rationale, a failed call's model name, as a host in
    another language may pass a provider's or a shell's output on) refused the whole call at
    the boundary (INVALID_ARGUMENT "entries[1].decision.rationale: NUL characters are not
    allowed"), against the contract's rule that a record's own problem refuses only that
    record: every other record of the call was lost. It is refused alone, named in `refused`."""
    a = held.assignment
    nul = shipped(a, "n2")
    nul.decision.rationale = "the switch\x00 is off"
    nul_spend = failed_calls(a, "f2")
    nul_spend.model = "m\x00"
    request = decision_log_service_pb2.ShipDecisionsRequest(
        entries=[shipped(a, "n1"), nul, shipped(a, "n3")],
        failed_calls=[failed_calls(a, "f1"), nul_spend],
    )
    reply = await held.decisions.ShipDecisions(request)
    assert [(r.field, r.index, r.record_id, r.reason, r.code) for r in reply.refused] == [
        (
            "entries",
            1,
            "n2",
            "entries[1].decision.rationale: NUL characters are not allowed",
            "INVALID_ARGUMENT",
        ),
        (
            "failed_calls",
            1,
            "f2",
            "failed_calls[1].model: NUL characters are not allowed",
            "INVALID_ARGUMENT",
        ),
    ]
    assert [(k.host_decision_id, k.step_index) for k in reply.acks] == [
        ("n1", 1),
        ("n2", 0),
        ("n3", 2),
    ]
    assert [r.rationale for r in await logged(held)] == ["because", "because"]
    task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
    assert task.totals.usage.input_tokens == 500  # f1 counted, f2 not
    only_nul = decision_log_service_pb2.ShipDecisionsRequest(entries=[nul])
    error = await refused(held.decisions.ShipDecisions(only_nul))  # nothing to take: as before
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "entries[0].decision.rationale: NUL characters are not allowed"


async def test_a_record_for_an_attempt_the_host_may_not_ship_into_is_refused_alone(
    held: Held, cloud: CloudServer, pki_dir: Path
) -> None:
    """A polyglot host (the protos, no amc code) ships records of several attempts in one
    call, one under a lease the cloud does not know (FAILED_PRECONDITION) and one under another
    host's (PERMISSION_DENIED). The whole call was refused with that code: every other record
    was lost to a client that never resends a refused call. Those records are refused alone,
    named in the reply with the reason the code gave; the others are logged and counted, a
    resend changes nothing. A request of nothing else keeps the code (the first record's)."""
    a = held.assignment
    other = ScriptedHost(cloud.address, pki_dir, "h2")
    try:
        await other.connect(["s2"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        await submit(
            held.ops,
            target=types_pb2.TaskTarget(host_id="h2"),
            lease_duration=Duration(seconds=120),
        )
        theirs = (await other.next("assignment")).assignment
        unknown = shipped(a, "l2")
        unknown.lease_id = "not-a-lease"
        spend_unknown = failed_calls(a, "f2")
        spend_unknown.lease_id = "not-a-lease"
        call_theirs = unsettled_call(theirs, "u1")
        request = decision_log_service_pb2.ShipDecisionsRequest(
            entries=[shipped(a, "l1"), unknown, shipped(theirs, "l3"), shipped(a, "l4")],
            failed_calls=[failed_calls(a, "f1"), spend_unknown],
            unsettled_calls=[call_theirs],
        )
        for resend in (False, True):
            reply = await held.decisions.ShipDecisions(request)
            assert [(r.field, r.index, r.record_id, r.code) for r in reply.refused] == [
                ("entries", 1, "l2", "FAILED_PRECONDITION"),
                ("entries", 2, "l3", "PERMISSION_DENIED"),
                ("failed_calls", 1, "f2", "FAILED_PRECONDITION"),
                ("unsettled_calls", 0, "u1", "PERMISSION_DENIED"),
            ]
            reasons = [r.reason for r in reply.refused]
            assert reasons[0].startswith("entries[1]: lease 'not-a-lease'"), reasons
            assert reasons[1].startswith("entries[2]: ") and "another host" in reasons[1]
            assert reasons[2].startswith("failed_calls[1]: lease 'not-a-lease'"), reasons
            assert "another host" in reasons[3] and reasons[3].startswith("unsettled_calls[0]: ")
            assert [(k.host_decision_id, k.step_index, k.duplicate) for k in reply.acks] == [
                ("l1", 1, resend),
                ("l2", 0, False),
                ("l3", 0, False),
                ("l4", 2, resend),
            ]
            assert [r.step_index for r in await logged(held)] == [1, 2]
            task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
            assert task.totals.usage.input_tokens == 500  # f1 once, f2 never
            mine = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=theirs.task_id))).task
            assert mine.totals.unsettled.calls == 0
        reply = await held.ops_decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=theirs.task_id)
        )
        assert list(reply.decisions) == []
        # Nothing to take: the whole call, with the first record's code and reason.
        error = await refused(ship(held, shipped(theirs, "l5"), unknown))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
        assert error.details().startswith("entries[0]: ") and "another host" in error.details()
        error = await refused(ship(held, unknown))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
    finally:
        await other.close()


async def test_a_record_holding_bytes_that_are_not_utf8_is_refused_alone(
    held: Held, pki_dir: Path
) -> None:
    """Bytes that are not UTF-8 in one record's text (a rationale cut in the middle of a
    character by a host in another language) made the request fail to parse, and the whole
    call was refused (INVALID_ARGUMENT "entries[1].decision.rationale: not valid UTF-8"),
    against the contract's rule that a record's own problem refuses only that record. The
    request is now read record by record: that one is refused alone, the others are taken."""
    a = held.assignment
    twin_class = wire.bytes_twin(decision_log_service_pb2.ShipDecisionsRequest.DESCRIPTOR)
    twin = twin_class.FromString(
        decision_log_service_pb2.ShipDecisionsRequest(
            entries=[shipped(a, "u1"), shipped(a, "u2"), shipped(a, "u3")],
            failed_calls=[failed_calls(a, "g1")],
        ).SerializeToString()
    )
    twin.entries[1].decision.rationale = b"the switch \xe2\x80 is off"
    async with channel(held.cloud.address, pki_dir, "host-h1") as ch:
        ship = ch.unary_unary(
            "/amc.v1.DecisionLogService/ShipDecisions",
            request_serializer=lambda raw: raw,
            response_deserializer=decision_log_service_pb2.ShipDecisionsResponse.FromString,
        )
        reply = await ship(twin.SerializeToString())
        assert [(r.field, r.index, r.record_id, r.reason, r.code) for r in reply.refused] == [
            (
                "entries",
                1,
                "u2",
                "entries[1].decision.rationale: not valid UTF-8",
                "INVALID_ARGUMENT",
            )
        ]
        assert [(k.host_decision_id, k.step_index) for k in reply.acks] == [
            ("u1", 1),
            ("u2", 0),
            ("u3", 2),
        ]
        assert [r.rationale for r in await logged(held)] == ["because", "because"]
        task = (await held.ops.GetTask(task_pb.GetTaskRequest(task_id=a.task_id))).task
        assert task.totals.usage.input_tokens == 500  # g1 counted
        only_bad = twin_class(entries=[twin.entries[1]])
        with pytest.raises(grpc.aio.AioRpcError) as error:  # nothing to take: as before
            await ship(only_bad.SerializeToString())
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == "entries[0].decision.rationale: not valid UTF-8"
