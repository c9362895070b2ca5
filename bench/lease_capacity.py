"""Lease capacity: N simulated hosts, one mTLS Lease stream each, renewing with progress.

For each store (SQLite, PostgreSQL) the cloud runs in its own process; N hosts in a few worker
processes connect, each gets an assignment (N tasks are submitted), then:

* paced: every host renews once a second for `duration` s (the real workload) — renewals handled
  per second, acknowledgement latency p50/p99, cloud CPU-seconds per 1,000 renewals;
* saturated: `sat` hosts renew in a closed loop (next renewal as soon as the last is acked) — the
  most renewals per second this machine gets through the cloud;
* idle (`--idle`): every host connected and holding its lease, none renewing, the cloud's and the
  echo server's CPU read over the same seconds — what a replica spends per second whatever its
  renewals (heartbeats, dispatcher, sweeper, timers, pings, metrics), which the paced phase's
  CPU per renewal includes.

The same run measures two references on the same hosts and leases:
(a) the old design: FastAPI + uvicorn, a JSON POST per renewal, the same fenced UPDATE via the same
    store function, one transaction per renewal, driven by httpx;
(b) a bare grpc.aio bidirectional stream with the same mTLS and messages, no store: the ceiling.

The echo server and its hosts stay up beside each cloud, and the paced phase alternates between
the two (echo, cloud, cloud, echo, echo, cloud, … for `rounds` rounds) so that drift in this
machine's load reaches both alike; each figure pools its rounds, and the CPU row lists every
round's ratio.

    python -m bench.lease_capacity [--smoke] [--hosts N] [--duration S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bench import command, resources
from bench.cloud_client import submit_many
from bench.procstat import cpu_seconds
from bench.report import Section, percentile, ratio
from bench.servers import ServerProcess, server_process
from bench.sim_hosts import Fleet, Lease, WorkerConfig, host_ids, split


@dataclass(slots=True)
class Measured:
    """One or more phases against one server, pooled."""

    hosts: int
    per_s: float
    p50_ms: float
    p99_ms: float
    cpu_per_1000: float
    errors: int
    #: Each phase's CPU-s per 1,000 renewals, in the order measured (NaN for a short one).
    rounds: tuple[float, ...] = ()
    #: The short phases (`_Phase.short`): "round 2: 97.1 % acked", left out of `cpu_per_1000`.
    short: tuple[str, ...] = ()


#: A paced phase must see this share of its hosts' scheduled renewals acknowledged to count.
ACKED_ENOUGH = 0.997


@dataclass(slots=True)
class _Phase:
    """What one phase saw: acknowledgement latencies (s), the server's CPU-s, errors."""

    hosts: int
    seconds: float
    latencies: list[float]
    cpu: float
    errors: int
    #: Renewals the hosts send on schedule in a paced phase (each host one per interval); 0 for
    #: a closed loop, which has no schedule.
    expected: int = 0

    @property
    def short(self) -> bool:
        """Fewer than ACKED_ENOUGH of the scheduled renewals acknowledged. A host sends its
        next renewal only after the last is acknowledged, so a server that falls behind is
        sent fewer, in bigger batches, each cheaper: its CPU per renewal drops and the build
        looked cheaper than it is."""
        return self.expected > 0 and len(self.latencies) < ACKED_ENOUGH * self.expected

    @property
    def cpu_per_1000(self) -> float:
        if self.short or not self.latencies:
            return math.nan
        return self.cpu / len(self.latencies) * 1000


def _pooled(phases: list[_Phase]) -> Measured:
    """Rate and latencies over every phase (a short one only lowers the rate and raises p99,
    against the build); CPU per renewal over the phases that were not short."""
    latencies = [x * 1000 for p in phases for x in p.latencies]
    counted = [p for p in phases if not p.short]
    acked = sum(len(p.latencies) for p in counted)
    return Measured(
        hosts=phases[0].hosts,
        per_s=len(latencies) / sum(p.seconds for p in phases),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        cpu_per_1000=sum(p.cpu for p in counted) / acked * 1000 if acked else math.nan,
        errors=sum(p.errors for p in phases),
        rounds=tuple(p.cpu_per_1000 for p in phases),
        short=tuple(
            f"round {n}: {len(p.latencies) / p.expected:.1%} acked"
            for n, p in enumerate(phases, 1)
            if p.short
        ),
    )


@dataclass(slots=True)
class Sizes:
    hosts: int
    workers: int
    duration: float
    sat_hosts: int
    lead: float
    #: Paced phases of each server, alternated with the echo stream's (drift reaches both).
    rounds: int = 1
    #: Renewals per progress change in the simulated hosts (1 = a new step every renewal).
    step_every: int = 5
    #: Pin the servers under test to CPU 0 and the simulated hosts to CPU 1 (`taskset`).
    pin: bool = False
    #: Also measure the HTTP/JSON reference (the old design; minutes at full size, so the full
    #: run leaves it out since issue 21: `--http` brings it back; the smoke run keeps it).
    http: bool = True
    stores: tuple[str, ...] = ("SQLite", "PostgreSQL")
    #: Also measure `rounds` idle windows (`_idle`) after the paced phases.
    idle: bool = False


SERVER_CPUS = "0"
HOST_CPUS = frozenset({1})


FULL = Sizes(
    hosts=2000, workers=2, duration=15.0, sat_hosts=200, lead=2.0, rounds=3, pin=True, http=False
)
SMOKE = Sizes(hosts=12, workers=1, duration=1.0, sat_hosts=12, lead=0.3, stores=("SQLite",))


def _phase(
    fleet: Fleet, server: ServerProcess, sizes: Sizes, interval: float, active: int
) -> _Phase:
    workers = max(1, min(sizes.workers, fleet.size))
    per_worker = math.ceil(active / workers)
    start = time.time() + sizes.lead
    cpu: list[float] = []

    def sample() -> None:
        time.sleep(max(0.0, start - time.time()))
        cpu.append(cpu_seconds(server.pid))
        time.sleep(max(0.0, start + sizes.duration - time.time()))
        cpu.append(cpu_seconds(server.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    result = fleet.phase(start, sizes.duration, interval, per_worker)
    sampler.join()
    hosts = min(active, fleet.connected)
    return _Phase(
        hosts,
        sizes.duration,
        result.latencies,
        cpu[1] - cpu[0],
        result.errors,
        expected=round(hosts * sizes.duration / interval) if interval else 0,
    )


def _measure(
    fleet: Fleet, server: ServerProcess, sizes: Sizes, interval: float, active: int
) -> Measured:
    return _pooled([_phase(fleet, server, sizes, interval, active)])


Target = tuple[Fleet, ServerProcess]


def _alternated(echo: Target, ours: Target, sizes: Sizes) -> tuple[Measured, Measured]:
    """`sizes.rounds` paced phases of each, in the order echo, ours, ours, echo, echo, … (a
    drift in the machine's load that is linear in time reaches both alike)."""
    phases: dict[int, list[_Phase]] = {0: [], 1: []}
    targets = (echo, ours)
    for n in range(sizes.rounds):
        for which in (0, 1) if n % 2 == 0 else (1, 0):
            fleet, server = targets[which]
            phases[which].append(_phase(fleet, server, sizes, 1.0, fleet.connected))
    return _pooled(phases[0]), _pooled(phases[1])


@dataclass(slots=True)
class Idle:
    """Each idle window's server CPU (CPU-s per second of wall time), cloud and echo alike."""

    ours: tuple[float, ...]
    echo: tuple[float, ...]


def _idle(echo: Target, ours: Target, sizes: Sizes) -> Idle:
    """`sizes.rounds` windows of `sizes.duration` s in which both fleets stay connected and send
    nothing, both servers' CPU read at the same instants. Before each window every host of both
    fleets renews once (a 1 s paced phase, the fleets in alternated order), so no cloud lease
    comes near its expiry within the window (a lease is renewed with at least
    `renewal_write_below` of its length left, 25.5 of 30 s by default) and the sweeper has
    nothing to expire; `sizes.lead` s after that phase lets its batches' writes finish."""
    ours_cpu: list[float] = []
    echo_cpu: list[float] = []
    for n in range(sizes.rounds):
        for fleet, _ in (echo, ours) if n % 2 == 0 else (ours, echo):
            fleet.phase(time.time() + 0.2, 1.0, 1.0, fleet.connected)
        time.sleep(sizes.lead)
        before = (cpu_seconds(ours[1].pid), cpu_seconds(echo[1].pid), time.monotonic())
        time.sleep(sizes.duration)
        after = (cpu_seconds(ours[1].pid), cpu_seconds(echo[1].pid), time.monotonic())
        seconds = after[2] - before[2]
        ours_cpu.append((after[0] - before[0]) / seconds)
        echo_cpu.append((after[1] - before[1]) / seconds)
    return Idle(tuple(ours_cpu), tuple(echo_cpu))


def _idle_rows(section: Section, label: str, idle: Idle, hosts: int) -> None:
    """The idle CPU as a share of a core, and its excess over the echo's as CPU per renewal at
    the paced rate (one renewal per host per second): the part of the paced phase's excess
    that renewals do not cause."""
    ours = sum(idle.ours) / len(idle.ours)
    echo = sum(idle.echo) / len(idle.echo)
    by_round = ", ".join(
        f"{o * 100:.2f} vs {e * 100:.2f}" for o, e in zip(idle.ours, idle.echo, strict=True)
    )
    section.add(
        f"{label} idle CPU, % of a core",
        round(ours * 100, 2),
        "%",
        baseline=round(echo * 100, 2),
        baseline_name="bare gRPC echo",
        note=f"{hosts} hosts connected, none renewing; by round {by_round}",
    )
    section.add(
        f"{label} idle CPU above the echo's, per paced renewal",
        round((ours - echo) / hosts * 1e6, 2) if hosts else math.nan,
        "us",
        note=f"at {hosts} renewals/s (each host once a second)",
    )


def _grpc_fleet(address: str, pki_dir: Path, ids: list[str], sizes: Sizes) -> Fleet:
    return Fleet(
        [
            WorkerConfig(
                i,
                "grpc",
                address,
                pki_dir,
                chunk,
                step_every=sizes.step_every,
                cpus=HOST_CPUS if sizes.pin else None,
            )
            for i, chunk in enumerate(split(ids, sizes.workers))
        ]
    )


def _cpus(sizes: Sizes) -> str:
    return SERVER_CPUS if sizes.pin else ""


def _both(fleet: Fleet, server: ServerProcess, sizes: Sizes) -> tuple[Measured, Measured]:
    paced = _measure(fleet, server, sizes, 1.0, fleet.connected)
    sat = _measure(fleet, server, sizes, 0.0, sizes.sat_hosts)
    return paced, sat


@dataclass(slots=True)
class _Pair:
    """A cloud's paced and closed-loop figures with the echo stream's, measured beside them."""

    paced: Measured
    sat: Measured
    echo_paced: Measured
    echo_sat: Measured
    idle: Idle | None = None


def run_cloud(
    url: str, pki_dir: Path, ids: list[str], sizes: Sizes, echo: Target
) -> tuple[_Pair, dict[str, Lease]]:
    """Our cloud: connect, assign, then paced renewals alternated with the echo stream's
    (`_alternated`), then closed-loop renewals of each."""
    with server_process("cloud", "--db", url, "--pki", str(pki_dir), cpus=_cpus(sizes)) as server:
        fleet = _grpc_fleet(server.address, pki_dir, ids, sizes)
        try:
            fleet.start()
            asyncio.run(submit_many(server.address, pki_dir, fleet.connected))
            leases = fleet.wait_assigned()
            echo_paced, paced = _alternated(echo, (fleet, server), sizes)
            idle = _idle(echo, (fleet, server), sizes) if sizes.idle else None
            echo_sat = _measure(*echo, sizes, 0.0, sizes.sat_hosts)
            sat = _measure(fleet, server, sizes, 0.0, sizes.sat_hosts)
        finally:
            fleet.stop()
    return _Pair(paced, sat, echo_paced, echo_sat, idle), leases


def _scrape_every_second(url: str, stop: threading.Event) -> None:
    """What a Prometheus would do, far more often than its usual 15 s."""
    with httpx.Client(timeout=5) as client:
        while not stop.wait(1.0):
            client.get(url).raise_for_status()


def run_observability(db: Path, pki_dir: Path, ids: list[str], sizes: Sizes, mode: str) -> Measured:
    """Paced renewals against a fresh store with observability `mode` ("on": metrics recorded
    and scraped every second, every span traced through a batch exporter; "off": neither)."""
    url = f"sqlite+aiosqlite:///{db}"
    with server_process(
        "cloud", "--db", url, "--pki", str(pki_dir), "--observability", mode, cpus=_cpus(sizes)
    ) as server:
        fleet = _grpc_fleet(server.address, pki_dir, ids, sizes)
        stop = threading.Event()
        scraper = None
        if server.metrics_url:
            scraper = threading.Thread(target=_scrape_every_second, args=(server.metrics_url, stop))
            scraper.start()
        try:
            fleet.start()
            asyncio.run(submit_many(server.address, pki_dir, fleet.connected))
            fleet.wait_assigned()
            return _measure(fleet, server, sizes, 1.0, fleet.connected)
        finally:
            stop.set()
            if scraper is not None:
                scraper.join()
            fleet.stop()


def overhead(pki_dir: Path, ids: list[str], sizes: Sizes, rounds: int) -> Section:
    """Observability on vs off, alternated (off, on, off, on, …) so drift in the machine's load
    hits both alike; each run on its own fresh SQLite store."""
    section = Section(
        "observability_overhead",
        "Observability overhead",
        f"{len(ids)} hosts paced at 1 renewal/s for {sizes.duration:g} s, {rounds} runs each "
        "with metrics and tracing off and on, alternated, SQLite",
    )
    t0 = time.monotonic()
    runs: dict[str, list[Measured]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="amc-bench-obs-") as tmp:
        for i in range(rounds):
            for mode in ("off", "on"):
                runs[mode].append(
                    run_observability(Path(tmp) / f"{mode}-{i}.sqlite3", pki_dir, ids, sizes, mode)
                )
    off = sum(m.cpu_per_1000 for m in runs["off"]) / rounds
    on = sum(m.cpu_per_1000 for m in runs["on"]) / rounds
    section.add(
        "cloud CPU-s / 1,000 renewals, observability on",
        round(on, 3),
        "s",
        baseline=round(off, 3),
        baseline_name="off",
        note=f"{(on / off - 1) * 100:+.1f} % (target <= +5 %)" if off else "",
    )
    for mode in ("off", "on"):
        section.add(
            f"renewals acked /s, observability {mode}",
            round(sum(m.per_s for m in runs[mode]) / rounds, 1),
            "/s",
            note="runs: "
            + ", ".join(f"{m.cpu_per_1000:.3f}" for m in runs[mode])
            + " CPU-s/1,000"
            + "".join(f"; SHORT, left out: {'; '.join(m.short)}" for m in runs[mode] if m.short),
        )
    section.notes.append(
        "On: every metric recorded (renewal outcomes, batch latency, …), /metrics scraped every "
        "second, an SDK tracer provider with a batch span processor over an exporter that drops "
        "what it gets (a collector's network cost is not in the cloud process). Off: "
        "AMC_CLOUD_METRICS_ENABLED=false and no tracer provider. Renewals themselves are not "
        "traced (the Lease stream is excluded): tracing's share is the SubmitTask spans."
    )
    section.seconds = time.monotonic() - t0
    return section


def run_http(url: str, leases: dict[str, Lease], sizes: Sizes) -> tuple[Measured, Measured]:
    """The old design on the same store and the same (still live) leases."""
    ids = sorted(leases)
    with server_process("http", "--db", url, cpus=_cpus(sizes)) as server:
        fleet = Fleet(
            [
                WorkerConfig(
                    i,
                    "http",
                    server.address,
                    Path(),
                    chunk,
                    http_leases={h: leases[h] for h in chunk},
                    cpus=HOST_CPUS if sizes.pin else None,
                )
                for i, chunk in enumerate(split(ids, sizes.workers))
            ]
        )
        try:
            fleet.start()
            return _both(fleet, server, sizes)
        finally:
            fleet.stop()


@contextlib.contextmanager
def echo_stream(pki_dir: Path, ids: list[str], sizes: Sizes) -> Iterator[Target]:
    """The bare grpc.aio stream with its hosts connected, measured beside each cloud."""
    with server_process("echo", "--pki", str(pki_dir), cpus=_cpus(sizes)) as server:
        fleet = _grpc_fleet(server.address, pki_dir, ids, sizes)
        try:
            fleet.start()
            fleet.wait_assigned()
            yield fleet, server
        finally:
            fleet.stop()


def _rows(
    section: Section,
    label: str,
    ours: Measured,
    http: Measured | None,
    echo: Measured,
    what: str,
) -> None:
    """Each figure against the bare echo stream (the transport's own cost), and, when measured,
    the renewal rate against the old HTTP/JSON design."""
    hosts = f"{ours.hosts} hosts"
    if http is not None:
        section.add(
            f"{label} {what} renewals/s",
            round(ours.per_s, 1),
            "/s",
            baseline=round(http.per_s, 1),
            baseline_name="HTTP/JSON",
            note=f"{hosts}; HTTP CPU-s/1,000 {http.cpu_per_1000:.3f}, p99 {http.p99_ms:,.0f} ms",
        )
    section.add(
        f"{label} {what} renewals/s",
        round(ours.per_s, 1),
        "/s",
        baseline=round(echo.per_s, 1),
        baseline_name="bare gRPC echo",
        note=hosts,
    )
    for name, value, base in (
        ("ack p50", ours.p50_ms, echo.p50_ms),
        ("ack p99", ours.p99_ms, echo.p99_ms),
    ):
        section.add(
            f"{label} {what} {name}",
            round(value, 2),
            "ms",
            baseline=round(base, 2),
            baseline_name="bare gRPC echo",
        )
    rounds = ""
    if len(ours.rounds) > 1:
        ratios = ", ".join(
            "short" if math.isnan(r) else f"x{r:.2f}" for r in map(ratio, ours.rounds, echo.rounds)
        )
        rounds = f"; by round {ratios}"
    short = "".join(
        f"; SHORT, left out: {name} {'; '.join(m.short)}"
        for name, m in (("cloud", ours), ("echo", echo))
        if m.short
    )
    section.add(
        f"{label} {what} CPU-s / 1,000 renewals",
        round(ours.cpu_per_1000, 3),
        "s",
        baseline=round(echo.cpu_per_1000, 3),
        baseline_name="bare gRPC echo",
        note=f"errors {ours.errors}{rounds}{short}",
    )


def _sizes(
    smoke: bool,
    hosts: int | None,
    duration: float | None,
    *,
    step_every: int | None = None,
    pin: bool | None = None,
    http: bool | None = None,
    stores: tuple[str, ...] | None = None,
    rounds: int | None = None,
    idle: bool | None = None,
) -> Sizes:
    sizes = SMOKE if smoke else FULL
    if hosts:
        sizes = replace(sizes, hosts=hosts, sat_hosts=min(sizes.sat_hosts, hosts))
    if duration:
        sizes = replace(sizes, duration=duration)
    if step_every:
        sizes = replace(sizes, step_every=step_every)
    if pin is not None:
        sizes = replace(sizes, pin=pin)
    if http is not None:
        sizes = replace(sizes, http=http)
    if stores:
        sizes = replace(sizes, stores=stores)
    if rounds:
        sizes = replace(sizes, rounds=rounds)
    if idle is not None:
        sizes = replace(sizes, idle=idle)
    return replace(sizes, pin=sizes.pin and len(os.sched_getaffinity(0)) > 1)


def run(
    smoke: bool,
    hosts: int | None = None,
    duration: float | None = None,
    *,
    step_every: int | None = None,
    pin: bool | None = None,
    http: bool | None = None,
    stores: tuple[str, ...] | None = None,
    rounds: int | None = None,
    idle: bool | None = None,
) -> Section:
    sizes = _sizes(
        smoke,
        hosts,
        duration,
        step_every=step_every,
        pin=pin,
        http=http,
        stores=stores,
        rounds=rounds,
        idle=idle,
    )
    t0 = time.monotonic()
    section = Section(
        "lease_capacity",
        "Lease capacity",
        f"{sizes.hosts} hosts in {sizes.workers} client processes, paced 1 renewal/s/host for "
        f"{sizes.rounds} x {sizes.duration:g} s alternated with the echo stream's (progress "
        f"changes every {sizes.step_every} renewals), then {sizes.sat_hosts} hosts closed-loop "
        f"for {sizes.duration:g} s",
    )
    ids = host_ids(sizes.hosts)
    pki_dir = resources.pki(ids)
    with (
        tempfile.TemporaryDirectory(prefix="amc-bench-lease-") as tmp,
        echo_stream(pki_dir, ids, sizes) as echo,
    ):
        backends = []
        if "SQLite" in sizes.stores:
            backends.append(("SQLite", f"sqlite+aiosqlite:///{Path(tmp) / 'cloud.sqlite3'}"))
        if "PostgreSQL" in sizes.stores:
            backends.append(("PostgreSQL", resources.postgres_url()))
        for label, url in backends:
            pair, leases = run_cloud(url, pki_dir, ids, sizes, echo)
            http_paced, http_sat = run_http(url, leases, sizes) if sizes.http else (None, None)
            _rows(section, label, pair.paced, http_paced, pair.echo_paced, "paced")
            _rows(section, label, pair.sat, http_sat, pair.echo_sat, "closed-loop")
            if pair.idle is not None:
                _idle_rows(section, label, pair.idle, len(leases))
            section.notes.append(
                f"{label}: {len(leases)} of {sizes.hosts} hosts held a lease; offered "
                f"{len(leases)} renewals/s in the paced phase"
            )
    section.notes.append(
        "Cloud, HTTP app and echo server each run in their own process; the simulated hosts run "
        "in separate worker processes on the same machine"
        + (
            f": servers pinned to CPU {SERVER_CPUS}, hosts to CPU "
            f"{','.join(map(str, sorted(HOST_CPUS)))} (taskset / sched_setaffinity), PostgreSQL "
            "unpinned."
            if sizes.pin
            else ", so client and server share its CPUs."
        )
    )
    section.notes.append(
        "CPU-s / 1,000 renewals is the server process's user+system time (from /proc) over the "
        "measurement window divided by the acknowledged renewals. A paced phase in which fewer "
        f"than {ACKED_ENOUGH:.1%} of the renewals its hosts were scheduled to send were "
        "acknowledged is SHORT: a host renews only after its last renewal is acknowledged, so a "
        "server that falls behind is sent fewer renewals in bigger batches and its CPU per "
        "renewal drops. A short phase is named in its row and left out of the CPU figures and "
        "their ratios (not of the rates and latencies, where it counts against the build)."
    )
    section.seconds = time.monotonic() - t0
    return section


def run_overhead(smoke: bool) -> Section:
    """The overhead benchmark as `python -m bench` runs it: 500 hosts, 15 s, 2 runs of each
    (smoke: 12 hosts, 1 s, one run of each)."""
    sizes = _sizes(smoke, None if smoke else 500, None if smoke else 15.0)
    ids = host_ids(sizes.hosts)
    return overhead(resources.pki(ids), ids, sizes, 1 if smoke else 2)


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--duration", type=float)
    parser.add_argument("--step-every", type=int, help="renewals per progress change")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--http", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--store", action="append", choices=["SQLite", "PostgreSQL"])
    parser.add_argument("--rounds", type=int, help="paced phases of each, alternated with echo's")
    parser.add_argument(
        "--idle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure both servers' CPU with every host connected and none renewing",
    )
    parser.add_argument(
        "--overhead",
        type=int,
        metavar="ROUNDS",
        help="only measure observability on vs off, this many runs of each",
    )
    args = parser.parse_args(argv)
    try:
        if args.overhead:
            sizes = _sizes(args.smoke, args.hosts, args.duration)
            ids = host_ids(sizes.hosts)
            print(overhead(resources.pki(ids), ids, sizes, args.overhead).text())
            return 0
        section = run(
            args.smoke,
            args.hosts,
            args.duration,
            step_every=args.step_every,
            pin=args.pin,
            http=args.http,
            stores=tuple(args.store) if args.store else None,
            rounds=args.rounds,
            idle=args.idle,
        )
        print(section.text())
    finally:
        resources.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
