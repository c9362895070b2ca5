"""Session mode behind the host's `StepPlanner` interface (`decide(goal, scene, history, …)`).

The agent loop stays as it is: it passes the goal, the current scene and its compact history of
finished steps. The adapter turns the newest finished step into the tool result of the pending
call (or, for `get_ui_tree`, the node list), and the scene into the next observation. The goal
opens the conversation and is repeated in the condensed form of that first observation, so a
context checkpoint never loses it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from planner.decision import Decision
from planner.history import WorldEvent
from planner.scene import Scene
from planner.session.items import ToolCall, UserObservation
from planner.session.planner import SessionPlanner
from planner.tools import ui_tree_result


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def observation_text(goal: str | None, scene: Scene) -> str:
    """One observation: the goal (first step only) and the scene in the prompt's JSON form."""
    head = f"Goal:\n```json goal\n{_dump(goal)}\n```\n\n" if goal is not None else ""
    return (
        f"{head}Current screen:\n```json scene\n{_dump(scene.to_prompt())}\n```\n\n"
        "Judge the previous step in one or two sentences, state this step's intent, then call "
        "exactly one tool."
    )


def condensed_text(goal: str | None, scene: Scene) -> str:
    """What an observation shrinks to after a checkpoint (the goal is never dropped)."""
    head = f"Goal: {goal}\n" if goal is not None else ""
    return f"{head}(earlier screen: {scene.page or 'unknown'}, {len(scene.elements)} elements)"


def step_outcome(event: WorldEvent | dict[str, Any]) -> tuple[str, bool]:
    """The tool result text for a finished step, and whether it failed."""
    if isinstance(event, WorldEvent):
        success, summary = event.success, event.scene_summary or {}
    else:
        success, summary = event.get("success"), event.get("scene_summary") or {}
    outcome: dict[str, Any] = {"ok": success}
    if isinstance(summary, dict) and summary.get("page_after"):
        outcome["page_after"] = summary["page_after"]
    return _dump(outcome), success is False


class SessionStepPlanner:
    """`StepPlanner` over one task attempt's `SessionPlanner`."""

    def __init__(self, session: SessionPlanner) -> None:
        self.session = session

    async def aclose(self) -> None:
        await self.session.aclose()

    def _pending_call(self) -> ToolCall | None:
        call_id = self.session.pending_call_id
        for item in reversed(self.session.history):
            if isinstance(item, ToolCall) and item.call_id == call_id:
                return item
        return None

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        """The next action. `screenshot` is not used: a session stores its conversation, and
        images there would be stored too (the Decide contract never stores screenshots)."""
        pending = self._pending_call()
        if pending is not None and history:
            if pending.name == "get_ui_tree":
                await self.session.record_tool_result(_dump(ui_tree_result(scene)))
            else:
                output, failed = step_outcome(history[-1])
                await self.session.record_tool_result(output, is_error=failed)
        first = not any(isinstance(i, UserObservation) for i in self.session.history)
        shown_goal = goal if first else None
        return await self.session.decide(
            observation_text(shown_goal, scene),
            condensed=condensed_text(shown_goal, scene),
            element_ids=[e.element_id for e in scene.elements],
            screen_size=(scene.screen_width, scene.screen_height),
        )
