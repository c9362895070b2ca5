"""Run a goal on the in-process virtual phone with a planner: perceive, decide, execute, record.

A small loop of its own (not the host's runner) so the planner's tests need no lease, store or
timeline, but it perceives and executes with the host's own code (`Perceiver`, `execute`), so
the scenes the planner sees are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from host.agent.actions import execute
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.perceive import Perceiver
from host.planner_client import DirectPlanner
from planner.decision import Decision
from planner.history import WorldEvent
from planner.planner import Planner
from planner.scene import Scene


@dataclass(slots=True)
class Run:
    claimed: bool | None = None
    reason: str = ""
    decisions: list[Decision] = field(default_factory=list)
    history: list[WorldEvent] = field(default_factory=list)
    scenes: list[Scene] = field(default_factory=list)

    def trace(self) -> str:
        return "\n".join(
            f"{i + 1:2d} [{e.page}] {e.action} — {d.rationale}"
            for i, (e, d) in enumerate(zip(self.history, self.decisions, strict=False))
        )


def _target(decision: Decision, scene: Scene) -> str | None:
    act = decision.action
    element_id = ""
    if act.WhichOneof("kind") == "tap" and act.tap.WhichOneof("target") == "element_id":
        element_id = act.tap.element_id
    elif act.WhichOneof("kind") == "input_text":
        element_id = act.input_text.element_id
    el = scene.element(element_id) if element_id else None
    return (el.text or el.content_desc or None) if el else None


async def run_goal(planner: Planner, phone: VirtualPhone, goal: str, max_steps: int = 30) -> Run:
    driver = VirtualDriver(phone)
    perceiver = Perceiver(ocr=None, retry_delay_s=0.0)
    run = Run()
    typed = DirectPlanner(planner)  # the typed contract's path, as on either transport
    for _ in range(max_steps):
        scene = perceiver.perceive(driver, with_ocr=False).scene
        run.scenes.append(scene)
        decision = await typed.decide(goal, scene, run.history)
        run.decisions.append(decision)
        result = execute(driver, decision.action, scene)
        run.history.append(
            WorldEvent.from_decision(
                decision, page=scene.page, success=result.ok, target=_target(decision, scene)
            )
        )
        if decision.tool_name == "complete":
            run.claimed = bool(decision.arguments["success"])
            run.reason = str(decision.arguments["reason"])
            break
    return run
