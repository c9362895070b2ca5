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

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence
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


async def spent_between(store: Store, since: dt.datetime, until: dt.datetime) -> Usage:
    """What every decision logged at or after `since` and before `until` cost."""
    async with store.read() as session:
        row = (
            await session.execute(
                select(*usage_columns()).where(
                    DecisionRow.created_at >= since, DecisionRow.created_at < until
                )
            )
        ).one()
    return usage_of(row)


class DailySpend:
    """The fleet's spending today as the daily cap and the metrics see it, at a cost that does
    not grow with the day.

    Summing today's decisions on every Decide (what the daily cap did) read every row logged
    today each time: a fleet taking a hundred steps a second sums millions of rows per call by
    evening. Here today is a settled part, summed once every `settle` (the day's rows older than
    `settle` ago), plus the recent tail, summed at most once every `refresh_s`: a Decide reads at
    most `2 × settle` of rows, once a second for all Decide calls together. What this replica
    logs itself counts at once (`add`), so a lone replica's cap is as exact as before; other
    replicas' decisions count within `refresh_s`, and a decision shipped from a host's outbox
    more than `settle` after it was made (its `created_at`) counts at the next settling, within
    `settle`. (A cap is checked before the model is called, so calls already under way overshoot
    it anyway.)
    """

    def __init__(
        self,
        store: Store,
        refresh_s: float = 1.0,
        settle: dt.timedelta = dt.timedelta(minutes=5),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._refresh = refresh_s
        self._settle = settle
        self._monotonic = monotonic
        self._lock = asyncio.Lock()
        self._day: dt.datetime | None = None
        self._mark = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._settled = Usage()
        self._settle_again_at = 0.0
        self._value = Usage()
        self._fresh_until = 0.0
        #: What this replica logged since the read before the last one began (monotonic time,
        #: usage): a read that began before a decision was committed may not include it.
        self._own: list[tuple[float, Usage]] = []
        #: Sums read so far (tests count them).
        self.reads = 0

    def add(self, usage: Usage) -> None:
        """A decision this replica just logged (committed) cost `usage`: it counts at once.
        (Before the first read there is nothing to keep up: that read sums it.)"""
        if self._day is None:
            return
        self._own.append((self._monotonic(), usage))
        self._value = _total(self._value, usage)

    async def today(self, day: dt.datetime) -> Usage:
        """What the fleet's decisions since `day` (midnight UTC, today) cost."""
        if day == self._day and self._monotonic() < self._fresh_until:
            return self._value
        async with self._lock:
            mono = self._monotonic()
            if day == self._day and mono < self._fresh_until:
                return self._value  # another caller read it while this one waited
            # Decisions logged from here on may or may not be in the sums read below: they
            # are counted on top until the next read (counted twice meanwhile, never missed).
            self._own = [(at, u) for at, u in self._own if at >= mono]
            if day != self._day or mono >= self._settle_again_at:
                mark = max(day, self._store.now() - self._settle)
                self._settled = await spent_between(self._store, day, mark)
                self._day, self._mark = day, mark
                self._settle_again_at = mono + self._settle.total_seconds()
                self.reads += 1
            tail = await spent_since(self._store, self._mark)
            self.reads += 1
            self._value = _total(self._settled, tail, *(u for _, u in self._own))
            self._fresh_until = mono + self._refresh
            return self._value


def _total(*parts: Usage) -> Usage:
    total = Usage()
    for part in parts:
        total.add(part)
    return total


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
