"""Replica restart: every host of a replica reconnects at once, and none may lose its lease.

A deployment with one replica restarts it to upgrade: its hosts' streams break together and
they all come back within seconds, each with a hello that names the lease it still holds. A
host stops its own task when its lease runs out while the cloud is unreachable (the last expiry
it heard, plus a short grace: `host.lease_client`), and renews every third of a 30 s lease, so
the last of them has about 20 s from the moment the replica dies to be heard again; a lease the
new replica does not confirm in time is work lost and started over.

The cloud runs in its own process (pinned to CPU 0 when there are two) on a fixed loopback
address; N tasks with the default 30 s lease are assigned to N simulated hosts (this process,
pinned to CPU 1), which renew every 10 s with progress. Then the replica is killed (SIGKILL, a
crash) or stopped (SIGTERM, a deploy) and a new one starts on the same address and database.
Each host notices at once (its stream's pending read fails), reconnects with the real host's
backoff (full jitter from 0.5 s, doubling, never past half the lease it has left:
`host.lease_client.backoff_delay`), renews at once once welcomed, and says hello
with its process id and held lease. Figures, from the new replica's READY: when the last host
was welcomed and when the last lease was confirmed; how many leases were confirmed, refused, or
confirmed only after the host's own expiry (it would have stopped the task); renewals refused
in the lease term after; the new replica's CPU over the storm, per reconnecting host. Baseline
in the same run: the time from the replica's death to its successor's READY (the outage no
amount of speed in the hello path can hide).

The full run then kills one of two PostgreSQL replicas sharing the database, half the hosts on
each, and does not restart it: its hosts move to the other replica (each host tries the
replicas' addresses in turn, as behind a load balancer that stops routing to a dead one), which
must confirm every moved lease before it runs out while serving its own hosts. Nothing gets a
new term (a replica stayed up). Baseline: the least lease time a moved host had left when its
replica died.

    python -m bench.replica_restart [--smoke] [--hosts N] [--signal kill|term]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc, types_pb2
from bench import command, resources
from bench.cloud_client import submit_many
from bench.procstat import cpu_seconds
from bench.report import Section, percentile
from bench.servers import ServerProcess, async_server_process
from bench.sim_hosts import credentials, host_ids, renewal
from host.lease_client import backoff_delay

SERVER_CPUS = "0"
HOST_CPUS = {1}
#: The default lease (`CloudSettings.default_lease_seconds`) and the host's renewal interval.
LEASE_S = 30
RENEW_EVERY_S = LEASE_S / 3
#: How far past its lease's expiry a host keeps running its task while the cloud is unreachable:
#: not at all (`host.lease_client`: the cloud hands the task on at that moment).
HOST_GRACE_S = 0.0


class _Dropped(Exception):
    """The stream ended or broke."""


@dataclass(slots=True)
class Host:
    """One simulated host: its identity, its lease, and what it saw of the restart."""

    host_id: str
    #: Replicas' addresses in the order it tries them: it moves to the next when a session
    #: fails (as behind a load balancer that stops routing to a dead replica).
    addresses: list[str]
    credentials: grpc.ChannelCredentials
    process_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lease: tuple[str, int, str] | None = None
    #: The lease's expiry as last heard (wall clock), which the host fences itself on.
    expires_at: float = 0.0
    step: int = 0
    dropped_at: float = 0.0
    welcomed_at: float = 0.0
    confirmed_at: float = 0.0
    #: Its held lease was refused on reconnect (or a renewal was): the lease is lost.
    lost: bool = False
    #: What the cloud said each time it refused the lease.
    refusals: list[str] = field(default_factory=list)
    #: Confirmed only after its own expiry plus grace: a real host would have stopped the task.
    self_expired: bool = False
    #: Unexpected failures of a session (their repr).
    odd: list[str] = field(default_factory=list)
    #: When each hello was written (a stream opened while the cloud was down writes it once
    #: the cloud is back).
    hellos: list[float] = field(default_factory=list)
    renewals: int = 0
    refused_renewals: int = 0
    latencies: list[float] = field(default_factory=list)

    async def run(self, until: float, assigned: asyncio.Event) -> None:
        """Sessions until `until` (wall clock), with the real host's backoff between them."""
        failures = 0
        while time.time() < until and not self.lost:
            welcomed = self.welcomed_at
            try:
                await self._session(until, assigned)
            except (_Dropped, grpc.aio.AioRpcError, OSError, TimeoutError):
                pass
            except Exception as exc:  # anything else: counted, and the host tries again
                self.odd.append(repr(exc))
            if self.lost or time.time() >= until:
                return
            if not self.dropped_at or self.dropped_at < self.welcomed_at:
                self.dropped_at = time.time()
            self.addresses.append(self.addresses.pop(0))
            failures = 0 if self.welcomed_at > welcomed else failures + 1
            left = self.expires_at - time.time() if self.lease is not None else None
            await asyncio.sleep(backoff_delay(failures, 0.5, 30.0, random.Random(), left))

    async def _session(self, until: float, assigned: asyncio.Event) -> None:
        channel = grpc.aio.secure_channel(
            self.addresses[0],
            self.credentials,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.ssl_target_name_override", "localhost"),
            ],
        )
        call: Any = None
        try:
            call = lease_service_pb2_grpc.LeaseServiceStub(channel).Lease()
            held = []
            if self.lease is not None:
                task_id, attempt, lease_id = self.lease
                held.append(
                    lease_pb.HeldAssignment(task_id=task_id, attempt=attempt, lease_id=lease_id)
                )
            await call.write(
                lease_pb.LeaseRequest(
                    hello=lease_pb.HostHello(
                        devices=[
                            types_pb2.Device(
                                serial="phone-0",
                                model="bench",
                                state=types_pb2.DEVICE_STATE_ONLINE,
                            )
                        ],
                        agent_version="bench",
                        planner_transport=types_pb2.PLANNER_TRANSPORT_DIRECT,
                        held_assignments=held,
                        process_id=self.process_id,
                    )
                )
            )
            self.hellos.append(time.time())
            while self._take(await self._read(call)) != "welcome":
                pass
            self.welcomed_at = time.time()
            while self.lease is None or (held and not self.confirmed_at):
                self._take(await self._read(call))
                if self.lost:
                    return
            if not held:
                assigned.set()
            # As the real host does on every Welcome: renew at once on the new stream.
            await self._renew_until(call, until, at_once=bool(held))
        finally:
            if call is not None:
                call.cancel()
            await channel.close()

    @staticmethod
    async def _read(call: Any) -> lease_pb.LeaseResponse:
        msg = await call.read()
        if msg is grpc.aio.EOF:
            raise _Dropped
        assert isinstance(msg, lease_pb.LeaseResponse)
        return msg

    def _take(self, msg: lease_pb.LeaseResponse) -> str:
        kind = msg.WhichOneof("kind")
        now = time.time()
        if kind == "assignment":
            a = msg.assignment
            if a.resumed:
                self.confirmed_at = now
                if self.dropped_at and now > self.expires_at + HOST_GRACE_S:
                    self.self_expired = True
            self.lease = (a.task_id, a.attempt, a.lease_id)
            self.expires_at = a.lease_expires_at.ToMicroseconds() / 1e6 or now + LEASE_S
        elif kind == "revoked":
            self.lost = True
            self.refusals.append(msg.revoked.message)
        elif kind == "renewed":
            self.expires_at = msg.renewed.lease_expires_at.ToMicroseconds() / 1e6
        return kind or ""

    async def _renew_until(self, call: Any, until: float, *, at_once: bool) -> None:
        """Renew every `RENEW_EVERY_S` with progress; a read is always pending, so a broken
        stream is noticed at once, as the real host's reader notices it."""
        reader = asyncio.ensure_future(self._read(call))
        try:
            next_at = time.time() + (0.0 if at_once else random.uniform(0, RENEW_EVERY_S))
            while time.time() < until:
                done, _ = await asyncio.wait({reader}, timeout=max(0.0, next_at - time.time()))
                if done:
                    self._take(reader.result())  # a push: a revocation, or the stream ended
                    if self.lost:
                        return
                    reader = asyncio.ensure_future(self._read(call))
                    continue
                assert self.lease is not None
                self.step += 1
                sent = time.perf_counter()
                await call.write(
                    renewal(self.lease, self.step, f"step {self.step}: tapping Dark theme")
                )
                self.renewals += 1
                kind = self._take(await asyncio.wait_for(reader, LEASE_S))
                reader = asyncio.ensure_future(self._read(call))
                if kind == "renewed":
                    self.latencies.append(time.perf_counter() - sent)
                elif kind in ("revoked", "rejected"):
                    self.refused_renewals += 1
                    return
                next_at += RENEW_EVERY_S
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@dataclass(slots=True)
class Restart:
    """What one restart of one store's replica showed."""

    hosts: int
    outage_s: float
    last_welcome_s: float
    last_confirm_s: float
    confirm_p50_s: float
    confirmed: int
    lost: int
    #: Why leases were refused (the cloud's message → how many times).
    refusals: dict[str, int]
    self_expired: int
    refused_after: int
    renewals_after: int
    cpu_s: float
    #: Hellos the new replica was sent (a host that failed to get in tries again).
    hellos: int
    #: Hosts neither confirmed nor refused 120 s after READY.
    missing: int
    ack_p99_ms: float


def _why(refusals: dict[str, int]) -> str:
    """The cloud's reasons for refusing leases, most frequent first."""
    if not refusals:
        return ""
    ranked = sorted(refusals.items(), key=lambda kv: -kv[1])
    return " (" + "; ".join(f"{n}× {message!r}" for message, n in ranked) + ")"


async def _wait_for(predicate: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def restart(
    url: str,
    pki_dir: Path,
    ids: list[str],
    pin: bool,
    how: str,
    after_s: float = LEASE_S,
    before_s: float = RENEW_EVERY_S + 1,
) -> Restart:
    """Assign, let the hosts renew for `before_s`, restart the replica under them, measure
    their return, then watch their renewals for `after_s`."""
    address = _free_address()
    cloud = ("cloud", "--db", url, "--pki", str(pki_dir), "--listen", address)
    cpus = SERVER_CPUS if pin else ""
    hosts = [Host(h, [address], credentials(pki_dir, h)) for h in ids]
    until = time.time() + 3600
    runs: list[asyncio.Task[None]] = []
    try:
        async with async_server_process(*cloud, cpus=cpus) as first:
            await submit_many(first.address, pki_dir, len(ids), lease_seconds=LEASE_S)
            await _start_all(hosts, until, runs)
            # A full renewal round (full run), so every host has heard an expiry from a renewal.
            await asyncio.sleep(before_s)
            died = _stop(first, how)
        async with async_server_process(*cloud, cpus=cpus) as second:
            ready = time.time()
            storm_cpu, hellos = await _storm(hosts, ready, second.pid)
            before = _counts(hosts)
            await asyncio.sleep(after_s)  # a lease term after: does every lease hold?
            after = _after(hosts, before)
    finally:
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
    confirmed = [h.confirmed_at - ready for h in hosts if h.confirmed_at]
    return Restart(
        hosts=len(hosts),
        outage_s=ready - died,
        last_welcome_s=max(h.welcomed_at for h in hosts) - ready,
        last_confirm_s=max(confirmed, default=float("nan")),
        confirm_p50_s=percentile(confirmed, 50) if confirmed else float("nan"),
        confirmed=len(confirmed),
        lost=sum(h.lost for h in hosts),
        refusals=dict(Counter(m for h in hosts for m in h.refusals)),
        self_expired=sum(h.self_expired for h in hosts),
        refused_after=after[1],
        renewals_after=after[0],
        cpu_s=storm_cpu,
        hellos=hellos,
        missing=sum(not (h.confirmed_at or h.lost) for h in hosts),
        ack_p99_ms=after[2] * 1000,
    )


@dataclass(slots=True)
class Failover:
    """What killing one of two replicas showed (its hosts move to the other)."""

    hosts: int
    moved: int
    #: From the death to the soonest expiry a moved host had heard: the time the survivor has.
    budget_s: float
    #: Leases lost before the kill (the fleet's start went wrong: the figures say nothing).
    lost_before: int
    last_confirm_s: float
    confirm_p50_s: float
    confirmed: int
    lost: int
    refusals: dict[str, int]
    self_expired: int
    missing: int
    #: The survivor's CPU from the death to the last lease confirmed, and its hellos.
    cpu_s: float
    hellos: int
    refused_after: int
    renewals_after: int
    ack_p99_ms: float


async def failover(
    url: str,
    pki_dir: Path,
    ids: list[str],
    pin: bool,
    after_s: float = LEASE_S,
    before_s: float = RENEW_EVERY_S + 1,
) -> Failover:
    """Two replicas on one database, half the hosts on each; one is killed and its hosts move
    to the other, which must confirm each lease before it runs out (no outage: the other replica
    stays up, so no lease gets a new term)."""
    dying, staying = _free_address(), _free_address()
    cpus = SERVER_CPUS if pin else ""

    def cloud(address: str) -> tuple[str, ...]:
        return ("cloud", "--db", url, "--pki", str(pki_dir), "--listen", address)

    hosts = [
        Host(h, [dying, staying] if n % 2 == 0 else [staying, dying], credentials(pki_dir, h))
        for n, h in enumerate(ids)
    ]
    moved = hosts[::2]
    until = time.time() + 3600
    runs: list[asyncio.Task[None]] = []
    try:
        async with (
            async_server_process(*cloud(staying), cpus=cpus) as survivor,
            async_server_process(*cloud(dying), cpus=cpus) as victim,
        ):
            await submit_many(survivor.address, pki_dir, len(ids), lease_seconds=LEASE_S)
            await _start_all(hosts, until, runs)
            await asyncio.sleep(before_s)
            lost_before = sum(h.lost for h in hosts)
            budget = min(h.expires_at for h in moved if not h.lost)
            died = _stop(victim, "kill")
            budget -= died
            storm_cpu, hellos = await _storm(moved, died, survivor.pid)
            before = _counts(hosts)
            await asyncio.sleep(after_s)
            after = _after(hosts, before)
    finally:
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
    confirmed = [h.confirmed_at - died for h in moved if h.confirmed_at]
    return Failover(
        hosts=len(hosts),
        moved=len(moved),
        budget_s=budget,
        lost_before=lost_before,
        last_confirm_s=max(confirmed, default=float("nan")),
        confirm_p50_s=percentile(confirmed, 50) if confirmed else float("nan"),
        confirmed=len(confirmed),
        lost=sum(h.lost for h in hosts),
        refusals=dict(Counter(m for h in hosts for m in h.refusals)),
        self_expired=sum(h.self_expired for h in moved),
        missing=sum(not (h.confirmed_at or h.lost) for h in moved),
        cpu_s=storm_cpu,
        hellos=hellos,
        refused_after=after[1],
        renewals_after=after[0],
        ack_p99_ms=after[2] * 1000,
    )


async def _start_all(hosts: list[Host], until: float, runs: list[asyncio.Task[None]]) -> None:
    """Start every host's sessions (into `runs`), 128 connecting at a time, and return once
    each holds its assignment."""
    gate = asyncio.Semaphore(128)

    async def start(h: Host) -> None:
        got = asyncio.Event()
        async with gate:
            runs.append(asyncio.create_task(h.run(until, got)))
            await asyncio.wait_for(got.wait(), 120)

    await asyncio.gather(*(start(h) for h in hosts))


async def _storm(hosts: list[Host], since: float, pid: int) -> tuple[float, int]:
    """Wait (at most 120 s) until each of `hosts` has its lease confirmed or refused; returns
    the replica's CPU seconds from `since` to the last confirmation, and the hellos written
    since `since`."""
    cpu = [(since, cpu_seconds(pid))]
    while not all(h.confirmed_at or h.lost for h in hosts) and time.time() < since + 120:
        await asyncio.sleep(0.25)
        cpu.append((time.time(), cpu_seconds(pid)))
    back = max((h.confirmed_at for h in hosts), default=since)
    storm_cpu = max(c for t, c in cpu if t <= back + 0.25) - cpu[0][1]
    return storm_cpu, sum(t >= since for h in hosts for t in h.hellos)


def _counts(hosts: list[Host]) -> dict[str, tuple[int, int, int]]:
    """Each host's renewals sent, refused, and acknowledged so far (for `_after`)."""
    return {h.host_id: (h.renewals, h.refused_renewals, len(h.latencies)) for h in hosts}


def _stop(server: ServerProcess, how: str) -> float:
    """Kill or stop the replica; returns when it died (wall clock)."""
    server.proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
    server.proc.wait()
    return time.time()


def _after(hosts: list[Host], before: dict[str, tuple[int, int, int]]) -> tuple[int, int, float]:
    """Renewals sent and refused since `before`, and their acknowledgements' p99 (s)."""
    sent = refused = 0
    latencies: list[float] = []
    for h in hosts:
        n, r, k = before[h.host_id]
        sent += h.renewals - n
        refused += h.refused_renewals - r
        latencies += h.latencies[k:]
    return sent, refused, percentile(latencies, 99) if latencies else float("nan")


def run(smoke: bool, hosts: int | None = None, how: str = "kill") -> Section:
    n = hosts or (12 if smoke else 2000)
    pin = len(os.sched_getaffinity(0)) > 1
    t0 = time.monotonic()
    section = Section(
        "replica_restart",
        "Replica restart",
        f"{n} hosts holding {LEASE_S} s leases, renewing every {RENEW_EVERY_S:g} s; the replica "
        f"is {'killed (SIGKILL)' if how == 'kill' else 'stopped (SIGTERM)'} and a new one "
        "starts on the same address and database; then (full run) one of two PostgreSQL "
        "replicas is killed and its hosts move to the other",
    )
    ids = host_ids(n, "restart")
    pki_dir = resources.pki(ids)
    before = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, HOST_CPUS)
    try:
        with tempfile.TemporaryDirectory(prefix="amc-bench-restart-") as tmp:
            stores = [("SQLite", f"sqlite+aiosqlite:///{Path(tmp) / 'cloud.sqlite3'}")]
            if not smoke:
                stores.append(("PostgreSQL", resources.postgres_url()))
            after, settle = (RENEW_EVERY_S + 2, 2.0) if smoke else (LEASE_S, RENEW_EVERY_S + 1)

            async def each() -> tuple[list[Restart], Failover | None]:
                # One event loop for every store: grpc.aio stays bound to the first one.
                restarts = [
                    await restart(url, pki_dir, ids, pin, how, after, settle) for _, url in stores
                ]
                if smoke:
                    return restarts, None
                fresh = resources.postgres_url()  # a database of its own
                return restarts, await failover(fresh, pki_dir, ids, pin, after, settle)

            restarts, moved = asyncio.run(each())
            for (label, _), r in zip(stores, restarts, strict=True):
                _rows(section, label, r)
            if moved is not None:
                _failover_rows(section, moved)
    finally:
        os.sched_setaffinity(0, before)
    section.notes.append(
        "Times are from the new replica's READY. A host welcomed is connected again; a lease "
        "confirmed is its held assignment sent back as resumed. A host whose lease was "
        f"confirmed more than {HOST_GRACE_S:g} s after the expiry it last heard would have "
        "stopped its task (`host.lease_client`)."
        + (" Cloud pinned to CPU 0, hosts to CPU 1; PostgreSQL unpinned." if pin else "")
    )
    section.seconds = time.monotonic() - t0
    return section


def _rows(section: Section, label: str, r: Restart) -> None:
    section.add(
        f"{label} last lease confirmed",
        round(r.last_confirm_s * 1000),
        "ms",
        baseline=round(r.outage_s * 1000),
        baseline_name="outage (death → new READY)",
        note=f"p50 {r.confirm_p50_s * 1000:,.0f} ms; last host welcomed "
        f"{r.last_welcome_s * 1000:,.0f} ms",
    )
    section.add(
        f"{label} leases confirmed",
        r.confirmed,
        "",
        note=f"of {r.hosts}; refused {r.lost}{_why(r.refusals)}; not back after 120 s "
        f"{r.missing}; confirmed "
        f"after the host's own expiry {r.self_expired} (target 0)",
    )
    section.add(
        f"{label} replica CPU per hello",
        round(r.cpu_s / max(1, r.hellos) * 1000, 2),
        "ms",
        note=f"{r.cpu_s:.1f} CPU-s from READY to the last lease confirmed; {r.hellos} hellos "
        "(a host whose stream broke before its lease was confirmed says hello again)",
    )
    section.add(
        f"{label} renewals refused in the term after",
        r.refused_after,
        "",
        note=f"of {r.renewals_after}; ack p99 {r.ack_p99_ms:,.0f} ms",
    )


def _failover_rows(section: Section, f: Failover) -> None:
    label = "PostgreSQL, one of two replicas killed:"
    section.add(
        f"{label} last moved lease confirmed",
        round(f.last_confirm_s * 1000),
        "ms",
        baseline=round(f.budget_s * 1000),
        baseline_name="least lease time a moved host had left at the death",
        note=f"after the death; p50 {f.confirm_p50_s * 1000:,.0f} ms; {f.moved} of {f.hosts} "
        "hosts moved to the other replica",
    )
    section.add(
        f"{label} moved leases confirmed",
        f.confirmed,
        "",
        note=f"of {f.moved}; refused {f.lost}{_why(f.refusals)} ({f.lost_before} before the "
        f"kill); not back after 120 s {f.missing}; confirmed after the host's own expiry "
        f"{f.self_expired} (target 0)",
    )
    section.add(
        f"{label} survivor CPU per hello",
        round(f.cpu_s / max(1, f.hellos) * 1000, 2),
        "ms",
        note=f"{f.cpu_s:.1f} CPU-s from the death to the last lease confirmed, its own hosts' "
        f"renewals included; {f.hellos} hellos",
    )
    section.add(
        f"{label} renewals refused in the term after",
        f.refused_after,
        "",
        note=f"of {f.renewals_after} (every host); ack p99 {f.ack_p99_ms:,.0f} ms",
    )


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--signal", choices=["kill", "term"], default="kill")
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke, args.hosts, args.signal))


if __name__ == "__main__":
    raise SystemExit(main())
