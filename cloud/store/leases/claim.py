"""Claims: a queued task handed to an idle phone of a host as a fresh lease.

Replicas claim at once without handing a task out twice: on PostgreSQL the candidate is locked
with FOR UPDATE SKIP LOCKED, the UPDATE re-checks `status = QUEUED` either way, and a unique
index allows one live attempt per phone.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import (
    CTE,
    BindParameter,
    ColumnElement,
    Integer,
    Select,
    String,
    Subquery,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from cloud.store import lease_events, secrets, spend, states
from cloud.store.database import Store
from cloud.store.flows import Choice, choice_columns
from cloud.store.lease_events import EventKind
from cloud.store.models import AttemptRow, DispatchHoldRow, LeaseEventRow, TaskRow
from planner.decision import Usage


@dataclass(frozen=True, slots=True)
class Claimed:
    """A fresh lease: what the Assignment message needs."""

    task_id: str
    attempt: int
    lease_id: str
    device_serial: str
    goal: str
    lease_expires_at: dt.datetime
    lease_seconds: float
    deadline: dt.datetime
    last_progress: AttemptRow | None
    #: The task's secret parameters, name → sealed token (opened only for the Assignment).
    sealed_secrets: dict[str, str] = field(default_factory=dict)
    #: The task asked never to replay a learned flow.
    no_replay: bool = False
    #: When the task was queued for this attempt (None when not known: a re-sent assignment).
    queued_since: dt.datetime | None = None
    #: The task's caps (0 = none) and what its earlier attempts' decisions cost.
    max_tokens: int = 0
    max_cost_usd: float = 0.0
    spent: Usage = field(default_factory=Usage)
    #: The claim wrote the attempt's flow choice (`claim`'s `settle`): none to make or write.
    choice_recorded: bool = False


#: What an Assignment needs of its task, in `Claimed` field order.
_ASSIGNMENT_COLUMNS = (
    TaskRow.goal,
    TaskRow.lease_seconds,
    TaskRow.deadline,
    TaskRow.no_replay,
    TaskRow.max_tokens,
    TaskRow.max_cost_usd,
)


#: A task's most recent attempt that reported progress (the task bound as `task_id`).
LATEST_PROGRESS: Select[AttemptRow] = (
    select(AttemptRow)
    .where(AttemptRow.task_id == bindparam("task_id"), AttemptRow.progress_updated_at.is_not(None))
    .order_by(AttemptRow.attempt.desc())
    .limit(1)
)


async def latest_progress(session: AsyncSession, task_id: str) -> AttemptRow | None:
    """The task's most recent attempt that reported progress (a new attempt starts from it)."""
    return await session.scalar(LATEST_PROGRESS, {"task_id": task_id})


def _queue(name: str, *where: ColumnElement[bool]) -> CTE:
    """The oldest claimable tasks of one queue (`where` names its target host and phone), at
    most `depth`, found in `ix_tasks_queue`. Read, not locked: the claim locks only the task it
    takes."""
    return (
        select(TaskRow.task_id, TaskRow.created_at)
        .where(
            *where,
            TaskRow.cancel_requested.is_(False),
            TaskRow.deadline > bindparam("now"),
        )
        .order_by(TaskRow.created_at, TaskRow.task_id)
        .limit(bindparam("depth", type_=Integer()))
        .cte(name)
    )


# A claim's statements, built once with bound parameters: built per claim, building them and
# computing their cache keys was a third of a claim's CPU (bench/dispatch_burst.py).
# Bound names differ from the columns they set (SQLAlchemy reserves those in SET and VALUES).
_HOST: BindParameter[str] = bindparam("host", type_=String())
# `models.QUEUE_KEY` as expressions a query repeats: whom a queued task waits for ('' = any
# host; NULL when not queued) and which phone ('' = any).
_QUEUED_FOR = case(
    (
        TaskRow.status == literal_column(f"'{states.QUEUED}'"),
        func.coalesce(TaskRow.target_host_id, literal_column("''")),
    )
)
_TARGET_PHONE = func.coalesce(TaskRow.target_device_serial, literal_column("''"))
_ANY_HOST = _QUEUED_FOR == ""
_ANY_PHONE = _TARGET_PHONE == ""
#: Heads each queue offers on PostgreSQL, so a claim finds a free task while one is queued:
#: more than the claims in flight (a connection each) plus those that took a head since the
#: claim's snapshot. At 64, about one claim in 2,000 of a 1,000-host burst found every head
#: locked or taken while hundreds of tasks were queued, and its host waited a dispatch pass
#: (2 s); at 512, none in 3,000. Reading deeper heads cost nothing measurable (a claim from
#: a queue of 3,000: 4.1–5.1 ms at 64, 3.9–4.0 ms at 1,024, noise either way).
_PG_DEPTH = 512


#: Terms one compound SELECT of the claim unions at most: SQLite refuses a compound SELECT of
#: more than 500 (SQLITE_MAX_COMPOUND_SELECT, "too many terms in compound SELECT"), and a host
#: of 250 idle phones (2 + 2 × 250 queues) got no task at all. The limit counts the terms of
#: one compound, not those of the compounds nested in it.
_TERMS = 250


def _heads(selects: list[Select[str, dt.datetime]]) -> Subquery:
    """The union of the queues' heads, as one statement for any number of phones: a host of
    up to 112 idle phones (its statement built for 112, `_shape`) gets one flat compound; a
    larger one a compound of compounds of at most `_TERMS` terms each (one statement still, no
    round trip more)."""
    if len(selects) <= _TERMS:
        return union_all(*selects).subquery("heads")
    groups = [
        union_all(*selects[i : i + _TERMS]).subquery(f"heads_{i // _TERMS}")
        for i in range(0, len(selects), _TERMS)
    ]
    return union_all(*(select(group) for group in groups)).subquery("heads")


def _shape(idle: int) -> int:
    """How many phones the claim statement for `idle` idle phones is built for: `idle` rounded
    up to its top three bits (1-8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...), the places past
    `idle` bound to its last phone again (a queue read twice, its head once more in the union:
    the oldest head still wins).

    Each number of phones is another statement, compiled the first time an engine runs it
    (2 + 2 × phones compound terms: 40-100 ms for 40 phones on a loaded machine). A host's idle
    count walks down one by one as its phones fill, so tasks submitted one after another to a
    fresh cloud with one host of 40 idle phones compiled a new statement for every claim, on
    the event loop, before the next SubmitTask was answered (110-122 ms per submit against
    5-7 ms with one phone, SQLite). Rounded, 40 phones down to 1 take 17 statements, not 40,
    with a third of the terms to compile; a claim reads at most a quarter more queues than
    its phones need (rounding to a power of two read up to twice as many: an empty claim for
    33 phones took 3.4 ms, not 1.6)."""
    step = 1 << max(0, idle.bit_length() - 3)
    return -(-idle // step) * step


@functools.cache
def _candidate(idle: int) -> Select[str, str | None, dt.datetime, str | None, str | None]:
    """The claim's candidate lookup for a host with `idle` idle phones (bound as `idle_0`...).

    The oldest task at the head of the queues the host may take from: tasks for any phone, for
    this host, and for each idle phone, of this host or by serial on any host. One walk of all
    queued tasks in age order read every task queued for other hosts or phones before reaching
    one this host could take (migration 0015). Each queue is one equality lookup in
    `ix_tasks_queue` (an IN list of phones let PostgreSQL walk all tasks in age order instead).
    The heads drive the statement (sorted, then each task found by its key). On PostgreSQL the
    oldest head nobody else holds is locked (FOR UPDATE SKIP LOCKED) and re-checked as still
    queued, so replicas claiming at once take different tasks and nothing else is locked.
    SQLite runs one claim at a time (its write lock): one head per queue is enough.
    """
    queues = [_queue("any_phone", _ANY_HOST, _ANY_PHONE)]
    queues.append(_queue("this_host", _QUEUED_FOR == _HOST, _ANY_PHONE))
    for n in range(idle):
        serial: BindParameter[str] = bindparam(f"idle_{n}", type_=String())
        phone = serial == _TARGET_PHONE
        queues.append(_queue(f"its_phone_{n}", _QUEUED_FOR == _HOST, phone))
        queues.append(_queue(f"any_host_phone_{n}", _ANY_HOST, phone))
    heads = _heads([select(queue) for queue in queues])
    return (
        select(
            TaskRow.task_id,
            TaskRow.target_device_serial,
            TaskRow.updated_at,
            TaskRow.host_id,
            TaskRow.device_serial,
        )
        .join_from(heads, TaskRow, TaskRow.task_id == heads.c.task_id)
        .where((TaskRow.status == states.QUEUED).is_(True))
        .order_by(heads.c.created_at, heads.c.task_id)
        .limit(1)
        .with_for_update(of=TaskRow, skip_locked=True)
    )


_TAKE = (
    update(TaskRow)
    .where(TaskRow.task_id == bindparam("task"), TaskRow.status == states.QUEUED)
    .values(
        status=states.ASSIGNED,
        attempt=TaskRow.attempt + 1,
        host_id=bindparam("host"),
        device_serial=bindparam("serial"),
        updated_at=bindparam("now"),
    )
    .returning(TaskRow.attempt, *_ASSIGNMENT_COLUMNS)
)
_NEW_ATTEMPT = insert(AttemptRow)
_NEW_EVENT = insert(LeaseEventRow)
#: Whether one of the dispatch holds named is set, read inside the claim's own transaction.
_HELD = (
    select(DispatchHoldRow.reason)
    .where(DispatchHoldRow.reason.in_(bindparam("reasons", expanding=True)))
    .limit(1)
)

#: The flow choice a fresh attempt gets without its goal being scored (its attempt number and
#: whether the task asked for no replay → the choice, or None when retrieval must score it):
#: `Retriever.settle` gives it, and the claim writes it on the attempt it creates.
Settle = Callable[[int, bool], Choice | None]


def _phone_for(idle_serials: list[str], last: str | None) -> str:
    """The idle phone a task's next attempt gets: another than the one its previous attempt
    ran on (`last`, when that was on this host) while there is one, else that one.

    A retryable end that names its phone (it was unplugged, or did not answer a look within
    its deadline: `host.agent.loop`) says nothing about the task, and the phone is idle again
    at once: the first idle phone in order was very often that very phone, and a stuck one
    failed every attempt the task had while the host's other phones stood idle. Read from the
    task row the claim already has: no statement more on the claim path."""
    if last is not None and len(idle_serials) > 1:
        return next(s for s in idle_serials if s != last)
    return idle_serials[0]


async def claim(
    store: Store,
    host_id: str,
    idle_serials: list[str],
    planner_transport: int,
    settle: Settle | None = None,
    unless_held: Sequence[str] = (),
) -> Claimed | None:
    """Hand the oldest matching queued task to one of `idle_serials` of `host_id`, or None.

    None too while one of the dispatch holds `unless_held` is set: read in the claim's own
    transaction, so a hold another replica committed before the claim began holds it, however
    long ago the caller read the holds (a pass over many hosts, a host's loop over its phones).

    On PostgreSQL the candidate row is locked with FOR UPDATE SKIP LOCKED, so replicas claiming at
    once pick different tasks; the UPDATE re-checks `status = QUEUED` either way, and a unique
    index allows one live attempt per phone. A device-targeted task only goes to that device.
    With `settle`, a flow choice it gives is written on the new attempt in the same
    transaction (`Claimed.choice_recorded`), sparing the assignment a second write.

    The transaction is one synchronous function (`_claim`) run by `Store.write_on_loop`: on a
    SQLite file on the loop's own thread, elsewhere through the async engine. Through aiosqlite
    a claim crossed to its worker thread and back about 50 times (each statement, cursor, fetch
    and the commit) and cost ~8 ms of CPU: a thousand hosts connecting at once waited seconds
    for their assignments behind one another (bench/dispatch_burst.py).
    """
    if not idle_serials:
        return None
    try:
        return await store.write_on_loop(
            lambda session: _claim(
                session, store.now, host_id, idle_serials, planner_transport, settle, unless_held
            )
        )
    except IntegrityError:
        # The phone already has a live attempt (another stream of this host got there first).
        return None


def _claim(
    session: Session,
    clock: Callable[[], dt.datetime],
    host_id: str,
    idle_serials: list[str],
    planner_transport: int,
    settle: Settle | None,
    unless_held: Sequence[str] = (),
) -> Claimed | None:
    """`claim`'s transaction. A claim that finds nothing has only read: SQLite takes its write
    lock at the first write, so the renewal batches' writes never wait on an empty claim.
    Core statements on the session's connection: the ORM's flush and its ORM-enabled UPDATE
    were ~40 % of a claim's CPU."""
    conn = session.connection()
    if unless_held and conn.execute(_HELD, {"reasons": list(unless_held)}).first() is not None:
        return None
    now = clock()
    params: dict[str, object] = {
        "now": now,
        "host": host_id,
        "depth": _PG_DEPTH if conn.dialect.name == "postgresql" else 1,
    }
    shape, last = _shape(len(idle_serials)), len(idle_serials) - 1
    params.update((f"idle_{n}", idle_serials[min(n, last)]) for n in range(shape))
    candidate = conn.execute(_candidate(shape), params).first()
    if candidate is None:
        return None
    task_id, target_serial, queued_since, last_host, last_serial = candidate
    serial = target_serial or _phone_for(
        idle_serials, last_serial if last_host == host_id else None
    )
    claimed = conn.execute(
        _TAKE, {"task": task_id, "host": host_id, "serial": serial, "now": now}
    ).first()
    if claimed is None:
        return None
    attempt, goal, lease_seconds, deadline, no_replay, max_tokens, max_cost_usd = claimed
    # Read again now the task row is ours: `now` may predate a task submitted while this claim
    # was starting, and an attempt never starts before its task was created.
    now = clock()
    previous = session.scalar(LATEST_PROGRESS, {"task_id": task_id}) if attempt > 1 else None
    spent = (
        spend.usage_of(conn.execute(spend.spent_query(task_id, attempt)).one())
        if attempt > 1
        else Usage()
    )
    expires = now + dt.timedelta(seconds=lease_seconds)
    lease_id = uuid.uuid4().hex
    choice = settle(attempt, no_replay) if settle is not None else None
    conn.execute(
        _NEW_ATTEMPT,
        {
            "task_id": task_id,
            "attempt": attempt,
            "host_id": host_id,
            "device_serial": serial,
            "lease_id": lease_id,
            "lease_expires_at": expires,
            "status": states.ASSIGNED,
            "planner_transport": planner_transport,
            "started_at": now,
            **({} if choice is None else choice_columns(choice)),
        },
    )
    conn.execute(
        _NEW_EVENT,
        lease_events.values(
            EventKind.ASSIGNED,
            task_id,
            attempt,
            now,
            host_id=host_id,
            device_serial=serial,
            task_status=states.ASSIGNED,
        ),
    )
    sealed = {name: token for name, token in conn.execute(secrets.SEALED, {"task_id": task_id})}
    return Claimed(
        task_id=task_id,
        attempt=attempt,
        lease_id=lease_id,
        device_serial=serial,
        goal=goal,
        lease_expires_at=expires,
        lease_seconds=lease_seconds,
        deadline=deadline,
        last_progress=previous,
        sealed_secrets=sealed,
        no_replay=no_replay,
        queued_since=queued_since,
        max_tokens=max_tokens,
        max_cost_usd=max_cost_usd,
        spent=spent,
        choice_recorded=choice is not None,
    )


async def live_attempts_on(store: Store, host_id: str, serials: set[str]) -> list[Claimed]:
    """Live leases of `host_id` on these phones, as assignments (to re-send after a claim whose
    commit outcome was unknown: the row may exist although the claim raised)."""
    if not serials:
        return []
    async with store.read() as session:
        rows = (
            await session.execute(
                select(AttemptRow, *_ASSIGNMENT_COLUMNS)
                .join(TaskRow, TaskRow.task_id == AttemptRow.task_id)
                .where(
                    AttemptRow.host_id == host_id,
                    AttemptRow.device_serial.in_(serials),
                    AttemptRow.ended_at.is_(None),
                    AttemptRow.lease_expires_at > store.now(),
                )
            )
        ).all()
        out = []
        for row, goal, lease_seconds, deadline, no_replay, max_tokens, max_cost_usd in rows:
            previous = await latest_progress(session, row.task_id) if row.attempt > 1 else None
            sealed = await secrets.sealed_for(session, row.task_id)
            spent = await spend.spent_in(session, row.task_id, row.attempt)
            out.append(
                Claimed(
                    task_id=row.task_id,
                    attempt=row.attempt,
                    lease_id=row.lease_id,
                    device_serial=row.device_serial,
                    goal=goal,
                    lease_expires_at=row.lease_expires_at,
                    lease_seconds=lease_seconds,
                    deadline=deadline,
                    last_progress=previous,
                    sealed_secrets=sealed,
                    no_replay=no_replay,
                    max_tokens=max_tokens,
                    max_cost_usd=max_cost_usd,
                    spent=spent,
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class Waiting:
    """Where queued work waits, as far as a dispatch pass needs to know."""

    #: Queued tasks any host may take, counted up to the cap `waiting` was given.
    any_host: int
    #: Hosts with tasks queued for them alone.
    hosts: frozenset[str]


def _next_target(after: ColumnElement[str]) -> ColumnElement[str]:
    """The first target host after `after` in `ix_tasks_queue` (NULL past the last)."""
    return (
        select(_QUEUED_FOR)
        .where(after < _QUEUED_FOR)
        .order_by(_QUEUED_FOR)
        .limit(1)
        .scalar_subquery()
    )


def _waiting() -> Select[str | None, int]:
    """Each target host with queued tasks, once, and beside each the count of tasks for any
    host (up to the bound `cap`): one statement, one row even when nothing waits (the
    recursion's first row; its last host is NULL).

    The hosts come from a loose index scan of `ix_tasks_queue` (one lookup per host, however
    many tasks each has). A GROUP BY of the queued tasks read every one of them on every
    dispatch pass: 10,000 tasks queued for one absent host made each pass 1.8 → 8.5 ms
    (SQLite), 1.8 → 6.9 ms (PostgreSQL)."""
    first = select(_next_target(literal_column("''")).label("host")).cte("targets", recursive=True)
    targets = first.union_all(select(_next_target(first.c.host)).where(first.c.host.is_not(None)))
    any_host = (
        select(func.count())
        .select_from(
            select(literal_column("1"))
            .where(_ANY_HOST)
            # The index's order: without it PostgreSQL, tables unanalysed, read all tasks.
            .order_by(_TARGET_PHONE, TaskRow.created_at, TaskRow.task_id)
            .limit(bindparam("cap", type_=Integer()))
            .subquery()
        )
        .scalar_subquery()
    )
    return select(targets.c.host, any_host)


_WAITING = _waiting()


async def waiting(store: Store, cap: int) -> Waiting:
    """Where queued work waits: `cap` bounds the count of tasks for any host (a pass hands out
    at most one per idle phone), so a long queue costs a pass no more than a short one."""
    async with store.read() as session:
        rows = (await session.execute(_WAITING, {"cap": cap})).all()
    hosts = frozenset(host for host, _ in rows if host is not None)
    return Waiting(int(rows[0][1]) if rows else 0, hosts)
