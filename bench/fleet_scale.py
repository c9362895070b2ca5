"""Fleet scale: many hosts on one replica at the default renewal interval, and replicas that add up.

Part 1 (`scale`): N simulated hosts (full: as many as `--hosts`, 10,000 asked by issue 21), one
mTLS stream each, hold a lease on one PostgreSQL-backed replica and renew every `interval` s
(the default renewal interval, a third of a 30 s lease) with progress; one host in ten is "hot"
(a new step on every renewal, its summary stamped with the time it was sent) and a fleet-wide
`WatchProgress` watcher times how long after the send each hot step reaches it. Figures: renewals
acknowledged, p50/p99, refusals (a refused renewal = a lost lease), cloud RSS, cloud CPU per 1,000
renewals, watcher delay p50/p99, and what the database did (its CPU, WAL bytes, commits).

Part 2 (`replicas`): the same closed-loop load (hosts renewing as fast as they are acknowledged)
against one replica and, with as many other hosts split between them, against two replicas on
the same PostgreSQL: renewals/s of each, with the database's CPU, WAL and connections beside
them. All three replicas and both sets of hosts stay up; the phases alternate (one, two, two,
one, one, two in the full run) so that drift in the machine's load reaches both alike.

The replicas are pinned to CPU 0 (`taskset`), the simulated hosts to CPU 1 when the machine has
two CPUs; PostgreSQL is not pinned (it shares both).

    python -m bench.fleet_scale [--smoke] [--hosts N] [--interval S] [--duration S]
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from amc.v1 import progress_service_pb2
from bench import command, cpu_quota, resources
from bench.cloud_client import operator, submit_many
from bench.procstat import cpu_seconds, rss_kb
from bench.report import Section, percentile
from bench.servers import ServerProcess, server_process
from bench.sim_hosts import Fleet, WorkerConfig, host_ids, sent_at, split

SERVER_CPUS = "0"
HOST_CPUS = frozenset({1})
#: The share of CPU 0 each replica gets in the replicas part (`bench.cpu_quota`): two replicas
#: then use at most 0.8 of it, as two small machines would, and the hosts keep CPU 1.
REPLICA_CPUS = 0.4


@dataclass(slots=True)
class Sizes:
    hosts: int
    workers: int
    interval: float
    duration: float
    sat_hosts: int
    sat_duration: float
    hot_every: int = 10
    #: Closed-loop phases of one and of two replicas, alternated.
    rounds: int = 1


FULL = Sizes(
    hosts=10_000,
    workers=4,
    interval=10.0,
    duration=60.0,
    sat_hosts=400,
    sat_duration=15.0,
    rounds=3,
)
SMOKE = Sizes(hosts=20, workers=1, interval=1.0, duration=2.0, sat_hosts=10, sat_duration=1.0)


class Database:
    """What the benchmark's PostgreSQL did: its processes' CPU, WAL written, commits."""

    def __init__(self, url: str) -> None:
        self.dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert pid is not None
            # While the connection is open: its backend process exits with it.
            self.postmaster = _ppid(int(pid[0]))

    def cpu(self) -> float:
        """CPU seconds of the postmaster and its live children (backends, WAL writer...)."""
        total = 0.0
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError):
                    pid = int(entry.name)
                    if pid == self.postmaster or _ppid(pid) == self.postmaster:
                        total += cpu_seconds(pid)
        return total

    def stats(self) -> tuple[int, int, int, int, int]:
        """(WAL position in bytes, commits in this database, connections to it, row updates of
        `attempts` and `tasks`, of which HOT: in place, no index touched)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, xact_commit, "
                "numbackends, (SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables "
                "WHERE relname IN ('attempts', 'tasks')), (SELECT coalesce(sum(n_tup_hot_upd), 0) "
                "FROM pg_stat_user_tables WHERE relname IN ('attempts', 'tasks')) "
                "FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4])


def _ppid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


@dataclass(slots=True)
class Window:
    """CPU and database counters over one measured window."""

    seconds: float
    cloud_cpu: float = 0.0
    db_cpu: float = 0.0
    wal_bytes: int = 0
    commits: int = 0
    connections: int = 0
    #: Row updates of `attempts` and `tasks`, and how many of them were HOT (in place).
    updates: int = 0
    hot_updates: int = 0
    rss_kib: list[int] = field(default_factory=list)
    #: CPU-seconds of the simulated hosts' worker processes (when their pids were given).
    hosts_cpu: float = 0.0


@contextlib.contextmanager
def _window(
    servers: list[ServerProcess],
    db: Database,
    start: float,
    seconds: float,
    hosts: Sequence[int] = (),
) -> Iterator[Window]:
    """Sample the servers, the database and the `hosts` worker processes at `start` and
    `start + seconds` (a thread)."""
    w = Window(seconds)
    marks: list[tuple[float, float, tuple[int, int, int, int, int]]] = []
    host_marks: list[float] = []

    def sample() -> None:
        for at in (start, start + seconds):
            time.sleep(max(0.0, at - time.time()))
            marks.append((sum(cpu_seconds(s.pid) for s in servers), db.cpu(), db.stats()))
            host_marks.append(sum(cpu_seconds(pid) for pid in hosts))

    sampler = threading.Thread(target=sample)
    sampler.start()
    yield w
    sampler.join()
    (c0, d0, (wal0, com0, _, upd0, hot0)), (c1, d1, (wal1, com1, conns, upd1, hot1)) = marks
    w.cloud_cpu, w.db_cpu = c1 - c0, d1 - d0
    w.wal_bytes, w.commits, w.connections = wal1 - wal0, com1 - com0, conns
    w.updates, w.hot_updates = upd1 - upd0, hot1 - hot0
    w.rss_kib = [rss_kb(s.pid) for s in servers]
    w.hosts_cpu = host_marks[1] - host_marks[0]


class Watcher:
    """A fleet-wide WatchProgress stream (batched, as the console's gateway asks for it) in its
    own thread, timing hot hosts' stamped steps."""

    def __init__(self, address: str, pki_dir: Path, snapshot: int) -> None:
        #: (when the host sent the step, seconds until it reached the watcher), time.time().
        self.delays: list[tuple[float, float]] = []
        #: Seconds from the call to the last of the `snapshot` tasks it starts with.
        self.snapshot_s = math.nan
        self._expected = snapshot
        self._snapshot_done = threading.Event()
        self._address, self._pki = address, pki_dir
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._call: Any = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Watcher:
        """Once the watcher has its snapshot: what is timed is live progress, not the snapshot."""
        self._thread.start()
        self._ready.wait(30)
        self._snapshot_done.wait(300)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._call is not None:
            self._loop.call_soon_threadsafe(self._call.cancel)
        self._thread.join(30)

    async def _run(self) -> None:
        client = operator(self._address, self._pki)
        self._loop = asyncio.get_running_loop()
        self._call = client.progress.WatchProgress(
            progress_service_pb2.WatchProgressRequest(batched=True)
        )
        self._ready.set()
        t0, seen = time.monotonic(), 0
        try:
            async for msg in self._call:
                if msg.snapshot:
                    seen += len(msg.tasks)
                    if seen >= self._expected and not self._snapshot_done.is_set():
                        self.snapshot_s = time.monotonic() - t0
                        self._snapshot_done.set()
                    continue
                now = time.time()
                for task in msg.tasks:
                    at = sent_at(task.progress.summary)
                    if at is not None:
                        self.delays.append((at, now - at))
        except asyncio.CancelledError:
            pass  # __exit__ cancelled the call
        finally:
            await client.close()


def _fleet(addresses: list[str], pki_dir: Path, ids: list[str], sizes: Sizes, pin: bool) -> Fleet:
    workers = max(len(addresses), sizes.workers)
    return Fleet(
        [
            WorkerConfig(
                i,
                "grpc",
                addresses[i % len(addresses)],
                pki_dir,
                chunk,
                step_every=1_000_000,  # cold hosts repeat their progress
                hot_every=sizes.hot_every,
                cpus=HOST_CPUS if pin else None,
                connect_concurrency=128,
            )
            for i, chunk in enumerate(split(ids, workers))
        ]
    )


def _cloud(url: str, pki_dir: Path, pin: bool) -> contextlib.AbstractContextManager[ServerProcess]:
    return server_process(
        "cloud", "--db", url, "--pki", str(pki_dir), cpus=SERVER_CPUS if pin else ""
    )


def scale(section: Section, url: str, pki_dir: Path, sizes: Sizes, pin: bool) -> None:
    """Part 1: N hosts on one replica at the default interval, a watcher timing hot steps."""
    ids = host_ids(sizes.hosts, "fleet")
    db = Database(url)
    with _cloud(url, pki_dir, pin) as cloud:
        fleet = _fleet([cloud.address], pki_dir, ids, sizes, pin)
        try:
            t0 = time.monotonic()
            fleet.start(timeout=900)
            connect_s = time.monotonic() - t0
            asyncio.run(submit_many(cloud.address, pki_dir, fleet.connected))
            leases = fleet.wait_assigned(timeout=900)
            rss_idle = rss_kb(cloud.pid)
            with Watcher(cloud.address, pki_dir, len(leases)) as watcher:
                start = time.time() + 2.0
                with _window([cloud], db, start, sizes.duration) as w:
                    result = fleet.phase(start, sizes.duration, sizes.interval, sizes.hosts)
                time.sleep(1.0)  # the last hot steps reach the watcher
        finally:
            fleet.stop()
    acked = len(result.latencies)
    offered = len(leases) * sizes.duration / sizes.interval
    ms = [x * 1000 for x in result.latencies]
    delays = [d * 1000 for _, d in watcher.delays]
    # The phase's first interval is also the fleet's start: every task's first renewal turns it
    # RUNNING (news for every watcher), so 10x the steady rate of task changes reaches watchers.
    steady = [d * 1000 for at, d in watcher.delays if at >= start + sizes.interval]
    steady_ms = [
        x * 1000
        for x, at in zip(result.latencies, result.sent, strict=True)
        if at >= start + sizes.interval
    ]
    n = f"{len(leases):,} hosts"
    section.add(
        "scale: hosts connected with a lease",
        len(leases),
        "",
        note=(
            f"of {sizes.hosts:,}; connected in {connect_s:.0f} s; failed to connect {fleet.failed}"
        ),
    )
    section.add(
        "scale: renewals acknowledged",
        acked,
        "",
        note=f"{n} every {sizes.interval:g} s for {sizes.duration:g} s: ~{offered:,.0f} offered",
    )
    section.add(
        "scale: renewals refused or failed", result.errors, "", note="a refusal = a lost lease"
    )
    section.add("scale: ack p50", round(percentile(ms, 50), 2), "ms")
    section.add(
        "scale: ack p99",
        round(percentile(ms, 99), 2),
        "ms",
        note="target < 100 ms: " + ("met" if percentile(ms, 99) < 100 else "NOT met"),
    )
    section.add(
        "scale: ack p99 after the first interval",
        round(percentile(steady_ms, 99), 2),
        "ms",
        note=f"{len(steady_ms):,} renewals; the first {sizes.interval:g} s are the fleet's start, "
        "where every renewal is its attempt's first and must be written (it turns the attempt "
        "RUNNING): ~10x the steady rate of writes",
    )
    section.add(
        "scale: cloud RSS",
        round(w.rss_kib[0] / 1024, 1),
        "MiB",
        baseline=round(rss_idle / 1024, 1),
        baseline_name="same hosts before the phase",
        note="target < 1,536 MiB: " + ("met" if w.rss_kib[0] < 1536 * 1024 else "NOT met"),
    )
    section.add(
        "scale: cloud CPU-s / 1,000 renewals",
        round(w.cloud_cpu / acked * 1000, 3) if acked else math.nan,
        "s",
        note=f"cloud CPU {w.cloud_cpu / w.seconds:.0%} of one core",
    )
    section.add(
        "scale: progress → watcher p50",
        round(percentile(delays, 50), 1),
        "ms",
        note=f"{len(delays):,} hot steps seen; the watcher's snapshot of {len(leases):,} tasks "
        f"took {watcher.snapshot_s:.1f} s before the phase",
    )
    section.add(
        "scale: progress → watcher p99",
        round(percentile(delays, 99), 1),
        "ms",
        note="target < 1,000 ms: " + ("met" if percentile(delays, 99) < 1000 else "NOT met"),
    )
    section.add(
        "scale: progress → watcher p99 after the first interval",
        round(percentile(steady, 99), 1),
        "ms",
        note=f"{len(steady):,} hot steps; in the first {sizes.interval:g} s every task's first "
        "renewal also turns it RUNNING (the fleet's start), a change each watcher shows",
    )
    section.add(
        "scale: database CPU",
        round(w.db_cpu / w.seconds * 100, 1),
        "% of a core",
        note=f"WAL {w.wal_bytes / w.seconds / 1024:,.0f} KiB/s, {w.commits / w.seconds:,.0f} "
        f"commits/s, {w.connections} connections; {w.updates:,} row updates of attempts and "
        f"tasks, {w.hot_updates / max(1, w.updates):.0%} of them HOT (in place, no index entry)",
    )


@dataclass(slots=True)
class _Setup:
    """Replicas on the benchmark's PostgreSQL with their closed-loop hosts connected."""

    clouds: list[ServerProcess]
    fleet: Fleet
    hosts: int


def _setup(
    stack: contextlib.ExitStack,
    url: str,
    pki_dir: Path,
    ids: list[str],
    sizes: Sizes,
    pin: bool,
    quota: float | None,
    replicas: int,
) -> _Setup:
    """`replicas` replicas, each under a CPU `quota` when given, and `ids` connected to them."""
    clouds = [stack.enter_context(_cloud(url, pki_dir, pin)) for _ in range(replicas)]
    if quota is not None:
        for i, c in enumerate(clouds):
            stack.enter_context(cpu_quota.limited(c.pid, quota, f"replicas{replicas}-{i}"))
    fleet = _fleet([c.address for c in clouds], pki_dir, ids, sizes, pin)
    stack.callback(fleet.stop)
    fleet.start(timeout=300)
    return _Setup(clouds, fleet, len(ids))


def _sat(setup: _Setup, db: Database, sizes: Sizes) -> tuple[list[float], Window]:
    """One closed-loop phase of `setup`'s hosts: acknowledgement latencies (s) and the window."""
    start = time.time() + 2.0
    with _window(setup.clouds, db, start, sizes.sat_duration, setup.fleet.pids) as w:
        result = setup.fleet.phase(start, sizes.sat_duration, 0.0, setup.hosts)
    return result.latencies, w


def _pooled(phases: list[tuple[list[float], Window]]) -> tuple[float, float, Window]:
    """(renewals/s, p99 ms, the windows summed) over `phases`."""
    ms = [x * 1000 for latencies, _ in phases for x in latencies]
    windows = [w for _, w in phases]
    total = Window(
        sum(w.seconds for w in windows),
        cloud_cpu=sum(w.cloud_cpu for w in windows),
        db_cpu=sum(w.db_cpu for w in windows),
        wal_bytes=sum(w.wal_bytes for w in windows),
        commits=sum(w.commits for w in windows),
        connections=windows[-1].connections,
        rss_kib=windows[-1].rss_kib,
        hosts_cpu=sum(w.hosts_cpu for w in windows),
    )
    return len(ms) / total.seconds, percentile(ms, 99), total


def replicas(section: Section, pki_dir: Path, sizes: Sizes, pin: bool) -> None:
    """Part 2: one replica and two on one PostgreSQL, each with its own closed-loop hosts, all
    connected throughout; their phases alternate (one, two, two, one, …) so that drift in the
    machine's load reaches both alike."""
    ids = {n: host_ids(sizes.sat_hosts, f"repl{n}-") for n in (1, 2)}
    resources.pki([*ids[1], *ids[2]])
    quota = REPLICA_CPUS if pin and cpu_quota.available() else None
    url = resources.postgres_url()
    db = Database(url)
    phases: dict[int, list[tuple[list[float], Window]]] = {1: [], 2: []}
    with contextlib.ExitStack() as stack:
        setups = {n: _setup(stack, url, pki_dir, ids[n], sizes, pin, quota, n) for n in (1, 2)}
        connected = sum(s.fleet.connected for s in setups.values())
        asyncio.run(submit_many(setups[1].clouds[0].address, pki_dir, connected))
        for s in setups.values():
            s.fleet.wait_assigned(timeout=300)
        for r in range(sizes.rounds):
            for n in (1, 2) if r % 2 == 0 else (2, 1):
                phases[n].append(_sat(setups[n], db, sizes))
    one, two = _pooled(phases[1]), _pooled(phases[2])
    by_round = ", ".join(
        f"x{len(b[0]) / len(a[0]):.2f}" for a, b in zip(phases[1], phases[2], strict=True) if a[0]
    )
    for label, (per_s, p99, w) in (("one replica", one), ("two replicas", two)):
        section.add(
            f"replicas: {label}, closed-loop renewals/s",
            round(per_s, 1),
            "/s",
            baseline=round(one[0], 1),
            baseline_name="one replica",
            note=(f"by round {by_round}; " if label == "two replicas" and sizes.rounds > 1 else "")
            + f"p99 {p99:,.0f} ms; replicas' CPU {w.cloud_cpu / w.seconds:.0%} of one core"
            + (f" (each at most {quota:.0%}: a CFS quota)" if quota is not None else "")
            + f"; RSS {' + '.join(f'{k / 1024:,.0f}' for k in w.rss_kib)} MiB; "
            f"database CPU {w.db_cpu / w.seconds:.0%}, WAL {w.wal_bytes / w.seconds / 1024:,.0f} "
            f"KiB/s, {w.commits / w.seconds:,.0f} commits/s, {w.connections} connections; "
            f"the simulated hosts' CPU {w.hosts_cpu / w.seconds:.0%} of one core"
            + (f" (theirs: CPU {','.join(map(str, sorted(HOST_CPUS)))})" if pin else ""),
        )
    per_s, _, w = two
    renewals = per_s * w.seconds
    if renewals and w.db_cpu > 0:
        db_cpu_per_k = w.db_cpu / renewals * 1000
        section.add(
            "replicas: database CPU-s / 1,000 renewals",
            round(db_cpu_per_k, 3),
            "s",
            note=f"WAL {w.wal_bytes / renewals:,.0f} B and {w.commits / renewals:.2f} commits per "
            f"renewal (two replicas): one database core is used up near "
            f"{1000 / db_cpu_per_k:,.0f} renewals/s of this mix (1 host in "
            f"{sizes.hot_every} changing progress), and each replica holds up to 33 connections "
            "(pool 10 + 20 overflow, LISTEN, the renewal batches' own two)",
        )


def run(
    smoke: bool,
    hosts: int | None = None,
    interval: float | None = None,
    duration: float | None = None,
    parts: tuple[str, ...] = ("scale", "replicas"),
) -> Section:
    sizes = SMOKE if smoke else FULL
    sizes = replace(
        sizes,
        hosts=hosts or sizes.hosts,
        interval=interval or sizes.interval,
        duration=duration or sizes.duration,
    )
    pin = len(os.sched_getaffinity(0)) > 1
    t0 = time.monotonic()
    section = Section(
        "fleet_scale",
        "Fleet scale (PostgreSQL)",
        f"{sizes.hosts:,} hosts renewing every {sizes.interval:g} s for {sizes.duration:g} s, one "
        f"in {sizes.hot_every} changing progress every renewal; then {sizes.sat_hosts} hosts "
        f"closed-loop against one replica and {sizes.sat_hosts} others against two, "
        f"{sizes.rounds} x {sizes.sat_duration:g} s each, alternated",
    )
    pki_dir = resources.pki(host_ids(sizes.hosts, "fleet"))
    if "scale" in parts:
        scale(section, resources.postgres_url(), pki_dir, sizes, pin)
    if "replicas" in parts:
        replicas(section, pki_dir, sizes, pin)
    section.notes.append(
        "Leases are an hour long (as in the lease benchmark) so that connecting the fleet, which "
        "takes minutes here, does not expire them before the phase; renewals then go every "
        f"{sizes.interval:g} s, and a renewal that changes nothing is answered from a read "
        "(decision 0070)."
        + (
            " Replicas pinned to CPU 0, simulated hosts to CPU 1 (taskset / sched_setaffinity); "
            "PostgreSQL and the benchmark's own watcher unpinned."
            if pin
            else ""
        )
        + (
            f" In the replicas part each replica runs under a CFS quota of {REPLICA_CPUS:.0%} of "
            "a CPU (its own cgroup, `bench/cpu_quota.py`): a small machine per replica, so that "
            "two replicas have twice the CPU of one on a machine with two cores."
            if pin and cpu_quota.available() and "replicas" in parts
            else (
                " No writable cgroup cpu controller: the replicas share CPU 0 and cannot show "
                "that they add up."
                if "replicas" in parts
                else ""
            )
        )
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--interval", type=float)
    parser.add_argument("--duration", type=float)
    parser.add_argument("--part", action="append", choices=["scale", "replicas"])
    args = parser.parse_args(argv)
    return command.print_figures(
        lambda: run(
            args.smoke,
            args.hosts,
            args.interval,
            args.duration,
            tuple(args.part) if args.part else ("scale", "replicas"),
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
