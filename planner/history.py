"""The compact per-step history the planner sends instead of past screens.

A `WorldEvent` is one finished step. Only `compact()` reaches a prompt, so prompt size stays flat
as a task grows: no past scene and no thinking ever goes back to the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from planner.secret_refs import MASK, stored

if TYPE_CHECKING:
    from planner.decision import Decision

__all__ = ["MASK", "WorldEvent", "verdict_line"]

_VERDICT_WORDS = {"met": "met", "not_met": "not met", "unknown": "unknown"}


def verdict_line(expected: str, verdict: str, evidence: str | None) -> str:
    """How a prompt says a checked step: "expected 'X' — not met: <evidence>"."""
    word = _VERDICT_WORDS.get(verdict, verdict)
    return f"expected {expected!r} — {word}: {evidence or 'no evidence recorded'}"


@dataclass(slots=True)
class WorldEvent:
    """One step as remembered. Every field but `action` is optional so older records still load."""

    action: dict[str, Any]
    page: str | None = None
    purpose: str | None = None
    expected_outcome: str | None = None
    rationale: str | None = None
    thinking: str | None = None
    success: bool | None = None
    scene_summary: dict[str, Any] | None = None
    #: Why the action failed, as the host reported it (None when it ran).
    error: str | None = None
    #: What the driver reported (kept for the timeline; never sent to the model).
    driver_output: str | None = None
    #: The checker's verdict on the expected outcome ("met", "not_met", "unknown"; None until
    #: checked) and its evidence (what was looked for, what was found).
    verdict: str | None = None
    evidence: str | None = None
    #: A step of a learned flow, replayed without the model ("flow <id> step <n>").
    replayed: str | None = None

    def compact(self) -> dict[str, Any]:
        """The prompt form: `{page, action (+ purpose, expected outcome), rationale, success}`,
        plus `error` when the action failed with one, `verdict` once the expected outcome was
        checked, and `replayed` for a step of a learned flow."""
        action = dict(self.action)
        if action.get("sensitive") and "text" in action:
            action["text"] = stored(action["text"])
        if self.purpose:
            action["purpose"] = self.purpose
        if self.expected_outcome:
            action["expected_outcome"] = self.expected_outcome
        record = {
            "page": self.page,
            "action": action,
            "rationale": self.rationale,
            "success": self.success,
        }
        if self.error:
            record["error"] = self.error
        if self.verdict:
            record["verdict"] = verdict_line(
                self.expected_outcome or "", self.verdict, self.evidence
            )
        if self.replayed:
            record["replayed"] = self.replayed
        return record

    def to_dict(self) -> dict[str, Any]:
        """Stored form; a sensitive input's text is masked here too (it is never recorded)."""
        data = asdict(self)
        if data["action"].get("sensitive") and "text" in data["action"]:
            data["action"] = {**data["action"], "text": stored(data["action"]["text"])}
        return data

    @classmethod
    def from_decision(
        cls,
        decision: Decision,
        *,
        page: str | None,
        success: bool | None,
        target: str | None = None,
    ) -> WorldEvent:
        """The record of a finished step, built the one way every caller should build it.

        `action` is `{"tool": name, **masked executable arguments}`; `target` (the tapped
        element's text or description, when the host knows it) is added as `action["target"]`
        because element ids alone mean nothing once the screen has changed. Thinking is kept on
        the event for the timeline but `compact()` never sends it back to the model.
        """
        action: dict[str, Any] = {"tool": decision.tool_name, **decision.masked_arguments()}
        if target:
            action["target"] = target
        thinking = "\n\n".join(b.text for b in decision.thinking if b.text) or None
        return cls(
            action=action,
            page=page,
            purpose=decision.purpose or None,
            expected_outcome=decision.expected_outcome or None,
            rationale=decision.rationale,
            thinking=thinking,
            success=success,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorldEvent:
        """Load a stored record, ignoring unknown keys and tolerating missing newer ones."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("action", {})
        return cls(**values)
