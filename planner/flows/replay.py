"""Replay a learned flow inside `plan_step`: no model call while the screen agrees with it.

Stateless by design: where the replay stands is read from the attempt's earlier steps (a
replayed step is a decision of mode "replay" with its flow id and step), so the cloud (history
from its decision log) and a host on the direct transport (history in memory) replay alike,
and a retried call replays the same step.

Each call:
1. The first call picks the flow: the first candidate (best score first) whose first step fits
   the screen (its page is open, its target is there, a switch it flips is not already where
   the flow leaves it). None fits: hand over at step 1. A flow missing a step's page is no
   candidate: that step could not be checked.
2. Later calls check the step just replayed: it ran, the checker did not find its expected
   outcome unmet (where the original run found it met; the host's verdict, or the checker's
   reading of this screen when the host reported no outcome), and the page is the one the
   original run reached. Otherwise another candidate that took the same steps so far and
   fits from here goes on (the same goal learned with and without an interruption); if none
   does, hand over at that step.
3. Then the next step: its page must be open and its target resolvable (and a switch not
   already in its end state); its action is rebuilt on this screen (the element the target
   resolves to; a swipe moved relative to its list's bounds; typed text from the goal's
   parameters). Otherwise: hand over at that step.
4. After the last step: `complete` with success, saying which flow was replayed, unless the
   reason the original run's `complete` gave names a state this screen does not show (the run
   found it already set: its flow has no step that sets it): then hand over there. A flow
   whose steps set nothing and whose claim says the state was found already so hands over
   there too when its claim cannot be checked on this screen (no switch of that name): its
   success rests on that claim alone.

A handover is the model's turn: its prompt says which flow was being replayed, which step
diverged and what the screen showed (`Handover.note`). Once the model has decided, the
replay is over for the attempt.

An attempt that begins where a later step of a candidate acts (the phone is part-way through
the flow: an earlier attempt's host restarted mid-replay) hands over too, but as no divergence
(`midway`): nothing is counted against the flow. So does a step whose switch is already where
the flow leaves it (`Handover.settled`): the phone's state, not a changed app. And so does
any handover on a screen a system dialog covers, or in another language than the flow's
labels, or at step 1 on a page the flow does not start from (`Handover.phone_state`,
`language`): the phone's moment, setting or place, not a changed app.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amc.v1 import types_pb2
from planner import labels
from planner.decision import Decision, Usage
from planner.flows import language, params
from planner.flows.synthesis import sets_something
from planner.scene import Scene
from planner.steps import PastStep
from planner.targets import describe, resolve, semantics
from planner.tools import KEYS
from planner.verify import (
    BLOCKING,
    claims_a_checkable_state,
    found_already_set,
    state_claim,
    verify,
)

MODE = "replay"
PROVIDER = "replay"
SHOWN_LABELS = 8
_KEY_NAMES = {v: k for k, v in KEYS.items()}


@dataclass(frozen=True, slots=True)
class Handover:
    """Where a replay stopped and why, for the model's prompt and the flow's counts."""

    flow_id: str
    goal_template: str
    step: int
    total: int
    reason: str
    screen: str
    #: False when the flow is set aside through no fault of its own: the attempt began on a
    #: screen where a later step of it acts (`midway`) or on another screen than its first
    #: step's, the switch a step flips is already where the flow leaves it (`settled`), or a
    #: system dialog or another language is in the way (`phone_state`). Such a handover is
    #: no divergence: the decision carries none (it names the flow with why it was set
    #: aside, `Decision.flow_set_aside`, for its record and the consoles), and nothing is
    #: counted against the flow.
    counted: bool = True
    #: The switch the step flips is already where the flow leaves it (the phone's state, not
    #: a changed app: counted, three phones already set retired a sound flow).
    settled: bool = False
    #: The screen is one of this phone's moments or settings, not the app's: a system dialog
    #: covers the app, or the screen is in another language than the flow's labels
    #: (`language`). Counted, three such phones retired the flow for every phone.
    phone_state: bool = False

    @property
    def line(self) -> str:
        """One line: "flow f1 step 2 of 5: <reason>"."""
        return f"flow {self.flow_id} {self._which.lower()} of {self.total}: {self.reason}"

    @property
    def _done(self) -> str:
        if self.step > 1:
            return (
                f"steps 1 to {self.step - 1} were replayed without you (they are in the steps "
                "so far)"
            )
        return "no step was replayed"

    @property
    def _which(self) -> str:
        """ "Step 2", or the closing `complete` one past the last step (its claim not met)."""
        if self.step > self.total:
            return f"Step {self.step} (its closing complete)"
        return f"Step {self.step}"

    def note(self) -> str:
        """What the model's prompt says about the replay it takes over."""
        if self.settled or self.phone_state:
            return (
                f"A learned flow was being replayed for this goal: flow {self.flow_id} "
                f"({self.goal_template!r}, {self.total} steps); {self._done}. Step {self.step} "
                f"was not replayed: {self.reason}. The screen shows {self.screen}. The flow is "
                "set aside: decide the next step yourself."
            )
        if not self.counted:
            return (
                f"A learned flow was handed for this goal: flow {self.flow_id} "
                f"({self.goal_template!r}, {self.total} steps). The phone is part-way through "
                f"it already ({self.reason}), so it was not replayed from its start: earlier "
                "steps may or may not have been done. The screen shows "
                f"{self.screen}. Decide the next step yourself."
            )
        return (
            f"A learned flow was being replayed for this goal: flow {self.flow_id} "
            f"({self.goal_template!r}, {self.total} steps); {self._done}. {self._which} diverged: "
            f"{self.reason}. The screen shows {self.screen}. The flow is set aside: decide the "
            "next step yourself."
        )


@dataclass(frozen=True, slots=True)
class Move:
    """A replayed decision, or a handover to the model (exactly one is set)."""

    decision: Decision | None = None
    handover: Handover | None = None


def _screen(scene: Scene) -> str:
    shown = [t for t in labels.screen_texts(scene) if t.strip()][:SHOWN_LABELS]
    what = ", ".join(repr(t[:40]) for t in shown)
    return f"{scene.page or 'an unnamed screen'!r}" + (f" with {what}" if what else "")


def _fill(text: str, values: Mapping[str, str]) -> str:
    return params.SLOT.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def _same_page(expected: str, scene: Scene) -> bool:
    """The screen is the page the flow recorded: the same app, and the same title unless a
    title holds digits (a launcher's date, a clock, a counter: it changes by itself, so the
    app alone must do; the step's target still has to be found on it)."""
    package, _, title = expected.partition(": ")
    if package.strip() != scene.package:
        return False
    now = scene.page_title
    if any(c.isdigit() for c in title + now):
        return True
    return " ".join(title.split()).lower() == " ".join(now.split()).lower()


def replay(flows: Sequence[types_pb2.Flow], steps: Sequence[PastStep], scene: Scene) -> Move | None:
    """The replay's move for this call, or None when there is no replay (no flow, or the model
    has taken over already). `steps` carry the outcome of the latest step when it is known."""
    # A flow stored without a step's page (learned before the cloud kept the pages of shipped
    # decisions) cannot be checked against the screen: it is no candidate.
    flows = [f for f in flows if all(s.page_before for s in f.steps)]
    if not flows or any(s.mode != MODE for s in steps):
        return None
    if not steps:
        first_problem: Handover | None = None
        for candidate in flows:
            move = _step(candidate, 0, scene)
            if move.decision is not None:
                return move
            # A flow whose first page is here but not its target (the app changed, counted)
            # is the one reported over one set aside (the phone elsewhere, or its state):
            # behind such a flow, a broken one was counted nowhere and never retired.
            handover = move.handover
            if first_problem is None or (
                handover is not None
                and handover.counted
                and not first_problem.counted
                and not first_problem.settled
            ):
                first_problem = handover
        return Move(handover=midway(flows, scene) or first_problem)
    flow: types_pb2.Flow | None = next((f for f in flows if f.flow_id == steps[-1].flow_id), None)
    if flow is None:  # the flow it was on is gone from the candidates: let the model go on
        return None
    move = _next(flow, steps, scene)
    if move.handover is None:
        return move
    # Another candidate that took the same steps so far may go on from here (the same goal
    # learned twice, once with an interruption: the one that fits the screen continues).
    for other in flows:
        if other.flow_id != flow.flow_id and _same_path(other, flow, len(steps)):
            switched = _next(other, steps, scene)
            if switched.decision is not None:
                return switched
    return move


def midway(flows: Sequence[types_pb2.Flow], scene: Scene) -> Handover | None:
    """An uncounted handover when the attempt begins where a later step of a candidate acts
    (its page is open and its target is there), or None.

    The phone is part-way through the flow: an earlier attempt replaying it was cut short (its
    host restarted, its lease ran out) and this one begins on the screen it left, or the phone
    was left there by something else. Step 1 does not fit, but not because the app changed:
    counted, each host restart was a divergence, and three retired a sound flow. Nor is the
    replay resumed there: whether the step before was done (typed, switched) cannot be told
    from the screen alone, and doing it twice, or skipping it, is worse than a model call."""
    for flow in flows:
        for index in range(1, len(flow.steps)):
            move = _step(flow, index, scene)
            # A step whose switch is already where the flow leaves it acts here all the same
            # (a phone left on 'Display' with dark theme on): the phone is part-way too.
            if move.decision is not None or (move.handover and move.handover.settled):
                reason = f"this screen is where its step {index + 1} acts"
                if move.handover is not None:
                    reason += f" ({move.handover.reason})"
                return Handover(
                    flow.flow_id,
                    flow.goal_template,
                    index + 1,
                    len(flow.steps),
                    reason,
                    _screen(scene),
                    counted=False,
                )
    return None


def _next(flow: types_pb2.Flow, steps: Sequence[PastStep], scene: Scene) -> Move:
    """Check the step just replayed, then the next one of `flow` (or its `complete`)."""
    done = len(steps)
    problem = _check_previous(flow, steps[-1], scene, done)
    if problem is not None:
        return Move(handover=_handover(flow, done, problem, scene))
    if done >= len(flow.steps):
        # The run's closing claim, checked here as each step's outcome is: a run that found
        # the goal's state already set ("'Dark theme' is on" before any tap) is learned with
        # no step that sets it, and its replay claimed success on a phone where it was off.
        completion = _fill(flow.completion, flow.parameters)
        claim = state_claim(completion, scene)
        if claim.verdict == "not_met" or (claim.verdict == "unknown" and _rests_on(flow)):
            reason = (
                f"the run it was learned from ended on a screen this one is not: {claim.evidence}"
                + ("" if claim.verdict == "not_met" else f" ({completion[:200]!r})")
            )
            return Move(handover=_handover(flow, done + 1, reason, scene))
        return Move(decision=_complete(flow, scene))
    return _step(flow, done, scene)


def _rests_on(flow: types_pb2.Flow) -> bool:
    """The flow's success rests on its closing claim: its steps set nothing, and its
    completion names a state in a form the replay checks (`synthesis` learns such a run only
    so). Unknown on this screen (no switch of that name: another app version's label, a list
    scrolled elsewhere), the claim is no success: nothing else checked the state."""
    # Only a run that says it found the state already so (as `synthesis` reads it): one whose
    # tap on a button ("Turn on now", no switch) set the state says it is on, and is checked
    # like any flow (a switch of that name off is still refused above).
    return (
        not any(
            sets_something(s.tool_name, s.target if s.HasField("target") else None)
            for s in flow.steps
        )
        and found_already_set(flow.completion)
        and claims_a_checkable_state(flow.completion)
    )


def _shape(step: types_pb2.FlowStep) -> tuple[object, ...]:
    """What a step does, whatever its flow: tool, target, typed text or key, app, page."""
    return (
        step.tool_name,
        semantics(step.target) if step.HasField("target") else "",
        step.text_parameter or step.action.input_text.text,
        step.action.press_key.key,
        step.action.launch_app.package_name or step.action.terminate_app.package_name,
        step.page_before,
    )


def _same_path(a: types_pb2.Flow, b: types_pb2.Flow, count: int) -> bool:
    """`a` begins with the same `count` steps as `b`."""
    if len(a.steps) < count or len(b.steps) < count:
        return False
    return all(
        _shape(x) == _shape(y) for x, y in zip(a.steps[:count], b.steps[:count], strict=True)
    )


def _handover(flow: types_pb2.Flow, step: int, reason: str, scene: Scene) -> Handover:
    handover = Handover(
        flow.flow_id, flow.goal_template, step, len(flow.steps), reason, _screen(scene)
    )
    state = _phone_state(flow, scene)
    if state:
        why = f"{state} ({reason})"
        return dataclasses.replace(handover, reason=why, counted=False, phone_state=True)
    return handover


def _phone_state(flow: types_pb2.Flow, scene: Scene) -> str:
    """What of this phone, not of the app, keeps the flow from fitting here, or "": a system
    dialog over the app (a permission prompt, an app not responding), or another language
    than the flow's labels (no screen of this phone shows them)."""
    covering = [o for o in scene.overlays if o in BLOCKING]
    if covering:
        return f"a {covering[0].replace('_', ' ')} covers the app"
    learned = language.of_flow(flow)
    if learned and _own_title(flow, scene, learned):
        # The app's title is the one the flow recorded, in the flow's words: whatever else the
        # screen shows in another language is the user's (notes, contacts), not the phone's.
        return ""
    shown = language.guess([scene.page_title, *labels.screen_texts(scene)]) if learned else ""
    if shown and shown != learned:
        return f"this screen is in {shown}, the flow was learned in {learned}"
    return ""


def _own_title(flow: types_pb2.Flow, scene: Scene, learned: str) -> bool:
    """The screen's title is one of the flow's pages' titles and a word of it is in the flow's
    language alone (so the phone shows the app in that language)."""
    now = " ".join(scene.page_title.split()).lower()
    if not now or not language.says(now, learned):
        return False
    titles = (
        _fill(page, flow.parameters).partition(": ")[2]
        for step in flow.steps
        for page in (step.page_before, step.page_after)
    )
    return any(" ".join(t.split()).lower() == now for t in titles)


def _check_previous(flow: types_pb2.Flow, last: PastStep, scene: Scene, index: int) -> str | None:
    """Why the step just replayed (flow step `index`) did not go as in the original run, or
    None."""
    if not 1 <= index <= len(flow.steps):
        return f"the attempt's last replayed step names flow step {index}, which it lacks"
    step = flow.steps[index - 1]
    outcome = last.outcome
    if outcome is not None and not outcome.executed:
        return f"step {index} did not run ({outcome.error or 'no reason given'})"
    # Not reported (a host that does not know it: restarted, or another language's that sends
    # none): the step is checked on this screen all the same, or a flow's last step that did
    # nothing would still end in a `complete` claiming success.
    if outcome is not None:
        verdict, evidence = outcome.verdict, outcome.evidence
    else:
        check = verify(last.expected_outcome, last.tool_name, last.arguments, scene)
        verdict, evidence = check.verdict, check.evidence
    if verdict == "not_met" and step.verdict == types_pb2.VERDICT_MET:
        return f"step {index}'s expected outcome was not met: {evidence}"
    expected_page = _fill(step.page_after, flow.parameters)
    if expected_page and not _same_page(expected_page, scene):
        return f"after step {index} the flow reached {expected_page!r}, not this screen"
    return None


def _step(flow: types_pb2.Flow, index: int, scene: Scene) -> Move:
    """Replay flow step `index` (0-based) on `scene`, or hand over at it."""
    step = flow.steps[index]
    number = index + 1
    page = _fill(step.page_before, flow.parameters)
    if not _same_page(page, scene):
        handover = _handover(flow, number, f"the flow expects {page!r} here", scene)
        if index == 0 and handover.counted:
            # Where a replay starts is where the phone was left (another app, a list
            # scrolled), and nothing was replayed: counted, three phones left elsewhere
            # retired a sound flow. A first page that is the flow's but lacks its target
            # (below) still counts: that is the app changed.
            handover = dataclasses.replace(
                handover,
                reason=f"the phone is not where the flow starts: {handover.reason}",
                counted=False,
                phone_state=True,
            )
        return Move(handover=handover)
    try:
        arguments, action, found = _rebuild(flow, step, scene)
    except _Diverged as diverged:
        handover = _handover(flow, number, str(diverged), scene)
        if diverged.settled:
            handover = dataclasses.replace(handover, counted=False, settled=True)
        return Move(handover=handover)
    purpose = _fill(step.purpose, flow.parameters)
    expected = _fill(step.expected_outcome, flow.parameters)
    action.purpose, action.expected_outcome = purpose, expected
    rationale = (
        f"Replaying learned flow {flow.flow_id}, step {number} of {len(flow.steps)}: {purpose}."
    )
    if found:
        rationale += f" Target: {found}."
    decision = _decision(
        flow, number, step.tool_name, arguments, action, purpose, expected, rationale
    )
    decision.page = scene.page
    decision.target_descriptor = describe(scene, action)
    return Move(decision=decision)


class _Diverged(Exception):
    """The step cannot be replayed on this screen (the message says why); `settled`: because
    the phone is already where the step would put it, which is no fault of the flow."""

    def __init__(self, why: str, *, settled: bool = False) -> None:
        super().__init__(why)
        self.settled = settled


def _rebuild(
    flow: types_pb2.Flow, step: types_pb2.FlowStep, scene: Scene
) -> tuple[dict[str, Any], types_pb2.Action, str]:
    """The step's arguments and typed action on this screen, and how its target was found."""
    action = types_pb2.Action()
    action.CopyFrom(step.action)
    kind = action.WhichOneof("kind")
    found = ""
    element_id = ""
    if step.HasField("target") and kind in ("tap", "input_text", "swipe"):
        target = types_pb2.ElementTarget()
        target.CopyFrom(step.target)
        if target.text:
            target.text = _fill(target.text, flow.parameters)
        resolved = resolve(scene, target)
        if resolved.element is None:
            raise _Diverged(f"its target is not here: {resolved.why}")
        element = resolved.element
        element_id, found = element.element_id, resolved.why
        switch = labels.holding_checkable(scene, element)
        if target.checkable and switch is not None and switch.checked != target.checked:
            state = "on" if switch.checked else "off"
            raise _Diverged(
                f"{semantics(target)} is already {state}, so tapping it would undo what the "
                "flow does",
                settled=True,
            )
    if kind == "tap":
        if action.tap.WhichOneof("target") == "element_id":
            if not element_id:
                raise _Diverged("it taps an element the flow cannot name")
            action.tap.element_id = element_id
            arguments: dict[str, Any] = {"element_id": element_id}
        else:
            # Coordinates alone mean nothing on a screen of another size or rotation (the
            # launcher's Settings point opened the Phone app on a smaller phone): the point
            # goes where it was on the element under it, found again by its target.
            if not element_id:
                raise _Diverged(
                    "it taps a point no element names, which cannot be placed on this screen"
                )
            point = action.tap.point
            point.x, point.y = _placed(step.target.bounds, scene, element_id, point.x, point.y)
            arguments = {"x": point.x, "y": point.y}
        if action.tap.long_press:
            arguments["long_press"] = True
        return arguments, action, found
    if kind == "input_text":
        text = action.input_text.text
        if step.text_parameter:
            if step.text_parameter not in flow.parameters:
                raise _Diverged(f"it types parameter {step.text_parameter}, which the goal lacks")
            text = flow.parameters[step.text_parameter]
        action.input_text.text = text
        action.input_text.element_id = element_id
        arguments = {"text": text, "sensitive": action.input_text.sensitive}
        if element_id:
            arguments["element_id"] = element_id
        return arguments, action, found
    if kind == "swipe":
        if not step.HasField("target") or not element_id:
            raise _Diverged("it swipes outside any list, which cannot be placed on this screen")
        sw, was = action.swipe, step.target.bounds
        (sw.start.x, sw.start.y), (sw.end.x, sw.end.y) = (
            _placed(was, scene, element_id, sw.start.x, sw.start.y),
            _placed(was, scene, element_id, sw.end.x, sw.end.y),
        )
        arguments = {
            "start_x": sw.start.x,
            "start_y": sw.start.y,
            "end_x": sw.end.x,
            "end_y": sw.end.y,
        }
        if sw.duration_ms:
            arguments["duration_ms"] = sw.duration_ms
        return arguments, action, found
    if kind == "press_key":
        return {"key": _KEY_NAMES.get(action.press_key.key, "")}, action, found
    if kind == "launch_app":
        return {"package_name": action.launch_app.package_name}, action, found
    if kind == "terminate_app":
        return {"package_name": action.terminate_app.package_name}, action, found
    raise _Diverged(f"it is a {kind or 'empty'} action, which a flow does not replay")


def _placed(was: types_pb2.Rect, scene: Scene, element_id: str, x: int, y: int) -> tuple[int, int]:
    """The point (x, y), taken where it was within `was` (the element's bounds in the learned
    run), put at the same place within that element's bounds on this screen."""
    now = scene.element(element_id)
    assert now is not None
    fx = (x - was.left) / max(1, was.right - was.left)
    fy = (y - was.top) / max(1, was.bottom - was.top)
    b = now.bounds
    return (
        min(b.right - 1, max(b.left, round(b.left + fx * b.width))),
        min(b.bottom - 1, max(b.top, round(b.top + fy * b.height))),
    )


def _decision(
    flow: types_pb2.Flow,
    number: int,
    tool_name: str,
    arguments: dict[str, Any],
    action: types_pb2.Action,
    purpose: str,
    expected: str,
    rationale: str,
) -> Decision:
    return Decision(
        tool_name=tool_name,
        arguments=arguments,
        action=action,
        purpose=purpose,
        expected_outcome=expected,
        rationale=rationale,
        thinking=[],
        usage=Usage(),
        provider=PROVIDER,
        model=f"flow {flow.flow_id}",
        latency_s=0.0,
        forced_retry=False,
        system_prompt="",
        user_prompt="",
        extra={"mode": MODE},
        flow_id=flow.flow_id,
        flow_step=number,
    )


def _complete(flow: types_pb2.Flow, scene: Scene) -> Decision:
    reason = f"replayed learned flow {flow.flow_id} ({len(flow.steps)} steps)"
    if flow.completion:
        reason += f": {_fill(flow.completion, flow.parameters)}"
    reason = re.sub(r"\s+", " ", reason)[:2000]
    action = types_pb2.Action()
    action.complete.success = True
    action.complete.reason = reason
    decision = _decision(
        flow,
        len(flow.steps) + 1,
        "complete",
        {"success": True, "reason": reason},
        action,
        "",
        "",
        f"Every step of learned flow {flow.flow_id} was replayed and checked; the goal is "
        "reached as in the run it was learned from.",
    )
    decision.page = scene.page
    return decision
