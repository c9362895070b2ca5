"""The spending ledger: sums of what decisions cost, per attempt, task, host, model and UTC day.

Every decision row keeps its tokens and its cost (`DecisionRow.cost_usd`, priced when the model
answered), so every total is a query over the decision log: a task's spending, the fleet's
today (the daily cap, the metrics), each attempt's (GetTask), and the rows of
FleetService.GetSpend. (A task's budget is checked before each Decide against the totals the
task's own row keeps, `tasks.budget_and_spent`, counted with each decision: one row, however
long the attempt.) Decisions made on the direct
transport count once their host has shipped them from its outbox.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store.database import Store
from cloud.store.models import DecisionRow
from planner.decision import Usage


def usage_columns() -> list[ColumnElement[Any]]:
    """Sums of a decision group's tokens and cost, in `Usage` field order."""
    return [
        func.coalesce(func.sum(column), 0)
        for column in (
            DecisionRow.input_tokens,
            DecisionRow.output_tokens,
            DecisionRow.cache_read_input_tokens,
            DecisionRow.cache_creation_input_tokens,
            DecisionRow.thinking_tokens,
            DecisionRow.cost_usd,
        )
    ]


def usage_of(values: Sequence[Any]) -> Usage:
    i, o, cr, cw, th, cost = values
    return Usage(int(i), int(o), int(cr), int(cw), int(th), float(cost))


async def spent(store: Store, task_id: str) -> Usage:
    """What every decision of a task cost, over all its attempts."""
    async with store.read() as session:
        return await spent_in(session, task_id)


def spent_query(task_id: str, before_attempt: int = 0) -> Select[Any]:
    """The sums of what the task's decisions cost (only attempts before `before_attempt`, when
    given): one row for `usage_of`."""
    stmt = select(*usage_columns()).where(DecisionRow.task_id == task_id)
    if before_attempt:
        stmt = stmt.where(DecisionRow.attempt < before_attempt)
    return stmt


async def spent_in(session: AsyncSession, task_id: str, before_attempt: int = 0) -> Usage:
    """What the task's decisions cost (only attempts before `before_attempt`, when given), read
    in an open session."""
    return usage_of((await session.execute(spent_query(task_id, before_attempt))).one())


async def spent_since(store: Store, since: dt.datetime) -> Usage:
    """What every decision logged at or after `since` cost (the fleet's spending today)."""
    async with store.read() as session:
        row = (
            await session.execute(select(*usage_columns()).where(DecisionRow.created_at >= since))
        ).one()
    return usage_of(row)


async def usage_by_attempt(store: Store, task_ids: Sequence[str]) -> dict[tuple[str, int], Usage]:
    """(task id, attempt) → what that attempt's decisions cost, for the given tasks."""
    if not task_ids:
        return {}
    async with store.read() as session:
        rows = (
            await session.execute(
                select(DecisionRow.task_id, DecisionRow.attempt, *usage_columns())
                .where(DecisionRow.task_id.in_(list(task_ids)))
                .group_by(DecisionRow.task_id, DecisionRow.attempt)
            )
        ).all()
    return {(r[0], int(r[1])): usage_of(r[2:]) for r in rows}


@dataclass(frozen=True, slots=True)
class SpendRow:
    """What one (UTC day, host, provider, model) spent."""

    day: str
    host_id: str
    provider: str
    model: str
    usage: Usage
    decisions: int


def _day(store: Store) -> ColumnElement[str]:
    """The UTC day of a decision as YYYY-MM-DD (SQLite keeps naive UTC text; PostgreSQL a
    timestamptz, read in UTC whatever the session's time zone)."""
    if store.is_postgres:
        return func.to_char(func.timezone("UTC", DecisionRow.created_at), "YYYY-MM-DD")
    return func.date(DecisionRow.created_at)


async def spend_rows(store: Store, since: dt.datetime, until: dt.datetime) -> list[SpendRow]:
    """Spending per (UTC day, host, provider, model) of decisions logged in [since, until)."""
    day = _day(store).label("day")
    stmt = (
        select(
            day,
            DecisionRow.host_id,
            DecisionRow.provider,
            DecisionRow.model,
            func.count(),
            *usage_columns(),
        )
        .where(DecisionRow.created_at >= since, DecisionRow.created_at < until)
        .group_by(day, DecisionRow.host_id, DecisionRow.provider, DecisionRow.model)
        .order_by(day, DecisionRow.host_id, DecisionRow.provider, DecisionRow.model)
    )
    async with store.read() as session:
        rows = (await session.execute(stmt)).all()
    return [SpendRow(str(r[0]), r[1], r[2], r[3], usage_of(r[5:]), int(r[4])) for r in rows]
