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
from tests.support.postgres import PostgresServer

#: Upper bound for one message to arrive (a bound, not a timing assertion).
WAIT_S = 20.0


class Watcher:
    """One WatchHosts stream read message by message."""

    def __init__(self, address: str, pki_dir: Path, host_id: str = "") -> None:
        self.channel = channel(address, pki_dir, "operator-ops")
        stub: Any = fleet_service_pb2_grpc.FleetServiceStub(self.channel)
        self.call = stub.WatchHosts(fleet_service_pb2.WatchHostsRequest(host_id=host_id))

    async def snapshot(self) -> dict[str, types_pb2.Host]:
        """The hosts of the initial snapshot (read up to its end marker)."""
        hosts: dict[str, types_pb2.Host] = {}
        while True:
            msg: fleet_service_pb2.WatchHostsResponse = await asyncio.wait_for(
                self.call.read(), WAIT_S
            )
            if msg.snapshot_complete:
                assert not msg.HasField("host")
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
