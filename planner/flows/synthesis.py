"""A learned flow from the steps of an attempt that succeeded.

Input is what the decision log keeps per decision (`SourceStep`): the tool and its masked
arguments, the typed action, the semantic target of the element it named, purpose, expected
outcome, the checker's verdict and the page it was decided on. Output is an `amc.v1.Flow`:

* steps that ran and changed something, in order (`get_ui_tree` reads, a step that failed
  to run, and a try the checker found not met that the next step repeats are left out), up to
  the `complete` that ended the attempt with success — none when the checker found the last
  of them not met (the success was the model's word alone), nor when one of them taps a point
  no element holds or swipes outside any list (a replay places a point on the element under
  it, a swipe on its list, and could only hand over there);
* element ids cleared: a replay finds the element again by its semantic target;
* typed text from the goal becomes a goal parameter ({p1}, …) in the step, and in the goal
  template, page names, purposes, expected outcomes, target texts and the completion (what a
  replay's `complete` says) that repeat it; a sensitive text that is a lone secret reference
  (`{{secret:NAME}}`, kept by the log: `secret_refs.stored`) stays in its step, and a replay
  has the host type the new task's value for it; any other sensitive text is never stored:
  its step types a `secret…` parameter no goal can fill, and a run that typed more such texts
  than its goal names secrets is not learned (its goal may spell the value out, and the log's
  mask cannot say where);
* a run for a goal that asks for a state ("Turn on dark theme", not "Open display
  settings": `verify.asks_for_a_state`) whose steps set nothing (no switch or checkbox acted
  on, no text typed: only navigation) and whose `complete` says the state was already so
  ("already", "nothing to do": `verify.found_already_set`) is learned only when that claim is
  one a replay checks on its last screen (`verify.claims_a_checkable_state`: "'Dark theme' is
  already on"): such a run found the goal reached before it did anything, its flow has no
  step that reaches it, and a replay of it completes only where the claim holds. Said in
  other words ("Dark theme already enabled, nothing to do") the replay could not check it,
  and would claim success on every phone its navigation works on: no flow. A run that set
  nothing and says it did the work ("Turned on dark theme.") is learned: its tap may have
  been on the switch's label, which is not the checkable element itself;
* the embedding text: the goal template and each step's purpose, expected outcome and target
  semantics — what retrieval scores a new goal against.

Nothing here touches a database: the cloud feeds it rows and stores the result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amc.v1 import types_pb2
from planner import secret_refs
from planner.decision import CUT_MARK
from planner.flows import params
from planner.targets import semantics
from planner.verify import (
    VerdictName,
    asks_for_a_state,
    claims_a_checkable_state,
    found_already_set,
    verdict_to_proto,
)

#: Tools a flow replays (reads and the closing `complete` are not steps of their own).
REPLAYED_TOOLS = frozenset(
    {"tap", "swipe", "input_text", "press_key", "launch_app", "terminate_app"}
)


@dataclass(frozen=True, slots=True)
class SourceStep:
    """One decision of the attempt, as the decision log keeps it."""

    step_index: int
    tool_name: str
    arguments: Mapping[str, Any]
    action: types_pb2.Action
    target: types_pb2.ElementTarget | None
    purpose: str
    expected_outcome: str
    page: str
    verdict: VerdictName | None = None
    executed: bool | None = None


@dataclass(frozen=True, slots=True)
class Synthesis:
    """The flow, or why none was made; `fingerprint` identifies the same path learned twice."""

    flow: types_pb2.Flow | None
    why: str
    fingerprint: str = ""


def package_of(page: str) -> str:
    """The app of a page name ("com.android.settings: Display" → com.android.settings)."""
    return page.split(": ", 1)[0].strip()


def _fill_slots(text: str, slots: Mapping[str, str]) -> str:
    """`text` with every known parameter value written as its slot."""
    return params.slotted(text, {name: value for value, name in slots.items()})


def _was_cut(arguments: Mapping[str, Any]) -> bool:
    return any(isinstance(v, str) and CUT_MARK in v for v in arguments.values())


def _masked(step: SourceStep) -> bool:
    """A sensitive text the log keeps as the mask: its value is not known (a lone secret
    reference is kept as it is, and typed again as it is)."""
    if step.tool_name != "input_text" or not step.arguments.get("sensitive"):
        return False
    text = step.arguments.get("text")
    return secret_refs.stored(text) == secret_refs.MASK


def _unplaceable(step: SourceStep) -> bool:
    """A tap by coordinates with no element under it, or a swipe on no list
    (`planner.targets.describe` found none): its points mean nothing on a screen of another
    size, rotation or layout."""
    kind = step.action.WhichOneof("kind")
    by_point = kind == "tap" and step.action.tap.WhichOneof("target") == "point"
    return (by_point or kind == "swipe") and step.target is None


def sets_something(tool_name: str, target: types_pb2.ElementTarget | None) -> bool:
    """A step that changes a state rather than only where the phone is: one acting on a
    switch, checkbox or option (its target is checkable), or typing text. A run (or flow)
    with none reached a goal that asks for a state only by finding it already set."""
    if tool_name == "input_text":
        return True
    return target is not None and target.checkable


def _retried(step: SourceStep, after: SourceStep | None) -> bool:
    """`after` does again, on the same page, what `step` did, whose outcome the checker found
    not met: `step` was a try that did not take."""
    return after is not None and step.verdict == "not_met" and _what(step) == _what(after)


def _what(step: SourceStep) -> tuple[str, str, str, str]:
    """What a step does, wherever its element is now: tool, page, target, other arguments."""
    rest = {k: v for k, v in step.arguments.items() if k != "element_id"}
    return (
        step.tool_name,
        step.page,
        semantics(step.target) if step.target is not None else "",
        json.dumps(rest, sort_keys=True, default=str),
    )


def synthesize(goal: str, steps: Sequence[SourceStep]) -> Synthesis:
    """The flow an attempt's steps make, or None with the reason (no successful `complete`,
    nothing replayable)."""
    if not steps or steps[-1].tool_name != "complete":
        return Synthesis(None, "the attempt did not end with a complete")
    if not steps[-1].arguments.get("success"):
        return Synthesis(None, "the attempt's complete did not claim success")
    ran = [s for s in steps[:-1] if s.tool_name in REPLAYED_TOOLS and s.executed is not False]
    # A step the checker found not met and the model then did again is left out: the retry
    # is the step. Kept, a replay did it twice (what the first try missed worked this time,
    # so the screen was no longer the one the flow expected after it: every replay of the
    # flow handed over there, and an action that does not move the page ran twice).
    kept = [s for s, after in zip(ran, [*ran[1:], None], strict=False) if not _retried(s, after)]
    if not kept:
        return Synthesis(None, "no device action to replay")
    if kept[-1].verdict == "not_met":
        # The success is the model's word against the checker's: a replay of it would end in
        # `complete` on a screen where the last step was never seen to work.
        return Synthesis(
            None, f"step {kept[-1].step_index}'s expected outcome was not met before the complete"
        )
    unplaced = next((s.step_index for s in [*kept, steps[-1]] if not s.page), None)
    if unplaced is not None:  # a replay checks each step's page: without one it would act blind
        return Synthesis(None, f"step {unplaced} has no page recorded (no screen came with it)")
    unheld = next((s for s in kept if _unplaceable(s)), None)
    if unheld is not None:  # a replay places a point on the element under it (a swipe on
        # the list it moved), found again by its target (`replay._rebuild`): with none it can
        # only hand over there, and every replay of the flow would count a divergence at that
        # step until it was retired
        what = (
            "taps a point no element holds"
            if unheld.tool_name == "tap"
            else ("swipes outside any list")
        )
        return Synthesis(None, f"step {unheld.step_index} {what}, which a replay cannot place")
    cut = next((s.step_index for s in kept if _was_cut(s.arguments)), None)
    if cut is not None:  # a text over the decision log's limit is kept cut (`kept`): a replay
        # would type the cut text and its marker
        return Synthesis(None, f"step {cut}'s action was cut to the decision log's limit")
    sensitive = sum(1 for s in kept if _masked(s))
    named = len(secret_refs.names_in(goal))
    if sensitive > named:
        # The log keeps a sensitive text masked, so where the goal spells the value out
        # ("... with password hunter2") it cannot be cut from the goal template, the embedding
        # text (sent to the embeddings API) or the pages: only a goal that refers to its
        # secrets by name ({{secret:NAME}}) holds none of them.
        return Synthesis(
            None,
            f"{sensitive} sensitive text(s) typed but the goal names {named} secret(s) by"
            " reference: it may spell a value out",
        )
    closing = str(steps[-1].arguments.get("reason") or "")
    if (
        asks_for_a_state(goal)
        and not any(sets_something(s.tool_name, s.target) for s in kept)
        and found_already_set(closing)
        and not claims_a_checkable_state(closing)
    ):
        return Synthesis(
            None,
            "its steps set nothing (only navigation) and its complete says the state was"
            f" already so, in words a replay cannot check on the screen: {closing[:200]!r}",
        )
    typed = [
        str(s.arguments.get("text") or "")
        for s in kept
        if s.tool_name == "input_text" and not s.arguments.get("sensitive")
    ]
    template, slots = params.template_goal(goal, typed)
    pages_after = [s.page for s in steps[1:]]
    flow = types_pb2.Flow(
        goal_template=template,
        completion=_fill_slots(str(steps[-1].arguments.get("reason") or ""), slots),
        status=types_pb2.FLOW_STATUS_ACTIVE,
    )
    secrets = 0
    apps: list[str] = []
    for source in kept:
        index = steps.index(source)
        step = flow.steps.add(
            index=len(flow.steps) + 1,
            tool_name=source.tool_name,
            purpose=_fill_slots(source.purpose, slots),
            expected_outcome=_fill_slots(source.expected_outcome, slots),
            verdict=verdict_to_proto(source.verdict),
            page_before=_fill_slots(source.page, slots),
            page_after=_fill_slots(pages_after[index], slots),
        )
        step.action.CopyFrom(source.action)
        step.action.ClearField("purpose")
        step.action.ClearField("expected_outcome")
        if source.target is not None:
            step.target.CopyFrom(source.target)
            if step.target.text:
                step.target.text = _fill_slots(step.target.text, slots)
        kind = step.action.WhichOneof("kind")
        if kind == "tap" and step.action.tap.WhichOneof("target") == "element_id":
            step.action.tap.element_id = ""
        elif kind == "input_text":
            text = str(source.arguments.get("text") or "")
            step.action.input_text.element_id = ""
            if _masked(source):
                secrets += 1
                step.text_parameter = f"{params.SECRET_PREFIX}{secrets}"
                step.action.input_text.text = ""
            elif text.strip() in slots:
                step.text_parameter = slots[text.strip()]
                step.action.input_text.text = ""
        elif kind == "launch_app":
            apps.append(step.action.launch_app.package_name)
        for page in (source.page, pages_after[index]):
            package = package_of(page)
            if package:
                apps.append(package)
    flow.apps.extend(dict.fromkeys(a for a in apps if a))
    flow.embedding_text = embedding_text(flow)
    return Synthesis(flow, f"{len(flow.steps)} steps", fingerprint(flow))


def embedding_text(flow: types_pb2.Flow) -> str:
    """What retrieval scores a goal against: the goal template, then per step its purpose,
    expected outcome and target semantics (one line each)."""
    lines = [flow.goal_template]
    for step in flow.steps:
        target = f" on {semantics(step.target)}" if step.HasField("target") else ""
        lines.append(f"{step.tool_name}{target}: {step.purpose}. {step.expected_outcome}")
    return "\n".join(lines)


def fingerprint(flow: types_pb2.Flow) -> str:
    """Same goal template, same steps (tool, what they name, what they type, where) → same
    fingerprint: the second success of a path adds no second flow."""
    shape = [flow.goal_template] + [
        [
            s.tool_name,
            semantics(s.target) if s.HasField("target") else "",
            s.text_parameter or s.action.input_text.text,
            s.action.press_key.key,
            s.action.launch_app.package_name or s.action.terminate_app.package_name,
            s.page_before,
        ]
        for s in flow.steps
    ]
    return hashlib.sha256(json.dumps(shape, ensure_ascii=False).encode()).hexdigest()[:32]


def needed_parameters(flow: types_pb2.Flow) -> list[str]:
    """The parameters the flow's steps type, in order (goal slots and secrets)."""
    return list(dict.fromkeys(s.text_parameter for s in flow.steps if s.text_parameter))
