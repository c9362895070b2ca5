"""JSON shapes of the console API, and their translation from the amc.v1 messages.

The API is the gRPC contract in JSON clothes: names follow the protos, enums become lower-case
words ("running", "cloud"), timestamps ISO 8601, durations seconds. Nothing is computed here that
the cloud did not say, except the one presentation hint `history_note` (why a history is empty).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from amc.v1 import (
    artifact_service_pb2,
    decision_log_service_pb2,
    fleet_service_pb2,
    task_service_pb2,
    types_pb2,
)
from console.formatting import enum_word
from console.limits import INT32_MAX, INT64_MAX, MAX_SECONDS
from planner.convert import resumed_from_proto
from planner.decision import billed_tokens, thinking_word
from planner.targets import semantics
from webui.numbers import NOT_WHOLE, takes_int

TaskStatusName = Literal[
    "unspecified", "queued", "assigned", "running", "succeeded", "failed", "cancelled"
]
StepStatusName = Literal["unspecified", "perceiving", "planning", "acting", "succeeded", "failed"]
TransportName = Literal["unspecified", "direct", "cloud"]
DeviceStateName = Literal["unspecified", "online", "offline", "unauthorized"]

#: The statuses a filter takes: every one but `unspecified`, which is only how a status this
#: console does not know reads (a filter of it would be dropped and answer every task).
TaskStatusFilter = Literal["queued", "assigned", "running", "succeeded", "failed", "cancelled"]
TASK_STATUSES: tuple[TaskStatusFilter, ...] = get_args(TaskStatusFilter)
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


def _enum_word(enum: Any, value: int, prefix: str) -> Any:
    """`TASK_STATUS_RUNNING` → `running`; an unknown number (a newer server) → `unspecified`,
    the one word of the API's enums that stands for "not one this console knows"."""
    return enum_word(enum, value, prefix, unknown="unspecified")


def task_status_value(word: str) -> int:
    """`running` → TASK_STATUS_RUNNING, for filters."""
    value: int = types_pb2.TaskStatus.Value("TASK_STATUS_" + word.upper())
    return value


def _time(ts: Timestamp, present: bool) -> datetime | None:
    return ts.ToDatetime(tzinfo=UTC) if present else None


def _seconds(d: Duration, present: bool) -> float | None:
    return d.seconds + d.nanos / 1e9 if present else None


class ProgressOut(BaseModel):
    """Latest progress snapshot of an attempt (never a history)."""

    step_index: int = Field(description="1-based step the agent is on; 0 before the first step")
    step_status: StepStatusName
    summary: str
    updated_at: datetime | None
    max_steps: int = Field(0, description="the attempt's step limit; 0 when the host did not say")

    @classmethod
    def of(cls, p: types_pb2.Progress) -> ProgressOut:
        return cls(
            step_index=p.step_index,
            step_status=_enum_word(types_pb2.StepStatus, p.step_status, "STEP_STATUS_"),
            summary=p.summary,
            updated_at=_time(p.updated_at, p.HasField("updated_at")),
            max_steps=p.max_steps,
        )


class TargetOut(BaseModel):
    """Where a task may run; empty strings mean any."""

    host_id: str
    device_serial: str


class UsageOut(BaseModel):
    """Token usage as the provider reported it, and what it cost (list prices, US dollars)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    thinking_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def billed_tokens(self) -> int:
        """Input, output, cache reads and writes: what a token budget counts."""
        return billed_tokens(self)

    @classmethod
    def of(cls, u: types_pb2.Usage) -> UsageOut:
        return cls(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_read_input_tokens=u.cache_read_input_tokens,
            cache_creation_input_tokens=u.cache_creation_input_tokens,
            thinking_tokens=u.thinking_tokens,
            cost_usd=u.cost_usd,
        )


class BudgetOut(BaseModel):
    """Spending caps; 0 is no cap of that kind."""

    max_tokens: int = 0
    max_cost_usd: float = 0.0

    @classmethod
    def of(cls, b: types_pb2.TaskBudget) -> BudgetOut:
        return cls(max_tokens=b.max_tokens, max_cost_usd=b.max_cost_usd)


class UnsettledOut(BaseModel):
    """Model calls whose cost was never recorded (decision 0080): the process making them died
    during them, or they are under way. The provider may have billed them, up to `at_most`."""

    calls: int
    at_most: UsageOut

    @classmethod
    def of(cls, u: types_pb2.UnsettledCalls) -> UnsettledOut:
        return cls(calls=u.calls, at_most=UsageOut.of(u.at_most))


class AttemptOut(BaseModel):
    """One lease on one phone; renewals are summarised (count, first, last)."""

    attempt: int
    host_id: str
    device_serial: str
    status: TaskStatusName
    progress: ProgressOut
    failure_reason: str
    started_at: datetime | None
    ended_at: datetime | None
    planner_transport: TransportName
    lease_expires_at: datetime | None
    flow: FlowUseOut | None = Field(
        default=None, description="whether a learned flow was handed to it and how it went"
    )
    renewals: int = Field(0, description="renewals the cloud accepted for this lease")
    first_renewed_at: datetime | None = None
    last_renewed_at: datetime | None = None
    usage: UsageOut = Field(
        default_factory=UsageOut,
        description="this attempt's logged decisions (the cloud's, and those its host shipped)",
    )
    unsettled: UnsettledOut | None = Field(
        default=None,
        description="this attempt's model calls whose cost was never recorded; null when none",
    )

    @classmethod
    def of(cls, a: types_pb2.Attempt) -> AttemptOut:
        return cls(
            unsettled=UnsettledOut.of(a.unsettled) if a.unsettled.calls else None,
            renewals=a.renewals,
            first_renewed_at=_time(a.first_renewed_at, a.HasField("first_renewed_at")),
            last_renewed_at=_time(a.last_renewed_at, a.HasField("last_renewed_at")),
            attempt=a.attempt,
            host_id=a.host_id,
            device_serial=a.device_serial,
            status=_enum_word(types_pb2.TaskStatus, a.status, "TASK_STATUS_"),
            progress=ProgressOut.of(a.progress),
            failure_reason=a.failure_reason,
            started_at=_time(a.started_at, a.HasField("started_at")),
            ended_at=_time(a.ended_at, a.HasField("ended_at")),
            planner_transport=_enum_word(
                types_pb2.PlannerTransport, a.planner_transport, "PLANNER_TRANSPORT_"
            ),
            lease_expires_at=_time(a.lease_expires_at, a.HasField("lease_expires_at")),
            usage=UsageOut.of(a.usage),
            flow=FlowUseOut.of(a.flow) if a.HasField("flow") else None,
        )


class FlowUseOut(BaseModel):
    """What the cloud decided about replaying a learned flow on one attempt."""

    flow_id: str = Field(description="the flow handed over; empty when none was")
    score: float
    scorer: str
    reason: str
    steps_replayed: int
    diverged_at_step: int = Field(description="0: the replay did not hand over")
    divergence: str

    @classmethod
    def of(cls, u: types_pb2.FlowUse) -> FlowUseOut:
        return cls(
            flow_id=u.flow_id,
            score=round(u.score, 4),
            scorer=u.scorer,
            reason=u.reason,
            steps_replayed=u.steps_replayed,
            diverged_at_step=u.diverged_at_step,
            divergence=u.divergence,
        )


VerdictWord = Literal["met", "not met", "unknown", ""]
_VERDICTS: dict[int, VerdictWord] = {
    types_pb2.VERDICT_MET: "met",
    types_pb2.VERDICT_NOT_MET: "not met",
    types_pb2.VERDICT_UNKNOWN: "unknown",
}


class VerificationOut(BaseModel):
    """Whether a step reached its expected outcome: the checker's verdict and the model's
    judgement (given with the next step)."""

    verdict: VerdictWord = Field(description='the checker\'s: "" until checked')
    evidence: str
    checked_by_cloud: bool = Field(description="the host sent no verdict; the cloud checked")
    model_verdict: VerdictWord = Field(description='the model\'s judgement: "" until given')
    model_note: str
    disagree: bool = Field(description="one said met, the other not met")

    @classmethod
    def of(cls, v: types_pb2.StepVerification) -> VerificationOut:
        return cls(
            verdict=_VERDICTS.get(v.verdict, ""),
            evidence=v.evidence,
            checked_by_cloud=v.checked_by_cloud,
            model_verdict=_VERDICTS.get(v.model.verdict, ""),
            model_note=v.model.note,
            disagree=v.disagree,
        )


class TotalsOut(BaseModel):
    """What a task used over all its attempts (times as of the answer). Tokens and cost cover
    every decision logged for it (the cloud's, and those direct-transport hosts shipped);
    `usage` holds them with the cost (list prices, US dollars)."""

    usage: UsageOut = Field(default_factory=UsageOut)

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    thinking_tokens: int
    decisions: int
    steps: int
    wall_time_s: float = Field(description="submission to end (or to now)")
    run_time_s: float = Field(description="time under leases, summed over attempts")
    unsettled: UnsettledOut | None = Field(
        default=None,
        description="model calls whose cost was never recorded (not in the totals); "
        "null when there are none",
    )

    @property
    def tokens(self) -> int:
        """Every token the model read or wrote (cache reads and writes included)."""
        return billed_tokens(self)

    @classmethod
    def of(cls, t: types_pb2.TaskTotals) -> TotalsOut:
        u = t.usage
        return cls(
            usage=UsageOut.of(u),
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_read_input_tokens=u.cache_read_input_tokens,
            cache_creation_input_tokens=u.cache_creation_input_tokens,
            thinking_tokens=u.thinking_tokens,
            decisions=t.decisions,
            steps=t.steps,
            wall_time_s=_seconds(t.wall_time, True) or 0.0,
            run_time_s=_seconds(t.run_time, True) or 0.0,
            unsettled=UnsettledOut.of(t.unsettled) if t.unsettled.calls else None,
        )


class TaskOut(BaseModel):
    """A task; `attempts` is filled on the detail endpoint and empty in lists and events."""

    task_id: str
    goal: str
    status: TaskStatusName
    attempt: int = Field(description="current or last attempt; 0 while never assigned")
    max_attempts: int
    target: TargetOut
    host_id: str
    device_serial: str
    progress: ProgressOut
    result_summary: str
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    lease_duration_s: float | None
    deadline: datetime | None
    client_request_id: str
    cancel_requested: bool
    cancelled_by: str = Field("", description="the operator who asked to cancel")
    lease_expires_at: datetime | None = Field(
        None, description="when the live lease runs out unless renewed; null without one"
    )
    totals: TotalsOut
    attempts: list[AttemptOut]
    no_replay: bool = Field(default=False, description="submitted asking for no replay")
    budget: BudgetOut = Field(default_factory=BudgetOut)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @classmethod
    def of(cls, t: types_pb2.Task) -> TaskOut:
        return cls(
            task_id=t.task_id,
            goal=t.goal,
            status=_enum_word(types_pb2.TaskStatus, t.status, "TASK_STATUS_"),
            attempt=t.attempt,
            max_attempts=t.max_attempts,
            target=TargetOut(host_id=t.target.host_id, device_serial=t.target.device_serial),
            host_id=t.host_id,
            device_serial=t.device_serial,
            progress=ProgressOut.of(t.progress),
            result_summary=t.result_summary,
            created_at=_time(t.created_at, t.HasField("created_at")),
            updated_at=_time(t.updated_at, t.HasField("updated_at")),
            finished_at=_time(t.finished_at, t.HasField("finished_at")),
            lease_duration_s=_seconds(t.lease_duration, t.HasField("lease_duration")),
            deadline=_time(t.deadline, t.HasField("deadline")),
            client_request_id=t.client_request_id,
            cancel_requested=t.cancel_requested,
            no_replay=t.no_replay,
            cancelled_by=t.cancelled_by,
            lease_expires_at=_time(t.lease_expires_at, t.HasField("lease_expires_at")),
            totals=TotalsOut.of(t.totals),
            attempts=[AttemptOut.of(a) for a in t.attempts],
            budget=BudgetOut.of(t.budget),
        )


class TaskPage(BaseModel):
    """One page of tasks, newest first."""

    tasks: list[TaskOut]
    next_page_token: str = Field(description="pass as page_token for the next page; empty at end")


class ThinkingOut(BaseModel):
    """One block of model reasoning; `redacted` blocks have no text (the provider encrypted it)."""

    text: str
    redacted: bool


_THINKING_KIND_NAMES = {
    types_pb2.THINKING_KIND_NONE: "none",
    types_pb2.THINKING_KIND_FULL: "full",
    types_pb2.THINKING_KIND_SUMMARIZED: "summarized",
    types_pb2.THINKING_KIND_OMITTED: "omitted",
    types_pb2.THINKING_KIND_REDACTED: "redacted",
}
_RETRY_KIND_NAMES = {
    types_pb2.RETRY_KIND_NONE: "none",
    types_pb2.RETRY_KIND_FORCED_TOOL_CHOICE: "forced",
    types_pb2.RETRY_KIND_NUDGE: "nudge",
}


class OutcomeOut(BaseModel):
    """What executing a decision did, as the host reported it."""

    executed: bool
    error: str
    driver_output: str


class ScreenOut(BaseModel):
    """One screenshot of a step, served by the gateway from the cloud's artifact store."""

    phase: Literal["before", "after"]
    url: str = Field(description="GET it (same login) for the image bytes")
    content_type: str
    width: int
    height: int
    target: list[int] | None = Field(
        description="[left, top, right, bottom] of the element the action named; null if none"
    )

    @classmethod
    def of(cls, s: artifact_service_pb2.StepScreenshot) -> ScreenOut:
        phase: Literal["before", "after"] = (
            "before" if s.phase == artifact_service_pb2.SCREENSHOT_PHASE_BEFORE else "after"
        )
        t = s.marks.target
        return cls(
            phase=phase,
            url=f"/api/tasks/{s.task_id}/attempts/{s.attempt}/steps/{s.step_index}/screens/{phase}",
            content_type=s.content_type,
            width=s.width,
            height=s.height,
            target=[t.left, t.top, t.right, t.bottom] if s.marks.HasField("target") else None,
        )


class ResumedOut(BaseModel):
    """The kept model answer a decision went on from instead of asking the model again."""

    turn_id: str = Field(description='the provider\'s id of that answer ("" when it sent none)')
    position: int = Field(description="where it begins in the attempt's conversation (0-based)")
    answered_at: datetime | None = Field(
        None, description="when it was answered (its session store kept it); null: not known"
    )
    words: str = Field(description="the same, as the console shows it")


class DecisionOut(BaseModel):
    """One planning decision: what the model was asked, what it thought, what it chose."""

    decision_id: str
    host_id: str
    task_id: str
    attempt: int
    step_index: int
    provider: str
    model: str
    system_prompt: str
    user_prompt: str
    tool_name: str
    arguments: dict[str, Any] | None = Field(
        description="executable arguments (purpose/expected outcome removed); null if unparsable"
    )
    arguments_json: str
    action: dict[str, Any]
    rationale: str
    thinking: list[ThinkingOut]
    purpose: str
    expected_outcome: str
    usage: UsageOut
    latency_ms: float | None
    forced_retry: bool
    corrective_retries: int
    created_at: datetime | None
    planner_mode: str = Field(
        description='"compact" (the prompts were the whole request) or "session" (user_prompt '
        "is what this step added to the conversation the cloud keeps)"
    )
    thinking_kind: str = Field(
        description='"full thinking", "summarized thinking", "thinking omitted by the provider", '
        '"redacted thinking", "no thinking", or "thinking kind not recorded" (older decisions)'
    )
    retry_kind: str = Field(
        description='"none", "forced" (forced tool choice) or "nudge" (thinking kept, an '
        'instruction); "" for decisions recorded before the field existed'
    )
    output_truncated: bool = Field(
        description="an answer was cut off by the output token limit (the rationale says so)"
    )
    planner_transport: TransportName = Field(
        description='who called the model: "cloud" (Decide) or "direct" (the host, which '
        "shipped the decision from its outbox)"
    )
    outcome: OutcomeOut | None = Field(
        description="what executing it did, as the host reported it; null until reported"
    )
    screens: list[ScreenOut] = Field(
        default_factory=list, description="the step's screenshots in the cloud, before first"
    )
    verification: VerificationOut
    previous_step: str = Field(
        default="", description="this decision's judgement of the step before it, one line"
    )
    target: str = Field(default="", description="the semantic target of the element it names")
    flow_id: str = Field(
        default="", description="replayed step: its flow; the step that took over: the flow"
    )
    flow_step: int = 0
    replay_divergence: str = Field(
        default="", description="set on the step that took over from a replay: why"
    )
    flow_set_aside: str = Field(
        default="",
        description="set on the step the model took where a replay set its flow aside "
        "uncounted (a switch already set, the phone part-way through it): why",
    )
    resumed_from: ResumedOut | None = Field(
        default=None,
        description="set when the decision went on from an answer an earlier decision of the "
        "step kept (and was billed for) before failing on a write, instead of asking again; "
        "its rationale and thinking are that answer's",
    )

    @classmethod
    def of(cls, d: types_pb2.Decision) -> DecisionOut:
        try:
            parsed = json.loads(d.arguments_json) if d.arguments_json else {}
            arguments: dict[str, Any] | None = parsed if isinstance(parsed, dict) else None
        except ValueError:
            arguments = None
        latency = _seconds(d.latency, d.HasField("latency"))
        return cls(
            decision_id=d.decision_id,
            host_id=d.host_id,
            task_id=d.task_id,
            attempt=d.attempt,
            step_index=d.step_index,
            provider=d.provider,
            model=d.model,
            system_prompt=d.system_prompt,
            user_prompt=d.user_prompt,
            tool_name=d.tool_name,
            arguments=arguments,
            arguments_json=d.arguments_json,
            action=MessageToDict(d.action, preserving_proto_field_name=True),
            rationale=d.rationale,
            thinking=[ThinkingOut(text=b.text, redacted=b.redacted) for b in d.thinking],
            purpose=d.purpose,
            expected_outcome=d.expected_outcome,
            usage=UsageOut(
                input_tokens=d.usage.input_tokens,
                output_tokens=d.usage.output_tokens,
                cache_read_input_tokens=d.usage.cache_read_input_tokens,
                cache_creation_input_tokens=d.usage.cache_creation_input_tokens,
                thinking_tokens=d.usage.thinking_tokens,
                cost_usd=d.usage.cost_usd,
            ),
            latency_ms=None if latency is None else round(latency * 1000, 1),
            forced_retry=d.forced_retry,
            corrective_retries=d.corrective_retries,
            thinking_kind=thinking_word(_THINKING_KIND_NAMES.get(d.thinking_kind, "")),
            retry_kind=_RETRY_KIND_NAMES.get(d.retry_kind, ""),
            output_truncated=d.output_truncated,
            created_at=_time(d.created_at, d.HasField("created_at")),
            planner_mode=d.planner_mode or "compact",
            planner_transport=_enum_word(
                types_pb2.PlannerTransport, d.planner_transport, "PLANNER_TRANSPORT_"
            ),
            outcome=OutcomeOut(
                executed=d.outcome.executed,
                error=d.outcome.error,
                driver_output=d.outcome.driver_output,
            )
            if d.HasField("outcome")
            else None,
            verification=VerificationOut.of(d.verification),
            previous_step=(
                f"{_VERDICTS.get(d.previous_step.verdict, '')}: {d.previous_step.note}"
                if d.HasField("previous_step")
                else ""
            ),
            target=semantics(d.target) if d.HasField("target") else "",
            flow_id=d.flow_id,
            flow_step=d.flow_step,
            replay_divergence=d.replay_divergence,
            flow_set_aside=d.flow_set_aside,
            resumed_from=_resumed(d),
        )


def _resumed(d: types_pb2.Decision) -> ResumedOut | None:
    """`d.resumed_from` for a reader, by presence: an empty turn id is still a resumed one."""
    resumed = resumed_from_proto(d)
    if resumed is None:
        return None
    return ResumedOut(
        turn_id=resumed.turn_id,
        position=resumed.position,
        answered_at=resumed.answered_at,
        words=resumed.words(),
    )


class ConversationItemOut(BaseModel):
    """One item of a session-mode conversation, as a person reads it (no signatures or
    encrypted reasoning; sensitive text masked)."""

    seq: int
    kind: str = Field(
        description="observation, instruction, reasoning, assistant_text, tool_call, "
        "tool_result or checkpoint"
    )
    text: str
    tool_name: str
    arguments: dict[str, Any] | None
    call_id: str
    is_error: bool
    redacted: bool
    omitted: bool = Field(
        description="reasoning whose text the provider omitted (a signature or encrypted "
        "content only); not redacted"
    )
    provider: str

    @classmethod
    def of(cls, item: decision_log_service_pb2.ConversationItem) -> ConversationItemOut:
        try:
            parsed = json.loads(item.arguments_json) if item.arguments_json else None
        except ValueError:
            parsed = None
        return cls(
            seq=item.seq,
            kind=_enum_word(
                decision_log_service_pb2.ConversationItemKind,
                item.kind,
                "CONVERSATION_ITEM_KIND_",
            ),
            text=item.text,
            tool_name=item.tool_name,
            arguments=parsed if isinstance(parsed, dict) else None,
            call_id=item.call_id,
            is_error=item.is_error,
            redacted=item.redacted,
            omitted=item.omitted,
            provider=item.provider,
        )


class ConversationOut(BaseModel):
    """A session-mode attempt's whole conversation; empty for compact mode."""

    task_id: str
    attempt: int
    items: list[ConversationItemOut]


class FailedCallsOut(BaseModel):
    """The answered model calls of one attempt's decisions that failed: no decision is logged
    for them, yet the provider billed them, and the task's totals count them."""

    attempt: int
    decisions: int = Field(description="failed decisions whose calls these are")
    usage: UsageOut

    @classmethod
    def of(cls, f: decision_log_service_pb2.FailedCalls) -> FailedCallsOut:
        return cls(attempt=f.attempt, decisions=f.decisions, usage=UsageOut.of(f.usage))


class PrunedOut(BaseModel):
    """What the cloud's retention deleted of a task's decision log: the task's totals still
    count it."""

    decisions: int = Field(description="decisions deleted")
    failed_decisions: int = Field(description="failed decisions whose call records were deleted")
    pruned_at: datetime | None = Field(description="when the retention last deleted some")
    usage: UsageOut = Field(description="what the deleted rows cost")

    @classmethod
    def of(cls, p: decision_log_service_pb2.PrunedRecord) -> PrunedOut:
        return cls(
            decisions=p.decisions,
            failed_decisions=p.failed_decisions,
            pruned_at=_time(p.pruned_at, p.HasField("pruned_at")),
            usage=UsageOut.of(p.usage),
        )


class DecisionPage(BaseModel):
    """One page of decisions, by attempt then step."""

    decisions: list[DecisionOut]
    next_page_token: str
    failed_calls: list[FailedCallsOut] = Field(
        default_factory=list,
        description="per attempt, what its failed decisions' answered model calls cost (the "
        "same on every page): the decisions' usage plus these is the task's totals",
    )
    pruned: PrunedOut | None = Field(
        default=None,
        description="what the cloud's retention deleted of the task's log (every attempt's; "
        "the same on every page): with it the listed usage makes the task's totals; null when "
        "nothing was deleted",
    )


LeaseEventKindName = Literal[
    "unspecified",
    "assigned",
    "resumed",
    "revoked",
    "expired",
    "deadline_exceeded",
    "cancel_requested",
    "cancelled",
    "result",
    "requeued",
]


class LeaseEventOut(BaseModel):
    """One event of a task's lease history (renewals are summarised on the attempt)."""

    kind: LeaseEventKindName
    at: datetime | None
    attempt: int = Field(description="0 for an event before the first attempt")
    host_id: str
    device_serial: str
    operator: str = Field(description="who acted (cancels); empty otherwise")
    reason: str
    result_status: TaskStatusName
    task_status: TaskStatusName = Field(description="the task's status right after the event")

    @classmethod
    def of(cls, e: task_service_pb2.LeaseEvent) -> LeaseEventOut:
        return cls(
            kind=_enum_word(task_service_pb2.LeaseEventKind, e.kind, "LEASE_EVENT_KIND_"),
            at=_time(e.at, e.HasField("at")),
            attempt=e.attempt,
            host_id=e.host_id,
            device_serial=e.device_serial,
            operator=e.operator,
            reason=e.reason,
            result_status=_enum_word(types_pb2.TaskStatus, e.result_status, "TASK_STATUS_"),
            task_status=_enum_word(types_pb2.TaskStatus, e.task_status, "TASK_STATUS_"),
        )


class LeaseEventPage(BaseModel):
    """A task's whole lease history, oldest first."""

    events: list[LeaseEventOut]


class AttemptHistory(BaseModel):
    """The LLM history of one attempt, with the reason when it is empty."""

    attempt: int
    planner_transport: TransportName
    decisions: list[DecisionOut]
    empty_reason: str | None = Field(
        description="why there are no decisions: no step yet, or the direct transport"
    )
    verdicts: dict[str, int] = Field(
        default_factory=dict,
        description='steps the checker found "met", "not met", "unknown", and "unchecked"',
    )
    failed_calls: FailedCallsOut | None = Field(
        default=None,
        description="what the attempt's failed decisions' answered model calls cost (no "
        "decision is listed for them; the task's totals count them); null when none",
    )
    #: The attempt's step count as the cloud counted it, when `decisions` are only its
    #: newest (the task page's read); not part of the JSON API, which lists every step.
    logged: int | None = Field(default=None, exclude=True)


class TaskDetailOut(BaseModel):
    """A task with its attempts, its lease history and, per attempt, the decision log."""

    task: TaskOut
    events: list[LeaseEventOut] = Field(description="the lease history, oldest first")
    history: list[AttemptHistory]
    history_note: str | None = Field(description="why the whole history is empty, if it is")
    pruned: PrunedOut | None = Field(
        default=None,
        description="what the cloud's retention deleted of the task's log (the task's totals "
        "still count it); null when nothing was deleted",
    )
    outbox_notes: list[str] = Field(
        default_factory=list,
        description="hosts of this task that still hold decisions or screenshots in their "
        "outbox: the record here may be incomplete until they arrive",
    )
    decisions_next_page_token: str = Field(
        default="",
        description="empty when `history` holds every decision of the task; else `history` "
        "holds its first 5,000 and the rest follow this token: pass it as `page_token` to "
        "GET /api/tasks/{task_id}/decisions (every attempt, any page size)",
    )


class DeviceOut(BaseModel):
    """A phone on a host."""

    serial: str
    model: str
    state: DeviceStateName
    reason: str = Field(
        default="",
        description="why its host keeps the phone out of work though it is plugged in (its "
        "state is then offline); empty when the host names no trouble",
    )


class OutboxOut(BaseModel):
    """What a host still has to send the cloud (decisions, screenshots), as it last said."""

    items: int
    decisions: int
    refused: int = Field(description="items the cloud refused for good (kept on the host)")
    oldest_at: datetime | None = Field(description="when the oldest waiting item was written")
    reported_at: datetime | None

    @classmethod
    def of(cls, o: types_pb2.OutboxBacklog) -> OutboxOut:
        return cls(
            items=o.items,
            decisions=o.decisions,
            refused=o.refused,
            oldest_at=_time(o.oldest_at, o.HasField("oldest_at")),
            reported_at=_time(o.reported_at, o.HasField("reported_at")),
        )


class BusyPhoneOut(BaseModel):
    """A phone holding a task's live lease."""

    device_serial: str
    task_id: str
    attempt: int
    goal: str


class HostHoldOut(BaseModel):
    """Why the cloud gives a connected host no new task: a lease of it ran out while its
    stream stayed open, so it may be frozen (a paused VM or process)."""

    reason: str = Field(description="the hold in words, for operators")
    since: datetime | None = Field(description="when the lease ran out and the hold began")
    until: datetime | None = Field(
        description="when the hold ends by itself if the host stays silent; it ends earlier "
        "when the host sends anything, or when its stream ends"
    )
    task_id: str = Field(description="the task whose lease ran out")
    attempt: int

    @classmethod
    def of(cls, h: types_pb2.HostHold) -> HostHoldOut:
        return cls(
            reason=h.reason,
            since=_time(h.since, h.HasField("since")),
            until=_time(h.until, h.HasField("until")),
            task_id=h.task_id,
            attempt=h.attempt,
        )


class HostOut(BaseModel):
    """A host and its phones; `busy_phones` are those working on a task (the rest are idle)."""

    host_id: str
    connected: bool
    devices: list[DeviceOut]
    planner_transport: TransportName
    agent_version: str
    last_seen_at: datetime | None
    outbox: OutboxOut | None = Field(
        default=None, description="the host's outbox backlog; null when it never reported one"
    )
    busy_phones: list[BusyPhoneOut] = Field(default_factory=list)
    held_back: HostHoldOut | None = Field(
        default=None,
        description="why the cloud gives this host no new task now; null when it does",
    )
    stopping_since: datetime | None = Field(
        default=None,
        description="when the host said it is stopping (it takes no new task and hands back "
        "the ones it runs); null when it is not",
    )

    def busy(self, serial: str) -> BusyPhoneOut | None:
        """The task a phone works on, None when it is idle."""
        return next((b for b in self.busy_phones if b.device_serial == serial), None)

    @classmethod
    def of(cls, h: types_pb2.Host) -> HostOut:
        return cls(
            busy_phones=[
                BusyPhoneOut(
                    device_serial=b.device_serial, task_id=b.task_id, attempt=b.attempt, goal=b.goal
                )
                for b in h.busy_phones
            ],
            host_id=h.host_id,
            connected=h.connected,
            devices=[
                DeviceOut(
                    serial=d.serial,
                    model=d.model,
                    state=_enum_word(types_pb2.DeviceState, d.state, "DEVICE_STATE_"),
                    reason=d.reason,
                )
                for d in h.devices
            ],
            planner_transport=_enum_word(
                types_pb2.PlannerTransport, h.planner_transport, "PLANNER_TRANSPORT_"
            ),
            agent_version=h.agent_version,
            last_seen_at=_time(h.last_seen_at, h.HasField("last_seen_at")),
            outbox=OutboxOut.of(h.outbox) if h.HasField("outbox") else None,
            held_back=HostHoldOut.of(h.held_back) if h.HasField("held_back") else None,
            stopping_since=_time(h.stopping_since, h.HasField("stopping_since")),
        )


DispatchHoldName = Literal["unspecified", "provider_down", "key_refused", "daily_budget"]


class DispatchOut(BaseModel):
    """Whether the cloud hands out new tasks (it pauses while its model provider is down or
    refuses the key, or the fleet's daily budget is spent), and what holds them back, in parts
    a script can read beside the sentence."""

    paused: bool
    reason: str = Field(description="why dispatch is paused; empty when it is not")
    kind: DispatchHoldName = Field(
        "unspecified",
        description="what holds dispatch: provider_down, key_refused, daily_budget; "
        "unspecified when not paused (or a kind this console does not know)",
    )
    since: datetime | None = Field(None, description="when the hold began")
    seen_by: str = Field("", description="the replica that found the hold")
    lifted_by: str = Field("", description="what lifts the hold")
    next_probe_at: datetime | None = Field(
        None, description="when a replica probes the model provider next (its holds only)"
    )
    resumes_at: datetime | None = Field(
        None, description="when the hold ends by itself (the daily budget's: 00:00 UTC)"
    )

    @classmethod
    def of(cls, d: fleet_service_pb2.DispatchStatus) -> DispatchOut:
        return cls(
            paused=d.paused,
            reason=d.reason,
            kind=_enum_word(fleet_service_pb2.DispatchHoldKind, d.kind, "DISPATCH_HOLD_KIND_"),
            since=_time(d.since, d.HasField("since")),
            seen_by=d.seen_by,
            lifted_by=d.lifted_by,
            next_probe_at=_time(d.next_probe_at, d.HasField("next_probe_at")),
            resumes_at=_time(d.resumes_at, d.HasField("resumes_at")),
        )


class SpendRowOut(BaseModel):
    """Spending of one (UTC day, host, provider, model)."""

    day: str
    host_id: str
    provider: str
    model: str
    decisions: int
    usage: UsageOut

    @classmethod
    def of(cls, r: fleet_service_pb2.SpendRow) -> SpendRowOut:
        return cls(
            day=r.day,
            host_id=r.host_id,
            provider=r.provider,
            model=r.model,
            decisions=r.decisions,
            usage=UsageOut.of(r.usage),
        )


class SpendOut(BaseModel):
    """Today's fleet spending (UTC) against the fleet's daily caps; `rows` per day, host and
    model when a range was asked for (empty otherwise)."""

    today: UsageOut
    daily_budget: BudgetOut
    rows: list[SpendRowOut] = Field(default_factory=list)

    @classmethod
    def of(cls, s: fleet_service_pb2.GetSpendResponse, *, rows: bool = False) -> SpendOut:
        return cls(
            today=UsageOut.of(s.today),
            daily_budget=BudgetOut.of(s.daily_budget),
            rows=[SpendRowOut.of(r) for r in s.rows] if rows else [],
        )


class HostList(BaseModel):
    """Hosts, connected first, and whether new tasks are handed out."""

    hosts: list[HostOut]
    dispatch: DispatchOut


class HostPage(HostList):
    """One page of hosts, by id, and whether new tasks are handed out."""

    next_page_token: str = Field(description="pass as page_token for the next page; empty at end")


#: Which hosts a fleet listing keeps: either, those connected now (an open Lease stream that
#: a cloud replica vouches for), those not connected now.
HostConnectionFilter = Literal["any", "connected", "disconnected"]
HOST_CONNECTIONS: tuple[HostConnectionFilter, ...] = get_args(HostConnectionFilter)


def host_connection_value(word: HostConnectionFilter) -> fleet_service_pb2.HostConnection.ValueType:
    """`disconnected` → HOST_CONNECTION_DISCONNECTED ("any": unspecified), for filters."""
    if word == "any":
        return fleet_service_pb2.HOST_CONNECTION_UNSPECIFIED
    return fleet_service_pb2.HostConnection.Value("HOST_CONNECTION_" + word.upper())


def _unencodable(value: object) -> bool:
    """Whether `value` holds text that is not Unicode (a lone surrogate such as "\\ud800",
    which JSON can spell but neither UTF-8 nor protobuf can carry)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_unencodable(k) or _unencodable(v) for k, v in value.items())
    return False


class RequestIn(BaseModel):
    """A request body: its text must be Unicode, else 422 naming the field (not a 500 when it
    is encoded for the cloud); its whole numbers JSON integers (`webui.numbers`); and no field
    the API does not take (a misspelt "max_attempt" was dropped, the task queued with the
    cloud's default as if the script's request had been followed)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _unicode_only(cls, value: object) -> object:
        if _unencodable(value):
            raise ValueError("not valid Unicode text (a lone surrogate)")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _integers_only(cls, value: object, info: ValidationInfo) -> object:
        """Lax mode took a string ("1_0": 10, "+3": 3) or a float (3.0) for an int field."""
        field = cls.model_fields.get(info.field_name or "")
        wanted = field is not None and takes_int(field.annotation)
        if wanted and not (isinstance(value, int) and not isinstance(value, bool)):
            raise ValueError(f"{NOT_WHOLE} (a JSON integer)")
        return value


class BudgetIn(RequestIn):
    """A task's spending caps, as `budget` reads in a task's answer (the cloud checks them)."""

    max_tokens: int = Field(default=0, ge=-INT64_MAX - 1, le=INT64_MAX)
    max_cost_usd: float = Field(default=0.0, allow_inf_nan=False)

    def to_proto(self) -> types_pb2.TaskBudget:
        return types_pb2.TaskBudget(max_tokens=self.max_tokens, max_cost_usd=self.max_cost_usd)


class SubmitIn(RequestIn):
    """A task to queue. Limits are the cloud's to enforce; it answers 422 with its reason. The
    bounds here only keep out what cannot even be sent to it (beyond int32, NaN, infinity), so
    an ordinary wrong value (-5 s, 50 attempts) still gets the cloud's message naming its range."""

    goal: str
    host_id: str = ""
    device_serial: str = ""
    max_attempts: int = Field(
        default=0, ge=-INT32_MAX - 1, le=INT32_MAX, description="0: the server default"
    )
    lease_duration_s: float | None = Field(
        default=None,
        ge=-MAX_SECONDS,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="unset: default",
    )
    timeout_s: float | None = Field(
        default=None,
        ge=-MAX_SECONDS,
        le=MAX_SECONDS,
        allow_inf_nan=False,
        description="unset: default",
    )
    client_request_id: str = Field(default="", description="idempotency key")
    secrets: dict[str, str] = Field(
        default_factory=dict,
        description="secret parameters, name → value, that the goal names as {{secret:NAME}}; "
        "write-only: no answer or page ever shows a value",
    )
    no_replay: bool = Field(default=False, description="plan every step with the model")
    budget: BudgetIn | None = Field(
        default=None, description="the task's spending caps; unset or 0: the cloud's default"
    )

    validate_only: bool = Field(
        default=False, description="check only (limits and fleet): nothing is queued"
    )


class SubmitOut(BaseModel):
    """The queued task (null for validate_only); `deduplicated` when client_request_id matched
    an earlier one; `warnings` the cloud's words about the request (an unknown target: the task
    may wait; a goal that looks like it holds a credential), the task queued anyway."""

    task: TaskOut | None
    deduplicated: bool
    warnings: list[str] = Field(default_factory=list)


class CancelIn(RequestIn):
    """Why the operator cancels."""

    reason: str = ""


class FieldErrorOut(BaseModel):
    """One problem of an invalid request: where (e.g. ["body", "max_attempts"]) and what."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(BaseModel):
    """An error, with the cloud's own message when it came from the cloud; an invalid request
    also lists each problem (`detail` names them all on one line)."""

    detail: str
    grpc_code: str | None = None
    errors: list[FieldErrorOut] | None = None


class HealthOut(BaseModel):
    """The gateway is up; `cloud` is the cloud's gRPC health or the error reaching it."""

    status: Literal["ok"]
    cloud: str
    open_streams: int


FlowStatusName = Literal["active", "disabled", "retired", "unspecified"]
#: The statuses a flow filter takes: `unspecified` is only how a status this console does not
#: know reads; as a filter the cloud refused it as "statuses: unknown value 0".
FlowStatusFilter = Literal["active", "disabled", "retired"]


def flow_status_value(name: str) -> types_pb2.FlowStatus.ValueType:
    """ "disabled" → FLOW_STATUS_DISABLED (an unknown word is UNSPECIFIED, which the cloud
    refuses with its own message)."""
    return types_pb2.FlowStatus.Value(f"FLOW_STATUS_{name.upper()}")


class FlowStepOut(BaseModel):
    """One step of a learned flow."""

    index: int
    tool_name: str
    target: str = Field(description="its semantic target in words; empty when it names none")
    text_parameter: str = Field(description="the goal parameter it types, if any")
    purpose: str
    expected_outcome: str
    verdict: VerdictWord = Field(description="the checker's verdict in the run it came from")
    page_before: str
    page_after: str
    divergences: int = Field(description="how often a replay diverged at this step")


class FlowOut(BaseModel):
    """A learned flow with its counts."""

    flow_id: str
    status: FlowStatusName
    status_reason: str
    goal_template: str
    apps: list[str]
    completion: str
    source_task_id: str
    source_attempt: int
    uses: int
    replays_completed: int
    divergences: int
    consecutive_divergences: int
    last_divergence: str
    created_at: datetime | None
    updated_at: datetime | None
    steps: list[FlowStepOut]

    @classmethod
    def of(cls, f: types_pb2.Flow) -> FlowOut:
        return cls(
            flow_id=f.flow_id,
            status=_enum_word(types_pb2.FlowStatus, f.status, "FLOW_STATUS_"),
            status_reason=f.status_reason,
            goal_template=f.goal_template,
            apps=list(f.apps),
            completion=f.completion,
            source_task_id=f.source_task_id,
            source_attempt=f.source_attempt,
            uses=f.uses,
            replays_completed=f.replays_completed,
            divergences=f.divergences,
            consecutive_divergences=f.consecutive_divergences,
            last_divergence=f.last_divergence,
            created_at=_time(f.created_at, f.HasField("created_at")),
            updated_at=_time(f.updated_at, f.HasField("updated_at")),
            steps=[
                FlowStepOut(
                    index=s.index,
                    tool_name=s.tool_name,
                    target=semantics(s.target) if s.HasField("target") else "",
                    text_parameter=s.text_parameter,
                    purpose=s.purpose,
                    expected_outcome=s.expected_outcome,
                    verdict=_VERDICTS.get(s.verdict, ""),
                    page_before=s.page_before,
                    page_after=s.page_after,
                    divergences=f.divergences_by_step.get(s.index, 0),
                )
                for s in f.steps
            ],
        )


class FlowPage(BaseModel):
    """One page of learned flows, newest first."""

    flows: list[FlowOut]
    next_page_token: str


class FlowStatusIn(RequestIn):
    """Turn a flow off (active false) or on again."""

    active: bool
    reason: str = ""
