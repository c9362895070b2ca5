"""A lease run out by the host's clock while the cloud was away pauses the attempt, not stops it.

The lease client over a real mTLS stream to the fake cloud (`lease_fake.py`), running a real
agent loop on a virtual phone: the cloud goes away for longer than the lease, the model
answers a step meanwhile, then the cloud comes back and resumes the held assignment (the
attempt continues, its done steps not asked again) or refuses it (the attempt stops, having
done nothing on its phone since its lease ran out).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import decision_log_service_pb2, lease_service_pb2, types_pb2
from host.agent.lease_pause import PAUSED_SUMMARY
from host.agent.loop import PAUSED_NOT_RUN, AgentLoop, LoopSettings, TaskOutcome, TaskSpec
from host.agent.progress import ProgressHolder
from host.agent.stop_signal import HOST_STOPPED, StopSignal
from host.cloud_channel import open_channel
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.lease_client import UNREACHABLE_SUMMARY, LeaseClient, LeaseClientConfig
from host.outbox import OutboxStore
from host.outbox.kinds import DECISION
from host.outbox.shipments import Shipments
from host.perception.perceive import Perceiver
from host.settings import HostSettings
from planner.decision import Decision
from planner.history import WorldEvent
from planner.planner import Planner
from planner.scene import Scene
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.host.lease_fake import RunningCloud, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner, Step, by_text
from tests.host.test_lease_client import StaticDevices, Stepper
from tests.support.fakes import ANTHROPIC_KEY, FakeModelServer, ScriptedTurn, tool_use
from tests.support.waiting import until

HOST_ID = "h1"
SERIAL = "emulator-5554"
SETTINGS_APP = "com.android.settings"
DARK_THEME = [
    Step("launch_app", {"package_name": SETTINGS_APP}, "open Settings", "Settings list shows"),
    Step("tap", by_text("Display"), "open display settings", "Display page shows"),
    Step("tap", by_text("Dark theme"), "turn dark theme on", "the switch is on"),
    Step("complete", {"success": True, "reason": "dark theme is on"}),
]


class StepPlanner:
    """The scripted model, its answer chosen by the step asked about (the history's length, as
    the cloud's `step_key`), counting each call: a step asked twice is a model turn paid twice.
    Step `hold` waits for `release` before answering."""

    def __init__(self, steps: list[Step], hold: int) -> None:
        self.steps, self.hold = steps, hold
        self.asked: list[int] = []
        self.pages: list[str | None] = []
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        step = len(history) + 1
        self.asked.append(step)
        self.pages.append(scene.page)
        if step == self.hold:
            self.holding.set()
            await self.release.wait()
        one = ScriptedPlanner([self.steps[step - 1]])
        return await one.decide(goal, scene, history, screenshot)


def _client(
    cloud: RunningCloud,
    body: Callable[..., Awaitable[Any]],
    tmp_path: Path,
    config: LeaseClientConfig | None = None,
    rng: random.Random | None = None,
) -> LeaseClient:
    settings = HostSettings(
        cloud_address=f"127.0.0.1:{cloud.port}",
        certs_dir=cloud.pki_dir,
        host_id=HOST_ID,
        data_dir=tmp_path / "host",
    )
    return LeaseClient(
        lambda: open_channel(settings),
        StaticDevices(SERIAL),
        body,
        config or LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
        rng=rng or random.Random(7),
    )


@contextlib.asynccontextmanager
async def _running(
    tmp_path: Path,
    body: Callable[..., Awaitable[Any]],
    config: LeaseClientConfig | None = None,
    rng: random.Random | None = None,
) -> AsyncIterator[tuple[RunningCloud, LeaseClient]]:
    """A fake cloud and a lease client running `body` for its assignments, connected."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    client = _client(cloud, body, tmp_path, config, rng)
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop))
    try:
        await asyncio.wait_for(client.wait_connected(), 20)
        yield cloud, client
    finally:
        stop.set()
        await task
        await cloud.server.stop(grace=None)


def _loop(phone: VirtualPhone, planner: StepPlanner) -> AgentLoop:
    return AgentLoop(
        VirtualDriver(phone),
        planner,
        Perceiver(None, retries=2, retry_delay_s=0),
        None,
        LoopSettings(max_steps=10, settle_delay_s=0, ocr=False),
    )


@contextlib.asynccontextmanager
async def _cloud_and_host(
    tmp_path: Path, planner: StepPlanner
) -> AsyncIterator[tuple[RunningCloud, LeaseClient, VirtualPhone]]:
    phone = VirtualPhone(SERIAL)
    async with _running(tmp_path, _loop(phone, planner).run) as (cloud, client):
        cloud.cloud.lease_s = 1.0
        yield cloud, client, phone


async def _away_past_the_lease(cloud: RunningCloud, client: LeaseClient, task_id: str) -> None:
    """The cloud goes away while step 2 is with the model, until the lease has run out by the
    host's clock (its renewer wakes at that moment; this waits a little longer)."""
    await cloud.server.stop(grace=None)
    rt = client._tasks[(task_id, 1)]
    await cloud.cloud.wait_for(lambda: time.monotonic() > rt.expires_mono + 0.3)


async def test_a_cloud_away_past_the_lease_pauses_the_attempt_and_it_continues_when_resumed(
    tmp_path: Path,
) -> None:
    """Before, the host stopped the attempt at its local expiry (a retryable result: attempt 2
    started from scratch, every step's model turn paid again) though the cloud, back, kept the
    lease. Now the attempt waits, does nothing on its phone, and continues in attempt 1 once
    the cloud resumes the assignment its hello named: no step done is asked again."""
    planner = StepPlanner(DARK_THEME, hold=2)
    async with _cloud_and_host(tmp_path, planner) as (cloud, client, phone):
        fake = cloud.cloud
        await fake.assign("t1", SERIAL, "Turn on dark theme")
        await asyncio.wait_for(planner.holding.wait(), 20)
        await _away_past_the_lease(cloud, client, "t1")
        planner.release.set()  # the model answers step 2 while the lease is not confirmed
        rt = client._tasks[("t1", 1)]
        await fake.wait_for(lambda: rt.progress.snapshot().summary.endswith(PAUSED_SUMMARY))
        assert [spec.task_id for spec, _ in client.running()] == ["t1"]  # paused, not stopped
        assert rt.progress.snapshot().summary == f"step 2: {PAUSED_SUMMARY}"
        assert planner.asked == [1, 2]  # no model call while paused
        assert not phone.state.flag("dark_theme")

        back = await start_fake_cloud(cloud.pki_dir, HOST_ID, port=cloud.port, cloud=fake)
        try:
            await fake.wait_for(lambda: len(fake.results) == 1, within=30)
        finally:
            await back.server.stop(grace=None)
        [result] = fake.results
        assert (result.task_id, result.attempt) == ("t1", 1)
        assert result.status == types_pb2.TASK_STATUS_SUCCEEDED, result.summary
        assert phone.state.flag("dark_theme")
        held = [h.task_id for h in fake.hellos[-1].held_assignments]
        assert held == ["t1"]  # the hello named it, and the cloud resumed it
        # Each step asked once, but step 2: its answer came while paused, and it was not acted
        # on; the step looked at the screen again (the same page: nothing was tapped).
        assert planner.asked == [1, 2, 2, 3, 4]
        assert planner.pages[1] == planner.pages[2]


async def test_a_paused_attempt_the_cloud_refuses_stops_having_done_nothing_more(
    tmp_path: Path,
) -> None:
    """The host was cut off while the cloud stayed up: the cloud swept the lease (and handed
    the task on). The paused attempt does nothing on its phone meanwhile, and stops when the
    cloud refuses the assignment its hello named, reporting the retryable result of a lease
    run out while the cloud was unreachable."""
    planner = StepPlanner(DARK_THEME, hold=2)
    async with _cloud_and_host(tmp_path, planner) as (cloud, client, phone):
        fake = cloud.cloud
        lease = await fake.assign("t2", SERIAL, "Turn on dark theme")
        fake.ack_results = False
        await asyncio.wait_for(planner.holding.wait(), 20)
        await _away_past_the_lease(cloud, client, "t2")
        planner.release.set()
        rt = client._tasks[("t2", 1)]
        await fake.wait_for(lambda: rt.progress.snapshot().summary.endswith(PAUSED_SUMMARY))
        del fake.leases[("t2", 1)]  # swept: the cloud no longer holds it for this host
        hellos = len(fake.hellos)

        back = await start_fake_cloud(cloud.pki_dir, HOST_ID, port=cloud.port, cloud=fake)
        try:
            await fake.wait_for(lambda: len(fake.hellos) > hellos)
            await fake.send(
                lease_service_pb2.LeaseResponse(
                    revoked=lease_service_pb2.Revoked(
                        task_id="t2",
                        attempt=1,
                        lease_id=lease.lease_id,
                        reason=lease_service_pb2.REVOKE_REASON_EXPIRED,
                        message="lease expired",
                    )
                )
            )
            await fake.wait_for(lambda: len(fake.results) == 1, within=30)
        finally:
            await back.server.stop(grace=None)
        [result] = fake.results
        assert (result.status, result.retryable) == (types_pb2.TASK_STATUS_FAILED, True)
        assert result.summary == UNREACHABLE_SUMMARY
        assert planner.asked == [1, 2]  # nothing asked, nothing done after the expiry
        assert not phone.state.flag("dark_theme")
        assert client.running() == []


async def _paused_at_step_2(
    planner: StepPlanner, deadline: float | None
) -> tuple[AgentLoop, StopSignal, ProgressHolder, asyncio.Task[TaskOutcome], VirtualPhone]:
    """A loop whose lease pauses while step 2 is with the model, paused at its gate."""
    phone = VirtualPhone(SERIAL)
    loop = _loop(phone, planner)
    cancel, progress = StopSignal(), ProgressHolder()
    spec = TaskSpec("t3", 1, "Turn on dark theme", SERIAL, "L3", deadline)
    run = asyncio.create_task(loop.run(spec, progress, cancel))
    await asyncio.wait_for(planner.holding.wait(), 20)
    cancel.lease.pause()
    planner.release.set()
    await until(lambda: progress.snapshot().summary.endswith(PAUSED_SUMMARY), what="paused")
    return loop, cancel, progress, run, phone


async def test_a_host_stop_while_paused_hands_the_attempt_back_as_a_stop() -> None:
    planner = StepPlanner(DARK_THEME, hold=2)
    _, cancel, _, run, phone = await _paused_at_step_2(planner, None)
    cancel.stop(HOST_STOPPED)
    outcome = await asyncio.wait_for(run, 20)
    assert (outcome.status, outcome.summary) == ("cancelled", "stopped: the host stopped")
    assert planner.asked == [1, 2]
    assert not phone.state.flag("dark_theme")


async def test_a_deadline_while_paused_ends_the_attempt_retryable() -> None:
    """The task's deadline passes while the lease waits for the cloud's word: the attempt ends
    retryable, as one whose planning stayed impossible until its deadline does."""
    planner = StepPlanner(DARK_THEME, hold=2)
    deadline = time.monotonic() + 3.0
    *_, run, _ = await _paused_at_step_2(planner, deadline)
    outcome = await asyncio.wait_for(run, 20)
    assert (outcome.status, outcome.retryable) == ("failed", True), outcome
    assert "confirmed it when the task's deadline came" in outcome.summary
    assert planner.asked == [1, 2]


async def test_a_paused_loop_continues_at_its_step_once_resumed() -> None:
    planner = StepPlanner(DARK_THEME, hold=2)
    _, cancel, _, run, phone = await _paused_at_step_2(planner, None)
    cancel.lease.resume()
    outcome = await asyncio.wait_for(run, 20)
    assert outcome.status == "succeeded", outcome
    assert planner.asked == [1, 2, 2, 3, 4]
    assert phone.state.flag("dark_theme")


async def test_a_paused_attempt_continues_only_on_an_answer_that_leaves_time_on_its_lease(
    tmp_path: Path,
) -> None:
    """A renewal answered with no time left on the lease confirms nothing: the attempt stays
    paused (continuing, it would act past its lease at once); an answer with time left resumes
    it."""
    body = Stepper(50)
    async with _running(tmp_path, body) as (cloud, client):
        fake = cloud.cloud
        fake.lease_s = 0.6
        lease = await fake.assign("t4", SERIAL, "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        del fake.leases[("t4", 1)]  # its renewals go unanswered
        rt = client._tasks[("t4", 1)]
        await fake.wait_for(lambda: rt.cancel.lease.paused)

        async def renewed(seconds: float) -> None:
            left = Duration()
            left.FromTimedelta(timedelta(seconds=seconds))
            was = rt.expires_mono
            await fake.send(
                lease_service_pb2.LeaseResponse(
                    renewed=lease_service_pb2.Renewed(
                        task_id="t4", attempt=1, lease_id=lease.lease_id, lease_remaining=left
                    )
                )
            )
            await fake.wait_for(lambda: rt.expires_mono != was)  # the answer was read

        await renewed(0)
        assert rt.cancel.lease.paused
        await renewed(30)
        assert not rt.cancel.lease.paused


async def test_a_renewal_answer_read_late_does_not_resume_a_lease_the_cloud_swept(
    tmp_path: Path,
) -> None:
    """The cloud answers a renewal with a full term, then stops hearing the host; the answer
    reaches the host late (a link that buffers, a slow cloud send queue), after the cloud's
    own expiry of that term swept the lease. Its term counts from when the renewal it answers
    left the host, not from when it is read: it confirms nothing, the attempt stays paused and
    asks no model."""
    planner = StepPlanner(DARK_THEME, hold=2)
    async with _cloud_and_host(tmp_path, planner) as (cloud, client, _phone):
        fake = cloud.cloud
        lease = await fake.assign("t9", SERIAL, "Turn on dark theme")
        await asyncio.wait_for(planner.holding.wait(), 20)
        left = Duration()
        left.FromTimedelta(timedelta(seconds=fake.lease_s))
        late = lease_service_pb2.LeaseResponse(
            renewed=lease_service_pb2.Renewed(
                task_id="t9", attempt=1, lease_id=lease.lease_id, lease_remaining=left
            )
        )
        del fake.leases[("t9", 1)]  # its renewals go unanswered from here
        rt = client._tasks[("t9", 1)]
        await fake.wait_for(lambda: rt.cancel.lease.paused)
        paused_at = time.monotonic()  # a renewal left at the pause, at the latest
        planner.release.set()
        await fake.wait_for(lambda: rt.progress.snapshot().summary.endswith(PAUSED_SUMMARY))
        await fake.wait_for(lambda: time.monotonic() > paused_at + fake.lease_s + 0.5)
        asked = len(planner.asked)
        was = rt.expires_mono
        await fake.send(late)  # a term that ended by the cloud's count before it was read
        await fake.wait_for(lambda: rt.expires_mono != was)  # the answer was read
        assert rt.expires_mono < time.monotonic()
        assert rt.cancel.lease.paused
        await fake.send(_swept(lease))
        await fake.wait_for(lambda: client.running() == [], within=20)
        assert planner.asked[asked:] == []


def _swept(lease: Any) -> lease_service_pb2.LeaseResponse:
    """The cloud's sweeper's Revoked of `lease` (run out)."""
    return lease_service_pb2.LeaseResponse(
        revoked=lease_service_pb2.Revoked(
            task_id=lease.task_id,
            attempt=lease.attempt,
            lease_id=lease.lease_id,
            reason=lease_service_pb2.REVOKE_REASON_EXPIRED,
            message="lease expired",
        )
    )


async def test_rejected_renewals_leave_later_answers_their_own_send_times(tmp_path: Path) -> None:
    """A cloud back but its database not rejects renewals (UNAVAILABLE, naming the task): each
    rejection answers its renewal, so the next `Renewed` counts its term from the renewal it
    answers, not from the oldest one rejected (an ever older send: a lease counted short for
    good, and a paused attempt that could never continue)."""
    body = Stepper(50)
    async with _running(tmp_path, body) as (cloud, client):
        fake = cloud.cloud
        fake.lease_s = 0.6
        lease = await fake.assign("t6", SERIAL, "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        del fake.leases[("t6", 1)]  # its renewals go unanswered
        rt = client._tasks[("t6", 1)]
        await fake.wait_for(lambda: len(rt.renewals_out) >= 3, within=20)
        oldest = rt.renewals_out[0]
        rejected = lease_service_pb2.LeaseResponse(
            rejected=lease_service_pb2.Rejected(code=14, message="database down", task_id="t6")
        )
        for _ in range(2):
            await fake.send(rejected)
        await fake.wait_for(lambda: rt.renewals_out[0] != oldest)
        left = Duration()
        left.FromTimedelta(timedelta(seconds=30))
        was = rt.expires_mono
        await fake.send(
            lease_service_pb2.LeaseResponse(
                renewed=lease_service_pb2.Renewed(
                    task_id="t6", attempt=1, lease_id=lease.lease_id, lease_remaining=left
                )
            )
        )
        await fake.wait_for(lambda: rt.expires_mono != was)
        assert rt.expires_mono > oldest + 30
        assert not rt.cancel.lease.paused


class _Watched(VirtualDriver):
    """A virtual phone's driver noting each call made on it while its attempt's lease is
    paused; `pause_at` names a call after which the lease pauses (the renewer firing then)."""

    def __init__(self, phone: VirtualPhone, cancel: StopSignal) -> None:
        super().__init__(phone)
        self.cancel = cancel
        self.while_paused: list[str] = []
        self.pause_at = ""

    def _before(self, name: str) -> None:
        if self.cancel.lease.paused:
            self.while_paused.append(name)

    def _after(self, name: str) -> None:
        if self.pause_at == name:
            self.pause_at = ""
            self.cancel.lease.pause()

    def screen_state(self) -> Any:
        self._before("screen_state")
        try:
            return super().screen_state()
        finally:
            self._after("screen_state")

    def screenshot_png(self) -> bytes:
        self._before("screenshot_png")
        return super().screenshot_png()

    def dump_hierarchy(self) -> str:
        self._before("dump_hierarchy")
        return super().dump_hierarchy()

    def wake(self) -> None:
        self._before("wake")
        super().wake()

    def tap(self, x: int, y: int) -> None:
        self._before("tap")
        super().tap(x, y)
        self._after("tap")

    def launch_app(self, package: str) -> None:
        self._before("launch_app")
        super().launch_app(package)


class _Armed(AgentLoop):
    """Calls `arm` once step 2's ACTING progress line is written, just before its action."""

    arm: Any = None

    async def _progress(
        self,
        spec: TaskSpec,
        progress: ProgressHolder,
        step: int,
        status: types_pb2.StepStatus.ValueType,
        summary: str,
    ) -> None:
        await super()._progress(spec, progress, step, status, summary)
        if status == types_pb2.STEP_STATUS_ACTING and step == 2 and self.arm is not None:
            arm, self.arm = self.arm, None
            arm()


async def _paused_around_step_2(arm: str) -> list[str]:
    """Run the dark-theme task until it waits paused; the lease pauses at `arm`: "acting"
    (during step 2's ACTING progress write), or a driver call of step 2 ("screen_state": the
    wake-up check before its tap; "tap": the tap itself). What the phone was asked while the
    lease was paused."""
    cancel = StopSignal()
    driver = _Watched(VirtualPhone(SERIAL), cancel)
    loop = _Armed(
        driver,
        ScriptedPlanner(list(DARK_THEME)),
        Perceiver(None, retries=2, retry_delay_s=0),
        None,
        LoopSettings(max_steps=10, settle_delay_s=0, ocr=False),
    )
    if arm == "acting":
        loop.arm = cancel.lease.pause
    else:
        loop.arm = lambda: setattr(driver, "pause_at", arm)
    progress = ProgressHolder()
    run = asyncio.create_task(loop.run(TaskSpec("t", 1, "g", SERIAL, "L", None), progress, cancel))
    try:
        await until(lambda: progress.snapshot().summary.endswith(PAUSED_SUMMARY), what="paused")
    finally:
        cancel.stop(HOST_STOPPED)
        await asyncio.wait_for(run, 20)
    return driver.while_paused


async def test_no_action_starts_after_a_pause_during_the_acting_progress_write() -> None:
    assert await _paused_around_step_2("acting") == []


async def test_no_action_starts_after_a_pause_while_the_screen_is_readied() -> None:
    assert await _paused_around_step_2("screen_state") == []


async def test_a_step_whose_action_the_pause_came_in_is_not_looked_at_after() -> None:
    """The action under way ends; its after look (which wakes the screen and dismisses a
    keyguard) is not taken: the phone is asked nothing more until the cloud confirms."""
    assert await _paused_around_step_2("tap") == []


async def test_a_decision_the_pause_kept_from_running_is_shipped_as_not_run(
    tmp_path: Path,
) -> None:
    """Direct transport: step 2's decision is shipped, then the lease pauses during its
    ACTING write. The step is looked at afresh once resumed and its new decision shipped;
    the first is shipped again with an outcome saying it never ran (before, it stayed in the
    record with no outcome, read as a step whose outcome was lost)."""
    cancel = StopSignal()
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    loop = _Armed(
        VirtualDriver(VirtualPhone(SERIAL)),
        StepPlanner(DARK_THEME, hold=0),
        Perceiver(None, retries=2, retry_delay_s=0),
        None,
        LoopSettings(max_steps=10, settle_delay_s=0, ocr=False),
        shipments=Shipments(store, "direct", screenshots=False),
    )
    loop.arm = cancel.lease.pause
    progress = ProgressHolder()
    spec = TaskSpec("t", 1, "g", SERIAL, "L", None)
    run = asyncio.create_task(loop.run(spec, progress, cancel))
    try:
        await until(lambda: progress.snapshot().summary.endswith(PAUSED_SUMMARY), what="paused")
        cancel.lease.resume()
        outcome = await asyncio.wait_for(run, 20)
    finally:
        cancel.stop(HOST_STOPPED)
        await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 20)
    assert outcome.status == "succeeded"
    shipped = [
        decision_log_service_pb2.ShippedDecision.FromString(item.body)
        for item in store.head(100)
        if item.kind == DECISION
    ]
    store.close()
    not_run = [e for e in shipped if e.outcome.error == PAUSED_NOT_RUN]
    assert len(not_run) == 1 and not not_run[0].outcome.executed
    decided = {e.host_decision_id for e in shipped}
    told = {e.host_decision_id for e in shipped if e.HasField("outcome")}
    assert len(decided) == 5 and told == decided, "a decision left without an outcome"


async def test_paused_renewals_are_no_faster_than_the_renew_interval(tmp_path: Path) -> None:
    """A paused attempt whose renewals go unanswered (a cloud back but its database not)
    renews at its renew interval, as a running one does: a lease of 9 s renews every 3 s, so
    5 s after the pause at most the renewal sent at the pause and one more arrive (before,
    one a second: 10x the normal rate at 30 s leases, 20x at the host's 60 s, against a cloud
    that just came back)."""
    body = Stepper(50)
    async with _running(tmp_path, body) as (cloud, client):

        def renewals() -> int:
            return sum(1 for r in fake.received if r.WhichOneof("kind") == "renewal")

        fake = cloud.cloud
        fake.lease_s = 9.0
        await fake.assign("t5", SERIAL, "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        rt = client._tasks[("t5", 1)]
        del fake.leases[("t5", 1)]  # unanswered from here
        rt.expires_mono = time.monotonic() + 0.2  # as if its last answers were lost
        rt.changed.set()  # the renewer looks at the lease now
        await fake.wait_for(lambda: rt.cancel.lease.paused)
        before = renewals()
        await asyncio.sleep(5.0)
        assert renewals() - before <= 2


class _Ceilings(random.Random):
    """A seeded random source noting each backoff's ceiling (`backoff_delay`'s upper bound)."""

    def __init__(self) -> None:
        super().__init__(7)
        self.ceilings: list[float] = []

    def uniform(self, a: float, b: float) -> float:
        self.ceilings.append(b)
        return super().uniform(a, b)


async def test_a_paused_attempt_caps_the_reconnect_backoff_at_half_its_lease(
    tmp_path: Path,
) -> None:
    """While an attempt is paused, only a connection can bring the cloud's word: the reconnect
    backoff stays under half its lease (full jitter below that), not up to its cap."""
    body = Stepper(50)
    rng = _Ceilings()
    config = LeaseClientConfig(reconnect_initial_s=10.0, reconnect_max_s=60.0)
    async with _running(tmp_path, body, config, rng) as (cloud, client):
        fake = cloud.cloud
        fake.lease_s = 1.0
        await fake.assign("t7", SERIAL, "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        rt = client._tasks[("t7", 1)]
        del fake.leases[("t7", 1)]  # its renewals go unanswered
        await fake.wait_for(lambda: rt.cancel.lease.paused)
        fake.cut()  # the stream breaks: the host backs off before reconnecting
        await fake.wait_for(lambda: rng.ceilings != [])
        assert rng.ceilings[0] <= rt.lease_s / 2


async def test_a_decision_under_way_asks_the_model_nothing_more_once_paused() -> None:
    """Direct transport: the lease pauses while the step's first model call is out; its
    answer is unusable, which the planner would correct with another call inside the same
    decision. The planning is raced against the pause: it is abandoned there (the call under
    way billed as for a cancel), and no further call goes to the provider while paused."""
    held = threading.Event()
    intent = {"purpose": "p", "expected_outcome": "e"}
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as fake:
        fake.script_anthropic(
            ScriptedTurn(
                [tool_use("input_text", {"text": "x" * (1024 * 1024), **intent})], hold=held
            ),
            ScriptedTurn([tool_use("complete", {"success": True, "reason": "ok"})]),
        )
        settings = PlannerSettings(
            provider="anthropic",
            anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=fake.anthropic_base_url,
            model="claude-test-model",
            max_retries=0,
        )
        planner = Planner(make_adapter(settings), settings)
        loop = AgentLoop(
            VirtualDriver(VirtualPhone(SERIAL)),
            planner,
            Perceiver(None, retries=2, retry_delay_s=0),
            None,
            LoopSettings(max_steps=5, settle_delay_s=0, ocr=False),
        )
        cancel, progress = StopSignal(), ProgressHolder()
        spec = TaskSpec("t", 1, "g", SERIAL, "L", None)
        run = asyncio.create_task(loop.run(spec, progress, cancel))
        try:
            await until(lambda: len(fake.bodies("/v1/messages")) == 1, what="asked")
            cancel.lease.pause()  # the lease runs out by the host's clock now
            held.set()
            await until(lambda: progress.snapshot().summary.endswith(PAUSED_SUMMARY), what="paused")
            asked = len(fake.bodies("/v1/messages"))
        finally:
            held.set()
            cancel.stop(HOST_STOPPED)
            await asyncio.wait_for(run, 20)
            await planner.aclose()
    assert asked == 1


async def test_a_cloud_rejecting_every_renewal_for_a_while_is_one_warning_not_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database restart under the cloud rejects every renewal of every attempt UNAVAILABLE
    ("retry"): nothing is lost (results are kept and resent, renewals repeat), so the host says
    so once, as a warning, and once more when a renewal is answered again. Each rejection was
    an ERROR line before: ~20 per host over a short database restart."""
    body = Stepper(50)
    async with _running(tmp_path, body) as (cloud, _client):
        fake = cloud.cloud
        lease = await fake.assign("t7", SERIAL, "g")
        await fake.wait_for(lambda: len(body.started) == 1)
        rejected = lease_service_pb2.LeaseResponse(
            rejected=lease_service_pb2.Rejected(code=14, message="database down", task_id="t7")
        )
        with caplog.at_level(logging.DEBUG, logger="host.lease_client"):
            for _ in range(5):
                await fake.send(rejected)
            left = Duration()
            left.FromTimedelta(timedelta(seconds=30))
            await fake.send(
                lease_service_pb2.LeaseResponse(
                    renewed=lease_service_pb2.Renewed(
                        task_id="t7", attempt=1, lease_id=lease.lease_id, lease_remaining=left
                    )
                )
            )
            await fake.wait_for(
                lambda: any("takes messages again" in r.getMessage() for r in caplog.records)
            )
    mine = [r for r in caplog.records if r.name == "host.lease_client"]
    assert not [r for r in mine if r.levelno >= logging.ERROR]
    warned = [r for r in mine if r.levelno == logging.WARNING and "just now" in r.getMessage()]
    assert len(warned) == 1 and "database down" in warned[0].getMessage()
