"""The Node example host refuses an assignment it cannot run, as the Python host does
(host/lease_client.py, `_cannot_run`): nothing runs, and the cloud gives the task to another
phone without counting the attempt.

Real parts: the in-test LeaseService of tests/host/lease_fake.py (real mTLS, a real stream: it
sends assignments the real cloud would send only in a race, for a phone it has not yet heard is
busy or offline), virtual phones served over the adb protocol, and host.js as its own process.
"""

from __future__ import annotations

from pathlib import Path

from amc.v1 import lease_service_pb2, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import fake_cloud_and_phones, running_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.waiting import until

__all__ = ["node"]


async def test_the_node_host_refuses_a_busy_offline_or_unknown_phone_as_the_python_host_does(
    node: str, tmp_path: Path
) -> None:
    """Assignments for the phone running t1, for a phone adb lists offline and for a phone the
    host does not drive. host.js ran each of them: the second attempt drove the busy phone
    alongside the first, and the others failed retryable ("phone … disconnected") after trying
    the phone, each using one of its task's attempts. As the Python host does, it now refuses
    them at once, with the same result: FAILED, retryable, `refusal` PHONE_BUSY, PHONE_OFFLINE
    or PHONE_NOT_ATTACHED and the same words, and never renews their leases."""
    busy, offline = VirtualPhone("emulator-5554"), VirtualPhone("emulator-5556")
    busy.hang_dumps(300)  # t1's first look: the phone is busy until the test ends
    offline.set_adb_state("offline")
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [busy, offline]) as rig:
        cloud = rig.cloud
        cloud.renew_s = 10.0  # the real cloud always sets Assignment.renew_interval

        def result(task_id: str) -> lease_service_pb2.TaskResult | None:
            return next((r for r in cloud.results if r.task_id == task_id), None)

        try:
            async with running_host(node, rig, HOST_ID, tmp_path / "host-data") as run:
                await cloud.wait_for(lambda: cloud.hellos, 60)
                await cloud.assign("t1", busy.serial, "Turn on dark theme")
                await until(lambda: busy.dumper is not None, 60, "t1's first look under way")
                await cloud.assign("t2", busy.serial, "Turn on dark theme")
                await cloud.assign("t3", offline.serial, "Turn on dark theme")
                await cloud.assign("t4", "emulator-9999", "Turn on dark theme")
                await cloud.wait_for(lambda: all(result(t) for t in ("t2", "t3", "t4")), 60)
        finally:
            rig.adb.unplug(busy.serial)  # ends the hung look
    said = run.said
    refused = {t: result(t) for t in ("t2", "t3", "t4")}
    assert {t: (r.status, r.retryable) for t, r in refused.items() if r} == {
        t: (types_pb2.TASK_STATUS_FAILED, True) for t in refused
    }, said
    assert {t: (r.refusal, r.summary) for t, r in refused.items() if r} == {
        "t2": (
            lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_BUSY,
            "phone emulator-5554 is busy with another task",
        ),
        "t3": (
            lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_OFFLINE,
            "phone emulator-5556 is offline",
        ),
        "t4": (
            lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_NOT_ATTACHED,
            "phone emulator-9999 is not attached to this host",
        ),
    }, said
    renewed = {r.renewal.task_id for r in cloud.received if r.WhichOneof("kind") == "renewal"}
    assert renewed == {"t1"}, said  # nothing ran for the refused ones
    assert result("t1") is None, said  # t1 runs on, untouched


async def test_an_assignment_past_grpc_js_default_4_mb_is_heard(node: str, tmp_path: Path) -> None:
    """The cloud sends messages of up to 16 MB, and the Python host takes as much; host.js kept
    grpc-js's 4 MB limit, so a bigger assignment ended its stream RESOURCE_EXHAUSTED and was
    never answered. Now it is heard: here refused, its phone not being attached."""
    async with (
        fake_cloud_and_phones(tmp_path, HOST_ID) as rig,
        running_host(node, rig, HOST_ID, tmp_path / "host-data") as run,
    ):
        cloud = rig.cloud
        await cloud.wait_for(lambda: cloud.hellos, 60)
        await cloud.assign("big", "emulator-9999", "x" * (5 * 1024 * 1024))
        await cloud.wait_for(lambda: any(r.task_id == "big" for r in cloud.results), 60)
    [refused] = [r for r in cloud.results if r.task_id == "big"]
    assert refused.refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_NOT_ATTACHED, run.said


async def test_an_assignment_without_a_lease_id_is_not_held(node: str, tmp_path: Path) -> None:
    """host.js held an assignment whatever its lease id, run (`runTask`) or refused (`refuse`),
    so every hello after named a lease with an empty id. It now holds none without a lease id:
    it logs it and leaves it; the next hello names no such lease."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)  # had it run, its first look would last until the test ends
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        try:
            async with running_host(node, rig, HOST_ID, tmp_path / "host-data") as run:
                await cloud.wait_for(lambda: cloud.hellos, 60)
                for task_id, serial in (("run", phone.serial), ("refuse", "emulator-9999")):
                    assignment = lease_service_pb2.Assignment(
                        task_id=task_id, attempt=1, lease_id="", device_serial=serial, goal="g"
                    )
                    await cloud.send(lease_service_pb2.LeaseResponse(assignment=assignment))
                await cloud.assign("marker", "emulator-9999", "g")  # answered after both
                await cloud.wait_for(lambda: any(r.task_id == "marker" for r in cloud.results), 60)
                cloud.cut()
                await cloud.wait_for(lambda: len(cloud.hellos) >= 2, 60)
        finally:
            rig.adb.unplug(phone.serial)
    said = run.said
    held = {(h.task_id, h.lease_id) for h in cloud.hellos[-1].held_assignments}
    assert {task_id for task_id, _ in held} <= {"marker"}, (held, said)
    assert said.count("has no lease id") == 2, said


async def test_a_refused_assignment_waiting_for_its_answer_is_not_named_in_a_hello(
    node: str, tmp_path: Path
) -> None:
    """The cloud leaves a refusal unanswered and the stream drops. Before, host.js named the
    refused assignment's lease in its next hello among those it holds, so the cloud kept that
    lease for it (a lapsed one given a new term) until the refusal came again, though nothing
    of it ran here. As the Python host does (`_hello`), it names no lease whose result is
    retryable: the refusal is sent again, the lease not named."""
    async with (
        fake_cloud_and_phones(tmp_path, HOST_ID) as rig,
        running_host(node, rig, HOST_ID, tmp_path / "host-data") as run,
    ):
        cloud = rig.cloud
        cloud.ack_results = False
        await cloud.wait_for(lambda: cloud.hellos, 60)
        await cloud.assign("t1", "emulator-9999", "g")
        await cloud.wait_for(lambda: cloud.results, 60)
        cloud.cut()
        await cloud.wait_for(lambda: len(cloud.hellos) >= 2, 60)
        await cloud.wait_for(lambda: len(cloud.results) >= 2, 60)  # sent again on the new stream
    said = run.said
    assert not cloud.hellos[-1].held_assignments, (cloud.hellos[-1], said)
    assert {r.refusal for r in cloud.results} == {
        lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_NOT_ATTACHED
    }, said
