"""The access table (`cloud.authz.ACCESS`) and the interceptor that enforces it.

Proves: every RPC the cloud serves has an entry and every entry is served; an RPC missing from
the table is refused before its handler runs (deny by default); the details clients see for a
refusal, word for word; a viewer certificate reaches exactly the read RPCs and every other RPC
refuses it (over real mTLS, table-driven over `ACCESS`, so a new RPC is covered); a streaming
handler behind the interceptor still runs its cleanup when the client goes away.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from amc.v1 import (  # noqa: F401 (imported for their services' descriptors)
    artifact_service_pb2,
    decision_log_service_pb2,
    fleet_service_pb2,
    flow_service_pb2,
    lease_service_pb2,
    lease_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    progress_service_pb2,
    task_service_pb2,
)
from cloud.authz import ACCESS, NO_IDENTITY, Authorization, Rule, refusal
from cloud.identity import INSECURE_IDENTITY_METADATA, Caller
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from tests.cloud.cloud_harness import channel, tasks_stub

HOST = Caller("host", "h1")
OPERATOR = Caller("operator", "ops")
VIEWER = Caller("viewer", "watcher")
#: What a viewer may call: the operator services' reads. Spelled out here, not derived from
#: `ACCESS`, so opening another RPC to viewers is a decision this test is changed for.
VIEWER_READS = {
    "/amc.v1.TaskService/GetTask",
    "/amc.v1.TaskService/ListTasks",
    "/amc.v1.TaskService/ListTaskEvents",
    "/amc.v1.ProgressService/WatchProgress",
    "/amc.v1.FleetService/ListHosts",
    "/amc.v1.FleetService/WatchHosts",
    "/amc.v1.FleetService/GetSpend",
    "/amc.v1.DecisionLogService/ListDecisions",
    "/amc.v1.DecisionLogService/GetDecision",
    "/amc.v1.DecisionLogService/GetConversation",
    "/amc.v1.ArtifactService/ListStepScreenshots",
    "/amc.v1.ArtifactService/GetStepScreenshot",
    "/amc.v1.FlowService/ListFlows",
    "/amc.v1.FlowService/GetFlow",
}


async def test_every_served_rpc_is_in_the_table_and_every_entry_is_served(
    tmp_path: Path, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gRPC has no public list of what a server serves: record what the generated
    # `add_*_to_server` functions register (the real method, called through), and check it
    # against what the running server's reflection service lists.
    server_class: Any = type(grpc.aio.server())
    register: Callable[..., None] = server_class.add_registered_method_handlers
    served: set[str] = set()
    services: set[str] = set()

    def recording(self: Any, service: str, handlers: dict[str, Any]) -> None:
        services.add(service)
        served.update(f"/{service}/{name}" for name in handlers)
        register(self, service, handlers)

    monkeypatch.setattr(server_class, "add_registered_method_handlers", recording)
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
    )
    cloud = await build_server(settings)
    monkeypatch.undo()
    await cloud.start()
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = stub.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        answer = await call.read()
        await call.done_writing()
        listed = {s.name for s in answer.list_services_response.service}
    finally:
        await ch.close()
        await cloud.stop(0.5)
    assert listed <= services, "reflection lists a service the recording did not see"
    assert served == set(ACCESS)


async def test_an_rpc_missing_from_the_table_is_refused_before_its_handler() -> None:
    ran: list[str] = []

    async def echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        ran.append("echo")
        return request

    handler = grpc.method_handlers_generic_handler(
        "amc.test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    table = {"/amc.test.Echo/Other": Rule(frozenset({"operator"}))}
    server = grpc.aio.server(interceptors=[Authorization(table, insecure=True)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = ch.unary_unary("/amc.test.Echo/Echo")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b"hi", metadata=[(INSECURE_IDENTITY_METADATA, "operator/ops")])
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "missing from the access table" in (err.value.details() or "")
        assert ran == []
        # A method nobody serves stays UNIMPLEMENTED, as without the interceptor.
        missing = ch.unary_unary("/amc.test.Echo/Nope")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await missing(b"hi", metadata=[(INSECURE_IDENTITY_METADATA, "operator/ops")])
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await ch.close()
        await server.stop(0)


@pytest.mark.parametrize(
    ("method", "who", "expected"),
    [
        ("/amc.v1.TaskService/SubmitTask", OPERATOR, None),
        ("/amc.v1.TaskService/SubmitTask", None, NO_IDENTITY),
        (
            "/amc.v1.TaskService/SubmitTask",
            HOST,
            "this RPC needs an operator certificate, not a host one",
        ),
        ("/amc.v1.PlannerService/Decide", HOST, None),
        (
            "/amc.v1.PlannerService/Decide",
            OPERATOR,
            "this RPC needs a host certificate, not an operator one",
        ),
        ("/amc.v1.LeaseService/Lease", HOST, None),
        ("/amc.v1.LeaseService/Lease", None, "a host certificate (amc://host/<id>) is required"),
        (
            "/amc.v1.LeaseService/Lease",
            OPERATOR,
            "a host certificate (amc://host/<id>) is required",
        ),
        ("/grpc.health.v1.Health/Check", None, None),
        ("/amc.v1.TaskService/ListTasks", VIEWER, None),
        (
            "/amc.v1.TaskService/SubmitTask",
            VIEWER,
            "this RPC needs an operator certificate, not a viewer one",
        ),
        (
            "/amc.v1.FlowService/SetFlowStatus",
            VIEWER,
            "this RPC needs an operator certificate, not a viewer one",
        ),
        (
            "/amc.v1.PlannerService/Decide",
            VIEWER,
            "this RPC needs a host certificate, not a viewer one",
        ),
        ("/amc.v1.LeaseService/Lease", VIEWER, "a host certificate (amc://host/<id>) is required"),
        # An RPC a viewer may read too still tells a host it needs an operator certificate.
        (
            "/amc.v1.TaskService/ListTasks",
            HOST,
            "this RPC needs an operator certificate, not a host one",
        ),
    ],
)
def test_refusal_details(method: str, who: Caller | None, expected: str | None) -> None:
    assert refusal(method, ACCESS.get(method), who) == expected


async def test_clients_see_the_refusal_details(cloud: CloudServer, pki_dir: Path) -> None:
    as_host = channel(cloud.address, pki_dir, "host-h1")
    as_operator = channel(cloud.address, pki_dir, "operator-ops")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks_stub(as_host).GetTask(task_service_pb2.GetTaskRequest(task_id="x"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details() == "this RPC needs an operator certificate, not a host one"

        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(as_operator)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await planner.Decide(planner_service_pb2.DecideRequest(task_id="t"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details() == "this RPC needs a host certificate, not an operator one"

        lease: Any = lease_service_pb2_grpc.LeaseServiceStub(as_operator)
        stream = lease.Lease()
        # Refused before the server reads anything: a hello written first could race the
        # refusal and turn the status into the transport's INTERNAL (see ScriptedHost.refusal).
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream.read()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details() == "a host certificate (amc://host/<id>) is required"
    finally:
        await as_host.close()
        await as_operator.close()


async def _call(ch: grpc.aio.Channel, method: str) -> tuple[grpc.StatusCode, str]:
    """Call `method` (whatever its shape) with an empty request: the status it ends with and
    its details (OK when a unary call answers or a stream sends its first message)."""
    service, name = method[1:].rsplit("/", 1)
    shape = descriptor_pool.Default().FindServiceByName(service).methods_by_name[name]
    try:
        if shape.client_streaming:
            stream: Any = ch.stream_stream(method)(timeout=5)
            await stream.read()
            stream.cancel()
        elif shape.server_streaming:
            call: Any = ch.unary_stream(method)(b"", timeout=5)
            await call.read()
            call.cancel()
        else:
            await ch.unary_unary(method)(b"", timeout=5)
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def test_viewers_may_call_the_reads_only() -> None:
    opened = {method for method, rule in ACCESS.items() if "viewer" in rule.allowed}
    assert opened == VIEWER_READS
    for method in VIEWER_READS:
        assert "operator" in ACCESS[method].allowed, f"{method}: an operator may read it too"


async def test_every_other_rpc_refuses_a_viewer_certificate(
    cloud: CloudServer, pki_dir: Path
) -> None:
    # Over the table, not a list: an RPC added to ACCESS later is called here too. One cloud
    # for them all (a cloud per RPC was 17 starts per backend).
    closed = sorted(
        m for m, rule in ACCESS.items() if not rule.any_peer and "viewer" not in rule.allowed
    )
    assert {"/amc.v1.TaskService/SubmitTask", "/amc.v1.FlowService/SetFlowStatus"} <= set(closed)
    async with channel(cloud.address, pki_dir, "viewer-watcher") as ch:
        seen = {method: await _call(ch, method) for method in closed}
    expected = {
        method: (grpc.StatusCode.PERMISSION_DENIED, refusal(method, ACCESS[method], VIEWER))
        for method in closed
    }
    assert seen == expected
    for method in closed:
        if "operator" in ACCESS[method].allowed:
            assert seen[method][1] == "this RPC needs an operator certificate, not a viewer one"


async def test_a_viewer_certificate_reaches_every_read(cloud: CloudServer, pki_dir: Path) -> None:
    async with channel(cloud.address, pki_dir, "viewer-watcher") as ch:
        codes = {method: await _call(ch, method) for method in sorted(VIEWER_READS)}
    # An empty request may be refused for what it says (a missing id: INVALID_ARGUMENT,
    # NOT_FOUND), or a stream wait for news past its deadline; never for who sent it.
    refused = {m: c for m, c in codes.items() if c[0] == grpc.StatusCode.PERMISSION_DENIED}
    assert refused == {}
    for method in ("TaskService/ListTasks", "FleetService/ListHosts", "FlowService/ListFlows"):
        assert codes[f"/amc.v1.{method}"] == (grpc.StatusCode.OK, "")


async def test_a_guarded_stream_runs_its_cleanup_when_the_client_leaves() -> None:
    started = asyncio.Event()
    cleaned_up = asyncio.Event()

    async def ticks(
        request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        try:
            started.set()
            while True:
                yield b"tick"
                await asyncio.sleep(0.01)
        finally:
            cleaned_up.set()

    handler = grpc.method_handlers_generic_handler(
        "amc.test.Ticks", {"Ticks": grpc.unary_stream_rpc_method_handler(ticks)}
    )
    table = {"/amc.test.Ticks/Ticks": Rule(frozenset({"operator"}))}
    server = grpc.aio.server(interceptors=[Authorization(table, insecure=True)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = ch.unary_stream("/amc.test.Ticks/Ticks")(
            b"", metadata=[(INSECURE_IDENTITY_METADATA, "operator/ops")]
        )
        assert await call.read() == b"tick"
        await asyncio.wait_for(started.wait(), 10)
        call.cancel()
        await asyncio.wait_for(cleaned_up.wait(), 10)
    finally:
        await ch.close()
        await server.stop(0)
