"""Simulated hosts: many asyncio Lease streams (or HTTP renewers) per process, a few processes.

Each simulated host is what the cloud sees of a real one: its own client certificate (identity
`amc://host/<id>`), its own channel and TCP/TLS connection, one Lease stream, a hello with one
phone. The benchmark process drives the workers through queues in phases:

1. `connect`: every host opens its stream (or, for HTTP, its keep-alive connection) → "connected";
2. the caller submits tasks; a worker whose hosts all hold an assignment reports "assigned";
3. `phase(start, duration, interval, active)`: the first `active` hosts of each worker renew with
   progress every `interval` seconds (0 = closed loop: next renewal as soon as the last is acked)
   and report every acknowledgement latency;
4. `stop`.

Latency is measured per host from the write of a renewal to the arrival of its `renewed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing as mp
import os
import queue
import random
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc, types_pb2

Lease = tuple[str, int, str]  # task id, attempt, lease id


@dataclass(slots=True)
class WorkerConfig:
    """What one worker process simulates."""

    worker_id: int
    mode: str  # "grpc" or "http"
    address: str
    pki_dir: Path
    host_ids: list[str]
    wait_assignment: bool = True
    http_leases: dict[str, Lease] = field(default_factory=dict)
    connect_concurrency: int = 64
    #: Renewals per progress change: 1 = a new step on every renewal (every renewal must be
    #: written); 5 at 1 Hz = an agent step every 5 s, the progress repeated in between.
    step_every: int = 1
    #: CPUs the worker runs on (`os.sched_setaffinity`); None = wherever the OS puts it.
    cpus: frozenset[int] | None = None
    #: Every `hot_every`-th host (0 = none) is "hot": a new step on every renewal, its summary
    #: stamped with the wall-clock time it was sent (`sent_at`), for watchers to time.
    hot_every: int = 0


@dataclass(slots=True)
class PhaseResult:
    """What one worker saw in one phase."""

    latencies: list[float]
    errors: int
    #: When each acknowledged renewal was sent (wall clock, s), in the order of `latencies`.
    sent: list[float] = field(default_factory=list)


def credentials(pki_dir: Path, host_id: str) -> grpc.ChannelCredentials:
    """A simulated host's mTLS credentials (its own certificate, from `resources.pki`)."""
    return grpc.ssl_channel_credentials(
        root_certificates=(pki_dir / "ca.pem").read_bytes(),
        private_key=(pki_dir / f"host-{host_id}.key").read_bytes(),
        certificate_chain=(pki_dir / f"host-{host_id}.pem").read_bytes(),
    )


def renewal(lease: Lease, step: int, summary: str) -> lease_pb.LeaseRequest:
    """A renewal of `lease` carrying an ACTING step."""
    task_id, attempt, lease_id = lease
    return lease_pb.LeaseRequest(
        renewal=lease_pb.LeaseRenewal(
            task_id=task_id,
            attempt=attempt,
            lease_id=lease_id,
            progress=types_pb2.Progress(
                step_index=step, step_status=types_pb2.STEP_STATUS_ACTING, summary=summary
            ),
        )
    )


class GrpcHost:
    """One host's channel and Lease stream."""

    def __init__(
        self, host_id: str, address: str, pki_dir: Path, step_every: int = 1, hot: bool = False
    ) -> None:
        self.step_every = 1 if hot else max(1, step_every)
        self.hot = hot
        self.renewals = 0
        #: Where in its cycle of `step_every` renewals this host reaches a new step (from its
        #: id): a fleet's agents take their steps at moments of their own. In lockstep (until
        #: 2026-12-04) every fifth second all 2,000 renewals of the lease benchmark carried new
        #: progress and the four after it none: 2,000 writes in one second, not 400 in each.
        self._step_phase = zlib.crc32(host_id.encode()) % self.step_every
        self.host_id = host_id
        creds = credentials(pki_dir, host_id)
        # A private subchannel pool: one TCP/TLS connection per simulated host, as in reality.
        self.channel = grpc.aio.secure_channel(
            address,
            creds,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.ssl_target_name_override", "localhost"),
            ],
        )
        self.call: Any = None
        self.lease: Lease | None = None
        self.step = 0
        #: Wall-clock times (time.time()): the hello written, the first assignment received.
        self.hello_at = 0.0
        self.assigned_at = 0.0

    async def connect(self) -> None:
        self.call = lease_service_pb2_grpc.LeaseServiceStub(self.channel).Lease()
        await self.call.write(
            lease_pb.LeaseRequest(
                hello=lease_pb.HostHello(
                    devices=[
                        types_pb2.Device(
                            serial="phone-0", model="bench", state=types_pb2.DEVICE_STATE_ONLINE
                        )
                    ],
                    agent_version="bench",
                    planner_transport=types_pb2.PLANNER_TRANSPORT_DIRECT,
                )
            )
        )
        self.hello_at = time.time()  # written (the connection and its TLS handshake are up)
        while True:
            msg = await self.call.read()
            if msg is grpc.aio.EOF:
                raise RuntimeError(f"{self.host_id}: stream ended before welcome")
            if msg.WhichOneof("kind") == "welcome":
                return
            self._take(msg)

    def _take(self, msg: lease_pb.LeaseResponse) -> None:
        if msg.WhichOneof("kind") == "assignment":
            a = msg.assignment
            if self.lease is None:
                self.assigned_at = time.time()
            self.lease = (a.task_id, a.attempt, a.lease_id)

    async def wait_assignment(self) -> Lease:
        while self.lease is None:
            msg = await self.call.read()
            if msg is grpc.aio.EOF:
                raise RuntimeError(f"{self.host_id}: stream ended before an assignment")
            self._take(msg)
        return self.lease

    async def renew(self) -> bool:
        assert self.lease is not None
        if self.renewals == 0 or (self.renewals + self._step_phase) % self.step_every == 0:
            self.step += 1
        self.renewals += 1
        summary = (
            f"step {self.step} @{time.time():.3f}"
            if self.hot
            else f"step {self.step}: tapping Dark theme"
        )
        await self.call.write(renewal(self.lease, self.step, summary))
        while True:
            msg = await self.call.read()
            if msg is grpc.aio.EOF:
                raise RuntimeError(f"{self.host_id}: stream ended")
            kind = msg.WhichOneof("kind")
            if kind == "renewed":
                return True
            if kind in ("revoked", "rejected"):
                return False

    async def close(self) -> None:
        if self.call is not None:
            with contextlib.suppress(Exception):
                await self.call.done_writing()
            self.call.cancel()
        await self.channel.close()


class HttpHost:
    """One host of the old design: a JSON POST per renewal on a shared keep-alive pool."""

    def __init__(self, host_id: str, client: Any, lease: Lease) -> None:
        self.host_id = host_id
        self.client = client
        self.lease = lease
        self.step = 0

    async def renew(self) -> bool:
        task_id, attempt, lease_id = self.lease
        self.step += 1
        response = await self.client.post(
            "/renew",
            json={
                "host_id": self.host_id,
                "task_id": task_id,
                "attempt": attempt,
                "lease_id": lease_id,
                "progress": {
                    "step_index": self.step,
                    "step_status": int(types_pb2.STEP_STATUS_ACTING),
                    "summary": f"step {self.step}: tapping Dark theme",
                },
            },
        )
        return response.status_code == 200 and bool(response.json().get("renewed"))

    async def close(self) -> None:
        return None


async def _renew_loop(
    host: GrpcHost | HttpHost, start: float, end: float, interval: float, out: PhaseResult
) -> None:
    next_t = start + (random.uniform(0, interval) if interval else 0.0)
    while True:
        now = time.perf_counter()
        if next_t > now:
            await asyncio.sleep(next_t - now)
        t0 = time.perf_counter()
        if t0 >= end:
            return
        wall = time.time()
        try:
            ok = await host.renew()
        except Exception:
            out.errors += 1
            await asyncio.sleep(0.1)
            ok = False
        else:
            if ok:
                out.latencies.append(time.perf_counter() - t0)
                out.sent.append(wall)
            else:
                out.errors += 1
        # Paced: keep the schedule, but never burst to catch up. Closed loop: go again now.
        next_t = max(next_t + interval, time.perf_counter()) if interval else time.perf_counter()


async def _get(ctrl: Any) -> Any:
    """Next command from the parent, without blocking the event loop."""
    while True:
        try:
            return ctrl.get_nowait()
        except queue.Empty:
            await asyncio.sleep(0.05)


async def _worker(cfg: WorkerConfig, ctrl: Any, out: Any) -> None:
    hosts: list[GrpcHost | HttpHost] = []
    client: Any = None
    failed = 0
    if cfg.mode == "grpc":
        grpc_hosts = [
            GrpcHost(
                h,
                cfg.address,
                cfg.pki_dir,
                cfg.step_every,
                hot=bool(cfg.hot_every) and n % cfg.hot_every == 0,
            )
            for n, h in enumerate(cfg.host_ids)
        ]
        gate = asyncio.Semaphore(cfg.connect_concurrency)

        async def connect(h: GrpcHost) -> bool:
            async with gate:
                try:
                    await asyncio.wait_for(h.connect(), 120)
                    return True
                except Exception:
                    return False

        oks = await asyncio.gather(*(connect(h) for h in grpc_hosts))
        live = [h for h, ok in zip(grpc_hosts, oks, strict=True) if ok]
        for h, ok in zip(grpc_hosts, oks, strict=True):
            if not ok:
                await h.close()
        hosts = [h for h in live]
        failed = len(grpc_hosts) - len(live)
        out.put(("connected", cfg.worker_id, len(live), failed))
        if cfg.wait_assignment:
            got = await asyncio.gather(
                *(asyncio.wait_for(h.wait_assignment(), 600) for h in live),
                return_exceptions=True,
            )
            leases = {
                h.host_id: g
                for h, g in zip(live, got, strict=True)
                if not isinstance(g, BaseException)
            }
            # Hosts without an assignment cannot renew; keep them connected but idle.
            hosts = sorted(live, key=lambda h: h.host_id not in leases)
            out.put(("assigned", cfg.worker_id, leases))
    else:
        import httpx

        client = httpx.AsyncClient(
            base_url=f"http://{cfg.address}",
            limits=httpx.Limits(
                max_connections=len(cfg.host_ids), max_keepalive_connections=len(cfg.host_ids)
            ),
            timeout=60,
        )
        http_hosts = [HttpHost(h, client, cfg.http_leases[h]) for h in cfg.host_ids]
        gate = asyncio.Semaphore(cfg.connect_concurrency)

        async def warm(h: HttpHost) -> bool:
            async with gate:
                try:
                    return await h.renew()
                except Exception:
                    return False

        oks = await asyncio.gather(*(warm(h) for h in http_hosts))
        hosts = [h for h, ok in zip(http_hosts, oks, strict=True) if ok]
        out.put(("connected", cfg.worker_id, len(hosts), len(http_hosts) - len(hosts)))
    try:
        while True:
            command = await _get(ctrl)
            if command[0] == "stop":
                break
            _, start_wall, duration, interval, active = command
            start = time.perf_counter() + (start_wall - time.time())
            result = PhaseResult([], 0)
            # No collection in this worker during the phase: with a thousand streams its young
            # collections walk every pending read again and again, and its full ones take
            # hundreds of ms, delaying the acknowledgements it times (the echo stream's and the
            # cloud's alike). A phase's cyclic garbage waits for the collection after it.
            gc.collect()
            gc.disable()
            try:
                await asyncio.gather(
                    *(
                        _renew_loop(h, start, start + duration, interval, result)
                        for h in hosts[:active]
                    )
                )
            finally:
                gc.enable()
            out.put(("phase", cfg.worker_id, result))
    finally:
        await asyncio.gather(*(h.close() for h in hosts), return_exceptions=True)
        if client is not None:
            await client.aclose()
        out.put(("stopped", cfg.worker_id))


def _worker_main(cfg: WorkerConfig, ctrl: Any, out: Any) -> None:
    if cfg.cpus:
        os.sched_setaffinity(0, cfg.cpus)
    asyncio.run(_worker(cfg, ctrl, out))


class Fleet:
    """A set of worker processes simulating hosts, driven from the benchmark process."""

    def __init__(self, configs: Sequence[WorkerConfig]) -> None:
        ctx = mp.get_context("spawn")
        self._out: Any = ctx.Queue()
        self._ctrls: list[Any] = [ctx.Queue() for _ in configs]
        self._procs = [
            ctx.Process(target=_worker_main, args=(c, q, self._out), daemon=True)
            for c, q in zip(configs, self._ctrls, strict=True)
        ]
        self.size = sum(len(c.host_ids) for c in configs)
        self.connected = 0
        self.failed = 0
        self.leases: dict[str, Lease] = {}
        self._stash: list[tuple[Any, ...]] = []

    def _expect(self, kind: str, timeout: float) -> list[tuple[Any, ...]]:
        got = [m for m in self._stash if m[0] == kind]
        self._stash = [m for m in self._stash if m[0] != kind]
        deadline = time.monotonic() + timeout
        while len(got) < len(self._procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"workers did not report {kind!r} in {timeout} s")
            try:
                msg = self._out.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in self._procs):
                    raise RuntimeError("a host worker process died") from None
                continue
            if msg[0] != kind:
                # A faster worker is already one step ahead; keep its report for later.
                self._stash.append(msg)
                continue
            got.append(msg)
        return got

    @property
    def pids(self) -> list[int]:
        """The worker processes' pids (once started), to measure what the hosts themselves use."""
        return [p.pid for p in self._procs if p.pid is not None]

    def start(self, timeout: float = 300) -> None:
        """Start the workers and wait until every host is connected."""
        for p in self._procs:
            p.start()
        for _, _, ok, failed in self._expect("connected", timeout):
            self.connected += ok
            self.failed += failed

    def wait_assigned(self, timeout: float = 600) -> dict[str, Lease]:
        """Wait until every worker's hosts hold an assignment; returns host id → lease."""
        for msg in self._expect("assigned", timeout):
            self.leases.update(msg[2])
        return self.leases

    def phase(
        self, start_wall: float, duration: float, interval: float, active: int
    ) -> PhaseResult:
        """Run one renewal phase on every worker (blocking) and merge what they saw."""
        for q in self._ctrls:
            q.put(("phase", start_wall, duration, interval, active))
        merged = PhaseResult([], 0)
        for msg in self._expect("phase", duration + 120 + max(0.0, start_wall - time.time())):
            merged.latencies.extend(msg[2].latencies)
            merged.sent.extend(msg[2].sent)
            merged.errors += msg[2].errors
        return merged

    def stop(self) -> None:
        """Close every stream and end the workers."""
        for q in self._ctrls:
            with contextlib.suppress(Exception):
                q.put(("stop",))
        with contextlib.suppress(Exception):
            self._expect("stopped", 60)
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def sent_at(summary: str) -> float | None:
    """The send time a hot host stamped into its progress summary (None if not stamped)."""
    _, at, stamp = summary.rpartition(" @")
    try:
        return float(stamp) if at else None
    except ValueError:
        return None


def split(host_ids: Sequence[str], workers: int) -> list[list[str]]:
    """Host ids dealt round-robin to `workers` lists (none empty)."""
    workers = max(1, min(workers, len(host_ids)))
    return [list(host_ids[i::workers]) for i in range(workers)]


def host_ids(n: int, prefix: str = "sim") -> list[str]:
    """Stable simulated host ids."""
    return [f"{prefix}-{i:05d}" for i in range(n)]
