"""A minimal in-test `LeaseService` over real mTLS, standing in for the cloud's.

The cloud's own LeaseService was not available when these tests were written; this one speaks
the same protocol (hello → welcome, assignments, renewed, revoked, result acks, resumed held
assignments) with just enough state for the host's lease client to be exercised over a real
grpc.aio stream. It can cut a live stream (as a network failure would) and revoke a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from amc.v1 import lease_service_pb2, lease_service_pb2_grpc, planner_service_pb2_grpc, types_pb2
from cloud import pki
from cloud.identity import peer_caller, peer_serial
from host.devices.virtual.adb_server import ThreadedAdbServer
from host.runner import HostApp, serve_host
from host.settings import HostSettings
from tests.support.mtls import start_mtls

SERVER_OPTIONS = [
    # The host pings every 10 s; the cloud must accept that rate (see the host report).
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
]


@dataclass
class Lease:
    task_id: str
    attempt: int
    lease_id: str
    serial: str
    goal: str
    live: bool = True


@dataclass
class FakeCloud(lease_service_pb2_grpc.LeaseServiceServicer):
    lease_s: float = 30.0
    received: list[lease_service_pb2.LeaseRequest] = field(default_factory=list)
    hellos: list[lease_service_pb2.HostHello] = field(default_factory=list)
    results: list[lease_service_pb2.TaskResult] = field(default_factory=list)
    leases: dict[tuple[str, int], Lease] = field(default_factory=dict)
    streams: int = 0
    host_ids: list[str] = field(default_factory=list)
    #: The serial of the client certificate each stream was opened with, in order.
    serials: list[str | None] = field(default_factory=list)
    _outbound: asyncio.Queue[lease_service_pb2.LeaseResponse | None] | None = None
    _cut: asyncio.Event | None = None
    #: How the next cut ends the stream (`cut`).
    _cut_status: tuple[grpc.StatusCode, str] = (
        grpc.StatusCode.UNAVAILABLE,
        "connection cut by test",
    )
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    ack_results: bool = True
    #: Assignment.renew_interval to send (None: leave it unset, as an older cloud would).
    renew_s: float | None = None

    async def _note(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def reported_states(self, serial: str) -> list[types_pb2.DeviceState.ValueType]:
        """Each state the host's device updates gave `serial`, in the order they came."""
        return [
            d.state
            for r in self.received
            if r.WhichOneof("kind") == "device_update"
            for d in r.device_update.devices
            if d.serial == serial
        ]

    def last_devices(self) -> list[types_pb2.Device]:
        """The phones of the host's latest device update (none before the first)."""
        updates = [r for r in self.received if r.WhichOneof("kind") == "device_update"]
        return list(updates[-1].device_update.devices) if updates else []

    async def wait_for(self, predicate: Callable[[], object], within: float = 20.0) -> None:
        """Return once `predicate()` holds; TimeoutError after `within` seconds. It is checked
        on each message the fake receives and every 50 ms besides: many predicates read the
        host's own state (its task bodies, its running tasks), which changes with no message,
        and one checked on messages alone waited for the host's next renewal (10 s)."""

        async def _wait() -> None:
            async with self.changed:
                while not predicate():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), 0.05)

        await asyncio.wait_for(_wait(), within)

    def _expiry(self) -> timestamp_pb2.Timestamp:
        ts = timestamp_pb2.Timestamp()
        ts.FromDatetime(datetime.now(UTC) + timedelta(seconds=self.lease_s))
        return ts

    def _duration(self, seconds: float) -> duration_pb2.Duration:
        d = duration_pb2.Duration()
        d.FromTimedelta(timedelta(seconds=seconds))
        return d

    async def assign(self, task_id: str, serial: str, goal: str, attempt: int = 1) -> Lease:
        lease = Lease(task_id, attempt, f"lease-{task_id}-{attempt}", serial, goal)
        self.leases[(task_id, attempt)] = lease
        assert self._outbound is not None, "no host connected"
        await self._outbound.put(self._assignment(lease, resumed=False))
        return lease

    def _assignment(self, lease: Lease, resumed: bool) -> lease_service_pb2.LeaseResponse:
        assignment = lease_service_pb2.Assignment(
            task_id=lease.task_id,
            attempt=lease.attempt,
            lease_id=lease.lease_id,
            device_serial=lease.serial,
            goal=lease.goal,
            lease_expires_at=self._expiry(),
            lease_duration=self._duration(self.lease_s),
            resumed=resumed,
        )
        if self.renew_s is not None:
            assignment.renew_interval.CopyFrom(self._duration(self.renew_s))
        return lease_service_pb2.LeaseResponse(assignment=assignment)

    async def revoke(self, task_id: str, attempt: int = 1) -> None:
        lease = self.leases[(task_id, attempt)]
        lease.live = False
        assert self._outbound is not None
        await self._outbound.put(self._revoked(lease, types_pb2.TASK_STATUS_CANCELLED))

    @staticmethod
    def _revoked(lease: Lease, _: int) -> lease_service_pb2.LeaseResponse:
        return lease_service_pb2.LeaseResponse(
            revoked=lease_service_pb2.Revoked(
                task_id=lease.task_id,
                attempt=lease.attempt,
                lease_id=lease.lease_id,
                reason=lease_service_pb2.REVOKE_REASON_CANCELLED,
                message="cancelled by operator",
            )
        )

    async def send(self, response: lease_service_pb2.LeaseResponse) -> None:
        """Send any message down the current stream (a test scripting the cloud's side)."""
        assert self._outbound is not None, "no host connected"
        await self._outbound.put(response)

    def expired(self, task_id: str, attempt: int = 1) -> lease_service_pb2.LeaseResponse:
        """The Revoked a cloud's sweeper sends when a lease ran out."""
        lease = self.leases[(task_id, attempt)]
        lease.live = False
        return lease_service_pb2.LeaseResponse(
            revoked=lease_service_pb2.Revoked(
                task_id=task_id,
                attempt=attempt,
                lease_id=lease.lease_id,
                reason=lease_service_pb2.REVOKE_REASON_EXPIRED,
                message="lease expired",
            )
        )

    def cut(
        self,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        details: str = "connection cut by test",
    ) -> None:
        """Drop the current stream abruptly, as a broken network would (UNAVAILABLE), or end
        it with another `code`, as the cloud ends the stream of a certificate it revoked."""
        self._cut_status = (code, details)
        if self._cut is not None:
            self._cut.set()

    async def Lease(
        self,
        request_iterator: AsyncIterator[lease_service_pb2.LeaseRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[lease_service_pb2.LeaseResponse]:
        caller = peer_caller(context)
        if caller is None or caller.kind != "host":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no host identity")
        assert caller is not None
        outbound: asyncio.Queue[lease_service_pb2.LeaseResponse | None] = asyncio.Queue()
        cut = asyncio.Event()
        self._outbound, self._cut = outbound, cut
        self.streams += 1
        self.host_ids.append(caller.name)
        self.serials.append(peer_serial(context))

        async def read() -> None:
            async for req in request_iterator:
                self.received.append(req)
                await self._on_request(req, outbound)
                await self._note()
            await outbound.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                getter = asyncio.ensure_future(outbound.get())
                cutter = asyncio.ensure_future(cut.wait())
                done, _ = await asyncio.wait({getter, cutter}, return_when=asyncio.FIRST_COMPLETED)
                if cutter in done:
                    getter.cancel()
                    await context.abort(*self._cut_status)
                cutter.cancel()
                item = getter.result()
                if item is None:
                    return
                yield item
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            if self._outbound is outbound:
                self._outbound = None
            await self._note()

    async def _on_request(
        self,
        req: lease_service_pb2.LeaseRequest,
        out: asyncio.Queue[lease_service_pb2.LeaseResponse | None],
    ) -> None:
        kind = req.WhichOneof("kind")
        if kind == "hello":
            self.hellos.append(req.hello)
            await out.put(
                lease_service_pb2.LeaseResponse(
                    welcome=lease_service_pb2.Welcome(
                        host_id=self.host_ids[-1],
                        renew_interval=self._duration(self.lease_s / 3),
                    )
                )
            )
            for held in req.hello.held_assignments:
                lease = self.leases.get((held.task_id, held.attempt))
                if lease and lease.live and lease.lease_id == held.lease_id:
                    await out.put(self._assignment(lease, resumed=True))
                elif lease:
                    await out.put(self._revoked(lease, 0))
        elif kind == "renewal":
            r = req.renewal
            lease = self.leases.get((r.task_id, r.attempt))
            if lease and lease.live and lease.lease_id == r.lease_id:
                await out.put(
                    lease_service_pb2.LeaseResponse(
                        renewed=lease_service_pb2.Renewed(
                            task_id=r.task_id,
                            attempt=r.attempt,
                            lease_id=r.lease_id,
                            lease_expires_at=self._expiry(),
                        )
                    )
                )
            elif lease:
                await out.put(self._revoked(lease, 0))
        elif kind == "result":
            res = req.result
            self.results.append(res)
            lease = self.leases.get((res.task_id, res.attempt))
            if lease and lease.lease_id == res.lease_id and self.ack_results:
                lease.live = False
                await out.put(
                    lease_service_pb2.LeaseResponse(
                        result_ack=lease_service_pb2.ResultAck(
                            task_id=res.task_id,
                            attempt=res.attempt,
                            lease_id=res.lease_id,
                            task_status=res.status,
                        )
                    )
                )


@dataclass
class RunningCloud:
    cloud: FakeCloud
    server: grpc.aio.Server
    port: int
    pki_dir: Path


async def start_fake_cloud(
    pki_dir: Path,
    host_id: str,
    port: int = 0,
    options: list[tuple[str, int]] | None = None,
    *,
    cloud: FakeCloud | None = None,
    planner: planner_service_pb2_grpc.PlannerServiceServicer | None = None,
) -> RunningCloud:
    """The fake LeaseService (`cloud`, or a new one) over mTLS, and `planner` beside it when a
    test needs Decide answered its own way (a planner that ends the cloud's stream is given
    the `cloud` it was built with)."""
    pki.ensure_embedded_pki(pki_dir.parent, [host_id])
    directory = pki_dir
    cloud = FakeCloud() if cloud is None else cloud
    server = grpc.aio.server(options=options or SERVER_OPTIONS)
    lease_service_pb2_grpc.add_LeaseServiceServicer_to_server(cloud, server)
    if planner is not None:
        planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(planner, server)
    bound = await start_mtls(server, directory, port)
    return RunningCloud(cloud, server, bound, directory)


def host_settings(tmp_path: Path, port: int, pki_dir: Path, host_id: str) -> HostSettings:
    """A host of two virtual phones dialing the fake cloud on `port`, quick to poll and to
    reconnect, with no OCR and no settle delay: what a test of a served host starts from."""
    return HostSettings(
        data_dir=tmp_path / "host",
        device_source="virtual",
        virtual_phones=2,
        cloud_address=f"127.0.0.1:{port}",
        certs_dir=pki_dir,
        host_id=host_id,
        ocr_enabled=False,
        settle_delay_s=0,
        device_poll_interval_s=0.2,
        reconnect_initial_s=0.05,
        reconnect_max_s=0.2,
    )


@contextlib.asynccontextmanager
async def serving(
    app: HostApp, phones: ThreadedAdbServer, cloud: RunningCloud, within: float = 20.0
) -> AsyncIterator[FakeCloud]:
    """`app` served against the fake cloud, connected when the block starts; then the host
    (let finish), its phones and the fake stop, in that order: each host test's frame."""
    stop = asyncio.Event()
    served = asyncio.create_task(serve_host(app, stop))
    try:
        await asyncio.wait_for(app.lease.wait_connected(), within)
        yield cloud.cloud
    finally:
        stop.set()
        await served
        phones.stop()
        await cloud.server.stop(grace=None)


class FreezableProxy:
    """A loopback TCP proxy that can go silent (a dead link: nothing flows, nothing closes)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen = False
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if self.frozen:
                    continue  # swallow: the peer hears nothing, and nothing is closed
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.frozen:
            self.frozen = False  # the dead link is noticed; new connections work again
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def stop(self) -> None:
        for w in self._writers:
            w.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
