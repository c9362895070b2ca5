"""The spending ledger on both backends: cost stored per decision (migration 0012), summed per
attempt, task, host, model and UTC day; task caps stored at submission."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import text, update

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, task_service_pb2, types_pb2
from cloud.server import CloudServer
from cloud.store import decisions, spend, tasks
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.models import DecisionRow, TaskRow
from planner.decision import Billed, Decision, Usage
from tests.cloud.cloud_harness import channel, table_names
from tests.cloud.test_store import _columns, _decision


def _costly(input_tokens: int, cost: float, model: str = "m") -> Decision:
    decision = _decision()
    decision.usage = Usage(
        input_tokens=input_tokens,
        output_tokens=10,
        cache_read_input_tokens=5,
        cache_creation_input_tokens=1,
        thinking_tokens=2,
        cost_usd=cost,
    )
    decision.model = model
    return decision


async def _submit(store: Store, max_tokens: int = 0, max_cost_usd: float = 0.0) -> str:
    view, _ = await tasks.submit(
        store,
        tasks.NewTask(
            goal="g",
            max_attempts=3,
            lease_seconds=30,
            timeout_seconds=3600,
            max_tokens=max_tokens,
            max_cost_usd=max_cost_usd,
        ),
    )
    return view.task.task_id


async def test_spending_is_summed_per_attempt_task_host_model_and_day(db_url: str) -> None:
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        task_id = await _submit(s, max_tokens=5000, max_cost_usd=1.5)
        other = await _submit(s)
        a1 = await decisions.append(s, "h1", task_id, 1, _costly(100, 0.25))
        await decisions.append(s, "h1", task_id, 1, _costly(200, 0.5))
        await decisions.append(s, "h2", task_id, 2, _costly(300, 1.0, "n"))
        await decisions.append(s, "h2", other, 1, _costly(50, 0.125))
        yesterday = s.now() - dt.timedelta(days=1)
        async with s.write() as session:
            await session.execute(
                update(DecisionRow)
                .where(DecisionRow.decision_id == a1.decision_id)
                .values(created_at=yesterday)
            )

        total = await spend.spent(s, task_id)
        assert (total.input_tokens, total.output_tokens, total.cost_usd) == (600, 30, 1.75)
        assert total.billed_tokens == 600 + 30 + 15 + 3
        assert (await spend.spent(s, "no-such-task")) == Usage()

        by_attempt = await spend.usage_by_attempt(s, [task_id, other])
        assert by_attempt[(task_id, 1)].cost_usd == 0.75
        assert by_attempt[(task_id, 2)].cost_usd == 1.0
        assert by_attempt[(other, 1)].input_tokens == 50

        view = await tasks.get(s, task_id)
        assert view is not None
        assert (view.task.max_tokens, view.task.max_cost_usd) == (5000, 1.5)
        assert view.task.cost_usd == 1.75  # the task's cost total, kept as decisions are logged
        found = await tasks.budget_and_spent(s, task_id)
        assert found is not None and found[0] == (5000, 1.5)
        assert await tasks.budget_and_spent(s, "no-such-task") is None

        today = s.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        assert (await spend.spent_since(s, today)).cost_usd == 1.625
        rows = await spend.spend_rows(s, today - dt.timedelta(days=1), today + dt.timedelta(days=1))
        keyed = {(r.day, r.host_id, r.model): (r.decisions, r.usage.cost_usd) for r in rows}
        day0, day1 = f"{yesterday:%Y-%m-%d}", f"{today:%Y-%m-%d}"
        assert keyed == {
            (day0, "h1", "m"): (1, 0.25),
            (day1, "h1", "m"): (1, 0.5),
            (day1, "h2", "m"): (1, 0.125),
            (day1, "h2", "n"): (1, 1.0),
        }
        assert [r.day for r in rows] == sorted(r.day for r in rows)
    finally:
        await s.close()


async def test_migration_0012_cost_and_caps_up_and_down(db_url: str) -> None:
    """0012 is additive: a cost per decision, a cost total and two caps per task, dropped by its
    downgrade without losing rows; a row from before it costs 0 and a task has no cap."""
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        task_id = await _submit(s, max_tokens=10)
        row = await decisions.append(s, "h1", task_id, 1, _costly(10, 0.5))
        await downgrade(s.engine, "0011")
        async with s.engine.connect() as conn:
            assert "cost_usd" not in await conn.run_sync(_columns, "decisions")
            assert not {"max_tokens", "max_cost_usd", "cost_usd"} & await conn.run_sync(
                _columns, "tasks"
            )
        await upgrade(s.engine)
        (old,) = (await decisions.list_page(s, task_id, 0, 5, ""))[0]
        assert old.decision_id == row.decision_id and old.cost_usd == 0.0
        found = await tasks.budget_and_spent(s, task_id)
        assert found is not None and found[0] == (0, 0.0)
        await check(s.engine)
    finally:
        await s.close()


async def test_get_spend_and_budget_fields_through_the_services(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """GetSpend answers operators (INVALID_ARGUMENT naming the field for a bad day or range,
    PERMISSION_DENIED for a host); SubmitTask stores caps and refuses negative ones."""
    submitted = await ops.SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            goal="g", budget=types_pb2.TaskBudget(max_tokens=9000, max_cost_usd=0.5)
        )
    )
    assert submitted.task.budget == types_pb2.TaskBudget(max_tokens=9000, max_cost_usd=0.5)
    for budget, field in (
        (types_pb2.TaskBudget(max_tokens=-1), "budget.max_tokens"),
        (types_pb2.TaskBudget(max_cost_usd=-0.5), "budget.max_cost_usd"),
        (types_pb2.TaskBudget(max_cost_usd=float("nan")), "budget.max_cost_usd"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.SubmitTask(task_service_pb2.SubmitTaskRequest(goal="g", budget=budget))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(field)

    ch = channel(cloud.address, pki_dir, "operator-ops")
    host = channel(cloud.address, pki_dir, "host-h1")
    try:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        empty = await fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
        assert list(empty.rows) == [] and empty.today == types_pb2.Usage()
        for request, field in (
            (fleet_service_pb2.GetSpendRequest(since_day="2026-13-01"), "since_day"),
            (fleet_service_pb2.GetSpendRequest(until_day="yesterday"), "until_day"),
            (
                fleet_service_pb2.GetSpendRequest(since_day="2026-12-02", until_day="2026-12-01"),
                "since_day",
            ),
            (
                fleet_service_pb2.GetSpendRequest(since_day="2024-01-01", until_day="2026-01-01"),
                "since_day..until_day",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fleet.GetSpend(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (err.value.details() or "").startswith(field), err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await fleet_service_pb2_grpc.FleetServiceStub(host).GetSpend(
                fleet_service_pb2.GetSpendRequest()
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await ch.close()
        await host.close()


async def test_the_fleet_s_spending_today_is_read_once_a_second_not_per_call(
    store: Store,
) -> None:
    """The daily cap's total (`spend.DailySpend`): however many Decide calls ask, the day's
    rows are summed once per `settle` and the recent tail once per `refresh_s`; what this
    replica logs counts at once, another replica's within `refresh_s`, a decision shipped late
    (made before the settled mark) at the next settling."""
    clock = [100.0]
    daily = spend.DailySpend(
        store, refresh_s=1.0, settle=dt.timedelta(seconds=1), monotonic=lambda: clock[0]
    )
    task_id = await _submit(store)
    today = store.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    await decisions.append(store, "h1", task_id, 1, _costly(100, 0.25))
    for _ in range(50):
        assert (await daily.today(today)).cost_usd == 0.25
    assert daily.reads == 2  # the settled part and the tail, once

    # This replica's own decision counts at once, without a read.
    await decisions.append(store, "h1", task_id, 1, _costly(100, 0.5))
    daily.add(_costly(100, 0.5).usage)
    assert (await daily.today(today)).cost_usd == 0.75 and daily.reads == 2
    # Another replica's counts after `refresh_s` (and this one's is not counted twice).
    await decisions.append(store, "h2", task_id, 1, _costly(100, 1.0))
    assert (await daily.today(today)).cost_usd == 0.75
    clock[0] += 1.01
    assert (await daily.today(today)).cost_usd == 1.75
    assert daily.reads == 4  # the tail, and (`settle` is a second here too) the settled part

    # Shipped late: made before the settled mark, so only the next settling sees it.
    late = await decisions.append(store, "h3", task_id, 1, _costly(100, 2.0))
    async with store.write() as session:
        await session.execute(
            update(DecisionRow)
            .where(DecisionRow.decision_id == late.decision_id)
            .values(created_at=max(today, store.now() - dt.timedelta(seconds=30)))
        )
    clock[0] += 1.01
    assert (await daily.today(today)).cost_usd == 3.75  # settle passed too: summed again
    assert (await daily.today(today)) == await spend.spent_since(store, today)

    # A new day starts from its own rows.
    assert (await daily.today(today + dt.timedelta(days=1))).cost_usd == 0.0


async def test_a_decision_logged_while_the_total_is_read_is_never_missed(store: Store) -> None:
    """A read that began before this replica logged a decision may or may not include it: the
    decision is counted on top until the next read (twice meanwhile, never missed)."""
    clock = [100.0]
    daily = spend.DailySpend(store, refresh_s=1.0, monotonic=lambda: clock[0])
    task_id = await _submit(store)
    today = store.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert (await daily.today(today)).cost_usd == 0.0
    await decisions.append(store, "h1", task_id, 1, _costly(100, 0.5))
    daily.add(_costly(100, 0.5).usage)  # logged at t=100, the instant the next read begins
    clock[0] += 1.0
    # The read at t=101 (it began after the add) sees the row: the add is dropped, not doubled.
    assert (await daily.today(today)).cost_usd == 0.5
    clock[0] += 1.0
    assert (await daily.today(today)).cost_usd == 0.5


async def test_a_failed_decision_s_calls_count_in_every_total(store: Store) -> None:
    """Both backends: the calls of a decision that failed (`failed_decision_spend`, no decision
    row) count in the task's spending and totals (its budget), each attempt's, the day's (the
    daily cap) and GetSpend's rows, which count decisions only; the earlier attempts' spending
    a new attempt is handed leaves the current one out; pruning an old task drops the record,
    not the task's totals."""
    task_id = await _submit(store, max_tokens=100)
    await decisions.append(store, "h1", task_id, 1, _costly(100, 0.25))
    failed = Usage(500, 100, 20, 10, 40, 0.5)
    await spend.count_failed(
        store, "h1", task_id, 2, Billed("offline", "m", failed), "PlannerRefused"
    )

    total = await spend.spent(store, task_id)
    assert (total.input_tokens, total.output_tokens, total.cost_usd) == (600, 110, 0.75)
    assert total.thinking_tokens == 42
    async with store.read() as session:
        assert (await spend.spent_in(session, task_id, 2)).cost_usd == 0.25
    by_attempt = await spend.usage_by_attempt(store, [task_id])
    assert (by_attempt[(task_id, 1)].cost_usd, by_attempt[(task_id, 2)].cost_usd) == (0.25, 0.5)
    found = await tasks.budget_and_spent(store, task_id)
    assert found is not None and found[1] == total
    view = await tasks.get(store, task_id)
    assert view is not None and view.task.cost_usd == 0.75

    today = store.now().astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert await spend.spent_since(store, today) == total
    assert await spend.DailySpend(store).today(today) == total
    (row,) = await spend.spend_rows(store, today, today + dt.timedelta(days=1))
    assert (row.host_id, row.model, row.decisions, row.usage) == ("h1", "m", 1, total)

    async with store.write() as session:
        await session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == task_id)
            .values(finished_at=store.now() - dt.timedelta(days=30))
        )
    await decisions.prune(store, dt.timedelta(days=7))
    assert await spend.spent(store, task_id) == Usage()
    found = await tasks.budget_and_spent(store, task_id)
    assert found is not None and found[1] == total


async def test_a_task_s_failed_calls_are_summed_per_attempt(store: Store) -> None:
    """Both backends: what the decision log's readers add to the decisions (ListDecisions'
    failed_calls): per attempt in order, how many failed decisions and what their calls cost;
    only the attempt asked for, when one is."""
    task_id = await _submit(store)
    other = await _submit(store)
    for attempt, used in ((2, Usage(5, 1, cost_usd=0.5)), (1, Usage(7)), (2, Usage(3, 2))):
        billed = Billed("anthropic", "m", used)
        await spend.count_failed(store, "h1", task_id, attempt, billed, "PlannerError")
    await spend.count_failed(store, "h1", other, 1, Billed("p", "m", Usage(100)), "PlannerError")

    every = await spend.failed_by_attempt(store, task_id)
    assert [(f.attempt, f.decisions) for f in every] == [(1, 1), (2, 2)]
    assert every[0].usage == Usage(7)
    assert every[1].usage == Usage(8, 3, cost_usd=0.5)
    assert await spend.failed_by_attempt(store, task_id, 2) == every[1:]
    assert await spend.failed_by_attempt(store, task_id, 3) == []


async def test_migration_0017_adds_the_failed_decisions_spend_and_back(db_url: str) -> None:
    """Both backends: 0017 adds the table `failed_decision_spend` and nothing else; its
    downgrade drops it; the schema matches the models again after the upgrade."""
    s = Store.from_url(db_url)

    try:
        await upgrade(s.engine, "0016")
        before = await table_names(s)
        await upgrade(s.engine, "0017")
        assert await table_names(s) - before == {"failed_decision_spend"}
        await upgrade(s.engine)  # the store's code writes the columns of later migrations
        task_id = await _submit(s)
        await spend.count_failed(s, "h1", task_id, 1, Billed("p", "m", Usage(5)), "PlannerError")
        await downgrade(s.engine, "0016")
        assert await table_names(s) == before
        found = await tasks.budget_and_spent(s, task_id)
        assert found is not None and found[1].input_tokens == 5  # the task's totals stay
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()


async def test_retention_counts_what_it_deletes_of_each_task_and_when(store: Store) -> None:
    """Both backends: each task's row counts the decisions and failed decisions' call records
    the retention deleted (across batches that split tasks), and when; `pruned` reads it with
    what they cost (the totals less what is left); a task it did not touch has no record."""
    old, other, recent = [await _submit(store) for _ in range(3)]
    for task_id, n in ((old, 3), (other, 2), (recent, 1)):
        for _ in range(n):
            await decisions.append(store, "h1", task_id, 1, _costly(100, 0.25))
    for task_id in (old, recent):
        billed = Billed("anthropic", "m", Usage(7, cost_usd=0.5))
        await spend.count_failed(store, "h1", task_id, 1, billed, "PlannerError")
    ended = store.now() - dt.timedelta(days=30)
    async with store.write() as session:
        await session.execute(
            update(TaskRow).where(TaskRow.task_id.in_([old, other])).values(finished_at=ended)
        )
    before = store.now()
    assert await decisions.prune(store, dt.timedelta(days=7), batch_size=2) == 5

    found = await decisions.pruned(store, old)
    assert found is not None
    assert (found.decisions, found.failed_decisions) == (3, 1)
    assert found.at >= before
    assert (found.usage.input_tokens, found.usage.output_tokens) == (307, 30)
    assert found.usage.cost_usd == pytest.approx(1.25)
    found = await decisions.pruned(store, other)
    assert found is not None and (found.decisions, found.failed_decisions) == (2, 0)
    assert await decisions.pruned(store, recent) is None
    assert await decisions.pruned(store, "no-such-task") is None
    # A second pass finds nothing more and changes no count.
    assert await decisions.prune(store, dt.timedelta(days=7)) == 0
    again = await decisions.pruned(store, old)
    assert again is not None and (again.decisions, again.failed_decisions) == (3, 1)


async def test_migration_0022_adds_the_tasks_pruned_record_and_back(db_url: str) -> None:
    """Both backends: 0022 adds the three columns of what retention deleted (an existing task
    has nothing pruned), and its downgrade drops them without losing the task."""
    s = Store.from_url(db_url)

    async def tasks_columns() -> set[str]:
        async with s.engine.connect() as conn:
            return await conn.run_sync(_columns, "tasks")

    try:
        await upgrade(s.engine, "0021")
        before = await tasks_columns()
        await upgrade(s.engine, "0022")
        assert await tasks_columns() - before == {
            "pruned_decisions",
            "pruned_failed_decisions",
            "pruned_at",
        }
        await upgrade(s.engine)  # the task's row as the models write it now
        task_id = await _submit(s)
        assert await decisions.pruned(s, task_id) is None
        await downgrade(s.engine, "0021")
        assert await tasks_columns() == before
        async with s.engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM tasks"))).scalar_one() == 1
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()
