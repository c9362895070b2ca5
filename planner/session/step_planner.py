"""One step of session mode: the previous call's tool result, then the next observation.

The newest finished step becomes the tool result of the pending call (or, for `get_ui_tree`,
the node list), and the scene the next observation. The goal opens the conversation and is
repeated in the condensed form of that first observation, so a context checkpoint never loses
it.

Both transports go through `continue_session`: on the direct transport the host calls it with
its local conversation; on the cloud transport the host sends the same pieces (goal, scene
JSON, previous outcome) in a `SessionStep` and the cloud calls it with the conversation it keeps,
so the two build byte-identical requests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.conversation.items import ToolCall, UserObservation, unanswered_calls
from planner.decision import Decision
from planner.errors import SessionStateError
from planner.history import WorldEvent, verdict_line
from planner.scene import Scene
from planner.tools import VERDICTS

if TYPE_CHECKING:  # the SDKs behind SessionPlanner are not needed by hosts that only send steps
    from planner.session.planner import SessionPlanner


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def scene_json(scene: Scene) -> str:
    """The scene in the prompt's JSON form, as an observation embeds it."""
    return _dump(scene.to_prompt())


def observation_text(goal: str | None, scene: Scene | str, note: str | None = None) -> str:
    """One observation: the goal (first step only), the scene (a Scene or its JSON) and a
    `note` (a replay handing over)."""
    body = scene if isinstance(scene, str) else scene_json(scene)
    head = f"Goal:\n```json goal\n{_dump(goal)}\n```\n\n" if goal is not None else ""
    return (
        f"{head}Current screen:\n```json scene\n{body}\n```\n\n"
        + (f"{note}\n\n" if note else "")
        + "Judge the previous step in one or two sentences, state this step's intent, then call "
        "exactly one tool."
    )


def condensed_text(
    goal: str | None, scene: Scene | None = None, *, page: str = "", elements: int = 0
) -> str:
    """What an observation shrinks to after a checkpoint (the goal is never dropped)."""
    if scene is not None:
        page, elements = scene.page or "", len(scene.elements)
    head = f"Goal: {goal}\n" if goal is not None else ""
    return f"{head}(earlier screen: {page or 'unknown'}, {elements} elements)"


def step_outcome(event: WorldEvent | dict[str, Any]) -> tuple[str, bool]:
    """The tool result text for a finished step, and whether it failed.

    The keys are those the cloud transport sends (`planner.steps.tool_result_text`): whether it
    ran, the page it led to, its error and the checker's verdict ("expected 'X' — not met: the
    screen shows Y"), so a session reads the same whichever transport its host plans over.
    """
    if not isinstance(event, WorldEvent):
        event = WorldEvent.from_dict(event)
    outcome: dict[str, Any] = {"ok": event.success}
    summary = event.scene_summary or {}
    if isinstance(summary, dict) and summary.get("page_after"):
        outcome["page_after"] = summary["page_after"]
    if event.error:
        outcome["error"] = event.error
    if event.verdict in VERDICTS:
        outcome["verdict"] = verdict_line(
            event.expected_outcome or "", event.verdict, event.evidence
        )
    elif event.verdict:  # a compact record: the line itself
        outcome["verdict"] = event.verdict
    return _dump(outcome), event.success is False


@dataclass(frozen=True, slots=True)
class Outcome:
    """What executing the previous decision's tool call did: its tool result."""

    call_id: str
    output: str
    is_error: bool = False


async def continue_session(
    session: SessionPlanner,
    *,
    goal: str,
    scene: Scene | str,
    page: str,
    element_ids: Sequence[str],
    screen_size: tuple[int, int] | None,
    outcome: Outcome | None,
    note: str | None = None,
    not_carried_out: Sequence[str] = (),
) -> Decision:
    """Record the previous call's outcome, then decide on the next observation (with `note`,
    a replay handing over, in it). Calls in `not_carried_out` (their decisions never reached
    the host) are answered as such.

    An outcome for a call that already has its result is ignored (a retried request); one for a
    call the conversation never made raises `SessionStateError`.
    """
    if outcome is not None:
        made = {i.call_id for i in session.history if isinstance(i, ToolCall)}
        if outcome.call_id not in made:
            raise SessionStateError(
                f"previous outcome names call {outcome.call_id!r}, which this conversation "
                "did not make"
            )
        if outcome.call_id in unanswered_calls(session.history):
            await session.record_tool_result(
                outcome.output, is_error=outcome.is_error, call_id=outcome.call_id
            )
    # The goal goes with the first observation, also when that step is asked again with no
    # call made yet (its answer called no tool, then the decision failed) or with its kept
    # answer to go on from (the decision failed on a write after it): told apart from a later
    # step, the same observation would be added twice.
    with_goal = observation_text(goal, scene, note)
    first = not any(isinstance(i, ToolCall) for i in session.history) and all(
        i.text == with_goal
        for i in session.history
        if isinstance(i, UserObservation) and i.kind == "observation"
    )
    first = first or session.resumes(with_goal, element_ids, screen_size)
    shown_goal = goal if first else None
    return await session.decide(
        with_goal if first else observation_text(None, scene, note),
        condensed=condensed_text(shown_goal, page=page, elements=len(element_ids)),
        element_ids=list(element_ids),
        screen_size=screen_size,
        not_carried_out=not_carried_out,
    )


def call_id_of(decision: Decision) -> str:
    """The conversation's id for a session decision's tool call ("" for compact decisions)."""
    return str(decision.extra.get("call_id", "")) if decision.extra else ""
