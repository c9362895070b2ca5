"""Fleet watch: what one WatchHosts snapshot reads, the whole fleet's or one page's (issue 21).

N hosts (10,000 full, as issue 21 asks of one replica) are written into a PostgreSQL store
migrated to head, one in ten connected. Then, alternated round by round so drift falls on
all alike, each way of reading a snapshot (rows, their busy phones, the API's Host messages):

- before: `hosts.list_hosts` of the whole fleet, every row loaded and sorted in Python, what
  every WatchHosts call read before watches could be scoped (a console tab among them);
- a watch without scope now: the whole fleet all the same, by id in pages of 500 (ListHosts'
  query, on its index);
- a scoped watch, as the fleet page asks for it: one page of 50, the first page and one deep
  in the fleet, of any host and of the connected ones.

Figures: wall time per snapshot (median), host rows loaded, and the plan PostgreSQL picks for
a page. A scoped watch also carries only the changes of its page's range of ids (50 hosts of
10,000), which is counted, not timed: `cloud/services/fleet_service.py`.

    python -m bench.fleet_watch [--smoke] [--hosts N]
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import event, update

from amc.v1 import types_pb2
from bench import command, hello_rows, resources
from bench.report import Section
from cloud.store import convert, hosts, leases
from cloud.store.database import Store
from cloud.store.engine import upgrade
from cloud.store.models import HostRow

#: Hosts on one page of the console's fleet page (console/gateway/pages.py FLEET_PAGE).
PAGE = 50
#: Rows per query of a snapshot without scope (FleetService's MAX_PAGE).
CHUNK = 500
#: A heartbeat long enough that hosts written at the start still count as connected.
HEARTBEAT_S = 3600.0


class _Loaded:
    """How many host rows were loaded since the last `take`."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, _row: HostRow, _context: Any) -> None:
        with self._lock:
            self.count += 1

    def take(self) -> int:
        with self._lock:
            count, self.count = self.count, 0
        return count


async def _present(store: Store, rows: list[tuple[HostRow, bool]]) -> list[types_pb2.Host]:
    """Rows as WatchHosts sends them: with their busy phones (FleetServicer._hosts)."""
    busy = await leases.busy_phones(store, [row.host_id for row, _ in rows])
    now = store.now()
    return [convert.host(row, connected, busy.get(row.host_id), now) for row, connected in rows]


async def _fleet(store: Store, count: int) -> list[str]:
    """`count` hosts as hellos recorded them, every tenth still connected; their ids."""
    ids = [f"fleet-{i:05d}" for i in range(count)]
    phones = convert.device_dicts(
        [types_pb2.Device(serial="emu-1", model="amc phone", state=types_pb2.DEVICE_STATE_ONLINE)]
    )
    await hello_rows.record_hellos(store, ids, "bench", phones)
    async with store.write() as session:
        down = [h for i, h in enumerate(ids) if i % 10]
        await session.execute(
            update(HostRow).where(HostRow.host_id.in_(down)).values(connected=False)
        )
    await hello_rows.analyze_hosts(store)
    return ids


async def _plan(store: Store, read: Callable[[], Awaitable[Any]]) -> str:
    """PostgreSQL's plan of the host query `read` sends (its own SQL and parameters)."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM hosts" in statement and "LIMIT" in statement:
            seen.append((statement, params))

    event.listen(store.engine.sync_engine, "before_cursor_execute", capture)
    try:
        await read()
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", capture)
    statement, params = seen[0]
    async with store.read() as session:
        conn = await session.connection()
        found = await conn.exec_driver_sql("EXPLAIN " + statement, params)
        return "\n".join(str(line) for line in found.scalars())


async def _measure(count: int, rounds: int) -> tuple[dict[str, tuple[float, int, int]], str]:
    """Per way: (median ms per snapshot, host rows loaded, hosts sent); and a page's plan."""
    store = Store.from_url(resources.postgres_url())
    loaded = _Loaded()
    event.listen(HostRow, "load", loaded)
    try:
        await upgrade(store.engine)
        ids = await _fleet(store, count)
        deep = ids[len(ids) // 2]

        async def before() -> list[types_pb2.Host]:
            return await _present(store, await hosts.list_hosts(store, HEARTBEAT_S))

        async def unscoped() -> list[types_pb2.Host]:
            out: list[types_pb2.Host] = []
            after: str | None = None
            while True:
                page, more = await hosts.hosts_page(
                    store, HEARTBEAT_S, hosts.HostFilter(), CHUNK, after
                )
                out += await _present(store, page)
                if not more or not page:
                    return out
                after = page[-1][0].host_id

        def page_of(connection: str, after: str | None) -> Callable[[], Awaitable[Any]]:
            async def read() -> list[types_pb2.Host]:
                flt = hosts.HostFilter(connection=connection)
                page, _ = await hosts.hosts_page(store, HEARTBEAT_S, flt, PAGE, after)
                return await _present(store, page)

            return read

        ways: dict[str, Callable[[], Awaitable[list[types_pb2.Host]]]] = {
            "before: the whole fleet, sorted in Python": before,
            "unscoped now: the whole fleet, pages of 500": unscoped,
            f"scoped: first page of {PAGE}": page_of(hosts.ANY, None),
            f"scoped: page of {PAGE} mid-fleet": page_of(hosts.ANY, deep),
            f"scoped: first page of {PAGE} connected": page_of(hosts.CONNECTED, None),
            f"scoped: page of {PAGE} connected, mid-fleet": page_of(hosts.CONNECTED, deep),
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        rows: dict[str, int] = {}
        sent: dict[str, int] = {}
        for name, read in ways.items():  # warm-up, and the row counts
            loaded.take()
            sent[name] = len(await read())
            rows[name] = loaded.take()
        for _ in range(rounds):
            for name, read in ways.items():
                start = time.perf_counter()
                await read()
                times[name].append((time.perf_counter() - start) * 1000)
        plan = await _plan(store, ways[f"scoped: page of {PAGE} mid-fleet"])
        figures = {name: (statistics.median(times[name]), rows[name], sent[name]) for name in ways}
        return figures, plan
    finally:
        event.remove(HostRow, "load", loaded)
        await store.close()


def run(smoke: bool, count: int | None = None) -> Section:
    count = count or (300 if smoke else 10_000)
    rounds = 3 if smoke else 15
    t0 = time.monotonic()
    section = Section(
        "fleet_watch",
        "Fleet watch: one WatchHosts snapshot (PostgreSQL)",
        f"{count:,} hosts, one in ten connected; median of {rounds} rounds per way, alternated",
    )
    figures, plan = asyncio.run(_measure(count, rounds))
    base_ms, base_rows, _ = figures["before: the whole fleet, sorted in Python"]
    for name, (ms, rows, sent) in figures.items():
        section.add(
            f"{name}: time", round(ms, 2), "ms", baseline=round(base_ms, 2), baseline_name="before"
        )
        section.add(
            f"{name}: host rows loaded",
            rows,
            "rows",
            baseline=base_rows,
            baseline_name="before",
            note=f"{sent} hosts sent",
        )
    index = "ix_hosts_host_id_c" in plan
    section.add("a page's plan uses ix_hosts_host_id_c", "yes" if index else "no")
    section.notes.append(
        "One process, no gRPC: the store reads and Host messages a snapshot is made of "
        "(`hosts.list_hosts` as before; `hosts.hosts_page`, ListHosts' query, now), each with "
        "the busy-phone query and `convert.host`. A page's plan (EXPLAIN, mid-fleet): "
        + " / ".join(line.strip() for line in plan.splitlines())
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--hosts", type=int)
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke, args.hosts))


if __name__ == "__main__":
    raise SystemExit(main())
