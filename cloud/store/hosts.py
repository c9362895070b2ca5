"""Host rows: hello and device updates, which replica holds the stream, and the fleet list."""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Executable,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from cloud.store.database import Store
from cloud.store.idlists import among
from cloud.store.lock_waits import (
    SWEEP_LOCK_TIMEOUT_MS,
    bound_lock_waits,
    lock_timed_out,
    waiting_then_skipping,
)
from cloud.store.models import HostRow, ReplicaRow, UTCDateTime

# A replica vouches for its streams every host_heartbeat_seconds; after this many missed beats
# its hosts stop counting as connected (the replica probably died).
STALE_AFTER_BEATS = 3
# A replica's row stale for this many staleness windows is deleted by any live replica's beat
# (`forget_dead_replicas`), once no host row that says connected names it.
FORGET_AFTER_WINDOWS = 10


@dataclass(frozen=True, slots=True)
class HelloRecord:
    """What a hello records on the host's row."""

    devices: list[dict[str, Any]]
    agent_version: str
    planner_transport: int
    replica_id: str
    stream_id: str
    #: "" when the agent does not say: the recorded one is kept.
    process_id: str = ""
    #: The leases the hello names (task id, attempt, lease id): a replica that finds the
    #: host's older stream superseded spares them (`replaced_streams`).
    held: Sequence[tuple[str, int, str]] = ()


async def upsert_hello(
    store: Store,
    host_id: str,
    devices: list[dict[str, Any]],
    agent_version: str,
    planner_transport: int,
    replica_id: str,
    stream_id: str,
    process_id: str = "",
) -> str | None:
    """`record_hello` in a transaction of its own."""
    record = HelloRecord(
        devices, agent_version, planner_transport, replica_id, stream_id, process_id
    )
    now = store.now()
    return await store.write_on_loop(lambda session: record_hello(session, now, host_id, record))


def record_hello(
    session: Session, now: dt.datetime, host_id: str, hello: HelloRecord
) -> str | None:
    """Record a hello: the host is connected through `hello.stream_id` on `hello.replica_id`,
    run by `hello.process_id`. Returns the process id recorded before (None: none known),
    read under a row lock, so of two hellos at once each sees the other's or none."""
    return record_hellos(session, now, [(host_id, hello)])[0]


def record_hellos(
    session: Session,
    now: dt.datetime,
    hellos: Sequence[tuple[str, HelloRecord]],
    held: set[str] | None = None,
) -> list[str | None]:
    """`record_hello` for several hosts with one read of their rows, locked in the order of
    their ids (two replicas' batches never wait for each other in a circle). A host twice in
    `hellos` is recorded twice, in order: the second sees the first's process id.

    With `held` (PostgreSQL, once a bounded wait for the rows timed out: `leases.hellos`) a
    row another transaction holds is skipped (SKIP LOCKED) rather than waited for: its host
    is added to `held` and its hellos are not recorded (None in their places). Waited for,
    one row an operator's `SELECT ... FOR UPDATE` left open in psql held up every hello of
    the batch: none of those hosts could connect while it stayed open."""
    ids = sorted({host_id for host_id, _ in hellos})
    rows = {
        row.host_id: row
        for row in session.scalars(
            select(HostRow)
            .where(HostRow.host_id.in_(ids))
            .order_by(HostRow.host_id)
            .with_for_update(skip_locked=held is not None)
        )
    }
    if held is not None and len(rows) < len(ids):
        # A plain read, no lock: of the rows not locked above, those that exist are held
        # elsewhere (the others are new hosts, inserted below).
        missing = [host_id for host_id in ids if host_id not in rows]
        held.update(session.scalars(select(HostRow.host_id).where(HostRow.host_id.in_(missing))))
    out: list[str | None] = []
    for host_id, hello in hellos:
        if held is not None and host_id in held:
            out.append(None)
            continue
        row = rows.get(host_id)
        if row is None:
            row = rows[host_id] = HostRow(host_id=host_id)
            session.add(row)
        out.append(row.process_id)
        if hello.process_id:
            row.process_id = hello.process_id
        row.devices = hello.devices
        row.agent_version = hello.agent_version
        row.planner_transport = hello.planner_transport
        row.connected = True
        row.replica_id = hello.replica_id
        row.stream_id = hello.stream_id
        row.held_leases = [list(h) for h in hello.held]
        row.stream_alive_at = now
        if row.last_seen_at is None or row.last_seen_at < now:
            row.last_seen_at = now
    return out


def _seen(now: dt.datetime) -> ColumnElement[dt.datetime]:
    """`last_seen_at` set to `now` unless it is later already. Writers take their time before
    they wait for the write lock, so they commit out of order: without this "last seen" could
    step back by microseconds, and a fleet watcher would have shown a time the database no
    longer holds."""
    at = literal(now, UTCDateTime())
    return case((HostRow.last_seen_at > at, HostRow.last_seen_at), else_=at)


@dataclass(frozen=True, slots=True)
class CurrentStream:
    """A host's newest stream as its latest hello recorded it ("" for what is not known)."""

    stream_id: str
    process_id: str
    #: The leases that hello named (task id, attempt, lease id).
    held: list[tuple[str, int, str]]


async def replaced_streams(
    store: Store, held: Sequence[tuple[str, str]]
) -> dict[str, CurrentStream]:
    """Of `held`, (host id, the stream this replica holds of it), the hosts whose latest hello
    recorded another stream (not "" nor NULL): that stream, its process and held leases. The
    database compares, the pairs bound as one JSON parameter (as in `idlists`): a replica's beat
    asks this of every stream it holds, and nearly always none differs. Reading every held
    host's row to compare in Python cost ~11-13 ms of the replica's CPU a beat at 2,000 hosts.

    The held leases travel with the stream because another replica's older stream of the host
    is released on the strength of this read: the leases granted on it but named by the newer
    process (a result it kept) must survive that release, and this row is the only place that
    replica can learn them from, committed with the hello that made the newer stream current."""
    if not held:
        return {}
    # One JSON object, host id -> held stream: `json_each` yields its members as (key, value)
    # text on both backends, with no JSON path to evaluate per row.
    pairs = bindparam(None, json.dumps(dict(held)), type_=String())
    if store.is_postgres:
        listed = func.json_each_text(cast(pairs, JSON)).table_valued("key", "value")
    else:
        listed = func.json_each(pairs).table_valued("key", "value")
    host_id, stream_id = listed.c.key, listed.c.value
    async with store.read() as session:
        rows = await session.execute(
            select(HostRow.host_id, HostRow.stream_id, HostRow.process_id, HostRow.held_leases)
            .select_from(listed)
            .join(HostRow, HostRow.host_id == host_id)
            .where(HostRow.stream_id.is_not(None), HostRow.stream_id != "")
            .where(HostRow.stream_id != stream_id)
        )
        return {
            h: CurrentStream(
                stream, process or "", [(str(t), int(n), str(lease)) for t, n, lease in kept or ()]
            )
            for h, stream, process, kept in rows
        }


class ListWrite(enum.Enum):
    """What `update_devices` did with a phone list."""

    #: Written.
    WRITTEN = "written"
    #: Not written: the host's row names another (newer) stream, whose own phones stand.
    OVERTAKEN = "overtaken"
    #: Not written: the host has no row (deleted while its stream was open); its next hello
    #: records it anew.
    NO_ROW = "no_row"


async def update_devices(
    store: Store, host_id: str, devices: list[dict[str, Any]], *, stream_id: str | None = None
) -> ListWrite:
    """Replace the host's phone list; with `stream_id`, only while that stream is the host's
    recorded one (a write retried after a newer hello must not put an older list back).
    When no row was written, says why (`ListWrite`): the caller's log named a newer stream
    also when the host's row was gone, which sent an operator looking for a second host
    process that did not exist.

    On PostgreSQL the row held by another transaction (an operator's `SELECT ... FOR UPDATE`
    left open in psql) is waited for `SWEEP_LOCK_TIMEOUT_MS` at most; then the database's
    lock timeout is raised (`lock_timed_out`) and the caller keeps the list to write later
    (`cloud.lease.held_rows`). Waited for, it held up the stream's reader, and every renewal
    behind it, until the host's leases ran out while it ran them."""
    now = store.now()
    where = [HostRow.host_id == host_id]
    if stream_id is not None:
        where.append(HostRow.stream_id == stream_id)
    async with store.write() as session:
        await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
        marked = await session.scalars(
            update(HostRow)
            .where(*where)
            .values(devices=devices, last_seen_at=_seen(now))
            .returning(HostRow.host_id)
        )
        if marked.first() is not None:
            return ListWrite.WRITTEN
        found = await session.scalar(select(HostRow.host_id).where(HostRow.host_id == host_id))
        return ListWrite.NO_ROW if found is None else ListWrite.OVERTAKEN


@dataclass(frozen=True, slots=True)
class Backlog:
    """A host's outbox backlog as it reported it (`amc.v1.OutboxBacklog`)."""

    items: int
    decisions: int
    refused: int
    oldest_at: dt.datetime | None


async def update_outbox(store: Store, host_id: str, backlog: Backlog) -> None:
    """Record the host's outbox backlog (and that it spoke).

    Only the fleet view reads it, and the host reports it again as it changes; so on
    PostgreSQL the host's row held by another transaction (an operator's `SELECT ... FOR
    UPDATE` left open in psql) is waited for `SWEEP_LOCK_TIMEOUT_MS` at most, then this report
    is dropped with a warning. Waited for, it held up the host's handler as long as the row
    stayed held: its Welcome (the report follows the hello) or its renewals, which its reader
    answers after this one, until its leases ran out."""
    now = store.now()
    try:
        async with store.write() as session:
            await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
            await session.execute(
                update(HostRow)
                .where(HostRow.host_id == host_id)
                .values(
                    outbox_items=backlog.items,
                    outbox_decisions=backlog.decisions,
                    outbox_refused=backlog.refused,
                    outbox_oldest_at=backlog.oldest_at,
                    outbox_reported_at=now,
                    last_seen_at=_seen(now),
                )
            )
    except DBAPIError as exc:
        if not lock_timed_out(exc):
            raise
        log.warning(
            "host %s: its outbox backlog (%d item(s)) was not recorded: its row is locked by"
            " another transaction for longer than %d ms (an open psql session? see pg_locks);"
            " the fleet view shows its previous report until the next one",
            host_id,
            backlog.items,
            SWEEP_LOCK_TIMEOUT_MS,
        )


def _in_order(stream_id: str, number: int) -> ColumnElement[bool]:
    """The row's last hold write is not a newer one of `stream_id` than `number`: compared in
    the UPDATE itself, so a write that waited (for a pooled connection, or for the row held
    elsewhere) while a newer one landed changes nothing. The same number again lands (a retry
    of a write whose commit was cut off may find itself done). Numbers count per replica, so
    only a write of the same stream is compared (a stream lives on one replica)."""
    return or_(
        HostRow.hold_write_stream_id.is_(None),
        HostRow.hold_write_stream_id != stream_id,
        HostRow.hold_write_number.is_(None),
        HostRow.hold_write_number <= number,
    )


async def hold(
    store: Store,
    host_id: str,
    stream_id: str,
    task_id: str,
    attempt: int,
    window: float,
    *,
    number: int,
) -> bool:
    """Record that new work is held back from the host's stream `stream_id` for `window`
    seconds (`HostSession.lapsed`: its lease of `task_id`/`attempt` ran out while the stream
    stayed open), so every replica's fleet view says so. False when a newer stream took over,
    or a newer write of the hold or its end (`number`: the caller's, rising per stream) landed
    first: written after it, this older one erased it. The row held elsewhere is waited for
    `SWEEP_LOCK_TIMEOUT_MS` at most, then the lock timeout is raised (`lock_timed_out`), as by
    `unhold` and `stopping`: the caller retries in the background (`LeaseManager`)."""
    now = store.now()
    async with store.write() as session:
        await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
        marked = await session.scalars(
            update(HostRow)
            .where(
                HostRow.host_id == host_id,
                HostRow.stream_id == stream_id,
                _in_order(stream_id, number),
            )
            .values(
                held_since=now,
                held_until=now + dt.timedelta(seconds=window),
                held_task_id=task_id,
                held_attempt=attempt,
                held_stream_id=stream_id,
                hold_write_stream_id=stream_id,
                hold_write_number=number,
            )
            .returning(HostRow.host_id)
        )
        return marked.first() is not None


async def unhold(store: Store, host_id: str, stream_id: str, *, number: int) -> bool:
    """The stream's hold ended (the host was heard from); False when none was recorded. The
    end is recorded (its `number`) also when it finds no hold, so an older hold still on its
    way lands no more (`hold`); not when a newer write of the stream landed first, nor once a
    newer stream took over (its hello made any hold of this one void)."""
    async with store.write() as session:
        await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
        # Locked first to read what this ends (the UPDATE's RETURNING gives the new values).
        was = await session.scalar(
            select(HostRow.held_stream_id).where(HostRow.host_id == host_id).with_for_update()
        )
        marked = await session.scalars(
            update(HostRow)
            .where(
                HostRow.host_id == host_id,
                HostRow.stream_id == stream_id,
                _in_order(stream_id, number),
            )
            .values(
                held_since=None,
                held_until=None,
                held_task_id=None,
                held_attempt=None,
                held_stream_id=None,
                hold_write_stream_id=stream_id,
                hold_write_number=number,
            )
            .returning(HostRow.host_id)
        )
        return marked.first() is not None and was == stream_id


async def stopping(store: Store, host_id: str, stream_id: str) -> bool:
    """Record that the host's stream `stream_id` said it is stopping, so every replica's fleet
    view says so; False when a newer stream took over."""
    async with store.write() as session:
        await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
        marked = await session.scalars(
            update(HostRow)
            .where(HostRow.host_id == host_id, HostRow.stream_id == stream_id)
            .values(stopping_since=store.now(), stopping_stream_id=stream_id)
            .returning(HostRow.host_id)
        )
        return marked.first() is not None


def stopping_since(row: HostRow, connected: bool) -> dt.datetime | None:
    """When the host's open stream said it is stopping, if it did (a stop of an older stream
    ended with it)."""
    if not connected or row.stopping_stream_id != row.stream_id:
        return None
    return row.stopping_since


@dataclass(frozen=True, slots=True)
class Held:
    """New work held back from a host: its lease of `task_id`/`attempt` ran out at `since`
    while its stream stayed open; the hold ends at `until` unless the host speaks first."""

    since: dt.datetime
    until: dt.datetime
    task_id: str
    attempt: int


def held(row: HostRow, connected: bool, now: dt.datetime) -> Held | None:
    """The hold on the host now, if any: one of its current stream that has not run out (a
    hold of an older stream ended with it)."""
    if (
        not connected
        or row.held_since is None
        or row.held_until is None
        or row.held_until <= now
        or row.held_stream_id != row.stream_id
    ):
        return None
    return Held(row.held_since, row.held_until, row.held_task_id or "", row.held_attempt or 0)


async def disconnected(
    store: Store, host_id: str, stream_id: str, *, process_id: str | None = None
) -> bool:
    """The stream ended; only the stream that is still recorded may mark the host disconnected.
    True when it did (False: a newer stream of the host took over, nothing changed).
    `process_id`: the process id to record back (a restart whose old leases could not be
    released: the host's next hello must find the previous process again and release them).

    On PostgreSQL the row held by another transaction is waited for `SWEEP_LOCK_TIMEOUT_MS` at
    most, then the database's lock timeout is raised (`lock_timed_out`): the caller retries
    later (`LeaseManager`), as a row left naming this stream would read as connected for as
    long as this replica's heartbeat vouches for it. Waited for, the end of the host's handler
    waited as long as the row was held."""
    now = store.now()
    values: dict[str, Any] = {"connected": False, "last_seen_at": _seen(now)}
    if process_id is not None:
        values["process_id"] = process_id
    async with store.write() as session:
        await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
        marked = await session.scalars(
            update(HostRow)
            .where(HostRow.host_id == host_id, HostRow.stream_id == stream_id)
            .values(values)
            .returning(HostRow.host_id)
        )
        return marked.first() is not None


log = logging.getLogger(__name__)

#: Host ids a warning names at most (the rest are counted).
LEFT_NAMED = 5


async def _mark_disconnected(
    store: Store, due: Sequence[ColumnElement[bool]], values: dict[str, Any], why: str
) -> list[str]:
    """UPDATE the host rows matching `due` to `values` in a transaction of its own; returns
    the hosts marked.

    On PostgreSQL a row another transaction holds (an operator's `SELECT ... FOR UPDATE` left
    open in psql) is waited for `SWEEP_LOCK_TIMEOUT_MS` at most; then the rows no other
    transaction holds are marked (SKIP LOCKED) and the held ones are left as they are, named
    in a warning (`why`: whose write left them). The plain UPDATE waited for such a row as
    long as its holder kept it, and with it a replica's start or stop. A host left so counts
    as disconnected anyway once its stream's vouch is `STALE_AFTER_BEATS` beats old
    (`_open`), as a host of a replica that died does, and its next hello writes its
    row. SQLite has one writer and no row locks."""

    async def attempt(wait: bool) -> tuple[list[str], list[str]]:
        async with store.write() as session:
            await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
            if wait:
                where: Sequence[ColumnElement[bool]] = due
            else:
                free = select(HostRow.host_id).where(*due).with_for_update(skip_locked=True)
                where = [HostRow.host_id.in_(free.scalar_subquery())]
            marked = await session.scalars(
                update(HostRow).where(*where).values(values).returning(HostRow.host_id)
            )
            done = list(marked.all())
            if wait:
                return done, []
            # A plain read, no lock: the rows still due now are those held elsewhere.
            left = await session.scalars(
                select(HostRow.host_id).where(*due).order_by(HostRow.host_id)
            )
            return done, list(left.all())

    marked, left = await waiting_then_skipping(attempt)
    if left:
        named = ", ".join(left[:LEFT_NAMED]) + (
            f" and {len(left) - LEFT_NAMED} more" if len(left) > LEFT_NAMED else ""
        )
        log.warning(
            "%s: %d host(s) left marked connected: their rows are locked by another"
            " transaction for longer than %d ms (an open psql session? see pg_locks); they"
            " count as disconnected once their stream is %d heartbeats unvouched: %s",
            why,
            len(left),
            SWEEP_LOCK_TIMEOUT_MS,
            STALE_AFTER_BEATS,
            named,
        )
    return marked


async def replica_gone(store: Store, replica_id: str) -> list[str]:
    """A replica shuts down: none of its streams is open any more, and its row vouches for
    nothing (deleted after its hosts are marked). Returns the hosts it marked disconnected. A
    host row held in another transaction is waited for a bounded time, then left
    (`_mark_disconnected`): the stop waited for it past its grace. Such a host reads as not
    connected once its hello is `STALE_AFTER_BEATS` beats old, its replica's vouch being gone
    with the row."""
    now = store.now()
    gone = await _mark_disconnected(
        store,
        [HostRow.replica_id == replica_id, HostRow.connected.is_(True)],
        {"connected": False, "last_seen_at": _seen(now)},
        f"replica {replica_id} stopping",
    )
    await _forget_replicas(store, ReplicaRow.replica_id == replica_id)
    return gone


def _vouched() -> ColumnElement[dt.datetime]:
    """In a statement over `hosts`: when the host's stream was last vouched for, the later of
    its hello (`stream_alive_at`, which replicas before migration 0032 also wrote every beat)
    and its replica's last heartbeat (NULL: neither)."""
    beat = (
        select(ReplicaRow.vouched_at)
        .where(ReplicaRow.replica_id == HostRow.replica_id)
        .scalar_subquery()
    )
    alive = HostRow.stream_alive_at
    return case((and_(beat.is_not(None), or_(alive.is_(None), beat > alive)), beat), else_=alive)


async def none_connected(store: Store, before: dt.datetime) -> list[str]:
    """The whole cloud was down (a replica starts with none other alive): no stream vouched for
    `before` it asked is open, whatever the rows of the replicas that died without a goodbye
    (SIGKILL, a crash) say. Their hosts are marked disconnected, last seen when their replica
    last vouched for their stream; until then a host that died with the cloud read "connected ·
    last seen now" for three heartbeats after the cloud came back. A stream vouched for since
    is open on a replica started at the same moment. The rows of the replicas that last
    vouched before `before` go too: no host row that says connected names them any more
    (a replica started at the same moment writes its row again at its next beat). Returns the
    hosts it marked. A host row held in another transaction is waited for a bounded time, then
    left (`_mark_disconnected`): the replica's start waited for it as long as it was held."""
    vouched = _vouched()
    out = await _mark_disconnected(
        store,
        [HostRow.connected.is_(True), or_(vouched.is_(None), vouched < before)],
        {
            "connected": False,
            "last_seen_at": case(
                (or_(HostRow.last_seen_at.is_(None), HostRow.last_seen_at < vouched), vouched),
                else_=HostRow.last_seen_at,
            ),
        },
        "replica start after an outage",
    )
    await _forget_replicas(store, ReplicaRow.vouched_at < before)
    return out


async def _forget_replicas(store: Store, due: ColumnElement[bool]) -> None:
    """Delete the `replicas` rows matching `due`, best effort, after their hosts were marked.

    Never raised: the caller still has to tell fleet watchers about the hosts it marked (their
    rows say disconnected now, so no later look would), and a row left behind only vouches for
    host rows still marked connected, for `STALE_AFTER_BEATS` beats. On PostgreSQL a row another
    transaction holds is waited for `SWEEP_LOCK_TIMEOUT_MS` at most, then left (SKIP LOCKED), as
    the host rows are: a plain DELETE hung a replica's stop, or its start after an outage, as
    long as the row was held."""

    def statement(wait: bool) -> Executable:
        if wait:
            return delete(ReplicaRow).where(due)
        free = select(ReplicaRow.replica_id).where(due).with_for_update(skip_locked=True)
        return delete(ReplicaRow).where(ReplicaRow.replica_id.in_(free.scalar_subquery()))

    try:
        if store.is_postgres:
            await _bounded(store, statement)
        else:
            async with store.write() as session:
                await session.execute(statement(True))
    except Exception as exc:
        log.warning("a replica's vouch row could not be deleted (left to go stale): %s", exc)


async def heartbeat(store: Store, replica_id: str) -> None:
    """The replica vouches for every stream it holds: one row, its own (`ReplicaRow`), whatever
    the number of its hosts. A host row that names this replica and says connected counts as
    connected while this row is fresh (`STALE_AFTER_BEATS`).

    Before, the beat wrote a row per host: each stream's vouch, and the time each host that
    spoke since the beat before last spoke (at one renewal a second, every host): at 2,000
    hosts the replica's largest background job, and every one of those hosts was published to
    the fleet watchers every beat. A host's `last_seen_at` is now written when its stream opens
    and ends (and when a replica finds its replica gone); while the stream is open the fleet
    shows its replica's vouch instead (`list_hosts`).

    On PostgreSQL the row is waited for `SWEEP_LOCK_TIMEOUT_MS` at most should another
    transaction hold it (an operator's `SELECT ... FOR UPDATE` left open in psql), then left
    for the next beat (`_bounded`): a beat must not hang behind it. Host rows held elsewhere
    no longer touch the beat at all. SQLite has one writer and no row locks."""
    now = store.now()
    insert = pg_insert if store.is_postgres else sqlite_insert
    upsert = (
        insert(ReplicaRow)
        .values(replica_id=replica_id, vouched_at=now)
        .on_conflict_do_update(index_elements=["replica_id"], set_={"vouched_at": now})
    )
    if not store.is_postgres:
        await store.write_on_loop(lambda session: session.execute(upsert))
        return

    def statement(wait: bool) -> Executable:
        if wait:
            return upsert
        free = (
            select(ReplicaRow.replica_id)
            .where(ReplicaRow.replica_id == replica_id)
            .with_for_update(skip_locked=True)
        )
        return (
            update(ReplicaRow)
            .where(ReplicaRow.replica_id.in_(free.scalar_subquery()))
            .values(vouched_at=now)
        )

    await _bounded(store, statement)


async def forget_dead_replicas(store: Store, heartbeat_seconds: float) -> None:
    """Delete the rows of replicas that last vouched `FORGET_AFTER_WINDOWS` staleness windows
    ago and that no host row saying connected names. A replica that crashed while others stayed
    up left its row for good: only its clean stop (`replica_gone`) or a start after an outage of
    the whole cloud (`none_connected`) deleted one. A row still named by a connected host stays:
    it is that host's last vouch, which the fleet shows as its last seen. A replica that was
    only paused that long writes its row again at its next beat.

    The common beat finds no such row in a read of the (small) table and stops there. On
    PostgreSQL a row held in another transaction is waited for `SWEEP_LOCK_TIMEOUT_MS` at most,
    then left for a later beat (`_bounded`)."""
    before = store.now() - dt.timedelta(
        seconds=heartbeat_seconds * STALE_AFTER_BEATS * FORGET_AFTER_WINDOWS
    )
    async with store.read() as session:
        stale = await session.scalar(
            select(ReplicaRow.replica_id).where(ReplicaRow.vouched_at < before).limit(1)
        )
    if stale is None:
        return
    named = (
        select(HostRow.host_id)
        .where(HostRow.connected.is_(True), HostRow.replica_id == ReplicaRow.replica_id)
        .exists()
    )
    dead = [ReplicaRow.vouched_at < before, ~named]
    if not store.is_postgres:
        async with store.write() as session:
            await session.execute(delete(ReplicaRow).where(*dead))
        return

    def statement(wait: bool) -> Executable:
        if wait:
            return delete(ReplicaRow).where(*dead)
        free = select(ReplicaRow.replica_id).where(*dead).with_for_update(skip_locked=True)
        return delete(ReplicaRow).where(ReplicaRow.replica_id.in_(free.scalar_subquery()))

    await _bounded(store, statement)


async def _bounded(store: Store, statement: Callable[[bool], Executable]) -> None:
    """Run a heartbeat (or replica row) statement on PostgreSQL in a transaction of its own, waiting
    `SWEEP_LOCK_TIMEOUT_MS` at most for a row another transaction holds; then once more as
    `statement(False)`, which leaves the rows held elsewhere for a later beat."""

    async def attempt(wait: bool) -> None:
        async with store.write() as session:
            await bound_lock_waits(session, True, SWEEP_LOCK_TIMEOUT_MS)
            await session.execute(statement(wait))

    await waiting_then_skipping(attempt)


def _stale_before(store: Store, heartbeat_seconds: float) -> dt.datetime:
    """Streams last vouched for before this instant no longer count as open."""
    return store.now() - dt.timedelta(seconds=heartbeat_seconds * STALE_AFTER_BEATS)


@dataclass(frozen=True, slots=True)
class _Vouches:
    """Every replica's last heartbeat, read once per listing (a row per replica), and the
    instant before which a vouch is stale."""

    beats: dict[str, dt.datetime]
    stale: dt.datetime

    @property
    def fresh(self) -> list[str]:
        """The replicas whose streams count as open."""
        return sorted(r for r, at in self.beats.items() if at > self.stale)

    def vouched(self, row: HostRow) -> dt.datetime | None:
        """When the host's stream was last vouched for (`_vouched`, in Python)."""
        beat = self.beats.get(row.replica_id or "")
        alive = row.stream_alive_at
        if beat is None or (alive is not None and alive >= beat):
            return alive
        return beat

    def connected(self, row: HostRow) -> bool:
        at = self.vouched(row)
        return bool(row.connected and at is not None and at > self.stale)

    def shown(self, row: HostRow) -> tuple[HostRow, bool]:
        """The row as the fleet shows it, and whether its host is connected. A row that says
        connected shows as `last_seen_at` the later of its own and its stream's last vouch: a
        connected host was heard from then (its stream open, kept alive by keepalives and
        renewals), and one whose replica died was last heard from when that replica last
        vouched. The rows are the read's detached copies: nothing writes them back."""
        at = self.vouched(row) if row.connected else None
        if at is not None and (row.last_seen_at is None or row.last_seen_at < at):
            row.last_seen_at = at
        return row, self.connected(row)


async def _vouches(session: AsyncSession, stale: dt.datetime) -> _Vouches:
    found = await session.execute(select(ReplicaRow.replica_id, ReplicaRow.vouched_at))
    return _Vouches({r: at for r, at in found}, stale)


def _open(v: _Vouches) -> ColumnElement[bool]:
    """In SQL over `hosts`: the host counts as connected (`_Vouches.connected`). Plain column
    tests (the fresh replicas' ids as a list), so a walk by host id stays on its index."""
    return and_(
        HostRow.connected.is_(True),
        or_(HostRow.stream_alive_at > v.stale, HostRow.replica_id.in_(v.fresh)),
    )


def _not_open(v: _Vouches) -> ColumnElement[bool]:
    """The complement of `_open`, NULLs included (a row never vouched for, nor named a
    replica)."""
    return or_(
        HostRow.connected.is_not(True),
        and_(
            or_(HostRow.stream_alive_at.is_(None), HostRow.stream_alive_at <= v.stale),
            or_(HostRow.replica_id.is_(None), HostRow.replica_id.not_in(v.fresh)),
        ),
    )


async def list_hosts(
    store: Store,
    heartbeat_seconds: float,
    host_ids: list[str] | None = None,
    *,
    mentioning: str | None = None,
) -> list[tuple[HostRow, bool]]:
    """Every host (or those of `host_ids`) with whether a stream is open now: connected first,
    then by id; each row's `last_seen_at` as the fleet shows it (`_Vouches.shown`).
    `mentioning`: only hosts whose stored phones hold that text as a JSON string
    (a serial, a model…: a filter in SQL, so a check of one serial does not load the fleet;
    the caller still checks the field it means)."""
    stale = _stale_before(store, heartbeat_seconds)
    query = select(HostRow)
    if host_ids is not None:
        query = query.where(HostRow.host_id.in_(host_ids))
    if mentioning is not None:
        # The column holds json.dumps' text (SQLAlchemy's JSON type, on both backends).
        query = query.where(
            cast(HostRow.devices, Text).contains(json.dumps(mentioning), autoescape=True)
        )
    async with store.read() as session:
        vouches = await _vouches(session, stale)
        rows = (await session.scalars(query)).all()
    out = [vouches.shown(r) for r in rows]
    out.sort(key=lambda pair: (not pair[1], pair[0].host_id))
    return out


#: HostFilter.connection: either, connected now, not connected now.
ANY, CONNECTED, DISCONNECTED = "any", "connected", "disconnected"


@dataclass(frozen=True, slots=True)
class HostFilter:
    """ListHosts filters; empty means no filter."""

    #: ANY, CONNECTED or DISCONNECTED, as `_Vouches.connected` decides.
    connection: str = ANY
    #: Only hosts whose id contains this text (case-insensitive).
    query: str = ""
    #: Only these hosts (None: any).
    host_ids: tuple[str, ...] | None = None


async def hosts_page(
    store: Store,
    heartbeat_seconds: float,
    flt: HostFilter,
    size: int,
    after: str | None = None,
    *,
    through: str | None = None,
) -> tuple[list[tuple[HostRow, bool]], bool]:
    """One page of hosts by id, after the host id `after`, and whether more follow. Ordered,
    filtered and cut in SQL: ListHosts loaded every host row of the fleet to answer one page,
    and the console's pickers asked for a page on every render. By id alone, a key no host
    changes: ordered connected first, a host that connected or disconnected between two pages
    of a walk moved across the place the walk had reached and was skipped or listed twice (a
    console paging a fleet of 10,000 hosts, which come and go all the time). Ids compare by
    code point on both backends (PostgreSQL's "C" collation), as the keys in page tokens and
    the fleet page's pager were made. `through`: no host after this id (a watched page's
    range, FleetService.WatchHosts)."""
    stale = _stale_before(store, heartbeat_seconds)
    host_id = HostRow.host_id.collate("C") if store.is_postgres else HostRow.host_id
    query = select(HostRow)
    if flt.query:
        query = query.where(
            func.lower(HostRow.host_id).contains(flt.query.lower(), autoescape=True)
        )
    if flt.host_ids is not None:
        query = query.where(among(store, HostRow.host_id, flt.host_ids))
    if after is not None:
        query = query.where(host_id > after)
    if through is not None:
        query = query.where(host_id <= through)
    query = query.order_by(host_id).limit(size + 1)
    async with store.read() as session:
        vouches = await _vouches(session, stale)
        # Plain column tests (`_open`), so the walk stays on the index in host id order
        # (migration 0027) and skips the hosts the filter leaves out.
        if flt.connection == CONNECTED:
            query = query.where(_open(vouches))
        elif flt.connection == DISCONNECTED:
            query = query.where(_not_open(vouches))
        rows = (await session.scalars(query)).all()
    return [vouches.shown(r) for r in rows[:size]], len(rows) > size


async def unvouched(store: Store, heartbeat_seconds: float) -> set[str]:
    """Hosts still recorded as connected whose replica stopped vouching for their stream (it
    probably died): they no longer count as connected, though their rows say so."""
    stale = _stale_before(store, heartbeat_seconds)
    async with store.read() as session:
        vouches = await _vouches(session, stale)
        ids = await session.scalars(
            select(HostRow.host_id).where(HostRow.connected.is_(True), _not_open(vouches))
        )
        return set(ids.all())
