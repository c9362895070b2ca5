"""Coalesced renewal writes: renewals that arrive within a few milliseconds share one transaction.

2,000 hosts renewing every second would otherwise be 2,000 transactions a second, which SQLite
cannot sustain. Each renewal is still fenced on its own (`cloud.store.leases.renew_batch`): on
SQLite an executemany of the fenced UPDATE, on PostgreSQL one statement for the whole batch
(one round trip), so a stale renewal is refused without failing the others in its batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from cloud import metrics
from cloud.events import EventBus
from cloud.store import leases
from cloud.store.database import Store

log = logging.getLogger(__name__)


class RenewalBatcher:
    """Queue renewals, write them in batches, resolve each caller with its own outcome."""

    def __init__(self, store: Store, bus: EventBus, window_s: float, max_batch: int) -> None:
        self._store = store
        self._bus = bus
        self._window = window_s
        self._max = max_batch
        self._queue: list[tuple[leases.RenewalIn, asyncio.Future[leases.RenewalOut]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches_written = 0

    def start(self) -> None:
        """Start the writer task."""
        self._task = asyncio.create_task(self._run(), name="renewal-batcher")

    async def stop(self) -> None:
        """Stop the writer; queued renewals fail with CancelledError."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, fut in self._queue:
            if not fut.done():
                fut.cancel()
        self._queue.clear()

    async def renew(self, item: leases.RenewalIn) -> leases.RenewalOut:
        """Write one renewal as part of the next batch."""
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
                await self._write(batch)

    async def _write(
        self, batch: list[tuple[leases.RenewalIn, asyncio.Future[leases.RenewalOut]]]
    ) -> None:
        observed = metrics.current()
        started = time.perf_counter()
        try:
            outcomes = await leases.renew_batch(self._store, [item for item, _ in batch])
        except Exception as exc:
            observed.renewal_errors(len(batch))
            log.exception("renewal batch of %d failed", len(batch))
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        observed.db_batch.observe(time.perf_counter() - started)
        observed.db_batch_size.observe(len(batch))
        self.batches_written += 1
        changed: list[str] = []
        for (item, fut), out in zip(batch, outcomes, strict=True):
            if out.expires_at is not None:
                changed.append(item.task_id)
            if not fut.done():
                fut.set_result(out)
        self._bus.tasks_changed(changed)
