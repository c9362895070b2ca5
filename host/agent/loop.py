"""The agent loop for one task on one phone.

Per step: screenshot + hierarchy (before) → plan → execute the typed action (intent stripped)
→ screenshot + hierarchy (after, also when the action failed) → record. Driver calls run in
worker threads so one host drives several phones at once. A cancellation event (the lease was
revoked, or the host is stopping: `StopSignal` says which, and the timeline records it) stops the
loop within one step: it is checked between phases and races planning. A lease run out by the
host's own clock with the cloud unheard pauses the loop instead (`lease_pause`): no action and
no model call until the cloud confirms the lease, then the step looks at the screen afresh.

Two ends are not the task's: a step that could not be planned right now waits inside the lease
(`planning_wait`), and a lease the cloud says is no longer live stops the loop without a
verdict (`TaskOutcome.lease_lost`: the cloud has ended or will end that attempt; the host
answers it CANCELLED, which only a task being cancelled still takes). A task's secret
parameters (`TaskSpec.secrets`) are typed where a decision's text refers to them
(`{{secret:NAME}}`) and scrubbed from everything observed afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from amc.v1 import types_pb2
from host import metrics as host_metrics
from host.agent.actions import ActionResult, action_to_record, changes_screen, describe, execute
from host.agent.lease_pause import PAUSED_SUMMARY, LeasePause, PausedPastDeadline
from host.agent.planning_wait import (
    CloudBack,
    Impossible,
    PlanningPostponed,
    WaitPolicy,
    plan_patiently,
)
from host.agent.progress import ProgressHolder, status_name, truncate
from host.agent.redact import SecretRedactor
from host.agent.step_telemetry import StepTelemetry
from host.agent.stop_signal import lease_pause, stop_reason
from host.agent.verdicts import ReplayTally, check_step
from host.devices.base import DeviceBusy, DeviceError, DeviceGone, Driver, ScreenUnavailable
from host.devices.health import Part
from host.devices.lanes import Lane, in_own_thread, new_lane
from host.outbox import Shipments, StepRef
from host.perception.hierarchy import HierarchyError
from host.perception.perceive import Observation, Perceiver
from host.planner_client import CloudPlanError, StepPlanner
from host.timeline.record import TimelineRecord, screen_record
from host.timeline.storage_faults import storage_fault, storage_summary
from host.timeline.store import TimelineStore, UnsettledCall
from planner import secret_refs, unsettled
from planner.budget import Budget, FleetDay
from planner.decision import Billed, Decision, Usage
from planner.errors import (
    PlannerError,
    cut_off_label,
    take_billed,
    take_cut_off,
    take_in_flight,
)
from planner.history import WorldEvent
from planner.late_calls import count_when_answered
from planner.observation import clip
from planner.scene import Bounds, Scene
from planner.steps import MAX_DRIVER_OUTPUT_BYTES, MAX_OUTCOME_ERROR_BYTES, target_label
from planner.verify import MAX_EVIDENCE_BYTES, verdict_to_proto

log = logging.getLogger(__name__)
T = TypeVar("T")

Outcome = Literal["succeeded", "failed", "cancelled"]

_TERMINAL: dict[str, types_pb2.TaskStatus.ValueType] = {
    "succeeded": types_pb2.TASK_STATUS_SUCCEEDED,
    "failed": types_pb2.TASK_STATUS_FAILED,
    "cancelled": types_pb2.TASK_STATUS_CANCELLED,
}


@dataclass(slots=True)
class TaskSpec:
    """One attempt to run: what the lease gave the host. Not frozen: the lease client updates
    `deadline` when the cloud resumes the attempt after a reconnect (the loop reads it each
    step), as it updates `withdrawn_flows` and `fleet_day` in place."""

    task_id: str
    attempt: int
    goal: str
    device_serial: str
    lease_id: str = ""
    #: The task's deadline on this host's monotonic clock (`time.monotonic()`; None: none
    #: known), so a step of the wall clock moves it neither nearer nor farther; a wait for the
    #: planner ends before it. A resumed assignment sets it anew.
    deadline: float | None = None
    #: Secret parameters, name → value (Assignment.secrets): typed where a decision's text says
    #: `{{secret:NAME}}`, kept in memory only, never printed (left out of repr).
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Learned flows the cloud retrieved for the goal, best first (the assignment's `flow` and
    #: `alternatives`): a direct-transport planner replays them (see planner/flows/replay.py).
    flows: tuple[types_pb2.Flow, ...] = ()
    #: Ids of those flows the cloud said are no longer active (each renewal adds to it in
    #: place): the direct transport replays them no further.
    withdrawn_flows: set[str] = field(default_factory=set)
    #: The task's spending caps and what it spent before this attempt (from the assignment);
    #: the direct transport checks them before each model call.
    budget: Budget = field(default_factory=Budget)
    spent: Usage = field(default_factory=Usage)
    #: The fleet's daily caps and today's spending as the cloud last said (the assignment,
    #: then each renewal updates it in place); the direct transport checks them too.
    fleet_day: FleetDay = field(default_factory=FleetDay)


@dataclass(slots=True)
class TaskOutcome:
    """How an attempt ended, for the lease result and the local store."""

    status: Outcome
    summary: str
    steps: int
    device_gone: bool = False
    #: What adb still lists the gone phone as ("unauthorized", "offline"); "" when not listed.
    adb_state: str = ""
    #: A failure outside the task (planning stayed impossible until the deadline came near,
    #: the phone vanished, did not answer a look or cannot show its screen): the cloud queues
    #: the next attempt if the task has any left.
    retryable: bool = False
    #: The cloud said the lease is no longer live (expired, revoked, superseded, its task being
    #: cancelled): the attempt stopped without a verdict on the task (answered CANCELLED).
    lease_lost: bool = False
    #: How replaying a learned flow went (None: no step was replayed or handed over).
    replay: types_pb2.FlowReplayReport | None = None
    #: What ended the attempt when it could not read its phone (a look unanswered, no usable
    #: tree, no image) or drive it (actions unanswered): the host counts these per phone
    #: (`host.devices.health`); "" otherwise. `unreadable_part` says which of the two.
    unreadable: str = ""
    unreadable_part: Part = "look"
    #: What the disk said when the attempt could not write the host's data folder
    #: (`host.timeline.storage_faults`): the host stops taking work; "" otherwise.
    storage: str = ""

    @property
    def proto_status(self) -> types_pb2.TaskStatus.ValueType:
        return _TERMINAL[self.status]


@dataclass(slots=True)
class LoopSettings:
    max_steps: int = 30
    settle_delay_s: float = 0.3
    #: More looks at the screen, each after `settle_delay_s`, while the checker finds a step's
    #: expected outcome not met (an app that loads shows it a moment late).
    late_outcome_looks: int = 2
    send_screenshot: bool = False
    ocr: bool = True
    planner_transport: str = "direct"
    planner_wait: WaitPolicy = field(default_factory=WaitPolicy)
    #: This host's id, for the attempt's log lines and spans (None: not known yet).
    host_id: str | None = None
    #: False: the caller writes the attempt's end into the timeline once the attempt's result
    #: is kept for the cloud (a host: its lease client's `ended`). Written first, a host killed
    #: in between said "succeeded" in its own record while no result reached the cloud.
    finishes_timeline: bool = True
    #: The host's data folders besides the timeline's own (`DataFolder.folders`): a refused
    #: permission on a file elsewhere is the attempt's error, not the host's disk
    #: (`host.timeline.storage_faults`).
    data_folders: Sequence[Path] = ()


#: A box past any screenshot's edge: painting it covers the whole image.
_WHOLE_IMAGE = 1 << 20
#: Actions a dark screen drops: a touch or a key reaches no app while the display is off.
_GESTURES = frozenset({"tap", "swipe", "input_text", "press_key"})


#: Actions in a row the phone did not answer in time (`ActionResult.unanswered`) that end
#: an attempt, retryable: one is a failed step the model sees and works around; a phone
#: whose taps hang again and again is sick, not the task, and counts towards marking it
#: unhealthy (`host.devices.health`) as a phone whose screen cannot be read does.
ACTIONS_UNANSWERED = 2


class _ActionsUnanswered(Exception):
    """`ACTIONS_UNANSWERED` actions in a row got no answer (the message says the last)."""


class _Cancelled(Exception):
    pass


#: A step's `after_error` when the lease paused before its after look (not taken: a look wakes
#: the screen and dismisses a keyguard, which a paused attempt does not do).
PAUSED_NO_LOOK = "not looked at after the action: the lease paused"


#: The outcome shipped for a decision whose action never ran because the lease paused first:
#: the step is looked at afresh, and its next decision is shipped on its own.
PAUSED_NOT_RUN = "not run: the lease paused before the action; the step was looked at afresh"


class _Paused(Exception):
    """The lease paused before the step's action (`host.agent.lease_pause`): the step waits
    for the cloud to confirm it, then looks at the screen afresh. `planned`: the step as far
    as it got, when its decision was already made (and shipped)."""

    def __init__(self, planned: _Planned | None = None) -> None:
        super().__init__()
        self.planned = planned


@dataclass(slots=True)
class _Planned:
    """A step up to its action (`AgentLoop._look_and_decide`)."""

    record: TimelineRecord
    timings: dict[str, float]
    before: Observation
    decision: Decision
    ref: StepRef | None
    line: str


def _now() -> str:
    return datetime.now(UTC).isoformat()


class AgentLoop:
    """Runs tasks on one phone. One task at a time; make one per phone."""

    def __init__(
        self,
        driver: Driver,
        planner: StepPlanner,
        perceiver: Perceiver,
        store: TimelineStore | None = None,
        settings: LoopSettings | None = None,
        shipments: Shipments | None = None,
        lane: Executor | None = None,
        cloud_back: CloudBack | None = None,
    ) -> None:
        self.driver = driver
        #: Said when the lease stream is welcomed again: a step waiting out a planning
        #: backoff asks again at once (`planning_wait.CloudBack`).
        self.cloud_back = cloud_back
        self.planner = planner
        self.perceiver = perceiver
        self.store = store
        self.settings = settings or LoopSettings()
        #: The host's outbox: each step's decision (direct transport) and screenshots go there.
        self.shipments = shipments
        #: The phone's worker thread for driver calls (see `host.devices.lanes`): the host's,
        #: shared by the phone's attempts, or else one of this loop's own, made on first use
        #: and shut down when a run ends.
        self._shared_lane = lane
        self._lane: Lane | None = None

    async def _on_phone(self, fn: Callable[..., T], *args: object) -> T:
        """Run a (blocking) driver call in the phone's own worker thread, never in asyncio's
        default pool (a stuck call there stalled every other phone: `host.devices.lanes`)."""
        lane = self._shared_lane
        if lane is None:
            if self._lane is None:
                self._lane = new_lane(self.driver.serial)
            lane = self._lane
        call = functools.partial(fn, *args)
        return await asyncio.get_running_loop().run_in_executor(lane, call)

    def _close_lane(self) -> None:
        """Let this loop's own thread go; one still inside a stuck call ends when the call
        does (every driver read has a timeout)."""
        lane, self._lane = self._lane, None
        if lane is not None:
            lane.shutdown(wait=False, cancel_futures=True)

    async def _guard(
        self, cancel: asyncio.Event, work: Awaitable[T], pause: LeasePause | None = None
    ) -> T:
        """Await `work` unless `cancel` fires first (then the work is abandoned), or `pause`
        pauses first (abandoned too, raising `_Paused`: the planning, whose one decision may
        ask the model several times; a call under way is billed as for a cancel, `_decide`)."""
        if cancel.is_set() or (pause is not None and pause.paused):
            if asyncio.iscoroutine(work):
                work.close()
            raise _Cancelled if cancel.is_set() else _Paused
        task: asyncio.Future[T] = asyncio.ensure_future(work)
        waiter: asyncio.Future[object] = asyncio.ensure_future(cancel.wait())
        pending: set[asyncio.Future[object]] = {task, waiter}  # type: ignore[arg-type]
        paused: asyncio.Future[None] | None = None
        if pause is not None:
            paused = asyncio.ensure_future(pause.wait_paused())
            pending.add(paused)  # type: ignore[arg-type]
        try:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if paused is not None:
                paused.cancel()
        if task in done:
            return task.result()
        task.cancel()
        if waiter in done:
            raise _Cancelled
        raise _Paused

    def _observe(self, secrets: SecretRedactor) -> Observation:
        """Perceive (in a worker thread), then scrub any secret typed earlier in this task."""
        obs = self.perceiver.perceive(self.driver, self.settings.ocr)
        if secrets:
            scene, boxes = secrets.scene(obs.scene)
            if scene.tree_missing:
                # No tree says where a secret typed earlier shows: none of the image is kept.
                boxes = [Bounds(0, 0, _WHOLE_IMAGE, _WHOLE_IMAGE)]
            obs.scene = scene
            obs.screenshot_png = secrets.paint(obs.screenshot_png, boxes)
            obs.hierarchy_xml = secrets.text(obs.hierarchy_xml)
        return obs

    def _checked_screenshot(self) -> bytes:
        """A screenshot outside a look, refused (`ScreenshotError`) as a look refuses one."""
        png = self.driver.screenshot_png()
        self.perceiver.image_size(self.driver.serial, png)
        return png

    async def _perceive(self, cancel: asyncio.Event, secrets: SecretRedactor) -> Observation:
        return await self._guard(cancel, self._on_phone(self._observe, secrets))

    async def _save_png(self, spec: TaskSpec, name: str, png: bytes) -> str | None:
        if self.store is None:
            return None
        return await in_own_thread(
            self.store.save_screenshot, spec.task_id, spec.attempt, name, png
        )

    async def _progress(
        self,
        spec: TaskSpec,
        progress: ProgressHolder,
        step: int,
        status: types_pb2.StepStatus.ValueType,
        summary: str,
    ) -> None:
        """The step's progress, live at once (`progress`), then written to the timeline in a
        thread (`in_own_thread`), awaited: on the event loop, a write hung on the disk (or
        waiting for the timeline's lock behind one) stopped every lease's renewals with it."""
        snap = progress.update(step, status, summary, max_steps=self.settings.max_steps)
        if self.store is not None:
            await in_own_thread(
                self.store.update_progress,
                spec.task_id,
                spec.attempt,
                snap.step_index,
                status_name(status),
                snap.summary,
            )

    def _data_folders(self) -> list[Path]:
        """The folders a refused permission must name to be the host's disk: the timeline's
        and its screenshots', and those the host said (`LoopSettings.data_folders`)."""
        folders = list(self.settings.data_folders)
        if self.store is not None:
            folders += [self.store.db_path.parent, self.store.artifacts.root]
        return folders

    async def run(
        self,
        spec: TaskSpec,
        progress: ProgressHolder | None = None,
        cancel: asyncio.Event | None = None,
    ) -> TaskOutcome:
        """Run one attempt to its end. Never raises for phone or planner trouble: it reports it."""
        progress = progress or ProgressHolder()
        cancel = cancel or asyncio.Event()
        if self.store is not None:
            await in_own_thread(
                self.store.start_task,
                spec.task_id,
                spec.attempt,
                spec.goal,
                spec.device_serial,
                spec.lease_id,
                self.settings.planner_transport,
            )
        step = 0
        tel = StepTelemetry(spec.task_id, spec.attempt, self.settings.host_id)
        log.info("attempt started on phone %s", spec.device_serial)
        outcome: TaskOutcome | None = None
        try:
            outcome = await self._run_observed(spec, progress, cancel, tel)
        except _Cancelled:
            step = progress.snapshot().step_index
            outcome = TaskOutcome("cancelled", f"stopped: {stop_reason(cancel)}", step)
        except DeviceGone as exc:
            step = progress.snapshot().step_index
            log.warning("task %s: %s", spec.task_id, exc)
            # Retryable: a phone unplugged (a cable, a hub, a reboot) is nothing the task did;
            # the cloud queues its next attempt for a phone that is there, as for a lease that
            # ran out, instead of ending the task failed for good.
            # Unauthorized or offline in adb: the message says what the operator must do.
            summary = str(exc) if exc.state else f"phone {spec.device_serial} disconnected"
            outcome = TaskOutcome(
                "failed",
                truncate(summary, 2000),
                step,
                retryable=True,
                device_gone=True,
                adb_state=exc.state,
            )
        except (DeviceBusy, HierarchyError) as exc:
            step = progress.snapshot().step_index
            log.warning("task %s: %s", spec.task_id, exc)
            # Retryable too: a look that got no answer within its deadline (uiautomator or
            # adbd stuck on the phone) says nothing about the task, whose next attempt may
            # find the phone (or another) answering. The attempt still counts.
            summary = f"phone {spec.device_serial} did not answer a look at its screen: {exc}"
            outcome = TaskOutcome(
                "failed", truncate(summary, 2000), step, retryable=True, unreadable=str(exc)
            )
        except ScreenUnavailable as exc:
            step = progress.snapshot().step_index
            log.warning("task %s: %s", spec.task_id, exc)
            # Retryable: a display that stays dark, screenshots that are no image or a lock
            # screen that needs a credential are the phone's condition, not the task's;
            # another phone can run the next attempt.
            summary = f"phone {spec.device_serial} cannot show its screen: {exc}"
            outcome = TaskOutcome(
                "failed", truncate(summary, 2000), step, retryable=True, unreadable=str(exc)
            )
        except _ActionsUnanswered as exc:
            step = progress.snapshot().step_index
            log.warning("task %s: %s", spec.task_id, exc)
            summary = f"phone {spec.device_serial} did not answer its actions: {exc}"
            outcome = TaskOutcome(
                "failed",
                truncate(summary, 2000),
                step,
                retryable=True,
                unreadable=str(exc),
                unreadable_part="action",
            )
        except (PlanningPostponed, PausedPastDeadline) as exc:
            step = progress.snapshot().step_index
            log.warning("task %s: %s", spec.task_id, exc)
            outcome = TaskOutcome("failed", truncate(str(exc), 2000), step, retryable=True)
        except CloudPlanError as exc:
            step = progress.snapshot().step_index
            log.warning("task %s: %s", spec.task_id, exc)
            if exc.lease_lost:
                summary = truncate(f"stopped: the lease is no longer live ({exc})", 2000)
                outcome = TaskOutcome("cancelled", summary, step, lease_lost=True)
            else:
                summary = truncate(str(exc), 2000)
                outcome = TaskOutcome("failed", summary, step, retryable=exc.not_the_task)
        except PlannerError as exc:
            step = progress.snapshot().step_index
            log.warning("task %s: %s", spec.task_id, exc)
            outcome = TaskOutcome("failed", truncate(str(exc), 2000), step)
        except Exception as exc:
            step = progress.snapshot().step_index
            disk = storage_fault(exc, self._data_folders())
            if disk is not None:
                # The host's disk, not the task: retryable (`host.timeline.storage_faults`).
                log.error("task %s: this host cannot write its data folder: %s", spec.task_id, disk)
                summary = storage_summary(self.settings.host_id or "", disk)
                outcome = TaskOutcome(
                    "failed", truncate(summary, 2000), step, retryable=True, storage=disk
                )
            else:
                log.exception("task %s failed", spec.task_id)
                summary = truncate(f"{type(exc).__name__}: {exc}", 2000)
                outcome = TaskOutcome("failed", summary, step)
        finally:
            if outcome is not None:
                log.info("attempt ended %s after %d step(s): %s", outcome.status, outcome.steps,
                         outcome.summary)  # fmt: skip
            tel.close(outcome.status if outcome is not None else "cancelled")
            self._close_lane()
        if self.store is not None and self.settings.finishes_timeline:
            await in_own_thread(
                self.store.finish_task, spec.task_id, spec.attempt, outcome.status, outcome.summary
            )
        return outcome

    async def _run_observed(
        self, spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event, tel: StepTelemetry
    ) -> TaskOutcome:
        """`_run`, with the step that an exception ends marked as failed by it."""
        try:
            return await self._run(spec, progress, cancel, tel)
        except BaseException as exc:
            if isinstance(exc, DeviceError):
                host_metrics.device_error(exc)
            tel.fail(exc)
            raise

    async def _run(
        self, spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event, tel: StepTelemetry
    ) -> TaskOutcome:
        history: list[WorldEvent] = []
        secrets = SecretRedactor()
        for value in spec.secrets.values():  # scrubbed from every observation, typed or not
            secrets.add(value)
        replay = ReplayTally()
        unanswered = 0  # actions in a row the phone did not answer
        pause = lease_pause(cancel)
        for step in range(1, self.settings.max_steps + 1):
            tel.start_step(step)
            while True:  # the step, looked at afresh after a pause
                await self._hold_if_paused(spec, progress, cancel, step)
                made: _Planned | None = None
                try:
                    planned = made = await self._look_and_decide(
                        spec, progress, cancel, tel, step, secrets, history
                    )
                    await self._progress(
                        spec, progress, step, types_pb2.STEP_STATUS_ACTING, planned.line
                    )
                    # The renewer runs during every await: the lease may have paused during
                    # that write. `_act` checks again before each thing it does on the phone.
                    if pause.paused:
                        raise _Paused
                    t = time.perf_counter()
                    with tel.phase("act"):
                        result = await self._act(
                            planned.decision, spec, planned.before.scene, secrets, pause
                        )
                except _Paused as paused:
                    abandoned = made or paused.planned
                    if abandoned is not None and abandoned.ref is not None:
                        # Its decision is in the record: say it never ran, or it read as a
                        # step whose outcome was lost, beside the decision made afresh.
                        await self._ship(self._ship_not_run, abandoned, secrets)
                    continue
                break
            record, timings, before = planned.record, planned.timings, planned.before
            decision, ref, line = planned.decision, planned.ref, planned.line
            timings["act_s"] = time.perf_counter() - t
            record.action = action_to_record(decision.action)
            record.result = result.to_dict()
            record.success = result.ok
            record.error = result.error

            t = time.perf_counter()
            after: Scene | None = before.scene
            after_png: bytes | None = before.screenshot_png
            if changes_screen(decision.action):
                if self.settings.settle_delay_s:
                    await asyncio.sleep(self.settings.settle_delay_s)
                if pause.paused:
                    # A look wakes the screen and dismisses a keyguard (`ready_screen`): an
                    # action on the phone. The step stays unjudged; the next looks afresh.
                    after, after_png = None, None
                    record.result["after_error"] = PAUSED_NO_LOOK
                else:
                    with tel.phase("perceive"):
                        after, after_png = await self._capture_after(spec, step, record, secrets)
            else:
                record.after_screenshot_path = record.before_screenshot_path
            check = check_step(decision, result.ok, before.scene, after)
            looks = self.settings.late_outcome_looks if changes_screen(decision.action) else 0
            while looks and after is not None and check is not None and check.verdict == "not_met":
                if cancel.is_set() or pause.paused:
                    break  # the attempt stops or pauses: its phone is read no more
                # An app that loads shows what a step did a moment late: one look right after
                # the settle delay called it not met in the record, the next prompt and any
                # flow learned from the run. Look again before saying so.
                looks -= 1
                if self.settings.settle_delay_s:
                    await asyncio.sleep(self.settings.settle_delay_s)
                with tel.phase("perceive"):
                    again = await self._look_again(secrets)
                if again is None:
                    break  # the step stays as the look before saw it (its record and image)
                after, after_png = await self._keep_after(spec, step, record, again)
                check = check_step(decision, result.ok, before.scene, after)
            after_page = after.page if after is not None else None
            timings["perceive_after_s"] = time.perf_counter() - t
            if check is not None:
                record.verdict = {
                    "verdict": check.verdict,
                    "evidence": secrets.text(check.evidence),
                }
            replay.saw(decision)

            event = WorldEvent.from_decision(
                decision,
                page=before.scene.page,
                success=result.ok,
                target=target_label(decision.action, before.scene),
            )
            event.scene_summary = {"page_after": after_page}
            # Both reach the cloud with the next Decide call: no secret typed earlier may ride.
            event.error = secrets.text(result.error) if result.error else None
            event.driver_output = secrets.text(result.report())
            if check is not None:
                event.verdict, event.evidence = check.verdict, secrets.text(check.evidence)
            history.append(event)
            if ref is not None:
                await self._ship(self._ship_after, ref, decision, secrets, event, after_png)
            record.world_event = event.to_dict()
            if secrets:  # belt and braces: nothing typed as sensitive is ever stored
                record.user_prompt = secrets.text(record.user_prompt or "")
                record.rationale = secrets.text(record.rationale) if record.rationale else None
                record.error = secrets.text(record.error) if record.error else None
                record.result = json.loads(
                    secrets.text(json.dumps(record.result, ensure_ascii=False))
                )
            record.finished_at = _now()
            t = time.perf_counter()
            record.timings = {**record.timings, **timings}
            if self.store is not None:
                with tel.phase("record"):
                    await in_own_thread(self.store.append_step, record)
            timings["record_s"] = time.perf_counter() - t

            status = types_pb2.STEP_STATUS_SUCCEEDED if result.ok else types_pb2.STEP_STATUS_FAILED
            # The progress line: what the model chose and why, a secret typed masked ("•••"),
            # in the driver's error too (a phone's exception may quote what it was to type).
            if not result.ok:
                line = f"{line} (failed: {secrets.text(result.error or '')})"
            await self._progress(spec, progress, step, status, line)
            log.info("%s", line)
            tel.end_step(result.ok)
            if result.reached:  # a step that asked the phone nothing says nothing of it
                unanswered = unanswered + 1 if result.unanswered else 0
            if unanswered >= ACTIONS_UNANSWERED:
                raise _ActionsUnanswered(
                    f"{unanswered} actions in a row got no answer in time "
                    f"(last: {secrets.text(result.error or '')})"
                )
            if result.complete:
                outcome = self._completion(result, step)
                outcome.replay = replay.report()
                return outcome
            if cancel.is_set():
                raise _Cancelled
        return TaskOutcome(
            "failed",
            f"step limit reached ({self.settings.max_steps} steps)",
            self.settings.max_steps,
            replay=replay.report(),
        )

    async def _hold_if_paused(
        self, spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event, step: int
    ) -> None:
        """The pause gate, before each step and each look after a pause: while the lease ran out
        by this host's clock and the cloud has not confirmed it (`host.agent.lease_pause`), the
        attempt does nothing on its phone and asks no model; it says so in its progress. Ends
        as a stop (`_Cancelled`) when the lease is refused or the host stops meanwhile."""
        pause = lease_pause(cancel)
        if pause.paused and not cancel.is_set():
            log.warning("step %d paused: the lease ran out by this host's clock", step)
            await self._progress(
                spec,
                progress,
                step,
                types_pb2.STEP_STATUS_PERCEIVING,
                f"step {step}: {PAUSED_SUMMARY}",
            )
            if await pause.wait_live(cancel, spec.deadline) and not cancel.is_set():
                log.info("step %d continues: the cloud confirmed the lease", step)
        if cancel.is_set():
            raise _Cancelled

    async def _look_and_decide(
        self,
        spec: TaskSpec,
        progress: ProgressHolder,
        cancel: asyncio.Event,
        tel: StepTelemetry,
        step: int,
        secrets: SecretRedactor,
        history: Sequence[WorldEvent],
    ) -> _Planned:
        """A step up to its action: look at the screen, decide (waiting out planning that is
        impossible right now), ship the decision. Raises `_Paused` when the lease pauses before
        the action (the step looks afresh once the cloud confirms it) and before each model
        ask (none is paid while the lease is not confirmed)."""
        pause = lease_pause(cancel)
        record = TimelineRecord(spec.task_id, spec.attempt, step, started_at=_now())
        timings: dict[str, float] = {}

        await self._progress(
            spec,
            progress,
            step,
            types_pb2.STEP_STATUS_PERCEIVING,
            f"step {step}: looking at the screen",
        )
        t = time.perf_counter()
        with tel.phase("perceive"):
            before = await self._perceive(cancel, secrets)
        timings.update({f"before_{k}": v for k, v in before.timings.items()})
        record.before_screenshot_path = await self._save_png(
            spec, f"step{step:03d}-before.png", before.screenshot_png
        )
        timings["perceive_before_s"] = time.perf_counter() - t
        record.page = before.scene.page
        record.screen = screen_record(before.scene)
        record.ocr = [o.to_dict() for o in before.scene.ocr]

        await self._progress(
            spec,
            progress,
            step,
            types_pb2.STEP_STATUS_PLANNING,
            f"step {step}: planning on {before.scene.page or 'the screen'}",
        )
        t = time.perf_counter()
        shot = before.screenshot_png if self.settings.send_screenshot else None
        scene = before.scene

        async def ask() -> Decision:
            if pause.paused:  # asked again after a wait: no model call while paused
                raise _Paused
            return await self._decide(spec, scene, history, shot)

        async def waiting(since: datetime, why: Impossible, step: int = step) -> None:
            await self._progress(
                spec,
                progress,
                step,
                types_pb2.STEP_STATUS_PLANNING,
                f"step {step}: waiting for {why.waiting_for} since {since:%H:%M:%S} UTC "
                f"({why.reason})",
            )

        with tel.phase("plan"):
            decision = await self._guard(
                cancel,
                plan_patiently(
                    ask,
                    on_wait=waiting,
                    deadline=spec.deadline,
                    policy=self.settings.planner_wait,
                    cloud_back=self.cloud_back,
                ),
                pause,
            )
        timings["plan_s"] = time.perf_counter() - t
        if pause.paused:  # paused while the model answered: not shipped, not acted on
            raise _Paused
        tel.decided(decision)
        self._fill_decision(record, decision)
        act = decision.action
        # From now on a secret typed is scrubbed everywhere, the shipped decision included.
        # A lone reference is no secret (its value is scrubbed already): kept, it is what a
        # flow learned from this run types again.
        typed = act.input_text.text
        if (
            act.WhichOneof("kind") == "input_text"
            and act.input_text.sensitive
            and secret_refs.stored(typed) == secret_refs.MASK
        ):
            secrets.add(typed)
        ref = await self._ship(
            self._ship_decision, spec, decision, secrets, before.screenshot_png, before.scene
        )

        what = describe(decision.action, before.scene)
        line = f"step {step}: {what}" + (f" — {decision.purpose}" if decision.purpose else "")
        planned = _Planned(record, timings, before, decision, ref, line)
        if cancel.is_set():
            raise _Cancelled
        if pause.paused:  # nothing more on the phone: wait, then look again
            raise _Paused(planned)
        return planned

    async def _act(
        self,
        decision: Decision,
        spec: TaskSpec,
        scene: Scene,
        secrets: SecretRedactor,
        pause: LeasePause | None = None,
    ) -> ActionResult:
        """Execute the decision's action, with the task's secrets typed in place of their
        references; a step the host must not run (a replayed sensitive input whose value was not
        kept, a reference to a secret the task does not carry) is a failed step, not a crash.
        Raises `_Paused` when `pause` is paused before the screen is woken or the action
        starts (each an await apart: the renewer may pause the lease in between)."""
        pause = pause or LeasePause()
        if pause.paused:
            raise _Paused
        withheld = decision.extra.get("withheld")
        if withheld:
            return ActionResult(ok=False, error=str(withheld))
        action = decision.action
        if action.WhichOneof("kind") == "input_text":
            text = action.input_text.text
            if secret_refs.refers(text):
                try:
                    typed = secret_refs.substitute(text, spec.secrets)
                except secret_refs.MissingSecret as exc:
                    return ActionResult(ok=False, error=str(exc))
                action = types_pb2.Action()
                action.CopyFrom(decision.action)
                action.input_text.text = typed
            elif action.input_text.sensitive:
                secrets.add(text)
        if action.WhichOneof("kind") in _GESTURES:
            # The screen may have timed out (and a swipe lock come back) while the model
            # decided: a dark screen drops the gesture, and the step with its model call.
            # Its wake-up key unanswered is the gesture's own failure: the same `input`.
            try:
                await self._on_phone(self.perceiver.ready_screen, self.driver)
            except DeviceBusy as exc:
                host_metrics.device_error(exc)
                return ActionResult(ok=False, error=str(exc), unanswered=True, reached=True)
            if pause.paused:
                raise _Paused
        return await self._on_phone(execute, self.driver, action, scene)

    async def _capture_after(
        self, spec: TaskSpec, step: int, record: TimelineRecord, secrets: SecretRedactor
    ) -> tuple[Scene | None, bytes | None]:
        """The after scene and screenshot. A bad dump here does not end the task (the next
        step's perception retries and decides); a vanished phone does. The one more
        screenshot taken when the look failed is checked as every look's is: noise framed as
        a PNG would be the step's after image in the timeline and the cloud (which refuses
        it), so an unreadable one is recorded as missing, with why."""
        try:
            after = await self._on_phone(self._observe, secrets)
        except DeviceGone:
            raise
        except DeviceError as exc:
            host_metrics.device_error(exc)
            record.result["after_error"] = str(exc)
            if secrets:
                return None, None  # without a scene the secret cannot be painted over: no image
            try:
                png = await self._on_phone(self._checked_screenshot)
            except DeviceGone:
                raise
            except DeviceError as shot:
                host_metrics.device_error(shot)
                record.result["after_screenshot_error"] = str(shot)
                return None, None
            record.after_screenshot_path = await self._save_png(
                spec, f"step{step:03d}-after.png", png
            )
            return None, png
        if after.scene.tree_missing:
            # Judged against no tree, every expected outcome would read "not met".
            await self._keep_after(spec, step, record, after)
            record.result["after_error"] = after.scene.tree_missing
            return None, after.screenshot_png
        return await self._keep_after(spec, step, record, after)

    async def _look_again(self, secrets: SecretRedactor) -> Observation | None:
        """One more look at the screen after a step found not met, or None when it read no
        screen and tree (a vanished phone still ends the task). A failed look again says
        nothing of the step: recorded as its after, its error and the screenshot taken after
        the failure stood beside a verdict judged on the look before."""
        try:
            again = await self._on_phone(self._observe, secrets)
        except DeviceGone:
            raise
        except DeviceError as exc:
            host_metrics.device_error(exc)
            return None
        return None if again.scene.tree_missing else again

    async def _keep_after(
        self, spec: TaskSpec, step: int, record: TimelineRecord, after: Observation
    ) -> tuple[Scene, bytes]:
        """Record `after` as the step's after look (its screenshot and OCR)."""
        record.after_screenshot_path = await self._save_png(
            spec, f"step{step:03d}-after.png", after.screenshot_png
        )
        record.ocr_after = [o.to_dict() for o in after.scene.ocr]
        return after.scene, after.screenshot_png

    async def _ship(self, write: Callable[..., T], *args: object) -> T | None:
        """An outbox write in a worker thread: one local row, no network. Shipping never fails
        a step: a write that fails is logged (the timeline still has the step); one the disk
        refused also pauses the host, which the outbox reports itself (`on_disk_fault`)."""
        if self.shipments is None:
            return None
        try:
            return await in_own_thread(write, *args)
        except Exception:
            log.exception("could not write to the outbox")
            return None

    async def _decide(
        self,
        spec: TaskSpec,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]],
        screenshot: bytes | None,
    ) -> Decision:
        """The planner's decision; when it fails after the provider answered (direct
        transport), what the answered calls cost goes to the outbox first: the provider billed
        them, and the cloud counts them toward the task's budget and the fleet's spending. So
        does a decision cancelled mid-way (the attempt revoked, cancelled or out of time), and
        the call it left under way once the provider answers it (`InFlight`), or what a
        streamed call it cut off (or one not streamed the provider answered as failed) had
        reported (labelled by `cut_off_label`). So does a decision that failed with any other
        error after the provider answered (the session store could not keep the model's turn):
        its calls' cost is known, and was shipped as unknown. On the direct transport each
        model call is written down first (`host.outbox.calls`); one that ended without the host
        learning its cost (its answer lost after the request went out) is shipped as such once
        the decision is over."""
        ledger = None
        if self.shipments is not None:
            ledger = self.shipments.call_ledger(spec.task_id, spec.attempt, spec.lease_id)
        token = unsettled.ledger.set(ledger)
        decision: Decision | None = None
        try:
            decision = await self.planner.decide(spec.goal, scene, history, screenshot)
        except (Exception, asyncio.CancelledError) as err:
            error = type(err).__name__
            in_flight = take_in_flight(err)
            if in_flight is not None:
                count_when_answered(in_flight, lambda late: self._count_failed(spec, late, error))
            billed = take_billed(err)
            if billed is not None:
                await self._count_failed(spec, billed, error)
            label = cut_off_label(err)
            cut_off = take_cut_off(err)
            if cut_off is not None:
                await self._count_failed(spec, cut_off, label)
            raise
        finally:
            unsettled.ledger.reset(token)
            if ledger is not None and self.shipments is not None:
                # However the decision ended (an answer, a planner error, a cancel, a bug: a
                # KeyError, an OSError), a marker still open after what was counted settled
                # its calls' is a call the provider may have billed whose cost this host will
                # never learn: the planner settles at once a call that failed unsent or
                # answered with an error (`ObservedAdapter`). The decision's own calls are
                # settled by its write.
                reported = decision.usage.calls if decision is not None else []
                lost = [c for c in ledger.written if c not in reported]
                if lost:
                    shipped = await self._ship(self.shipments.release_calls, lost)
                    if shipped:
                        await self._keep_unsettled_calls(shipped)
        return decision

    async def _keep_unsettled_calls(self, calls: list[UnsettledCall]) -> None:
        """The timeline keeps the calls shipped as of unknown cost, for this host's console
        and export (the outbox forgets them once the cloud has them); one whose late answer the
        timeline already holds is left out (`TimelineStore.add_unsettled_calls`). Shielded as
        the failed calls' record is; a write that fails is logged."""
        if self.store is None:
            return
        write = in_own_thread(self.store.add_unsettled_calls, calls)
        try:
            await asyncio.shield(write)
        except Exception:
            log.exception("could not record the calls of unknown cost in the timeline")

    async def _count_failed(self, spec: TaskSpec, billed: Billed, error: str) -> None:
        """A failed decision's answered calls: kept in the timeline and sent from the outbox."""
        await self._keep_failed_calls(spec, billed, error)
        if self.shipments is not None:
            await self._ship(
                self.shipments.failed_calls,
                spec.task_id,
                spec.attempt,
                spec.lease_id,
                billed,
                error,
            )

    async def _keep_failed_calls(self, spec: TaskSpec, billed: Billed, error: str) -> None:
        """The timeline keeps what a failed decision's calls cost, for this host's export and
        console (the outbox forgets them once the cloud has them). Shielded: a cancelled
        decision's calls are recorded all the same; a write that fails is logged."""
        if self.store is None:
            return
        write = in_own_thread(
            self.store.add_failed_calls, spec.task_id, spec.attempt, billed, error
        )
        try:
            await asyncio.shield(write)
        except Exception:
            log.exception("could not record a failed decision's calls in the timeline")

    def _ship_decision(
        self,
        spec: TaskSpec,
        decision: Decision,
        secrets: SecretRedactor,
        png: bytes,
        scene: Scene,
    ) -> StepRef | None:
        assert self.shipments is not None
        ref = self.shipments.decision(
            spec.task_id, spec.attempt, spec.lease_id, decision, secrets.text
        )
        if ref is not None:
            self.shipments.screenshot(ref, "before", png, action_target(decision.action, scene))
        return ref

    def _ship_not_run(self, planned: _Planned, secrets: SecretRedactor) -> None:
        assert self.shipments is not None and planned.ref is not None
        outcome = types_pb2.ActionOutcome(executed=False, error=PAUSED_NOT_RUN)
        self.shipments.outcome(planned.ref, planned.decision, secrets.text, outcome)

    def _ship_after(
        self,
        ref: StepRef,
        decision: Decision,
        secrets: SecretRedactor,
        event: WorldEvent,
        png: bytes | None,
    ) -> None:
        assert self.shipments is not None
        outcome = types_pb2.ActionOutcome(
            executed=bool(event.success),
            error=clip(event.error or "", MAX_OUTCOME_ERROR_BYTES),
            driver_output=clip(event.driver_output or "", MAX_DRIVER_OUTPUT_BYTES),
            verdict=verdict_to_proto(event.verdict),
            evidence=clip(event.evidence or "", MAX_EVIDENCE_BYTES),
        )
        self.shipments.outcome(ref, decision, secrets.text, outcome)
        if png is not None:
            self.shipments.screenshot(ref, "after", png)

    @staticmethod
    def _completion(result: ActionResult, step: int) -> TaskOutcome:
        reason = result.complete_reason or (
            "goal reached" if result.complete_success else "gave up"
        )
        return TaskOutcome("succeeded" if result.complete_success else "failed", reason, step)

    @staticmethod
    def _fill_decision(record: TimelineRecord, decision: Decision) -> None:
        record.system_prompt = decision.system_prompt
        record.user_prompt = decision.user_prompt
        record.planner_mode = decision.planner_mode
        record.rationale = decision.rationale
        record.thinking = [{"text": b.text, "redacted": b.redacted} for b in decision.thinking]
        record.tool_name = decision.tool_name
        record.arguments = decision.masked_arguments()
        record.purpose = decision.purpose or None
        record.expected_outcome = decision.expected_outcome or None
        record.provider = decision.provider
        record.model = decision.model
        record.forced_retry = decision.forced_retry
        record.corrective_retries = decision.corrective_retries
        record.thinking_kind = decision.thinking_kind
        record.retry_kind = decision.retry_kind
        record.output_truncated = decision.output_truncated
        record.decision_step_index = decision.step_index
        if decision.previous_step is not None:
            record.previous_step = {
                "verdict": decision.previous_step.verdict,
                "note": decision.previous_step.note,
            }
        if decision.resumed_from is not None:
            record.resumed_from = decision.resumed_from.as_dict()
        if decision.flow_id:
            record.flow = {
                "flow_id": decision.flow_id,
                "flow_step": decision.flow_step,
                "divergence": decision.replay_divergence,
                "set_aside": decision.flow_set_aside,
            }
        u = decision.usage
        record.usage = {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cache_read_input_tokens": u.cache_read_input_tokens,
            "cache_creation_input_tokens": u.cache_creation_input_tokens,
            "thinking_tokens": u.thinking_tokens,
            "cost_usd": u.cost_usd,
        }
        record.timings["planner_latency_s"] = decision.latency_s


def action_target(action: types_pb2.Action, scene: Scene) -> Bounds | None:
    """Bounds of the element an action names on this screen (where a tap lands, the field
    text goes into), for drawing the action on the screenshot; None when it names none."""
    kind = action.WhichOneof("kind")
    element_id = ""
    if kind == "tap" and action.tap.WhichOneof("target") == "element_id":
        element_id = action.tap.element_id
    elif kind == "input_text":
        element_id = action.input_text.element_id
    element = scene.element(element_id) if element_id else None
    return element.bounds if element is not None else None


__all__ = [
    "AgentLoop",
    "DeviceError",
    "LoopSettings",
    "TaskOutcome",
    "TaskSpec",
]
