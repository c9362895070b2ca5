"""Model calls the cloud started whose cost is not recorded yet (decision 0080).

A marker row is written before each call a Decide makes (`planner.unsettled`) and deleted in
the transaction that records what the provider reported of the call: the decision row
(`decisions.append`) or the failed decision's calls (`spend.count_failed`), which pass the
ids the call's usage carries to `settle_in`. A row that outlives its call is a call whose cost
is unknown (the process died during it, or the record's write failed): GetTask says so, with
the most those calls can have cost, beside totals that count only what providers reported.

A host on the direct transport keeps its own markers (`host.outbox.calls`) and ships those whose
call ended unknown (`ShipDecisionsRequest.unsettled_calls`): `shipped` writes them here under
`host_call_key`, and a shipped failed decision's calls that name them settle them
(`settle_shipped_in`). Each such call has a row in `host_calls` from its first arrival either
way, so a resend in any order records it at most once and never after its cost was counted.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

from sqlalchemy import ColumnElement, Select, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store.database import Store
from cloud.store.models import HostCallRow, TaskRow, UnsettledCallRow
from planner.decision import Usage


async def settle_in(session: AsyncSession, call_ids: Sequence[str]) -> None:
    """Delete the markers of calls recorded in this transaction."""
    if call_ids:
        await session.execute(
            delete(UnsettledCallRow)
            .where(UnsettledCallRow.call_id.in_(list(call_ids)))
            .execution_options(synchronize_session=False)
        )


def host_call_key(host_id: str, host_call_id: str) -> str:
    """The row id of a host's shipped call: its id is the host's own, so it is keyed with the
    host (a host settles only its own), hashed to the width of the cloud's own ids."""
    return hashlib.sha256(f"{host_id}\0{host_call_id}".encode()).hexdigest()[:32]


async def shipped(
    store: Store,
    host_id: str,
    host_call_id: str,
    task_id: str,
    attempt: int,
    provider: str,
    model: str,
    started_at: dt.datetime | None,
    at_most: Usage,
) -> bool:
    """Record a call of unknown cost a direct host shipped, unless this call was shipped or
    settled before (`HostCallRow`): a resend changes nothing, in whatever order it comes. True
    when it was recorded here (its task's watchers are to hear it)."""
    call_id = host_call_key(host_id, host_call_id)
    try:
        async with store.write() as session:
            if not await _take(session, store, call_id, task_id, settled=None):
                return False
            session.add(
                UnsettledCallRow(
                    call_id=call_id,
                    host_id=host_id,
                    task_id=task_id,
                    attempt=attempt,
                    provider=provider,
                    model=model,
                    started_at=started_at or store.now(),
                    at_most_input_tokens=at_most.input_tokens,
                    at_most_output_tokens=at_most.output_tokens,
                    at_most_cost_usd=at_most.cost_usd,
                )
            )
    except IntegrityError:
        return False  # its marker is there from before migration 0031 took host calls
    return True


async def settle_shipped_in(
    session: AsyncSession, store: Store, task_id: str, call_ids: Sequence[str]
) -> None:
    """Say that these calls of a host (their `host_call_key`s) are settled, in the transaction
    that counts their cost, before their markers are deleted (`settle_in`): a call shipped
    unsettled after this commits is not recorded (`shipped`). Taking the rows first makes a
    concurrent `shipped` of one of them wait for this commit, or this wait for it and then
    delete the marker it wrote."""
    for call_id in call_ids:
        await _take(session, store, call_id, task_id, settled=store.now())


async def _take(
    session: AsyncSession,
    store: Store,
    call_id: str,
    task_id: str,
    settled: dt.datetime | None,
) -> bool:
    """Insert the host call's row, or with `settled` given mark the one there settled (at its
    first settling). Whether a row was written: with `settled` None, whether it is new."""
    values = {"call_id": call_id, "task_id": task_id, "settled_at": settled}
    insert = pg_insert if store.is_postgres else sqlite_insert
    statement = insert(HostCallRow).values(**values)
    if settled is None:
        statement = statement.on_conflict_do_nothing(index_elements=["call_id"])
    else:
        statement = statement.on_conflict_do_update(
            index_elements=["call_id"],
            set_={"settled_at": func.coalesce(HostCallRow.settled_at, settled)},
        )
    added = await session.execute(statement.returning(HostCallRow.call_id))
    return added.first() is not None


async def prune(store: Store, older_than: dt.timedelta) -> int:
    """Delete the markers of tasks that ended before now - older_than (the decision log's
    retention, in the same pass): a marker that outlived its call stays for good otherwise, as
    no record will ever settle it. A task still active keeps every marker, however old: its
    calls may still be recorded. Each task's row counts what went, in the same transaction
    (how many, and the most they can have cost: `decisions.pruned`), as it counts the decisions
    pruned: deleted without a count, a call of unknown cost left no trace anywhere. Returns how
    many went.

    One statement for the counts, one for the delete: markers outlive their calls only when a
    process died or a write failed, so a pass finds few."""
    t = UnsettledCallRow
    ended = select(TaskRow.task_id).where(
        TaskRow.finished_at.is_not(None), TaskRow.finished_at < store.now() - older_than
    )
    async with store.write() as session:
        await session.execute(
            delete(HostCallRow)
            .where(HostCallRow.task_id.in_(ended))
            .execution_options(synchronize_session=False)
        )  # their resends are refused by then: the shipping window is within the retention
        counts = (await session.execute(_bounds_per_task(t.task_id.in_(ended)))).all()
        if not counts:
            return 0
        gone = [task_id for task_id, *_ in counts]
        await session.execute(
            delete(t).where(t.task_id.in_(gone)).execution_options(synchronize_session=False)
        )
        for task_id, n, input_tokens, output_tokens, cost in counts:
            await session.execute(
                update(TaskRow)
                .where(TaskRow.task_id == task_id)
                .values(
                    pruned_unsettled_calls=TaskRow.pruned_unsettled_calls + int(n),
                    pruned_unsettled_input_tokens=TaskRow.pruned_unsettled_input_tokens
                    + int(input_tokens or 0),
                    pruned_unsettled_output_tokens=TaskRow.pruned_unsettled_output_tokens
                    + int(output_tokens or 0),
                    pruned_unsettled_cost_usd=TaskRow.pruned_unsettled_cost_usd
                    + float(cost or 0.0),
                    pruned_at=store.now(),
                )
                .execution_options(synchronize_session=False)
            )
    return sum(int(n) for _, n, *_ in counts)


def _bounds_per_task(where: ColumnElement[bool]) -> Select[str, int, int, int, float]:
    """Per task of the markers `where` picks: how many, and their bounds summed (input tokens,
    output tokens, cost). One query for the retention count and the watchers' figures."""
    t = UnsettledCallRow
    return (
        select(
            t.task_id,
            func.count(),
            func.sum(t.at_most_input_tokens),
            func.sum(t.at_most_output_tokens),
            func.sum(t.at_most_cost_usd),
        )
        .where(where)
        .group_by(t.task_id)
    )


async def of_task(store: Store, task_id: str) -> tuple[int, Usage]:
    """How many of the task's calls are unsettled, and the most they can have cost."""
    return summed(await by_attempt(store, task_id))


def summed(per_attempt: Mapping[int, tuple[int, Usage]]) -> tuple[int, Usage]:
    """`by_attempt`'s figures for the whole task."""
    total = Usage()
    for _, at_most in per_attempt.values():
        total.add(at_most)
    return sum(n for n, _ in per_attempt.values()), total


async def of_tasks(session: AsyncSession, task_ids: Sequence[str]) -> dict[str, tuple[int, Usage]]:
    """Per task (those with some): how many of its calls are unsettled, and the most they can
    have cost; read in the caller's session, beside the task rows it reads (a watcher is sent
    them with the task's totals)."""
    t = UnsettledCallRow
    rows = (await session.execute(_bounds_per_task(t.task_id.in_(list(task_ids))))).all()
    return {
        str(task): (int(n), Usage(input_tokens=int(i), output_tokens=int(o), cost_usd=float(c)))
        for task, n, i, o, c in rows
    }


async def by_attempt(store: Store, task_id: str) -> dict[int, tuple[int, Usage]]:
    """Per attempt (those with some): how many of its calls are unsettled, and the most they
    can have cost."""
    t = UnsettledCallRow
    async with store.read() as session:
        rows = (
            await session.execute(
                select(
                    t.attempt,
                    func.count(),
                    func.sum(t.at_most_input_tokens),
                    func.sum(t.at_most_output_tokens),
                    func.sum(t.at_most_cost_usd),
                )
                .where(t.task_id == task_id)
                .group_by(t.attempt)
            )
        ).all()
    return {
        int(a): (int(n), Usage(input_tokens=int(i), output_tokens=int(o), cost_usd=float(c)))
        for a, n, i, o, c in rows
    }


class StoreCallLedger:
    """`planner.unsettled.CallLedger` for one attempt's Decide: markers in `unsettled_calls`.
    `on_moved` hears the task once a marker is written or settled without a record
    (`EventBus.decisions_counted`): its watchers show a call under way, then its end, as they
    happen; a marker settled by its record is heard with that record."""

    def __init__(
        self,
        store: Store,
        host_id: str,
        task_id: str,
        attempt: int,
        on_moved: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._host_id = host_id
        self._task_id = task_id
        self._attempt = attempt
        self._on_moved = on_moved

    async def opened(self, provider: str, model: str, at_most: Usage) -> str:
        call_id = uuid.uuid4().hex
        async with self._store.write() as session:
            session.add(
                UnsettledCallRow(
                    call_id=call_id,
                    host_id=self._host_id,
                    task_id=self._task_id,
                    attempt=self._attempt,
                    provider=provider[:32],
                    model=model[:128],
                    started_at=self._store.now(),
                    at_most_input_tokens=at_most.input_tokens,
                    at_most_output_tokens=at_most.output_tokens,
                    at_most_cost_usd=at_most.cost_usd,
                )
            )
        await self._moved()
        return call_id

    async def settled(self, call_id: str) -> None:
        async with self._store.write() as session:
            await settle_in(session, [call_id])
        await self._moved()

    async def _moved(self) -> None:
        if self._on_moved is not None:
            await self._on_moved([self._task_id])
