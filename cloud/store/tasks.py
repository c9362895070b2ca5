"""Task queries: submit (idempotent), read with attempts, list with filters and pages, cancel."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError

from cloud.store import secrets, spend, states, unsettled
from cloud.store.database import Store
from cloud.store.idlists import among
from cloud.store.lease_events import EventKind
from cloud.store.lease_events import new as new_event
from cloud.store.models import AttemptRow, TaskRow
from cloud.store.paging import newest_page, page_token, past, position, token_id, token_time
from planner.decision import Usage

#: The longest id a page token may hold: `TaskRow.task_id` is String(32).
TASK_ID_LENGTH = 32


@dataclass(slots=True)
class TaskView:
    """A task and its attempts, oldest first (attempts may be empty in list views), with what
    each attempt's decisions cost (attempt number → usage; attempts without decisions absent)."""

    task: TaskRow
    attempts: list[AttemptRow] = field(default_factory=list)
    usage: dict[int, Usage] = field(default_factory=dict)
    #: The task's calls of unknown cost (`cloud.store.unsettled`), read with it, and when that
    #: read began (a watcher keeps the later of this and what it hears: `spend.TaskSpent`).
    unsettled: spend.Unsettled = (0, Usage())
    read_at: dt.datetime | None = None

    def latest_progress_attempt(self) -> AttemptRow | None:
        """The newest attempt that reported progress (an ended task shows its last step)."""
        for attempt in reversed(self.attempts):
            if attempt.progress_updated_at is not None:
                return attempt
        return None

    def current_attempt(self) -> AttemptRow | None:
        """The attempt whose number is the task's current attempt, if it exists."""
        for attempt in self.attempts:
            if attempt.attempt == self.task.attempt:
                return attempt
        return None


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated submission."""

    goal: str
    max_attempts: int
    lease_seconds: float
    timeout_seconds: float
    target_host_id: str | None = None
    target_device_serial: str | None = None
    client_request_id: str | None = None
    #: Secret parameters, name → sealed token (`cloud/secret_box.py`), never plain values.
    sealed_secrets: Mapping[str, str] = field(default_factory=dict)
    no_replay: bool = False
    max_tokens: int = 0
    max_cost_usd: float = 0.0


async def submit(store: Store, spec: NewTask) -> tuple[TaskView, bool]:
    """Queue a task; with a known client_request_id return the first task and True."""
    if spec.client_request_id:
        existing = await _by_request_id(store, spec.client_request_id)
        if existing is not None:
            return existing, True
    now = store.now()
    row = TaskRow(
        task_id=uuid.uuid4().hex,
        goal=spec.goal,
        status=states.QUEUED,
        attempt=0,
        max_attempts=spec.max_attempts,
        target_host_id=spec.target_host_id or None,
        target_device_serial=spec.target_device_serial or None,
        lease_seconds=spec.lease_seconds,
        deadline=now + dt.timedelta(seconds=spec.timeout_seconds),
        client_request_id=spec.client_request_id or None,
        cancel_requested=False,
        no_replay=spec.no_replay,
        max_tokens=spec.max_tokens,
        max_cost_usd=spec.max_cost_usd,
        created_at=now,
        updated_at=now,
    )
    try:
        async with store.write() as session:
            session.add(row)
            if spec.sealed_secrets:
                await session.flush()  # the task row first: the secrets refer to it
                secrets.add(session, row.task_id, spec.sealed_secrets, now)
    except IntegrityError:
        # Two submissions with one key raced; the other one won.
        if spec.client_request_id:
            existing = await _by_request_id(store, spec.client_request_id)
            if existing is not None:
                return existing, True
        raise
    return TaskView(row), False


async def _by_request_id(store: Store, client_request_id: str) -> TaskView | None:
    async with store.read() as session:
        row = await session.scalar(
            select(TaskRow).where(TaskRow.client_request_id == client_request_id)
        )
    return None if row is None else (await load_views(store, [row.task_id]))[0]


async def load_views(store: Store, task_ids: list[str], *, usage: bool = True) -> list[TaskView]:
    """Tasks with their attempts, in the order of `task_ids` (unknown ids are skipped); without
    `usage`, no attempt's decision costs (`TaskView.usage` empty): for readers that show no
    attempts (a task's totals come from its own row), such as progress watchers."""
    if not task_ids:
        return []
    read_at = store.now()
    async with store.read() as session:
        tasks = (await session.scalars(select(TaskRow).where(TaskRow.task_id.in_(task_ids)))).all()
        attempts = (
            await session.scalars(
                select(AttemptRow)
                .where(AttemptRow.task_id.in_(task_ids))
                .order_by(AttemptRow.task_id, AttemptRow.attempt)
            )
        ).all()
        open_calls = await unsettled.of_tasks(session, task_ids)
    by_task: dict[str, list[AttemptRow]] = defaultdict(list)
    for a in attempts:
        by_task[a.task_id].append(a)
    costs: dict[str, dict[int, Usage]] = defaultdict(dict)
    if usage:
        for (task_id, attempt), used in (await spend.usage_by_attempt(store, task_ids)).items():
            costs[task_id][attempt] = used
    found = {
        t.task_id: TaskView(
            t,
            by_task[t.task_id],
            costs[t.task_id],
            open_calls.get(t.task_id) or (0, Usage()),
            read_at,
        )
        for t in tasks
    }
    return [found[i] for i in task_ids if i in found]


async def get(store: Store, task_id: str) -> TaskView | None:
    """One task with all its attempts."""
    views = await load_views(store, [task_id])
    return views[0] if views else None


async def goal(store: Store, task_id: str) -> str | None:
    """A task's goal (what the planner works towards), or None for an unknown task."""
    async with store.read() as session:
        return await session.scalar(select(TaskRow.goal).where(TaskRow.task_id == task_id))


async def attempts_had(store: Store, task_id: str) -> int | None:
    """A task's current or last attempt number (0 before the first), or None for an unknown
    task."""
    async with store.read() as session:
        return await session.scalar(select(TaskRow.attempt).where(TaskRow.task_id == task_id))


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """ListTasks filters; empty means no filter."""

    statuses: tuple[str, ...] = ()
    host_id: str = ""
    query: str = ""
    #: Lower-case hexadecimal start of the task id (ids are uuid4 hex).
    id_prefix: str = ""
    #: Only these tasks (None: any).
    task_ids: tuple[str, ...] | None = None

    def listing(self) -> str:
        """The page tokens' listing name: ListTasks with this filter. A token held a position
        only, and continued under another filter it silently skipped that filter's newer
        tasks; the filter (hashed: a query may be 2,000 characters) keeps it to its own."""
        named: list[object] = [
            sorted(self.statuses),
            self.host_id,
            self.query.lower(),
            self.id_prefix,
        ]
        if self.task_ids is not None:  # tokens of filters without ids stay as they were
            named.append(sorted(self.task_ids))
        digest = hashlib.sha256(json.dumps(named).encode()).hexdigest()[:16]
        return f"tasks/{digest}"


def encode_cursor(flt: TaskFilter, task: TaskRow) -> str:
    """Opaque page token: the (created_at, task_id) of the last task of a page."""
    return page_token(flt.listing(), task.created_at.isoformat(), task.task_id)


def decode_cursor(flt: TaskFilter, token: str) -> tuple[dt.datetime, str]:
    """Inverse of encode_cursor for the same filter; ValueError for anything else."""
    created, task_id = position(flt.listing(), token, 2)
    return token_time(created), token_id(task_id, TASK_ID_LENGTH)


async def list_page(
    store: Store, flt: TaskFilter, page_size: int, page_token: str
) -> tuple[list[TaskView], str]:
    """Newest first, keyset-paged on (created_at, task_id) so pages stay stable under inserts;
    a later page is a range of `ix_tasks_created_at_task_id` from its token (`past`), or of
    `ix_tasks_status_created_at_task_id` for each status asked for, a page of each merged
    (`newest_page`; before, several statuses were one walk of the first testing each task's,
    or all their tasks read and sorted)."""
    newest = (TaskRow.created_at, TaskRow.task_id)
    stmt = select(TaskRow)
    if flt.host_id:
        # A task aimed at the host is on it before its first attempt too (waiting for it).
        stmt = stmt.where(
            or_(TaskRow.host_id == flt.host_id, TaskRow.target_host_id == flt.host_id)
        )
    if flt.query:
        stmt = stmt.where(func.lower(TaskRow.goal).contains(flt.query.lower(), autoescape=True))
    if flt.id_prefix:
        stmt = stmt.where(TaskRow.task_id.startswith(flt.id_prefix, autoescape=True))
    if flt.task_ids is not None:
        stmt = stmt.where(among(store, TaskRow.task_id, flt.task_ids))
    if page_token:
        created, task_id = decode_cursor(flt, page_token)
        stmt = stmt.where(past(newest, (created, task_id), descending=True))
    page = newest_page(stmt, newest, page_size + 1, TaskRow.status, flt.statuses)
    async with store.read() as session:
        rows = list((await session.scalars(page)).all())
    more = len(rows) > page_size
    rows = rows[:page_size]
    # A listed task shows no attempts (its totals are on its own row): no decision costs.
    views = await load_views(store, [r.task_id for r in rows], usage=False)
    return views, (encode_cursor(flt, rows[-1]) if more and rows else "")


async def active_task_ids(store: Store, *, ended_since: dt.datetime | None = None) -> list[str]:
    """Ids of every task that has not ended, oldest first (the fleet watch snapshot), then,
    with `ended_since`, of those that ended at or after it, in the order they ended: a fleet
    watcher that may have missed their ends (`Subscription.take_missed_since`) shows them."""
    async with store.read() as session:
        rows = await session.scalars(
            select(TaskRow.task_id)
            .where(TaskRow.status.in_(states.ACTIVE))
            .order_by(TaskRow.created_at, TaskRow.task_id)
        )
        found = list(rows.all())
        if ended_since is not None:
            ended = await session.scalars(
                select(TaskRow.task_id)
                .where(TaskRow.finished_at >= ended_since)  # ix_tasks_finished_at
                .order_by(TaskRow.finished_at, TaskRow.task_id)
            )
            found += ended.all()  # one that ended between the two reads is in both
        return list(dict.fromkeys(found))


@dataclass(frozen=True, slots=True)
class LiveLease:
    """The live lease of a task, named so a revocation can reach its host."""

    host_id: str
    task_id: str
    attempt: int
    lease_id: str


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What CancelTask did: `None` view for unknown tasks, `ended` for a task already ended."""

    view: TaskView | None
    already_ended: bool = False
    revoke: LiveLease | None = None


async def cancel(store: Store, task_id: str, reason: str, operator: str = "") -> CancelOutcome:
    """Cancel a queued task at once; flag a running one and name its lease for the revoke.

    Either way the lease history records who asked (`operator`, their certificate's name) and
    why; a second request for a task already being cancelled keeps the first one's words.
    """
    reason = reason or "cancelled by operator"
    now = store.now()
    revoke: LiveLease | None = None
    async with store.write() as session:
        task = await session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        if task is None:
            return CancelOutcome(None)
        if task.status in states.TERMINAL:
            ended = True
        else:
            ended = False
            queued = (
                await session.execute(
                    update(TaskRow)
                    .where(TaskRow.task_id == task_id, TaskRow.status == states.QUEUED)
                    .values(
                        status=states.CANCELLED,
                        cancel_requested=True,
                        cancel_reason=reason,
                        cancelled_by=operator or None,
                        result_summary=reason,
                        finished_at=now,
                        updated_at=now,
                    )
                    .returning(TaskRow.task_id, TaskRow.attempt)
                )
            ).first()
            if queued is not None:
                session.add(
                    new_event(
                        EventKind.CANCELLED,
                        task_id,
                        queued[1],
                        now,
                        operator=operator,
                        reason=reason,
                        task_status=states.CANCELLED,
                    )
                )
            else:
                flagged = (
                    await session.execute(
                        update(TaskRow)
                        .where(
                            TaskRow.task_id == task_id,
                            TaskRow.status.in_(states.LIVE),
                            TaskRow.cancel_requested.is_(False),
                        )
                        .values(
                            cancel_requested=True,
                            cancel_reason=reason,
                            cancelled_by=operator or None,
                            updated_at=now,
                        )
                        .returning(TaskRow.status)
                    )
                ).first()
                live = await session.scalar(
                    select(AttemptRow).where(
                        AttemptRow.task_id == task_id,
                        AttemptRow.attempt == task.attempt,
                        AttemptRow.ended_at.is_(None),
                    )
                )
                if live is not None:
                    revoke = LiveLease(live.host_id, task_id, live.attempt, live.lease_id)
                if flagged is not None:
                    session.add(
                        new_event(
                            EventKind.CANCEL_REQUESTED,
                            task_id,
                            task.attempt,
                            now,
                            host_id=live.host_id if live is not None else None,
                            device_serial=live.device_serial if live is not None else None,
                            operator=operator,
                            reason=reason,
                            task_status=flagged[0],
                        )
                    )
    view = await get(store, task_id)
    return CancelOutcome(view, already_ended=ended, revoke=revoke)


async def count_by_status(store: Store) -> dict[str, int]:
    """How many tasks are in each status (the metrics' gauges)."""
    async with store.read() as session:
        rows = (
            await session.execute(select(TaskRow.status, func.count()).group_by(TaskRow.status))
        ).all()
    return {status: int(n) for status, n in rows}


async def budget_and_spent(store: Store, task_id: str) -> tuple[tuple[int, float], Usage] | None:
    """The task's caps (max tokens, max cost in dollars; 0 = none) and what its model calls
    cost so far, from the totals its own row keeps (counted in the transaction that logs each
    decision, or each failed decision's calls: one row read per Decide, not a sum over the
    task's decision log), or None for no
    such task."""
    async with store.read() as session:
        row = (
            await session.execute(
                select(
                    TaskRow.max_tokens,
                    TaskRow.max_cost_usd,
                    TaskRow.input_tokens,
                    TaskRow.output_tokens,
                    TaskRow.cache_read_tokens,
                    TaskRow.cache_write_tokens,
                    TaskRow.thinking_tokens,
                    TaskRow.cost_usd,
                ).where(TaskRow.task_id == task_id)
            )
        ).first()
    if row is None:
        return None
    return (int(row[0]), float(row[1])), spend.usage_of([v or 0 for v in row[2:]])
