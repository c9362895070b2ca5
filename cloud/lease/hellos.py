"""Hellos settled in batches: one transaction for the hellos of a few milliseconds.

A replica that restarts (or a network that comes back) brings every one of its hosts' hellos
within seconds, each naming the lease it still runs, and each host stops its task when its
lease runs out before the cloud confirmed it. One transaction per hello cost a PostgreSQL
replica ~6 ms of statements and commits per hello: 2,000 hosts took it half a minute and a
quarter of them ran out (bench/replica_restart.py, decision 0075). Batched, a storm costs less
per hello the larger it grows; a lone hello waits one window (the renewals' window) longer.

Should a batch fail, each of its hellos is settled again on its own, so one hello the store
refuses (say, a host row two replicas insert at once) fails only its own stream. A host row
another transaction holds past a bounded wait fails only its own hello (`RowHeld`); the
others of its batch are settled (`leases.settle_hellos`).
"""

from __future__ import annotations

import asyncio
import logging

from cloud import supervised
from cloud.lease.clock import ClockWatch
from cloud.store import errors, leases
from cloud.store.database import Store
from cloud.store.lock_waits import SWEEP_LOCK_TIMEOUT_MS, RowHeld, lock_timed_out

log = logging.getLogger(__name__)

#: Hellos per transaction at most. On SQLite the batch's transaction runs on the event loop's
#: thread, which stands still meanwhile: with 100 a storm of 2,000 took as long as with 32, and
#: the renewals answered meanwhile waited longer (ack p99 617 against 350 ms).
MAX_BATCH = 32

_Waiting = list[tuple[leases.HelloIn, asyncio.Future[leases.Settled]]]


class HelloBatcher:
    """Queue hellos, settle them in batches (`leases.hellos`), resolve each caller."""

    def __init__(
        self,
        store: Store,
        window_s: float,
        max_batch: int = MAX_BATCH,
        clock: ClockWatch | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._window = window_s
        self._max = max_batch
        self._queue: _Waiting = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Transactions so far (tests and benchmarks read it).
        self.batches = 0

    def start(self) -> None:
        """Start settling."""
        self._task = asyncio.create_task(self._run(), name="hello-batches")

    async def stop(self) -> None:
        """Stop; hellos still queued fail with CancelledError."""
        if self._task is not None:
            await supervised.stop([self._task])
            self._task = None
        for _, fut in self._queue:
            fut.cancel()
        self._queue.clear()

    def submit(self, item: leases.HelloIn) -> asyncio.Future[leases.Settled]:
        """Queue a hello for the next batch. Await the future shielded: once its batch began,
        the hello is written whatever becomes of the caller."""
        fut: asyncio.Future[leases.Settled] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        self._wake.set()
        return fut

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._window:
                await asyncio.sleep(self._window)
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                batch = [(item, fut) for item, fut in batch if not fut.done()]
                if batch:
                    if self._clock is not None:
                        await self._clock.settled()
                    await self._settle(batch)

    async def _settle(self, batch: _Waiting) -> None:
        try:
            settled = await leases.settle_hellos(self._store, [item for item, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                _resolve(batch[0][1], _named(batch[0][0], exc))
                return
            errors.report(log, "a batch of %d hellos failed; settling each alone", exc, len(batch))
            for one in batch:
                await self._settle([one])
            return
        self.batches += 1
        for (_, fut), out in zip(batch, settled, strict=True):
            _resolve(fut, out)


def _named(item: leases.HelloIn, exc: Exception) -> Exception:
    """A lone hello's failure as its host is to hear it. A lock wait that timed out on a row
    its leases need (a task or attempt row held in psql) becomes `RowHeld`, naming the host:
    raised as it came, psycopg's LockNotAvailable is an OperationalError, and the host was told
    "the cloud's database is unavailable", the database probe woken, while it answers."""
    if not lock_timed_out(exc):
        return exc
    held = RowHeld(
        f"a row host {item.host_id}'s hello needs (a lease's task or attempt) is locked by "
        f"another transaction (waited {SWEEP_LOCK_TIMEOUT_MS} ms; an open psql session or a "
        "stuck migration? see pg_locks): the hello was not recorded; reconnect later"
    )
    held.__cause__ = exc
    return held


def _resolve(fut: asyncio.Future[leases.Settled], out: leases.Settled | Exception) -> None:
    if fut.done():
        return
    if isinstance(out, Exception):
        fut.set_exception(out)
    else:
        fut.set_result(out)
