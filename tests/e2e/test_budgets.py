"""A task stopped by its budget before the provider is called, on both planner transports (its
own cap or the replica's default for tasks submitted without one), and the fleet's daily caps
(cost and tokens) stopping planning for everyone.

Every real part runs (the embedded stack: cloud over mTLS with SQLite, host, virtual phone over
the adb protocol); the model is the real Anthropic SDK against the local fake Messages server,
which counts every request it gets. Each scripted answer reports 500 input and 100 output
tokens (claude-sonnet-4-6: $3 / $15 per million, so $0.003 a call). With a cap of 700 tokens
the first call (600 spent) and the second (1,200) are made, the third is not: the attempt fails
with "budget exhausted: 1,200 tokens of the task's 700", the task is FAILED (not retried), and
the fake saw exactly two requests.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from amc.v1 import (
    decision_log_service_pb2,
    fleet_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud import metrics
from cloud.metrics import start_of_day
from console.embedded import Transport, embedded_stack, follow_tasks
from host.console import HostConsoleSettings
from host.console.login_token import issue, served_url
from tests.host.console.host_console_support import CSRF_RE
from tests.support.fakes import (
    FakeModelServer,
    ScriptedTurn,
    anthropic_message,
    text,
    thinking,
    tool_use,
)
from tests.support.migrated import seeded
from tests.support.waiting import until

KEY = "sk-ant-budget-test-key"


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key=KEY) as fake:
        for name in list(os.environ):
            if name.startswith(("AMC_PLANNER_", "ANTHROPIC_", "OPENAI_", "AI_PLANNER_")):
                monkeypatch.delenv(name)
        monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
        monkeypatch.setenv("AMC_PLANNER_MODEL", "claude-sonnet-4-6")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
        monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
        fake.script_anthropic(
            *[_launch(p) for p in ("com.android.settings", "com.android.contacts")]
        )
        yield fake


LAUNCH = {
    "package_name": "com.android.settings",
    "purpose": "open it",
    "expected_outcome": "it opens",
}


def _launch(package: str) -> ScriptedTurn:
    return anthropic_message(
        tool_use(
            "launch_app",
            {"package_name": package, "purpose": "open it", "expected_outcome": "it opens"},
        ),
        input_tokens=500,
        output_tokens=100,
    )


async def _run(
    data_dir: Path, transport: Transport, budget: types_pb2.TaskBudget | None = None
) -> tuple[types_pb2.Task, list[types_pb2.Decision], fleet_service_pb2.GetSpendResponse]:
    task, decisions, spend, _ = await _run_and_look(data_dir, transport, budget)
    return task, decisions, spend


async def _run_and_look(
    data_dir: Path, transport: Transport, budget: types_pb2.TaskBudget | None = None
) -> tuple[
    types_pb2.Task,
    list[types_pb2.Decision],
    fleet_service_pb2.GetSpendResponse,
    tuple[fleet_service_pb2.DispatchStatus, bool],
]:
    async with embedded_stack(seeded(data_dir), transport=transport) as stack:
        request = task_service_pb2.SubmitTaskRequest(goal="Open two apps", max_attempts=3)
        if budget is not None:
            request.budget.CopyFrom(budget)
        task_id = (await stack.operator.tasks.SubmitTask(request)).task.task_id
        final = await follow_tasks(stack.operator, [task_id], Console(file=io.StringIO()), 30)
        decisions = await stack.operator.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        spend = await stack.operator.fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
        task = (
            await stack.operator.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        ).task
        assert task.status == final[task_id].status
        hosts = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
        session = stack.cloud.leases.sessions["embedded-host"]
        held = await stack.cloud.leases.dispatcher.held_for(session)
        return task, list(decisions.decisions), spend, (hosts.dispatch, held)


@pytest.mark.parametrize("transport", ["cloud", "direct"])
async def test_a_task_stops_at_its_token_budget_before_the_provider_is_called(
    tmp_path: Path, fake_model: FakeModelServer, transport: Transport
) -> None:
    refused = (
        metrics.REGISTRY.get_sample_value("amc_cloud_budget_refusals_total", {"scope": "task"})
        or 0.0
    )
    outcome = {
        "provider": "anthropic",
        "model": "claude-sonnet-4-6",
        "outcome": "failed_precondition",
    }
    failed = metrics.REGISTRY.get_sample_value("amc_cloud_decide_seconds_count", outcome) or 0.0
    task, decisions, _ = await _run(
        tmp_path / "stack", transport, types_pb2.TaskBudget(max_tokens=700)
    )
    assert len(fake_model.bodies("/v1/messages")) == 2, "no model call after the cap"
    assert task.status == types_pb2.TASK_STATUS_FAILED
    assert task.result_summary == "budget exhausted: 1,200 tokens of the task's 700"
    assert task.attempt == 1, "a spent budget is not retried as another attempt"
    assert task.budget.max_tokens == 700
    if transport == "cloud":
        assert [d.usage.input_tokens for d in decisions] == [500, 500]
        assert [d.usage.cost_usd for d in decisions] == pytest.approx([0.003, 0.003])
        assert task.totals.usage.cost_usd == pytest.approx(0.006)
        after = metrics.REGISTRY.get_sample_value(
            "amc_cloud_budget_refusals_total", {"scope": "task"}
        )
        assert after == refused + 1
        # Decide's outcome label is the status the host got.
        seen = metrics.REGISTRY.get_sample_value("amc_cloud_decide_seconds_count", outcome)
        assert seen == failed + 1
    else:
        # The host made these calls itself; what reached the cloud (from its outbox, in the
        # background) is marked as shipped, and nothing past the cap was ever made.
        assert all(d.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT for d in decisions)
        assert len(decisions) <= 2


async def test_the_fleet_daily_cost_cap_stops_planning(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMC_CLOUD_DAILY_MAX_COST_USD", "0.005")
    task, decisions, spend, (dispatch, held) = await _run_and_look(tmp_path / "stack", "cloud")
    # Queued work waits for tomorrow instead of failing at its first step.
    assert held and dispatch.paused
    assert dispatch.reason.startswith("the fleet's daily model budget is spent since ")
    assert ": budget exhausted: $0.0060 of the fleet's daily $0.0050" in dispatch.reason
    assert len(fake_model.bodies("/v1/messages")) == 2
    assert task.status == types_pb2.TASK_STATUS_FAILED
    assert task.result_summary.startswith("budget exhausted: $0.0060 of the fleet's daily $0.0050")
    assert len(decisions) == 2
    assert spend.daily_budget.max_cost_usd == pytest.approx(0.005)
    assert spend.today.cost_usd == pytest.approx(0.006)
    (row,) = spend.rows
    assert (row.host_id, row.provider, row.model, row.decisions) == (
        "embedded-host",
        "anthropic",
        "claude-sonnet-4-6",
        2,
    )
    assert row.usage.input_tokens == 1000 and row.usage.cost_usd == pytest.approx(0.006)


async def test_the_default_task_cap_applies_when_a_submission_sets_none(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMC_CLOUD_DEFAULT_TASK_MAX_TOKENS", "700")
    task, _, _ = await _run(tmp_path / "stack", "cloud")
    assert task.budget.max_tokens == 700, "the default is stored with the task"
    assert len(fake_model.bodies("/v1/messages")) == 2
    assert task.status == types_pb2.TASK_STATUS_FAILED
    assert task.result_summary == "budget exhausted: 1,200 tokens of the task's 700"


async def test_the_fleet_daily_token_cap_stops_planning(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMC_CLOUD_DAILY_MAX_TOKENS", "700")
    task, decisions, spend, (dispatch, held) = await _run_and_look(tmp_path / "stack", "cloud")
    assert held and dispatch.paused
    assert len(fake_model.bodies("/v1/messages")) == 2
    assert task.status == types_pb2.TASK_STATUS_FAILED
    assert task.result_summary.startswith(
        "budget exhausted: 1,200 tokens of the fleet's daily 700 (UTC day "
    )
    assert len(decisions) == 2
    assert spend.daily_budget.max_tokens == 700


def _no_tool_call() -> ScriptedTurn:
    return anthropic_message(
        text("I would rather look around first."), input_tokens=500, output_tokens=100
    )


async def test_a_failed_decision_s_billed_calls_count_toward_the_budgets(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model answers without a tool call, to the forced retry too, to the corrective turn
    and to its forced retry: the decision fails (UNKNOWN, the task fails) after four answered
    calls the provider billed (2,400 tokens, $0.012) and no decision row. They count in the
    task's totals, today's spending and GetSpend (a row with no decisions), so the next task is
    held back by the fleet's daily cap (queued, never handed out) instead of spending again."""
    monkeypatch.setenv("AMC_CLOUD_DAILY_MAX_TOKENS", "700")
    fake_model.anthropic_script.clear()
    fake_model.script_anthropic(*[_no_tool_call() for _ in range(4)])
    async with embedded_stack(seeded(tmp_path / "stack"), transport="cloud") as stack:
        ops = stack.operator
        first, second = [
            (await ops.tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(goal=goal))).task.task_id
            for goal in ("Open two apps", "Open one app")
        ]
        await follow_tasks(ops, [first], Console(file=io.StringIO()), 30)
        await stack.cloud.leases.dispatcher.dispatch_pass()  # the phone is free again
        failed, held = [
            (await ops.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=t))).task
            for t in (first, second)
        ]
        spend = await ops.fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
        logged = await ops.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=first)
        )
    assert len(fake_model.bodies("/v1/messages")) == 4, "no model call after the failed one"
    assert list(logged.decisions) == []
    assert failed.status == types_pb2.TASK_STATUS_FAILED
    assert "unusable tool call twice" in failed.result_summary
    assert (failed.totals.usage.input_tokens, failed.totals.usage.output_tokens) == (2000, 400)
    assert failed.totals.usage.cost_usd == pytest.approx(0.012)
    assert (held.status, held.attempt) == (types_pb2.TASK_STATUS_QUEUED, 0)
    assert held.totals.usage == types_pb2.Usage()
    assert (spend.today.input_tokens, spend.today.output_tokens) == (2000, 400)
    assert spend.today.cost_usd == pytest.approx(0.012)
    (row,) = spend.rows
    assert (row.host_id, row.provider, row.model, row.decisions) == (
        "embedded-host",
        "anthropic",
        "claude-sonnet-4-6",
        0,
    )
    assert row.usage.output_tokens == 400 and row.usage.cost_usd == pytest.approx(0.012)


async def test_a_direct_host_ships_a_failed_decision_s_billed_calls(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """The same model on the direct transport: the host made the four billed calls itself and
    no decision came of them. Its outbox ships what they cost (ShipDecisions' failed_calls),
    and the cloud counts it in the task's totals, today's spending and GetSpend."""
    fake_model.anthropic_script.clear()
    fake_model.script_anthropic(*[_no_tool_call() for _ in range(4)])
    async with embedded_stack(seeded(tmp_path / "stack"), transport="direct") as stack:
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Open two apps")
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        await follow_tasks(ops, [task_id], Console(file=io.StringIO()), 30)

        async def task() -> types_pb2.Task:
            get = task_service_pb2.GetTaskRequest(task_id=task_id)
            found: types_pb2.Task = (await ops.tasks.GetTask(get)).task
            return found

        async def counted() -> bool:
            return (await task()).totals.usage.input_tokens > 0

        await until(counted, what="the failed decision's calls shipped and counted")
        failed = await task()
        spend = await ops.fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
    assert len(fake_model.bodies("/v1/messages")) == 4
    assert failed.status == types_pb2.TASK_STATUS_FAILED
    assert "unusable tool call twice" in failed.result_summary
    assert (failed.totals.usage.input_tokens, failed.totals.usage.output_tokens) == (2000, 400)
    assert failed.totals.usage.cost_usd == pytest.approx(0.012)
    assert (spend.today.input_tokens, spend.today.output_tokens) == (2000, 400)
    (row,) = spend.rows
    assert (row.host_id, row.model, row.decisions) == ("embedded-host", "claude-sonnet-4-6", 0)
    assert row.usage.cost_usd == pytest.approx(0.012)


async def test_a_direct_host_ships_the_calls_of_a_decision_cancelled_mid_way(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """The host's own planner: the first call is answered without a tool call (billed), the
    retry is held by the provider when the operator cancels the task. The decision is cancelled
    on the host mid-way; its answered call is shipped (failed_calls) and counted all the same."""
    hold = threading.Event()
    held = _launch("com.android.settings")
    held.hold = hold
    fake_model.anthropic_script.clear()
    fake_model.script_anthropic(_no_tool_call(), held)
    try:
        async with embedded_stack(seeded(tmp_path / "stack"), transport="direct") as stack:
            ops = stack.operator
            request = task_service_pb2.SubmitTaskRequest(goal="Open two apps")
            task_id = (await ops.tasks.SubmitTask(request)).task.task_id
            await until(lambda: len(fake_model.bodies("/v1/messages")) == 2, what="retry asked")
            await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id))
            get = task_service_pb2.GetTaskRequest(task_id=task_id)

            async def counted() -> bool:
                return bool((await ops.tasks.GetTask(get)).task.totals.usage.input_tokens)

            await until(counted, what="the cancelled decision's answered call counted")
            cancelled = (await ops.tasks.GetTask(get)).task
            spend = await ops.fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
    finally:
        hold.set()
    assert cancelled.status == types_pb2.TASK_STATUS_CANCELLED
    usage = cancelled.totals.usage
    assert (usage.input_tokens, usage.output_tokens) == (500, 100)
    assert usage.cost_usd == pytest.approx(0.003)
    assert (spend.today.input_tokens, spend.today.output_tokens) == (500, 100)
    (row,) = spend.rows
    assert (row.host_id, row.model, row.decisions) == ("embedded-host", "claude-sonnet-4-6", 0)


async def test_a_direct_host_counts_the_model_call_in_flight_at_a_cancel_once_it_answers(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """The host's own planner: the first call of a step is answered without a tool call
    (billed); the provider is still working on the retry when the operator cancels the task.
    The provider answers the retry all the same (it bills it: 600 more tokens) after the
    attempt was cancelled: the host ships that call too, and it counts in the task's totals
    and GetSpend; nothing else is asked of the model."""
    hold = threading.Event()
    held = _launch("com.android.settings")
    held.hold = hold
    fake_model.anthropic_script.clear()
    fake_model.script_anthropic(_no_tool_call(), held)
    try:
        async with embedded_stack(seeded(tmp_path / "stack"), transport="direct") as stack:
            ops = stack.operator
            request = task_service_pb2.SubmitTaskRequest(goal="Open two apps")
            task_id = (await ops.tasks.SubmitTask(request)).task.task_id
            await until(lambda: len(fake_model.bodies("/v1/messages")) == 2, what="retry asked")
            await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id))
            get = task_service_pb2.GetTaskRequest(task_id=task_id)

            async def cancelled() -> bool:
                task = (await ops.tasks.GetTask(get)).task
                return bool(task.status == types_pb2.TASK_STATUS_CANCELLED)

            await until(cancelled, what="the attempt cancelled")
            hold.set()  # the provider answers the call it was working on

            async def counted() -> bool:
                usage = (await ops.tasks.GetTask(get)).task.totals.usage
                return bool(usage.input_tokens >= 1000)

            await until(counted, what="the call in flight at the cancel counted")
            task = (await ops.tasks.GetTask(get)).task
            spend = await ops.fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
    finally:
        hold.set()
    assert task.status == types_pb2.TASK_STATUS_CANCELLED
    usage = task.totals.usage
    assert (usage.input_tokens, usage.output_tokens) == (1000, 200)
    assert usage.cost_usd == pytest.approx(0.006)
    assert (spend.today.input_tokens, spend.today.output_tokens) == (1000, 200)
    assert len(fake_model.bodies("/v1/messages")) == 2


async def test_a_direct_host_counts_what_a_streamed_call_cut_off_at_a_cancel_reported(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session mode streams the host's model calls. The operator cancels the task while the
    answer is streaming (its thinking shows in the host's console): the host hangs up, but the
    provider billed the input `message_start` reported. The host keeps that call in its
    timeline as cut off (`StreamCutOff`) and ships it: it counts once in the task's totals and
    GetSpend."""
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    monkeypatch.setenv("AMC_PLANNER_THINKING", "budget")
    monkeypatch.setenv("AMC_PLANNER_THINKING_BUDGET_TOKENS", "2048")
    hold = threading.Event()
    fake_model.anthropic_script.clear()
    fake_model.anthropic_script.append(
        ScriptedTurn(
            [thinking("Settings is an app."), tool_use("launch_app", LAUNCH)],
            usage={
                "input_tokens": 500,
                "output_tokens": 300,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 200,
            },
            hold=hold,
            hold_after="content_block_delta",  # message_start and the first thinking delta
        )
    )
    tokens = tmp_path / "console-tokens"
    console = HostConsoleSettings(bind_port=0, token_dir=tokens)
    try:
        async with embedded_stack(
            seeded(tmp_path / "stack"), transport="direct", host_console=console
        ) as stack:
            ops = stack.operator
            request = task_service_pb2.SubmitTaskRequest(goal="Open Settings")
            task_id = (await ops.tasks.SubmitTask(request)).task.task_id
            await until(lambda: served_url(tokens) is not None, what="the host console up")
            async with httpx.AsyncClient(base_url=str(served_url(tokens))) as web:
                page = await web.get("/login")
                match = CSRF_RE.search(page.text)
                assert match
                login = {"token": issue(tokens), "csrf_token": match.group(1)}
                assert (await web.post("/login", data=login)).status_code == 303

                async def thinking_shown() -> bool:
                    live = await web.get(f"/tasks/{task_id}/live", params={"attempt": 1})
                    return live.status_code == 200 and bool(live.json()["thinking"])

                # The host read message_start before its first thinking delta.
                await until(thinking_shown, what="the streamed thinking on the host")
            await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id))
            get = task_service_pb2.GetTaskRequest(task_id=task_id)

            async def counted() -> bool:
                task = (await ops.tasks.GetTask(get)).task
                cancelled = task.status == types_pb2.TASK_STATUS_CANCELLED
                return bool(cancelled and task.totals.usage.input_tokens)

            await until(counted, what="the cut-off call counted")
            hold.set()  # the provider would go on; nobody listens any more
            task = (await ops.tasks.GetTask(get)).task
            spend = await ops.fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
    finally:
        hold.set()
    timeline = sqlite3.connect(tmp_path / "stack" / "host" / "task_progress.sqlite3")
    try:
        kept = timeline.execute("SELECT error, usage FROM failed_calls").fetchall()
    finally:
        timeline.close()
    assert [(error, json.loads(usage)["input_tokens"]) for error, usage in kept] == [
        ("StreamCutOff", 500)
    ]
    for usage in (task.totals.usage, spend.today):
        assert (
            usage.input_tokens,
            usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens,
            usage.output_tokens,
        ) == (500, 1000, 200, 1)  # output: what message_start reported, no message_delta came
        assert usage.cost_usd == pytest.approx(0.002565)
    assert len(fake_model.bodies("/v1/messages")) == 1


async def test_a_direct_host_stops_calling_the_model_within_a_task_at_the_fleet_s_daily_cap(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Direct transport, a daily cap of 1,500 tokens. The first task spends 600 (shipped and
    counted), so the second is handed out (600 of 1,500). Its assignment says so: its first
    call brings the day to 1,200, its second to 1,800, and no third call is made: the attempt
    fails, not retried, with the words Decide uses for the daily cap on the cloud transport.
    (Before, the host knew only its task's caps and went on calling the model all task long.)"""
    monkeypatch.setenv("AMC_CLOUD_DAILY_MAX_TOKENS", "1500")
    done = anthropic_message(
        tool_use("complete", {"success": True, "reason": "opened"}),
        input_tokens=500,
        output_tokens=100,
    )
    fake_model.anthropic_script.clear()
    fake_model.script_anthropic(
        done, _launch("com.android.settings"), _launch("com.android.contacts"), done
    )
    async with embedded_stack(seeded(tmp_path / "stack"), transport="direct") as stack:
        ops = stack.operator

        async def submit(goal: str) -> str:
            request = task_service_pb2.SubmitTaskRequest(goal=goal)
            task_id: str = (await ops.tasks.SubmitTask(request)).task.task_id
            return task_id

        first = await submit("Say done")
        await follow_tasks(ops, [first], Console(file=io.StringIO()), 30)

        async def shipped() -> bool:
            today = start_of_day(stack.cloud.store.now())
            return (await stack.cloud.budgets.spend.today(today)).input_tokens == 500

        await until(shipped, what="the first task's decision shipped and counted")
        second = await submit("Open two apps")
        ended = await follow_tasks(ops, [second], Console(file=io.StringIO()), 30)
    task = ended[second]
    assert task.status == types_pb2.TASK_STATUS_FAILED, task.result_summary
    assert task.result_summary.startswith(
        "budget exhausted: 1,800 tokens of the fleet's daily 1,500 (UTC day "
    ), task.result_summary
    assert task.attempt == 1  # not retried
    assert len(fake_model.bodies("/v1/messages")) == 3, "no call past the daily cap"


async def test_a_direct_host_gets_no_new_task_once_the_fleet_s_daily_cap_is_spent(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct-transport host calls the model itself, so no Decide of its is ever refused by
    the fleet's daily cap; its shipped spending counts toward it all the same. Once what it
    shipped spends the day's 700 tokens, the next task is held back from it (queued, not run
    into more model calls), and the fleet's DispatchStatus says why."""
    monkeypatch.setenv("AMC_CLOUD_DAILY_MAX_TOKENS", "700")
    done = anthropic_message(
        tool_use("complete", {"success": True, "reason": "opened"}),
        input_tokens=500,
        output_tokens=100,
    )
    fake_model.anthropic_script.clear()
    fake_model.script_anthropic(_launch("com.android.settings"), done)
    async with embedded_stack(seeded(tmp_path / "stack"), transport="direct") as stack:
        ops = stack.operator

        async def submit(goal: str) -> str:
            request = task_service_pb2.SubmitTaskRequest(goal=goal)
            task_id: str = (await ops.tasks.SubmitTask(request)).task.task_id
            return task_id

        first = await submit("Open Settings")
        ended = await follow_tasks(ops, [first], Console(file=io.StringIO()), 30)

        async def shipped() -> bool:
            # Today's tally as the replica's daily cap reads it (fresh within a second).
            today = start_of_day(stack.cloud.store.now())
            return (await stack.cloud.budgets.spend.today(today)).input_tokens == 1000

        await until(shipped, what="the first task's decisions shipped and counted")
        second = await submit("Open Contacts")

        async def dispatch() -> fleet_service_pb2.DispatchStatus:
            hosts = await ops.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
            status: fleet_service_pb2.DispatchStatus = hosts.dispatch
            return status

        async def held() -> bool:
            return (await dispatch()).paused

        await until(held, what="dispatch paused for the daily cap")
        status = await dispatch()
        queued = (await ops.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=second))).task
    assert ended[first].status == types_pb2.TASK_STATUS_SUCCEEDED
    assert status.reason.startswith("the fleet's daily model budget is spent since ")
    assert ": budget exhausted: 1,200 tokens of the fleet's daily 700 (UTC day " in status.reason
    assert queued.status == types_pb2.TASK_STATUS_QUEUED
    assert len(fake_model.bodies("/v1/messages")) == 2, "no model call for the held task"
