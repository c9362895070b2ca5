"""One timeline step as stored: what was asked, what the model said, what ran, what came of it.

Every field but the keys is optional so records written by older hosts (a `prompt`, a
`tool_call`, one `screenshot_path`) still load; `screenshot_path` stays as an alias of the
after screenshot for readers that only know that name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from google.protobuf.json_format import MessageToDict

from planner.history import WorldEvent
from planner.observation import observation_from_scene
from planner.scene import Scene
from planner.secret_refs import MASK, stored

SENSITIVE_MASK = MASK


@dataclass(slots=True)
class TimelineRecord:
    """One step of one attempt."""

    task_id: str
    attempt: int
    step_index: int
    started_at: str = ""
    finished_at: str = ""
    page: str | None = None
    # The prompts actually sent for this step.
    system_prompt: str | None = None
    user_prompt: str | None = None
    # "session": user_prompt is what this step added to a kept conversation, not the request.
    planner_mode: str = "compact"
    # The model's answer.
    rationale: str | None = None
    thinking: list[dict[str, Any]] = field(default_factory=list)
    tool_name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    purpose: str | None = None
    expected_outcome: str | None = None
    provider: str | None = None
    model: str | None = None
    forced_retry: bool = False
    corrective_retries: int = 0
    decision_step_index: int | None = None
    # "full" | "summarized" | "omitted" | "redacted" | "none"; "" in records of older hosts.
    thinking_kind: str = ""
    # "none" | "forced" | "nudge"; "" in records of older hosts.
    retry_kind: str = ""
    output_truncated: bool = False
    # The model's judgement of the step before this one ({"verdict", "note"}), when it gave one.
    previous_step: dict[str, Any] | None = None
    # A replayed step of a learned flow, or the step that took over from one:
    # {"flow_id", "flow_step", "divergence"} (divergence set on the one that took over).
    flow: dict[str, Any] | None = None
    # The kept model answer the decision went on from instead of asking the model again
    # ({"turn_id", "position", "answered_at"}: `ResumedFrom.as_dict`; the turn id "" when the
    # provider sent none, answered_at ISO 8601 or None when not known); None: it did not.
    resumed_from: dict[str, Any] | None = None
    # What ran and how it went.
    action: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    success: bool | None = None
    error: str | None = None
    # The checker's verdict on the expected outcome: {"verdict": "met" | "not_met" | "unknown",
    # "evidence": "..."}; None when the step was not checked (it did not run, or it is a read).
    verdict: dict[str, str] | None = None
    # Evidence (paths relative to the artifact folder).
    before_screenshot_path: str | None = None
    after_screenshot_path: str | None = None
    #: The screen the step was decided on, as `amc.v1.ScreenObservation` JSON without OCR
    #: (elements, size, app): what an export's dataset and drawn actions need.
    screen: dict[str, Any] = field(default_factory=dict)
    ocr: list[dict[str, Any]] = field(default_factory=list)
    ocr_after: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    world_event: dict[str, Any] = field(default_factory=dict)
    # Fields of older record formats, kept verbatim so nothing is lost on load.
    legacy: dict[str, Any] = field(default_factory=dict)

    @property
    def screenshot_path(self) -> str | None:
        """Alias of the after screenshot, the only screenshot older records had."""
        return self.after_screenshot_path

    @property
    def event(self) -> WorldEvent:
        return WorldEvent.from_dict(self.world_event or {"action": self.action})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["screenshot_path"] = self.after_screenshot_path
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimelineRecord:
        """Load any stored form: unknown keys go to `legacy`, missing ones take defaults."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        legacy = dict(values.pop("legacy", None) or {})
        for k, v in data.items():
            if k not in known and k != "screenshot_path":
                legacy[k] = v
        if values.get("after_screenshot_path") is None and data.get("screenshot_path"):
            values["after_screenshot_path"] = data["screenshot_path"]
        # The old format's `prompt` was the task goal, `tool_call` the parsed call.
        if "tool_call" in legacy and not values.get("tool_name"):
            call = legacy["tool_call"] or {}
            if isinstance(call, dict):
                values["tool_name"] = call.get("action") or call.get("name")
                args = call.get("args") or call.get("arguments")
                if isinstance(args, dict):
                    values.setdefault("arguments", args)
                if call.get("description") and not values.get("purpose"):
                    values["purpose"] = call["description"]
        values.setdefault("task_id", str(data.get("task_id", "")))
        values.setdefault("attempt", int(data.get("attempt", 1) or 1))
        values.setdefault("step_index", int(data.get("step_index", data.get("step", 0)) or 0))
        values["legacy"] = legacy
        return cls(**values)


def mask_text_arguments(arguments: dict[str, Any], sensitive: bool) -> dict[str, Any]:
    """Arguments safe to store: the text of a sensitive input becomes "•••" (a lone secret
    reference stays: `secret_refs.stored`)."""
    if sensitive or arguments.get("sensitive"):
        out = dict(arguments)
        if "text" in out:
            out["text"] = stored(out["text"])
        return out
    return dict(arguments)


def screen_record(scene: Scene) -> dict[str, Any]:
    """What a record keeps of a screen: the observation the planner got, OCR left out (the
    record has it already), as proto JSON."""
    observation = observation_from_scene(scene)
    observation.ClearField("ocr_blocks")
    return MessageToDict(observation, preserving_proto_field_name=True)
