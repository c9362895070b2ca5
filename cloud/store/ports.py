"""The planner service's ports (LeaseGate, DecisionSink) implemented on the cloud store."""

from __future__ import annotations

from cloud.store import decisions, leases
from cloud.store.database import Store
from planner.decision import Decision


class StoreLeaseGate:
    """`is_live`: the planner checks the caller's lease before it spends any tokens."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
        return await leases.is_live(self._store, host_id, task_id, attempt, lease_id)


class StoreDecisionSink:
    """`append`: one decision row with a cloud-assigned, gap-free step index per (task, attempt)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def append(
        self, host_id: str, task_id: str, attempt: int, decision: Decision
    ) -> tuple[str, int]:
        row = await decisions.append(self._store, host_id, task_id, attempt, decision)
        return row.decision_id, row.step_index
