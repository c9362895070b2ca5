"""What a client that does not play by the rules of the transport gets, on a real replica over
real mTLS: a Lease stream that never says hello, and request metadata near gRPC's limits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc, task_service_pb2
from cloud import metrics
from tests.cloud.cloud_harness import ScriptedHost, channel, hello, started, tasks_stub
from tests.cloud.conftest import SettingsFactory
from tests.support.mtls import channel_credentials

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto" / "amc" / "v1"

#: gRPC core's hard limit on request metadata, which the cloud makes its only one.
MAX_METADATA_BYTES = 16 * 1024


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
    long after it. (A limit of a second: a loaded machine may take a while to read a hello
    that is on its way.)"""
    async with (
        started(make_settings(hello_timeout_seconds=1.0)) as cloud,
        channel(cloud.address, pki_dir, "operator-ops") as ops,
        ScriptedHost(cloud.address, pki_dir, "a") as host,
    ):
        before = _timeouts()
        await host.connect(["a-phone"])
        await asyncio.sleep(2.5)  # more than twice the limit
        submitted = await tasks_stub(ops).SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="open settings")
        )
        assignment = (await host.next("assignment")).assignment
        assert assignment.task_id == submitted.task.task_id
        assert _timeouts() == before


async def test_metadata_under_the_limit_is_always_served_and_over_it_always_refused(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """gRPC core refuses request metadata between its soft limit (8 KiB) and its hard limit
    (16 KiB) at random, more often the larger it is: the same call passed or failed by chance.
    The cloud sets both limits to one value: 12 KiB of metadata (half of such calls were refused
    before) is served every time, and 20 KiB is RESOURCE_EXHAUSTED every time."""
    async with (
        started(make_settings()) as cloud,
        channel(cloud.address, pki_dir, "operator-ops") as ops,
    ):
        stub = tasks_stub(ops)
        request = task_service_pb2.GetTaskRequest(task_id="no-such-task")
        under = (("x-padding", "a" * (MAX_METADATA_BYTES * 3 // 4)),)
        codes = set()
        for _ in range(24):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetTask(request, metadata=under, timeout=10)
            codes.add(refused.value.code())
        assert codes == {grpc.StatusCode.NOT_FOUND}

        over = (("x-padding", "a" * (MAX_METADATA_BYTES + 4096)),)
        for _ in range(4):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetTask(request, metadata=over, timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        # The replica serves on.
        answered = await stub.ListTasks(task_service_pb2.ListTasksRequest(), timeout=10)
        assert not answered.tasks


def _lease_service_comment() -> str:
    """The comment above `service LeaseService` in the .proto a host's author reads, one line."""
    lines = (PROTO_DIR / "lease_service.proto").read_text().splitlines()
    at = lines.index("service LeaseService {")
    above: list[str] = []
    for line in reversed(lines[:at]):
        if not line.startswith("//"):
            break
        above.insert(0, line.removeprefix("//").strip())
    return " ".join(above)


async def test_the_keepalive_a_host_may_use_is_in_the_contract_and_a_faster_one_loses_its_stream(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """A host built from proto/ alone with its gRPC library's keepalive set below the cloud's
    minimum ping interval (a Go client at 5 s, say) had its connection closed every few
    seconds (GOAWAY too_many_pings: UNAVAILABLE "Too many pings"), its stream with it, and
    nothing in the contract said why or what interval is allowed: only docs/deployment.md
    did. The LeaseService comment now says it, with the setting; this is what it describes."""
    settings = make_settings()
    allowed = settings.min_client_ping_interval_seconds
    said = _lease_service_comment()
    assert f"keepalive pings at most once every {allowed:g} s" in said, said
    assert "AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS" in said
    assert '"Too many pings"' in said and "UNAVAILABLE" in said
    async with started(settings) as cloud:
        # As Go's and Node's clients ping: on schedule, whether or not data flows (gRPC core's
        # own stops after 2 pings without data unless told otherwise).
        options = [
            ("grpc.keepalive_time_ms", 1000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        credentials = channel_credentials(pki_dir, "host-a")
        async with grpc.aio.secure_channel(cloud.address, credentials, options=options) as ch:
            call = lease_service_pb2_grpc.LeaseServiceStub(ch).Lease()
            await call.write(hello(["p1"]))
            assert (await call.read()).WhichOneof("kind") == "welcome"
            code, details = await _status_of(call)  # read on: nothing else ends it
    assert code == grpc.StatusCode.UNAVAILABLE, details
    assert "too many pings" in details.lower(), details
