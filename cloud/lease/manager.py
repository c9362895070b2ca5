"""The replica's lease engine: host sessions, renewals, results, revocations and its jobs.

Everything here runs on the event loop: no thread per stream. State that must survive a replica
(or be shared by replicas) is in the store; the sessions map only says which host streams this
replica holds, so it can push assignments and revocations down them. Dispatch
(`dispatcher.py`) and the expiry sweeps (`sweeper.py`) work on the same sessions; the three
background loops (dispatch, sweep, host heartbeat) run under `cloud.supervised`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud import metrics, revocations, supervised
from cloud.events import EventBus, RevokeEvent
from cloud.identity import Caller
from cloud.lease import messages, validate, write_watch
from cloud.lease.batcher import RenewalBatcher
from cloud.lease.clock import TICK_S, ClockWatch
from cloud.lease.dispatcher import Dispatcher
from cloud.lease.held_rows import PhoneLists, held_then_retried
from cloud.lease.hellos import HelloBatcher
from cloud.lease.session import Closing, HostSession
from cloud.lease.sweeper import Sweeper
from cloud.lease.write_watch import WriteWatch
from cloud.secret_box import SecretBox
from cloud.settings import CloudSettings
from cloud.store import convert, errors, flows, hosts, idlists, lease_events, leases, states
from cloud.store.database import Store
from cloud.store.lock_waits import SWEEP_LOCK_TIMEOUT_MS, RowHeld, lock_timed_out
from cloud.store.revocations import Revoked

log = logging.getLogger(__name__)

#: Seconds a stopping replica gives the stream ends and holds still being recorded (its
#: background writes of host rows) before it cancels them: such a write waited for a host row
#: another transaction held (an operator's `SELECT ... FOR UPDATE` left open in psql) as long
#: as it was held, and the stop with it. The replica's own goodbye (`hosts.replica_gone`)
#: marks its hosts disconnected next.
CLOSINGS_AT_STOP_S = 2.0


#: How often (in beats) a replica looks for the rows of replicas long dead to delete.
FORGET_EVERY_BEATS = 10


def _held(
    hello: lease_pb.HostHello,
) -> tuple[list[leases.HeldLease], list[tuple[lease_pb.HeldAssignment, str]]]:
    """The hello's held assignments to settle (a lease listed twice, once), and those that
    cannot name a lease, with why: each of those is answered on its own (Revoked, UNKNOWN),
    and the hello and the other held leases go on."""
    held: dict[leases.HeldLease, None] = {}
    unusable: list[tuple[lease_pb.HeldAssignment, str]] = []
    for i, h in enumerate(hello.held_assignments):
        problem = validate.held(i, h)
        if problem:
            unusable.append((h, problem))
        else:
            held[leases.HeldLease(h.task_id, h.attempt, h.lease_id)] = None
    return list(held), unusable


class LeaseManager:
    """Owns this replica's host sessions and the background jobs of the lease protocol."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        settings: CloudSettings,
        secrets: SecretBox | None = None,
        others_alive: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.sessions: dict[str, HostSession] = {}
        self.clock = ClockWatch(store, others_alive or _alone, settings.clock_gap_seconds)
        self.batcher = RenewalBatcher(
            store,
            bus,
            settings.renewal_batch_window_seconds,
            settings.renewal_batch_max,
            settings.renewal_write_below,
            clock=self.clock,
        )
        self.hellos = HelloBatcher(store, settings.renewal_batch_window_seconds, clock=self.clock)
        self.dispatcher = Dispatcher(store, bus, self.sessions)
        self.dispatcher.secrets = secrets
        self.sweeper = Sweeper(store, bus, self.clock, interval=settings.sweep_interval_seconds)
        #: Ends the writes to host streams pending past `lease_write_timeout_seconds`.
        self.write_watch = WriteWatch(settings.lease_write_timeout_seconds)
        #: Called when an attempt ended with a result (the flow-learning loop wakes up).
        self.on_ended: list[Callable[[], None]] = []
        #: The fleet's daily caps and today's tally, for a direct-transport host's renewals
        #: (None: no cap; the host then checks only its task's caps).
        self.fleet_day: Callable[[], Awaitable[lease_pb.FleetDay | None]] | None = None
        self._jobs: list[asyncio.Task[None]] = []
        self._closings: set[asyncio.Task[None]] = set()
        #: Phone lists whose host row was held elsewhere, written in the background.
        self.phone_lists = PhoneLists(store, lambda h: bus.hosts_changed([h]), self._spawn)
        self._stopping = False
        #: Why this replica's host streams were ended (`close_all` at its stop): a hello that
        #: comes after is refused with it (`cloud.lease.stream`), so the host reconnects to
        #: another replica at once rather than be welcomed, handed work, and cut off when the
        #: stop's grace runs out.
        self.refusing: Closing | None = None
        self._open_streams = 0
        self._streams_idle = asyncio.Event()
        self._streams_idle.set()
        # Hosts recorded as connected whose replica stopped vouching for them, as last seen by
        # this replica (None until the first look): fleet watchers hear when the set changes.
        self._unvouched: set[str] | None = None
        # Beats since this replica last looked for long-dead replicas' rows (`_beat`).
        self._beats_since_forget = 0
        # Holds on new work (`HostSession.lapsed`) written to the store for the fleet view, with
        # when each ends by itself: the heartbeat tells fleet watchers when one has.
        self._holds_shown: dict[HostSession, dt.datetime] = {}
        # The latest write of each host's hold (or its end) still going on, by number
        # (`_want_hold_row`): an older one still retrying is dropped.
        #: The latest wanted write of each host's hold row: (its number, whether a hold).
        self._hold_writes: dict[HostSession, tuple[int, bool]] = {}
        self._hold_write_count = 0
        # Refusals (host, task, attempt, reason) whose history row waits in the background for
        # its task row held elsewhere: the same refusal again joins it (`_record_revoked`).
        self._revocations_waiting: set[tuple[str, str, int, str]] = set()
        bus.on_revoke.append(self._on_revoke)
        bus.on_new_stream.append(self._on_new_stream)

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the batcher, dispatcher, sweeper and heartbeat."""
        s = self.settings
        self.clock.reset()
        self.batcher.start()
        self.hellos.start()
        self._jobs = [
            supervised.start("clock", self.clock.tick, interval=TICK_S),
            supervised.start(
                "dispatch",
                self.dispatcher.tick,
                interval=s.dispatch_interval_seconds,
                wake=self.dispatcher.wake,
                pause_first=True,
            ),
            supervised.start(
                "sweep", self.sweeper.sweep, interval=s.sweep_interval_seconds, pause_first=True
            ),
            supervised.start("host-heartbeat", self._beat, interval=s.host_heartbeat_seconds),
            supervised.start(
                "write-watch",
                self.write_watch.look,
                interval=write_watch.period(s.lease_write_timeout_seconds),
            ),
        ]
        self.dispatcher.wake.set()

    def close_all(self, code: grpc.StatusCode, message: str, *, refuse_new: bool = False) -> None:
        """End every host stream (shutdown): hosts reconnect to another replica. `refuse_new`
        (the replica's stop): a hello that comes after is refused the same way (`refusing`)."""
        self._stopping = True
        if refuse_new:
            self.refusing = Closing(code, message)
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
            async with asyncio.timeout(within):
                await self._streams_idle.wait()

    async def stop(self) -> None:
        """Stop the background jobs."""
        await supervised.stop([*self._jobs, *self.dispatcher.pending()])
        self._jobs.clear()
        await self.batcher.stop()
        await self.hellos.stop()
        await self.clock.stop()  # a new term the stopped jobs left under way
        # Stream ends and holds still being recorded, for a bounded time.
        await supervised.finish(list(self._closings), CLOSINGS_AT_STOP_S)
        # And what those started meanwhile: a held row's write retried in the background
        # (`_mark_later`); the goodbye below marks this replica's hosts.
        await supervised.stop(list(self._closings))
        with contextlib.suppress(Exception):
            self.bus.hosts_changed(await hosts.replica_gone(self.store, self.bus.replica_id))

    # ---- sessions -----------------------------------------------------------------------------

    async def open(
        self, host_id: str, hello: lease_pb.HostHello, serial: str | None = None
    ) -> HostSession:
        """Register the stream, answer Welcome, settle held assignments, then dispatch.

        One live stream per host: the newer wins. A new process (another `process_id` than the
        hello before it) releases the previous process's leases it does not hold at once and
        supersedes that process's stream; a reconnect of the same process keeps its leases (it
        may have finished one while disconnected: its result follows the hello).
        """
        session = HostSession(
            host_id=host_id,
            planner_transport=messages.transport_in(hello),
            process_id=hello.process_id,
            serial=serial,
        )
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
        # Attempts that start from here on are this session's: a new process's hello releases
        # only what started before it (a release racing a claim for this session spares it).
        hello_at = self.store.now()
        held, unusable = _held(hello)
        old = self.sessions.get(host_id)
        self.sessions[host_id] = session
        # Assignments the superseded stream never handed to gRPC: released unused, so the
        # hello's release of what started before it must spare them (`_replace`).
        unsent = self._replace(old, session.process_id, keep=held) if old is not None else set()
        record = hosts.HelloRecord(
            convert.device_dicts(list(hello.devices)),
            hello.agent_version[: convert.AGENT_VERSION_LIMIT],
            messages.transport_in(hello),
            self.bus.replica_id,
            session.stream_id,
            hello.process_id,
            [(h.task_id, h.attempt, h.lease_id) for h in held],
        )
        pending = self.hellos.submit(leases.HelloIn(host_id, record, held))
        try:
            settled = await asyncio.shield(pending)
        except BaseException:
            # The handler ends with the failure's status; nothing may be sent to this session.
            session.closed = True
            if self.sessions.get(host_id) is session:
                del self.sessions[host_id]
            if not pending.done():  # cancelled: its batch may still record this stream
                self._spawn(self._forget_hello(session, pending))
            raise
        session.recorded = True
        try:
            return await self._settle(
                session, hello, settled, held, unusable, hello_at, spare=unsent
            )
        except BaseException:
            # Failed or cancelled after the hello was recorded: a session left registered
            # looked live, took assignments nobody read and was vouched for until the replica
            # stopped (a restart's failure has ended it already, `_unrecord`).
            if not session.closed:
                session.closed = True
                if self.sessions.get(host_id) is session:
                    del self.sessions[host_id]
                self._spawn(self._record_end(session))
            raise

    async def _settle(
        self,
        session: HostSession,
        hello: lease_pb.HostHello,
        settled: leases.Settled,
        held: list[leases.HeldLease],
        unusable: list[tuple[lease_pb.HeldAssignment, str]],
        hello_at: dt.datetime,
        spare: set[leases.HeldLease] | None = None,
    ) -> HostSession:
        """The rest of `open()` once the hello is recorded: its outbox report, a restarted
        process's predecessor's leases released (but `spare`, released unused already), the
        held leases resumed or refused, the phones marked busy; then the session may take
        work (`settled`)."""
        host_id = session.host_id
        if hello.HasField("outbox"):
            await hosts.update_outbox(self.store, host_id, messages.backlog_in(hello.outbox))
        self.bus.hosts_changed([host_id])
        self.bus.new_stream(host_id, session.stream_id)
        if settled.checks is None:
            log.info(
                "host %s: new process %s (was %s); releasing the leases it does not hold",
                host_id, hello.process_id, settled.previous_process,
            )  # fmt: skip
            try:
                await self._release(
                    host_id,
                    states.HOST_RESTARTED,
                    keep=[*held, *(spare or ())],
                    started_before=hello_at,
                    lock_wait_ms=SWEEP_LOCK_TIMEOUT_MS,
                )
                settled = await leases.resume(
                    self.store, host_id, held, lock_wait_ms=SWEEP_LOCK_TIMEOUT_MS
                )
            except BaseException as exc:
                end = self._unrecord(session, settled.previous_process or "")
                if not isinstance(exc, Exception):  # cancelled (the host went): not awaited here
                    self._spawn(end)
                    raise
                await end
                if not lock_timed_out(exc):
                    raise
                raise _restart_held(host_id) from exc
        assert settled.checks is not None
        resumed: list[str] = []
        for check in settled.checks:
            if check.live is not None and check.task is not None:
                session.granted.add(check.held)
                session.send(messages.resumed(check))
                resumed.append(check.live.task_id)
            else:
                h = check.held
                session.send(
                    messages.refused(
                        h.task_id,
                        h.attempt,
                        h.lease_id,
                        check.revocation,
                        check.message,
                        check.task_status,
                    )
                )
                await self._record_revoked(host_id, h.task_id, h.attempt, check.revocation)
        for bad, problem in unusable:
            session.send(
                messages.refused(
                    bad.task_id, bad.attempt, bad.lease_id, leases.Revocation.UNKNOWN, problem
                )
            )
        self.bus.tasks_changed(resumed)
        # A live lease the same process did not re-announce is left to run out rather than
        # ended here: the process may have finished that attempt while disconnected, and its
        # result follows the hello (held assignments list only what still runs).
        session.set_busy(settled.busy)
        session.settled = True
        self.dispatcher.kick(session)
        return session

    def _unrecord(self, session: HostSession, previous_process: str) -> Coroutine[Any, Any, None]:
        """A restart's hello was recorded but its previous process's leases could not be
        settled (or its call was cancelled meanwhile): end the session unsent (its Welcome too)
        at once, and return the write that records the stream's end with the previous process
        id back on the row, so the host's next hello (it reconnects) finds a new process again
        and releases those leases then (should the row be held too, that write is tried again
        in the background). At once: a cancelled call left the session in `sessions`, marked
        connected, taking assignments nobody read, for as long as the replica ran."""
        session.closed = True
        if self.sessions.get(session.host_id) is session:
            del self.sessions[session.host_id]
        return self._record_end(session, previous_process)

    def _replace(
        self, old: HostSession, process_id: str, keep: list[leases.HeldLease] | None = None
    ) -> set[leases.HeldLease]:
        """End `old`, an older stream of the same host: superseded when another process
        opened the newer one (that process must stop), quietly replaced for a reconnect.

        The leases granted on a superseded stream are released, but for those the newer
        process holds (`keep`, its hello's): a process that took over a result kept by the
        old one names its lease, and released, the result was refused and the task ran again
        (the old stream was still open: a half-open connection the cloud had not noticed).
        When the newer stream is on another replica, `keep` is what its hello recorded on the
        host's row (`reconcile`).

        A superseded stream's fresh assignments never handed to gRPC (queued behind a write its
        client does not read: the usual way a hung host's newer process finds it) reached no
        process: they are taken back and released unused (STREAM_LOST, as `hand_back`), and
        returned, for the newer hello's own release to spare. A write in flight (pending, or
        timed out) is ambiguous, gRPC may still deliver it: its lease is the old process's and
        is released as the host's restart, which uses an attempt. A newer stream on another
        replica cannot see this outbox: its hello releases them as the restart first."""
        if old.process_id and process_id and old.process_id != process_id:
            unsent = old.take_unsent()  # before the Superseded is queued behind them
            old.supersede(
                f"superseded by a newer process of host {old.host_id} (this process "
                f"{old.process_id}, the newer {process_id}); stop, do not reconnect"
            )
            if unsent:
                self._spawn(self._release_later(old.host_id, states.STREAM_LOST, unsent))
            orphaned = old.granted - set(keep or ())
            if orphaned:
                self._spawn(self._release_later(old.host_id, states.HOST_RESTARTED, orphaned))
            return unsent
        old.close(grpc.StatusCode.ABORTED, "replaced by a newer stream of this host")
        return set()

    async def _release(
        self,
        host_id: str,
        reason: str,
        *,
        keep: list[leases.HeldLease] | None = None,
        only: set[leases.HeldLease] | None = None,
        started_before: dt.datetime | None = None,
        lock_wait_ms: int | None = None,
    ) -> None:
        """End leases nobody will finish (see `leases.release`) and tell who needs to know."""
        ended = await leases.release(
            self.store,
            host_id,
            reason,
            keep=keep or (),
            only=None if only is None else set(only),
            started_before=started_before,
            lock_wait_ms=lock_wait_ms,
        )
        if not ended:
            return
        self.bus.tasks_changed(sorted({e.task_id for e in ended}))
        if any(e.task_status == states.QUEUED for e in ended):
            self.bus.tasks_queued()
        session = self.sessions.get(host_id)
        if session is not None:
            released = {e.device_serial for e in ended}
            session.mark_free(released)
            session.granted -= {leases.HeldLease(e.task_id, e.attempt, e.lease_id) for e in ended}

    async def _release_later(
        self,
        host_id: str,
        reason: str,
        only: set[leases.HeldLease] | None = None,
        started_before: dt.datetime | None = None,
    ) -> None:
        """`_release` in the background (a superseded process's leases, a revoked certificate's):
        a task or attempt row held elsewhere is waited for `SWEEP_LOCK_TIMEOUT_MS` at most per
        try (nothing is released by a try that timed out), warned about once, and tried again
        until released or this replica stops; the leases run out by themselves meanwhile (the
        sweeper passes over held rows too). Waited for with no bound, the release held a pooled
        connection and the replica's stop, saying nothing. Each try reads the host's live
        leases again: `started_before` (the caller's now) keeps a late try from ending those
        granted since (a revoked host that re-enrolled and reconnected while the rows were
        held). The first try is made even when this replica is stopping: a stop ends every
        stream, and the assignments a stream never sent are handed back then (`hand_back`);
        with no try they stayed ASSIGNED to a lease no host held until it ran out, and that
        attempt counted against the task's max_attempts. The stop waits for it, bounded."""
        tried = False

        def wanted() -> bool:
            nonlocal tried
            first, tried = not tried, True
            return first or not self._stopping

        which = (
            "the leases of tasks " + ", ".join(sorted({h.task_id for h in only}))
            if only
            else "its live leases"
        )

        def warn() -> None:
            log.warning(
                "host %s: releasing %s (%s) waits: a task or attempt row of them is locked by"
                " another transaction for longer than %d ms (an open psql session? see"
                " pg_locks); tried again until the rows are free",
                host_id,
                which,
                reason,
                SWEEP_LOCK_TIMEOUT_MS,
            )

        await held_then_retried(
            lambda: self._release(
                host_id,
                reason,
                only=only,
                started_before=started_before,
                lock_wait_ms=SWEEP_LOCK_TIMEOUT_MS,
            ),
            wanted,
            f"host {host_id}: releasing {which} ({reason})",
            on_held=warn,
        )

    def hand_back(self, session: HostSession, unsent: set[leases.HeldLease]) -> None:
        """Assignments queued for `session` that never reached gRPC (its stream ended first:
        its client stopped reading, or went away): released in the background without using
        an attempt (`states.STREAM_LOST`), as the dispatcher hands back a claim whose stream
        went away (`Dispatcher._release_unsent`), rather than left to their leases. Out of
        `granted` at once (`HostSession.take_unsent`): a supersede meanwhile would release
        them as the host's restart, which uses an attempt."""
        self._spawn(self._release_later(session.host_id, states.STREAM_LOST, unsent))

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        """Run `job` in the background (awaited at stop), reporting its failure."""

        async def run() -> None:
            try:
                await job
            except Exception as exc:
                errors.report(log, "lease manager job failed", exc)

        task = asyncio.create_task(run())
        self._closings.add(task)
        task.add_done_callback(self._closings.discard)

    # ---- other replicas' streams and revocations ---------------------------------------------

    def _on_new_stream(self, host_id: str, stream_id: str) -> None:
        """Another replica opened a stream for `host_id`: end ours if it is older."""
        session = self.sessions.get(host_id)
        if session is not None and session.stream_id != stream_id:
            self._spawn(self.reconcile([host_id]))

    async def reconcile(self, host_ids: list[str]) -> None:
        """End this replica's streams of `host_ids` that the store says are not the host's
        newest (a hello on another replica, whose event may have been lost). The beat asks
        this of every stream the replica holds: the store compares and returns only the hosts
        whose recorded stream differs (`hosts.replaced_streams`), nearly always none."""
        recorded = {
            h: s
            for h in host_ids
            if (s := self.sessions.get(h)) is not None and s.recorded and not s.closed
        }
        if not recorded:
            return
        replaced: dict[str, hosts.CurrentStream] = {}
        for chunk in idlists.chunked(list(recorded)):
            held = [(h, recorded[h].stream_id) for h in chunk]
            replaced.update(await hosts.replaced_streams(self.store, held))
        for host_id, newest in replaced.items():
            session = recorded[host_id]
            if newest.stream_id != session.stream_id and not session.closed:
                if self.sessions.get(host_id) is session:
                    del self.sessions[host_id]
                keep = [leases.HeldLease(*h) for h in newest.held]
                self._replace(session, newest.process_id, keep=keep)

    def on_deny_list(self, revoked: Revoked) -> None:
        """The deny-list changed: the leases of hosts whose streams it refuses now are released
        (the authorization interceptor drops the streams themselves)."""
        for session in list(self.sessions.values()):
            who = Caller("host", session.host_id)
            if revocations.refusal(revoked, who, session.serial) is not None:
                self._spawn(
                    self._release_later(
                        session.host_id,
                        states.CERTIFICATE_REVOKED,
                        started_before=self.store.now(),  # not the leases granted after it
                    )
                )

    async def closed(self, session: HostSession) -> None:
        """The stream ended. Leases stay until they expire: the host may resume them elsewhere."""
        self.write_watch.discard(session)
        if self.sessions.get(session.host_id) is session:
            del self.sessions[session.host_id]
        session.closed = True
        self._hold_writes.pop(session, None)  # its writes end with it (`_host_row_written`)
        if self._stopping:
            return  # stop() marks all of this replica's hosts disconnected in one statement
        await self._record_end(session)

    async def _record_end(self, session: HostSession, process_id: str | None = None) -> None:
        """`_mark_disconnected`, shielded: when the host cancels its call, grpc cancels the
        handler again while this runs in its `finally`, and an unrecorded end would leave the
        host "connected" (this replica's heartbeat keeps vouching for rows it holds) long after
        it left. Its first try only is waited for (bounded on PostgreSQL)."""
        mark = asyncio.create_task(self._mark_disconnected(session, process_id))
        self._closings.add(mark)
        mark.add_done_callback(self._closings.discard)
        await asyncio.shield(mark)

    async def _forget_hello(
        self, session: HostSession, pending: asyncio.Future[leases.Settled]
    ) -> None:
        """The stream ended while its hello waited in a batch: once the batch recorded the
        hello, record the end (else the row would name a stream that is gone, and this
        replica's heartbeat would keep vouching for it)."""
        await asyncio.wait([pending])
        if not pending.cancelled() and pending.exception() is None:
            await self._mark_disconnected(session)

    async def _mark_disconnected(self, session: HostSession, process_id: str | None = None) -> None:
        """Record the stream's end on the host's row (with `process_id`: that process id back).

        A row held elsewhere past the bounded wait, or a try the database cut off (restarting),
        is tried again in the background (`_mark_later`): waited for, the end of the host's
        handler waited as long as the row was held; left naming this stream as connected (and
        dropped with no word at any failure but a lock timeout, before), the host read as
        connected for as long as this replica's heartbeat vouched for it."""
        try:
            marked = await hosts.disconnected(
                self.store, session.host_id, session.stream_id, process_id=process_id
            )
        except Exception as exc:
            if lock_timed_out(exc):
                log.warning(
                    "host %s: the end of its stream is not recorded yet: its row is locked by"
                    " another transaction for longer than %d ms (an open psql session? see"
                    " pg_locks); tried again until the row is free",
                    session.host_id,
                    SWEEP_LOCK_TIMEOUT_MS,
                )
            elif errors.unavailable(exc):
                log.warning(
                    "host %s's row: the end of its stream is not recorded yet: the database is"
                    " unavailable (%s); tried again",
                    session.host_id,
                    errors.describe(exc),
                )
            else:
                log.error(
                    "host %s's row: the end of its stream: not written, and not tried again"
                    " (retrying cannot mend it): %s",
                    session.host_id,
                    errors.describe(exc),
                )
                return
            self._spawn(self._mark_later(session, process_id))
            return
        if marked:
            self.bus.hosts_changed([session.host_id])

    async def _mark_later(self, session: HostSession, process_id: str | None) -> None:
        """`_mark_disconnected` again once the row is free, until this replica stops (its
        goodbye, `hosts.replica_gone`, marks its hosts then)."""
        done, marked = await held_then_retried(
            lambda: hosts.disconnected(
                self.store, session.host_id, session.stream_id, process_id=process_id
            ),
            lambda: not self._stopping,
            f"host {session.host_id}'s row: the end of its stream",
            first_try=False,
        )
        if done and marked:
            log.info("host %s: the end of its stream is recorded (its row is free again)",
                     session.host_id)  # fmt: skip
            self.bus.hosts_changed([session.host_id])

    async def device_update(self, session: HostSession, update: lease_pb.DeviceUpdate) -> None:
        """New phone list; newly idle phones may get work."""
        session.set_devices(list(update.devices))
        # Written now, or (its row held elsewhere) kept and written in the background: this
        # runs in the stream's reader, and every renewal of the host waits behind it.
        if await self.phone_lists.write(session, convert.device_dicts(list(update.devices))):
            self.bus.hosts_changed([session.host_id])
        self.dispatcher.kick(session)

    async def outbox(self, session: HostSession, backlog: types_pb2.OutboxBacklog) -> None:
        """The host's outbox backlog changed: recorded for the fleet view."""
        await hosts.update_outbox(self.store, session.host_id, messages.backlog_in(backlog))
        self.bus.hosts_changed([session.host_id])

    def stopping(self, session: HostSession) -> None:
        """The host is stopping: no new work on this stream; the results of the attempts it
        stops follow, and queue their tasks for whichever host is free."""
        session.stopping = True
        log.info("host %s is stopping: no new work for it", session.host_id)
        self._spawn(self._show_stopping(session))

    async def _show_stopping(self, session: HostSession) -> None:
        """Show operators the stop (on the host's row: any replica's fleet view reads it); the
        fleet view showed a connected host with idle phones for the seconds of its stop. The
        row held elsewhere: tried again while the stream lasts (`_host_row_written`)."""
        done, marked = await self._host_row_written(
            session,
            "its stop",
            lambda: hosts.stopping(self.store, session.host_id, session.stream_id),
            lambda: True,
        )
        if done and marked:
            self.bus.hosts_changed([session.host_id])

    def touch(self, session: HostSession) -> None:
        """The host sent something: it is not frozen, so work held back from it (a lease of it
        ran out, `_on_revoke`) may go to it again."""
        session.last_seen = dt.datetime.now(dt.UTC)
        if session.heard():
            self.dispatcher.kick(session)
            shown = self._holds_shown.pop(session, None) is not None
            if shown or session in self._hold_writes:  # shown, or a write of it may land
                self._spawn(self._unhold(session))

    def _want_hold_row(self, session: HostSession, hold: bool) -> int:
        """Number a new write of the host's hold (or its end), taking over from any older one.
        The row held elsewhere, each write is retried in the background: an end of a hold
        retrying past a newer hold landed after it, and the fleet view showed no hold while
        new work was held back. Only the latest is tried again (the older is dropped), and
        the number goes with the write (`hosts.hold`, `hosts.unhold`): an older try already
        on its way (waiting for a pooled connection or for the row) lands no more once a newer
        one has."""
        self._hold_write_count += 1
        self._hold_writes[session] = (self._hold_write_count, hold)
        return self._hold_write_count

    def _latest_hold_write(self, session: HostSession, number: int) -> bool:
        latest = self._hold_writes.get(session)
        return latest is not None and latest[0] == number

    def _hold_write_done(self, session: HostSession, number: int) -> None:
        if self._latest_hold_write(session, number):
            del self._hold_writes[session]

    def _hold(
        self, session: HostSession, task_id: str, attempt: int, window: float
    ) -> Coroutine[Any, Any, None]:
        """Show operators the hold `_on_revoke` set (on the host's row: any replica's fleet
        view reads it). The row held elsewhere: tried again while the hold lasts and no newer
        write of the row is wanted (bounded waits, `_host_row_written`)."""
        return self._write_hold(
            session, task_id, attempt, window, self._want_hold_row(session, hold=True)
        )

    async def _write_hold(
        self, session: HostSession, task_id: str, attempt: int, window: float, number: int
    ) -> None:
        # Heard from while this waits: `touch` numbered an end of the hold after it, which
        # lands after it or, landed first, keeps it from landing (the row compares numbers).
        try:
            done, marked = await self._host_row_written(
                session,
                f"the hold of new work after its lease of {task_id}/{attempt} ran out",
                lambda: hosts.hold(
                    self.store,
                    session.host_id,
                    session.stream_id,
                    task_id,
                    attempt,
                    window,
                    number=number,
                ),
                lambda: self._latest_hold_write(session, number) and session.unheard(),
            )
            if not (done and marked):
                return
            if session.unheard():
                self._holds_shown[session] = self.store.now() + dt.timedelta(seconds=window)
            elif self._latest_hold_write(session, number):
                # Its window ran out while it waited, and no end was numbered after it.
                await self._write_unhold(session, self._want_hold_row(session, hold=False))
            self.bus.hosts_changed([session.host_id])
        finally:
            self._hold_write_done(session, number)

    def _unhold(self, session: HostSession) -> Coroutine[Any, Any, None]:
        """End the hold shown on the host's row (it was heard from), unless a newer hold is
        wanted before this is written."""
        return self._write_unhold(session, self._want_hold_row(session, hold=False))

    async def _write_unhold(self, session: HostSession, number: int) -> None:
        try:
            done, marked = await self._host_row_written(
                session,
                "the end of its hold",
                lambda: hosts.unhold(self.store, session.host_id, session.stream_id, number=number),
                lambda: self._latest_hold_write(session, number),
            )
            if done and marked:
                self.bus.hosts_changed([session.host_id])
        finally:
            self._hold_write_done(session, number)

    async def _host_row_written(
        self,
        session: HostSession,
        what: str,
        write: Callable[[], Awaitable[bool]],
        wanted: Callable[[], bool],
    ) -> tuple[bool, bool | None]:
        """`write()` of the host's row for the fleet view (a hold, its end, a stop), run in the
        background. The row held elsewhere (an operator's `SELECT ... FOR UPDATE` left open
        in psql) is waited for `SWEEP_LOCK_TIMEOUT_MS` at most per try, warned about once,
        naming the row and `what` waits, and tried again while `wanted()`, the stream is open
        and the replica is not stopping: waited for with no bound, the write held a pooled
        connection and the replica's stop (`CLOSINGS_AT_STOP_S`), saying nothing."""

        def warn() -> None:
            log.warning(
                "host %s's row is locked by another transaction for longer than %d ms (an open"
                " psql session? see pg_locks): %s is not shown yet; tried again until the row"
                " is free",
                session.host_id,
                SWEEP_LOCK_TIMEOUT_MS,
                what,
            )

        return await held_then_retried(
            write,
            lambda: wanted() and not session.closed and not self._stopping,
            f"host {session.host_id}'s row: {what}",
            on_held=warn,
        )

    # ---- renewals and results -----------------------------------------------------------------

    async def _withdrawn(self, session: HostSession, msg: lease_pb.LeaseRenewal) -> list[str]:
        """The flows handed to the renewed attempt that are no longer active. Most attempts
        are handed none: the stream remembers which flows each attempt got (the assignment's,
        or read once for an attempt that came to it on a reconnect), so only the renewals of
        an attempt with flows read their status."""
        key = (msg.task_id, msg.attempt)
        handed = session.handed_flows.get(key)
        if handed is None:
            handed = tuple(await flows.handed_ids(self.store, msg.task_id, msg.attempt))
            session.handed_flows[key] = handed
        return await flows.withdrawn(self.store, list(handed)) if handed else []

    async def renew(
        self, session: HostSession, msg: lease_pb.LeaseRenewal
    ) -> lease_pb.LeaseResponse:
        """Fenced renewal with progress (written in the next batch)."""
        progress = messages.progress_in(msg.progress) if msg.HasField("progress") else None
        out = await self.batcher.renew(
            leases.RenewalIn(session.host_id, msg.task_id, msg.attempt, msg.lease_id, progress)
        )
        if out.expires_at is not None:  # counted "acked" by the batcher, once per batch
            renewed = lease_pb.Renewed(
                task_id=msg.task_id,
                attempt=msg.attempt,
                lease_id=msg.lease_id,
                lease_expires_at=convert.ts(out.expires_at),
                lease_remaining=convert.remaining(out.expires_at),
            )
            direct = session.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT
            day = await self.fleet_day() if direct and self.fleet_day is not None else None
            if day is not None:  # what the fleet spent meanwhile, for the host's next calls
                renewed.fleet_day.CopyFrom(day)
            if direct:  # a flow disabled or retired mid-replay is replayed no further
                renewed.withdrawn_flows.extend(await self._withdrawn(session, msg))
            return lease_pb.LeaseResponse(renewed=renewed)
        await self._record_revoked(session.host_id, msg.task_id, msg.attempt, out.revocation)
        why = out.revocation.name.lower() if out.revocation is not None else "unknown"
        metrics.current().renewal(why)
        return messages.refused(
            msg.task_id, msg.attempt, msg.lease_id, out.revocation, out.message, out.task_status
        )

    async def result(
        self, session: HostSession, msg: lease_pb.TaskResult
    ) -> lease_pb.LeaseResponse:
        """Fenced, idempotent result; a late one (lease run out, no other attempt yet) is
        accepted and acknowledged as late. The attempt's or task's row held elsewhere is waited
        for `SWEEP_LOCK_TIMEOUT_MS` at most, then the result is refused retryably (`RowHeld`,
        answered UNAVAILABLE: the host sends it again) with nothing written; it runs on the
        stream's result lane (`result_lane.py`), never on the reader."""
        final = messages.progress_in(msg.final_progress) if msg.HasField("final_progress") else None
        if msg.HasField("replay"):
            handed = await flows.handed_steps(self.store, msg.task_id, msg.attempt)
            problem = validate.replay(msg.replay, handed)
            if problem:
                # The result stands (the phone did the work); only the report is not trusted.
                log.warning("replay report of %s/%d from %s left out: %s",
                            msg.task_id, msg.attempt, session.host_id, problem)  # fmt: skip
                msg.ClearField("replay")
        # Any value, one this cloud does not know too: a newer host's reason to refuse.
        refused = (
            msg.refusal != lease_pb.ASSIGNMENT_REFUSAL_UNSPECIFIED
            and msg.status == types_pb2.TASK_STATUS_FAILED
        )
        await self.clock.settled()
        try:
            out = await leases.record_result(
                self.store,
                session.host_id,
                msg.task_id,
                msg.attempt,
                msg.lease_id,
                states.from_proto(msg.status),
                leases.truncate_summary(msg.summary, leases.RESULT_SUMMARY_LIMIT),
                final,
                retryable=msg.retryable,
                refused=refused,
                replay=messages.replay_in(msg.replay) if msg.HasField("replay") else None,
                lock_wait_ms=SWEEP_LOCK_TIMEOUT_MS,
            )
        except Exception as exc:
            if not lock_timed_out(exc):
                raise
            raise _result_held(session.host_id, msg.task_id, msg.attempt) from exc
        if out.recorded or out.duplicate:
            session.granted.discard(leases.HeldLease(msg.task_id, msg.attempt, msg.lease_id))
            session.handed_flows.pop((msg.task_id, msg.attempt), None)
            if out.recorded:
                for hear in self.on_ended:
                    hear()
                if not refused:
                    # A refused phone stays out of the offers (the host says it is running
                    # something, or cannot be used): else its next claim went to the very same
                    # phone, refused again at once. The next busy resync frees it.
                    session.mark_free([out.device_serial])
                self.bus.tasks_changed([msg.task_id])
                self.bus.hosts_changed([session.host_id])  # the phone is idle again
                metrics.current().result(states.from_proto(msg.status))
                if out.task_status == states.QUEUED:  # a retryable end: its next attempt waits
                    cause = "refused" if refused else "retryable_result"
                    metrics.current().requeued.labels(cause=cause).inc()
                    self.bus.tasks_queued()
                self.dispatcher.kick(session)
            return lease_pb.LeaseResponse(
                result_ack=lease_pb.ResultAck(
                    task_id=msg.task_id,
                    attempt=msg.attempt,
                    lease_id=msg.lease_id,
                    task_status=states.to_proto(out.task_status),
                    duplicate=out.duplicate,
                    late=out.late,
                )
            )
        await self._record_revoked(session.host_id, msg.task_id, msg.attempt, out.revocation)
        return messages.refused(
            msg.task_id, msg.attempt, msg.lease_id, out.revocation, out.message, out.task_status
        )

    async def _record_revoked(
        self, host_id: str, task_id: str, attempt: int, revocation: leases.Revocation | None
    ) -> None:
        """Add a refusal of the host's own lease to the task's lease history (a refusal of
        another host's lease, or of a lease the cloud never issued, is not the task's history).
        Best effort: the host is told either way, and a store that fails here fails loudly on
        the host's next message. The failure is logged without the driver's text, which names
        the database's host and port (`errors.report`).

        The task's row held elsewhere (the history row's foreign key locks it) is waited for
        `SWEEP_LOCK_TIMEOUT_MS` at most, then the row is written in the background once the
        lock is gone: this runs before a hello's Welcome goes out and on the stream's reader,
        and waited for, the host got no Welcome (or no answer to anything behind the refusal)
        for as long as the lock was held. The same refusal again (the host reconnecting, or
        sending the refused result again) while one waits so joins it: one background retry
        and one warning per refusal, not one per message refused."""
        if revocation is None or revocation in (
            leases.Revocation.UNKNOWN,
            leases.Revocation.NOT_YOURS,
        ):
            return
        key = (host_id, task_id, attempt, revocation.value)
        if key in self._revocations_waiting:
            return  # written by the retry already waiting for the row

        def write() -> Awaitable[bool]:
            return lease_events.record_revoked(
                self.store,
                host_id,
                task_id,
                attempt,
                revocation.value,
                lock_wait_ms=SWEEP_LOCK_TIMEOUT_MS,
            )

        try:
            if await write():
                self.bus.tasks_changed([task_id])
            return
        except Exception as exc:
            if not lock_timed_out(exc):
                errors.report(
                    log, "recording the revocation of %s/%d failed", exc, task_id, attempt
                )
                return
        log.warning(
            "task %s's row is locked by another transaction for longer than %d ms (an open"
            " psql session? see pg_locks): the refusal of host %s's lease of attempt %d (%s)"
            " goes into its lease history once the row is free",
            task_id,
            SWEEP_LOCK_TIMEOUT_MS,
            host_id,
            attempt,
            revocation.value,
        )
        self._revocations_waiting.add(key)
        self._spawn(self._record_revoked_later(write, key))

    async def _record_revoked_later(
        self, write: Callable[[], Awaitable[bool]], key: tuple[str, str, int, str]
    ) -> None:
        """`_record_revoked`'s write again once the task's row is free, until this replica
        stops (the refusal is then missing from the history, the only loss: the host was told).
        Written twice it is not: the store adds no second row for the same refusal in a row."""
        try:
            done, added = await held_then_retried(
                write,
                lambda: not self._stopping,
                f"task {key[1]}'s row: the refusal of host {key[0]}'s lease of attempt"
                f" {key[2]} ({key[3]}) for its lease history",
                first_try=False,
            )
        finally:
            self._revocations_waiting.discard(key)
        if done and added:
            self.bus.tasks_changed([key[1]])

    # ---- revocations --------------------------------------------------------------------------

    def _on_revoke(self, event: RevokeEvent) -> None:
        session = self.sessions.get(event.host_id)
        if session is None:
            return
        session.send(
            messages.revoked(
                event.task_id,
                event.attempt,
                event.lease_id,
                event.reason,
                event.message,
                event.task_status,
            )
        )
        if (
            event.ended
            and event.reason == lease_pb.REVOKE_REASON_EXPIRED
            and (event.expired_at is None or session.last_seen < event.expired_at)
        ):
            # The host did not renew a lease on a stream that is still open and has said
            # nothing since: it may be frozen, and would not answer new work either (see
            # HostSession.unheard_until). A host heard from after the lease ran out (a late
            # renewal read before this revoke came) is alive: held back, it got no work for
            # the keepalive window.
            window = self.settings.keepalive_time_seconds + self.settings.keepalive_timeout_seconds
            session.lapsed(window)
            self._spawn(self._hold(session, event.task_id, event.attempt, window))
        if event.ended and event.device_serial:
            session.mark_free([event.device_serial])
            self.dispatcher.kick(session)

    # ---- host heartbeat -----------------------------------------------------------------------

    async def _beat(self) -> None:
        """Vouch for the hosts whose streams this replica holds, look for unvouched ones, and
        end streams a newer one replaced elsewhere (should that event have been lost).

        The vouch is one row, the replica's own (`hosts.heartbeat`), and fleet watchers hear
        of no host for it: a connected host's "last seen" is its replica's last vouch, which
        moves every beat for every such host alike and which the fleet shows as "now". Before,
        every host that sent anything since the last beat (at one renewal a second: every
        host) had its row written and was published to every fleet watcher, every beat.
        Watchers still hear when a host's connectedness changes (`check_unvouched`) or a field
        they show does. The rows of replicas long dead go too (`hosts.forget_dead_replicas`),
        looked for every `FORGET_EVERY_BEATS` beats: such a row is 30 beats old, and its read
        (~0.7-1.2 ms of CPU) every beat would give back a good part of what the reconcile saved.
        """
        await hosts.heartbeat(self.store, self.bus.replica_id)
        if self._beats_since_forget % FORGET_EVERY_BEATS == 0:  # the first beat, then every 10th
            await hosts.forget_dead_replicas(self.store, self.settings.host_heartbeat_seconds)
        self._beats_since_forget += 1
        now = self.store.now()
        ran_out = [s for s, until in self._holds_shown.items() if until <= now or s.closed]
        for session in ran_out:  # the fleet view stops showing them by itself: tell watchers
            del self._holds_shown[session]
        self.bus.hosts_changed(sorted({s.host_id for s in ran_out if not s.closed}))
        await self.check_unvouched()
        await self.reconcile(list(self.sessions))

    async def check_unvouched(self) -> None:
        """Tell this replica's fleet watchers about hosts that stopped (or started again) counting
        as connected because their replica's heartbeat stopped (or resumed): no row changes
        then, so nothing else would publish it. Every replica looks for itself and tells only
        its own watchers."""
        now = await hosts.unvouched(self.store, self.settings.host_heartbeat_seconds)
        before, self._unvouched = self._unvouched, now
        if before is not None:
            self.bus.hosts_changed(sorted(now ^ before), local_only=True)


def _restart_held(host_id: str) -> RowHeld:
    """What a restarted host whose previous process's task or attempt row is held elsewhere
    (in psql) is told: its stream ends UNAVAILABLE naming the rows, and it reconnects with its
    backoff. Raised as it came, psycopg's LockNotAvailable read as "the cloud's database is
    unavailable", and the handler had waited for the row with no bound before that."""
    return RowHeld(
        f"a row host {host_id}'s restart needs (a lease of its previous process: its task or"
        f" attempt) is locked by another transaction (waited {SWEEP_LOCK_TIMEOUT_MS} ms; an"
        " open psql session or a stuck migration? see pg_locks): the previous process's"
        " leases were not settled; reconnect later"
    )


def _result_held(host_id: str, task_id: str, attempt: int) -> RowHeld:
    """What a host whose result's rows are held elsewhere (in psql) is told: UNAVAILABLE
    naming the rows, on which it sends the result again shortly (and again, until the rows
    are free: nothing was written, so no resend records it twice)."""
    return RowHeld(
        f"a row the result of task {task_id} attempt {attempt} from host {host_id} needs (its"
        f" attempt or task) is locked by another transaction (waited {SWEEP_LOCK_TIMEOUT_MS}"
        " ms; an open psql session or a stuck migration? see pg_locks): the result was not"
        " recorded; send it again"
    )


async def _alone() -> bool:
    """No other replica is alive (a manager built without a presence lock: one store, one
    replica)."""
    return False
