"""Time this replica did not live through: its wall clock stepped forward, or it stood still
(decision 0076).

Lease expiry is wall-clock time in the database (`Store.now()`); hosts count their leases on
monotonic clocks of their own. When a replica's wall clock steps forward (an NTP step, a
virtual machine restored from a snapshot: a `.ci/run` failed so, its kernel logging "crng
reseeded due to virtual machine fork") or the replica stands still for seconds (a paused
virtual machine, SIGSTOP, a stalled event loop), every lease looks expired at once although no
host could have been heard meanwhile: the next sweep requeues work hosts keep doing, and every
renewal is refused. For the hosts that is an outage of the cloud, and it is treated as one:
before any decision that holds a lease's expiry against the clock (a batch of renewals or
hellos, a result, a sweep, PlannerDecide's lease check) the replica checks for such a gap, and
when one is found and no other replica is alive, live leases get a new term
(`leases.extend_after_outage`), as at a start after an outage. Other replicas alive kept their
clocks and swept as usual: nothing is extended.

A gap is measured between two consecutive checks, and the `clock` job checks every second, so
a step of the wall clock is seen whole however long ago the last renewal came, and a
standstill is the time since the last check beyond that second. A step back of the gap or more
is put right the other way: it left every stored expiry that much further off by the new clock
(a renewal kept it and told its host an hour more, a host that died held its task an hour
longer), so with no other replica alive it comes off live leases (`leases.keep_time_left`)
before any of those decisions. Task deadlines are points in wall-clock time and stay as they
are. A step within the instant between a check and the read of the clock that follows it is
not seen.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import text

from cloud import supervised
from cloud.store import errors, leases
from cloud.store.database import Store

log = logging.getLogger(__name__)

#: Seconds between the `clock` job's checks (a standstill is what exceeds it).
TICK_S = 1.0
#: Seconds a stopping replica gives a new term under way to be written before it is cancelled
#: (its transaction then rolls back; the next replica to start alone gives the new term). The
#: writes wait `SWEEP_LOCK_TIMEOUT_MS` at most for a held row: a fraction of this.
SETTLE_AT_STOP_S = 2.0


class ClockSkew(RuntimeError):
    """This replica's clock is too far from its database server's to hold leases by it."""

    def __init__(self, offset_s: float, limit_s: float) -> None:
        self.offset_s = offset_s
        side = "ahead of" if offset_s > 0 else "behind"
        super().__init__(
            f"this machine's clock is {abs(offset_s):.0f} s {side} the database server's"
            f" (more than AMC_CLOUD_CLOCK_GAP_SECONDS={limit_s:g}): lease expiry is held"
            " against each replica's clock, so its sweeps would end other replicas' live"
            " leases (their tasks run twice) or keep dead hosts' work; synchronise it (NTP)"
        )


async def database_offset(store: Store) -> float:
    """How far this replica's clock (`Store.now`) is ahead of its PostgreSQL server's, in
    seconds, beyond what the round trip leaves uncertain (0 within it; always 0 on SQLite:
    one machine, one clock).

    Replicas hold one another's lease expiries against their own clocks, so a replica minutes
    ahead requeued every lease another replica kept (the task ran on two phones), and one
    behind kept a dead host's work that long. ClockWatch sees only this replica's own steps;
    the database's clock is the one reference every replica shares."""
    if not store.is_postgres:
        return 0.0
    async with store.read() as session:
        before = store.now()
        theirs = await session.scalar(text("SELECT clock_timestamp()"))
        after = store.now()
    assert isinstance(theirs, dt.datetime)
    mine = before + (after - before) / 2
    offset = (mine - theirs).total_seconds()
    slack = (after - before).total_seconds() / 2
    return 0.0 if abs(offset) <= slack else offset - slack * (1 if offset > 0 else -1)


async def check_database_clock(store: Store, limit_s: float) -> None:
    """Raise `ClockSkew` when this replica's clock is more than `limit_s` off the database's."""
    offset = await database_offset(store)
    if abs(offset) > limit_s:
        raise ClockSkew(offset, limit_s)


class ClockWatch:
    """Notices a gap in this replica's time and gives live leases a new term for it."""

    def __init__(
        self,
        store: Store,
        others_alive: Callable[[], Awaitable[bool]],
        gap_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._others_alive = others_alive
        self._gap = gap_s
        self._monotonic = monotonic
        self._pending: asyncio.Task[None] | None = None
        #: A gap seen whose new term is not written yet (the store failed): the next check
        #: tries again.
        self._owed = False
        #: Seconds the wall clock stepped back that live leases still owe (the store failed).
        self._owed_back = 0.0
        #: New terms given so far (tests read it).
        self.outages = 0
        self.reset()

    def reset(self) -> None:
        """Take the clocks as they are now (the replica starts; a gap was settled)."""
        self._last_mono = self._monotonic()
        self._offset = self._store.now().timestamp() - self._last_mono

    def _moved(self) -> tuple[float, float]:
        """Seconds lost since the last check (wall clock stepped forward, or stood still), and
        seconds the wall clock stepped back."""
        mono = self._monotonic()
        offset = self._store.now().timestamp() - mono
        stepped = offset - self._offset
        stood = mono - self._last_mono - TICK_S
        self._last_mono, self._offset = mono, offset
        return max(stepped, stood), -stepped

    async def settled(self) -> None:
        """Return once no gap is owed: at once, with no suspension, when the clocks agree (the
        renewals' path calls it for every batch); else after the leases are put right."""
        if self._pending is None:
            lost, back = self._moved()
            if back >= self._gap:
                self._owed_back += back
            if lost >= self._gap:
                self._owed = True
            if not self._owed and not self._owed_back:
                return
            self._pending = asyncio.create_task(self._settle(lost))
        await asyncio.shield(self._pending)

    async def tick(self) -> None:
        """The `clock` job's step."""
        await self.settled()

    async def stop(self, within: float = SETTLE_AT_STOP_S) -> None:
        """The replica stops: a new term under way (shielded from its callers, whom the stop
        cancelled) gets `within` seconds to be written, then is cancelled and awaited. Left
        alone it ran on into the closed store, or was destroyed pending with the loop."""
        if self._pending is not None:
            await supervised.finish([self._pending], within)

    async def _settle(self, lost: float) -> None:
        try:
            if self._owed_back:
                await self._step_back()
            if self._owed:
                await self._outage(lost)
        except Exception as exc:
            errors.report(log, "putting live leases right after a gap failed", exc)
        finally:
            self.reset()
            self._pending = None

    async def _step_back(self) -> None:
        back = self._owed_back
        if await self._others_alive():
            log.warning(
                "this replica's clock stepped back %.1f s; other replicas kept time, no lease "
                "is moved",
                back,
            )
        else:
            moved = await leases.keep_time_left(self._store, dt.timedelta(seconds=back))
            log.warning(
                "this replica's clock stepped back %.1f s and no other replica is up: %d live "
                "lease(s) keep the time they had left",
                back,
                moved,
            )
        self._owed_back = 0.0

    async def _outage(self, lost: float) -> None:
        if await self._others_alive():
            log.warning(
                "this replica lost %.1f s (its clock stepped or it stood still); other "
                "replicas kept time, no lease gets a new term",
                lost,
            )
        else:
            extended = await leases.extend_after_outage(self._store)
            self.outages += 1
            log.warning(
                "this replica lost %.1f s (its clock stepped or it stood still) and no "
                "other replica is up: %d live lease(s) get a new term",
                lost,
                extended,
            )
        self._owed = False
