"""A host client that stops reading its Lease stream, on a real replica over real mTLS: the
cloud's writes to it cannot pin the host's session."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import pytest

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc, task_service_pb2, types_pb2
from cloud import metrics
from cloud.lease import stream
from cloud.lease.session import HostSession
from cloud.store import states
from tests.cloud.cloud_harness import (
    ScriptedHost,
    assigned,
    channel,
    hello,
    renewal,
    started,
    tasks_stub,
    wait_status,
)
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


#: How a client sees a call the cloud dropped after its "not reading" status could not be sent.
DROPPED = (grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL)


async def test_a_host_that_stops_reading_is_ended_so_its_newer_process_takes_its_place(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """A client that sent a hello and then read nothing left the cloud blocked in a write
    under the session's write lock: the supersede of the host's newer process could not end
    that stream (nor could a revocation), only the connection's maximum age did, and the
    handler stayed open. Now a write that waits `lease_write_timeout_seconds` ends the
    stream, counted, and the client sees UNAVAILABLE "not reading" once it reads again (or
    the call dropped, when even that status could not be sent within the bound)."""
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
                    # The status waits behind the unread answers for the same bound; when the
                    # cloud could not send it in time it dropped the call (the contract says
                    # so): a loaded full-suite run saw INTERNAL "Internal error from Core".
                    if code == grpc.StatusCode.UNAVAILABLE:
                        assert details.startswith("not reading"), details
                    else:
                        assert code in DROPPED, (code, details)
                    # The newer process is served.
                    await newer.send(hello(["a-phone"], process_id="second"))
                    assert (await newer.next("rejected")).rejected.message.startswith("hello")
            finally:
                flooding.cancel()
                with contextlib.suppress(BaseException):
                    await flooding
                stuck.cancel()


async def _until_write_blocked(session: HostSession) -> None:
    """Wait until a write to `session` is blocked: its write lock held on every look for a
    while. A write the transport takes holds it for far less than a look's interval; one
    waiting for a client that reads nothing holds it until the write's limit."""
    async with asyncio.timeout(30):
        held = 0
        while held < 5:
            held = held + 1 if session.write_lock.locked() else 0
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _queued_behind_a_stuck_write(
    address: str, pki_dir: Path, session_of: Callable[[], HostSession]
) -> AsyncIterator[tuple[grpc.aio.Channel, Any, str]]:
    """Host "a" connects, stops reading and floods the cloud with renewals whose answers fill
    its window; once the cloud's write to it is blocked, a max_attempts=1 task is submitted
    for it and claimed for that stream, so its assignment waits behind the blocked write.
    Yields the operator's channel, the stream and the task's id; the stream is
    cancelled on exit."""
    creds = channel_credentials(pki_dir, "host-a")
    async with (
        grpc.aio.secure_channel(address, creds, options=_SMALL_WINDOW) as ch,
        channel(address, pki_dir, "operator-ops") as ops,
    ):
        stuck = lease_service_pb2_grpc.LeaseServiceStub(ch).Lease()
        await stuck.write(hello(["a-phone"], process_id="first"))
        assert (await stuck.read()).WhichOneof("kind") == "welcome"
        session = session_of()

        async def flood() -> None:
            for _ in range(64):  # 16 MiB of answers, never read
                await stuck.write(_bogus_renewal())

        flooding = asyncio.create_task(flood())
        try:
            await _until_write_blocked(session)
            submitted = await tasks_stub(ops).SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal="open settings",
                    target=types_pb2.TaskTarget(host_id="a"),
                    max_attempts=1,
                )
            )
            task_id = submitted.task.task_id
            await _until(lambda: any(h.task_id == task_id for h in session.granted), 30)
            assert not session.stuck and not session.closed
            yield ops, stuck, task_id
        finally:
            flooding.cancel()
            with contextlib.suppress(BaseException):
                await flooding
            stuck.cancel()


async def test_assignments_queued_behind_a_stuck_write_are_handed_back_unused(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """An assignment queued for a host whose stream then ended "not reading" never went to
    gRPC: the handler dropped it. Its lease stayed the host's, so the task stayed ASSIGNED
    until the lease ran out, and then that attempt counted against max_attempts (a task
    allowed one failed over work no host received). Now it is handed back at once, as the
    dispatcher hands back a claim whose stream went away: QUEUED again, the attempt not
    counted, and the host's next stream gets it."""
    limit = 3.0  # long enough for the task to be claimed while the write waits
    async with started(make_settings(lease_write_timeout_seconds=limit)) as cloud:
        before = _sample("amc_cloud_lease_write_timeouts_total")
        async with _queued_behind_a_stuck_write(
            cloud.address, pki_dir, lambda: cloud.leases.sessions["a"]
        ) as (ops, stuck, task_id):
            await _until(lambda: _sample("amc_cloud_lease_streams") == 0, 30)
            assert _sample("amc_cloud_lease_write_timeouts_total") - before == 1
            got: list[str] = []
            async with asyncio.timeout(30):
                with contextlib.suppress(grpc.aio.AioRpcError):
                    while (msg := await stuck.read()) is not grpc.aio.EOF:
                        got.append(msg.WhichOneof("kind"))
            assert "assignment" not in got, got
            # Handed back unused: queued again (a max_attempts=1 task not failed), its
            # attempt ended as never sent.
            task = await wait_status(tasks_stub(ops), task_id, types_pb2.TASK_STATUS_QUEUED)
            assert [a.failure_reason for a in task.attempts] == [states.STREAM_LOST]
            # The host's next stream gets it.
            async with ScriptedHost(cloud.address, pki_dir, "a") as newer:
                await newer.connect(["a-phone"], process_id="second")
                handed = (await newer.next("assignment")).assignment
                assert (handed.task_id, handed.attempt) == (task_id, 2)


async def test_an_assignment_queued_behind_a_stuck_write_uses_no_attempt_when_a_newer_process_connects(  # noqa: E501
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """The host's newer process connects while the hung one's stream still waits in a write
    (the usual way a hung host comes back), and an assignment claimed for the hung stream
    waits behind that write, never handed to gRPC. The supersede released it as the host's
    restart (and so did the newer hello's release of what started before it), which uses an
    attempt: a max_attempts=1 task failed over work no process received. Now it is taken
    back and released unused (STREAM_LOST), and the hello's release spares it."""
    limit = 5.0  # the newer process connects well before the write watch ends the write
    async with (
        started(make_settings(lease_write_timeout_seconds=limit)) as cloud,
        _queued_behind_a_stuck_write(
            cloud.address, pki_dir, lambda: cloud.leases.sessions["a"]
        ) as (ops, _, task_id),
        ScriptedHost(cloud.address, pki_dir, "a") as newer,
    ):
        await newer.connect(["a-phone"], process_id="second")
        # Only the newer stream's handler is left (the stuck one's ended).
        await _until(lambda: _sample("amc_cloud_lease_streams") == 1, 30)
        # Its attempt ended as never sent, not as the host's restart: the task
        # is queued again, or already the newer process's second attempt.
        task = await _attempt_ended(ops, task_id)
        assert task.status in (
            types_pb2.TASK_STATUS_QUEUED,
            types_pb2.TASK_STATUS_ASSIGNED,
        ), (
            types_pb2.TaskStatus.Name(task.status),
            [a.failure_reason for a in task.attempts],
        )
        assert task.attempts[0].failure_reason == states.STREAM_LOST
        handed = (await newer.next("assignment")).assignment
        assert (handed.task_id, handed.attempt) == (task_id, 2)


async def _attempt_ended(ops: grpc.aio.Channel, task_id: str) -> Any:
    """The task once its first attempt has ended (30 s at most)."""
    async with asyncio.timeout(30):
        while True:
            task = (
                await tasks_stub(ops).GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
            ).task
            if task.attempts and task.attempts[0].failure_reason:
                return task
            await asyncio.sleep(0.05)


def _within_a_stream_write() -> bool:
    """Whether the caller runs inside a write to a host's stream (`_bounded_write`)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_bounded_write" and frame.f_code.co_filename == stream.__file__:
            return True
        frame = frame.f_back
    return False


async def test_a_write_to_a_host_arms_no_timer(
    make_settings: SettingsFactory, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals answered on a real stream arm no timer in the write path. Each write was
    bounded by its own `asyncio.timeout`: a timer armed on the event loop and cancelled
    again, ~10 µs a write on a loaded replica, on the renewal hot path (a renewal costs some
    400 µs of cloud CPU in all). The bound is now the replica's one write watch, which looks
    at the open streams once a second (`cloud.lease.write_watch`)."""
    async with (
        started(make_settings()) as cloud,
        ScriptedHost(cloud.address, pki_dir, "a") as host,
        channel(cloud.address, pki_dir, "operator-ops") as ops,
    ):
        a = await assigned(ops, host)
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        call_at = loop.call_at

        def counted(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            if _within_a_stream_write():
                armed.append(when)
            return call_at(when, *args, **kwargs)

        monkeypatch.setattr(loop, "call_at", counted)
        for step in range(1, 21):
            await host.send(renewal(a, step=step))
            assert (await host.next("renewed")).renewed.task_id == a.task_id
        monkeypatch.undo()
        assert armed == []


async def test_an_assignment_queued_behind_a_stuck_write_is_handed_back_when_the_replica_stops(
    make_settings: SettingsFactory, pki_dir: Path
) -> None:
    """The replica stops (SIGTERM, a rolling deploy) while an assignment waits behind a write
    its host does not read. The stop ends the stream, and its hand-back of the unsent
    assignment was a background release that tries only while the replica is not stopping:
    it never tried, so the task stayed ASSIGNED to a lease no host held until that lease ran
    out, and the attempt then counted against max_attempts (a max_attempts=1 task failed over
    work no host received). Now it is tried once all the same, inside the stop's bound for
    its jobs: the next replica finds the task QUEUED, its attempt ended as never sent."""
    settings = make_settings(lease_write_timeout_seconds=60.0)  # the stop comes first
    async with (
        started(settings) as cloud,
        _queued_behind_a_stuck_write(
            cloud.address, pki_dir, lambda: cloud.leases.sessions["a"]
        ) as (_, _, task_id),
    ):
        await cloud.stop(0.5)
    async with (
        started(make_settings()) as after,
        channel(after.address, pki_dir, "operator-ops") as ops,
    ):
        task = (
            await tasks_stub(ops).GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        ).task
        assert task.status == types_pb2.TASK_STATUS_QUEUED, (
            types_pb2.TaskStatus.Name(task.status),
            [a.failure_reason for a in task.attempts],
        )
        assert [a.failure_reason for a in task.attempts] == [states.STREAM_LOST]
