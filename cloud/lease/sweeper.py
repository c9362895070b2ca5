"""Expiry and deadline sweeps: attempts whose lease ran out and tasks past their deadline end.

Every replica sweeps (the store makes each end happen once); the host that held an ended
attempt is told through the bus, wherever its stream is, and dispatchers hear of requeued work.
Each pass also deletes the secret parameters of tasks that have ended, however they ended (a
result, an expiry, a deadline, a cancel), so a secret outlives its task by one sweep at most.
"""

from __future__ import annotations

from cloud import metrics
from cloud.events import EventBus, RevokeEvent
from cloud.lease import messages
from cloud.lease.clock import ClockWatch
from cloud.store import leases, secrets, states
from cloud.store.database import Store

#: Rows one sweep query ends at most; a full batch means more may be waiting.
SWEEP_BATCH = 500


class Sweeper:
    """Ends expired leases and passed deadlines, and tells who needs to know."""

    def __init__(self, store: Store, bus: EventBus, clock: ClockWatch | None = None) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock

    async def sweep_once(self) -> int:
        """End expired leases and passed deadlines; returns how many attempts/tasks it ended."""
        if self.clock is not None:
            await self.clock.settled()
        ended = await leases.sweep_expired(self.store, SWEEP_BATCH) + await leases.sweep_deadlines(
            self.store, SWEEP_BATCH
        )
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

    async def sweep(self) -> None:
        """Sweep until a pass finds less than a full batch (the sweep loop's step), then delete
        the secrets of ended tasks."""
        while await self.sweep_once() >= SWEEP_BATCH:
            pass
        await secrets.forget_ended(self.store)
