"""JSON shapes of the console API, and their translation from the amc.v1 messages.

The API is the gRPC contract in JSON clothes: names follow the protos, enums become lower-case
words ("running", "cloud"), timestamps ISO 8601, durations seconds. Nothing is computed here that
the cloud did not say, except the one presentation hint `history_note` (why a history is empty).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, Field

from amc.v1 import decision_log_service_pb2, fleet_service_pb2, types_pb2
from planner.decision import thinking_word

TaskStatusName = Literal[
    "unspecified", "queued", "assigned", "running", "succeeded", "failed", "cancelled"
]
StepStatusName = Literal["unspecified", "perceiving", "planning", "acting", "succeeded", "failed"]
TransportName = Literal["unspecified", "direct", "cloud"]
DeviceStateName = Literal["unspecified", "online", "offline", "unauthorized"]

TASK_STATUSES: tuple[TaskStatusName, ...] = (
    "queued",
    "assigned",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


def _enum_word(enum: Any, value: int, prefix: str) -> Any:
    """`TASK_STATUS_RUNNING` → `running`; an unknown number (a newer server) → `unspecified`."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return "unspecified"
    return name.removeprefix(prefix).lower()


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
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_input_tokens
            + self.cache_creation_input_tokens
        )

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


class AttemptOut(BaseModel):
    """One lease on one phone."""

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
    usage: UsageOut = Field(
        default_factory=UsageOut, description="this attempt's decisions (cloud transport)"
    )

    @classmethod
    def of(cls, a: types_pb2.Attempt) -> AttemptOut:
        return cls(
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
    attempts: list[AttemptOut]
    budget: BudgetOut = Field(default_factory=BudgetOut)
    usage: UsageOut = Field(
        default_factory=UsageOut, description="every decision of the task (cloud transport)"
    )

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
            attempts=[AttemptOut.of(a) for a in t.attempts],
            budget=BudgetOut.of(t.budget),
            usage=UsageOut.of(t.usage),
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


class DecisionPage(BaseModel):
    """One page of decisions, by attempt then step."""

    decisions: list[DecisionOut]
    next_page_token: str


class AttemptHistory(BaseModel):
    """The LLM history of one attempt, with the reason when it is empty."""

    attempt: int
    planner_transport: TransportName
    decisions: list[DecisionOut]
    empty_reason: str | None = Field(
        description="why there are no decisions: no step yet, or the direct transport"
    )


class TaskDetailOut(BaseModel):
    """A task with its attempts and, per attempt, the decision log."""

    task: TaskOut
    history: list[AttemptHistory]
    history_note: str | None = Field(description="why the whole history is empty, if it is")


class DeviceOut(BaseModel):
    """A phone on a host."""

    serial: str
    model: str
    state: DeviceStateName


class HostOut(BaseModel):
    """A host and its phones."""

    host_id: str
    connected: bool
    devices: list[DeviceOut]
    planner_transport: TransportName
    agent_version: str
    last_seen_at: datetime | None

    @classmethod
    def of(cls, h: types_pb2.Host) -> HostOut:
        return cls(
            host_id=h.host_id,
            connected=h.connected,
            devices=[
                DeviceOut(
                    serial=d.serial,
                    model=d.model,
                    state=_enum_word(types_pb2.DeviceState, d.state, "DEVICE_STATE_"),
                )
                for d in h.devices
            ],
            planner_transport=_enum_word(
                types_pb2.PlannerTransport, h.planner_transport, "PLANNER_TRANSPORT_"
            ),
            agent_version=h.agent_version,
            last_seen_at=_time(h.last_seen_at, h.HasField("last_seen_at")),
        )


class DispatchOut(BaseModel):
    """Whether the cloud hands out new tasks (it pauses while its model provider is down)."""

    paused: bool
    reason: str = Field(description="why dispatch is paused; empty when it is not")

    @classmethod
    def of(cls, d: fleet_service_pb2.DispatchStatus) -> DispatchOut:
        return cls(paused=d.paused, reason=d.reason)


class SpendOut(BaseModel):
    """Today's fleet spending (UTC) against the fleet's daily caps."""

    today: UsageOut
    daily_budget: BudgetOut

    @classmethod
    def of(cls, s: fleet_service_pb2.GetSpendResponse) -> SpendOut:
        return cls(today=UsageOut.of(s.today), daily_budget=BudgetOut.of(s.daily_budget))


class HostList(BaseModel):
    """Hosts, connected first, and whether new tasks are handed out."""

    hosts: list[HostOut]
    dispatch: DispatchOut


class SubmitIn(BaseModel):
    """A task to queue. Limits are the cloud's to enforce; it answers 422 with its reason."""

    goal: str
    host_id: str = ""
    device_serial: str = ""
    max_attempts: int = Field(default=0, description="0 means the server default")
    lease_duration_s: float | None = Field(default=None, description="unset: server default")
    timeout_s: float | None = Field(default=None, description="unset: server default")
    client_request_id: str = Field(default="", description="idempotency key")


class SubmitOut(BaseModel):
    """The queued task; `deduplicated` when client_request_id matched an earlier one."""

    task: TaskOut
    deduplicated: bool


class CancelIn(BaseModel):
    """Why the operator cancels."""

    reason: str = ""


class ErrorOut(BaseModel):
    """An error, with the cloud's own message when it came from the cloud."""

    detail: str
    grpc_code: str | None = None


class HealthOut(BaseModel):
    """The gateway is up; `cloud` is the cloud's gRPC health or the error reaching it."""

    status: Literal["ok"]
    cloud: str
    open_streams: int
