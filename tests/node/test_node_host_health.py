"""The Node example host keeps a phone whose screen cannot be read out of work until a probe
reads it, as the Python host does (host/devices/health.py, tests/e2e/test_unreadable_phone.py).

Real parts: `amc cloud serve` (SQLite, mTLS, the offline planner) or the in-test LeaseService
of tests/host/lease_fake.py (it sends an assignment the real cloud sends only in a race), a
virtual phone served over the adb protocol whose dumper crashes natively ("Segmentation fault")
on every try, as a phone without a working `uiautomator` does, and host.js as its own process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amc.v1 import fleet_service_pb2, lease_service_pb2, task_service_pb2, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import (
    Rig,
    cloud_and_phone,
    dark_theme_task,
    fake_cloud_and_phones,
    running_host,
    spawn_host,
)
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_phones import _phones
from tests.support.waiting import until

__all__ = ["node"]

#: Unhealthy after two unreadable attempts in a row, probed every half second (a probe is
#: started by the phone poll, so that is read every half second too, not every 2 s).
HEALTH = {
    "AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS": "2",
    "AMC_HOST_UNHEALTHY_PROBE_S": "0.5",
    "AMC_HOST_DEVICE_POLL_INTERVAL_S": "0.5",
}

#: An attempt's statuses once it has ended.
ENDED = (
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_CANCELLED,
)


#: Why the cloud keeps out a phone whose last probe's look came without a UI tree.
TREELESS_REASON = (
    "phone emulator-5554 is unhealthy: its last probe failed: its look came without a UI tree"
)


async def _reason(rig: Rig, serial: str) -> str:
    """Why the cloud keeps the Node host's phone out, as it knows it now."""
    hosts = (await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
    return next(
        (d.reason for h in hosts if h.host_id == HOST_ID for d in h.devices if d.serial == serial),
        "",
    )


async def test_an_unreadable_phone_stops_taking_work_until_a_probe_reads_it(
    node: str, tmp_path: Path
) -> None:
    """Every attempt host.js ran on a phone that can never be read ended retryable, so the task
    used up all its attempts there. After two in a row it now reports the phone OFFLINE (the
    cloud offers it nothing), probes it with a look and takes work again once a look works:
    the task's next attempt runs there and succeeds."""
    phone = VirtualPhone("emulator-5554")
    phone.glitch_every(1, "segfault")
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await dark_theme_task(rig.client, max_attempts=5)
        get = task_service_pb2.GetTaskRequest(task_id=task_id)
        host = await spawn_host(
            node, rig.address, rig.pki, HOST_ID, rig.adb_port, tmp_path / "host-data", **HEALTH
        )
        try:

            async def ran_twice() -> bool:
                task: types_pb2.Task = (await rig.client.tasks.GetTask(get, timeout=10)).task
                # Ended, not only "not running": an attempt still ASSIGNED passed that, and
                # the task read after it was still RUNNING its second attempt.
                return len(task.attempts) >= 2 and all(a.status in ENDED for a in task.attempts)

            async def kept_out() -> bool:
                return (await _phones(rig)).get(phone.serial) == types_pb2.DEVICE_STATE_OFFLINE

            await until(ran_twice, 90, "two attempts on the unreadable phone")
            await until(kept_out, 30, "the unreadable phone reported OFFLINE")
            kept = (await rig.client.tasks.GetTask(get, timeout=10)).task

            phone.glitch_every(0)  # mended: its dumps work again

            async def succeeded() -> bool:
                task: types_pb2.Task = (await rig.client.tasks.GetTask(get, timeout=10)).task
                return task.status == types_pb2.TASK_STATUS_SUCCEEDED

            await until(succeeded, 90, "the task run on the phone once it is read")
            back = await _phones(rig)
            final = (await rig.client.tasks.GetTask(get, timeout=10)).task
        finally:
            if host.returncode is None:
                host.kill()
            _, err = await host.communicate()
    said = err.decode()
    unreadable = [a for a in final.attempts if "cannot show its screen" in a.failure_reason]
    assert len(unreadable) == 2, ([a.failure_reason for a in final.attempts], said)
    assert kept.status == types_pb2.TASK_STATUS_QUEUED, (kept, said)  # not failed: it waits
    assert len(kept.attempts) == 2, (kept, said)  # none sent to the phone kept out
    assert back == {phone.serial: types_pb2.DEVICE_STATE_ONLINE}, said
    assert "can be read again" in said, said


async def test_an_assignment_on_an_unhealthy_phone_is_refused_saying_why(
    node: str, tmp_path: Path
) -> None:
    """An assignment on its way to a phone host.js keeps out of work (the cloud had not read
    its DeviceUpdate): it ran, and used one more attempt on a phone that cannot be read. As
    the Python host does, it is refused (FAILED, retryable, ASSIGNMENT_REFUSAL_PHONE_UNHEALTHY)
    with words saying what failed and how it clears, and the cloud heard the phone OFFLINE
    before the second attempt's result."""
    phone = VirtualPhone("emulator-5554")
    phone.glitch_every(1, "segfault")
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        cloud.renew_s = 10.0

        def result(task_id: str) -> lease_service_pb2.TaskResult | None:
            return next((r for r in cloud.results if r.task_id == task_id), None)

        async with running_host(
            node,
            rig,
            HOST_ID,
            tmp_path / "host-data",
            AMC_HOST_UNHEALTHY_AFTER_ATTEMPTS="2",
            AMC_HOST_UNHEALTHY_PROBE_S="600",  # no probe clears it while the test runs
        ) as run:
            await cloud.wait_for(lambda: cloud.hellos, 60)
            for task_id in ("t1", "t2", "t3"):
                await cloud.assign(task_id, phone.serial, "Turn on dark theme")
                await cloud.wait_for(lambda t=task_id: result(t), 60)  # type: ignore[misc]
    said = run.said
    ran, refused = [result("t1"), result("t2")], result("t3")
    assert all(r and "cannot show its screen" in r.summary and r.retryable for r in ran), said
    assert refused is not None
    assert refused.refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_PHONE_UNHEALTHY, (refused, said)
    assert (refused.status, refused.retryable) == (types_pb2.TASK_STATUS_FAILED, True), said
    assert refused.summary.startswith(
        "phone emulator-5554 is unhealthy: its screen could not be read in 2 attempts in a row "
        "(last: phone emulator-5554 cannot show its screen: "
    ), refused.summary
    assert "restart the host to clear it" in refused.summary, refused.summary
    kinds = [r.WhichOneof("kind") for r in cloud.received]
    second = [i for i, r in enumerate(cloud.received) if r.WhichOneof("kind") == "result"][1]
    last_update = max(i for i, k in enumerate(kinds[:second]) if k == "device_update")
    states = {d.serial: d.state for d in cloud.received[last_update].device_update.devices}
    assert states == {phone.serial: types_pb2.DEVICE_STATE_OFFLINE}, said


async def test_a_dark_phone_stays_out_of_work_through_its_probes_and_a_brief_unplug(
    node: str, tmp_path: Path
) -> None:
    """A phone whose display stays off fails every look at `readyScreen`, but its dumps work:
    host.js probed it with one dump, put it back to work and it burnt two more attempts, again
    and again (as the Python host did before 8e70f64). The probe now takes the attempt's look,
    so the phone stays out until its display works. A poll that missed the phone (unplugged
    for a moment) cleared the mark too; now only forgetting the phone does, as in Python."""
    phone = VirtualPhone("emulator-5554")
    phone.stays_dark = True
    phone.sleep()
    said: list[str] = []

    def probes_failed() -> int:
        return sum("still unreadable" in line and "display stayed off" in line for line in said)

    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await dark_theme_task(rig.client, max_attempts=5)
        get = task_service_pb2.GetTaskRequest(task_id=task_id)
        host = await spawn_host(
            node, rig.address, rig.pki, HOST_ID, rig.adb_port, tmp_path / "host-data", **HEALTH
        )
        assert host.stderr is not None
        stderr = host.stderr

        async def read() -> None:
            while line := (await stderr.readline()).decode():
                said.append(line)

        reader = asyncio.create_task(read())
        try:
            await until(lambda: probes_failed() >= 1, 90, "a probe that finds the display off")
            listed = rig.adb.lists_answered
            rig.adb.unplug(phone.serial)
            await until(lambda: rig.adb.lists_answered >= listed + 2, 30, "a list without it")
            rig.adb.replug(phone.serial)
            before = probes_failed()
            await until(lambda: probes_failed() > before, 90, "a probe once it is back")
            kept = (await rig.client.tasks.GetTask(get, timeout=10)).task
            phone.stays_dark = False  # mended: the next probe wakes it and reads it

            async def succeeded() -> bool:
                task: types_pb2.Task = (await rig.client.tasks.GetTask(get, timeout=10)).task
                return task.status == types_pb2.TASK_STATUS_SUCCEEDED

            await until(succeeded, 90, "the task run on the phone once it shows its screen")
            final = (await rig.client.tasks.GetTask(get, timeout=10)).task
        finally:
            if host.returncode is None:
                host.kill()
            await host.wait()
            await reader
    log = "".join(said)
    assert kept.status == types_pb2.TASK_STATUS_QUEUED, (kept, log)  # not failed: it waits
    assert len(kept.attempts) == 2, (kept, log)  # none sent to the phone kept out
    dark = [a for a in final.attempts if "display stayed off" in a.failure_reason]
    assert len(dark) == 2, ([a.failure_reason for a in final.attempts], log)
    assert "can be read again" in log, log


async def test_a_probe_whose_look_gives_no_tree_keeps_the_phone_out(
    node: str, tmp_path: Path
) -> None:
    """A look whose dumps all fail with a passing error ("could not get idle state" on every
    try) still answers, without a tree (`ui_tree_missing`). host.js's probe took that for a
    look that works and put the phone back to work, where every attempt planned blind. Now
    such a probe fails, saying so, and the phone stays OFFLINE until a look gives a tree; the
    reason the cloud keeps for it says so (before, only what the attempts said: a crash)."""
    phone = VirtualPhone("emulator-5554")
    phone.glitch_every(1, "segfault")
    said: list[str] = []

    def after(start: int, words: str) -> bool:
        return any(words in line for line in said[start:])

    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await dark_theme_task(rig.client, max_attempts=5)
        get = task_service_pb2.GetTaskRequest(task_id=task_id)
        host = await spawn_host(
            node, rig.address, rig.pki, HOST_ID, rig.adb_port, tmp_path / "host-data", **HEALTH
        )
        assert host.stderr is not None
        stderr = host.stderr

        async def read() -> None:
            while line := (await stderr.readline()).decode():
                said.append(line)

        async def kept_out() -> bool:
            return (await _phones(rig)).get(phone.serial) == types_pb2.DEVICE_STATE_OFFLINE

        reader = asyncio.create_task(read())
        try:
            await until(lambda: after(0, "is unhealthy"), 90, "the phone kept out of work")
            await until(kept_out, 30, "the unreadable phone reported OFFLINE")
            phone.glitch_every(1, "idle")  # its dumps now answer, never with a tree
            start = len(said)
            treeless = "still unreadable: its look came without a UI tree"
            await until(
                lambda: after(start, treeless) or after(start, "can be read again"),
                90,
                "a probe of the phone whose dumps give no tree",
            )
            judged = "".join(said[start:])
            out_meanwhile = await kept_out()
            # The host says it on stderr before its device update reaches the cloud.
            for _ in range(300):
                reason = await _reason(rig, phone.serial)
                if reason.startswith(TREELESS_REASON):
                    break
                await asyncio.sleep(0.1)
            kept = (await rig.client.tasks.GetTask(get, timeout=10)).task
            phone.glitch_every(0)  # mended: its dumps give a tree again

            async def succeeded() -> bool:
                task: types_pb2.Task = (await rig.client.tasks.GetTask(get, timeout=10)).task
                return task.status == types_pb2.TASK_STATUS_SUCCEEDED

            await until(succeeded, 90, "the task run on the phone once a look gives a tree")
        finally:
            if host.returncode is None:
                host.kill()
            await host.wait()
            await reader
    log = "".join(said)
    assert "can be read again" not in judged, log
    assert "could not get idle state" in judged, log
    assert out_meanwhile, log
    # The reason the cloud keeps says what the probe found, not only what the attempts did.
    assert reason.startswith(TREELESS_REASON), (reason, log)
    assert kept.status == types_pb2.TASK_STATUS_QUEUED, (kept, log)
    assert len(kept.attempts) == 2, (kept, log)  # none sent to the phone kept out
    assert "can be read again" in log, log


async def test_a_phone_left_on_a_screen_without_a_tree_is_probed_from_home(
    node: str, tmp_path: Path
) -> None:
    """A phone kept out (its dumper crashed), then mended, but left on an app whose screen
    never goes idle (a game, a video, a Flutter app): every dump there fails. host.js's probe
    looked at that app each time, refused the missing tree, and nothing moved the phone off
    it: it stayed out for good. The probe now presses HOME before its look: the launcher
    gives a tree, and the phone takes work again."""
    phone = VirtualPhone("emulator-5554")
    phone.glitch_every(1, "segfault")
    game = "com.android.calculator2"
    said: list[str] = []

    def treeless_probes() -> int:
        return sum("still unreadable: its look came without a UI tree" in line for line in said)

    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        await dark_theme_task(rig.client, max_attempts=5)  # its attempts mark the phone
        host = await spawn_host(
            node, rig.address, rig.pki, HOST_ID, rig.adb_port, tmp_path / "host-data", **HEALTH
        )
        assert host.stderr is not None
        stderr = host.stderr

        async def read() -> None:
            while line := (await stderr.readline()).decode():
                said.append(line)

        reader = asyncio.create_task(read())
        try:
            await until(lambda: any("is unhealthy" in line for line in said), 90, "kept out")
            phone.never_idle = {game}
            assert phone.launch(game) and phone.current_package() == game
            phone.glitch_every(0)  # mended, but on a screen that never gives a tree
            await until(
                lambda: treeless_probes() >= 2 or any("can be read again" in x for x in said),
                90,
                "the phone back at work, or two probes refused for the missing tree",
            )
            judged = "".join(said)
        finally:
            if host.returncode is None:
                host.kill()
            await host.wait()
            await reader
    log = "".join(said)
    assert "can be read again" in judged, log
    assert phone.current_package() != game, log
