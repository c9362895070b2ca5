"""Push dispatch: queued tasks go to idle phones of the hosts whose streams this replica holds.

A host gets work the moment it can take some (`kick`: a hello, a result, a freed phone), and a
pass over every local host runs whenever work is queued (the bus wakes it, on any replica) and
on a timer, which also corrects the busy hints from the store now and then.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable

from amc.v1 import types_pb2
from cloud import metrics
from cloud.events import EventBus
from cloud.lease import messages
from cloud.lease.session import HostSession
from cloud.provider_health import ProviderHealth
from cloud.store import leases
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
        #: Set (since, why) while the fleet's daily budget is spent: the same hosts get no new
        #: tasks until the next UTC day (their first step would be refused).
        self.budget_hold: Callable[[], tuple[dt.datetime, str] | None] | None = None
        bus.on_queued.append(self.wake.set)

    def paused_for(self, session: HostSession) -> bool:
        """Whether new tasks are held back from this host (it plans through this cloud, whose
        model provider is down)."""
        if session.planner_transport != types_pb2.PLANNER_TRANSPORT_CLOUD:
            return False
        if self.provider is not None and self.provider.pause is not None:
            return True
        return self.budget_hold is not None and self.budget_hold() is not None

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

    async def dispatch_host(self, session: HostSession) -> int:
        """Claim work for every idle phone of one host; returns how many tasks it got."""
        got = 0
        async with session.dispatch_lock:
            session.dispatch_pending = False
            if session.unsure_serials and not await self._send_unsure(session):
                return got
            while not session.closed:
                idle = session.idle_serials()
                if not idle or self.paused_for(session):
                    return got
                try:
                    claimed = await leases.claim(
                        self.store, session.host_id, idle, session.planner_transport
                    )
                except Exception:
                    # The commit may have happened even though the call failed (a database
                    # that went away mid-commit): look on these phones again next pass.
                    session.unsure_serials.update(idle)
                    log.exception("claim for %s failed", session.host_id)
                    return got
                if claimed is None:
                    return got
                got += 1
                if session.closed or self.sessions.get(session.host_id) is not session:
                    # The stream went away mid-claim; the lease will expire and the task requeue.
                    return got
                session.busy.add(claimed.device_serial)
                session.send(messages.assignment(claimed))
                if claimed.queued_since is not None:
                    waited = (self.store.now() - claimed.queued_since).total_seconds()
                    metrics.current().dispatch_latency.observe(max(0.0, waited))
                self.bus.tasks_changed([claimed.task_id])
        return got

    async def _send_unsure(self, session: HostSession) -> bool:
        """Send the leases that claims with an unknown outcome did create; False if the store is
        still unreachable (the phones stay unsure and the next pass tries again)."""
        try:
            found = await leases.live_attempts_on(
                self.store, session.host_id, session.unsure_serials
            )
        except Exception:
            log.exception("checking unsure claims for %s failed", session.host_id)
            return False
        session.unsure_serials.clear()
        for claimed in found:
            log.warning(
                "re-sending assignment %s/%d to %s: its claim failed after the commit",
                claimed.task_id, claimed.attempt, session.host_id,
            )  # fmt: skip
            session.busy.add(claimed.device_serial)
            session.send(messages.assignment(claimed))
            self.bus.tasks_changed([claimed.task_id])
        return True

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
        the periodic tick tries again.
        """
        for session in list(self.sessions.values()):
            if session.unsure_serials and not session.closed:
                async with session.dispatch_lock:
                    await self._send_unsure(session)
        if not any(s.idle_serials() for s in self.sessions.values()):
            return
        targets = await leases.queued_by_target_host(self.store)
        if not targets:
            return
        any_left = targets.get(None, 0)
        misses = 0
        for session in list(self.sessions.values()):
            if session.closed or not session.idle_serials() or self.paused_for(session):
                continue
            mine = targets.get(session.host_id, 0)
            if not mine and (any_left <= 0 or misses >= _MAX_DISPATCH_MISSES):
                continue
            got = await self.dispatch_host(session)
            if not mine:
                any_left -= got
                misses = 0 if got else misses + 1

    async def _resync_busy(self) -> None:
        """Correct the busy hints from the store (one query for all local hosts)."""
        busy = await leases.live_serials_by_host(self.store, list(self.sessions))
        for host_id, serials in busy.items():
            session = self.sessions.get(host_id)
            if session is not None:
                session.busy = serials
