"""What the cloud makes of a hello's planner transport, over real mTLS gRPC (SQLite and
PostgreSQL).

Proves: a hello that leaves `planner_transport` UNSPECIFIED (0: what a host built from proto/
alone sends unless it sets the field) is a cloud-transport host, as the contract says: the fleet
lists it as CLOUD, its attempts record CLOUD, and dispatch to it pauses while the model provider
is down (it was treated as not-cloud: handed work it could only fail to plan). A value this
cloud does not know is refused in the stream with INVALID_ARGUMENT naming the field; the stream
stays up for a hello it can use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, task_service_pb2, types_pb2
from amc.v1 import lease_service_pb2 as lease_pb
from cloud.server import CloudServer
from planner.errors import PlannerUnavailable
from tests.cloud.cloud_harness import ScriptedHost, channel, hello, submit, wait_status

UNSPECIFIED = types_pb2.PLANNER_TRANSPORT_UNSPECIFIED


async def _provider_probe() -> None:
    """The provider probe of a cloud whose provider stays down (never called here: nothing
    runs the probe loop in this test's time)."""
    raise PlannerUnavailable("still down")


async def test_an_unspecified_transport_is_the_cloud_transport(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    fleet_channel = channel(cloud.address, pki_dir, "operator-ops")
    try:
        await host.connect(["p1"], transport=UNSPECIFIED)
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(fleet_channel)
        listed = await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
        assert [h.planner_transport for h in listed.hosts] == [types_pb2.PLANNER_TRANSPORT_CLOUD]

        # The provider goes down (the threshold of failed Decide calls in a row).
        health = cloud.provider_health
        health.probe = _provider_probe
        for _ in range(health.threshold):
            await health.failed("overloaded")
        assert health.pause is not None
        task = (await submit(ops)).task
        # A whole dispatch pass for this host (after any the submission started) gets nothing.
        session = cloud.leases.sessions["h1"]
        assert await cloud.leases.dispatcher.dispatch_host(session) == 0
        queued = await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))
        assert queued.task.status == types_pb2.TASK_STATUS_QUEUED

        await health.succeeded()  # the provider answers again: dispatch resumes
        assignment = (await host.next("assignment")).assignment
        assert assignment.task_id == task.task_id
        running = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_ASSIGNED)
        assert running.attempts[0].planner_transport == types_pb2.PLANNER_TRANSPORT_CLOUD
    finally:
        await host.close()
        await fleet_channel.close()


async def test_an_unknown_transport_is_refused_naming_the_field(
    cloud: CloudServer, pki_dir: Path
) -> None:
    ch = channel(cloud.address, pki_dir, "host-h2")
    call: Any = ch.stream_stream("/amc.v1.LeaseService/Lease")()
    try:
        future = hello(["p1"])
        future.hello.planner_transport = 7  # type: ignore[assignment]  # a value proto/ lacks
        await call.write(future.SerializeToString())
        refused = lease_pb.LeaseResponse.FromString(await call.read())
        assert refused.rejected.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert refused.rejected.message == (
            "hello.planner_transport: 7 is not a transport this cloud knows "
            "(PLANNER_TRANSPORT_DIRECT, PLANNER_TRANSPORT_CLOUD; UNSPECIFIED counts as CLOUD)"
        )
        await call.write(hello(["p1"]).SerializeToString())
        welcome = lease_pb.LeaseResponse.FromString(await call.read())
        assert welcome.welcome.host_id == "h2"
    finally:
        call.cancel()
        await ch.close()
