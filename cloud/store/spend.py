"""The spending ledger: sums of what the model calls cost, per attempt, task, host, model and
UTC day.

Every decision row keeps its tokens and its cost (`DecisionRow.cost_usd`, priced when the model
answered), and so does every row of `failed_decision_spend`: the answered calls of a decision
that failed (a refusal, no usable tool call, a provider error after billed turns), which the
provider billed all the same though no decision was logged. Every total is a query over both:
a task's spending, the fleet's today (the daily cap, the metrics), each attempt's (GetTask), and
the rows of FleetService.GetSpend (whose decision counts count decisions only). (A task's budget
is checked before each Decide against the totals the task's own row keeps,
`tasks.budget_and_spent`, counted with each decision and each failed one: one row, however long
the attempt.) Decisions made on the direct transport count once their host has shipped them
from its outbox.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, func, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store import unsettled
from cloud.store.database import Store
from cloud.store.models import DecisionRow, FailedDecisionSpendRow, TaskRow
from planner.decision import Billed, Usage

Ledger = type[DecisionRow] | type[FailedDecisionSpendRow]
#: The tables whose rows cost something: decisions, and the calls of decisions that failed.
LEDGER: tuple[Ledger, ...] = (DecisionRow, FailedDecisionSpendRow)
#: The figures of a `Usage` (its token counts and cost; not its unsettled-call markers).
FIGURES = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "thinking_tokens",
    "cost_usd",
)


def usage_columns(table: Ledger = DecisionRow) -> list[ColumnElement[Any]]:
    """Sums of a group's tokens and cost in one ledger table, in `Usage` field order."""
    return [func.coalesce(func.sum(getattr(table, name)), 0).label(name) for name in FIGURES]


def usage_of(values: Sequence[Any]) -> Usage:
    i, o, cr, cw, th, cost = values
    return Usage(int(i), int(o), int(cr), int(cw), int(th), float(cost))


def _summed(where: Callable[[Ledger], list[ColumnElement[bool]]]) -> Select[Any]:
    """One row for `usage_of`: the sums over both ledger tables of the rows `where` picks (each
    table summed on its own, through its own indexes)."""
    decided, failed = (select(*usage_columns(t)).where(*where(t)).subquery() for t in LEDGER)
    return select(*(decided.c[name] + failed.c[name] for name in FIGURES)).select_from(
        decided.join(failed, true())  # one row each: their sums side by side
    )


#: A task row's totals: its decisions, then its figures in `Usage` order.
_TOTALS = (
    TaskRow.decision_count,
    TaskRow.input_tokens,
    TaskRow.output_tokens,
    TaskRow.cache_read_tokens,
    TaskRow.cache_write_tokens,
    TaskRow.thinking_tokens,
    TaskRow.cost_usd,
)


def _spent_of(task_id: str, totals: Sequence[Any]) -> TaskSpent:
    """A row's `_TOTALS` as a task's totals (its unsettled calls not read)."""
    return TaskSpent(task_id, usage_of([v or 0 for v in totals[1:]]), int(totals[0] or 0))


async def add_to_task_totals(
    session: AsyncSession, task_id: str, usage: Usage, decisions: int
) -> TaskSpent | None:
    """Count `usage` (of `decisions` logged decisions: 1, or 0 for a failed one's calls) in its
    task's totals, in the transaction that records it (the totals outlive the log, which is
    pruned after the retention period), and settle the markers of the calls it sums
    (`cloud.store.unsettled`): from this commit on, their cost is known. Returns the task's
    totals as the update left them (None: no such task), from the UPDATE itself (RETURNING):
    its watchers are sent them once committed (`EventBus.decisions_counted`), and each
    counted decision cost a second read of the row."""
    await unsettled.settle_in(session, usage.calls)
    row = (
        await session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == task_id)
            .values(
                input_tokens=TaskRow.input_tokens + usage.input_tokens,
                output_tokens=TaskRow.output_tokens + usage.output_tokens,
                cache_read_tokens=TaskRow.cache_read_tokens + usage.cache_read_input_tokens,
                cache_write_tokens=TaskRow.cache_write_tokens + usage.cache_creation_input_tokens,
                thinking_tokens=TaskRow.thinking_tokens + usage.thinking_tokens,
                cost_usd=TaskRow.cost_usd + usage.cost_usd,
                decision_count=TaskRow.decision_count + decisions,
            )
            .returning(*_TOTALS)
            .execution_options(synchronize_session=False)
        )
    ).first()
    return None if row is None else _spent_of(task_id, row)


#: A task's calls of unknown cost (`cloud.store.unsettled`): how many, and the most they cost.
Unsettled = tuple[int, Usage]


@dataclass(frozen=True, slots=True)
class TaskSpent:
    """A task's totals as its row keeps them (`add_to_task_totals`), and its calls of unknown
    cost as `unsettled_calls` holds them: what its watchers show.

    Each figure of the totals only grows, so of two readings the later has every figure at
    least as large: `newest` picks it without knowing which was read first (a reading can
    arrive after a reload that read a newer one, or from another replica before this one's
    own). The unsettled calls come and go (a marker written before each call, deleted when it
    is recorded), so the one read later (`read_at`, taken before the read) is kept: the reading
    of a task's last change starts after that change's commit, so it is the latest of all.
    `unsettled` None: not read (a replica that does not send them)."""

    task_id: str
    usage: Usage
    decisions: int
    unsettled: Unsettled | None = None
    read_at: dt.datetime | None = None

    def newest(self, other: TaskSpent) -> TaskSpent:
        """The later of two readings of this task's totals and unsettled calls."""
        a, b = self.usage, other.usage
        later = self
        if other.unsettled is not None and (
            self.unsettled is None
            or self.read_at is None
            or (other.read_at is not None and other.read_at >= self.read_at)
        ):
            later = other
        return TaskSpent(
            self.task_id,
            Usage(*(max(getattr(a, name), getattr(b, name)) for name in FIGURES)),
            max(self.decisions, other.decisions),
            later.unsettled,
            later.read_at,
        )

    def shown(self) -> tuple[Usage, int, Unsettled | None]:
        """What a watcher is sent of it (not when it was read)."""
        return self.usage, self.decisions, self.unsettled


OnCounted = Callable[[list[str], Sequence[TaskSpent]], Awaitable[None]]
"""Hears, once committed, the tasks whose totals or calls of unknown cost moved, with the totals
counted for some of them (`add_to_task_totals`): `EventBus.decisions_counted`."""


async def task_totals(
    store: Store, task_ids: Sequence[str], counted: Sequence[TaskSpent] = ()
) -> list[TaskSpent]:
    """The tasks' totals as their rows keep them now, with their unsettled calls (unknown ids
    are left out). The totals in `counted` (committed, as `add_to_task_totals` returned them)
    are not read again: only their tasks' unsettled calls are."""
    known = {s.task_id: s for s in counted}
    unread = [i for i in task_ids if i not in known]
    read_at = store.now()
    async with store.read() as session:
        if unread:
            rows = (
                await session.execute(
                    select(TaskRow.task_id, *_TOTALS).where(TaskRow.task_id.in_(unread))
                )
            ).all()
            known.update((r[0], _spent_of(r[0], r[1:])) for r in rows)
        open_calls = await unsettled.of_tasks(session, list(known))
    return [
        TaskSpent(
            s.task_id, s.usage, s.decisions, open_calls.get(s.task_id) or (0, Usage()), read_at
        )
        for s in known.values()
    ]


class SpentElsewhere(ValueError):
    """A host spend id that names a record of another attempt (the host reused an id): counting
    it as a resend would drop what this attempt was billed."""


async def count_failed(
    store: Store,
    host_id: str,
    task_id: str,
    attempt: int,
    billed: Billed,
    error: str,
    host_spend_id: str | None = None,
    on_totals: Callable[[TaskSpent], None] | None = None,
) -> bool:
    """Record what the answered calls of a failed decision cost (`error`: the planner error's
    class) and add it to the task's totals, in one transaction. A host's shipped record
    (`host_spend_id`) counts once: False when it was counted before (a resend, on this replica
    or another), True when counted now. `on_totals` hears the task's totals as counted (heard
    before the commit: the caller's to keep for after it, should it return)."""
    u = billed.usage
    if host_spend_id is not None:
        async with store.read() as session:
            seen = (
                await session.execute(
                    select(FailedDecisionSpendRow.task_id, FailedDecisionSpendRow.attempt).where(
                        FailedDecisionSpendRow.host_id == host_id,
                        FailedDecisionSpendRow.host_spend_id == host_spend_id,
                    )
                )
            ).first()
        if seen is not None and tuple(seen) != (task_id, attempt):
            raise SpentElsewhere(
                f"host_spend_id {host_spend_id!r} already names a record of task {seen[0]!r} "
                f"attempt {seen[1]}"
            )
        if seen is not None:
            return False
    try:
        async with store.write() as session:
            session.add(
                FailedDecisionSpendRow(
                    spend_id=uuid.uuid4().hex,
                    host_id=host_id,
                    task_id=task_id,
                    attempt=attempt,
                    provider=billed.provider,
                    model=billed.model,
                    error=error[:64],
                    input_tokens=u.input_tokens,
                    output_tokens=u.output_tokens,
                    cache_read_input_tokens=u.cache_read_input_tokens,
                    cache_creation_input_tokens=u.cache_creation_input_tokens,
                    thinking_tokens=u.thinking_tokens,
                    cost_usd=u.cost_usd,
                    created_at=store.now(),
                    host_spend_id=host_spend_id,
                )
            )
            await session.flush()
            if host_spend_id is not None:  # the calls it names are a host's: never again
                await unsettled.settle_shipped_in(session, store, task_id, u.calls)
            totals = await add_to_task_totals(session, task_id, u, decisions=0)
            if totals is not None and on_totals is not None:
                on_totals(totals)
    except IntegrityError:
        if host_spend_id is None:
            raise
        return False  # a resend that raced its original on another replica: counted there
    return True


async def spent(store: Store, task_id: str) -> Usage:
    """What every model call of a task cost, over all its attempts."""
    async with store.read() as session:
        return await spent_in(session, task_id)


def spent_query(task_id: str, before_attempt: int = 0) -> Select[Any]:
    """The sums of what the task's model calls cost (only attempts before `before_attempt`,
    when given): one row for `usage_of`."""

    def where(t: Ledger) -> list[ColumnElement[bool]]:
        picked = [t.task_id == task_id]
        if before_attempt:
            picked.append(t.attempt < before_attempt)
        return picked

    return _summed(where)


async def spent_in(session: AsyncSession, task_id: str, before_attempt: int = 0) -> Usage:
    """What the task's model calls cost (only attempts before `before_attempt`, when given),
    read in an open session."""
    return usage_of((await session.execute(spent_query(task_id, before_attempt))).one())


async def spent_since(store: Store, since: dt.datetime) -> Usage:
    """What every model call recorded at or after `since` cost (the fleet's spending today)."""
    async with store.read() as session:
        row = (await session.execute(_summed(lambda t: [t.created_at >= since]))).one()
    return usage_of(row)


async def spent_between(store: Store, since: dt.datetime, until: dt.datetime) -> Usage:
    """What every model call recorded at or after `since` and before `until` cost."""
    async with store.read() as session:
        row = (
            await session.execute(_summed(lambda t: [t.created_at >= since, t.created_at < until]))
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

    def known(self, day: dt.datetime) -> Usage | None:
        """What the fleet's decisions since `day` cost as last read (and counted since), without
        reading: None before the first read of that day."""
        return _total(self._value) if day == self._day else None

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
    """(task id, attempt) → what that attempt's model calls cost, for the given tasks."""
    if not task_ids:
        return {}
    found: dict[tuple[str, int], Usage] = {}
    async with store.read() as session:
        for t in LEDGER:
            rows = (
                await session.execute(
                    select(t.task_id, t.attempt, *usage_columns(t))
                    .where(t.task_id.in_(list(task_ids)))
                    .group_by(t.task_id, t.attempt)
                )
            ).all()
            for r in rows:
                found.setdefault((r[0], int(r[1])), Usage()).add(usage_of(r[2:]))
    return found


@dataclass(frozen=True, slots=True)
class FailedCalls:
    """What the answered calls of one attempt's failed decisions cost (`decisions` of them)."""

    attempt: int
    decisions: int
    usage: Usage


async def failed_by_attempt(store: Store, task_id: str, attempt: int = 0) -> list[FailedCalls]:
    """The failed decisions' calls of a task (of one attempt, when given), per attempt in
    order: what a reader of the decision log adds to the decisions' usage to get the task's
    totals."""
    t = FailedDecisionSpendRow
    stmt = select(t.attempt, func.count(), *usage_columns(t)).where(t.task_id == task_id)
    if attempt:
        stmt = stmt.where(t.attempt == attempt)
    async with store.read() as session:
        rows = (await session.execute(stmt.group_by(t.attempt).order_by(t.attempt))).all()
    return [FailedCalls(int(r[0]), int(r[1]), usage_of(r[2:])) for r in rows]


@dataclass(frozen=True, slots=True)
class SpendRow:
    """What one (UTC day, host, provider, model) spent."""

    day: str
    host_id: str
    provider: str
    model: str
    usage: Usage
    decisions: int


def _day(store: Store, table: Ledger) -> ColumnElement[str]:
    """The UTC day of a ledger row as YYYY-MM-DD (SQLite keeps naive UTC text; PostgreSQL a
    timestamptz, read in UTC whatever the session's time zone)."""
    if store.is_postgres:
        return func.to_char(func.timezone("UTC", table.created_at), "YYYY-MM-DD")
    return func.date(table.created_at)


async def spend_rows(store: Store, since: dt.datetime, until: dt.datetime) -> list[SpendRow]:
    """Spending per (UTC day, host, provider, model) of model calls recorded in [since, until);
    `decisions` counts the decisions logged (a failed decision's calls cost, but count none)."""
    found: dict[tuple[str, str, str, str], tuple[Usage, int]] = {}
    async with store.read() as session:
        for t in LEDGER:
            day = _day(store, t).label("day")
            stmt = (
                select(day, t.host_id, t.provider, t.model, func.count(), *usage_columns(t))
                .where(t.created_at >= since, t.created_at < until)
                .group_by(day, t.host_id, t.provider, t.model)
            )
            for r in (await session.execute(stmt)).all():
                key = (str(r[0]), r[1], r[2], r[3])
                usage, decisions = found.get(key, (Usage(), 0))
                usage.add(usage_of(r[5:]))
                found[key] = (usage, decisions + (int(r[4]) if t is DecisionRow else 0))
    return [
        SpendRow(day, host_id, provider, model, usage, decisions)
        for (day, host_id, provider, model), (usage, decisions) in sorted(found.items())
    ]
