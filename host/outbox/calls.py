"""The direct transport's ledger of model calls (decision 0080): a marker in the outbox's own
SQLite before each call this host's planner makes, so a call whose cost the host never learns
(its answer lost after the request went out, or the process killed during it) is shipped to the
cloud as "cost unknown, at most X" instead of vanishing.

The marker's body is the call as it would be shipped (`ShippedUnsettledCall`); it is deleted in
the outbox write that ships what the provider reported of the call (`OutboxStore.put(settles=)`),
and moved into the outbox when the call ended unknown (`Shipments.release_calls`) or, at start,
when the process that made it died (`OutboxStore.release_calls`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from amc.v1 import decision_log_service_pb2
from host.devices.lanes import in_own_thread
from host.outbox.store import OutboxStore
from host.timeline.store import UnsettledCall
from planner.convert import usage_from_proto, usage_to_proto
from planner.decision import Usage


class OutboxCallLedger:
    """`planner.unsettled.CallLedger` for one attempt's decision on a direct host; `opened`
    `written` lists the markers it wrote."""

    def __init__(self, store: OutboxStore, task_id: str, attempt: int, lease_id: str) -> None:
        self._store = store
        self._task_id = task_id
        self._attempt = attempt
        self._lease_id = lease_id
        self.written: list[str] = []

    async def opened(self, provider: str, model: str, at_most: Usage) -> str:
        started = Timestamp()
        started.GetCurrentTime()
        record = decision_log_service_pb2.ShippedUnsettledCall(
            host_call_id=uuid.uuid4().hex,
            task_id=self._task_id,
            attempt=self._attempt,
            lease_id=self._lease_id,
            provider=provider[:32],
            model=model[:128],
            started_at=started,
            at_most=usage_to_proto(at_most),
        )
        await in_own_thread(  # not asyncio's default pool: a write hung there held the exit
            self._store.open_call, record.host_call_id, record.SerializeToString()
        )
        self.written.append(record.host_call_id)
        return record.host_call_id

    async def settled(self, call_id: str) -> None:
        await in_own_thread(self._store.settle_calls, [call_id])


def unsettled_calls(bodies: Sequence[bytes]) -> list[UnsettledCall]:
    """Released markers' bodies (`ShippedUnsettledCall`) as the timeline keeps the calls."""
    calls = []
    for body in bodies:
        c = decision_log_service_pb2.ShippedUnsettledCall.FromString(body)
        at_most = usage_from_proto(c.at_most)
        calls.append(
            UnsettledCall(c.host_call_id, c.task_id, c.attempt, c.provider, c.model, at_most)
        )
    return calls
