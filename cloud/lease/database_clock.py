"""The replica's clock against its PostgreSQL server's, checked while it runs, not only at start.

A replica whose clock is off the database server's by more than the clock gap is refused at
start (`clock.check_database_clock`): replicas hold one another's lease expiries against their
own clocks, so one ahead requeues leases other replicas keep (the task runs twice) and one
behind keeps a dead host's work. A clock that drifts slowly afterwards (NTP stopped, a virtual
machine's clock source gone bad) went unnoticed: `ClockWatch` sees steps and standstills of
the replica's own time, not a slow drift from everyone else's. `DatabaseClockWatch.step` (a
supervised job, every `CHECK_INTERVAL_S`) repeats the start's check, one `SELECT
clock_timestamp()`, sets the offset metric, and logs an error once when the offset passes the
limit and once when it is back within it.

It does not stop the replica. Refusing to serve would drop every host stream of the replica at
once and put their leases through a reconnect storm, for a drift that is usually seconds past
the limit and grows slowly; and should the database server's clock be the one that moved, every
replica would see the same drift and the whole cloud would stop. An error in the log and a
metric to alert on let the operator fix the clock while the fleet keeps working.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from cloud import metrics
from cloud.lease.clock import database_offset
from cloud.store import errors
from cloud.store.database import Store

log = logging.getLogger(__name__)

#: Seconds between two checks: a drift of a few seconds a day is seen within a minute of
#: passing the limit, for one cheap statement a minute.
CHECK_INTERVAL_S = 60.0


class DatabaseClockWatch:
    """`step()` measures the offset once; `drifted` says whether the last one was past the
    limit (so each crossing is logged once, not every minute)."""

    def __init__(
        self,
        store: Store,
        limit_s: float,
        offset: Callable[[Store], Awaitable[float]] = database_offset,
    ) -> None:
        self._store = store
        self._limit = limit_s
        self._offset = offset
        #: Whether the last measured offset was past the limit.
        self.drifted = False
        #: The last measured offset, seconds (this replica ahead: positive).
        self.offset_s = 0.0

    async def step(self) -> None:
        """One check. A database that cannot be reached is the database probe's to report
        (`cloud.db_probe`): this check just waits for the next minute."""
        if not self._store.is_postgres:
            return
        try:
            offset = await self._offset(self._store)
        except Exception as exc:
            if errors.database_error(exc) is None:
                raise
            return
        self.offset_s = offset
        metrics.current().database_clock_offset.set(offset)
        side = "ahead of" if offset > 0 else "behind"
        if abs(offset) > self._limit and not self.drifted:
            self.drifted = True
            log.error(
                "this replica's clock is now %.1f s %s the database server's (more than"
                " AMC_CLOUD_CLOCK_GAP_SECONDS=%g): its sweeps misjudge other replicas' leases"
                " (ahead: live leases requeued, their tasks run twice; behind: dead hosts keep"
                " their work); it keeps serving: synchronise its clock (NTP)",
                abs(offset),
                side,
                self._limit,
            )
        elif abs(offset) <= self._limit and self.drifted:
            self.drifted = False
            log.warning(
                "this replica's clock is within %g s of the database server's again (%.1f s %s)",
                self._limit,
                abs(offset),
                side,
            )
