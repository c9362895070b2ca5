"""Dispatch burst: tasks already queued, then as many hosts connect at once.

The cloud runs in its own process (SQLite, then PostgreSQL), pinned to CPU 0 when there are two;
N tasks are submitted before any host is connected, then N simulated hosts (own certificates, own
streams, one phone each; this process, pinned to CPU 1) connect as fast as they can. Figures:
every task assigned exactly once (each host reports the one assignment it got; none twice, none
missing), the connect spread (first to last hello), and how long after the last hello the last
assignment arrived. Baseline in the same run: the connect spread itself.

The burst runs again with a backlog queued first: tasks targeted at a host that is not
connected (a batch for one lab's phone that is offline), older than the burst's own. Every
claim of the burst must pass over them (migration 0015); baseline: the burst without them.

    python -m bench.dispatch_burst [--smoke] [--tasks N] [--backlog N] [--pool-size N]
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import command, resources
from bench.cloud_client import submit_many
from bench.report import Section
from bench.servers import async_server_process
from bench.sim_hosts import GrpcHost, host_ids

SERVER_CPUS = "0"
HOST_CPUS = {1}


@dataclass(slots=True)
class Burst:
    """One burst against one store."""

    tasks: int
    hosts: int
    assigned: int
    distinct: int
    hello_spread_s: float
    last_after_last_hello_s: float
    last_after_first_hello_s: float
    #: Tasks queued before the burst for a host that never connects.
    backlog: int = 0


async def _host(h: GrpcHost, gate: asyncio.Semaphore) -> None:
    async with gate:
        await asyncio.wait_for(h.connect(), 120)
    await asyncio.wait_for(h.wait_assignment(), 120)


ABSENT_HOST = "burst-absent"


async def burst(
    url: str, pki_dir: Path, ids: list[str], pin: bool, backlog: int = 0, pool_size: int = 0
) -> Burst:
    """Queue `backlog` tasks for a host that never connects, then len(ids) tasks for any host;
    connect len(ids) hosts at once, wait for every assignment. `pool_size`: the replica's
    `AMC_CLOUD_DATABASE_POOL_SIZE` (0: its default)."""
    pool = ["--pool-size", str(pool_size)] if pool_size else []
    async with async_server_process(
        "cloud", "--db", url, "--pki", str(pki_dir), *pool, cpus=SERVER_CPUS if pin else ""
    ) as server:
        if backlog:
            await submit_many(server.address, pki_dir, backlog, target_host=ABSENT_HOST)
        queued = await submit_many(server.address, pki_dir, len(ids))
        hosts = [GrpcHost(h, server.address, pki_dir) for h in ids]
        gate = asyncio.Semaphore(128)
        try:
            got = await asyncio.gather(*(_host(h, gate) for h in hosts), return_exceptions=True)
        finally:
            await asyncio.gather(*(h.close() for h in hosts), return_exceptions=True)
        failed = [g for g in got if isinstance(g, BaseException)]
        if failed:
            raise RuntimeError(f"{len(failed)} hosts failed, first: {failed[0]!r}")
    tasks = Counter(h.lease[0] for h in hosts if h.lease is not None)
    assert set(tasks) <= set(queued)
    hellos = [h.hello_at for h in hosts]
    last = max(h.assigned_at for h in hosts)
    return Burst(
        tasks=len(queued),
        hosts=len(hosts),
        assigned=sum(tasks.values()),
        distinct=len(tasks),
        hello_spread_s=max(hellos) - min(hellos),
        last_after_last_hello_s=last - max(hellos),
        last_after_first_hello_s=last - min(hellos),
        backlog=backlog,
    )


def run(
    smoke: bool, tasks: int | None = None, backlog: int | None = None, pool_size: int = 0
) -> Section:
    """`pool_size`: the PostgreSQL replica's `AMC_CLOUD_DATABASE_POOL_SIZE` (0: its default)."""
    n = tasks or (20 if smoke else 1000)
    queued_elsewhere = backlog if backlog is not None else (200 if smoke else 10_000)
    pin = len(os.sched_getaffinity(0)) > 1
    t0 = time.monotonic()
    section = Section(
        "dispatch_burst",
        "Dispatch burst",
        f"{n} tasks queued, then {n} hosts (one phone each) connect at once; then the same "
        f"with {queued_elsewhere:,} older tasks queued for a host that is not connected",
    )
    ids = host_ids(n, "burst")
    pki_dir = resources.pki(ids)
    before = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, HOST_CPUS)
    try:
        with tempfile.TemporaryDirectory(prefix="amc-bench-burst-") as tmp:

            def sqlite(name: str) -> str:
                return f"sqlite+aiosqlite:///{Path(tmp) / name}"

            def postgres(name: str) -> str:  # a new database for each burst, whatever the name
                return resources.postgres_url()

            stores: list[tuple[str, Callable[[str], str]]] = [("SQLite", sqlite)]
            if not smoke:
                stores.append(("PostgreSQL", postgres))
            for label, fresh in stores:
                pool = pool_size if label == "PostgreSQL" else 0
                b = asyncio.run(burst(fresh("plain.sqlite3"), pki_dir, ids, pin, 0, pool))
                _add(section, label, b)
                if queued_elsewhere:
                    db = fresh("backlog.sqlite3")
                    c = asyncio.run(burst(db, pki_dir, ids, pin, queued_elsewhere, pool))
                    _add(section, label, c, plain=b)
    finally:
        os.sched_setaffinity(0, before)
    section.notes.append(
        "Hosts connect 128 at a time (TLS handshake, hello); the tasks are queued before the "
        "first hello, so every hello finds work. The backlog's tasks are targeted at a host "
        "that never connects, and queued before the burst's (so they are the oldest)."
        + (" Cloud pinned to CPU 0, hosts to CPU 1; PostgreSQL unpinned." if pin else "")
    )
    section.seconds = time.monotonic() - t0
    return section


def _add(section: Section, label: str, b: Burst, plain: Burst | None = None) -> None:
    """The rows of one burst (with a backlog: compared with the `plain` burst's)."""
    if b.backlog:
        label = f"{label} with {b.backlog:,} queued for another host:"
    once = "met" if b.assigned == b.distinct == b.tasks else "NOT met"
    section.add(
        f"{label} tasks assigned (distinct)",
        b.distinct,
        "",
        note=f"{b.assigned} assignments for {b.tasks} tasks: exactly once {once}",
    )
    target = "target < 2,000 ms: " + ("met" if b.last_after_last_hello_s < 2 else "NOT met")
    if plain is None:
        section.add(
            f"{label} last assignment after the last hello",
            round(b.last_after_last_hello_s * 1000, 1),
            "ms",
            baseline=round(b.hello_spread_s * 1000, 1),
            baseline_name="hello spread (first → last)",
            note=target,
        )
    else:
        section.add(
            f"{label} last assignment after the last hello",
            round(b.last_after_last_hello_s * 1000, 1),
            "ms",
            baseline=round(plain.last_after_last_hello_s * 1000, 1),
            baseline_name="without the backlog",
            note=f"{target}; hello spread {b.hello_spread_s * 1000:,.0f} ms",
        )
    section.add(
        f"{label} last assignment after the first hello",
        round(b.last_after_first_hello_s * 1000, 1),
        "ms",
        baseline=None if plain is None else round(plain.last_after_first_hello_s * 1000, 1),
        baseline_name="" if plain is None else "without the backlog",
    )


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--backlog", type=int, help="tasks queued for an absent host first")
    parser.add_argument(
        "--pool-size", type=int, default=0, help="the PostgreSQL replica's pool ceiling"
    )
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke, args.tasks, args.backlog, args.pool_size))


if __name__ == "__main__":
    raise SystemExit(main())
