"""FleetService.ListHosts. Operators only."""

from __future__ import annotations

import grpc

from amc.v1 import fleet_service_pb2 as pb
from amc.v1 import fleet_service_pb2_grpc
from cloud.services.auth import require
from cloud.settings import CloudSettings
from cloud.store import convert, hosts
from cloud.store.database import Store


class FleetServicer(fleet_service_pb2_grpc.FleetServiceServicer):
    """Hosts and their phones, connected ones first."""

    def __init__(self, store: Store, settings: CloudSettings) -> None:
        self._store = store
        self._settings = settings

    async def ListHosts(
        self,
        request: pb.ListHostsRequest,
        context: grpc.aio.ServicerContext[pb.ListHostsRequest, pb.ListHostsResponse],
    ) -> pb.ListHostsResponse:
        await require(context, "operator", insecure=self._settings.insecure)
        rows = await hosts.list_hosts(self._store, self._settings.host_heartbeat_seconds)
        return pb.ListHostsResponse(
            hosts=[
                convert.host(row, connected)
                for row, connected in rows
                if connected or not request.connected_only
            ]
        )
