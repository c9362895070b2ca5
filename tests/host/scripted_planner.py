"""A scripted planner for agent-loop tests: each step names a tool and how to pick its target.

It builds the same prompts as the real planner (`planner.prompts`) and validates each call with
the real tool parser, so the loop records real prompts and executes real typed actions; only
the model's choice is scripted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.decision import Decision, ThinkingBlock, Usage
from planner.history import WorldEvent
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.scene import Scene
from planner.tools import parse_tool_call

Args = dict[str, Any] | Callable[[Scene], dict[str, Any]]


def by_text(text: str, **extra: Any) -> Callable[[Scene], dict[str, Any]]:
    """Tap the element whose text or description is `text`."""

    def pick(scene: Scene) -> dict[str, Any]:
        for e in scene.elements:
            if e.text == text or e.content_desc == text:
                return {"element_id": e.element_id, **extra}
        raise AssertionError(f"{text!r} not on screen: {[e.text for e in scene.elements]}")

    return pick


@dataclass
class Step:
    tool: str
    args: Args = field(default_factory=dict)
    purpose: str = "move on"
    expected: str = "the next page shows"
    before: Callable[[], None] | None = None


@dataclass
class ScriptedPlanner:
    steps: list[Step]
    seen: list[Scene] = field(default_factory=list)
    histories: list[list[WorldEvent | dict[str, Any]]] = field(default_factory=list)
    block: asyncio.Event | None = None
    #: Set when a decide call has begun (before `block`): a test can act while planning runs.
    planning: asyncio.Event = field(default_factory=asyncio.Event)

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        self.planning.set()
        if self.block is not None:
            await self.block.wait()
        index = len(self.seen)
        self.seen.append(scene)
        self.histories.append(list(history))
        step = self.steps[min(index, len(self.steps) - 1)]
        if step.before is not None:
            step.before()
        args = step.args(scene) if callable(step.args) else dict(step.args)
        if step.tool not in ("complete", "get_ui_tree"):
            args.update(purpose=step.purpose, expected_outcome=step.expected)
        parsed = parse_tool_call(step.tool, args)
        return Decision(
            tool_name=parsed.tool_name,
            arguments=parsed.arguments,
            action=parsed.action,
            purpose=parsed.purpose,
            expected_outcome=parsed.expected_outcome,
            rationale=f"Step {index + 1}: {step.purpose}.",
            thinking=[ThinkingBlock("considering the screen")],
            thinking_kind="summarized",
            usage=Usage(input_tokens=100, output_tokens=20),
            provider="scripted",
            model="scripted-1",
            latency_s=0.0,
            forced_retry=False,
            system_prompt=SYSTEM_PROMPT,
            user_prompt=build_user_prompt(goal, scene, history),
        )
