"""ListHosts at fleet scale: a page reads its own hosts, not the fleet's, on both backends."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import update

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc
from cloud.server import CloudServer
from cloud.store import hosts, paging
from cloud.store.database import Store
from cloud.store.models import HostRow
from tests.cloud.cloud_harness import channel
from tests.support.fleet_rows import loaded_hosts, register

#: Registered hosts: "a few hundred", every tenth of them connected.
FLEET = 300


@pytest.fixture
def loaded() -> Iterator[list[str]]:
    """Ids of the host rows the cloud loads while the test runs."""
    with loaded_hosts() as ids:
        yield ids


async def test_a_page_of_hosts_loads_that_page_not_the_fleet(
    cloud: CloudServer, pki_dir: Path, loaded: list[str]
) -> None:
    """ListHosts loaded every host row and paged in Python: each page, however small, read
    the whole fleet (and the console asked for one on every render of three pages). It pages
    in SQL now, in the same order, with tokens that walk the fleet once."""
    expected = await register(cloud, FLEET)
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        loaded.clear()
        first = await fleet.ListHosts(fleet_service_pb2.ListHostsRequest(page_size=5))
        assert len(loaded) <= 6, f"one page of 5 loaded {len(loaded)} host rows"
        assert [(h.host_id, h.connected) for h in first.hosts] == expected[:5]

        seen: list[tuple[str, bool]] = []
        token = ""
        while True:
            page = await fleet.ListHosts(
                fleet_service_pb2.ListHostsRequest(page_size=70, page_token=token)
            )
            seen += [(h.host_id, h.connected) for h in page.hosts]
            token = page.next_page_token
            if not token:
                break
        assert seen == expected

        connected = await fleet.ListHosts(
            fleet_service_pb2.ListHostsRequest(connected_only=True, page_size=500)
        )
        assert [h.host_id for h in connected.hosts] == [h for h, c in expected if c]


async def test_list_hosts_tokens_of_the_connected_first_order_are_refused(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """A token of the earlier, connected-first order (a bare base64 JSON `[rank, host_id]`, or
    one naming the "hosts/" listing) held a place in that order: read as a place in the order
    by id it would skip or repeat hosts, so it is refused with INVALID_ARGUMENT (the client
    starts again), as is a token of another listing or of nothing."""
    expected = await register(cloud, 20)
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        host_id, connected = expected[3]
        bare = base64.urlsafe_b64encode(json.dumps([int(not connected), host_id]).encode())
        named = paging.page_token(f"hosts/{'0' * 16}", int(not connected), host_id)
        tasks = paging.page_token("tasks/0", "x")
        for token, message in (
            (bare.decode(), "page_token: not a page token from this server"),
            (named, "page_token: not a page token from this server"),
            ("garbage!", "page_token: not a page token from this server"),
            (tasks, "page_token: a page token of another listing"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fleet.ListHosts(fleet_service_pb2.ListHostsRequest(page_token=token))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith(message)


async def test_a_walk_of_the_fleet_lists_each_host_once_while_hosts_come_and_go(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """ListHosts paged connected first: a host that connected between two pages of a walk
    moved ahead of the place the walk had reached and was never listed, one that disconnected
    moved behind it and was listed twice. Pages follow the host id now, which no host changes:
    a walk lists every host once, whatever connects or disconnects between its pages."""
    expected = await register(cloud, 20)
    store, now = cloud.store, cloud.store.now()
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        page = await fleet.ListHosts(fleet_service_pb2.ListHostsRequest(page_size=5))
        seen = [h.host_id for h in page.hosts]
        token = page.next_page_token
        # fleet-0010 (connected) disconnects, fleet-0015 (not connected) connects.
        assert await hosts.disconnected(store, "fleet-0010", "s-fleet-0010")
        hello = hosts.HelloRecord([], "v1", 1, cloud.bus.replica_id, "s-again")
        await store.write_on_loop(
            lambda session: hosts.record_hellos(session, now, [("fleet-0015", hello)])
        )
        while token:
            page = await fleet.ListHosts(
                fleet_service_pb2.ListHostsRequest(page_size=5, page_token=token)
            )
            seen += [h.host_id for h in page.hosts]
            token = page.next_page_token
    assert seen == [h for h, _ in expected]


async def test_list_hosts_filters_by_id_text_and_by_ids(cloud: CloudServer, pki_dir: Path) -> None:
    """A host picker asks for the hosts whose id holds what the operator typed, and a task's
    page for the hosts it names: each a page of its own, whose tokens continue only it."""
    expected = await register(cloud, 40)
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        seen: list[str] = []
        token = ""
        while True:
            page = await fleet.ListHosts(
                fleet_service_pb2.ListHostsRequest(
                    host_query="LEET-001", page_size=3, page_token=token
                )
            )
            seen += [h.host_id for h in page.hosts]
            token = page.next_page_token
            if not token:
                break
            for other in (
                fleet_service_pb2.ListHostsRequest(host_query="fleet", page_token=token),
                fleet_service_pb2.ListHostsRequest(page_token=token),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.ListHosts(other)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "another listing" in err.value.details()
        assert seen == [h for h, _ in expected if h.startswith("fleet-001")]
        assert seen[0] == "fleet-0010"  # by id

        # LIKE's wildcards are the text typed, not patterns.
        none = await fleet.ListHosts(fleet_service_pb2.ListHostsRequest(host_query="t_0"))
        assert list(none.hosts) == []

        named = await fleet.ListHosts(
            fleet_service_pb2.ListHostsRequest(host_ids=["fleet-0005", "fleet-0020", "nope"])
        )
        assert [(h.host_id, h.connected) for h in named.hosts] == [
            ("fleet-0005", False),
            ("fleet-0020", True),
        ]

        for bad, message in (
            (
                fleet_service_pb2.ListHostsRequest(host_query="x" * 129),
                "host_query: at most 128 characters",
            ),
            (
                fleet_service_pb2.ListHostsRequest(host_ids=["h"] * 501),
                "host_ids: at most 500 ids",
            ),
            (
                fleet_service_pb2.ListHostsRequest(host_ids=["fleet-0001", ""]),
                "host_ids[1]: 1 to 128 characters",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fleet.ListHosts(bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == message


async def test_the_store_lists_connected_or_disconnected_hosts_by_id(store: Store) -> None:
    """Both backends: the connection filter keeps the walk by id and says what ListHosts'
    `connected` says. A row that reads connected but whose replica stopped vouching (three
    heartbeats) or never vouched is disconnected, as the fleet page shows it."""
    now = store.now()
    hello = [(f"h-{i}", hosts.HelloRecord([], "v1", 1, "replica-a", f"s-{i}")) for i in range(8)]
    await store.write_on_loop(lambda session: hosts.record_hellos(session, now, hello))
    for i in (1, 4, 6):
        assert await hosts.disconnected(store, f"h-{i}", f"s-{i}")
    async with store.write() as session:  # h-3's replica stopped vouching; h-5 never did
        long_ago = now - dt.timedelta(minutes=5)
        await session.execute(
            update(HostRow).where(HostRow.host_id == "h-3").values(stream_alive_at=long_ago)
        )
        await session.execute(
            update(HostRow).where(HostRow.host_id == "h-5").values(stream_alive_at=None)
        )

    async def walk(connection: str) -> list[tuple[str, bool]]:
        seen: list[tuple[str, bool]] = []
        after = None
        while True:
            page, more = await hosts.hosts_page(store, 5, hosts.HostFilter(connection), 2, after)
            seen += [(row.host_id, connected) for row, connected in page]
            if not more:
                return seen
            after = page[-1][0].host_id

    assert await walk(hosts.CONNECTED) == [("h-0", True), ("h-2", True), ("h-7", True)]
    assert await walk(hosts.DISCONNECTED) == [
        ("h-1", False), ("h-3", False), ("h-4", False), ("h-5", False), ("h-6", False)
    ]  # fmt: skip
    assert [h for h, _ in await walk(hosts.ANY)] == [f"h-{i}" for i in range(8)]


async def test_list_hosts_filters_by_connection(cloud: CloudServer, pki_dir: Path) -> None:
    """ListHosts' `connection`: the connected hosts or the disconnected ones, by id, each
    listing's tokens continuing only it; `connected_only` is CONNECTED. An unknown value, or
    `connected_only` with DISCONNECTED, is INVALID_ARGUMENT saying what is allowed."""
    expected = await register(cloud, 30)
    request = fleet_service_pb2.ListHostsRequest
    down = fleet_service_pb2.HOST_CONNECTION_DISCONNECTED
    up = fleet_service_pb2.HOST_CONNECTION_CONNECTED
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        seen: list[tuple[str, bool]] = []
        token = ""
        while True:
            page = await fleet.ListHosts(request(connection=down, page_size=4, page_token=token))
            seen += [(h.host_id, h.connected) for h in page.hosts]
            token = page.next_page_token
            if not token:
                break
            for other in (request(page_token=token), request(connection=up, page_token=token)):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await fleet.ListHosts(other)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "another listing" in err.value.details()
        assert seen == [(h, c) for h, c in expected if not c]

        connected = await fleet.ListHosts(request(connection=up))
        assert [(h.host_id, h.connected) for h in connected.hosts] == [
            (h, c) for h, c in expected if c
        ]
        # The boolean of before is the same listing: its tokens continue the enum's.
        first = await fleet.ListHosts(request(connected_only=True, page_size=1))
        rest = await fleet.ListHosts(request(connection=up, page_token=first.next_page_token))
        assert [h.host_id for h in [*first.hosts, *rest.hosts]] == [h for h, c in expected if c]

        for bad, message in (
            (
                request(connection=7),  # type: ignore[arg-type]
                "connection: unknown value 7; one of HOST_CONNECTION_UNSPECIFIED, "
                "HOST_CONNECTION_CONNECTED, HOST_CONNECTION_DISCONNECTED",
            ),
            (
                request(connected_only=True, connection=down),
                "connected_only: contradicts connection HOST_CONNECTION_DISCONNECTED",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fleet.ListHosts(bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == message
