"""Expiry and deadline sweeps: attempts whose lease ran out and tasks past their deadline end.

Every replica sweeps (the store makes each end happen once); the host that held an ended
attempt is told through the bus, wherever its stream is, and dispatchers hear of requeued work.
Each pass also deletes the secret parameters of tasks that have ended, however they ended (a
result, an expiry, a deadline, a cancel), so a secret outlives its task by one sweep at most.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cloud import metrics
from cloud.events import EventBus, RevokeEvent
from cloud.lease import messages
from cloud.lease.clock import ClockWatch
from cloud.store import leases, secrets, states
from cloud.store.database import Store
from cloud.store.lock_waits import SWEEP_LOCK_TIMEOUT_MS

#: Rows one sweep query ends at most; a full batch means more may be waiting.
SWEEP_BATCH = 500
#: Task ids a warning names at most (the rest are counted).
HELD_NAMED = 5

log = logging.getLogger(__name__)


class Sweeper:
    """Ends expired leases and passed deadlines, and tells who needs to know."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        clock: ClockWatch | None = None,
        *,
        interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        #: The sweep loop's pace (AMC_CLOUD_SWEEP_INTERVAL_SECONDS).
        self.interval = interval
        self._monotonic = monotonic
        #: Tasks the last pass left because another transaction held their rows.
        self.held: set[str] = set()
        #: Each task whose expired attempt row every expiry sweep skipped (SKIP LOCKED) since
        #: the first of them, with when (`monotonic`) that one ran.
        self._skipped: dict[str, float] = {}

    async def sweep_once(self) -> int:
        """End expired leases and passed deadlines; returns how many attempts/tasks it ended."""
        if self.clock is not None:
            await self.clock.settled()
        held: list[str] = []
        skipped = leases.Skipped()
        ended = await leases.sweep_expired(
            self.store, SWEEP_BATCH, held, skipped
        ) + await leases.sweep_deadlines(self.store, SWEEP_BATCH, held)
        self._say_held(set(held) | self._skipped_for_long(skipped))
        if not ended:
            return 0
        requeued = False
        observed = metrics.current()
        for e in ended:
            observed.expiries.labels(reason=e.revocation.name.lower()).inc()
            if e.task_status == states.QUEUED:
                observed.requeued.labels(cause="lease_expired").inc()
            if e.host_id:
                self.bus.revoke(
                    RevokeEvent(
                        e.host_id,
                        e.task_id,
                        e.attempt,
                        e.lease_id,
                        messages.revoke_reason(e.revocation),
                        messages.swept_message(e.revocation),
                        e.device_serial,
                        ended=True,
                        task_status=e.task_status,
                        expired_at=e.expired_at,
                    )
                )
            requeued = requeued or e.task_status == states.QUEUED
        self.bus.tasks_changed(sorted({e.task_id for e in ended}))
        self.bus.hosts_changed(sorted({e.host_id for e in ended if e.host_id}))  # phones freed
        if requeued:
            self.bus.tasks_queued()
        return len(ended)

    def _skipped_for_long(self, skipped: leases.Skipped) -> set[str]:
        """The tasks of `skipped` (this pass's) whose expired attempt row every pass has
        skipped for a sweep interval at least: held for no good reason, and their leases
        outlived their term silently before. A row skipped for less is most often another
        replica's sweeper ending it. Two passes running were not enough: a pass that ended a
        full batch (of expiries or deadlines) runs the next one at once, and its sweep could
        find the other replica's transaction still open a few milliseconds later.

        A pass that could not tell (a full batch: it did not look past its last row) keeps
        the stretches as they are and names no new one: taken for "none skipped", it started
        every stretch over, and a task already named was named again."""
        if not skipped.told:
            return self.held & set(self._skipped)
        now = self._monotonic()
        self._skipped = {task: self._skipped.get(task, now) for task in skipped.task_ids}
        return {task for task, since in self._skipped.items() if now - since >= self.interval}

    def _say_held(self, held: set[str]) -> None:
        """Warn once about tasks a pass skipped because their rows stay locked: every pass
        (each second) skips them again until the lock is gone, and a line a second would bury
        the log; a task skipped again after it was free is named again."""
        new = sorted(held - self.held)
        self.held = held
        if not new:
            return
        named = ", ".join(new[:HELD_NAMED]) + (
            f" and {len(new) - HELD_NAMED} more" if len(new) > HELD_NAMED else ""
        )
        log.warning(
            "sweep: %d task(s) left for a later pass: their rows are locked by another"
            " transaction for longer than %d ms (an open psql session? see pg_locks): %s",
            len(new),
            SWEEP_LOCK_TIMEOUT_MS,
            named,
        )

    async def sweep(self) -> None:
        """Sweep until a pass finds less than a full batch (the sweep loop's step), then delete
        the secrets of ended tasks."""
        while await self.sweep_once() >= SWEEP_BATCH:
            pass
        await secrets.forget_ended(self.store)
