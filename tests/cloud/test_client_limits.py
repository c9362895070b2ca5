"""What a client that does not play by the rules of the transport gets, on a real replica over
real mTLS: a Lease stream that never says hello.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc, task_service_pb2
from cloud import metrics
from tests.cloud.cloud_harness import ScriptedHost, channel, started, tasks_stub
from tests.cloud.conftest import SettingsFactory


def _timeouts() -> float:
    return metrics.REGISTRY.get_sample_value("amc_cloud_lease_hello_timeouts_total") or 0.0


async def _status_of(call: grpc.aio.StreamStreamCall) -> tuple[grpc.StatusCode, str]:
    """The status the server ended `call` with (whatever the stream carried before it)."""
    async with asyncio.timeout(20):  # the server's own limit is far shorter
        while True:
            try:
                if await call.read() is grpc.aio.EOF:
                    break
            except grpc.aio.AioRpcError:
                break
        return await call.code(), await call.details() or ""


async def test_a_stream_that_never_says_hello_is_ended_deadline_exceeded(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """A stream opened and left silent (or sent only hellos the cloud refuses) held its handler
    and a stream slot for as long as the client kept the connection. Now it ends
    DEADLINE_EXCEEDED, saying what was missing, after `hello_timeout_seconds`, and is counted."""
    async with started(make_settings(hello_timeout_seconds=0.3)) as cloud:
        before = _timeouts()
        async with channel(cloud.address, pki_dir, "host-a") as ch:
            stub = lease_service_pb2_grpc.LeaseServiceStub(ch)
            silent = stub.Lease()
            code, details = await _status_of(silent)
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
            assert details == "no hello within 0.3 s of opening the stream; send HostHello first"

            refused_only = stub.Lease()
            unknown_transport = lease_pb.HostHello(planner_transport=999)  # type: ignore[arg-type]
            await refused_only.write(lease_pb.LeaseRequest(hello=unknown_transport))
            first = await refused_only.read()
            assert first.WhichOneof("kind") == "rejected", first
            code, details = await _status_of(refused_only)
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
        assert _timeouts() - before == 2


async def test_a_stream_welcomed_in_time_outlives_the_hello_timeout(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """The limit is on the hello only: a host welcomed in time keeps its stream and gets work
    long after it."""
    async with (
        started(make_settings(hello_timeout_seconds=0.3)) as cloud,
        channel(cloud.address, pki_dir, "operator-ops") as ops,
        ScriptedHost(cloud.address, pki_dir, "a") as host,
    ):
        before = _timeouts()
        await host.connect(["a-phone"])
        await asyncio.sleep(1.0)  # several times the limit
        submitted = await tasks_stub(ops).SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="open settings")
        )
        assignment = (await host.next("assignment")).assignment
        assert assignment.task_id == submitted.task.task_id
        assert _timeouts() == before
