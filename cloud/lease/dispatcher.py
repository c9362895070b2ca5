"""Push dispatch: queued tasks go to idle phones of the hosts whose streams this replica holds.

A host gets work the moment it can take some (`kick`: a hello, a result, a freed phone), and a
pass over every local host runs whenever work is queued (the bus wakes it, on any replica) and
on a timer, which also corrects the busy hints from the store now and then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud import metrics
from cloud.dispatch_holds import DispatchHolds
from cloud.events import EventBus
from cloud.flows.retrieval import Retriever
from cloud.lease import messages
from cloud.lease.session import HostSession
from cloud.provider_health import ProviderHealth
from cloud.secret_box import SecretBox, SecretUnreadable
from cloud.store import errors, holds, idlists, leases, states
from cloud.store.database import Store

log = logging.getLogger(__name__)

# A dispatch pass gives up on untargeted tasks after this many hosts in a row got none.
_MAX_DISPATCH_MISSES = 16
# Every this many passes, the busy hints are read again from the store.
_RESYNC_EVERY = 5


class Dispatcher:
    """Hands queued tasks to this replica's host sessions (the lease manager's `sessions`)."""

    def __init__(self, store: Store, bus: EventBus, sessions: dict[str, HostSession]) -> None:
        self.store = store
        self.bus = bus
        self.sessions = sessions
        #: Set when work may be waiting: the next pass starts at once.
        self.wake = asyncio.Event()
        self._kicks: set[asyncio.Task[int]] = set()
        self._passes = 0
        #: The model provider's state; while it is down, hosts on the cloud planner transport
        #: get no new tasks (their steps could not be planned), see cloud/provider_health.py.
        self.provider: ProviderHealth | None = None
        #: The holds every replica shares, read again at the start of each pass.
        self.holds: DispatchHolds | None = None
        #: Opens tasks' sealed secrets for their assignments (None: the cloud has no key).
        self.secrets: SecretBox | None = None
        #: Chooses the learned flows an assignment carries (None: flows are off).
        self.flows: Retriever | None = None
        #: Why today's fleet budget is spent, or None (the day's tally against this replica's
        #: cap, asked each round: no host gets a new task while it is spent).
        self.daily_spent: Callable[[], Awaitable[str | None]] | None = None
        #: The fleet's daily caps and today's tally as last read, for a direct-transport
        #: host's assignment (None: no cap).
        self.fleet_day: Callable[[], lease_pb.FleetDay | None] | None = None
        bus.on_queued.append(self.wake.set)

    def _assignment(
        self,
        session: HostSession,
        claimed: leases.Claimed,
        flows: Sequence[types_pb2.Flow] = (),
    ) -> lease_pb.LeaseResponse:
        """The Assignment for a claim, with the task's secrets opened for the lease holder and
        the learned flows chosen for it.

        A secret that cannot be opened (the key was changed or removed since the task was
        submitted) is left out and logged by name: the host then refuses to type it, and the
        step that needs it fails saying which secret is missing."""
        opened: dict[str, str] = {}
        for name, token in claimed.sealed_secrets.items():
            try:
                if self.secrets is None:
                    raise SecretUnreadable("no secrets key configured")
                opened[name] = self.secrets.open(token)
            except SecretUnreadable as exc:
                log.error("task %s: secret %r left out of its assignment: %s",
                          claimed.task_id, name, exc)  # fmt: skip
        response = messages.assignment(claimed, opened, flows)
        direct = session.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT
        day = self.fleet_day() if direct and self.fleet_day is not None else None
        if day is not None:  # the host checks it before each model call, as Decide does
            response.assignment.fleet_day.CopyFrom(day)
        return response

    def paused_for(self, session: HostSession) -> bool:
        """Whether the model provider's hold keeps new tasks from this host: it plans through
        this cloud, which cannot plan now. Only a host that says it calls the model itself is
        spared: one that leaves its transport unset (a host written from the proto, its field at
        the default) plans through Decide, and a task handed to it would fail at its first
        step."""
        if session.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT:
            return False
        return self.provider is not None and self.provider.pause is not None

    async def held_for(self, session: HostSession) -> bool:
        """Whether new tasks are held back from this host now: the provider's hold
        (`paused_for`), or the fleet's daily budget spent (every host)."""
        return self.paused_for(session) or await self._daily_spent()

    async def _daily_spent(self) -> bool:
        """Whether the fleet's daily budget is spent, asked before any host gets a task. A
        direct-transport host never asks Decide (its shipped spending counts all the same), and
        a cloud-transport host's task would fail at its first step. Asked each round rather
        than latched: the hold ends with the day, or with a replica started with a higher cap."""
        if self.daily_spent is None:
            return False
        try:
            return await self.daily_spent() is not None
        except Exception as exc:
            errors.report(log, "the fleet's daily budget could not be read", exc)
            return True  # no task this pass: the next one asks again

    def kick(self, session: HostSession) -> None:
        """Look for work for one host soon (coalesced: at most one pending pass per host)."""
        if session.dispatch_pending or session.closed:
            return
        session.dispatch_pending = True
        task = asyncio.create_task(self.dispatch_host(session))
        self._kicks.add(task)
        task.add_done_callback(self._kicks.discard)

    def pending(self) -> list[asyncio.Task[int]]:
        """The per-host passes still running (cancelled with the replica's jobs)."""
        return list(self._kicks)

    def _unless_held(self, session: HostSession) -> tuple[str, ...]:
        """The shared holds each claim for this host reads again in its own transaction: on
        PostgreSQL another replica may have set one since this replica last read them (at
        the start of its pass, which may have run over many hosts since, or before this host's
        first claim), and its announcement may not have arrived. A lone SQLite replica wrote
        every row itself: none. A replica planning offline names the provider's holds only
        while it last saw a replica that calls the provider alive."""
        if self.holds is None or not self.store.is_postgres:
            return ()
        if session.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT:
            return ()
        if self.holds.provider_free and not self.holds.provider_replicas_alive:
            return ()
        return holds.PROVIDER

    # A session is registered before its hello's batch settles the leases the
    # hello re-announces. A pass in that window saw a host with no busy phone and claimed the
    # next attempt of a lapsed task it was about to resume (for the very same phone): the
    # hello's attempt was then superseded. Such a session gets nothing until `open()` has
    # settled the hello's leases (`HostSession.settled`: after a restarted process's release
    # and resume too), and `open()` kicks it then.

    async def dispatch_host(self, session: HostSession, *, holds_read: bool = False) -> int:
        """Claim work for every idle phone of one host; returns how many tasks it got.

        The shared holds are read before the first claim (unless the caller's pass just read
        them): a hold another replica set a moment ago may not have been announced here yet.
        And each claim reads them again in its own transaction (`_unless_held`): one committed
        since (during this host's claims, or the pass's) holds the next claim."""
        got = 0
        async with session.dispatch_lock:
            session.dispatch_pending = False
            if not session.settled:  # its hello not settled: `open()` kicks it once it is
                return got
            if session.unsure_serials and not await self._send_unsure(session):
                return got
            while not session.closed:
                idle = session.idle_serials()
                if idle and not holds_read and self.holds is not None:
                    try:
                        await self.holds.refresh()
                    except Exception as exc:  # no task this time: the next pass reads again
                        errors.report(log, "reading the dispatch holds failed", exc)
                        return got
                    holds_read = True
                if not idle or session.unheard() or await self.held_for(session):
                    return got
                try:
                    settle = None if self.flows is None else await self.flows.settle()
                    claimed = await leases.claim(
                        self.store,
                        session.host_id,
                        idle,
                        session.planner_transport,
                        settle,
                        self._unless_held(session),
                    )
                except Exception as exc:
                    # The commit may have happened even though the call failed (a database
                    # that went away mid-commit): look on these phones again next pass.
                    session.unsure_serials.update(idle)
                    errors.report(log, "claim for %s failed", exc, session.host_id)
                    return got
                if claimed is None:
                    return got
                got += 1
                held = leases.HeldLease(claimed.task_id, claimed.attempt, claimed.lease_id)
                flows = [] if session.closed else await self._flows_for(claimed)
                if session.closed or self.sessions.get(session.host_id) is not session:
                    # The stream went away mid-claim (or while the flows were chosen): nobody
                    # got the assignment, so nobody will run it. Handed back now, without
                    # using an attempt, rather than when its lease runs out. Nothing below
                    # awaits before the send, so a stream open here gets the assignment.
                    await self._release_unsent(session, held)
                    return got
                session.mark_busy(claimed.device_serial)
                session.granted.add(held)
                session.handed_flows[(claimed.task_id, claimed.attempt)] = tuple(
                    f.flow_id for f in flows
                )
                session.send(self._assignment(session, claimed, flows))
                if claimed.queued_since is not None:
                    waited = (self.store.now() - claimed.queued_since).total_seconds()
                    metrics.current().dispatch_latency.observe(max(0.0, waited))
                self.bus.tasks_changed([claimed.task_id])
                self.bus.hosts_changed([session.host_id])  # a phone of it is busy now
        return got

    async def _flows_for(self, claimed: leases.Claimed) -> list[types_pb2.Flow]:
        """The learned flows for a fresh attempt (recorded on it); none when retrieval fails:
        the task then runs with the model, which is never worse than a wrong replay. A
        database failure is logged without the driver's text (`errors.report`)."""
        if self.flows is None or claimed.choice_recorded:
            return []
        try:
            return await self.flows.for_new_attempt(
                claimed.task_id, claimed.attempt, claimed.goal, no_replay=claimed.no_replay
            )
        except Exception as exc:
            errors.report(
                log, "flow retrieval for %s/%d failed", exc, claimed.task_id, claimed.attempt
            )
            return []

    async def _send_unsure(self, session: HostSession) -> bool:
        """Send the leases that claims with an unknown outcome did create; False if the store is
        still unreachable (the phones stay unsure and the next pass tries again). One whose
        stream went away meanwhile (ended, or replaced by a newer stream of the host) is
        handed back unused, as in `dispatch_host`: its send was dropped, and left to its lease
        the task stayed ASSIGNED to work no host received, then that attempt counted."""
        try:
            found = await leases.live_attempts_on(
                self.store, session.host_id, session.unsure_serials
            )
        except Exception as exc:
            errors.report(log, "checking unsure claims for %s failed", exc, session.host_id)
            return False
        session.unsure_serials.clear()
        for claimed in found:
            held = leases.HeldLease(claimed.task_id, claimed.attempt, claimed.lease_id)
            handed: list[types_pb2.Flow] = []
            if self.flows is not None and not session.closed:
                try:
                    handed = await self.flows.handed(claimed.task_id, claimed.attempt, claimed.goal)
                except Exception as exc:
                    errors.report(log, "reading the flows of %s failed", exc, claimed.task_id)
            if session.closed or self.sessions.get(session.host_id) is not session:
                await self._release_unsent(session, held)  # nothing awaits from here to the send
                continue
            log.warning(
                "re-sending assignment %s/%d to %s: its claim failed after the commit",
                claimed.task_id, claimed.attempt, session.host_id,
            )  # fmt: skip
            session.mark_busy(claimed.device_serial)
            session.granted.add(held)
            session.send(self._assignment(session, claimed, handed))
            self.bus.tasks_changed([claimed.task_id])
        return True

    async def _release_unsent(self, session: HostSession, held: leases.HeldLease) -> None:
        """Hand back an assignment `session` never sent, unused. The host's stream now, if a
        newer one took `session`'s place, read the phone busy at its hello (the lease was live
        then): it may have the phone again at once, not only after the next busy resync."""
        try:
            ended = await leases.release(
                self.store, session.host_id, states.STREAM_LOST, only={held}
            )
        except Exception as exc:  # it runs out and is requeued by the sweeper instead
            errors.report(log, "releasing an unsent assignment of %s failed", exc, session.host_id)
            return
        if ended:
            current = self.sessions.get(session.host_id)
            if current is not None:
                current.mark_free(e.device_serial for e in ended)
            self.bus.tasks_changed([held.task_id])
            self.bus.tasks_queued()

    async def tick(self) -> None:
        """One round of the dispatch loop: now and then a busy resync, then a pass."""
        self._passes += 1
        if self._passes % _RESYNC_EVERY == 0:
            await self._resync_busy()
        await self.dispatch_pass()

    async def dispatch_pass(self) -> None:
        """Offer queued tasks to this replica's hosts with idle phones.

        Hosts that have tasks targeted at them are always tried. For untargeted tasks the pass
        stops after a run of hosts that got nothing (what is left needs a phone nobody here has);
        the periodic tick tries again. The shared holds are read first: a task queued after
        another replica held dispatch back (the queueing wakes this pass) is not handed out.
        A host whose hello is not settled yet is passed over (see `dispatch_host`).
        """
        for session in list(self.sessions.values()):
            if session.unsure_serials and session.settled and not session.closed:
                async with session.dispatch_lock:
                    await self._send_unsure(session)
        idle = [s for s in self.sessions.values() if s.settled and s.has_idle()]
        if not idle:
            return
        waiting = await leases.waiting(self.store, cap=sum(len(s.devices) for s in idle))
        if not waiting.any_host and not waiting.hosts:
            return
        if self.holds is not None:
            await self.holds.refresh()
        if await self._daily_spent():
            return
        any_left = waiting.any_host
        misses = 0
        for session in idle:
            if (
                session.closed
                or not session.has_idle()
                or session.unheard()
                or self.paused_for(session)
            ):
                continue
            mine = session.host_id in waiting.hosts
            if not mine and (any_left <= 0 or misses >= _MAX_DISPATCH_MISSES):
                continue
            got = await self.dispatch_host(session, holds_read=self.holds is not None)
            if not mine:
                any_left -= got
                misses = 0 if got else misses + 1

    async def _resync_busy(self) -> None:
        """Correct the busy hints from the store (one query per `idlists.CHUNK` local hosts)."""
        for chunk in idlists.chunked(list(self.sessions)):
            before = {h: (s, s.busy_changes) for h in chunk if (s := self.sessions.get(h))}
            busy = await leases.live_serials_by_host(self.store, chunk)
            for host_id, serials in busy.items():
                session, changes = before.get(host_id, (None, -1))
                if (
                    session is not None
                    and self.sessions.get(host_id) is session
                    and session.busy_changes == changes
                ):
                    session.busy = serials
