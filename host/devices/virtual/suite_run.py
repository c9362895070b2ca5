"""Run suite tasks with a planner on the in-process virtual phone and judge each one.

The loop is the host's in miniature: perceive with the host's `Perceiver` (through the
`VirtualDriver`, so the scene is what the host would see), ask the planner, execute with the
host's `execute`, check the expected outcome on the screen after it (the host's checker),
record a `WorldEvent`. No lease, store or timeline: this is for measuring a
planner (tests and `scripts/suite_report.py`), not for running tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from host.agent.actions import changes_screen, execute
from host.agent.verdicts import check_step
from host.devices.base import DeviceError
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.suite import SuiteTask, Verdict, snapshot
from host.perception.ocr import OcrPool
from host.perception.perceive import Perceiver
from host.planner_client import DirectPlanner
from planner.decision import Decision
from planner.history import WorldEvent
from planner.planner import Planner
from planner.scene import Scene


@dataclass
class TaskRun:
    task: SuiteTask
    verdict: Verdict
    #: What the planner said at the end (None: it never called `complete`).
    claimed: bool | None
    reason: str
    steps: int
    trace: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """The agent finished the task: it said so, the goal is met, nothing else changed."""
        return self.claimed is True and self.verdict.passed


def _target(decision: Decision, scene: Scene) -> str | None:
    act = decision.action
    element_id = ""
    if act.WhichOneof("kind") == "tap" and act.tap.WhichOneof("target") == "element_id":
        element_id = act.tap.element_id
    elif act.WhichOneof("kind") == "input_text":
        element_id = act.input_text.element_id
    el = scene.element(element_id) if element_id else None
    return (el.text or el.content_desc or None) if el else None


async def run_task(
    task: SuiteTask,
    planner: Planner,
    *,
    max_steps: int = 30,
    ocr: OcrPool | None = None,
    serial: str = "suite",
) -> TaskRun:
    """One task from its setup to the planner's `complete` (or `max_steps`), then its verdict."""
    phone = task.new_phone(serial)
    before = snapshot(phone)
    driver = VirtualDriver(phone)
    perceiver = Perceiver(ocr=ocr, retry_delay_s=0.0)
    # Through the typed contract, as on either transport: what perception knows must survive
    # the ScreenObservation for the planner to decide alike in the cloud and on a host.
    typed = DirectPlanner(planner)
    history: list[WorldEvent] = []
    trace: list[str] = []
    claimed: bool | None = None
    reason = f"no decision after {max_steps} steps"
    steps = 0
    for steps in range(1, max_steps + 1):
        try:
            scene = perceiver.perceive(driver, with_ocr=ocr is not None).scene
        except DeviceError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            break
        decision = await typed.decide(task.goal, scene, history)
        result = execute(driver, decision.action, scene)
        event = WorldEvent.from_decision(
            decision, page=scene.page, success=result.ok, target=_target(decision, scene)
        )
        if result.ok and changes_screen(decision.action):
            try:
                after = perceiver.perceive(driver, with_ocr=ocr is not None).scene
            except DeviceError:
                after = None
            check = check_step(decision, result.ok, scene, after)
            if check is not None:
                event.verdict, event.evidence = check.verdict, check.evidence
        history.append(event)
        trace.append(f"{steps:2d} [{scene.page}] {history[-1].action} — {decision.rationale}")
        if decision.tool_name == "complete":
            claimed = bool(decision.arguments.get("success"))
            reason = str(decision.arguments.get("reason", ""))
            break
    return TaskRun(task, task.verdict(phone, before), claimed, reason, steps, trace)
