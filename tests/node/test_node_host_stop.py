"""The Node example host, stopped, hands its work back as the Python host does.

Real parts: `amc cloud serve` (SQLite, mTLS) or the in-test LeaseService of
tests/host/lease_fake.py (real mTLS, a real stream: it can leave results unanswered, which the
real cloud never does), a virtual phone served over the adb protocol whose look hangs (the
attempt is mid-step when the signal comes), and host.js as its own process, sent real signals.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from amc.v1 import lease_service_pb2, task_service_pb2, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import HOST, cloud_and_phone, fake_cloud_and_phones, spawn_host, start_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.cloud_view import cloud_view
from tests.support.processes import TERMINAL, wait_task
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import until

__all__ = ["node"]

HOST_STOPPED = "stopped: the host stopped"


async def test_the_node_host_stopped_mid_task_hands_its_attempt_back_at_once(
    node: str, tmp_path: Path
) -> None:
    """SIGTERM while a step is under way, with a 5-minute lease. host.js exited at once (Node's
    default), with no word to the cloud: the attempt stayed RUNNING until its lease ran out and
    only then went to another host. As the Python host does, it now says HostStopping, stops
    the attempt with a retryable result, "stopped: the host stopped", which the cloud answers
    before the host exits 0: the task is queued for its next attempt at once."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)  # the first look waits for an idle screen: mid-step
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task = (
            await rig.client.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal="Turn on dark theme", lease_duration=Duration(seconds=300), max_attempts=2
                ),
                timeout=10,
            )
        ).task
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data", tasks=None)
        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            host.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(host.communicate(), 60)
            said = err.decode()
            final = await wait_task(
                rig.client,
                task.task_id,
                lambda t: (
                    bool(t.attempts) and t.attempts[0].status != types_pb2.TASK_STATUS_RUNNING
                ),
                30,
            )
        finally:
            rig.adb.unplug(phone.serial)  # ends the hung look
            if host.returncode is None:
                host.kill()
                await host.wait()
    assert final.attempts[0].failure_reason == HOST_STOPPED, (final, said)
    assert final.status == types_pb2.TASK_STATUS_QUEUED, (final, said)
    assert host.returncode == 0, said
    assert not list((tmp_path / "host-data").rglob("*.json")), said  # answered: nothing kept


async def test_a_node_host_stopped_with_the_cloud_unreachable_keeps_the_result_for_its_next_start(
    node: str, tmp_path: Path
) -> None:
    """SIGTERM mid-step while the cloud cannot be reached (its connections cut at a proxy).
    host.js died with nothing kept, so its next process named no lease and the attempt waited
    for its 5-minute lease. As the Python host does, it stops the attempt, keeps its result on
    disk and exits 0; its next start sends it, and attempt 1 reads "stopped: the host
    stopped". The stop grace is 10 minutes: host.js waited all of it for its attempt to end
    although the attempt had ended at once (only a result answered woke that wait, and no
    cloud was there to answer); it now exits as soon as nothing is left to wait for."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        cloud_port = int(rig.address.rsplit(":", 1)[1])
        proxy = TcpProxy([("127.0.0.1", cloud_port)]).start()
        task = (
            await rig.client.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal="Turn on dark theme", lease_duration=Duration(seconds=300), max_attempts=2
                ),
                timeout=10,
            )
        ).task
        data = tmp_path / "host-data"
        env = {
            "PATH": os.environ.get("PATH", ""),
            "AMC_CLOUD_ADDRESS": proxy.address,
            "AMC_HOST_CERTS_DIR": str(rig.pki),
            "AMC_HOST_ID": HOST_ID,
            "ADB_PORT": str(rig.adb_port),
            "AMC_HOST_DATA_DIR": str(data),
            "AMC_HOST_STOP_GRACE_S": "600",
        }
        first = await asyncio.create_subprocess_exec(
            node, str(HOST), env=env, stderr=asyncio.subprocess.PIPE
        )
        second: asyncio.subprocess.Process | None = None
        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            proxy.stop()  # the cloud is unreachable from here on
            first.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(first.communicate(), 60)
            kept = list(data.rglob("*.json"))
            proxy = TcpProxy([("127.0.0.1", cloud_port)], port=proxy.port).start()
            second = await asyncio.create_subprocess_exec(
                node, str(HOST), env=env, stderr=asyncio.subprocess.DEVNULL
            )
            final = await wait_task(
                rig.client,
                task.task_id,
                lambda t: (
                    bool(t.attempts) and t.attempts[0].status != types_pb2.TASK_STATUS_RUNNING
                ),
                60,
            )
        finally:
            rig.adb.unplug(phone.serial)
            for process in (first, second):
                if process is not None and process.returncode is None:
                    process.kill()
                    await process.wait()
            proxy.stop()
    said = err.decode()
    assert first.returncode == 0, said
    assert len(kept) == 1, said
    assert final.attempts[0].failure_reason == HOST_STOPPED, (final, said)


async def test_a_stopping_node_host_refuses_new_work_and_a_second_signal_stops_it_at_once(
    node: str, tmp_path: Path
) -> None:
    """A cloud that leaves the stopped attempt's result unanswered, and sends an assignment
    after the host said it stops (one on its way before the cloud read HostStopping). The
    host refuses it (ASSIGNMENT_REFUSAL_HOST_STOPPING, retryable: nothing ran), waits for the
    answers (AMC_HOST_STOP_GRACE_S, 10 minutes here) and, at a second signal, stops at once,
    keeping both results on disk for its next start."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)
    data = tmp_path / "host-data"
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        cloud.ack_results = False
        cloud.renew_s = 10.0
        host = await spawn_host(
            node,
            rig.address,
            rig.fake.pki_dir,
            HOST_ID,
            rig.adb_port,
            data,
            AMC_HOST_STOP_GRACE_S="600",
        )

        def result(task_id: str) -> lease_service_pb2.TaskResult | None:
            return next((r for r in cloud.results if r.task_id == task_id), None)

        try:
            await cloud.wait_for(lambda: cloud.hellos, 60)
            await cloud.assign("t1", phone.serial, "Turn on dark theme")
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            host.send_signal(signal.SIGTERM)
            await cloud.wait_for(lambda: result("t1"), 60)
            await cloud.assign("t2", phone.serial, "Turn on dark theme")
            await cloud.wait_for(lambda: result("t2"), 60)
            stopping = [r for r in cloud.received if r.WhichOneof("kind") == "stopping"]
            waiting = host.returncode is None  # still waiting for the cloud's answers
            host.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(host.communicate(), 60)
        finally:
            if host.returncode is None:
                host.kill()
                await host.wait()
            rig.adb.unplug(phone.serial)
    said = err.decode()
    assert len(stopping) == 1, said
    assert cloud.received.index(stopping[0]) < next(
        i for i, r in enumerate(cloud.received) if r.WhichOneof("kind") == "result"
    ), said  # said before the results, as the contract orders them
    first, refused = result("t1"), result("t2")
    assert first is not None and refused is not None
    assert (first.status, first.summary, first.retryable) == (
        types_pb2.TASK_STATUS_FAILED,
        HOST_STOPPED,
        True,
    ), said
    assert refused.status == types_pb2.TASK_STATUS_FAILED and refused.retryable, said
    assert refused.refusal == lease_service_pb2.ASSIGNMENT_REFUSAL_HOST_STOPPING, said
    assert waiting, said
    assert host.returncode == 0, said
    assert len(list(data.rglob("*.json"))) == 2, said  # kept for the next start


async def _said(host: asyncio.subprocess.Process, words: str, said: list[str]) -> None:
    """Read host.js's stderr into `said` until a line holds `words` (fails if it exits first)."""
    assert host.stderr is not None
    while line := (await host.stderr.readline()).decode():
        said.append(line)
        if words in line:
            return
    raise AssertionError(f"host.js exited without saying {words!r}: {''.join(said)}")


async def test_a_node_host_stopped_while_adb_cannot_say_whether_the_phone_is_there_stops_at_once(
    node: str, tmp_path: Path
) -> None:
    """A phone vanishes mid-look while its adb server's USB thread is held (device lists go
    unanswered), and the host is stopped while it asks adb whether the phone is still there.
    That question (`phoneGone`) was the one wait of an attempt a stop did not cut short:
    host.js sat on it until adb's list timed out (10 s; "adb device list failed" in its log)
    and only then handed the attempt back. It now hands it back at once, "stopped: the host
    stopped", and exits before the list could time out. The grace is 10 minutes, so only the
    list's own timeout could have ended the old wait."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)  # the first look is under way until the phone goes
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task = (
            await rig.client.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal="Turn on dark theme", lease_duration=Duration(seconds=300), max_attempts=2
                ),
                timeout=10,
            )
        ).task
        host = await spawn_host(
            node,
            rig.address,
            rig.pki,
            HOST_ID,
            rig.adb_port,
            tmp_path / "host-data",
            AMC_HOST_STOP_GRACE_S="600",
        )
        said: list[str] = []
        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            rig.adb.stall_device_lists(1000)
            rig.adb.unplug(phone.serial)  # the look fails: is the phone still there?
            await asyncio.wait_for(_said(host, "is the phone still there?", said), 60)
            host.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(host.communicate(), 60)
            said.append(err.decode())
            final = await wait_task(
                rig.client,
                task.task_id,
                lambda t: (
                    bool(t.attempts) and t.attempts[0].status != types_pb2.TASK_STATUS_RUNNING
                ),
                30,
            )
        finally:
            if host.returncode is None:
                host.kill()
                await host.wait()
    log = "".join(said)
    assert "adb device list failed" not in log, log  # it did not wait for adb's answer
    assert host.returncode == 0, log
    assert final.attempts[0].failure_reason == HOST_STOPPED, (final, log)
    assert final.status == types_pb2.TASK_STATUS_QUEUED, (final, log)


async def test_an_operator_cancel_stops_the_step_under_way_at_once(
    node: str, tmp_path: Path
) -> None:
    """An operator cancels a task whose look hangs on the phone. host.js stopped taking the
    lease's renewals but let the step run on: the cancel was answered only once the look came
    back by itself (up to 45 s), as the Python host (`_on_revoked` → `cancel.stop`) does not.
    A revoke now ends every wait of the attempt: the host answers CANCELLED while the hung
    look is still under way, and kills its dumper. Told by that kill: the dumper still ran
    (it hangs 25 s, less than a shell call's 30 s, so the old host's look returned by itself
    first) when the cancel stopped the look."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(25)
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        task = (
            await rig.client.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(
                    goal="Turn on dark theme", lease_duration=Duration(seconds=300), max_attempts=2
                ),
                timeout=10,
            )
        ).task
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data", tasks=None)

        async def answered() -> list[task_service_pb2.LeaseEvent]:
            events = await rig.client.tasks.ListTaskEvents(
                task_service_pb2.ListTaskEventsRequest(task_id=task.task_id), timeout=10
            )
            return [e for e in events.events if e.kind == task_service_pb2.LEASE_EVENT_KIND_RESULT]

        async def answered_yet() -> bool:
            return bool(await answered())

        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            await rig.client.tasks.CancelTask(
                task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="wrong phone"),
                timeout=10,
            )
            await until(answered_yet, 60, "the host's answer to the cancel")
            results = await answered()
            final = await wait_task(
                rig.client, task.task_id, lambda t: t.status == types_pb2.TASK_STATUS_CANCELLED, 30
            )
        finally:
            rig.adb.unplug(phone.serial)  # ends the hung look
            if host.returncode is None:
                host.kill()
            _, err = await host.communicate()
    said = err.decode()
    # The host found the dumper still running when it stopped it: the look had not come back.
    assert "stopped a stuck uiautomator dump" in said, said
    assert [e.result_status for e in results] == [types_pb2.TASK_STATUS_CANCELLED], said
    assert final.attempts[0].status == types_pb2.TASK_STATUS_CANCELLED, (final, said)
    assert "TASK_STATUS_CANCELLED" in said, said


async def test_a_cancelled_look_stops_its_dumper_so_the_phone_looks_again(
    node: str, tmp_path: Path
) -> None:
    """An operator cancels a task whose look hangs (a screen that never goes idle). host.js
    answered the cancel at once but hung up on the dump only: on a phone the dumper runs on
    after its adb client leaves, holding the accessibility bridge, so every dump of the next
    task failed ("… already registered!") until the hung one gave up by itself, minutes later.
    The host now kills the abandoned dumper (`pidof uiautomator`, `kill`), as the Python host
    does, and the next task on the phone looks and succeeds while the first dump would still
    be hanging (300 s)."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)

    async def submit() -> types_pb2.Task:
        request = task_service_pb2.SubmitTaskRequest(
            goal="Turn on dark theme", lease_duration=Duration(seconds=300), max_attempts=1
        )
        submitted: task_service_pb2.SubmitTaskResponse = await rig.client.tasks.SubmitTask(
            request, timeout=10
        )
        return submitted.task

    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        first = await submit()
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data", tasks=None)
        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            await rig.client.tasks.CancelTask(
                task_service_pb2.CancelTaskRequest(task_id=first.task_id, reason="wrong goal"),
                timeout=10,
            )
            await wait_task(
                rig.client, first.task_id, lambda t: t.status == types_pb2.TASK_STATUS_CANCELLED
            )
            second = await submit()
            final = await wait_task(
                rig.client,
                second.task_id,
                lambda t: t.status in TERMINAL,
                120,
            )
        finally:
            rig.adb.unplug(phone.serial)  # ends a hung look the host left
            if host.returncode is None:
                host.kill()
            _, err = await host.communicate()
    said = err.decode()
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, (final, said)
    assert "stopped a stuck uiautomator dump" in said, said


async def test_a_stuck_look_kills_only_its_own_dumper(node: str, tmp_path: Path) -> None:
    """host.js killed every `uiautomator` on the phone when a look was abandoned (`pidof`,
    `kill` of all): on a phone another tool drives too (its own dump or test run), that tool's
    process died with ours. The dump's shell now prints its pid and `exec`s the dumper, and
    only that pid is killed: another `uiautomator` on the phone runs on."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)
    theirs = phone.processes.spawn("uiautomator", "shell", threading.Event())

    async def submit() -> types_pb2.Task:
        request = task_service_pb2.SubmitTaskRequest(
            goal="Turn on dark theme", lease_duration=Duration(seconds=300), max_attempts=1
        )
        submitted: task_service_pb2.SubmitTaskResponse = await rig.client.tasks.SubmitTask(
            request, timeout=10
        )
        return submitted.task

    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        first = await submit()
        tasks = [first.task_id]
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data", tasks=None)
        # A wait that fails says the host's log, whether host.js still ran, and the cloud's view
        # of the host and the tasks (a CI run once saw the second task queued for 120 s, with
        # nothing to tell why: a host gone, a phone reported offline or still counted busy, a
        # hold, or a dispatch that never ran).
        unended: AssertionError | None = None
        view = ""
        try:
            try:
                await until(lambda: phone.dumper is not None, 60, "the first look under way")
                ours = phone.dumper
                assert ours is not None
                pid = ours.pid
                await rig.client.tasks.CancelTask(
                    task_service_pb2.CancelTaskRequest(task_id=first.task_id, reason="wrong goal"),
                    timeout=10,
                )
                await until(lambda: ours.stop.is_set(), 60, "the host's own dumper killed")
                second = await submit()
                tasks.append(second.task_id)
                final = await wait_task(
                    rig.client, second.task_id, lambda t: t.status in TERMINAL, 120
                )
            except AssertionError as exc:
                unended = exc
                running = "still runs" if host.returncode is None else f"exited {host.returncode}"
                view = (
                    f"host.js {running}; the cloud's view:\n{await cloud_view(rig.client, tasks)}"
                )
        finally:
            rig.adb.unplug(phone.serial)  # ends a hung look the host left
            if host.returncode is None:
                host.kill()
            _, err = await host.communicate()
            phone.processes.exited(theirs)
    said = err.decode()
    assert unended is None, f"{unended}\n{view}\nthe host's log:\n{said}"
    assert not theirs.stop.is_set(), said  # the other tool's process was not killed
    assert f"stopped a stuck uiautomator dump (pid {pid})" in said, said
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, (final, said)


async def _cancel_mid_first_look(
    node: str, tmp_path: Path, phone: VirtualPhone, **env: str
) -> tuple[str, int, bool]:
    """Submits a task, cancels it while its first dump runs on `phone`, then stops host.js
    (SIGTERM: it waits for its dumper cleanup before it goes, `handBack`): the host's log,
    the first dumper's pid, and whether that dumper was killed."""
    async with cloud_and_phone(tmp_path, phone, HOST_ID) as rig:
        request = task_service_pb2.SubmitTaskRequest(
            goal="Turn on dark theme", lease_duration=Duration(seconds=300), max_attempts=1
        )
        submitted: task_service_pb2.SubmitTaskResponse = await rig.client.tasks.SubmitTask(
            request, timeout=10
        )
        host = await start_host(node, rig, HOST_ID, tmp_path / "host-data", tasks=None, **env)
        try:
            await until(lambda: phone.dumper is not None, 60, "the first look under way")
            ours = phone.dumper
            assert ours is not None
            await rig.client.tasks.CancelTask(
                task_service_pb2.CancelTaskRequest(
                    task_id=submitted.task.task_id, reason="wrong goal"
                ),
                timeout=10,
            )
            await wait_task(
                rig.client,
                submitted.task.task_id,
                lambda t: t.status == types_pb2.TASK_STATUS_CANCELLED,
            )
            host.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(host.communicate(), 60)
            killed = ours.stop.is_set()
        finally:
            rig.adb.unplug(phone.serial)  # ends a dumper left running
            if host.returncode is None:
                host.kill()
                await host.communicate()
    return err.decode(), ours.pid, killed


async def test_a_look_stopped_before_its_dumper_pid_came_still_kills_the_dumper(
    node: str, tmp_path: Path
) -> None:
    """The pid the dump's shell prints first reaches the host 3 s late (a busy adbd), while the
    dumper already runs, and the task is cancelled before it came. host.js hung up with no pid
    and killed nothing: the dumper ran on, holding the accessibility bridge, and the phone's
    next dumps failed ("… already registered!"). The look's call now stays open until the pid
    comes, and that dumper is killed as when the pid came in time."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)
    phone.delay_exec_heads(3)
    said, pid, killed = await _cancel_mid_first_look(
        node, tmp_path, phone, AMC_HOST_STOP_GRACE_S="20"
    )
    assert killed, said
    assert f"stopped a stuck uiautomator dump (pid {pid})" in said, said
    assert "no pid of it came back" not in said, said


async def test_a_host_stopped_with_a_short_grace_still_waits_for_its_dumper_kill(
    node: str, tmp_path: Path
) -> None:
    """The stop grace (here 1 s) bounds the wait for the cloud, not the dumper's kill: bounded
    by it, a host stopped while a late pid was on its way exited before the kill, and the
    dumper ran on holding the phone's accessibility bridge."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)
    phone.delay_exec_heads(3)
    said, pid, killed = await _cancel_mid_first_look(
        node, tmp_path, phone, AMC_HOST_STOP_GRACE_S="1"
    )
    assert killed, said
    assert f"stopped a stuck uiautomator dump (pid {pid})" in said, said


async def test_a_dumper_pid_that_never_comes_is_said_with_what_to_do(
    node: str, tmp_path: Path
) -> None:
    """A look stopped whose dumper pid does not come within 5 s (a wedged adbd) is hung up, and
    the host says that it could not stop the dumper and how the operator ends it by hand,
    instead of only that one may still run."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)
    phone.delay_exec_heads(120)
    said, _, killed = await _cancel_mid_first_look(
        node, tmp_path, phone, AMC_HOST_STOP_GRACE_S="20"
    )
    assert not killed, said
    hint = "adb -s emulator-5554 shell pidof uiautomator, then adb -s emulator-5554 shell kill PID"
    assert "could not stop a stuck uiautomator dump: no pid of it came back" in said, said
    assert hint in said, said
