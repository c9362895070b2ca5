"""The compact per-step history the planner sends instead of past screens.

A `WorldEvent` is one finished step. Only `compact()` reaches a prompt, so prompt size stays flat
as a task grows: no past scene and no thinking ever goes back to the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


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

    def compact(self) -> dict[str, Any]:
        """The prompt form: `{page, action (with purpose and expected outcome), rationale, success}`."""
        action = dict(self.action)
        if self.purpose:
            action["purpose"] = self.purpose
        if self.expected_outcome:
            action["expected_outcome"] = self.expected_outcome
        return {
            "page": self.page,
            "action": action,
            "rationale": self.rationale,
            "success": self.success,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorldEvent:
        """Load a stored record, ignoring unknown keys and tolerating missing newer ones."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("action", {})
        return cls(**values)
