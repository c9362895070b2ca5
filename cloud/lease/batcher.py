"""Coalesced renewals in two stages: one read per batch answers what changes nothing, and the
rest are written together, without holding up the next read.

2,000 hosts renewing every second would otherwise be 2,000 transactions a second, which SQLite
cannot sustain. Renewals that arrive within a few milliseconds form a batch. Stage one reads the
batch's leases in one statement and answers each renewal that would change nothing but a
far-off expiry with the stored expiry (decision 0070). Stage two writes the others, fenced each
on its own (`cloud.store.leases.write_renewals`: on SQLite one fenced UPDATE per renewal, on
PostgreSQL one statement), so a stale renewal is refused without failing the others in its
batch. The stages run side by side: while a write waits (for SQLite's one writer, say, behind a
heartbeat), unchanged renewals are still answered. A lease with a renewal queued for writing is
written again, never answered from a read, so a lease's renewals land in the order they came.
Renewals answered from a read are counted in the attempt's `renewals` by the lease's next write
(`RenewalIn.counts`); those after its last write are not counted when the attempt ends first.
Watchers reload the tasks whose writes were news; a write that only extended a lease, brought
new progress or started the attempt tells them its new expiry, progress and status instead
(`EventBus.leases_extended`): at the default renewal interval that is nearly every write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from cloud import metrics, supervised
from cloud.events import EventBus, Extension
from cloud.lease.clock import ClockWatch
from cloud.store import errors, leases
from cloud.store.database import Store

log = logging.getLogger(__name__)

_Waiting = list[tuple[leases.RenewalIn, asyncio.Future[leases.RenewalOut]]]
#: Leases with uncounted renewals kept at most (the entries of leases that ended between two
#: writes are dropped with the rest when there are more; those renewals stay uncounted).
_MAX_UNCOUNTED = 100_000


class RenewalBatcher:
    """Queue renewals, answer or write them in batches, resolve each caller with its outcome."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        window_s: float,
        max_batch: int,
        write_below: float = leases.ALWAYS_WRITE,
        clock: ClockWatch | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._bus = bus
        self._window = window_s
        self._max = max_batch
        self._write_below = write_below
        self._queue: _Waiting = []
        self._writes: _Waiting = []
        #: Leases with renewals queued for writing or being written (how many of each).
        self._pending: Counter[tuple[str, int, str, str]] = Counter()
        #: Renewals answered from a read, per lease, not yet in the attempt's count.
        self._uncounted: Counter[tuple[str, int, str, str]] = Counter()
        self._wake = asyncio.Event()
        self._write_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: Write transactions so far (stage two).
        self.batches_written = 0

    def start(self) -> None:
        """Start the two stages."""
        self._tasks = [
            asyncio.create_task(self._run(), name="renewal-reads"),
            asyncio.create_task(self._run_writes(), name="renewal-writes"),
        ]

    async def stop(self) -> None:
        """Stop both stages; queued renewals fail with CancelledError."""
        await supervised.stop(self._tasks)
        self._tasks = []
        for _, fut in (*self._queue, *self._writes):
            if not fut.done():
                fut.cancel()
        self._queue.clear()
        self._writes.clear()
        self._pending.clear()
        self._uncounted.clear()

    async def renew(self, item: leases.RenewalIn) -> leases.RenewalOut:
        """Answer one renewal as part of the next batch."""
        fut: asyncio.Future[leases.RenewalOut] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        self._wake.set()
        return await fut

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._window:
                await asyncio.sleep(self._window)
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                if self._clock is not None:
                    await self._clock.settled()
                await self._answer(batch)

    async def _answer(self, batch: _Waiting) -> None:
        """Stage one: answer from one read what needs no write, queue the rest for stage two."""
        items = [item for item, _ in batch]
        if self._write_below >= leases.ALWAYS_WRITE:
            outcomes: list[leases.RenewalOut | leases.Must] = [leases.Must.NEWS] * len(batch)
        else:
            try:
                outcomes = await leases.answer_from_read(
                    self._store, items, self._write_below, self._pending
                )
            except Exception as exc:
                self._fail(batch, exc)
                return
        acked = 0
        for (item, fut), out in zip(batch, outcomes, strict=True):
            key = leases.lease_key(item)
            if isinstance(out, leases.Must):
                self._pending[key] += 1
                counts = 1 + self._uncounted.pop(key, 0)
                self._writes.append((item._replace(counts=counts, must=out), fut))
                continue
            self._uncounted[key] += 1
            acked += 1
            if not fut.done():
                fut.set_result(out)
        if acked:
            metrics.current().renewal("acked", acked)
        if len(self._uncounted) > _MAX_UNCOUNTED:  # leases that ended between writes
            self._uncounted.clear()
        if self._writes:
            self._write_wake.set()

    async def _run_writes(self) -> None:
        while True:
            await self._write_wake.wait()
            self._write_wake.clear()
            while self._writes:
                batch, self._writes = self._writes[: self._max], self._writes[self._max :]
                try:
                    if self._clock is not None:
                        await self._clock.settled()
                    await self._write(batch)
                finally:
                    for item, _ in batch:
                        key = leases.lease_key(item)
                        self._pending[key] -= 1
                        if self._pending[key] <= 0:
                            del self._pending[key]

    async def _write(self, batch: _Waiting) -> None:
        """Stage two: one fenced write transaction; watchers hear of what it changed."""
        observed = metrics.current()
        started = time.perf_counter()
        try:
            outcomes = await leases.write_renewals(
                self._store, [item for item, _ in batch], self._write_below
            )
        except Exception as exc:
            self._fail(batch, exc)
            return
        observed.db_batch.observe(time.perf_counter() - started)
        observed.db_batch_size.observe(len(batch))
        self.batches_written += 1
        changed: list[str] = []
        extended: list[Extension] = []
        acked = 0
        blocked: list[Exception] = []
        for (item, fut), out in zip(batch, outcomes, strict=True):
            if out.error is not None:  # its rows locked: neither renewed nor refused
                blocked.append(out.error)
                self._uncounted[leases.lease_key(item)] += item.counts - 1
                if not fut.done():
                    fut.set_exception(out.error)
                continue
            if out.expires_at is None:
                self._uncounted.pop(leases.lease_key(item), None)
                if not fut.done():
                    fut.set_result(out)
                continue
            acked += 1
            if out.written and item.must is not leases.Must.NEWS and out.renewed_at is not None:
                extended.append(
                    Extension(
                        item.task_id,
                        out.expires_at,
                        out.renewed_at,
                        item.attempt,
                        None if item.must is leases.Must.EXTEND else item.progress,
                        started=item.must is leases.Must.START,
                    )
                )
            elif out.written:
                changed.append(item.task_id)
            if not fut.done():
                fut.set_result(out)
        if acked:
            observed.renewal("acked", acked)
        if blocked:
            observed.renewal_errors(len(blocked))
            errors.report(log, "%d renewals met a locked row", blocked[0], len(blocked))
        self._bus.tasks_changed(changed)
        self._bus.leases_extended(extended)

    @staticmethod
    def _fail(batch: _Waiting, exc: Exception) -> None:
        """Every renewal of the batch is told "internal error; retry" (the boundary's words).
        A database that went away is logged as one line without the driver's text (it names
        the database's host and port), as every other database failure is: a renewal batch
        fails every few milliseconds while the database is down."""
        metrics.current().renewal_errors(len(batch))
        errors.report(log, "renewal batch of %d failed", exc, len(batch))
        for _, fut in batch:
            if not fut.done():
                fut.set_exception(exc)
