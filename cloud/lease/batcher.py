"""Coalesced renewals: renewals that arrive within a few milliseconds share one read and at most
one transaction.

2,000 hosts renewing every second would otherwise be 2,000 transactions a second, which SQLite
cannot sustain. Each renewal is still fenced on its own (`cloud.store.leases.renew_batch`): the
batch is read in one statement, the renewals that change nothing but a far-off expiry are
answered from that read (decision 0070), and the rest are written, on SQLite as an executemany of
the fenced UPDATE, on PostgreSQL as one statement for the whole batch, so a stale renewal is
refused without failing the others in its batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cloud.events import EventBus
from cloud.store import leases
from cloud.store.database import Store

log = logging.getLogger(__name__)


class RenewalBatcher:
    """Queue renewals, write them in batches, resolve each caller with its own outcome."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        window_s: float,
        max_batch: int,
        write_below: float = leases.ALWAYS_WRITE,
    ) -> None:
        self._store = store
        self._write_below = write_below
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
        try:
            outcomes = await leases.renew_batch(
                self._store, [item for item, _ in batch], self._write_below
            )
        except Exception as exc:
            log.exception("renewal batch of %d failed", len(batch))
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.batches_written += 1
        changed: list[str] = []
        for (item, fut), out in zip(batch, outcomes, strict=True):
            if out.written:  # a renewal answered from the read changed nothing a watcher shows
                changed.append(item.task_id)
            if not fut.done():
                fut.set_result(out)
        self._bus.tasks_changed(changed)
