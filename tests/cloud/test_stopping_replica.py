"""A replica that is stopping (SIGTERM, a rolling deploy) takes no new host stream.

Its stop ends every host stream first ("server shutting down; reconnect"), waits for their
handlers, and then gives the server its grace before cancelling what is left. A host that
connected in that window (one whose own replica went away a moment before, or through a load
balancer not yet told) was welcomed, given work, and then cut off when the grace ran out: its
reconnect wasted, and the work handed out by a replica that was going away. Real replica over
mTLS on each backend, stopped by its own `stop()`; the wait for the streams is wrapped only to
send the host's hello inside that window.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from amc.v1 import lease_service_pb2_grpc, task_service_pb2, types_pb2
from tests.cloud.cloud_harness import channel, hello, started, tasks_stub
from tests.cloud.conftest import SettingsFactory
from tests.support.mtls import channel_credentials


async def test_a_hello_reaching_a_stopping_replica_is_told_to_reconnect_elsewhere(
    make_settings: SettingsFactory, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers: list[object] = []
    async with started(make_settings()) as cloud:
        async with channel(cloud.address, pki_dir, "operator-ops") as ops:
            submitted = await tasks_stub(ops).SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal="open settings", target=types_pb2.TaskTarget(host_id="a")
                )
            )
        task_id = submitted.task.task_id
        wait_streams_closed = cloud.leases.wait_streams_closed
        creds = channel_credentials(pki_dir, "host-a")

        async def then_a_hello(within: float) -> None:
            await wait_streams_closed(within)
            async with grpc.aio.secure_channel(cloud.address, creds) as ch:
                call = lease_service_pb2_grpc.LeaseServiceStub(ch).Lease()
                await call.write(hello(["a-phone"], process_id="p"))
                try:
                    async with asyncio.timeout(30):
                        answers.append(await call.read())
                except grpc.aio.AioRpcError as exc:
                    answers.append((exc.code(), exc.details()))
                call.cancel()

        monkeypatch.setattr(cloud.leases, "wait_streams_closed", then_a_hello)
        await cloud.stop(0.5)
    assert len(answers) == 1
    (answer,) = answers
    assert isinstance(answer, tuple), f"a stopping replica answered the hello: {answer}"
    code, details = answer
    assert code == grpc.StatusCode.UNAVAILABLE, answer
    assert "shutting down" in (details or ""), answer
    async with (
        started(make_settings()) as after,
        channel(after.address, pki_dir, "operator-ops") as ops,
    ):
        task = (
            await tasks_stub(ops).GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        ).task
        assert task.status == types_pb2.TASK_STATUS_QUEUED and not task.attempts, task
