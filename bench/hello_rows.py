"""Host rows as a fleet's hellos leave them, written straight into a store (no streams).

A benchmark of what the cloud does per host (the heartbeat, WatchHosts) needs thousands of
hosts in the store; the hellos themselves are not what it measures.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from cloud.store import hosts
from cloud.store.database import Store

#: Hellos per transaction: as a fleet reconnecting at once lands them, in batches.
BATCH = 1000


async def record_hellos(
    store: Store, ids: list[str], replica: str, devices: list[dict[str, Any]] | None = None
) -> None:
    """A hello of each of `ids` (its stream `s-<id>`, through `replica`, naming `devices`),
    all at the store's one now."""
    now = store.now()
    for start in range(0, len(ids), BATCH):
        record = [
            (h, hosts.HelloRecord(devices or [], "v1", 1, replica, f"s-{h}"))
            for h in ids[start : start + BATCH]
        ]

        def write(session: Session, record: list[tuple[str, hosts.HelloRecord]] = record) -> None:
            hosts.record_hellos(session, now, record)

        await store.write_on_loop(write)


async def analyze_hosts(store: Store) -> None:
    """Statistics of the rows just written, as autovacuum would take them soon after: the
    planner would otherwise plan for an empty table."""
    async with store.write() as session:
        await session.execute(text("ANALYZE hosts"))
