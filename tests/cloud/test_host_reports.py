"""What a host only reports never refuses its message (found by a client written from the protos).

A hello, a renewal or a result carries reports beside what the cloud acts on: progress, the
host's outbox, its phones' models. A value out of the contract's range in one of them used to
refuse the whole message: a hello got no Welcome (so no work, and its live leases were not
resumed), a renewal was refused (so its lease ran out), a result was refused on every resend.
Each test sends what a client in another language can send (raw bytes where Python's API cannot
build it) to a real cloud on SQLite and PostgreSQL, and checks what the contract now says.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, task_service_pb2, types_pb2
from amc.v1 import lease_service_pb2 as lease_pb
from cloud.server import CloudServer
from cloud.wire import bytes_twin
from tests.cloud.cloud_harness import ScriptedHost, channel, hello, renewal, result, submit

LEASE = "/amc.v1.LeaseService/Lease"


class RawHost:
    """A host stream that writes bytes as they are, as a client in another language may."""

    def __init__(self, address: str, pki_dir: Path, host_id: str) -> None:
        self._channel = channel(address, pki_dir, f"host-{host_id}")
        self.call: Any = self._channel.stream_stream(
            LEASE, response_deserializer=lease_pb.LeaseResponse.FromString
        )()

    async def send(self, raw: bytes) -> None:
        await self.call.write(raw)

    async def next(self, kind: str) -> lease_pb.LeaseResponse:
        async with asyncio.timeout(10):
            msg = await self.call.read()
        assert msg is not grpc.aio.EOF
        assert msg.WhichOneof("kind") == kind, msg
        return msg  # type: ignore[no-any-return]

    async def close(self) -> None:
        self.call.cancel()
        await self._channel.close()


def _twin(message: lease_pb.LeaseRequest) -> Any:
    """`message` as its bytes twin: its text fields can then hold any bytes."""
    return bytes_twin(lease_pb.LeaseRequest.DESCRIPTOR).FromString(message.SerializeToString())


async def _task(ops: Any, task_id: str) -> types_pb2.Task:
    got = await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
    return got.task  # type: ignore[no-any-return]


async def _host(cloud: CloudServer, pki_dir: Path, host_id: str, until: Any) -> types_pb2.Host:
    """The host as operators list it, once `until(host)` holds."""
    async with channel(cloud.address, pki_dir, "operator-ops") as ch:
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
        async with asyncio.timeout(10):
            while True:
                hosts = (await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
                found = [h for h in hosts if h.host_id == host_id]
                if found and until(found[0]):
                    return found[0]  # type: ignore[no-any-return]
                await asyncio.sleep(0.05)


@pytest.fixture
async def host(cloud: CloudServer, pki_dir: Path) -> AsyncIterator[ScriptedHost]:
    h = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        yield h
    finally:
        await h.close()


async def test_a_held_assignment_that_names_no_lease_is_revoked_on_its_own(
    cloud: CloudServer, ops: Any, pki_dir: Path, host: ScriptedHost
) -> None:
    """One unusable held entry (attempt 0) used to refuse the hello: no Welcome, and the live
    lease listed beside it was not resumed. Now the hello is welcomed, the live lease resumed
    once (it is listed twice), the bad entry revoked (UNKNOWN) naming the problem."""
    await host.connect(["p1"], process_id="P")
    task = (await submit(ops)).task
    a = (await host.next("assignment")).assignment
    await host.close()
    live = lease_pb.HeldAssignment(
        task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_serial="p1"
    )
    bad = lease_pb.HeldAssignment(task_id="t-unknown", attempt=0, lease_id="l")
    again = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await again.connect(["p1"], held=[live, bad, live], process_id="P")
        resumed = (await again.next("assignment")).assignment
        assert (resumed.task_id, resumed.resumed) == (task.task_id, True)
        revoked = (await again.next("revoked")).revoked
        assert (revoked.task_id, revoked.reason, revoked.message) == (
            "t-unknown",
            lease_pb.REVOKE_REASON_UNKNOWN,
            "hello.held_assignments[1].attempt: must be >= 1",
        )
        # Answered once: the next message is the renewal's answer, not a second Assignment.
        await again.send(renewal(a))
        assert (await again.next("renewed")).renewed.task_id == task.task_id
    finally:
        await again.close()


async def test_a_hello_settles_at_most_1024_held_assignments(
    cloud: CloudServer, ops: Any, pki_dir: Path, host: ScriptedHost
) -> None:
    """Each held assignment costs the replica a lookup while its other hosts wait (20,000 took
    8 s): those past the 1,024th are revoked unlooked-at."""
    await host.connect(["p1"], process_id="P")
    await submit(ops)
    a = (await host.next("assignment")).assignment
    await host.close()
    live = lease_pb.HeldAssignment(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id)
    extra = lease_pb.HeldAssignment(task_id="t-extra", attempt=1, lease_id="l")
    again = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await again.connect(["p1"], held=[live] * 1024 + [extra], process_id="P")
        assert (await again.next("assignment")).assignment.resumed
        revoked = (await again.next("revoked")).revoked
        assert (revoked.task_id, revoked.message) == (
            "t-extra",
            "hello.held_assignments[1024]: at most 1024 held assignments",
        )
    finally:
        await again.close()


async def test_an_outbox_report_out_of_range_is_read_within_range(
    cloud: CloudServer, pki_dir: Path, host: ScriptedHost
) -> None:
    """Go's zero time (year 1) as `oldest_at`, more decisions than items: the hello used to be
    refused ("not a time between 1970 and 9999"); a later report so too."""
    report = types_pb2.OutboxBacklog(items=5, decisions=9)
    report.oldest_at.FromDatetime(dt.datetime(1, 1, 1))
    await host.connect(["p1"], outbox=report)
    shown = await _host(cloud, pki_dir, "h1", lambda h: h.outbox.items == 5)
    assert shown.outbox.decisions == 5
    assert not shown.outbox.HasField("oldest_at")
    later = types_pb2.OutboxBacklog(items=-3, refused=2)
    later.oldest_at.FromDatetime(dt.datetime(1970, 1, 1))
    await host.send(lease_pb.LeaseRequest(outbox=later))
    shown = await _host(cloud, pki_dir, "h1", lambda h: h.outbox.refused == 2)
    assert (shown.outbox.items, shown.outbox.decisions) == (0, 0)
    assert not shown.outbox.HasField("oldest_at")
    assert host.inbox.empty()  # never answered, not even with a Rejected


async def test_progress_out_of_range_keeps_the_lease_and_the_result(
    ops: Any, host: ScriptedHost
) -> None:
    """A step status this cloud does not know (a newer host's: proto3 enums are open), a
    negative step, a step limit out of range: the renewal used to be refused (the lease ran
    out) and a result carrying them was refused on every resend."""
    await host.connect(["p1"])
    task = (await submit(ops)).task
    a = (await host.next("assignment")).assignment
    odd = renewal(a, step=-1, summary="newer host")
    odd.renewal.progress.step_status = 6  # type: ignore[assignment]
    odd.renewal.progress.max_steps = -5
    await host.send(odd)
    await host.next("renewed")
    p = (await _task(ops, task.task_id)).progress
    assert (p.step_index, p.step_status, p.max_steps, p.summary) == (
        0,
        types_pb2.STEP_STATUS_UNSPECIFIED,
        0,
        "newer host",
    )
    done = result(a, summary="all done")
    done.result.final_progress.step_status = 77  # type: ignore[assignment]
    done.result.final_progress.max_steps = 99_999
    await host.send(done)
    assert (await host.next("result_ack")).result_ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
    p = (await _task(ops, task.task_id)).progress
    assert (p.step_status, p.max_steps) == (types_pb2.STEP_STATUS_UNSPECIFIED, 10_000)


async def test_summaries_that_are_not_utf8_are_mended_and_a_refusal_names_its_task(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A summary cut in the middle of a character (a C++ host cutting by bytes): the renewal
    and the result used to be refused ("…summary: not valid UTF-8"), the result on every
    resend. A message refused for an id that is not UTF-8 now names its task in `Rejected`."""
    raw = RawHost(cloud.address, pki_dir, "h1")
    try:
        await raw.send(hello(["p1"]).SerializeToString())
        await raw.next("welcome")
        task = (await submit(ops)).task
        a = (await raw.next("assignment")).assignment
        cut = _twin(renewal(a))
        cut.renewal.progress.summary = "tapped “Display".encode()[:-9]  # “ cut after a byte
        await raw.send(cut.SerializeToString())
        await raw.next("renewed")
        assert (await _task(ops, task.task_id)).progress.summary == "tapped \ufffd"
        bad_id = _twin(renewal(a))
        bad_id.renewal.lease_id = b"\xff"
        await raw.send(bad_id.SerializeToString())
        rejected = (await raw.next("rejected")).rejected
        assert (rejected.code, rejected.message, rejected.task_id) == (
            grpc.StatusCode.INVALID_ARGUMENT.value[0],
            "renewal.lease_id: not valid UTF-8",
            task.task_id,
        )
        done = _twin(result(a))
        done.result.summary = b"done \xe2\x80"
        done.result.final_progress.summary = b"\xc3"
        await raw.send(done.SerializeToString())
        assert (await raw.next("result_ack")).result_ack.task_id == task.task_id
        got = await _task(ops, task.task_id)
        assert got.result_summary == "done \ufffd"
        assert got.progress.summary == "\ufffd"
    finally:
        await raw.close()


async def test_a_long_phone_model_is_cut_and_the_fleet_list_still_answers(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """A model name is a report: a 5 MB one used to be stored as it was, and every operator's
    ListHosts then failed (RESOURCE_EXHAUSTED, over a default client's 4 MB)."""
    raw = RawHost(cloud.address, pki_dir, "h1")
    try:
        long_model = hello(["p1"])
        long_model.hello.devices[0].model = "Pixel " * 1_000_000
        await raw.send(long_model.SerializeToString())
        await raw.next("welcome")
        shown = await _host(cloud, pki_dir, "h1", lambda h: h.connected)
        assert shown.devices[0].model == ("Pixel " * 30)[:128]
    finally:
        await raw.close()


async def test_report_text_that_is_not_utf8_or_holds_a_nul_refuses_no_hello(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A phone's model and reason and the agent version are reports (the LeaseService comment:
    never a reason to refuse): a host in C++ or Go reading `getprop ro.product.model` as bytes
    sent one with a NUL or a cut character, and its whole hello was refused ("hello.devices[0].
    model: not valid UTF-8"): no Welcome, every phone idle, its live leases not resumed. The same
    in a DeviceUpdate kept the phone list it replaced. Now they are mended (U+FFFD)."""
    raw = RawHost(cloud.address, pki_dir, "h1")
    try:
        first = _twin(hello(["p1", "p2"]))
        first.hello.agent_version = b"go-host/\xc3"  # "é" cut after its first byte
        first.hello.devices[0].model = b"Pixel\x00 8"
        first.hello.devices[1].model = b"Galaxy \xff"
        first.hello.devices[1].reason = b"screen unreadable\x00"
        await raw.send(first.SerializeToString())
        await raw.next("welcome")
        shown = await _host(cloud, pki_dir, "h1", lambda h: h.connected)
        assert shown.agent_version == "go-host/\ufffd"
        models = {d.serial: (d.model, d.reason) for d in shown.devices}
        assert models == {
            "p1": ("Pixel\ufffd 8", ""),
            "p2": ("Galaxy \ufffd", "screen unreadable\ufffd"),
        }
        update = _twin(lease_pb.LeaseRequest(device_update=lease_pb.DeviceUpdate()))
        phone = update.device_update.devices.add()
        phone.serial, phone.model, phone.state = (
            b"p3",
            b"Moto\xe2\x80",
            types_pb2.DEVICE_STATE_ONLINE,
        )
        await raw.send(update.SerializeToString())
        shown = await _host(cloud, pki_dir, "h1", lambda h: [d.serial for d in h.devices] == ["p3"])
        assert shown.devices[0].model == "Moto\ufffd"
        task = (await submit(ops)).task  # the phone it reported is given work
        assert (await raw.next("assignment")).assignment.task_id == task.task_id
    finally:
        await raw.close()


async def test_a_replay_report_whose_text_is_not_utf8_leaves_the_result_recorded(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """TaskResult.replay is never a reason to refuse the result (its comment: a report that
    cannot be used is left out, the result recorded). A divergence reason holding a NUL or a cut
    character refused the whole result (INVALID_ARGUMENT "result.replay.reason: …"), which a
    host drops as final: the finished work was lost and the task ran again after its lease."""
    raw = RawHost(cloud.address, pki_dir, "h1")
    try:
        await raw.send(
            hello(["p1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT).SerializeToString()
        )
        await raw.next("welcome")
        tasks = [(await submit(ops)).task for _ in range(2)]
        await raw.send(
            _twin(lease_pb.LeaseRequest(device_update=lease_pb.DeviceUpdate(devices=[
                types_pb2.Device(serial=s, state=types_pb2.DEVICE_STATE_ONLINE)
                for s in ("p1", "p2")
            ]))).SerializeToString()
        )  # fmt: skip
        got = [(await raw.next("assignment")).assignment for _ in tasks]
        for a, (flow_id, reason) in zip(
            got,
            [(b"f1", b"diverged at \xe2\x80"), (b"f\x002", b"no switch\x00 found")],
            strict=True,
        ):
            done = _twin(result(a))
            done.result.replay.flow_id = flow_id
            done.result.replay.steps_replayed = 1
            done.result.replay.diverged = True
            done.result.replay.diverged_at_step = 2
            done.result.replay.reason = reason
            await raw.send(done.SerializeToString())
            ack = (await raw.next("result_ack")).result_ack
            assert (ack.task_id, ack.task_status) == (a.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        for t in tasks:
            assert (await _task(ops, t.task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED
    finally:
        await raw.close()
