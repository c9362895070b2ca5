"""The host against the real cloud server (cloud/server.py, SQLite): assignment to result, a
stream cut mid-task, a revoke, and the cloud planner transport with the offline provider."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud import pki, revocations
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from cloud.store import flows, leases, tasks
from host.cloud_channel import open_channel
from host.console.state import phones_now
from host.devices.adb_driver import DUMP_COMMAND
from host.devices.virtual.phone import VirtualPhone
from host.lease_client import HostRefused
from host.runner import HostApp, build_host, serve_host, start_virtual_phones
from host.settings import HostSettings
from host.startup import describe
from host.timeline.store import TimelineStore
from tests.cloud.cloud_harness import lapse
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text
from tests.support.flows import store_flow
from tests.support.migrated import migrated_sqlite_url
from tests.support.processes import free_port
from tests.support.waiting import until

HOST_ID = "h1"
SETTINGS_APP = "com.android.settings"


@dataclass
class Stack:
    cloud: CloudServer
    pki_dir: Path
    ops: Any
    decisions: Any
    ops_channel: grpc.aio.Channel
    tmp: Path


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    pki_dir = pki.ensure_embedded_pki(tmp_path, [HOST_ID], operator="ops")
    settings = CloudSettings(
        database_url=migrated_sqlite_url(tmp_path / "cloud.sqlite3"),
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        default_lease_seconds=6.0,
        min_lease_seconds=0.2,
        sweep_interval_seconds=0.1,
        dispatch_interval_seconds=0.2,
        host_heartbeat_seconds=1.0,
        shutdown_grace_seconds=0.5,
    )
    cloud = await build_server(settings)
    await cloud.start()
    ca = (pki_dir / "ca.pem").read_bytes()
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(pki_dir / "operator-ops.key").read_bytes(),
        certificate_chain=(pki_dir / "operator-ops.pem").read_bytes(),
    )
    ch = grpc.aio.secure_channel(cloud.address, creds)
    yield Stack(
        cloud,
        pki_dir,
        task_service_pb2_grpc.TaskServiceStub(ch),
        decision_log_service_pb2_grpc.DecisionLogServiceStub(ch),
        ch,
        tmp_path,
    )
    await ch.close()
    await cloud.stop(0.5)


def _host_settings(stack: Stack, **overrides: Any) -> HostSettings:
    values: dict[str, Any] = {
        "data_dir": stack.tmp / "host",
        "device_source": "virtual",
        "virtual_phones": 1,
        "cloud_address": stack.cloud.address,
        "certs_dir": stack.pki_dir,
        "host_id": HOST_ID,
        "ocr_enabled": False,
        "settle_delay_s": 0,
        "device_poll_interval_s": 0.2,
        "reconnect_initial_s": 0.05,
        "reconnect_max_s": 0.3,
        # Most tests here hand the host a scripted planner (the direct transport's place).
        "planner_transport": "direct",
    }
    values.update(overrides)
    return HostSettings(**values)


async def _submit(stack: Stack, goal: str) -> str:
    lease = duration_pb2.Duration()
    lease.FromTimedelta(timedelta(seconds=6))
    response = await stack.ops.SubmitTask(
        task_service_pb2.SubmitTaskRequest(goal=goal, max_attempts=1, lease_duration=lease)
    )
    return str(response.task.task_id)


async def _until(
    stack: Stack, task_id: str, check: Callable[[Any], bool], within: float = 60
) -> Any:
    async def poll() -> Any:
        while True:
            task = (await stack.ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))).task
            if check(task):
                return task
            await asyncio.sleep(0.1)

    return await asyncio.wait_for(poll(), within)


@dataclass
class RunningHost:
    app: HostApp
    stop: asyncio.Event
    task: asyncio.Task[None]
    virtual: Any

    async def close(self) -> None:
        self.stop.set()
        await self.task
        await asyncio.to_thread(self.virtual.stop)


async def _start_host(
    stack: Stack,
    planner: Any = None,
    channel_factory: Callable[[], grpc.aio.Channel] | None = None,
    **overrides: Any,
) -> RunningHost:
    virtual, settings = start_virtual_phones(_host_settings(stack, **overrides))
    app = build_host(settings, planner=planner, channel_factory=channel_factory)
    stop = asyncio.Event()
    task = asyncio.create_task(serve_host(app, stop))
    await asyncio.wait_for(app.lease.wait_connected(), 20)
    return RunningHost(app, stop, task, virtual)


@dataclass
class _CutLink:
    """The host's way to the cloud, which a test cuts (new streams dial a dead port, as while
    the network is down) and restores; `go_away` cuts it and ends the open streams."""

    stack: Stack
    cut: bool = False
    dead: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")

    def channels(self) -> grpc.aio.Channel:
        address = self.dead if self.cut else self.stack.cloud.address
        settings = _host_settings(self.stack).model_copy(update={"cloud_address": address})
        return open_channel(settings)

    def go_away(self) -> None:
        self.cut = True
        self.stack.cloud.leases.close_all(grpc.StatusCode.UNAVAILABLE, "cut by test")


def _local_status(app: HostApp, task_id: str) -> str:
    """Attempt 1's status in the host's own timeline ("" before its row)."""
    row = app.store.get_task(task_id, 1)
    return row.status if row is not None else ""


async def _finished_unanswered(app: HostApp, task_id: str) -> None:
    """Until the host finished attempt 1 and holds its result unanswered (a state, not a
    timer: its stream is down)."""
    for _ in range(600):
        local = app.store.get_task(task_id, 1)
        if local is not None and local.status == "succeeded" and app.lease.pending_results():
            break
        await asyncio.sleep(0.05)
    assert app.lease.pending_results() == [(task_id, 1)]


def _dark_theme(before_display: Callable[[], None] | None = None) -> ScriptedPlanner:
    return ScriptedPlanner(
        [
            Step("launch_app", {"package_name": SETTINGS_APP}, "open Settings"),
            Step("tap", by_text("Display"), "open display settings", before=before_display),
            Step("tap", by_text("Dark theme"), "turn dark theme on"),
            Step("complete", {"success": True, "reason": "dark theme is on"}),
        ]
    )


async def test_assignment_runs_to_a_recorded_success(stack: Stack) -> None:
    host = await _start_host(stack, _dark_theme())
    try:
        task_id = await _submit(stack, "Turn on dark theme")
        task = await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED)
        assert task.result_summary == "dark theme is on"
        assert task.host_id == HOST_ID
        assert task.progress.step_index == 4
        assert host.virtual.server.phones["emulator-5554"].state.flag("dark_theme")
        assert len(host.app.store.steps(task_id, 1)) == 4
    finally:
        await host.close()


async def _run_a_task_and_stop(stack: Stack) -> dict[str, weakref.ref[Any]]:
    """Weak references to the parts of a host that ran a task and stopped (only this frame
    held them)."""
    host = await _start_host(stack, _dark_theme())
    try:
        task_id = await _submit(stack, "Turn on dark theme")
        await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED)
    finally:
        await host.close()
    return {
        "host": weakref.ref(host.app),
        "lease client": weakref.ref(host.app.lease),
        "device registry": weakref.ref(host.app.registry),
        "timeline": weakref.ref(host.app.store),
    }


async def test_a_stopped_host_is_freed_without_the_cycle_collector(
    stack: Stack, no_cycle_collector: None
) -> None:
    """The host's parts sat in cycles (the app and its lease client's task runner; the device
    registry and the lease client listening to it; a forgotten attempt and its renewer's
    CancelledError) or on the loop (a result's resend timer), so a stopped host waited for
    the cycle collector, or the timer, to be freed."""
    refs = await _run_a_task_and_stop(stack)
    assert [name for name, ref in refs.items() if ref() is not None] == []


async def test_stream_cut_mid_task_reconnects_and_finishes(stack: Stack) -> None:
    cut = lambda: stack.cloud.leases.close_all(grpc.StatusCode.UNAVAILABLE, "cut by test")  # noqa: E731
    host = await _start_host(stack, _dark_theme(before_display=cut))
    try:
        task_id = await _submit(stack, "Turn on dark theme")
        task = await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED)
        assert task.attempt == 1  # the same attempt finished: resumed, not retried
        assert host.app.lease.connects >= 2
    finally:
        await host.close()


async def test_revoke_stops_the_task(stack: Stack) -> None:
    planner = _dark_theme()
    planner.steps[1] = Step("swipe", {"start_x": 540, "start_y": 1800, "end_x": 540, "end_y": 900})
    planner.steps[2:] = [planner.steps[1]]  # swipes forever until stopped
    host = await _start_host(stack, planner)
    try:
        task_id = await _submit(stack, "Scroll forever")
        await _until(stack, task_id, lambda t: t.progress.step_index >= 2)
        await stack.ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id, reason="t"))
        task = await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_CANCELLED)
        assert task.status == types_pb2.TASK_STATUS_CANCELLED
        for _ in range(100):
            if not host.app.lease.running():
                break
            await asyncio.sleep(0.05)
        assert host.app.lease.running() == []
        # The end is written in the lease client's own thread, after the attempt's task.
        await until(lambda: _local_status(host.app, task_id) != "running", what="end written")
        local = host.app.store.get_task(task_id, 1)
        assert local is not None
        assert local.status == "cancelled"
    finally:
        await host.close()


async def test_cloud_planner_transport_with_the_offline_provider(stack: Stack) -> None:
    host = await _start_host(stack, None, planner_transport="cloud")
    try:
        task_id = await _submit(stack, "Turn on dark theme")
        task = await _until(stack, task_id, lambda t: t.status in (4, 5, 6), within=120)
        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.result_summary
        listed = await stack.decisions.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
        local = host.app.store.steps(task_id, 1)
        assert len(listed.decisions) == len(local)
        assert [d.user_prompt for d in listed.decisions] == [r.user_prompt for r in local]
    finally:
        await host.close()


async def test_a_task_paused_by_a_cloud_outage_longer_than_its_lease_continues_in_attempt_1(
    stack: Stack,
) -> None:
    """The cloud is down for longer than the lease: the host pauses the attempt when its lease
    has run out by its own clock (nothing more on its phone, no model asked). The cloud that
    starts again gives live leases a new term (`leases.extend_after_outage`) and resumes the
    assignment the host's hello names: the attempt continues and the task succeeds as attempt
    1, each step asked once. The host used to stop the attempt there (a retryable result) and
    the task ran again as attempt 2, every step's model turn paid again."""
    gate = asyncio.Event()
    planner = _dark_theme(before_display=lambda: setattr(planner, "block", gate))
    host = await _start_host(stack, planner)  # step 3 waits for `gate`
    again: CloudServer | None = None
    try:
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(seconds=6))
        submitted = await stack.ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme", max_attempts=2, lease_duration=lease
            )
        )
        task_id = submitted.task.task_id
        await _until(stack, task_id, lambda t: t.progress.step_index >= 3)
        settings = stack.cloud.settings.model_copy(update={"listen_address": stack.cloud.address})
        await stack.cloud.stop(0)
        [rt] = host.app.lease._tasks.values()
        past = rt.expires_mono + 0.3  # its renewer wakes at the lease's end
        await until(lambda: time.monotonic() > past, 60, "the lease runs out by the host's clock")
        assert [spec.task_id for spec, _ in host.app.lease.running()] == [task_id]  # not stopped
        assert rt.cancel.lease.paused
        again = await build_server(settings)
        await again.start()
        await until(lambda: not rt.cancel.lease.paused, 60, "the cloud resumes the lease")
        gate.set()
        task = await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED)
        assert task.attempt == 1
        assert [a.attempt for a in task.attempts] == [1]
        assert len(planner.seen) == 4  # each step asked once
        assert host.virtual.server.phones["emulator-5554"].state.flag("dark_theme")
    finally:
        gate.set()
        await host.close()
        if again is not None:
            await again.stop(0.5)


async def test_a_cancel_the_host_meets_at_its_next_step_ends_the_task_at_once(
    stack: Stack,
) -> None:
    """The operator cancels while the host's Lease stream is down (it is reconnecting), so the
    revoke cannot reach it; its next step's Decide is refused (the task is being cancelled)
    and it stops there. Once it reconnects it says so (a CANCELLED result, taken while the
    lease is live), and the task is cancelled at once. It said nothing (the lease was "lost"),
    and the task stayed running, cancel pending, until its lease ran out."""
    link = _CutLink(stack)
    host = await _start_host(  # its planner channel stays up
        stack, channel_factory=link.channels, planner_transport="cloud", settle_delay_s=1.0
    )
    app = host.app
    try:
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(seconds=120))
        submitted = await stack.ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme", max_attempts=1, lease_duration=lease
            )
        )
        task_id = submitted.task.task_id
        await _until(stack, task_id, lambda t: t.progress.step_index >= 1)
        link.go_away()
        await stack.ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id, reason="t"))
        for _ in range(400):  # its next Decide is refused and it stops (a state, not a timer)
            if not app.lease.running():
                break
            await asyncio.sleep(0.05)
        assert app.lease.running() == []
        link.cut = False
        task = await _until(
            stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_CANCELLED, within=30
        )
        assert task.result_summary == "t"
        await until(lambda: _local_status(app, task_id) != "running", what="end written")
        local = app.store.get_task(task_id, 1)
        assert local is not None and local.status == "cancelled"
    finally:
        await host.close()


async def test_a_stuck_phone_gives_the_task_its_next_attempt_within_its_budget(
    stack: Stack,
) -> None:
    """A phone whose uiautomator never answers within a look's deadline ended its task FAILED
    for good after the first attempt. Each attempt now ends retryable, saying which phone did
    not answer what, so the cloud queues the next one, and attempts still count: with two
    allowed, the task ends FAILED after its second."""
    host = await _start_host(
        stack,
        _dark_theme(),
        dump_timeout_s=1.0,
        hierarchy_deadline_s=2.5,
        hierarchy_retries=3,
    )
    try:
        host.virtual.server.phones["emulator-5554"].hang_dumps(3.0, count=50)
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(seconds=6))
        submitted = await stack.ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme", max_attempts=2, lease_duration=lease
            )
        )
        task_id = submitted.task.task_id
        task = await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_FAILED)
        assert task.attempt == 2, task
        assert [a.status for a in task.attempts] == [types_pb2.TASK_STATUS_FAILED] * 2
        for attempt in task.attempts:
            reason = attempt.failure_reason
            assert reason.startswith("phone emulator-5554 did not answer"), reason
            assert "uiautomator dump on emulator-5554 timed out" in reason, reason
    finally:
        await host.close()


async def test_a_result_finished_while_the_stream_was_down_beats_the_next_attempt(
    stack: Stack,
) -> None:
    """Direct transport: the host's stream goes down mid-task and stays down while the host
    finishes; meanwhile the cloud's lease runs out and the task is requeued (nobody takes it:
    this host's phone is the only one). When the same process reconnects, its result must end
    the task. Its hello named only the tasks still running, so the hello's dispatch handed the
    requeued task's next attempt to the idle phone before the result was read: the result was
    refused as superseded and the task ran again."""
    link = _CutLink(stack)
    planner = _dark_theme(before_display=link.go_away)
    host = await _start_host(stack, planner, channel_factory=link.channels)
    app = host.app
    try:
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(seconds=120))
        submitted = await stack.ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme", max_attempts=2, lease_duration=lease
            )
        )
        task_id = submitted.task.task_id
        await _finished_unanswered(app, task_id)
        await lapse(stack.cloud.store, task_id)
        await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_QUEUED)
        link.cut = False
        task = await _until(
            stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED, within=30
        )
        assert [a.attempt for a in task.attempts] == [1], task.attempts
        assert task.result_summary == "dark theme is on"
    finally:
        await host.close()


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        ("SUCCEEDED", "the cloud already has it"),
        ("FAILED", "the cloud recorded another end for its attempt (attempt ended FAILED)"),
    ],
)
async def test_a_kept_result_the_cloud_already_recorded_is_not_called_refused(
    stack: Stack, caplog: pytest.LogCaptureFixture, recorded: str, said: str
) -> None:
    """The host's result reached the cloud but the ack did not come back (here: the stream went
    down first and the result is written to the cloud's store as if it had arrived). At the
    reconnect the hello names the lease and the cloud answers Revoked FINISHED: the host logged
    "dropped: the cloud refused it" for a result the cloud has. The same status is said to be
    there already; another status is a real conflict and is logged as one."""
    link = _CutLink(stack)
    planner = _dark_theme(before_display=link.go_away)
    host = await _start_host(stack, planner, channel_factory=link.channels)
    app = host.app
    try:
        task_id = await _submit(stack, "Turn on dark theme")
        await _finished_unanswered(app, task_id)
        view = await tasks.get(stack.cloud.store, task_id)
        assert view is not None
        (attempt,) = view.attempts
        out = await leases.record_result(
            stack.cloud.store, HOST_ID, task_id, 1, attempt.lease_id, recorded, "done", None
        )
        assert out.recorded
        with caplog.at_level(logging.INFO, logger="host.lease_client"):
            link.cut = False
            for _ in range(600):  # answered at the hello: nothing left to send
                if not app.lease.pending_results():
                    break
                await asyncio.sleep(0.05)
        assert app.lease.pending_results() == []
        lines = [r.getMessage() for r in caplog.records if task_id in r.getMessage()]
        assert any(said in line for line in lines), lines
        assert not any("refused it" in line for line in lines), lines
    finally:
        await host.close()


async def test_a_stuck_phones_retry_goes_to_the_hosts_other_idle_phone(stack: Stack) -> None:
    """A host with two phones, the first of which never answers a look: its attempt ends
    retryable naming that phone, which is idle again at once, and the claim handed the task's
    next attempt to the first idle phone in order, that same stuck phone, while the other one
    stood idle. The next attempt now goes to the other phone."""
    host = await _start_host(
        stack,
        _dark_theme(),
        virtual_phones=2,
        dump_timeout_s=1.0,
        hierarchy_deadline_s=2.5,
        hierarchy_retries=3,
    )
    try:
        host.virtual.server.phones["emulator-5554"].hang_dumps(3.0, count=50)
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(seconds=6))
        submitted = await stack.ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme", max_attempts=2, lease_duration=lease
            )
        )
        task_id = submitted.task.task_id
        task = await _until(stack, task_id, lambda t: t.attempt == 2)
        first, second = task.attempts
        assert first.device_serial == "emulator-5554", task
        assert first.failure_reason.startswith("phone emulator-5554 did not answer"), task
        assert second.device_serial == "emulator-5556", task
    finally:
        await host.close()


async def test_an_unreadable_after_action_screenshot_is_recorded_missing_not_kept(
    stack: Stack,
) -> None:
    """When the look after an action failed, the loop took one more screenshot for the step's
    AFTER image and kept it unchecked, although every look now checks its screenshot's header
    and chunks: noise framed as a PNG (a wedged SurfaceFlinger, a GPU fault) was stored in the
    timeline as the step's after image (a broken image in the host console and the export) and
    shipped, which the cloud refused ("data: not a readable image"), leaving a refused item in
    the host's outbox. An unreadable after shot is now checked like the others: recorded as
    missing, with the reason, and neither stored nor shipped."""
    phone: list[Any] = []

    def garble() -> None:  # after the step's look, before its action: the after shots
        phone[0].garble_screenshots("garbage", count=2)

    planner = ScriptedPlanner(
        [
            Step("launch_app", {"package_name": SETTINGS_APP}, "open Settings", before=garble),
            Step("complete", {"success": True, "reason": "Settings is open"}),
        ]
    )
    host = await _start_host(stack, planner)
    phone.append(host.virtual.server.phones["emulator-5554"])
    outbox = host.app.outbox
    assert outbox is not None
    try:
        task_id = await _submit(stack, "Open Settings")
        task = await _until(stack, task_id, lambda t: t.status == types_pb2.TASK_STATUS_SUCCEEDED)
        assert task.progress.step_index == 2
        for _ in range(600):  # until the cloud took (or refused) every shipped item
            if outbox.backlog().items == 0:
                break
            await asyncio.sleep(0.05)
        backlog = outbox.backlog()
        refusals = outbox.refusals()
        first = host.app.store.steps(task_id, 1)[0]
        kept = sorted(p.name for p in host.app.settings.resolved_artifact_dir.rglob("*.png"))
    finally:
        await host.close()

    assert backlog.items == 0
    assert refusals == []
    assert first.after_screenshot_path is None
    assert "unreadable screenshot from emulator-5554" in first.result["after_error"]
    assert "unreadable screenshot from emulator-5554" in first.result["after_screenshot_error"]
    assert "step001-after.png" not in kept
    assert "step001-before.png" in kept


async def test_a_host_stopped_mid_task_records_that_it_stopped(stack: Stack) -> None:
    """A host stopped (SIGTERM, `amc up` stopped) mid-task recorded the attempt in its own
    timeline as "stopped: the lease was revoked", a revoke the cloud never sent. It hands the
    task back before it closes its stream: the attempt ends with its retryable result, the
    task queued for its next attempt at once, not when the lease runs out (a minute here)."""
    planner = _dark_theme()
    planner.steps[1] = Step("swipe", {"start_x": 540, "start_y": 1800, "end_x": 540, "end_y": 900})
    planner.steps[2:] = [planner.steps[1]]  # swipes forever until stopped
    host = await _start_host(stack, planner)
    closed = False
    try:
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(seconds=60))
        submitted = await stack.ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Scroll forever", max_attempts=2, lease_duration=lease
            )
        )
        task_id = str(submitted.task.task_id)
        await _until(stack, task_id, lambda t: t.progress.step_index >= 2)
        host.stop.set()
        await host.task
        # The step the stop abandoned may still talk to the phone: its lane thread ends first.
        for thread in threading.enumerate():
            if thread.name.startswith("phone-"):
                await asyncio.to_thread(thread.join)
        await host.close()
        closed = True
        s = host.app.settings
        timeline = TimelineStore(s.resolved_db_path, s.resolved_artifact_dir)
        try:
            local = timeline.get_task(task_id, 1)
        finally:
            timeline.close()
        assert local is not None
        assert (local.status, local.summary) == ("cancelled", "stopped: the host stopped")
        # At once: the host's stop returned only after the cloud acknowledged the result.
        task = (await stack.ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))).task
        assert task.status == types_pb2.TASK_STATUS_QUEUED
        ended = task.attempts[0]
        assert (ended.status, ended.failure_reason) == (
            types_pb2.TASK_STATUS_FAILED,
            "stopped: the host stopped",
        )
    finally:
        if not closed:
            await host.close()


async def test_a_host_stopped_in_a_stuck_step_hands_the_attempt_back_all_the_same(
    stack: Stack,
) -> None:
    """A step stuck on its phone (a look waiting for a screen that never idles; the driver's
    timeouts raised, as on a slow phone) held a stopping host for 30 s, then the attempt was
    cancelled with no result: the host exited without handing the task back, which waited for
    its lease. Past `stop_grace_s` the host hands such an attempt back without its step."""
    wedged: list[RunningHost] = []

    def wedge() -> None:  # step 2's look after its tap waits for ever
        phone = wedged[0].virtual.server.phones["emulator-5554"]
        phone.stall_service(f"shell:{DUMP_COMMAND}", 600.0)

    host = await _start_host(
        stack,
        _dark_theme(before_display=wedge),
        dump_timeout_s=600.0,
        hierarchy_deadline_s=1200.0,
        stop_grace_s=1.0,
    )
    wedged.append(host)
    try:
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(minutes=5))
        submitted = await stack.ops.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Turn on dark theme", max_attempts=2, lease_duration=lease
            )
        )
        task_id = str(submitted.task.task_id)
        await _until(
            stack,
            task_id,
            lambda t: (
                t.progress.step_index >= 2
                and t.progress.step_status == types_pb2.STEP_STATUS_ACTING
            ),
        )
        host.stop.set()
        await host.task
        task = (await stack.ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))).task
        assert task.status == types_pb2.TASK_STATUS_QUEUED, task
        ended = task.attempts[0]
        assert (ended.status, ended.failure_reason) == (
            types_pb2.TASK_STATUS_FAILED,
            "stopped: the host stopped",
        )
    finally:
        await host.close()


async def test_a_flow_disabled_mid_attempt_reaches_the_direct_hosts_attempt(stack: Stack) -> None:
    """The lease client keeps what the cloud's renewals say of the assignment's flows: a flow
    disabled meanwhile lands in the running attempt's `withdrawn_flows`, which its direct
    planner replays no further."""
    row = await store_flow(stack.cloud.store)
    planner = _dark_theme()
    planner.steps[1] = Step("swipe", {"start_x": 540, "start_y": 1800, "end_x": 540, "end_y": 900})
    planner.steps[2:] = [planner.steps[1]]  # swipes forever until stopped
    host = await _start_host(stack, planner)
    try:
        task_id = await _submit(stack, "Turn on dark theme")
        await _until(stack, task_id, lambda t: t.progress.step_index >= 1)
        ((spec, _),) = host.app.lease.running()
        assert [f.flow_id for f in spec.flows] == [row.flow_id]
        assert spec.withdrawn_flows == set()
        await flows.set_status(stack.cloud.store, row.flow_id, flows.DISABLED, "app changed")
        for _ in range(600):  # until a renewal answered after the disable
            if spec.withdrawn_flows:
                break
            await asyncio.sleep(0.05)
        assert spec.withdrawn_flows == {row.flow_id}
    finally:
        await host.close()


async def test_a_phone_whose_id_the_cloud_refuses_is_left_out_not_the_whole_host(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The cloud refuses a hello naming a phone id over 128 characters (cloud/lease/
    validate.py) with no Welcome: the host named every phone adb listed, so one phone with
    such a serial kept the whole host from connecting, its other phones idle. Now that phone
    is left out, said once, and the host runs a task on the other one (as the Node host)."""
    long = "X" * 129
    virtual, settings = start_virtual_phones(_host_settings(stack))
    virtual.server.add_phone(VirtualPhone(long))  # listed by adb before the first hello
    app = build_host(settings, planner=_dark_theme())
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="host.devices.registry"):
        serving = asyncio.create_task(serve_host(app, stop))
        try:
            await asyncio.wait_for(app.lease.wait_connected(), 20)
            task_id = await _submit(stack, "Turn on dark theme")
            ended = (types_pb2.TASK_STATUS_SUCCEEDED, types_pb2.TASK_STATUS_FAILED)
            task = await _until(stack, task_id, lambda t: t.status in ended)
            fleet = fleet_service_pb2_grpc.FleetServiceStub(stack.ops_channel)
            hosts = (await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
            banner = describe(app)
            console = phones_now(app)
            status = app.status()["devices"]
            gauge = {serial: online for serial, online, _ in app.phone_states()}
        finally:
            stop.set()
            await serving
            await asyncio.to_thread(virtual.stop)
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
    assert [d.serial for h in hosts for d in h.devices] == ["emulator-5554"]
    # The start banner and the local console said the long phone was there to work, as any
    # other; they say it is refused, and why (the cloud never hears of it).
    why = "the cloud takes phone ids of at most 128 characters, this one has 129"
    assert [line for line in banner if line.lstrip().startswith(("phones:", "refused:"))] == [
        "  phones:       emulator-5554 via 1 virtual phone(s) behind adb "
        f"{app.settings.adb_host}:{app.settings.adb_port}",
        f"  refused:      {long} (left out: {why}; it gets no work)",
    ]
    assert {p.serial: (p.state, p.refused) for p in console} == {
        "emulator-5554": ("online", ""),
        long: ("refused", why),
    }
    assert {d["serial"]: (d["online"], d["refused"]) for d in status} == {
        "emulator-5554": (True, ""),
        long: (False, why),
    }
    assert gauge == {"emulator-5554": True, long: False}  # amc_host_phones: offline, not idle
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"phone {long}")]
    assert said == [
        f"phone {long} left out: the cloud takes phone ids of at most 128 characters, "
        "this one has 129"
    ]


async def test_a_host_whose_identity_the_cloud_revokes_mid_run_stops_at_once(
    stack: Stack,
) -> None:
    """`amc certs revoke --host h1` while the host runs a task: the cloud drops its stream
    UNAUTHENTICATED ("host h1 revoked") and releases its leases. The host waited its longest
    backoff (`AMC_HOST_RECONNECT_MAX_S`, an hour here) and tried again, for ever, refused the
    same way each time, looking alive to its supervisor. Now it stops at once, its attempt
    stopped, saying why (`HostRefused`, exit 4 at `amc host run`), as the Node host does
    (host.js `FINAL`; decision 0084)."""
    planner = _dark_theme()
    swipe = Step("swipe", {"start_x": 540, "start_y": 1800, "end_x": 540, "end_y": 900})
    planner.steps[1:] = [swipe]  # swipes until stopped
    host = await _start_host(stack, planner, reconnect_max_s=3600.0)
    try:
        task_id = await _submit(stack, "Scroll forever")
        await _until(stack, task_id, lambda t: t.progress.step_index >= 2)
        await revocations.revoke(stack.cloud.store, host_id=HOST_ID, reason="decommissioned")
        await stack.cloud.revocations.refresh()
        with pytest.raises(HostRefused) as refused:
            await asyncio.wait_for(asyncio.shield(host.task), 30)
    finally:
        host.stop.set()
        with contextlib.suppress(HostRefused):
            await host.task
        await asyncio.to_thread(host.virtual.stop)
    assert (
        str(refused.value)
        == f"the cloud refused this host: UNAUTHENTICATED: host {HOST_ID} revoked"
    )
    assert host.app.lease.running() == []
    assert host.app.lease.connects == 1
