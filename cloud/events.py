"""Change events between the parts of one replica, and across replicas through PostgreSQL.

Ten kinds of event travel: "these tasks changed" (watchers reload them), "these leases were
extended, with new progress or nothing else changed" (watchers on every replica show the new
expiry and progress without a read: the extension itself travels), "these tasks' totals moved"
(a decision, or a failed decision's calls, was counted: the new totals travel, so watchers show
them without a read either), "these hosts changed"
(fleet watchers reload them: connected, disconnected, phones), "tasks are queued" (dispatchers
look for idle phones), "revoke this lease" (the replica holding the host's stream tells the
host), "a host has a new stream" (a replica holding an older stream of that host replaces or
supersedes it), "certificate revocations changed" (every replica reloads its deny-list and drops
the streams it refuses now; `amc certs revoke` sends it from outside any replica, with
`announce`), "a dispatch hold was set or lifted" (dispatchers read `dispatch_holds` again),
and live thinking text of a step being planned (watchers that asked for it show it;
it is never stored). In one process they are delivered directly; on PostgreSQL every replica
also LISTENs on one channel and the publisher NOTIFYs it, batched into a few NOTIFY calls per
flush so a burst of renewals costs a handful of round trips, not one each.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from cloud import metrics, supervised
from cloud.store import errors, spend
from cloud.store.database import Store
from cloud.store.leases.progress import ProgressIn
from cloud.store.spend import TaskSpent
from planner.decision import Usage

log = logging.getLogger(__name__)

CHANNEL = "amc_events"
_MAX_PAYLOAD = 7000  # PostgreSQL refuses NOTIFY payloads of 8000 bytes or more.
# Tasks' totals per NOTIFY message: a task id of up to 64 characters and twelve numbers each
# (at most 25 characters as JSON: a float's repr, a 64-bit integer), under 400 bytes.
_TOTALS_CHUNK = 16
# Thinking text per NOTIFY message: JSON escapes a character to at most 12 bytes (a surrogate
# pair), so 500 characters always fit one payload.
_THINKING_CHUNK = 500
# What a slow watcher keeps of one attempt's unread thinking: the newest text wins.
_THINKING_BACKLOG = 16_384
#: How long before the last notification heard a LISTEN gap is taken to begin: a task's end
#: is stamped by its writer before its commit (and its NOTIFY), on that replica's clock.
GAP_MARGIN = dt.timedelta(seconds=30)


# Every payload of a flush in one statement, in order (a function scan yields the array's
# elements in order, and the notifications of one transaction are delivered in the order sent).
# The payloads go as one JSON text: as a `text[]` parameter psycopg dumped and escaped each in
# Python, a 40 ms stop of a 10,000-host replica's loop after every heartbeat (250 payloads).
_NOTIFY_ALL = "SELECT pg_notify(%s, p) FROM json_array_elements_text(CAST(%s AS json)) AS p"

#: The message every replica reloads its deny-list on.
REVOCATIONS_CHANGED: dict[str, Any] = {"k": "c"}


async def announce(session: AsyncSession, message: dict[str, Any], origin: str) -> None:
    """NOTIFY every replica of `message` inside `session`'s transaction (PostgreSQL delivers it
    on commit, so a replica that hears it reads what was committed). For writers that are not
    a replica (`amc certs revoke`); `origin` names them in the payload."""
    payload = json.dumps({"r": origin, "m": [message]}, separators=(",", ":"))
    await session.execute(select(func.pg_notify(CHANNEL, payload)))


@dataclass(frozen=True, slots=True)
class RevokeEvent:
    """Tell `host_id` (wherever its stream is) to stop an attempt."""

    host_id: str
    task_id: str
    attempt: int
    lease_id: str
    reason: int
    message: str
    device_serial: str = ""
    # True when the attempt already ended in the store (expiry, deadline): the phone is free.
    ended: bool = False
    #: The task's status then (its stored name; "" unknown): `Revoked.task_status`.
    task_status: str = ""
    #: When the lease ran out, for an expiry (None: not said): a host heard from since then is
    #: not frozen (`LeaseManager._on_revoke`).
    expired_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class Extension:
    """A lease renewed with nothing else about its task changed but, when given, its attempt's
    progress and start: its new expiry, when, the progress stored with it, and whether the
    task turned RUNNING."""

    task_id: str
    expires_at: dt.datetime
    renewed_at: dt.datetime
    #: The attempt renewed (the renewal's own; 0 when not said).
    attempt: int = 0
    #: The attempt's new progress; None when it did not change.
    progress: ProgressIn | None = None
    #: The attempt's first renewal: it and its task turned RUNNING.
    started: bool = False


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)


def _micros(t: dt.datetime) -> int:
    """Whole microseconds since the epoch: exact, as the store keeps times (a watcher compares
    the write's time with the task it was sent). Integer arithmetic: `td // microsecond` is
    slower and a float timestamp can round."""
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def _instant(text: Any) -> dt.datetime | None:
    """An ISO time another replica sent; None for none, or for one this replica cannot read
    (an older or newer replica's)."""
    try:
        return dt.datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _encode_extension(e: Extension) -> list[Any]:
    """An extension as a JSON array: task, expiry, write time, attempt, start, then progress."""
    fields: list[Any] = [
        e.task_id,
        _micros(e.expires_at),
        _micros(e.renewed_at),
        e.attempt,
        int(e.started),
    ]
    p = e.progress
    if p is not None:
        fields += [p.step_index, p.step_status, p.summary, p.max_steps]
    return fields


def _decode_extension(fields: list[Any]) -> Extension:
    progress = None
    if len(fields) > 5:
        step_index, step_status, summary, max_steps = fields[5:9]
        progress = ProgressIn(
            int(step_index),
            int(step_status),
            str(summary),
            None if max_steps is None else int(max_steps),
        )
    return Extension(
        str(fields[0]),
        _EPOCH + int(fields[1]) * _MICROSECOND,
        _EPOCH + int(fields[2]) * _MICROSECOND,
        int(fields[3]),
        progress,
        started=bool(fields[4]),
    )


def _extension_messages(extended: list[Extension]) -> list[str]:
    """Extensions as rendered messages that each fit a payload. Each message is rendered in one
    `json.dumps` (one per extension cost ~3 µs each, a hot path at 1,000 renewals/s); they are
    grouped by their length as ASCII, and a group that escapes beyond the limit is halved."""
    out: list[str] = []

    def render(rows: list[list[Any]]) -> None:
        text = json.dumps({"k": "x", "e": rows}, separators=(",", ":"))
        if len(text) > _MAX_PAYLOAD - 100 and len(rows) > 1:
            half = len(rows) // 2
            render(rows[:half])
            render(rows[half:])
        else:
            out.append(text)

    rows: list[list[Any]] = []
    size = 0
    for e in extended:
        row = _encode_extension(e)
        length = 50 + len(e.task_id) + (len(e.progress.summary) + 24 if e.progress else 0)
        if rows and size + length > _MAX_PAYLOAD - 100:
            render(rows)
            rows, size = [], 0
        rows.append(row)
        size += length
    if rows:
        render(rows)
    return out


def _encode_spent(s: TaskSpent) -> list[Any]:
    """A task's totals as a JSON array: task, decisions, the figures in `Usage` order, then,
    when read, when the reading began and its unsettled calls (how many, their bound's input
    and output tokens and cost)."""
    fields = [s.task_id, s.decisions, *(getattr(s.usage, name) for name in spend.FIGURES)]
    if s.unsettled is not None and s.read_at is not None:
        n, at_most = s.unsettled
        fields += [
            _micros(s.read_at),
            n,
            at_most.input_tokens,
            at_most.output_tokens,
            at_most.cost_usd,
        ]
    return fields


def _decode_spent(fields: list[Any]) -> TaskSpent:
    totals = 2 + len(spend.FIGURES)
    if len(fields) not in (totals, totals + 5):
        raise ValueError("not a task's totals")
    usage = spend.usage_of(fields[2:totals])
    if len(fields) == totals:  # a replica that sends no unsettled calls
        return TaskSpent(str(fields[0]), usage, int(fields[1]))
    read_at, n, i, o, cost = fields[totals:]
    at_most = Usage(input_tokens=int(i), output_tokens=int(o), cost_usd=float(cost))
    return TaskSpent(
        str(fields[0]),
        usage,
        int(fields[1]),
        (int(n), at_most),
        _EPOCH + int(read_at) * _MICROSECOND,
    )


class Mailbox:
    """A watcher's mailbox of changed ids: coalesces, never overflows."""

    def __init__(self, on_close: Callable[[Mailbox], None]) -> None:
        self._on_close = on_close
        self._pending: set[str] = set()
        self._all = False
        self._event = asyncio.Event()

    def _offer(self, ids: list[str]) -> None:
        self._pending.update(ids)
        self._event.set()

    def _offer_all(self) -> None:
        self._all = True
        self._pending.clear()
        self._event.set()

    async def next(self) -> set[str] | None:
        """Wait for changes; return every id changed since the last call (possibly none, when
        a subclass's own kind of event woke it), or None when anything may have changed
        (notifications from other replicas may have been lost while LISTEN reconnected)."""
        await self._event.wait()
        self._event.clear()
        if self._all:
            self._all = False
            self._pending.clear()
            return None
        out, self._pending = self._pending, set()
        return out

    def close(self) -> None:
        """Stop receiving."""
        self._on_close(self)


class Subscription(Mailbox):
    """Changed task ids, and, if asked, live thinking (of `task_id` only, when given)."""

    def __init__(
        self,
        on_close: Callable[[Mailbox], None],
        *,
        thinking: bool = False,
        task_id: str | None = None,
    ) -> None:
        super().__init__(on_close)
        self._wants_thinking = thinking
        self._task_id = task_id
        self._thinking: dict[tuple[str, int], str] = {}
        self._extended: dict[str, Extension] = {}
        self._spent: dict[str, TaskSpent] = {}
        self._missed_since: dt.datetime | None = None

    def _offer_missed(self, since: dt.datetime) -> None:
        """Notifications sent from `since` on may have been lost (LISTEN reconnected)."""
        if self._missed_since is None or since < self._missed_since:
            self._missed_since = since
        self._offer_all()

    def take_missed_since(self) -> dt.datetime | None:
        """When the notifications that may have been lost began (the earliest gap since the
        last call; None: none): a fleet watcher re-reads the tasks that ended from then on
        too, whose ends it would otherwise never hear of."""
        since, self._missed_since = self._missed_since, None
        return since

    def _offer_spent(self, spent: list[TaskSpent]) -> None:
        for s in spent:
            if not self._task_id or s.task_id == self._task_id:
                held = self._spent.get(s.task_id)
                self._spent[s.task_id] = s if held is None else held.newest(s)
                self._event.set()

    def take_spent(self) -> list[TaskSpent]:
        """Tasks' totals received since the last call, the newest of each task."""
        out = list(self._spent.values())
        self._spent = {}
        return out

    def _offer_extended(self, extended: list[Extension]) -> None:
        for e in extended:
            if not self._task_id or e.task_id == self._task_id:
                # The later write wins, not the later arrival: a host that moved replicas may
                # be heard from its new replica before its old one's last flush.
                held = self._extended.get(e.task_id)
                if held is None or held.renewed_at <= e.renewed_at:
                    self._extended[e.task_id] = e
                self._event.set()

    def take_extended(self) -> list[Extension]:
        """Lease extensions received since the last call, the newest of each task."""
        out = list(self._extended.values())
        self._extended = {}
        return out

    def _offer_thinking(self, task_id: str, attempt: int, delta: str) -> None:
        if not self._wants_thinking or (self._task_id and task_id != self._task_id):
            return
        key = (task_id, attempt)
        self._thinking[key] = (self._thinking.get(key, "") + delta)[-_THINKING_BACKLOG:]
        self._event.set()

    def take_thinking(self) -> list[tuple[str, int, str]]:
        """Live thinking received since the last call: (task id, attempt, text) in order."""
        out = [(task_id, attempt, text) for (task_id, attempt), text in self._thinking.items()]
        self._thinking = {}
        return out


HostSubscription = Mailbox
"""Changed host ids (FleetService.WatchHosts)."""


class EventBus:
    """In-process fan-out plus, on PostgreSQL, LISTEN/NOTIFY between replicas."""

    def __init__(self, store: Store, replica_id: str | None = None) -> None:
        self.store = store
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        #: How every payload this replica sends begins (`_payloads`); LISTEN hears them too.
        self._head = '{"r":' + json.dumps(self.replica_id) + ',"m":['
        self._subs: set[Subscription] = set()
        self._host_subs: set[HostSubscription] = set()
        self.on_queued: list[Callable[[], None]] = []
        self.on_revoke: list[Callable[[RevokeEvent], None]] = []
        #: Called with (host id, stream id) when a host opened a stream on another replica.
        self.on_new_stream: list[Callable[[str, str], None]] = []
        #: Called when certificate revocations may have changed (or events may have been lost).
        self.on_revocations: list[Callable[[], None]] = []
        #: Called when another replica set or lifted a dispatch hold (cloud/dispatch_holds.py).
        self.on_holds: list[Callable[[], None]] = []
        self._outbox: list[dict[str, Any]] = []
        self._outbox_event = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._listen_ready = asyncio.Event()
        #: When LISTEN last heard anything (or began listening): what it missed while its
        #: connection was down was sent after this (`GAP_MARGIN`).
        self._heard_at: dt.datetime | None = None

    # ---- publishing -------------------------------------------------------------------------

    def subscribe(self, *, thinking: bool = False, task_id: str | None = None) -> Subscription:
        """A new mailbox for task changes; with `thinking`, also for live thinking (of `task_id`
        only, when given)."""
        sub = Subscription(self._subs.discard, thinking=thinking, task_id=task_id)
        self._subs.add(sub)
        return sub

    def watchers(self) -> int:
        """Open task mailboxes: one per live WatchProgress call of this replica (a call whose
        client went away closes its own)."""
        return len(self._subs)

    def subscribe_hosts(self) -> HostSubscription:
        """A new mailbox for host changes (FleetService.WatchHosts)."""
        sub = HostSubscription(self._host_subs.discard)
        self._host_subs.add(sub)
        return sub

    def thinking(self, task_id: str, attempt: int, delta: str) -> None:
        """Thinking text of a step being planned, for watchers that asked for it. Consecutive
        deltas of one attempt are joined into few NOTIFY messages."""
        if not delta:
            return
        self._deliver_thinking(task_id, attempt, delta)
        if not self.store.is_postgres:
            return
        last = self._outbox[-1] if self._outbox else None
        if (
            last is not None
            and last["k"] == "th"
            and (last["t"], last["a"]) == (task_id, attempt)
            and len(last["x"]) + len(delta) <= _THINKING_CHUNK
        ):
            last["x"] += delta
            return
        for i in range(0, len(delta), _THINKING_CHUNK):
            self._remote(
                {"k": "th", "t": task_id, "a": attempt, "x": delta[i : i + _THINKING_CHUNK]}
            )

    def tasks_changed(self, task_ids: list[str]) -> None:
        """Tasks changed (status, progress, attempt)."""
        if not task_ids:
            return
        self._deliver_changed(task_ids)
        self._remote({"k": "t", "ids": task_ids})

    def leases_extended(self, extended: list[Extension]) -> None:
        """Leases were extended and nothing else about their tasks changed but, in some, their
        progress: watchers on every replica show the new expiry and progress without reloading
        the tasks (nearly every renewal write at the default interval is one). Other replicas
        hear the extensions themselves: as task changes, each of their watchers reloaded every
        renewed task, a read per renewal per watcher."""
        if not extended:
            return
        for sub in list(self._subs):
            sub._offer_extended(extended)
        self._remote({"k": "x", "e": extended})

    async def decisions_counted(
        self, task_ids: list[str], counted: Sequence[TaskSpent] = ()
    ) -> None:
        """Decisions, or failed decisions' calls, were just counted in these tasks' totals, or
        a model call's marker was written or settled (`cloud.store.unsettled`), and committed:
        their watchers on every replica show the new totals and calls of unknown cost. They
        are read here once, one row per task (not the totals in `counted`: the count's own
        UPDATE returned them, `spend.add_to_task_totals`), and travel as they are, so no
        watcher reloads a task for them: as task changes, each step of every task cost each
        watcher a reload. Should the read fail, the tasks are announced as changed instead
        (their watchers reload them)."""
        if not task_ids or (not self.store.is_postgres and not self._subs):
            return  # nobody watches (another replica's watchers would, on PostgreSQL)
        try:
            found = await spend.task_totals(self.store, task_ids, counted)
        except Exception as exc:
            errors.report(log, "reading the totals just counted failed; watchers reload", exc)
            self.tasks_changed(task_ids)
            return
        self.totals_moved(found)

    def totals_moved(self, spent: list[TaskSpent]) -> None:
        """These are the tasks' totals now: watchers on every replica show them."""
        if not spent:
            return
        self._deliver_spent(spent)
        for i in range(0, len(spent), _TOTALS_CHUNK):
            self._remote({"k": "u", "e": [_encode_spent(s) for s in spent[i : i + _TOTALS_CHUNK]]})

    def hosts_changed(self, host_ids: list[str], *, local_only: bool = False) -> None:
        """Hosts changed (hello, phones, stream closed). `local_only` for changes every replica
        finds by itself (a host whose replica stopped vouching for it), so each tells only its
        own watchers instead of every replica notifying every other."""
        if not host_ids:
            return
        self._deliver_hosts(host_ids)
        if not local_only:
            self._remote({"k": "h", "ids": host_ids})

    def tasks_queued(self) -> None:
        """Work is waiting: dispatchers should look for idle phones."""
        self._deliver_queued()
        self._remote({"k": "q"})

    def holds_changed(self) -> None:
        """A dispatch hold was set or lifted: the other replicas' dispatchers read them again."""
        self._remote({"k": "d"})

    def revoke(self, event: RevokeEvent) -> None:
        """Ask whichever replica holds the host's stream to revoke a lease."""
        self._deliver_revoke(event)
        self._remote(
            {
                "k": "v",
                "h": event.host_id,
                "t": event.task_id,
                "a": event.attempt,
                "l": event.lease_id,
                "why": event.reason,
                "m": event.message,
                "d": event.device_serial,
                "e": event.ended,
                "s": event.task_status,
                "x": None if event.expired_at is None else event.expired_at.isoformat(),
            }
        )

    def new_stream(self, host_id: str, stream_id: str) -> None:
        """`host_id` opened stream `stream_id` here: other replicas check their older ones."""
        self._remote({"k": "s", "h": host_id, "s": stream_id})

    def revocations_changed(self) -> None:
        """The deny-list changed: every replica (this one too) reloads it."""
        self._deliver_revocations()
        self._remote(REVOCATIONS_CHANGED)

    def _deliver_revocations(self) -> None:
        for cb in self.on_revocations:
            cb()

    def _deliver_changed(self, task_ids: list[str]) -> None:
        for sub in list(self._subs):
            sub._offer(task_ids)

    def _deliver_extended(self, encoded: list[Any]) -> None:
        """Another replica's extensions; one this replica cannot read is reloaded instead."""
        try:
            extended = [_decode_extension(e) for e in encoded]
        except (TypeError, ValueError, IndexError, OverflowError):
            log.warning("unreadable lease extensions from another replica; reloading their tasks")
            ids = [str(e[0]) for e in encoded if isinstance(e, list) and e]
            self._deliver_changed(ids)
            return
        for sub in list(self._subs):
            sub._offer_extended(extended)

    def _deliver_spent(self, spent: list[TaskSpent]) -> None:
        for sub in list(self._subs):
            sub._offer_spent(spent)

    def _deliver_spent_remote(self, encoded: list[Any]) -> None:
        """Another replica's totals; those this replica cannot read are reloaded instead."""
        try:
            spent = [_decode_spent(e) for e in encoded]
        except (TypeError, ValueError, IndexError, OverflowError):
            log.warning("unreadable task totals from another replica; reloading their tasks")
            self._deliver_changed([str(e[0]) for e in encoded if isinstance(e, list) and e])
            return
        self._deliver_spent(spent)

    def _deliver_hosts(self, host_ids: list[str]) -> None:
        for sub in list(self._host_subs):
            sub._offer(host_ids)

    def _deliver_hosts_all(self) -> None:
        for sub in list(self._host_subs):
            sub._offer_all()

    def _deliver_thinking(self, task_id: str, attempt: int, delta: str) -> None:
        for sub in list(self._subs):
            sub._offer_thinking(task_id, attempt, delta)

    def _deliver_queued(self) -> None:
        for cb in self.on_queued:
            cb()

    def _deliver_revoke(self, event: RevokeEvent) -> None:
        for cb in self.on_revoke:
            cb(event)

    def _remote(self, message: dict[str, Any]) -> None:
        if not self.store.is_postgres:
            return
        self._outbox.append(message)
        self._outbox_event.set()

    # ---- cross-replica ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start LISTEN and the NOTIFY flusher (PostgreSQL only)."""
        if not self.store.is_postgres:
            return
        self._tasks.append(asyncio.create_task(self._listen(), name="events-listen"))
        self._tasks.append(asyncio.create_task(self._flush_loop(), name="events-notify"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await self._listen_ready.wait()

    async def stop(self) -> None:
        """Stop background tasks (pending notifications are flushed first), then drop the
        listeners: nothing is delivered any more, and a listener's owner (the lease manager)
        holds this bus, so kept listeners held a stopped replica in a cycle that only the
        cycle collector freed, later, on whatever loop then ran."""
        if self._outbox:
            with contextlib.suppress(Exception):
                await self._flush()
        await supervised.stop(self._tasks)
        self._tasks.clear()
        for listeners in (
            self.on_queued,
            self.on_revoke,
            self.on_new_stream,
            self.on_revocations,
            self.on_holds,
        ):
            listeners.clear()

    def _payloads(self, messages: list[dict[str, Any]]) -> list[str]:
        """Group messages into NOTIFY payloads below the size limit (task and host ids merged)."""
        ids: list[str] = []
        host_ids: list[str] = []
        extended: list[Extension] = []
        others: list[dict[str, Any]] = []
        queued = False
        for m in messages:
            if m["k"] == "x":
                extended.extend(m["e"])
            elif m["k"] == "t":
                ids.extend(m["ids"])
            elif m["k"] == "h":
                host_ids.extend(m["ids"])
            elif m["k"] == "q":
                queued = True
            else:
                others.append(m)
        if queued:
            others.append({"k": "q"})
        chunks: list[dict[str, Any]] = []
        unique = list(dict.fromkeys(ids))
        step = 150  # 150 ids of 32 chars stay well below the payload limit
        for i in range(0, len(unique), step):
            chunks.append({"k": "t", "ids": unique[i : i + step]})
        unique_hosts = list(dict.fromkeys(host_ids))
        host_step = 40  # host ids may be up to 128 characters
        for i in range(0, len(unique_hosts), host_step):
            chunks.append({"k": "h", "ids": unique_hosts[i : i + host_step]})
        texts = [json.dumps(m, separators=(",", ":")) for m in chunks + others]
        texts += _extension_messages(extended)
        # Each message is rendered once; a payload is their texts joined (valid JSON as is).
        head = self._head
        out: list[str] = []
        batch: list[str] = []
        size = 0
        for text in texts:
            if batch and size + len(text) > _MAX_PAYLOAD:
                out.append(head + ",".join(batch) + "]}")
                batch, size = [], 0
            batch.append(text)
            size += len(text) + 1
        if batch:
            out.append(head + ",".join(batch) + "]}")
        return out

    async def _flush(self) -> None:
        """Send the outbox: one statement on the store's own connection (`Store.direct_notify`,
        autocommit: one round trip), or, when that cannot be used, through the pool. Through the
        pool each flush cost a checkout with its ping, a statement per payload and a COMMIT:
        5 % of a 10,000-host replica's CPU (bench/fleet_scale.py, issue 21)."""
        messages, self._outbox = self._outbox, []
        payloads = self._payloads(messages)
        if not payloads:
            return
        direct = self.store.direct_notify
        if direct is not None:
            sent = await direct.run(_NOTIFY_ALL, (CHANNEL, json.dumps(payloads)), resend=False)
            if sent is not None:
                return
        async with self.store.engine.connect() as conn:
            for payload in payloads:
                await conn.execute(select(func.pg_notify(CHANNEL, payload)))
            await conn.commit()

    async def _flush_loop(self) -> None:
        while True:
            await self._outbox_event.wait()
            self._outbox_event.clear()
            await asyncio.sleep(0.005)  # let a burst gather into one flush
            try:
                await self._flush()
            except Exception as exc:
                metrics.current().notify_failures.inc()
                errors.report(log, "NOTIFY failed; other replicas catch up on their tick", exc)

    async def _listen(self) -> None:
        import psycopg  # PostgreSQL only: a cloud on SQLite never loads it (`store.pg_driver`)

        url = make_url(self.store.engine.url).set(drivername="postgresql")
        dsn = url.render_as_string(hide_password=False)
        now = self.store.now
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._listen_ready.set()
                    # After a reconnect anything may have been missed: wake everyone once.
                    # Task watchers learn since when: a fleet watcher re-reads the tasks that
                    # ended in the gap too, not only those still active.
                    missed_since = (self._heard_at or now()) - GAP_MARGIN
                    self._heard_at = now()
                    self._deliver_queued()
                    self._deliver_hosts_all()
                    self._deliver_revocations()
                    for sub in list(self._subs):
                        sub._offer_missed(missed_since)
                    async for note in conn.notifies():
                        self._heard_at = now()
                        self._on_notify(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                metrics.current().listen_reconnects.inc()
                errors.report(log, "LISTEN connection lost; reconnecting", exc)
                await asyncio.sleep(1.0)

    def _on_notify(self, payload: str) -> None:
        # This replica's own payloads come back too; what they say was delivered here already.
        # Recognised by their first bytes, not parsed: on a busy replica they are most of what
        # LISTEN hears (every renewal write's extensions).
        if payload.startswith(self._head):
            return
        try:
            data = json.loads(payload)
        except ValueError:
            return
        if data.get("r") == self.replica_id:
            return
        for m in data.get("m", []):
            kind = m.get("k")
            if kind == "t":
                self._deliver_changed([str(i) for i in m.get("ids", [])])
            elif kind == "x":
                if self._subs:
                    self._deliver_extended(m.get("e", []))
            elif kind == "u":
                if self._subs:
                    self._deliver_spent_remote(m.get("e", []))
            elif kind == "h":
                self._deliver_hosts([str(i) for i in m.get("ids", [])])
            elif kind == "q":
                self._deliver_queued()
            elif kind == "s":
                for cb in self.on_new_stream:
                    cb(str(m["h"]), str(m["s"]))
            elif kind == "c":
                self._deliver_revocations()
            elif kind == "d":
                for wake in self.on_holds:
                    wake()
            elif kind == "th":
                self._deliver_thinking(str(m["t"]), int(m["a"]), str(m["x"]))
            elif kind == "v":
                self._deliver_revoke(
                    RevokeEvent(
                        str(m["h"]),
                        str(m["t"]),
                        int(m["a"]),
                        str(m["l"]),
                        int(m["why"]),
                        str(m.get("m", "")),
                        str(m.get("d", "")),
                        bool(m.get("e", False)),
                        str(m.get("s", "")),
                        _instant(m.get("x")),
                    )
                )
