"""FleetService.WatchHosts: a snapshot, then hosts connecting, changing phones, disconnecting,
on each backend, across replicas, and when the replica holding a host's stream dies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, types_pb2
from amc.v1 import lease_service_pb2 as lease_pb
from cloud.server import CloudServer
from tests.cloud.cloud_harness import ScriptedHost, channel, device, start_replicas
from tests.support.fleet_rows import loaded_hosts, register
from tests.support.postgres import PostgresServer

#: Upper bound for one message to arrive (a bound, not a timing assertion).
WAIT_S = 20.0


class Watcher:
    """One WatchHosts stream read message by message."""

    def __init__(
        self,
        address: str,
        pki_dir: Path,
        host_id: str = "",
        request: fleet_service_pb2.WatchHostsRequest | None = None,
    ) -> None:
        self.channel = channel(address, pki_dir, "operator-ops")
        stub: Any = fleet_service_pb2_grpc.FleetServiceStub(self.channel)
        self.call = stub.WatchHosts(request or fleet_service_pb2.WatchHostsRequest(host_id=host_id))
        #: The snapshot's end marker, once read.
        self.complete: fleet_service_pb2.WatchHostsResponse | None = None
        #: Ids of every host a change was received for, in order.
        self.heard: list[str] = []

    async def snapshot(self) -> dict[str, types_pb2.Host]:
        """The hosts of the initial snapshot (read up to its end marker)."""
        hosts: dict[str, types_pb2.Host] = {}
        while True:
            msg: fleet_service_pb2.WatchHostsResponse = await asyncio.wait_for(
                self.call.read(), WAIT_S
            )
            if msg.snapshot_complete:
                assert not msg.HasField("host")
                self.complete = msg
                return hosts
            assert msg.snapshot
            hosts[msg.host.host_id] = msg.host

    async def until(self, host_id: str, *, connected: bool) -> types_pb2.Host:
        """Read changes until `host_id` shows with this connection state."""
        while True:
            msg: fleet_service_pb2.WatchHostsResponse = await asyncio.wait_for(
                self.call.read(), WAIT_S
            )
            assert not msg.snapshot
            self.heard.append(msg.host.host_id)
            if msg.host.host_id == host_id and msg.host.connected == connected:
                return msg.host

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


def serials(host: types_pb2.Host) -> list[str]:
    return [d.serial for d in host.devices]


async def test_watcher_sees_a_host_connect_change_phones_and_disconnect(
    cloud: CloudServer, pki_dir: Path
) -> None:
    watcher = Watcher(cloud.address, pki_dir)
    host = ScriptedHost(cloud.address, pki_dir, "h5")
    try:
        assert "h5" not in await watcher.snapshot()
        await host.connect(["p1"])
        seen = await watcher.until("h5", connected=True)
        assert serials(seen) == ["p1"]
        assert seen.agent_version == "sim/1"
        assert seen.planner_transport == types_pb2.PLANNER_TRANSPORT_CLOUD

        await host.send(
            lease_pb.LeaseRequest(
                device_update=lease_pb.DeviceUpdate(devices=[device("p1"), device("p2")])
            )
        )
        while serials(seen) != ["p1", "p2"]:
            seen = await watcher.until("h5", connected=True)

        await host.close()
        gone = await watcher.until("h5", connected=False)
        assert serials(gone) == ["p1", "p2"]

        # A new watcher's snapshot agrees with what the first one was told.
        late = Watcher(cloud.address, pki_dir, host_id="h5")
        try:
            assert await late.snapshot() == {"h5": gone}
        finally:
            await late.close()
    finally:
        await host.close()
        await watcher.close()


async def test_a_watcher_of_one_host_hears_only_that_host(
    cloud: CloudServer, pki_dir: Path
) -> None:
    watcher = Watcher(cloud.address, pki_dir, host_id="h7")
    other = ScriptedHost(cloud.address, pki_dir, "h6")
    mine = ScriptedHost(cloud.address, pki_dir, "h7")
    try:
        assert await watcher.snapshot() == {}  # never connected: no error, nothing yet
        await other.connect(["o1"])
        await mine.connect(["m1"])
        seen = await watcher.until("h7", connected=True)
        assert serials(seen) == ["m1"]
        await other.close()
        await mine.close()
        await watcher.until("h7", connected=False)  # no message about h6 came in between
    finally:
        await other.close()
        await mine.close()
        await watcher.close()


async def test_watch_hosts_refuses_hosts_and_overlong_ids(
    cloud: CloudServer, pki_dir: Path
) -> None:
    ch = channel(cloud.address, pki_dir, "host-h8")
    ops = channel(cloud.address, pki_dir, "operator-ops")
    try:
        as_host: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await as_host.WatchHosts(fleet_service_pb2.WatchHostsRequest()).read()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED

        as_ops: Any = fleet_service_pb2_grpc.FleetServiceStub(ops)
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await as_ops.WatchHosts(fleet_service_pb2.WatchHostsRequest(host_id="x" * 129)).read()
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "host_id" in (invalid.value.details() or "")
    finally:
        await ch.close()
        await ops.close()


@pytest.fixture
async def two_replicas(
    postgres_server: PostgresServer, pki_dir: Path
) -> AsyncIterator[list[CloudServer]]:
    """Two replicas on one PostgreSQL with a fast host heartbeat (stale after 1.5 s)."""
    async with start_replicas(
        postgres_server.create_database(), pki_dir, host_heartbeat_seconds=0.5
    ) as servers:
        yield servers


async def stop_heartbeat(replica: CloudServer) -> None:
    """Make a replica stop vouching for its streams, as a crashed one would, while the test can
    still stop it cleanly (the heartbeat job is private to the lease manager)."""
    jobs = [job for job in replica.leases._jobs if job.get_name() == "host-heartbeat"]
    assert len(jobs) == 1
    jobs[0].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await jobs[0]


@pytest.mark.postgres
async def test_watcher_on_one_replica_sees_hosts_of_another_come_and_go(
    two_replicas: list[CloudServer], pki_dir: Path
) -> None:
    a, b = two_replicas
    watcher = Watcher(a.address, pki_dir)
    host = ScriptedHost(b.address, pki_dir, "h9")
    try:
        assert await watcher.snapshot() == {}
        await host.connect(["p"])
        assert serials(await watcher.until("h9", connected=True)) == ["p"]
        await host.close()
        await watcher.until("h9", connected=False)

        # Connected again through B, then B dies: its heartbeat stops, the row still says
        # connected, and A's watcher is told the host no longer counts as connected.
        host = ScriptedHost(b.address, pki_dir, "h9")
        await host.connect(["p"])
        await watcher.until("h9", connected=True)
        await stop_heartbeat(b)
        await watcher.until("h9", connected=False)
    finally:
        await host.close()
        await watcher.close()


async def test_a_watch_of_one_page_reads_that_page_and_hears_only_its_hosts(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """Issue 21: WatchHosts' snapshot loaded every host row and sorted them in Python for
    each watcher, and every change of the fleet went to every watcher. A watch scoped as a
    ListHosts page (connection, page size, page token) reads that page, hears the changes of
    the hosts in its range of ids only (one added to it too), and hears once of a host that
    leaves its filter."""
    await register(cloud, 11, "h0")  # connected: h0-0000, h0-0010
    await register(cloud, 11, "h2")  # connected: h2-0000, h2-0010
    up = fleet_service_pb2.HOST_CONNECTION_CONNECTED
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        first = await fleet.ListHosts(
            fleet_service_pb2.ListHostsRequest(connection=up, page_size=1)
        )
        token = first.next_page_token
        second = await fleet.ListHosts(
            fleet_service_pb2.ListHostsRequest(connection=up, page_size=2, page_token=token)
        )
    request = fleet_service_pb2.WatchHostsRequest(connection=up, page_size=2, page_token=token)
    with loaded_hosts() as loaded:
        page = Watcher(cloud.address, pki_dir, request=request)
        snapshot = await page.snapshot()
    # The page's range: after h0-0000, through h2-0000 (h2-0010 follows it).
    assert list(snapshot) == ["h0-0010", "h2-0000"] == [h.host_id for h in second.hosts]
    assert len(loaded) <= 3, f"a snapshot of 2 hosts loaded {len(loaded)} host rows"
    assert page.complete is not None
    assert page.complete.next_page_token == second.next_page_token != ""
    everything = Watcher(cloud.address, pki_dir)
    await everything.snapshot()
    hosts = [ScriptedHost(cloud.address, pki_dir, h) for h in ("b", "h20", "h15", "h15")]
    below, above, inside, again = hosts
    try:
        await below.connect(["p1"])
        await above.connect(["p1"])
        await everything.until("b", connected=True)
        await everything.until("h20", connected=True)
        # Added inside the range: the page hears of it. A leak of "b" would come before it
        # (ids are sent in order), one of "h20" right after it, before its disconnect.
        await inside.connect(["p1"])
        await page.until("h15", connected=True)
        await inside.close()
        await page.until("h15", connected=False)  # left the filter: told once
        await again.connect(["p2"])
        back = await page.until("h15", connected=True)  # back in it
        assert [d.serial for d in back.devices] == ["p2"]
        assert not {"b", "h20"} & set(page.heard), page.heard
    finally:
        for host in hosts:
            await host.close()
        await page.close()
        await everything.close()


async def test_a_watch_without_scope_sends_every_host_by_id(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """A watch without a page size, as every client's was, still starts with every host of
    the fleet (read in pages of 500 now, by id as ListHosts lists them), or of its
    connection filter."""
    expected = await register(cloud, 510, "h1")
    order: list[str] = []
    watcher = Watcher(cloud.address, pki_dir)
    try:
        while not (msg := await asyncio.wait_for(watcher.call.read(), WAIT_S)).snapshot_complete:
            order.append(msg.host.host_id)
        assert msg.next_page_token == ""
    finally:
        await watcher.close()
    assert order == [h for h, _ in expected]
    up = fleet_service_pb2.WatchHostsRequest(connection=fleet_service_pb2.HOST_CONNECTION_CONNECTED)
    connected = Watcher(cloud.address, pki_dir, request=up)
    try:
        assert list(await connected.snapshot()) == [h for h, c in expected if c]
    finally:
        await connected.close()


async def test_watch_hosts_refuses_an_unknown_scope(cloud: CloudServer, pki_dir: Path) -> None:
    """An unknown connection, a page size out of range or a token of another listing is
    INVALID_ARGUMENT saying what is allowed, before any snapshot."""
    await register(cloud, 3, "h3")
    request = fleet_service_pb2.WatchHostsRequest
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        any_token = (
            await fleet.ListHosts(fleet_service_pb2.ListHostsRequest(page_size=1))
        ).next_page_token
        for bad, message in (
            (
                request(connection=7),  # type: ignore[arg-type]
                "connection: unknown value 7; one of HOST_CONNECTION_UNSPECIFIED, "
                "HOST_CONNECTION_CONNECTED, HOST_CONNECTION_DISCONNECTED",
            ),
            (request(page_size=501), "page_size: 0 to 500"),
            (request(page_size=-1), "page_size: 0 to 500"),
            (request(page_token="x"), "page_token: not a page token from this server"),
            (
                request(
                    connection=fleet_service_pb2.HOST_CONNECTION_CONNECTED, page_token=any_token
                ),
                "page_token: a page token of another listing (another RPC, task, attempt or "
                "filter)",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fleet.WatchHosts(bad).read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == message
        # The same token continues the listing it came from.
        watch = fleet.WatchHosts(request(page_size=1, page_token=any_token))
        try:
            assert (await watch.read()).host.host_id == "h3-0001"
        finally:
            watch.cancel()
