"""Dispatch burst: tasks already queued, then as many hosts connect at once.

The cloud runs in its own process (SQLite, then PostgreSQL), pinned to CPU 0 when there are two;
N tasks are submitted before any host is connected, then N simulated hosts (own certificates, own
streams, one phone each; this process, pinned to CPU 1) connect as fast as they can. Figures:
every task assigned exactly once (each host reports the one assignment it got; none twice, none
missing), the connect spread (first to last hello), and how long after the last hello the last
assignment arrived. Baseline in the same run: the connect spread itself.

    python -m bench.dispatch_burst [--smoke] [--tasks N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench import resources
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


async def _host(h: GrpcHost, gate: asyncio.Semaphore) -> None:
    async with gate:
        await asyncio.wait_for(h.connect(), 120)
    await asyncio.wait_for(h.wait_assignment(), 120)


async def burst(url: str, pki_dir: Path, ids: list[str], pin: bool) -> Burst:
    """Queue len(ids) tasks, connect len(ids) hosts at once, wait for every assignment."""
    async with async_server_process(
        "cloud", "--db", url, "--pki", str(pki_dir), cpus=SERVER_CPUS if pin else ""
    ) as server:
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
    )


def run(smoke: bool, tasks: int | None = None) -> Section:
    n = tasks or (20 if smoke else 1000)
    pin = len(os.sched_getaffinity(0)) > 1
    t0 = time.monotonic()
    section = Section(
        "dispatch_burst",
        "Dispatch burst",
        f"{n} tasks queued, then {n} hosts (one phone each) connect at once",
    )
    ids = host_ids(n, "burst")
    pki_dir = resources.pki(ids)
    before = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, HOST_CPUS)
    try:
        with tempfile.TemporaryDirectory(prefix="amc-bench-burst-") as tmp:
            stores = [("SQLite", f"sqlite+aiosqlite:///{Path(tmp) / 'cloud.sqlite3'}")]
            if not smoke:
                stores.append(("PostgreSQL", resources.postgres_url()))
            for label, url in stores:
                b = asyncio.run(burst(url, pki_dir, ids, pin))
                once = "met" if b.assigned == b.distinct == b.tasks else "NOT met"
                section.add(
                    f"{label} tasks assigned (distinct)",
                    b.distinct,
                    "",
                    note=f"{b.assigned} assignments for {b.tasks} tasks: exactly once {once}",
                )
                section.add(
                    f"{label} last assignment after the last hello",
                    round(b.last_after_last_hello_s * 1000, 1),
                    "ms",
                    baseline=round(b.hello_spread_s * 1000, 1),
                    baseline_name="hello spread (first → last)",
                    note="target < 2,000 ms: "
                    + ("met" if b.last_after_last_hello_s < 2 else "NOT met"),
                )
                section.add(
                    f"{label} last assignment after the first hello",
                    round(b.last_after_first_hello_s * 1000, 1),
                    "ms",
                )
    finally:
        os.sched_setaffinity(0, before)
    section.notes.append(
        "Hosts connect 128 at a time (TLS handshake, hello); the tasks are queued before the "
        "first hello, so every hello finds work."
        + (" Cloud pinned to CPU 0, hosts to CPU 1; PostgreSQL unpinned." if pin else "")
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--tasks", type=int)
    args = parser.parse_args(argv)
    try:
        print(run(args.smoke, args.tasks).text())
    finally:
        resources.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
