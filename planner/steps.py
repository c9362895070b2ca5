"""An attempt's earlier steps as the planner remembers them: decision, screen, reported outcome.

The cloud rebuilds them from its decision log (one row per decision, the host's `ActionOutcome`
recorded on it when the next Decide call reports it); the direct transport keeps the same
records in memory. Both turn them into the compact history with `history_events`, so a prompt
does not depend on where the planner runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from amc.v1 import types_pb2
from planner.decision import Decision
from planner.history import WorldEvent
from planner.scene import Scene
from planner.session.step_planner import call_id_of
from planner.tools import ui_tree_result
from planner.verify import (
    MAX_EVIDENCE_BYTES,
    Check,
    VerdictName,
    cut_evidence,
    verdict_from_proto,
    verdict_to_proto,
    verify,
)

MAX_OUTCOME_ERROR_BYTES = 2048
MAX_DRIVER_OUTPUT_BYTES = 4096
TARGET_CHARS = 60


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def stored_arguments(decision: Decision) -> str:
    """The masked arguments as the decision log stores them (keys sorted)."""
    return json.dumps(decision.masked_arguments(), ensure_ascii=False, sort_keys=True)


def target_label(action: types_pb2.Action, scene: Scene) -> str | None:
    """The text (or description) of the element an action names, because an element id alone
    means nothing once the screen has changed; None when it names none or it has no label."""
    kind = action.WhichOneof("kind")
    element_id = ""
    if kind == "tap" and action.tap.WhichOneof("target") == "element_id":
        element_id = action.tap.element_id
    elif kind == "input_text":
        element_id = action.input_text.element_id
    element = scene.element(element_id) if element_id else None
    label = (element.text or element.content_desc) if element is not None else ""
    return label[:TARGET_CHARS] or None


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What the host reported about executing one decision (`amc.v1.ActionOutcome`), with the
    checker's verdict on its expected outcome (None: not checked)."""

    executed: bool
    error: str = ""
    driver_output: str = ""
    verdict: VerdictName | None = None
    evidence: str = ""

    @classmethod
    def from_proto(cls, outcome: types_pb2.ActionOutcome) -> StepOutcome:
        return cls(
            outcome.executed,
            outcome.error,
            outcome.driver_output,
            verdict_from_proto(outcome.verdict),
            outcome.evidence,
        )

    def to_proto(self, step_index: int) -> types_pb2.ActionOutcome:
        return types_pb2.ActionOutcome(
            step_index=step_index,
            executed=self.executed,
            error=self.error,
            driver_output=self.driver_output,
            verdict=verdict_to_proto(self.verdict),
            evidence=self.evidence,
        )

    @property
    def check(self) -> Check | None:
        return Check(self.verdict, self.evidence) if self.verdict is not None else None


@dataclass(frozen=True, slots=True)
class PastStep:
    """One earlier decision of the attempt: where it was made, what it did, what came of it.

    `arguments_json` is the masked arguments exactly as `stored_arguments` writes them, so a
    record rebuilt from the decision log equals the one the direct transport kept.
    """

    step_index: int
    page: str
    tool_name: str
    arguments_json: str
    target: str | None
    purpose: str
    expected_outcome: str
    rationale: str | None
    outcome: StepOutcome | None = None
    #: "compact", "session" or "replay" (a step of a learned flow, no model call).
    mode: str = "compact"
    #: For a replayed step: its flow and 1-based position in it.
    flow_id: str = ""
    flow_step: int = 0
    #: Session mode: the conversation's id of the step's tool call ("" otherwise, and for rows
    #: logged before migration 0018), so its outcome answers that call and no other.
    call_id: str = ""

    @classmethod
    def from_decision(cls, decision: Decision, step_index: int) -> PastStep:
        return cls(
            step_index=step_index,
            page=decision.page,
            tool_name=decision.tool_name,
            arguments_json=stored_arguments(decision),
            target=decision.target,
            purpose=decision.purpose,
            expected_outcome=decision.expected_outcome,
            rationale=decision.rationale,
            mode=decision.planner_mode,
            flow_id=decision.flow_id,
            flow_step=decision.flow_step,
            call_id=call_id_of(decision),
        )

    @property
    def arguments(self) -> dict[str, Any]:
        value = json.loads(self.arguments_json or "{}")
        return value if isinstance(value, dict) else {}

    def verdict_line(self) -> str | None:
        """ "expected 'X' — not met: <evidence>", once a checked outcome was reported."""
        check = self.outcome.check if self.outcome is not None else None
        if check is None or not self.expected_outcome:
            return None
        return check.line(self.expected_outcome)

    def event(self, page_after: str | None) -> WorldEvent:
        """The compact history record of this step."""
        action: dict[str, Any] = {"tool": self.tool_name, **json.loads(self.arguments_json)}
        if self.target:
            action["target"] = self.target
        outcome = self.outcome
        replayed = f"flow {self.flow_id} step {self.flow_step}" if self.mode == "replay" else None
        return WorldEvent(
            action=action,
            page=self.page,
            purpose=self.purpose or None,
            expected_outcome=self.expected_outcome or None,
            rationale=self.rationale,
            success=outcome.executed if outcome is not None else None,
            error=(outcome.error or None) if outcome is not None else None,
            scene_summary={"page_after": page_after} if page_after else None,
            verdict=outcome.verdict if outcome is not None else None,
            evidence=(outcome.evidence or None) if outcome is not None else None,
            replayed=replayed,
        )


def outcome_problem(outcome: types_pb2.ActionOutcome, steps: Sequence[PastStep]) -> str | None:
    """INVALID_ARGUMENT text for a previous outcome that names no decision of the attempt or
    is oversize, naming the field; None when it is usable (a verdict this planner does not
    know included: `unknown_verdict`)."""
    for name, value, limit in (
        ("previous_outcome.error", outcome.error, MAX_OUTCOME_ERROR_BYTES),
        ("previous_outcome.driver_output", outcome.driver_output, MAX_DRIVER_OUTPUT_BYTES),
        ("previous_outcome.evidence", outcome.evidence, MAX_EVIDENCE_BYTES),
    ):
        size = len(value.encode("utf-8"))
        if size > limit:
            return f"{name} is {size} bytes; at most {limit}"
    if not any(s.step_index == outcome.step_index for s in steps):
        known = f"1 to {steps[-1].step_index}" if steps else "none yet"
        return (
            f"previous_outcome.step_index: {outcome.step_index} is not a decision of this "
            f"attempt (its decisions: {known})"
        )
    return None


_VERDICTS = frozenset(types_pb2.Verdict.values())


def unknown_verdict(outcome: types_pb2.ActionOutcome) -> tuple[types_pb2.ActionOutcome, str]:
    """`outcome` with a verdict this planner does not know (a newer host's: proto3 enums are
    open) read as UNSPECIFIED, as if the host had run no checker, and the note that says so
    for the record ("" when the verdict is known). Refused, the host's step failed for a
    judgement that only informs the model."""
    if outcome.verdict in _VERDICTS:
        return outcome, ""
    note = f"the host's verdict {outcome.verdict} is not one this cloud knows; read as unspecified"
    read = types_pb2.ActionOutcome()
    read.CopyFrom(outcome)
    read.verdict = types_pb2.VERDICT_UNSPECIFIED
    return read, note


def noted(outcome: types_pb2.ActionOutcome, note: str, host_evidence: str) -> None:
    """Put `note` (`unknown_verdict`'s) first in `outcome.evidence`, before the cloud's check's
    evidence or else the host's, so the decision log says the verdict was unknown."""
    after = outcome.evidence or host_evidence
    outcome.evidence = cut_evidence(f"{note}: {after}" if after else note)


def checked(
    outcome: types_pb2.ActionOutcome | None,
    steps: Sequence[PastStep],
    scene: Scene,
) -> tuple[types_pb2.ActionOutcome | None, bool]:
    """`outcome` with a verdict: as the host sent it, or — when it sent none (a host that runs
    no checker) — the checker's reading of the current screen alone (`scene`, the screen after
    the action). Returns the outcome and whether this function ran the check."""
    if outcome is None or outcome.verdict != types_pb2.VERDICT_UNSPECIFIED:
        return outcome, False
    step = next((s for s in steps if s.step_index == outcome.step_index), None)
    if step is None or not step.expected_outcome or not outcome.executed:
        return outcome, False
    check = verify(step.expected_outcome, step.tool_name, step.arguments, scene)
    filled = types_pb2.ActionOutcome()
    filled.CopyFrom(outcome)
    filled.verdict = verdict_to_proto(check.verdict)
    filled.evidence = check.evidence
    return filled, True


def with_outcome(
    steps: Sequence[PastStep], outcome: types_pb2.ActionOutcome | None
) -> list[PastStep]:
    """The steps with `outcome` recorded on the step it names, unless that step already has
    one (the first report wins, as in the decision log)."""
    return [
        replace(s, outcome=StepOutcome.from_proto(outcome))
        if outcome is not None and s.step_index == outcome.step_index and s.outcome is None
        else s
        for s in steps
    ]


def history_events(steps: Sequence[PastStep], current_page: str) -> list[WorldEvent]:
    """The compact history: each step's page after is the next step's page (the screen the
    next decision was made on), the last one's the current screen's."""
    pages = [s.page for s in steps[1:]] + [current_page]
    return [step.event(page_after) for step, page_after in zip(steps, pages, strict=False)]


def tool_result_text(
    tool_name: str, outcome: StepOutcome, scene: Scene, verdict: str | None = None
) -> str:
    """A session-mode tool result for an executed call: the node list for `get_ui_tree` (its
    answer is the current screen), else whether it ran, its error, the page it led to and the
    checker's verdict on its expected outcome ("expected 'X' — not met: the screen shows Y")."""
    if tool_name == "get_ui_tree" and outcome.executed:
        return _dump(ui_tree_result(scene))
    result: dict[str, Any] = {"ok": outcome.executed}
    if scene.page:
        result["page_after"] = scene.page
    if outcome.error:
        result["error"] = outcome.error
    if verdict:
        result["verdict"] = verdict
    return _dump(result)
