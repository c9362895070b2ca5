"""ListHosts at fleet scale: a page reads its own hosts, not the fleet's, on both backends."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc
from cloud.server import CloudServer
from cloud.store import hosts, paging
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
