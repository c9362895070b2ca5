"""A host client that stops reading its Lease stream, on a real replica over real mTLS: the
cloud's writes to it cannot pin the host's session."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc
from cloud import metrics
from tests.cloud.cloud_harness import ScriptedHost, hello, started
from tests.cloud.conftest import SettingsFactory
from tests.support.mtls import channel_credentials

#: A Rejected echoes the task id it refused: a renewal naming this one costs the cloud as many
#: bytes to answer, so a few of them fill any flow-control window a client leaves unread.
_LONG_ID = "x" * 256 * 1024

#: The client's side of flow control kept small and fixed (no BDP probing to grow it).
_SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16 * 1024)]


def _sample(name: str) -> float:
    return metrics.REGISTRY.get_sample_value(name) or 0.0


def _bogus_renewal() -> lease_pb.LeaseRequest:
    return lease_pb.LeaseRequest(
        renewal=lease_pb.LeaseRenewal(task_id=_LONG_ID, attempt=1, lease_id="l")
    )


async def _until(check: Callable[[], bool], within: float) -> None:
    """Wait until `check()` holds, `within` seconds at most (a bound far above what it takes:
    not a timing assertion); the metrics it reads have no event to wait on."""
    async with asyncio.timeout(within):
        while True:
            if check():
                return
            await asyncio.sleep(0.05)


async def test_a_host_that_stops_reading_is_ended_so_its_newer_process_takes_its_place(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """A client that sent a hello and then read nothing left the cloud blocked in a write
    under the session's write lock: the supersede of the host's newer process could not end
    that stream (nor could a revocation), only the connection's maximum age did, and the
    handler stayed open. Now a write that waits `lease_write_timeout_seconds` ends the
    stream, counted, and the client sees UNAVAILABLE "not reading" once it reads again."""
    async with started(make_settings(lease_write_timeout_seconds=0.5)) as cloud:
        before = _sample("amc_cloud_lease_write_timeouts_total")
        creds = channel_credentials(pki_dir, "host-a")
        async with grpc.aio.secure_channel(cloud.address, creds, options=_SMALL_WINDOW) as ch:
            stuck = lease_service_pb2_grpc.LeaseServiceStub(ch).Lease()
            await stuck.write(hello(["a-phone"], process_id="first"))
            assert (await stuck.read()).WhichOneof("kind") == "welcome"

            async def flood() -> None:
                for _ in range(64):  # 16 MiB of answers, never read
                    await stuck.write(_bogus_renewal())

            flooding = asyncio.create_task(flood())
            try:
                async with ScriptedHost(cloud.address, pki_dir, "a") as newer:
                    await newer.connect(["a-phone"], process_id="second")
                    # Only the newer stream's handler is left (the stuck one's ended).
                    await _until(lambda: _sample("amc_cloud_lease_streams") == 1, 30)
                    assert _sample("amc_cloud_lease_write_timeouts_total") - before == 1
                    # What the stuck client reads, once it reads: what was written, then why
                    # its stream ended.
                    async with asyncio.timeout(30):
                        with contextlib.suppress(grpc.aio.AioRpcError):
                            while await stuck.read() is not grpc.aio.EOF:
                                pass
                        code, details = await stuck.code(), await stuck.details()
                    assert code == grpc.StatusCode.UNAVAILABLE, details
                    assert details.startswith("not reading"), details
                    # The newer process is served.
                    await newer.send(hello(["a-phone"], process_id="second"))
                    assert (await newer.next("rejected")).rejected.message.startswith("hello")
            finally:
                flooding.cancel()
                with contextlib.suppress(BaseException):
                    await flooding
                stuck.cancel()
