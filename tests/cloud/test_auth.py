"""Who may call what: mTLS is required, host and operator certificates open different doors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    lease_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
)
from cloud import pki
from cloud.identity import INSECURE_IDENTITY_METADATA
from cloud.server import CloudServer, build_server
from tests.cloud.cloud_harness import channel, tasks_stub


async def test_no_client_certificate_fails_handshake(cloud: CloudServer, pki_dir: Path) -> None:
    ch = channel(cloud.address, pki_dir, None)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks_stub(ch).GetTask(task_service_pb2.GetTaskRequest(task_id="x"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await ch.close()


async def test_certificate_from_another_ca_fails_handshake(
    cloud: CloudServer, pki_dir: Path, tmp_path: Path
) -> None:
    rogue = tmp_path / "rogue"
    pki.init_ca(rogue)
    pki.write_operator_cert(rogue, "ops")
    (rogue / "ca.pem").write_bytes((pki_dir / "ca.pem").read_bytes())  # trusts the real server
    ch = channel(cloud.address, rogue, "operator-ops")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks_stub(ch).GetTask(task_service_pb2.GetTaskRequest(task_id="x"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await ch.close()


async def test_host_certificate_cannot_call_operator_services(
    cloud: CloudServer, pki_dir: Path
) -> None:
    ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks_stub(ch).SubmitTask(task_service_pb2.SubmitTaskRequest(goal="x"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await ch.close()


async def test_operator_certificate_cannot_open_a_lease_or_plan(
    cloud: CloudServer, pki_dir: Path
) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = lease_service_pb2_grpc.LeaseServiceStub(ch)
        call = stub.Lease()
        # Refused before the server reads anything, so nothing is written: a hello could race
        # the refusal and turn the status into the transport's INTERNAL (ScriptedHost.refusal).
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await planner.Decide(planner_service_pb2.DecideRequest(task_id="t"))
        assert err.value.code() in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNIMPLEMENTED,  # only when planner/service.py is absent
        )
    finally:
        await ch.close()


async def test_planner_refuses_a_lease_that_is_not_live(cloud: CloudServer, pki_dir: Path) -> None:
    ch = channel(cloud.address, pki_dir, "host-h1")
    try:
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await planner.Decide(
                planner_service_pb2.DecideRequest(
                    task_id="t", attempt=1, lease_id="l", system_prompt="s", user_prompt="u"
                )
            )
        assert err.value.code() in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.UNIMPLEMENTED,  # only when planner/service.py is absent
        )
    finally:
        await ch.close()


async def test_health_serving(cloud: CloudServer, pki_dir: Path) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = health_pb2_grpc.HealthStub(ch)
        resp = await stub.Check(health_pb2.HealthCheckRequest(service="amc.v1.TaskService"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await ch.close()


async def test_plaintext_only_with_flag_on_loopback(make_settings: Any) -> None:
    with pytest.raises(ValueError, match="loopback"):
        await build_server(make_settings(insecure=True, listen_address="0.0.0.0:0"))
    server = await build_server(make_settings(insecure=True, pki_dir=None))
    await server.start()
    ch = grpc.aio.insecure_channel(server.address)
    try:
        stub = tasks_stub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitTask(task_service_pb2.SubmitTaskRequest(goal="x"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        resp = await stub.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="x"),
            metadata=[(INSECURE_IDENTITY_METADATA, "operator/ops")],
        )
        assert resp.task.task_id
    finally:
        await ch.close()
        await server.stop(0.5)
