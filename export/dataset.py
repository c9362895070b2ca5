"""The dataset form of a run: JSON Lines, one `StepRecord` per step, screenshots beside it.

The schema (docs/export.md, `docs/export/step.schema.json` generated from these models) follows
the public Android agent datasets where they agree: AndroidControl's episode of goal +
screenshots + accessibility elements + JSON actions, with AndroidWorld's action vocabulary and
keys (`action_type`, `x`, `y`, `text`, `direction`, `app_name`, `goal_status`) in screen pixels,
and Android-in-the-Wild's `episode_id` / `step_id` / `episode_length` and touch/lift points.
What amc knows beyond them (purpose, expected outcome, thinking, rationale, outcome, usage,
since /2 the prompts, the learned flow and the model's verdict on its previous step, since /3
the kept answer a resumed decision went on from, since /4 a flow set aside) rides in fields of
its own. `parse_line` reads a line of any version and `step_from_record` turns it back into a
`Step`, which is how a host's export is merged into the cloud's: /1 to /3 are closed (their
models stay, `StepRecordV1` to `StepRecordV3`), so exports written before /4 still merge.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from google.protobuf.json_format import MessageToDict, ParseDict
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from amc.v1 import types_pb2
from export.gesture import gesture
from export.run import FailedCalls, Judged, Outcome, Pruned, Run, Step, Unsettled
from planner.decision import ResumedFrom, ThinkingBlock, Usage
from planner.scene import Bounds, Element, Scene

STEP_SCHEMA: Literal["amc.export.step/4"] = "amc.export.step/4"
STEP_SCHEMA_V3: Literal["amc.export.step/3"] = "amc.export.step/3"
STEP_SCHEMA_V2: Literal["amc.export.step/2"] = "amc.export.step/2"
STEP_SCHEMA_V1: Literal["amc.export.step/1"] = "amc.export.step/1"
RUN_SCHEMA: Literal["amc.export.run/4"] = "amc.export.run/4"

ActionType = Literal[
    "click",
    "long_press",
    "swipe",
    "input_text",
    "navigate_back",
    "navigate_home",
    "keyboard_enter",
    "press_key",
    "open_app",
    "terminate_app",
    "get_ui_tree",
    "status",
    "unknown",
]

_KEY_ACTIONS: dict[int, tuple[ActionType, str]] = {
    types_pb2.KEY_BACK: ("navigate_back", "KEYCODE_BACK"),
    types_pb2.KEY_HOME: ("navigate_home", "KEYCODE_HOME"),
    types_pb2.KEY_ENTER: ("keyboard_enter", "KEYCODE_ENTER"),
    types_pb2.KEY_DELETE: ("press_key", "KEYCODE_DEL"),
}


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ScreenRecord(_Record):
    """The screen the step was decided on."""

    width: int = Field(description="Screen width in pixels (AndroidControl screenshot_widths).")
    height: int = Field(description="Screen height in pixels (screenshot_heights).")
    rotation: int = Field(description="Quarter turns, 0..3, as uiautomator reports them.")
    app: str = Field(description="Package of the app in the foreground.")
    activity: str = Field(description="Its activity when known, else empty.")
    title: str = Field(description="The page's title as perception named it.")
    keyboard_shown: bool
    overlays: list[str] = Field(description="What covered the app (keyboard, dialogs...).")


class UiElementRecord(_Record):
    """One element of the screen (AndroidControl's accessibility nodes, flattened)."""

    id: str = Field(description="The id the model names in its actions.")
    bounds: list[int] = Field(description="[left, top, right, bottom] in screen pixels.")
    center: list[int] = Field(description="[x, y]: where a tap on this element lands.")
    text: str
    content_desc: str
    hint: str
    resource_id: str
    class_name: str
    package: str
    clickable: bool
    long_clickable: bool
    checkable: bool
    checked: bool
    enabled: bool
    focusable: bool
    focused: bool
    scrollable: bool
    selected: bool
    password: bool
    source: Literal["tree", "ocr"]


class ActionRecord(_Record):
    """The action in AndroidWorld's JSON action vocabulary, coordinates in screen pixels."""

    action_type: ActionType
    x: int | None = Field(None, description="Tap point, or the field tapped before typing.")
    y: int | None = None
    text: str | None = Field(None, description="Text typed; '•••' for a sensitive value.")
    direction: Literal["up", "down", "left", "right"] | None = Field(
        None, description="Swipe: where the finger moves."
    )
    app_name: str | None = Field(None, description="open_app / terminate_app: the package.")
    goal_status: Literal["complete", "infeasible"] | None = Field(
        None, description="status: the agent's own verdict on the goal."
    )
    keycode: str | None = Field(None, description="The Android key code of a key press.")
    element_id: str | None = Field(None, description="The element the model named, if any.")
    element_bounds: list[int] | None = None
    touch: list[int] | None = Field(None, description="Swipe start [x, y] (AitW yx_touch).")
    lift: list[int] | None = Field(None, description="Swipe end [x, y] (AitW yx_lift).")
    duration_ms: int | None = None
    sensitive: bool | None = Field(None, description="The text was marked sensitive.")


class AmcActionRecord(_Record):
    """The action as amc ran it: the tool call and the typed `amc.v1.Action` (proto JSON)."""

    tool: str
    arguments: dict[str, Any]
    proto: dict[str, Any]


class ThinkingRecord(_Record):
    text: str
    redacted: bool


class OutcomeRecord(_Record):
    executed: bool | None = Field(description="The action ran without error; null: not reported.")
    error: str
    driver_output: str
    verdict: str | None = Field(description="A checker's verdict on the step; null: none given.")
    verdict_detail: str


class ModelRecord(_Record):
    provider: str
    model: str
    planner_mode: str
    transport: str = Field(description="'cloud' or 'direct': where the decision was made.")


class UsageRecord(_Record):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    thinking_tokens: int


class JudgementRecord(_Record):
    """The model's own verdict on its previous step's expected outcome (its `previous_step`)."""

    verdict: Literal["met", "not met", "unknown"]
    note: str = Field(description="Its one line on it (at most 512 characters).")


class FlowRecord(_Record):
    """A learned flow's step replayed without the model, or the model's step that took over."""

    flow_id: str
    flow_step: int = Field(
        description="1-based step of the flow replayed (one past its last for the replayed "
        "complete), or the flow step that diverged."
    )
    divergence: str | None = Field(
        description="null: a replayed step. Else the step that took over from the replay: "
        "why the flow step diverged, as the model's prompt said it."
    )


# /4's `flow`: /3's with `set_aside`. A new model, not a field added to FlowRecord: /2 and /3
# are closed, and their documented schemas name FlowRecord as it was.
class FlowUseRecord(FlowRecord):
    """A learned flow's part in the step: replayed, taken over from, or set aside."""

    set_aside: str | None = Field(
        description="null: not set aside. Else the model's step decided where a replay set "
        "its flow aside through no fault of the flow (the phone part-way through it or on "
        "another screen than the flow starts from, a switch already where the flow leaves it, "
        "a system dialog in the way, a screen in another language): why. No divergence "
        "(`divergence` is null), nothing counted against the flow."
    )


class ResumedRecord(_Record):
    """The kept model answer the step's decision went on from instead of asking the model
    again (`amc.v1.Decision.resumed_from`): its rationale, thinking and call were written for
    an earlier request of the step, whose decision was billed for them and failed after."""

    turn_id: str = Field(description="The provider's id of the answer; '': it sent none.")
    position: int = Field(
        description="Where the answer begins in the attempt's conversation (0-based item)."
    )
    answered_at: str | None = Field(
        description="When it was answered (ISO 8601 with its offset, UTC: its session store "
        "kept it); null: not known.",
        json_schema_extra={"format": "date-time"},
    )

    @field_validator("answered_at")
    @classmethod
    def _an_aware_time(cls, value: str | None) -> str | None:
        """A time without its offset was read as the reader's local time (the report showed
        another hour), and one that is no time failed the read with a bare ValueError."""
        if value is None:
            return None
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not an ISO 8601 time: {value!r}") from None
        if at.tzinfo is None:
            raise ValueError(f"a time without its UTC offset: {value!r}")
        return value


# `amc.export.step/1`, closed: read, never written. Its docstring and title are /1's as
# published, so its schema (docs/export/step-v1.schema.json) stays the file it was.
class StepRecordV1(_Record):
    """One line of steps.jsonl: one step of one attempt, self-contained."""

    model_config = ConfigDict(title="StepRecord")

    schema_version: Literal["amc.export.step/1"]
    episode_id: str = Field(description="'<task id>-a<attempt>': one attempt is one episode.")
    task_id: str
    attempt: int
    step_id: int = Field(description="0-based position in the episode (AitW step_id).")
    step_index: int = Field(description="amc's 1-based step number within the attempt.")
    episode_length: int = Field(description="Steps in this episode.")
    goal: str
    host_id: str
    device_serial: str
    started_at: str
    page: str = Field(description="'<app>: <page title>' of the screen the step began on.")
    screen: ScreenRecord | None = Field(description="null: the source kept no screen.")
    ui_elements: list[UiElementRecord] | None
    screenshot: str | None = Field(description="Before screenshot, relative to this file.")
    screenshot_after: str | None
    action: ActionRecord
    amc_action: AmcActionRecord
    step_instruction: str = Field(description="AndroidControl's step instruction: the purpose.")
    purpose: str
    expected_outcome: str
    rationale: str
    thinking: list[ThinkingRecord]
    thinking_kind: str
    outcome: OutcomeRecord
    model: ModelRecord
    usage: UsageRecord | None
    latency_s: float | None
    cost_usd: float | None


# `amc.export.step/2`, closed like /1: read, never written; its schema stays
# docs/export/step-v2.schema.json.
class StepRecordV2(StepRecordV1):
    """One line of steps.jsonl: one step of one attempt, self-contained but for the system
    prompt, which is written where it changes (tens of KB, the same all attempt long)."""

    schema_version: Literal["amc.export.step/2"]  # type: ignore[assignment]  # /1's, narrowed
    user_prompt: str = Field(
        description="What we asked the model at this step, as recorded (sensitive input "
        "masked); in session mode this step's part of the conversation. '': none recorded "
        "(a replayed step, an older record)."
    )
    system_prompt: str | None = Field(
        description="The system prompt, on the episode's first line and where it changes; "
        "null: the same as the line before in this episode."
    )
    flow: FlowRecord | None = Field(description="null: no learned flow had a part in the step.")
    previous_step: JudgementRecord | None = Field(
        description="The model's own verdict on the step before this one; null: none given."
    )


# /3 is /2 with `resumed_from`: /2 is closed (extra fields are refused), and a /2 reader would
# take a resumed step's rationale and thinking for an answer to the step's own request. Closed
# like /2 since /4: read, never written; its schema stays docs/export/step-v3.schema.json.
class StepRecordV3(StepRecordV2):
    """One line of steps.jsonl: one step of one attempt, self-contained but for the system
    prompt, which is written where it changes (tens of KB, the same all attempt long)."""

    schema_version: Literal["amc.export.step/3"]  # type: ignore[assignment]  # /2's, narrowed
    resumed_from: ResumedRecord | None = Field(
        description="null: the decision asked the model. Else the kept answer it went on "
        "from (its rationale and thinking were written for an earlier request of the step)."
    )


# /4 is /3 with `flow.set_aside`: in /3 a flow set aside had no words, so the step either named
# no flow or, naming it with no divergence, read as a replayed step the model decided.
class StepRecord(StepRecordV3):
    """One line of steps.jsonl: one step of one attempt, self-contained but for the system
    prompt, which is written where it changes (tens of KB, the same all attempt long)."""

    schema_version: Literal["amc.export.step/4"]  # type: ignore[assignment]  # /3's, narrowed
    flow: FlowUseRecord | None = Field(  # /3's FlowRecord, narrowed to its /4 subclass
        description="null: no learned flow had a part in the step."
    )


class RunRecordV1(_Record):
    """run.json: the run as a whole (the goal and result the steps belong to)."""

    schema_version: Literal["amc.export.run/1"]
    task_id: str
    goal: str
    status: str
    result: str
    origin: Literal["host", "cloud", "cloud+host"]
    attempts: dict[str, str] = Field(description="Attempt number -> 'host/phone' it ran on.")
    steps: int
    notes: list[str]


class FailedCallsRecord(_Record):
    """What the answered model calls of one attempt's failed decisions cost: no step is
    recorded for them, yet the provider billed them."""

    attempt: int
    decisions: int = Field(description="Decisions that failed after billed calls.")
    usage: UsageRecord
    cost_usd: float


class TotalRecord(_Record):
    """Every model call of the run: the steps' and the failed decisions'."""

    usage: UsageRecord
    cost_usd: float | None = Field(description="null: a step's price is not known.")


# /2 is /1 with what the failed decisions' calls cost and the run's total: /1 is closed (extra
# fields are refused), and a /1 reader summing the steps would take a smaller number for the
# task's spending.
class RunRecordV2(RunRecordV1):
    """run.json /2: the run as a whole (the goal and result the steps belong to, and its
    spending). Read, never written."""

    schema_version: Literal["amc.export.run/2"]  # type: ignore[assignment]  # /1's, narrowed
    failed_calls: list[FailedCallsRecord] = Field(
        description="Per attempt, the failed decisions' billed calls (no step is recorded)."
    )
    total: TotalRecord = Field(
        description="The steps' and the failed decisions' calls: the task's totals."
    )


class PrunedRecord(_Record):
    """What the cloud's retention deleted of the task's decision log: no step is recorded
    for it, yet the task's totals count it."""

    decisions: int = Field(description="Decisions deleted.")
    failed_decisions: int = Field(description="Failed decisions whose call records went.")
    pruned_at: str | None = Field(description="When (ISO 8601, UTC); null: not known.")
    usage: UsageRecord
    cost_usd: float


# /3 is /2 with what the retention deleted: /2 is closed, and its total would leave it out.
class RunRecordV3(RunRecordV2):
    """run.json /3: the run as a whole (the goal and result the steps belong to, and its
    spending). Read, never written."""

    schema_version: Literal["amc.export.run/3"]  # type: ignore[assignment]  # /2's, narrowed
    pruned: PrunedRecord | None = Field(
        description="What the cloud's retention deleted of the log; null: nothing."
    )
    total: TotalRecord = Field(
        description="The steps', the failed decisions' and the pruned calls: the task's totals."
    )


class UnsettledRecord(_Record):
    """One attempt's model calls whose cost was never recorded (the process making them died,
    or their answer was lost after the request went out): the provider may have billed them.
    Not in `total`, which counts what providers reported."""

    attempt: int
    calls: int = Field(description="How many calls.")
    at_most: UsageRecord = Field(description="The most their tokens can have been.")
    at_most_cost_usd: float = Field(description="The most they can have cost.")


# /4 is /3 with the calls of unknown cost: /3 is closed, and a /3 reader would take its total
# for everything the provider may have billed.
class RunRecord(RunRecordV3):
    """run.json: the run as a whole (the goal and result the steps belong to, and its spending)."""

    schema_version: Literal["amc.export.run/4"]  # type: ignore[assignment]  # /3's, narrowed
    unsettled: list[UnsettledRecord] = Field(
        description="Per attempt, its calls of unknown cost with the most they can have cost "
        "(not in total)."
    )


# --- Step -> record ---------------------------------------------------------------------------


def action_record(step: Step) -> ActionRecord:
    """The step's action in the dataset's vocabulary, element ids resolved to points."""
    g = gesture(step)
    action = step.action
    kind = action.WhichOneof("kind")
    x, y = g.point if g.point is not None else (None, None)
    box = g.box.to_list() if g.box is not None else None
    if kind == "tap":
        element_id = action.tap.element_id or None
        verb: ActionType = "long_press" if g.kind == "long_press" else "click"
        return ActionRecord(action_type=verb, element_id=element_id, element_bounds=box, x=x, y=y)
    if kind == "swipe":
        s = action.swipe
        return ActionRecord(
            action_type="swipe",
            direction=g.direction,  # type: ignore[arg-type]  # swipe_direction's four words
            touch=[s.start.x, s.start.y],
            lift=[s.end.x, s.end.y],
            duration_ms=s.duration_ms or None,
        )
    if kind == "input_text":
        it = action.input_text
        return ActionRecord(
            action_type="input_text",
            text=it.text,
            element_id=it.element_id or None,
            element_bounds=box,
            sensitive=step.sensitive,
            x=x,
            y=y,
        )
    if kind == "press_key":
        verb, keycode = _KEY_ACTIONS.get(action.press_key.key, ("press_key", "KEYCODE_UNKNOWN"))
        return ActionRecord(action_type=verb, keycode=keycode)
    if kind == "launch_app":
        return ActionRecord(action_type="open_app", app_name=action.launch_app.package_name)
    if kind == "terminate_app":
        return ActionRecord(action_type="terminate_app", app_name=action.terminate_app.package_name)
    if kind == "get_ui_tree":
        return ActionRecord(action_type="get_ui_tree")
    if kind == "complete":
        status: Literal["complete", "infeasible"] = (
            "complete" if action.complete.success else "infeasible"
        )
        return ActionRecord(action_type="status", goal_status=status, text=action.complete.reason)
    return ActionRecord(action_type="unknown")


def _element_record(e: Element) -> UiElementRecord:
    return UiElementRecord(
        id=e.element_id,
        bounds=e.bounds.to_list(),
        center=list(e.bounds.center),
        text=e.text,
        content_desc=e.content_desc,
        hint=e.hint,
        resource_id=e.resource_id,
        class_name=e.class_name,
        package=e.package,
        clickable=e.clickable,
        long_clickable=e.long_clickable,
        checkable=e.checkable,
        checked=e.checked,
        enabled=e.enabled,
        focusable=e.focusable,
        focused=e.focused,
        scrollable=e.scrollable,
        selected=e.selected,
        password=e.password,
        source=e.source,
    )


def step_record(
    run: Run,
    step: Step,
    step_id: int,
    length: int,
    shots: tuple[str | None, str | None],
    previous: Step | None = None,
) -> StepRecord:
    """One line of the dataset; `shots` are the before/after file names (None: no image),
    `previous` the line before it (its system prompt is not repeated)."""
    scene = step.screen
    screen = (
        ScreenRecord(
            width=scene.screen_width,
            height=scene.screen_height,
            rotation=scene.rotation,
            app=scene.package,
            activity=scene.activity,
            title=scene.page_title,
            keyboard_shown=scene.keyboard_shown,
            overlays=list(scene.overlays),
        )
        if scene is not None
        else None
    )
    u = step.usage
    return StepRecord(
        schema_version=STEP_SCHEMA,
        episode_id=f"{run.task_id}-a{step.attempt}",
        task_id=run.task_id,
        attempt=step.attempt,
        step_id=step_id,
        step_index=step.step_index,
        episode_length=length,
        goal=run.goal,
        host_id=step.host_id,
        device_serial=step.device_serial,
        started_at=step.started_at,
        page=step.page,
        screen=screen,
        ui_elements=[_element_record(e) for e in scene.elements] if scene is not None else None,
        screenshot=shots[0],
        screenshot_after=shots[1],
        action=action_record(step),
        amc_action=AmcActionRecord(
            tool=step.tool_name,
            arguments=dict(step.arguments),
            proto=MessageToDict(step.action, preserving_proto_field_name=True),
        ),
        step_instruction=step.purpose,
        purpose=step.purpose,
        expected_outcome=step.expected_outcome,
        rationale=step.rationale,
        thinking=[ThinkingRecord(text=b.text, redacted=b.redacted) for b in step.thinking],
        thinking_kind=step.thinking_kind,
        outcome=OutcomeRecord(
            executed=step.outcome.executed,
            error=step.outcome.error,
            driver_output=step.outcome.driver_output,
            verdict=step.verdict,
            verdict_detail=step.verdict_detail,
        ),
        model=ModelRecord(
            provider=step.provider,
            model=step.model,
            planner_mode=step.planner_mode,
            transport=step.transport,
        ),
        usage=_usage_record(u) if u is not None else None,
        latency_s=step.latency_s,
        cost_usd=step.cost_usd,
        user_prompt=step.user_prompt,
        system_prompt=None
        if previous is not None
        and previous.attempt == step.attempt
        and previous.system_prompt == step.system_prompt
        else step.system_prompt,
        flow=FlowUseRecord(
            flow_id=step.flow_id,
            flow_step=step.flow_step,
            divergence=step.replay_divergence or None,
            set_aside=step.flow_set_aside or None,
        )
        if step.flow_id
        else None,
        previous_step=JudgementRecord(
            verdict=step.previous_step.verdict,  # type: ignore[arg-type]  # VERDICT_WORDS
            note=step.previous_step.note,
        )
        if step.previous_step is not None
        else None,
        resumed_from=_resumed_record(step.resumed_from) if step.resumed_from is not None else None,
    )


def _resumed_record(r: ResumedFrom) -> ResumedRecord:
    at = r.answered_at.astimezone(UTC).isoformat() if r.answered_at is not None else None
    return ResumedRecord(turn_id=r.turn_id, position=r.position, answered_at=at)


def _usage_record(u: Usage) -> UsageRecord:
    return UsageRecord(
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        cache_read_input_tokens=u.cache_read_input_tokens,
        cache_creation_input_tokens=u.cache_creation_input_tokens,
        thinking_tokens=u.thinking_tokens,
    )


def run_record(run: Run) -> RunRecord:
    usage, cost = run.total()
    return RunRecord(
        schema_version=RUN_SCHEMA,
        task_id=run.task_id,
        goal=run.goal,
        status=run.status,
        result=run.result,
        origin=run.origin,
        attempts={str(k): v for k, v in sorted(run.attempts.items())},
        steps=len(run.steps),
        notes=list(run.notes),
        failed_calls=[
            FailedCallsRecord(
                attempt=f.attempt,
                decisions=f.decisions,
                usage=_usage_record(f.usage),
                cost_usd=f.usage.cost_usd,
            )
            for f in run.failed_calls
        ],
        pruned=None
        if run.pruned is None
        else PrunedRecord(
            decisions=run.pruned.decisions,
            failed_decisions=run.pruned.failed_decisions,
            pruned_at=run.pruned.at.isoformat() if run.pruned.at is not None else None,
            usage=_usage_record(run.pruned.usage),
            cost_usd=run.pruned.usage.cost_usd,
        ),
        total=TotalRecord(usage=_usage_record(usage), cost_usd=cost),
        unsettled=[
            UnsettledRecord(
                attempt=u.attempt,
                calls=u.calls,
                at_most=_usage_record(u.at_most),
                at_most_cost_usd=u.at_most.cost_usd,
            )
            for u in run.unsettled
        ],
    )


def pruned_from_record(record: RunRecordV1) -> Pruned | None:
    """What the retention deleted, as a run.json says (/1 and /2 did not say)."""
    if not isinstance(record, RunRecordV3) or record.pruned is None:
        return None
    p = record.pruned
    at = datetime.fromisoformat(p.pruned_at) if p.pruned_at is not None else None
    usage = Usage(**p.usage.model_dump(), cost_usd=p.cost_usd)
    return Pruned(p.decisions, p.failed_decisions, at, usage)


def failed_calls_from_record(record: RunRecordV1) -> list[FailedCalls]:
    """The failed decisions' calls a run.json lists (none in /1, which did not list them)."""
    if not isinstance(record, RunRecordV2):
        return []
    return [
        FailedCalls(f.attempt, f.decisions, Usage(**f.usage.model_dump(), cost_usd=f.cost_usd))
        for f in record.failed_calls
    ]


def unsettled_from_record(record: RunRecordV1) -> list[Unsettled]:
    """The calls of unknown cost a run.json lists (none before /4, which did not list them)."""
    if not isinstance(record, RunRecord):
        return []
    return [
        Unsettled(
            u.attempt,
            u.calls,
            Usage(**u.at_most.model_dump(), cost_usd=u.at_most_cost_usd),
        )
        for u in record.unsettled
    ]


AnyRunRecord = RunRecord | RunRecordV3 | RunRecordV2 | RunRecordV1
_ANY_RUN: TypeAdapter[AnyRunRecord] = TypeAdapter(
    Annotated[AnyRunRecord, Field(discriminator="schema_version")]
)


def parse_run(text: str | bytes) -> AnyRunRecord:
    """run.json of any version, validated against its schema (a ValidationError names what
    is wrong)."""
    return _ANY_RUN.validate_json(text)


# --- record -> Step ---------------------------------------------------------------------------


def _scene(record: StepRecordV1) -> Scene | None:
    s = record.screen
    if s is None:
        return None
    elements = [
        Element(
            element_id=e.id,
            bounds=Bounds(*e.bounds),
            text=e.text,
            content_desc=e.content_desc,
            resource_id=e.resource_id,
            class_name=e.class_name,
            package=e.package,
            clickable=e.clickable,
            long_clickable=e.long_clickable,
            checkable=e.checkable,
            checked=e.checked,
            enabled=e.enabled,
            focusable=e.focusable,
            focused=e.focused,
            scrollable=e.scrollable,
            selected=e.selected,
            password=e.password,
            source=e.source,
            hint=e.hint,
        )
        for e in record.ui_elements or []
    ]
    return Scene(
        elements=elements,
        package=s.app,
        page_title=s.title,
        screen_width=s.width,
        screen_height=s.height,
        rotation=s.rotation,
        activity=s.activity,
        keyboard_shown=s.keyboard_shown,
        overlays=list(s.overlays),
    )


def step_from_record(
    record: StepRecord | StepRecordV3 | StepRecordV2 | StepRecordV1,
    before: bytes | None = None,
    after: bytes | None = None,
    system_prompt: str = "",
) -> Step:
    """A dataset line back as a `Step` (with the screenshots the caller read beside it);
    `system_prompt` is the one in force before this line (a /2 line leaves it out when it
    has not changed). A /1 line has no prompts, flow or judgement: they read as none; a /1 or
    /2 line no resumed mark: read as asked."""
    u = record.usage
    step = Step(
        attempt=record.attempt,
        step_index=record.step_index,
        tool_name=record.amc_action.tool,
        action=ParseDict(record.amc_action.proto, types_pb2.Action()),
        arguments=dict(record.amc_action.arguments),
        purpose=record.purpose,
        expected_outcome=record.expected_outcome,
        rationale=record.rationale,
        thinking=[ThinkingBlock(t.text, t.redacted) for t in record.thinking],
        thinking_kind=record.thinking_kind,
        provider=record.model.provider,
        model=record.model.model,
        planner_mode=record.model.planner_mode,
        transport=record.model.transport,
        host_id=record.host_id,
        device_serial=record.device_serial,
        started_at=record.started_at,
        page=record.page,
        screen=_scene(record),
        usage=Usage(**u.model_dump()) if u is not None else None,
        latency_s=record.latency_s,
        cost_usd=record.cost_usd,
        outcome=Outcome(
            record.outcome.executed, record.outcome.error, record.outcome.driver_output
        ),
        verdict=record.outcome.verdict,
        verdict_detail=record.outcome.verdict_detail,
        before_png=before,
        after_png=after,
    )
    if isinstance(record, StepRecordV3) and record.resumed_from is not None:
        r = record.resumed_from
        at = datetime.fromisoformat(r.answered_at) if r.answered_at is not None else None
        step.resumed_from = ResumedFrom(r.turn_id, r.position, at)
    if isinstance(record, StepRecordV2):
        step.user_prompt = record.user_prompt
        step.system_prompt = (
            record.system_prompt if record.system_prompt is not None else system_prompt
        )
        if record.flow is not None:
            step.flow_id, step.flow_step = record.flow.flow_id, record.flow.flow_step
            step.replay_divergence = record.flow.divergence or ""
            if isinstance(record.flow, FlowUseRecord):
                step.flow_set_aside = record.flow.set_aside or ""
        if record.previous_step is not None:
            step.previous_step = Judged(record.previous_step.verdict, record.previous_step.note)
    return step


AnyStepRecord = StepRecord | StepRecordV3 | StepRecordV2 | StepRecordV1
_ANY_LINE: TypeAdapter[AnyStepRecord] = TypeAdapter(
    Annotated[AnyStepRecord, Field(discriminator="schema_version")]
)


def parse_line(line: str) -> AnyStepRecord:
    """One line of steps.jsonl of any version, validated against its schema (a
    ValidationError, a ValueError, names what is wrong)."""
    return _ANY_LINE.validate_json(line)


def schema_json(record: type[StepRecordV1] = StepRecord) -> str:
    """The JSON Schema of a steps.jsonl line (what docs/export/step.schema.json holds; /1's
    to /3's are docs/export/step-v1.schema.json to step-v3.schema.json)."""
    return json.dumps(record.model_json_schema(), indent=2, sort_keys=True) + "\n"
