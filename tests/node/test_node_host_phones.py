"""The Node example host on phones as they are found on a desk: asleep, locked, plugged in and
out while it runs.

Real parts: `amc cloud serve` (SQLite, mTLS, offline planner) as its own process, virtual phones
served over the adb protocol, and host.js as its own process. Each behaviour is compared with
the Python host's (host/perception/perceive.py `ready_screen`, host/devices/registry.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from amc.v1 import fleet_service_pb2, task_service_pb2, types_pb2
from host.devices.adb_errors import no_adb_server_reason, state_fix
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import Rig, cloud_and_phone, dark_theme_task, start_host
from tests.node.test_node_host import HOST_ID, _one_task, node
from tests.support.processes import wait_task
from tests.support.waiting import until

__all__ = ["node"]

#: A short phone poll (host.js reads adb's list every 2 s by default) for the tests that wait
#: for it to see a phone come, go or finish booting.
QUICK_POLL_S = "0.2"


@pytest.mark.parametrize(
    ("lock", "sdk", "menu_unlocks"),
    [("none", 34, True), ("swipe", 34, True), ("swipe", 25, False)],
    ids=["asleep", "swipe-locked", "swipe-locked-before-android-8"],
)
async def test_the_node_host_wakes_a_sleeping_phone_and_dismisses_a_swipe_lock(
    node: str, tmp_path: Path, lock: str, sdk: int, menu_unlocks: bool
) -> None:
    """host.js never woke a phone: on one whose screen was off (or swipe-locked) every tap
    fell on a dark screen and the task failed. As the Python host does before each look, it
    now wakes it (KEYCODE_WAKEUP) and dismisses a lock screen that needs no credential
    (`wm dismiss-keyguard`; before Android 8, which has no such command, MENU and then a swipe
    up while the lock screen is still there)."""
    phone = VirtualPhone("emulator-5554")
    phone.sdk = sdk
    phone.menu_unlocks = menu_unlocks
    if lock == "swipe":
        phone.set_screen_lock("swipe")
    phone.sleep()
    said, final, _ = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert (phone.awake, phone.locked) == (True, False), said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert phone.state.flag("dark_theme")


async def test_the_node_host_never_guesses_a_pin_and_says_so(node: str, tmp_path: Path) -> None:
    """A lock screen that needs a PIN is a person's to open: the Python host wakes the phone,
    types nothing, and fails the attempt saying to unlock it by hand. host.js carried on
    against the lock screen (its taps going to the PIN pad) until its step limit."""
    phone = VirtualPhone("emulator-5554")
    phone.set_screen_lock("pin", "2580")
    phone.sleep()
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert final.status == types_pb2.TASK_STATUS_FAILED, said
    assert "needs a PIN, pattern or password" in final.attempts[0].failure_reason, said
    assert "unlock the phone by hand" in final.attempts[0].failure_reason
    assert not decisions  # nothing was planned, nothing tapped or typed on the lock screen
    assert phone.awake and phone.locked and not phone.state.flag("dark_theme")


async def _phones(rig: Rig) -> dict[str, types_pb2.DeviceState.ValueType]:
    """The Node host's phones as the cloud knows them now, by id."""
    hosts = (await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
    return {d.serial: d.state for h in hosts if h.host_id == HOST_ID for d in h.devices}


async def _task_and_quick_host(
    node: str, rig: Rig, tmp_path: Path, *, max_attempts: int
) -> tuple[str, asyncio.subprocess.Process]:
    """A "Turn on dark theme" task that may run `max_attempts` times, and host.js started for
    it, reading adb's list every QUICK_POLL_S: the task's id and the host's process."""
    task_id = await dark_theme_task(rig.client, max_attempts=max_attempts)
    host = await start_host(
        node, rig, HOST_ID, tmp_path / "host-data", AMC_HOST_DEVICE_POLL_INTERVAL_S=QUICK_POLL_S
    )
    return task_id, host


async def _first_attempt(
    rig: Rig,
    host: asyncio.subprocess.Process,
    task_id: str,
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> tuple[str, types_pb2.Task, dict[str, types_pb2.DeviceState.ValueType]]:
    """Runs `meanwhile` (what befalls the phone while host.js runs its one task), then waits for
    host.js to exit and the task's first attempt to end: what the host said, the task, and the
    phones as the cloud then knows them. The host is killed if anything fails first."""
    try:
        if meanwhile is not None:
            await meanwhile()
        _, err = await asyncio.wait_for(host.communicate(), 120)
        final = await wait_task(
            rig.client,
            task_id,
            lambda t: t.attempts and t.attempts[0].status != types_pb2.TASK_STATUS_RUNNING,
            30,
        )
        phones = await _phones(rig)
    finally:
        if host.returncode is None:
            host.kill()
            await host.wait()
    return err.decode(), final, phones


async def test_the_node_host_tells_the_cloud_of_phones_plugged_in_and_out_while_it_runs(
    node: str, tmp_path: Path
) -> None:
    """host.js read adb's phone list once, at start: a phone plugged in later was never
    offered a task, and one unplugged stayed ONLINE in the cloud, which kept assigning it
    tasks that failed. As the Python host does (host/devices/registry.py, polled every 2 s),
    it now watches the list and sends the whole of it in a DeviceUpdate whenever it changes:
    a phone that came is ONLINE and runs a task; one that went is OFFLINE (kept, so the cloud
    learns it went); one adb lists as unauthorized is UNAUTHORIZED, given no task."""
    first, second, third = (VirtualPhone(s) for s in ("emulator-5554", "emulator-5556", "R58M"))
    async with cloud_and_phone(tmp_path, first, HOST_ID) as rig:
        host = await start_host(
            node, rig, HOST_ID, tmp_path / "host-data", AMC_HOST_DEVICE_POLL_INTERVAL_S=QUICK_POLL_S
        )
        try:
            online = types_pb2.DEVICE_STATE_ONLINE

            async def phones_are(expected: dict[str, types_pb2.DeviceState.ValueType]) -> bool:
                return await _phones(rig) == expected

            await until(lambda: phones_are({first.serial: online}), 30, "the hello's phone")
            rig.adb.add_phone(second)
            third.set_adb_state("unauthorized")
            rig.adb.add_phone(third)
            await until(
                lambda: phones_are(
                    {
                        first.serial: online,
                        second.serial: online,
                        third.serial: types_pb2.DEVICE_STATE_UNAUTHORIZED,
                    }
                ),
                30,
                "the phones plugged in",
            )
            rig.adb.unplug(first.serial)
            await until(
                lambda: phones_are(
                    {
                        first.serial: types_pb2.DEVICE_STATE_OFFLINE,
                        second.serial: online,
                        third.serial: types_pb2.DEVICE_STATE_UNAUTHORIZED,
                    }
                ),
                30,
                "the phone unplugged",
            )
            task_id = await dark_theme_task(rig.client, max_attempts=1)
            _, err = await asyncio.wait_for(host.communicate(), 240)
            said = err.decode()
            final = await wait_task(
                rig.client, task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
            )
        finally:
            if host.returncode is None:
                host.kill()
                await host.wait()
    assert host.returncode == 0, said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert final.device_serial == second.serial
    assert second.state.flag("dark_theme") and not first.state.flag("dark_theme")


async def test_a_phone_unplugged_mid_task_ends_its_attempt_retryable(
    node: str, tmp_path: Path
) -> None:
    """A phone pulled off its cable while host.js looks at its screen: host.js ended the
    attempt with "host error: Failure: 'device … not found'", not retryable, and the task
    failed for good for a wiggled cable. As the Python host does (DeviceGone), the attempt
    now ends retryable, saying the phone disconnected, and the task waits for a phone."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(120)  # the first look is under way until the phone goes
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await dark_theme_task(rig.client, max_attempts=2)
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data")

        async def unplug() -> None:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            rig.adb.unplug(phone.serial)

        said, final, _ = await _first_attempt(rig, host, task_id, unplug)
    assert final.attempts[0].failure_reason.startswith("phone emulator-5554 disconnected"), said
    assert final.status == types_pb2.TASK_STATUS_QUEUED, said  # retryable: it waits for a phone


async def test_a_look_the_phone_never_answers_ends_its_attempt_retryable(
    node: str, tmp_path: Path
) -> None:
    """Every dump waits for an idle screen that never comes (a stuck phone, an adbd that never
    answers). host.js waited on the first for good: the step hung while its lease was renewed,
    and the task never ended. As the Python host bounds them (`dump_timeout_s` 30 s, a look's
    dumps together `hierarchy_deadline_s` 45 s), the dump gives up at its timeout, no second
    one starts that could not end within the look's deadline, and the attempt ends retryable.
    Both are set a tenth as long here, through the settings of those names (30 s of waiting
    were most of the test's time)."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(600, count=5)
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await dark_theme_task(rig.client, max_attempts=2)
        host = await start_host(
            node,
            rig,
            HOST_ID,
            tmp_path / "host-data",
            AMC_HOST_DUMP_TIMEOUT_S="3",
            AMC_HOST_HIERARCHY_DEADLINE_S="4.5",
        )
        try:
            said, final, _ = await _first_attempt(rig, host, task_id)
        finally:
            rig.adb.unplug(phone.serial)  # ends the hung dump
    assert final.attempts[0].failure_reason == (
        "host error: uiautomator dump gave no tree in 1 try: "
        "adb shell uiautomator did not answer within 3 s"
    ), said
    assert final.status != types_pb2.TASK_STATUS_FAILED, said  # retryable: it runs again


async def test_a_node_host_told_to_run_one_task_takes_no_second_one(
    node: str, tmp_path: Path
) -> None:
    """host.js with AMC_TASKS=1 ran every assignment it was sent, however many: on two free
    phones it ran two tasks, and one sent as it ended its stream (the next attempt of a task
    whose attempt ended retryable on the same phone, as in the hung-dump test above under load)
    ran on with no stream to report to; its result, resent every 5 s, kept host.js from ever
    exiting. As its last task starts it now tells the cloud it is stopping (HostStopping: no
    assignment after it), and refuses one already on its way (ASSIGNMENT_REFUSAL_HOST_STOPPING:
    nothing ran, the task is queued again without counting the attempt)."""
    first, second = VirtualPhone("emulator-5554"), VirtualPhone("emulator-5556")
    async with cloud_and_phone(tmp_path, first, HOST_ID, more=[second]) as rig:
        submitted = [await dark_theme_task(rig.client, max_attempts=1) for _ in range(2)]
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data")
        try:
            _, err = await asyncio.wait_for(host.communicate(), 120)
        finally:
            if host.returncode is None:
                host.kill()
                await host.wait()
        said = err.decode()
        ended = [
            await wait_task(
                rig.client, task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 30
            )
            for task_id in submitted
        ]
    assert host.returncode == 0, said
    assert sorted(types_pb2.TaskStatus.Name(t.status) for t in ended) == [
        "TASK_STATUS_QUEUED",
        "TASK_STATUS_SUCCEEDED",
    ], said
    assert [first.state.flag("dark_theme"), second.state.flag("dark_theme")].count(True) == 1


async def test_an_adb_server_gone_takes_every_phone_offline_at_once_and_a_failing_step_retryable(
    node: str, tmp_path: Path
) -> None:
    """The adb server stops while host.js looks at a phone's screen. host.js took a server it
    could not reach for a device list that failed: its phones stayed ONLINE until three lists
    in a row had failed, and the step that failed meanwhile ended "host error: …", not
    retryable, so the task failed for good for an adb server restart. As the Python host does
    (host/devices/registry.py: an unreachable server makes every phone OFFLINE), the phones go
    OFFLINE at the first poll and the attempt ends retryable, saying the phone disconnected."""
    phone = VirtualPhone("emulator-5554")
    # The first look is under way until the server goes (stopped as soon as the dump
    # starts). The virtual server's stop waits for that shell command, so the look ends when
    # the hang does: 10 s is far more than the test needs; 30 s were most of its time.
    phone.hang_dumps(10)
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await dark_theme_task(rig.client, max_attempts=2)
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data")

        async def stop_the_server() -> None:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            await rig.adb.stop()

        said, final, phones = await _first_attempt(rig, host, task_id, stop_the_server)
    reason = final.attempts[0].failure_reason
    # The Python host's words (host/devices/adb_errors.py, `no_server`), which
    # docs/deployment.md gives for both hosts: "disconnected" sends the operator to a sound cable.
    assert reason.startswith("phone emulator-5554 is out of sight ("), said
    assert reason.endswith(
        f": no adb server): {no_adb_server_reason('127.0.0.1', rig.adb_port)}"
    ), said
    assert final.status == types_pb2.TASK_STATUS_QUEUED, said  # retryable: it waits for a phone
    assert phones == {phone.serial: types_pb2.DEVICE_STATE_OFFLINE}, said


async def test_the_node_host_never_starts_an_adb_server_the_operator_stopped(
    node: str, tmp_path: Path
) -> None:
    """The operator stops the adb server (`adb kill-server`: to update adb, to hand the phones
    to another tool) while host.js runs a task. adbkit, refused a connection, runs `adb -P
    <port> start-server` itself: the next step's shell call started a server the operator had
    stopped. As the Python host does (host/devices/adb_transport.py), host.js now never starts
    one: the step fails, the phone is OFFLINE and the attempt ends retryable, saying no adb
    server answers. No adb program can run here (the virtual phone's server is the adb
    server), so the `adb` on the host's PATH is a stand-in that notes that it was run."""
    ran = tmp_path / "adb-ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "adb").write_text(f'#!/bin/sh\necho "$@" >> "{ran}"\n', encoding="utf-8")
    (bin_dir / "adb").chmod(0o755)
    phone = VirtualPhone("emulator-5554")
    stopping: list[asyncio.Task[None]] = []
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        loop = asyncio.get_running_loop()

        def stop_the_server() -> None:
            loop.call_soon_threadsafe(lambda: stopping.append(loop.create_task(rig.adb.stop())))

        phone.interrupt_after(1, stop_the_server)  # right after step 1's tap: step 2 finds none
        task_id = await dark_theme_task(rig.client, max_attempts=2)
        path = f"{bin_dir}:{os.environ.get('PATH', '')}"
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data", path=path)
        try:
            said, final, phones = await _first_attempt(rig, host, task_id)
        finally:
            await asyncio.gather(*stopping)
    assert stopping, said  # the tap was made and the server stopped
    assert not ran.exists(), ran.read_text()
    reason = final.attempts[0].failure_reason
    # The Python host's words (host/devices/adb_errors.py, `no_server`), which
    # docs/deployment.md gives for both hosts: "disconnected" sends the operator to a sound cable.
    assert reason.startswith("phone emulator-5554 is out of sight ("), said
    assert reason.endswith(
        f": no adb server): {no_adb_server_reason('127.0.0.1', rig.adb_port)}"
    ), said
    assert final.status == types_pb2.TASK_STATUS_QUEUED, said  # retryable: it waits for a phone
    assert phones == {phone.serial: types_pb2.DEVICE_STATE_OFFLINE}, said


async def test_the_node_host_reports_each_phones_model_as_the_phone_names_it(
    node: str, tmp_path: Path
) -> None:
    """host.js told the cloud every phone's model was "adb device": an operator's fleet list
    could not tell a Pixel from a Galaxy. As the Python host does (host/devices/registry.py,
    `_model`), it now reads `ro.product.model` once a phone is online, in the hello and for a
    phone plugged in later; one adb lists as unauthorized (nothing can be read from it) is
    reported by its serial."""
    pixel = VirtualPhone("emulator-5554", model="Pixel 8")
    galaxy = VirtualPhone("R58M", model="SM-S911B")
    locked_out = VirtualPhone("ZY22", model="moto g")
    locked_out.set_adb_state("unauthorized")
    async with cloud_and_phone(tmp_path, pixel, HOST_ID) as rig:
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data", tasks=None)

        async def models() -> dict[str, str]:
            hosts = (await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
            return {d.serial: d.model for h in hosts if h.host_id == HOST_ID for d in h.devices}

        async def listed(count: int) -> bool:
            return len(await models()) == count

        try:
            await until(lambda: listed(1), 30, "the hello's phone")
            rig.adb.add_phone(galaxy)
            rig.adb.add_phone(locked_out)
            await until(lambda: listed(3), 30, "the phones plugged in")
            seen = await models()
        finally:
            host.kill()
            _, err = await host.communicate()
    assert seen == {"emulator-5554": "Pixel 8", "R58M": "SM-S911B", "ZY22": "ZY22"}, err.decode()


async def test_a_phone_still_booting_is_offline_until_it_has_booted(
    node: str, tmp_path: Path
) -> None:
    """adb lists a phone as "device" as soon as its adbd runs, well before a booting phone's
    system services are up. host.js reported it ONLINE at once, and the cloud handed it tasks
    whose every step fails until it has booted (`input`, `wm`, `dumpsys` find no service). As
    the Python host does (host/devices/registry.py, `_booted`), it is now OFFLINE (the
    contract's "rebooting") until `sys.boot_completed` is 1, and then ONLINE, and runs the
    task."""
    phone = VirtualPhone("emulator-5554")
    phone.system_server_down = True  # booting: sys.boot_completed is unset
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id, host = await _task_and_quick_host(node, rig, tmp_path, max_attempts=1)

        async def announced() -> bool:
            return bool(await _phones(rig))

        try:
            await until(announced, 30, "the hello's phone")
            booting = await _phones(rig)
            phone.system_server_down = False  # booted
            _, err = await asyncio.wait_for(host.communicate(), 240)
            final = await wait_task(
                rig.client, task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
            )
        finally:
            if host.returncode is None:
                host.kill()
                await host.wait()
    said = err.decode()
    assert booting == {phone.serial: types_pb2.DEVICE_STATE_OFFLINE}, said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert len(final.attempts) == 1, said


async def _queued_task(rig: Rig, goal: str) -> str:
    """A task of `goal` that may run twice (a retryable first attempt leaves it queued)."""
    request = task_service_pb2.SubmitTaskRequest(goal=goal, max_attempts=2)
    return str((await rig.client.tasks.SubmitTask(request, timeout=10)).task.task_id)


async def test_a_phone_whose_dumper_always_crashes_ends_its_attempt_retryable(
    node: str, tmp_path: Path
) -> None:
    """A dumper that crashes natively ("Segmentation fault", exit 139) on every try: host.js
    took it for a window still changing, tried five times and sent the look without a tree,
    saying only "no window in the dump"; the planner, shown nothing, gave up and the task
    failed for good for a broken phone. As the Python host does (ScreenUnavailable), a dump
    no retry mends now ends the attempt retryable, saying the phone cannot show its screen
    and what the dump printed."""
    phone = VirtualPhone("emulator-5554")
    phone.glitch_every(1, "segfault")
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await _queued_task(rig, "Turn on dark theme")
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data")
        said, final, _ = await _first_attempt(rig, host, task_id)
    assert final.attempts[0].failure_reason == (
        "host error: phone emulator-5554 cannot show its screen: "
        "uiautomator dump failed on emulator-5554: 'Segmentation fault'"
    ), said
    assert final.status == types_pb2.TASK_STATUS_QUEUED, said  # retryable: it runs again


async def test_a_phone_whose_dumper_always_aborts_is_looked_at_without_a_tree_saying_why(
    node: str, tmp_path: Path
) -> None:
    """A dumper whose runtime aborts ("Aborted", exit 134) is a fresh process each try, so
    host.js tries again, as the Python host does (DeviceBusy). When every try aborts, the look
    goes on without a tree; host.js told the model "no window in the dump", which is not what
    happened. It now says what the dump printed."""
    phone = VirtualPhone("emulator-5554")
    phone.glitch_every(1, "aborted")
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    assert decisions[0].observation.ui_tree_missing == (
        "uiautomator dump gave no tree in 5 tries: "
        "uiautomator dump failed on emulator-5554: 'Aborted'"
    ), said


async def test_a_dump_adb_closes_while_it_lists_the_phone_is_tried_again(
    node: str, tmp_path: Path
) -> None:
    """adbd closes a request unstarted while it restarts or is out of processes: the adb
    server answers FAIL "closed" and still lists the phone. host.js ended the attempt at the
    first such dump, "host error: Failure: 'closed'", not retryable: the task failed for good
    on a phone that answered the next request. As the Python host does (DeviceBusy), the
    dump is now tried again (and a phone adb no longer lists is still told disconnected)."""
    phone = VirtualPhone("emulator-5554")
    phone.close_service("shell:echo $$; exec uiautomator dump", 2)
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    assert not decisions[0].observation.ui_tree_missing, said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert phone.state.flag("dark_theme")


CLOSED = (
    "adb closed the request (its adbd closes requests while it restarts or is out of processes)"
)


async def test_a_dump_adb_closes_on_every_try_is_looked_at_without_a_tree_saying_why(
    node: str, tmp_path: Path
) -> None:
    """adbd closes every dump of a look unstarted (restarting, out of processes). host.js
    counted a closed request as no answer, like a dump that timed out (a stuck phone), and
    ended the attempt retryable. The Python host counts it as the phone's answer
    (`scene_from_dump`: only a timeout is none) and goes on without a tree, the model told
    why; host.js now does too."""
    phone = VirtualPhone("emulator-5554")
    phone.close_service("shell:echo $$; exec uiautomator dump", 5)  # every try of the first look
    home = phone.current_package()
    said, _final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    first = decisions[0].observation
    assert first.ui_tree_missing == (
        f"uiautomator dump gave no tree in 5 tries: adb shell uiautomator failed: {CLOSED}"
    ), said
    assert not first.elements, said
    assert first.foreground_package == home, said


async def test_a_screen_size_read_adb_closes_is_tried_again(node: str, tmp_path: Path) -> None:
    """adbd closes `wm size` unstarted twice. host.js ended the attempt at the first, "host
    error: adb shell wm failed: adb closed the request …", and the task (one attempt) failed
    on a phone that answered the next request. The read is now tried again, as a dump is."""
    phone = VirtualPhone("emulator-5554")
    phone.close_service("shell:wm size", 2)
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions and decisions[0].observation.elements, said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said
    assert phone.state.flag("dark_theme")


async def test_a_screen_size_read_adb_closes_on_every_try_ends_the_attempt_retryable(
    node: str, tmp_path: Path
) -> None:
    """adbd closes `wm size` on every try of a look: without the screen's size nothing of the
    dump can be placed, so the attempt ends retryable, as the Python host ends it (DeviceBusy:
    "did not answer a look at its screen"), saying what was tried."""
    phone = VirtualPhone("emulator-5554")
    phone.close_service("shell:wm size", 3)
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task_id = await _queued_task(rig, "Turn on dark theme")
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data")
        said, final, _ = await _first_attempt(rig, host, task_id)
    assert final.attempts[0].failure_reason == (
        "host error: phone emulator-5554 did not answer a look at its screen: "
        f"adb shell wm failed: {CLOSED} in 3 tries"
    ), said
    assert final.status == types_pb2.TASK_STATUS_QUEUED, said  # retryable: it runs again


async def test_a_window_read_adb_closes_on_every_try_is_looked_at_without_it(
    node: str, tmp_path: Path
) -> None:
    """adbd closes `dumpsys window` (which activity has the focus) on every try of a look.
    host.js ended the attempt; the Python host goes on without the window's name, the app in
    front named from the dump (`_app_package`), and so does host.js now."""
    phone = VirtualPhone("emulator-5554")
    phone.close_service("shell:dumpsys window", 3)
    home = phone.current_package()
    said, final, decisions = await _one_task(node, tmp_path, phone, "Turn on dark theme")

    assert decisions, said
    first = decisions[0].observation
    assert first.elements and not first.foreground_activity, said
    assert first.foreground_package == home, said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, said


async def test_a_phone_whose_serial_the_cloud_refuses_is_left_out_not_the_whole_host(
    node: str, tmp_path: Path
) -> None:
    """The cloud refuses a hello naming a phone id over 128 characters (cloud/lease/
    validate.py), and answers it with no Welcome. host.js named every phone adb listed: one
    phone with such a serial kept the whole host from ever connecting, its other phones idle
    ("rejected: hello.devices[0].serial: at most 128 characters", again after each reconnect).
    Now that phone is left out, said once, and the host runs a task on the other one."""
    long = VirtualPhone("X" * 129)
    async with cloud_and_phone(
        tmp_path, VirtualPhone("emulator-5554"), HOST_ID, more=[long]
    ) as rig:
        task_id = await dark_theme_task(rig.client, max_attempts=1)
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data")
        try:
            _, err = await asyncio.wait_for(host.communicate(), 120)
        except TimeoutError:
            host.kill()
            _, err = await host.communicate()
            raise AssertionError(f"the host ran no task:\n{err.decode()}") from None
        hosts = (await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
        final = await wait_task(
            rig.client, task_id, lambda t: t.status != types_pb2.TASK_STATUS_RUNNING, 10
        )
    said = err.decode()
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, (final, said)
    assert [d.serial for h in hosts for d in h.devices] == ["emulator-5554"], said
    assert said.count(f"phone {long.serial} left out: ") == 1, said
    assert "rejected" not in said, said


async def test_a_phone_adb_may_not_open_is_offline_with_what_fixes_it(
    node: str, tmp_path: Path
) -> None:
    """Linux without udev rules: adb lists a phone `no permissions (…); see […]`. host.js
    reported it OFFLINE with no reason, where the Python host gives the udev fix
    (host/devices/adb_errors.py, the same words: review of 051650a7)."""
    first, other = VirtualPhone("emulator-5554"), VirtualPhone("R58M")
    async with cloud_and_phone(tmp_path, first, HOST_ID) as rig:
        host = await start_host(
            node, rig, HOST_ID, tmp_path / "host-data", AMC_HOST_DEVICE_POLL_INTERVAL_S=QUICK_POLL_S
        )
        try:
            other.set_adb_state("no permissions")
            rig.adb.add_phone(other)

            async def devices() -> dict[str, tuple[int, str]]:
                hosts = (
                    await rig.client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
                ).hosts
                return {
                    d.serial: (d.state, d.reason)
                    for h in hosts
                    if h.host_id == HOST_ID
                    for d in h.devices
                }

            async def listed() -> bool:
                return other.serial in await devices()

            await until(listed, 30, "the phone adb may not open")
            assert (await devices())[other.serial] == (
                types_pb2.DEVICE_STATE_OFFLINE,
                state_fix("no permissions"),
            )
        finally:
            host.kill()
            await host.wait()
