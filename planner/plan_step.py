"""`plan_step`: the one typed planning entry point, for the cloud's Decide and the direct transport.

Its inputs are what the contract carries — the goal, the attempt's earlier steps, the typed
screen observation and the typed outcome of the previous decision — and the engine of the
planning mode: a compact `Planner` (a fresh prompt with a compact history each step) or a
`SessionPlanner` (one kept conversation). The scene the model sees is built from the observation
by `planner.observation.scene_from_observation` and nothing else, so the cloud and a host that
plans in-process build byte-identical prompts from the same observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from amc.v1 import types_pb2
from planner.conversation.items import SessionItem, ToolCall, ToolResult, unanswered_calls
from planner.decision import Decision
from planner.flows.replay import replay
from planner.observation import scene_from_observation
from planner.planner import Planner
from planner.scene import Scene
from planner.session.step_planner import Outcome, continue_session
from planner.steps import (
    PastStep,
    checked,
    history_events,
    target_label,
    tool_result_text,
    with_outcome,
)
from planner.targets import describe

if TYPE_CHECKING:  # hosts that only send observations never load the provider SDKs
    from planner.session.planner import SessionPlanner


async def plan_step(
    engine: Planner | SessionPlanner,
    *,
    goal: str,
    history: Sequence[PastStep],
    observation: types_pb2.ScreenObservation,
    previous_outcome: types_pb2.ActionOutcome | None,
    screenshot: bytes | None = None,
    flows: Sequence[types_pb2.Flow] = (),
    logged: bool = False,
) -> Decision:
    """The next decision. `history` is the attempt's earlier steps as recorded before this call;
    `previous_outcome` is applied to the step it names here (first report wins), so callers pass
    what they have and get the same prompt either way; when it carries no verdict, the checker
    reads its expected outcome on this observation (`planner.steps.checked`). The decision comes
    back with the page it was made on, the label of the element it names, that element's
    semantic target and the observation itself (`Decision.page` / `.target` /
    `.target_descriptor` / `.observation`).

    `flows` are the learned flows retrieved for the attempt, best first: while the screen
    agrees with one, its next step is the decision and no model is called (mode "replay");
    when it stops agreeing, the model decides, told which step diverged and why.

    `logged`: `history` is every decision delivered in the attempt (the cloud's decision log),
    not what one process remembers (a direct-transport host after a restart starts with none
    while its stored conversation goes on), so a session call no step carried was never
    delivered, even before the first step is logged."""
    scene = scene_from_observation(observation)
    previous_outcome, _ = checked(previous_outcome, history, scene)
    steps = with_outcome(history, previous_outcome)
    move = replay(flows, steps, scene)
    if move is not None and move.decision is not None:
        move.decision.target = target_label(move.decision.action, scene)
        move.decision.observation = observation
        return move.decision
    handover = move.handover if move is not None else None
    note = handover.note() if handover is not None else None
    if isinstance(engine, Planner):
        decision = await engine.decide(
            goal, scene, history_events(steps, scene.page), screenshot, note=note
        )
    else:
        decision = await _session_step(engine, goal, scene, steps, previous_outcome, note, logged)
    on_screen(decision, scene, observation)
    if handover is not None:
        decision.flow_id, decision.flow_step = handover.flow_id, handover.step
        if handover.counted:
            decision.replay_divergence = handover.reason
        else:  # no divergence: said for the record and the consoles, counted nowhere
            decision.flow_set_aside = handover.reason
    return decision


def on_screen(
    decision: Decision, scene: Scene, observation: types_pb2.ScreenObservation
) -> Decision:
    """Stamp `decision` with where it was made: the page, the label and semantic target of the
    element it names, the observation. The cloud derives these itself for a decision a host
    on the direct transport ships (from the observation it ships with), so a flow learned
    from either transport knows the page of every step and a replay can check it."""
    decision.page = scene.page
    decision.target = target_label(decision.action, scene)
    decision.target_descriptor = describe(scene, decision.action)
    decision.observation = observation
    return decision


async def _session_step(
    session: SessionPlanner,
    goal: str,
    scene: Scene,
    steps: Sequence[PastStep],
    previous: types_pb2.ActionOutcome | None,
    note: str | None = None,
    logged: bool = False,
) -> Decision:
    """Continue the conversation: a reported outcome becomes the tool result of the call of the
    decision it names (its id is in the record), once. A call the model made after the last
    recorded one never reached the host: its decision was lost after the model's turn was kept
    (the replica died, the call was cancelled), and the retry answered it with the outcome of
    the call before, so the model heard that what it never did was done. It is now answered
    as not carried out. A session step logged without its call id (before migration 0018)
    answers the newest open call, as every step did; a replayed step made no call, so its
    outcome answers none."""
    outcome: Outcome | None = None
    pending = unanswered_calls(session.history)
    named = next((s for s in steps if previous and s.step_index == previous.step_index), None)
    if named is not None and named.outcome is not None:
        call_id = named.call_id
        if not call_id and named.mode == "session" and named is steps[-1] and pending:
            call_id = pending[-1]
        tool = next(
            (i.name for i in session.history if isinstance(i, ToolCall) and i.call_id == call_id),
            named.tool_name,
        )
        result = tool_result_text(tool, named.outcome, scene, named.verdict_line())
        if call_id in pending:
            outcome = Outcome(call_id, result, is_error=not named.outcome.executed)
        elif call_id and _told_not_carried_out(session.history, call_id):
            note = "\n\n".join(filter(None, [_carried_out_after_all(call_id, tool, result), note]))
    return await continue_session(
        session,
        goal=goal,
        scene=scene,
        page=scene.page,
        element_ids=[e.element_id for e in scene.elements],
        screen_size=(scene.screen_width, scene.screen_height),
        outcome=outcome,
        note=note,
        not_carried_out=_never_delivered(session.history, steps, logged),
    )


def _told_not_carried_out(history: Sequence[SessionItem], call_id: str) -> bool:
    """Whether the conversation answered `call_id` as not carried out. Two replicas planned one
    step at once: the second found the first's call with no decision logged and said so, then
    the first's decision was logged first and delivered (the second answered with it)."""
    from planner.session.planner import NOT_CARRIED_OUT  # loaded with the session planner

    return any(
        isinstance(i, ToolResult) and i.call_id == call_id and i.output == NOT_CARRIED_OUT
        for i in history
    )


def _carried_out_after_all(call_id: str, tool: str, result: str) -> str:
    """What the model is told of a call it heard was not carried out, once the record says it
    was: the record and the conversation agree from this step on."""
    return (
        f"Correction: your earlier call {call_id} ({tool}) was carried out after all (its "
        "decision reached the phone after you were told it had not). What it did: " + result
    )


def _never_delivered(
    history: Sequence[SessionItem], steps: Sequence[PastStep], logged: bool
) -> list[str]:
    """The calls made after the call of the latest session step: no decision carried them.
    Before the first session step, every call when `steps` is the whole log (`logged`: a first
    decision lost after its model turn was kept). None are known when the record holds no such
    call: a host that restarted (its steps start empty), a latest step logged without its id
    (by a replica from before 0018)."""
    made = [s.call_id for s in steps if s.mode == "session"]
    calls = [i.call_id for i in history if isinstance(i, ToolCall)]
    if not made:
        return calls if logged else []
    if made[-1] not in calls:
        return []
    return calls[calls.index(made[-1]) + 1 :]
