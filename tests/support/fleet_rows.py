"""A fleet of a few hundred hosts written straight into a cloud's store, and a count of the
host rows it loads: for tests that a listing reads its page, not the fleet."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from cloud.server import CloudServer
from cloud.store import hosts
from cloud.store.models import HostRow


async def register(cloud: CloudServer, count: int, prefix: str = "fleet") -> list[tuple[str, bool]]:
    """`count` hosts as hellos recorded them, every tenth still connected through this
    replica (its heartbeat vouches for them), the others' streams ended. Returns (host id,
    connected) in ListHosts' order: by id."""
    now = cloud.store.now()
    made = [(f"{prefix}-{i:04d}", i % 10 == 0) for i in range(count)]
    record = [(h, hosts.HelloRecord([], "v1", 1, cloud.bus.replica_id, f"s-{h}")) for h, _ in made]
    await cloud.store.write_on_loop(lambda session: hosts.record_hellos(session, now, record))
    for host_id, connected in made:
        if not connected:
            assert await hosts.disconnected(cloud.store, host_id, f"s-{host_id}")
    return sorted(made)


@contextmanager
def loaded_hosts() -> Iterator[list[str]]:
    """Ids of the host rows loaded (by any session, in any thread) inside the block."""
    ids: list[str] = []
    lock = threading.Lock()

    def on_load(row: HostRow, _context: Any) -> None:
        with lock:
            ids.append(row.host_id)

    event.listen(HostRow, "load", on_load)
    try:
        yield ids
    finally:
        event.remove(HostRow, "load", on_load)
