"""The replica's lease engine: sessions, push dispatch, renewals, results, sweeps and revocations.

Everything here runs on the event loop: no thread per stream. State that must survive a replica
(or be shared by replicas) is in the store; the sessions map only says which host streams this
replica holds, so it can push assignments and revocations down them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable

import grpc
from sqlalchemy import select

from amc.v1 import lease_service_pb2 as lease_pb
from cloud.events import EventBus, RevokeEvent
from cloud.lease.batcher import RenewalBatcher
from cloud.lease.session import HostSession
from cloud.settings import CloudSettings
from cloud.store import convert, hosts, leases, states
from cloud.store.database import Store
from cloud.store.models import AttemptRow

log = logging.getLogger(__name__)

# A dispatch pass gives up on untargeted tasks after this many hosts in a row got none.
_MAX_DISPATCH_MISSES = 16


def _revoked(
    task_id: str, attempt: int, lease_id: str, reason: int, message: str
) -> lease_pb.LeaseResponse:
    return lease_pb.LeaseResponse(
        revoked=lease_pb.Revoked(
            task_id=task_id,
            attempt=attempt,
            lease_id=lease_id,
            reason=reason,  # type: ignore[arg-type]
            message=message,
        )
    )


class LeaseManager:
    """Owns this replica's host sessions and the background jobs of the lease protocol."""

    def __init__(self, store: Store, bus: EventBus, settings: CloudSettings) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.sessions: dict[str, HostSession] = {}
        self.batcher = RenewalBatcher(
            store, bus, settings.renewal_batch_window_seconds, settings.renewal_batch_max
        )
        self._dispatch_wake = asyncio.Event()
        self._sweep_wake = asyncio.Event()
        self._jobs: list[asyncio.Task[None]] = []
        self._kicks: set[asyncio.Task[int]] = set()
        self._closings: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._open_streams = 0
        self._streams_idle = asyncio.Event()
        self._streams_idle.set()
        # Hosts recorded as connected whose replica stopped vouching for them, as last seen by
        # this replica (None until the first look): fleet watchers hear when the set changes.
        self._unvouched: set[str] | None = None
        bus.on_queued.append(self._dispatch_wake.set)
        bus.on_revoke.append(self._on_revoke)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the batcher, dispatcher, sweeper and heartbeat."""
        self.batcher.start()
        self._jobs = [
            asyncio.create_task(self._dispatch_loop(), name="dispatch"),
            asyncio.create_task(self._sweep_loop(), name="sweep"),
            asyncio.create_task(self._heartbeat_loop(), name="host-heartbeat"),
        ]
        self._dispatch_wake.set()

    def close_all(self, code: grpc.StatusCode, message: str) -> None:
        """End every host stream (shutdown): hosts reconnect to another replica."""
        self._stopping = True
        for session in list(self.sessions.values()):
            session.close(code, message)

    def stream_started(self) -> None:
        """A Lease handler began (counted so shutdown can wait for handlers to finish)."""
        self._open_streams += 1
        self._streams_idle.clear()

    def stream_finished(self) -> None:
        """A Lease handler ended."""
        self._open_streams -= 1
        if self._open_streams <= 0:
            self._streams_idle.set()

    async def wait_streams_closed(self, within: float) -> None:
        """Wait (bounded) until every Lease handler of this replica has returned."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._streams_idle.wait(), within)

    async def stop(self) -> None:
        """Stop the background jobs."""
        for job in [*self._jobs, *self._kicks]:
            job.cancel()
        for job in [*self._jobs, *self._kicks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
        self._jobs.clear()
        await self.batcher.stop()
        if self._closings:  # stream ends still being recorded
            await asyncio.gather(*self._closings, return_exceptions=True)
        with contextlib.suppress(Exception):
            self.bus.hosts_changed(await hosts.replica_gone(self.store, self.bus.replica_id))

    async def _forever(
        self, name: str, interval: float, step: Callable[[], Awaitable[None]]
    ) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; retrying", name)
            await asyncio.sleep(interval)

    # ---- sessions -----------------------------------------------------------------------------

    async def open(self, host_id: str, hello: lease_pb.HostHello) -> HostSession:
        """Register the stream, answer Welcome, settle held assignments, then dispatch."""
        session = HostSession(host_id=host_id, planner_transport=int(hello.planner_transport))
        session.set_devices(list(hello.devices))
        # Welcome first, before anything can await: once the session is registered below, the
        # sweeper or a dispatcher may queue a revoke or an assignment on it, and the contract
        # promises the host a Welcome before anything else.
        session.send(
            lease_pb.LeaseResponse(
                welcome=lease_pb.Welcome(
                    host_id=host_id,
                    renew_interval=convert.renew_interval(self.settings.default_lease_seconds),
                )
            )
        )
        old = self.sessions.get(host_id)
        self.sessions[host_id] = session
        if old is not None:
            old.close(grpc.StatusCode.ABORTED, "replaced by a newer stream of this host")
        await hosts.upsert_hello(
            self.store,
            host_id,
            convert.device_dicts(list(hello.devices)),
            hello.agent_version,
            int(hello.planner_transport),
            self.bus.replica_id,
            session.stream_id,
        )
        self.bus.hosts_changed([host_id])
        for check in await leases.check_held(self.store, host_id, list(hello.held_assignments)):
            h = check.held
            if check.live is not None and check.task is not None:
                session.send(await self._resumed(check.live, check.task.goal, check))
            else:
                session.send(
                    _revoked(h.task_id, h.attempt, h.lease_id, check.revoke_reason, check.message)
                )
        # A live lease the host did not re-announce is left to run out rather than ended here:
        # the host may have finished that attempt while disconnected, and its result follows the
        # hello (held assignments list only what still runs).
        session.busy = await leases.live_serials(self.store, host_id)
        self.kick(session)
        return session

    async def _resumed(
        self, live: AttemptRow, goal: str, check: leases.HeldCheck
    ) -> lease_pb.LeaseResponse:
        task = check.task
        assert task is not None
        assignment = lease_pb.Assignment(
            task_id=live.task_id,
            attempt=live.attempt,
            lease_id=live.lease_id,
            device_serial=live.device_serial,
            goal=goal,
            lease_expires_at=convert.ts(live.lease_expires_at),
            lease_duration=convert.duration(task.lease_seconds),
            deadline=convert.ts(task.deadline),
            resumed=True,
            renew_interval=convert.renew_interval(task.lease_seconds),
        )
        async with self.store.read() as session:
            last = await session.scalar(
                select(AttemptRow)
                .where(
                    AttemptRow.task_id == live.task_id,
                    AttemptRow.progress_updated_at.is_not(None),
                )
                .order_by(AttemptRow.attempt.desc())
                .limit(1)
            )
        p = convert.progress(last)
        if p is not None:
            assignment.last_progress.CopyFrom(p)
        return lease_pb.LeaseResponse(assignment=assignment)

    async def closed(self, session: HostSession) -> None:
        """The stream ended. Leases stay until they expire: the host may resume them elsewhere."""
        if self.sessions.get(session.host_id) is session:
            del self.sessions[session.host_id]
        session.closed = True
        if self._stopping:
            return  # stop() marks all of this replica's hosts disconnected in one statement
        # Shielded: when the host cancels its call, grpc cancels the handler again while this
        # runs in its `finally`, and an unrecorded end would leave the host "connected" (this
        # replica's heartbeat keeps vouching for rows it holds) long after it left.
        mark = asyncio.create_task(self._mark_disconnected(session))
        self._closings.add(mark)
        mark.add_done_callback(self._closings.discard)
        await asyncio.shield(mark)

    async def _mark_disconnected(self, session: HostSession) -> None:
        with contextlib.suppress(Exception):
            if await hosts.disconnected(self.store, session.host_id, session.stream_id):
                self.bus.hosts_changed([session.host_id])

    async def device_update(self, session: HostSession, update: lease_pb.DeviceUpdate) -> None:
        """New phone list; newly idle phones may get work."""
        session.set_devices(list(update.devices))
        await hosts.update_devices(
            self.store, session.host_id, convert.device_dicts(list(update.devices))
        )
        self.bus.hosts_changed([session.host_id])
        self.kick(session)

    # ---- renewals and results -----------------------------------------------------------------

    async def renew(
        self, session: HostSession, msg: lease_pb.LeaseRenewal
    ) -> lease_pb.LeaseResponse:
        """Fenced renewal with progress (written in the next batch)."""
        progress = leases.ProgressIn.from_proto(msg.progress) if msg.HasField("progress") else None
        out = await self.batcher.renew(
            leases.RenewalIn(session.host_id, msg.task_id, msg.attempt, msg.lease_id, progress)
        )
        if out.expires_at is not None:
            return lease_pb.LeaseResponse(
                renewed=lease_pb.Renewed(
                    task_id=msg.task_id,
                    attempt=msg.attempt,
                    lease_id=msg.lease_id,
                    lease_expires_at=convert.ts(out.expires_at),
                )
            )
        return _revoked(msg.task_id, msg.attempt, msg.lease_id, out.revoke_reason, out.message)

    async def result(
        self, session: HostSession, msg: lease_pb.TaskResult
    ) -> lease_pb.LeaseResponse:
        """Fenced, idempotent result."""
        final = (
            leases.ProgressIn.from_proto(msg.final_progress)
            if msg.HasField("final_progress")
            else None
        )
        out = await leases.record_result(
            self.store,
            session.host_id,
            msg.task_id,
            msg.attempt,
            msg.lease_id,
            states.from_proto(msg.status),
            msg.summary,
            final,
        )
        if out.recorded or out.duplicate:
            if out.recorded:
                session.busy.discard(out.device_serial)
                self.bus.tasks_changed([msg.task_id])
                self.kick(session)
            return lease_pb.LeaseResponse(
                result_ack=lease_pb.ResultAck(
                    task_id=msg.task_id,
                    attempt=msg.attempt,
                    lease_id=msg.lease_id,
                    task_status=states.to_proto(out.task_status),
                    duplicate=out.duplicate,
                )
            )
        return _revoked(msg.task_id, msg.attempt, msg.lease_id, out.revoke_reason, out.message)

    # ---- dispatch -----------------------------------------------------------------------------

    def kick(self, session: HostSession) -> None:
        """Look for work for one host soon (coalesced: at most one pending pass per host)."""
        if session.dispatch_pending or session.closed:
            return
        session.dispatch_pending = True
        task = asyncio.create_task(self._dispatch_host(session))
        self._kicks.add(task)
        task.add_done_callback(self._kicks.discard)

    async def _dispatch_host(self, session: HostSession) -> int:
        """Claim work for every idle phone of one host; returns how many tasks it got."""
        got = 0
        async with session.dispatch_lock:
            session.dispatch_pending = False
            if session.unsure_serials and not await self._send_unsure(session):
                return got
            while not session.closed:
                idle = session.idle_serials()
                if not idle:
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
                session.send(self._assignment(claimed))
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
            session.send(self._assignment(claimed))
            self.bus.tasks_changed([claimed.task_id])
        return True

    def _assignment(self, c: leases.Claimed) -> lease_pb.LeaseResponse:
        a = lease_pb.Assignment(
            task_id=c.task_id,
            attempt=c.attempt,
            lease_id=c.lease_id,
            device_serial=c.device_serial,
            goal=c.goal,
            lease_expires_at=convert.ts(c.lease_expires_at),
            lease_duration=convert.duration(c.lease_seconds),
            deadline=convert.ts(c.deadline),
            resumed=False,
            renew_interval=convert.renew_interval(c.lease_seconds),
        )
        p = convert.progress(c.last_progress)
        if p is not None:
            a.last_progress.CopyFrom(p)
        return lease_pb.LeaseResponse(assignment=a)

    async def _dispatch_loop(self) -> None:
        ticks = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._dispatch_wake.wait(), self.settings.dispatch_interval_seconds
                )
            self._dispatch_wake.clear()
            ticks += 1
            try:
                if ticks % 5 == 0:
                    await self._resync_busy()
                await self._dispatch_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch pass failed")

    async def _dispatch_pass(self) -> None:
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
            if session.closed or not session.idle_serials():
                continue
            mine = targets.get(session.host_id, 0)
            if not mine and (any_left <= 0 or misses >= _MAX_DISPATCH_MISSES):
                continue
            got = await self._dispatch_host(session)
            if not mine:
                any_left -= got
                misses = 0 if got else misses + 1

    async def _resync_busy(self) -> None:
        """Correct the busy hints from the store (one query for all local hosts)."""
        local = list(self.sessions)
        if not local:
            return
        async with self.store.read() as db:
            rows = (
                await db.execute(
                    select(AttemptRow.host_id, AttemptRow.device_serial).where(
                        AttemptRow.host_id.in_(local), AttemptRow.ended_at.is_(None)
                    )
                )
            ).all()
        busy: dict[str, set[str]] = {h: set() for h in local}
        for host_id, serial in rows:
            busy[host_id].add(serial)
        for host_id, serials in busy.items():
            session = self.sessions.get(host_id)
            if session is not None:
                session.busy = serials

    # ---- revocations and sweeps -----------------------------------------------------------------

    def _on_revoke(self, event: RevokeEvent) -> None:
        session = self.sessions.get(event.host_id)
        if session is None:
            return
        session.send(
            _revoked(event.task_id, event.attempt, event.lease_id, event.reason, event.message)
        )
        if event.ended and event.device_serial:
            session.busy.discard(event.device_serial)
            self.kick(session)

    async def sweep_once(self) -> int:
        """End expired leases and passed deadlines; returns how many attempts/tasks it ended."""
        ended = await leases.sweep_expired(self.store) + await leases.sweep_deadlines(self.store)
        if not ended:
            return 0
        requeued = False
        for e in ended:
            if e.host_id:
                self.bus.revoke(
                    RevokeEvent(
                        e.host_id,
                        e.task_id,
                        e.attempt,
                        e.lease_id,
                        e.reason,
                        "lease expired"
                        if e.reason == lease_pb.REVOKE_REASON_EXPIRED
                        else states.DEADLINE_EXCEEDED
                        if e.reason == lease_pb.REVOKE_REASON_DEADLINE_EXCEEDED
                        else "cancelled",
                        e.device_serial,
                        ended=True,
                    )
                )
            requeued = requeued or e.task_status == states.QUEUED
        self.bus.tasks_changed(sorted({e.task_id for e in ended}))
        if requeued:
            self.bus.tasks_queued()
        return len(ended)

    async def _sweep_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._sweep_wake.wait(), self.settings.sweep_interval_seconds
                )
            self._sweep_wake.clear()
            try:
                while await self.sweep_once() >= 500:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep failed")

    async def _heartbeat_loop(self) -> None:
        async def beat() -> None:
            seen = {h: s.last_seen for h, s in self.sessions.items()}
            await hosts.heartbeat(self.store, self.bus.replica_id, seen)
            await self.check_unvouched()

        await self._forever("host heartbeat", self.settings.host_heartbeat_seconds, beat)

    async def check_unvouched(self) -> None:
        """Tell this replica's fleet watchers about hosts that stopped (or started again) counting
        as connected because their replica's heartbeat stopped (or resumed): no row changes
        then, so nothing else would publish it. Every replica looks for itself and tells only
        its own watchers."""
        now = await hosts.unvouched(self.store, self.settings.host_heartbeat_seconds)
        before, self._unvouched = self._unvouched, now
        if before is not None:
            self.bus.hosts_changed(sorted(now ^ before), local_only=True)

    def touch(self, session: HostSession) -> None:
        """The host sent something."""
        session.last_seen = dt.datetime.now(dt.UTC)
