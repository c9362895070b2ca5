"""Rows to protobuf messages (the only place that knows both shapes)."""

from __future__ import annotations

import datetime as dt
import json

from google.protobuf import duration_pb2, timestamp_pb2

from amc.v1 import task_service_pb2, types_pb2
from cloud.store import hosts, states
from cloud.store.lease_events import EventKind
from cloud.store.leases.progress import truncate_summary
from cloud.store.leases.queries import BusyPhone
from cloud.store.models import AttemptRow, DecisionRow, FlowRow, HostRow, LeaseEventRow
from cloud.store.spend import Unsettled
from cloud.store.tasks import TaskView
from planner.convert import (
    mode_enum,
    provider_enum,
    retry_kind_to_proto,
    thinking_kind_to_proto,
    usage_to_proto,
)
from planner.decision import Usage
from planner.verify import disagree, verdict_to_proto

FLOW_STATUSES: dict[str, types_pb2.FlowStatus.ValueType] = {
    "active": types_pb2.FLOW_STATUS_ACTIVE,
    "disabled": types_pb2.FLOW_STATUS_DISABLED,
    "retired": types_pb2.FLOW_STATUS_RETIRED,
}

#: DecisionRow.planner_transport → the protocol's enum.
TRANSPORTS: dict[str, int] = {
    "cloud": types_pb2.PLANNER_TRANSPORT_CLOUD,
    "direct": types_pb2.PLANNER_TRANSPORT_DIRECT,
}


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def ts(value: dt.datetime) -> timestamp_pb2.Timestamp:
    """Aware datetime -> Timestamp (every renewal's answer carries one: the arithmetic here is
    a third of `Timestamp.FromDatetime`'s cost, with the same result; a naive datetime is
    taken as local time, as `astimezone` takes it)."""
    if value.tzinfo is None:
        value = value.astimezone(dt.UTC)
    since = value - _EPOCH
    return timestamp_pb2.Timestamp(
        seconds=since.days * 86_400 + since.seconds, nanos=since.microseconds * 1000
    )


def remaining(expires_at: dt.datetime, now: dt.datetime | None = None) -> duration_pb2.Duration:
    """Time left until `expires_at` from `now` (this replica's clock by default), never below
    zero: what a host counts its lease down from on its own monotonic clock, whatever its wall
    clock says (`Renewed.lease_remaining`, `Assignment.lease_remaining`)."""
    left = expires_at - (now or dt.datetime.now(dt.UTC))
    if left.days < 0:
        return duration_pb2.Duration()
    return duration_pb2.Duration(
        seconds=left.days * 86_400 + left.seconds, nanos=left.microseconds * 1000
    )


def duration(seconds: float) -> duration_pb2.Duration:
    """Seconds -> Duration."""
    out = duration_pb2.Duration()
    out.FromTimedelta(dt.timedelta(seconds=seconds))
    return out


def renew_interval(lease_seconds: float) -> duration_pb2.Duration:
    """How often a host renews a lease of this length: a third of it, so two lost renewals
    still leave the lease alive (Assignment.renew_interval)."""
    return duration(lease_seconds / 3)


def progress(row: AttemptRow | None) -> types_pb2.Progress | None:
    """The attempt's progress snapshot, or None when it never reported any."""
    if row is None or row.progress_updated_at is None:
        return None
    return types_pb2.Progress(
        step_index=row.step_index or 0,
        step_status=row.step_status or 0,  # type: ignore[arg-type]
        summary=row.summary or "",
        updated_at=ts(row.progress_updated_at),
        max_steps=row.max_steps or 0,
    )


def shown_progress(view: TaskView) -> types_pb2.Progress | None:
    """What a task shows of its progress: its live attempt's (none before its first renewal),
    its last reported step once it ended, and, queued again after an attempt ended, that it
    waits and why (step 0). A queued task showed the dead attempt's last step ("step 2 ·
    looking at the screen") as if it still ran; that step stays in the attempt's own record."""
    if view.task.status in states.TERMINAL:
        return progress(view.latest_progress_attempt())
    current = view.current_attempt()
    if current is None:
        return None
    if current.ended_at is None:
        return progress(current)
    why = current.failure_reason or current.result_summary or current.status.lower()
    return types_pb2.Progress(
        summary=truncate_summary(f"re-queued after attempt {current.attempt} ended: {why}"),
        updated_at=ts(current.ended_at),
    )


def attempt(row: AttemptRow, usage: Usage | None = None) -> types_pb2.Attempt:
    """One attempt as the API shows it, with what its decisions cost."""
    out = types_pb2.Attempt(
        attempt=row.attempt,
        host_id=row.host_id,
        device_serial=row.device_serial,
        status=states.to_proto(row.status),
        failure_reason=row.failure_reason or "",
        started_at=ts(row.started_at),
        planner_transport=row.planner_transport,  # type: ignore[arg-type]
        late_result=row.late_result,
    )
    p = progress(row)
    if p is not None:
        out.progress.CopyFrom(p)
    if row.ended_at is not None:
        out.ended_at.CopyFrom(ts(row.ended_at))
    else:
        out.lease_expires_at.CopyFrom(ts(row.lease_expires_at))
    out.renewals = row.renewals or 0
    if row.first_renewed_at is not None:
        out.first_renewed_at.CopyFrom(ts(row.first_renewed_at))
    if row.last_renewed_at is not None:
        out.last_renewed_at.CopyFrom(ts(row.last_renewed_at))
    if row.flow_reason is not None:
        out.flow.CopyFrom(
            types_pb2.FlowUse(
                flow_id=row.flow_id or "",
                score=row.flow_score or 0.0,
                scorer=row.flow_scorer or "",
                reason=row.flow_reason,
                steps_replayed=row.replay_steps or 0,
                diverged_at_step=row.replay_diverged_step or 0,
                divergence=row.replay_divergence or "",
            )
        )
    if usage is not None:
        out.usage.CopyFrom(usage_to_proto(usage))
    return out


def totals(view: TaskView, now: dt.datetime) -> types_pb2.TaskTotals:
    """What the task used over all its attempts, as of `now` (running times grow)."""
    t = view.task
    run_time = sum(((a.ended_at or now) - a.started_at).total_seconds() for a in view.attempts)
    out = types_pb2.TaskTotals(
        usage=types_pb2.Usage(
            input_tokens=t.input_tokens or 0,
            output_tokens=t.output_tokens or 0,
            cache_read_input_tokens=t.cache_read_tokens or 0,
            cache_creation_input_tokens=t.cache_write_tokens or 0,
            thinking_tokens=t.thinking_tokens or 0,
            cost_usd=t.cost_usd or 0.0,
        ),
        decisions=t.decision_count or 0,
        steps=sum(a.step_index or 0 for a in view.attempts),
        wall_time=duration(max(((t.finished_at or now) - t.created_at).total_seconds(), 0.0)),
        run_time=duration(max(run_time, 0.0)),
    )
    unsettled(out, view.unsettled)
    return out


def unsettled(totals: types_pb2.TaskTotals, calls: Unsettled) -> None:
    """Say the task's calls of unknown cost in `totals` (decision 0080); none: the field unset."""
    n, at_most = calls
    if n:
        totals.unsettled.calls = n
        totals.unsettled.at_most.CopyFrom(usage_to_proto(at_most))
    else:
        totals.ClearField("unsettled")


def task(view: TaskView, *, with_attempts: bool) -> types_pb2.Task:
    """A task; attempts only when asked (GetTask), progress always."""
    t = view.task
    out = types_pb2.Task(
        task_id=t.task_id,
        goal=t.goal,
        status=states.to_proto(t.status),
        attempt=t.attempt,
        max_attempts=t.max_attempts,
        target=types_pb2.TaskTarget(
            host_id=t.target_host_id or "", device_serial=t.target_device_serial or ""
        ),
        host_id=t.host_id or "",
        device_serial=t.device_serial or "",
        result_summary=t.result_summary or "",
        created_at=ts(t.created_at),
        updated_at=ts(t.updated_at),
        lease_duration=duration(t.lease_seconds),
        deadline=ts(t.deadline),
        client_request_id=t.client_request_id or "",
        cancel_requested=t.cancel_requested and t.status not in states.TERMINAL,
        no_replay=t.no_replay,
        cancelled_by=t.cancelled_by or "",
        totals=totals(view, dt.datetime.now(dt.UTC)),
        budget=types_pb2.TaskBudget(max_tokens=t.max_tokens, max_cost_usd=t.max_cost_usd),
    )
    if t.finished_at is not None:
        out.finished_at.CopyFrom(ts(t.finished_at))
    current = view.current_attempt()
    if current is not None and current.ended_at is None:
        out.lease_expires_at.CopyFrom(ts(current.lease_expires_at))
    p = shown_progress(view)
    if p is not None:
        out.progress.CopyFrom(p)
    if with_attempts:
        out.attempts.extend(attempt(a, view.usage.get(a.attempt)) for a in view.attempts)
    return out


def host(
    row: HostRow,
    connected: bool,
    busy: list[BusyPhone] | None = None,
    now: dt.datetime | None = None,
) -> types_pb2.Host:
    """A host with its phones, which of them work on a task (`busy`), and whether new work is
    held back from it at `now` (not looked at without it)."""
    out = types_pb2.Host(
        host_id=row.host_id,
        connected=connected,
        planner_transport=row.planner_transport,  # type: ignore[arg-type]
        agent_version=row.agent_version,
    )
    for d in row.devices or []:
        out.devices.append(
            types_pb2.Device(
                serial=str(d.get("serial", "")),
                model=str(d.get("model", "")),
                state=device_state(int(d.get("state", 0))),
                # Rows written before hosts said why a phone is kept out have no reason.
                reason=str(d.get("reason", "")),
            )
        )
    if row.last_seen_at is not None:
        out.last_seen_at.CopyFrom(ts(row.last_seen_at))
    if row.outbox_reported_at is not None:
        out.outbox.CopyFrom(
            types_pb2.OutboxBacklog(
                items=row.outbox_items,
                decisions=row.outbox_decisions,
                refused=row.outbox_refused,
                reported_at=ts(row.outbox_reported_at),
            )
        )
        if row.outbox_oldest_at is not None:
            out.outbox.oldest_at.CopyFrom(ts(row.outbox_oldest_at))
    hold = hosts.held(row, connected, now) if now is not None else None
    if hold is not None:
        out.held_back.CopyFrom(held_back(hold))
    stopping = hosts.stopping_since(row, connected)
    if stopping is not None:
        out.stopping_since.CopyFrom(ts(stopping))
    for b in busy or []:
        out.busy_phones.append(
            types_pb2.BusyPhone(
                device_serial=b.device_serial, task_id=b.task_id, attempt=b.attempt, goal=b.goal
            )
        )
    return out


def held_back(h: hosts.Held) -> types_pb2.HostHold:
    """Why new work is held back from a host, in words and in parts."""
    return types_pb2.HostHold(
        reason=f"a lease of it (task {h.task_id}, attempt {h.attempt}) ran out at "
        f"{h.since:%H:%M:%S} UTC while its stream stayed open: it may be frozen (a paused VM "
        f"or process); no new task until it sends anything, or until {h.until:%H:%M:%S} UTC",
        since=ts(h.since),
        until=ts(h.until),
        task_id=h.task_id,
        attempt=h.attempt,
    )


def verification(row: DecisionRow) -> types_pb2.StepVerification:
    """What is known about whether a decision reached its expected outcome."""
    return types_pb2.StepVerification(
        verdict=verdict_to_proto(row.verdict),
        evidence=row.verdict_evidence or "",
        checked_by_cloud=row.verdict_by_cloud,
        model=types_pb2.StepJudgement(
            verdict=verdict_to_proto(row.model_verdict), note=row.model_note or ""
        ),
        disagree=disagree(row.verdict, row.model_verdict),
    )


def flow(row: FlowRow, *, with_steps: bool = True) -> types_pb2.Flow:
    """A learned flow with its counts and status (its steps unless asked not to)."""
    out = types_pb2.Flow()
    out.ParseFromString(row.flow_pb)
    if not with_steps:
        out.ClearField("embedding_text")
    out.flow_id = row.flow_id
    out.status = FLOW_STATUSES.get(row.status, types_pb2.FLOW_STATUS_UNSPECIFIED)
    out.status_reason = row.status_reason
    out.source_task_id = row.source_task_id
    out.source_attempt = row.source_attempt
    out.embedding_text = row.embedding_text if with_steps else ""
    out.uses = row.uses
    out.replays_completed = row.replays_completed
    out.divergences = row.divergences
    out.consecutive_divergences = row.consecutive_divergences
    for step, count in (row.divergences_by_step or {}).items():
        out.divergences_by_step[int(step)] = int(count)
    out.last_divergence = row.last_divergence
    out.created_at.CopyFrom(ts(row.created_at))
    out.updated_at.CopyFrom(ts(row.updated_at))
    return out


_EVENT_KINDS = {
    EventKind.ASSIGNED: task_service_pb2.LEASE_EVENT_KIND_ASSIGNED,
    EventKind.RESUMED: task_service_pb2.LEASE_EVENT_KIND_RESUMED,
    EventKind.REVOKED: task_service_pb2.LEASE_EVENT_KIND_REVOKED,
    EventKind.EXPIRED: task_service_pb2.LEASE_EVENT_KIND_EXPIRED,
    EventKind.DEADLINE_EXCEEDED: task_service_pb2.LEASE_EVENT_KIND_DEADLINE_EXCEEDED,
    EventKind.CANCEL_REQUESTED: task_service_pb2.LEASE_EVENT_KIND_CANCEL_REQUESTED,
    EventKind.CANCELLED: task_service_pb2.LEASE_EVENT_KIND_CANCELLED,
    EventKind.RESULT: task_service_pb2.LEASE_EVENT_KIND_RESULT,
    EventKind.REQUEUED: task_service_pb2.LEASE_EVENT_KIND_REQUEUED,
}


def _status_or_unspecified(status: str | None) -> types_pb2.TaskStatus.ValueType:
    return states.to_proto(status) if status else types_pb2.TASK_STATUS_UNSPECIFIED


def lease_event(row: LeaseEventRow) -> task_service_pb2.LeaseEvent:
    """One event of a task's lease history (an unknown stored kind reads UNSPECIFIED)."""
    try:
        kind = _EVENT_KINDS[EventKind(row.kind)]
    except ValueError:
        kind = task_service_pb2.LEASE_EVENT_KIND_UNSPECIFIED
    return task_service_pb2.LeaseEvent(
        kind=kind,
        at=ts(row.at),
        attempt=row.attempt,
        host_id=row.host_id or "",
        device_serial=row.device_serial or "",
        operator=row.operator or "",
        reason=row.reason or "",
        result_status=_status_or_unspecified(row.result_status),
        task_status=_status_or_unspecified(row.task_status),
    )


#: Device.model at most (a longer one is cut: a host's report, not a reason to refuse it, and
#: every operator's ListHosts carries it).
DEVICE_MODEL_LIMIT = 128
#: Device.reason at most (cut like the model: a host's words about its phone, shown to every
#: operator, never a reason to refuse the host's report).
DEVICE_REASON_LIMIT = 1024
#: HostHello.agent_version is kept to this many characters (the hosts column's size).
AGENT_VERSION_LIMIT = 128


#: The phone states this cloud's contract names.
_DEVICE_STATES = frozenset(types_pb2.DeviceState.values())


def device_state(value: int) -> types_pb2.DeviceState.ValueType:
    """A phone's reported state as stored and served. A number the contract does not name (a
    newer host's: proto3 enums are open) is UNSPECIFIED, as a progress's unknown step status
    is: kept as it came, it reached every operator's ListHosts, and readers that name states
    (`amc host list`) failed on it. Either way the phone gets no task (only ONLINE ones do)."""
    if value in _DEVICE_STATES:
        return types_pb2.DeviceState.ValueType(value)
    return types_pb2.DEVICE_STATE_UNSPECIFIED


def device_dicts(devices: list[types_pb2.Device]) -> list[dict[str, object]]:
    """Devices as stored in the hosts table."""
    return [
        {
            "serial": d.serial,
            "model": d.model[:DEVICE_MODEL_LIMIT],
            "state": int(device_state(d.state)),
            "reason": d.reason[:DEVICE_REASON_LIMIT],
        }
        for d in devices
    ]


def decision(row: DecisionRow, *, include_observation: bool = False) -> types_pb2.Decision:
    """One logged decision (with the screen it was made on when asked and kept)."""
    out = types_pb2.Decision(
        decision_id=row.decision_id,
        host_id=row.host_id,
        task_id=row.task_id,
        attempt=row.attempt,
        step_index=row.step_index,
        provider=row.provider,
        model=row.model,
        system_prompt=row.system_prompt,
        user_prompt=row.user_prompt,
        tool_name=row.tool_name,
        arguments_json=row.arguments_json,
        rationale=row.rationale or "",
        purpose=row.purpose,
        expected_outcome=row.expected_outcome,
        usage=types_pb2.Usage(
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cache_read_input_tokens=row.cache_read_input_tokens,
            cache_creation_input_tokens=row.cache_creation_input_tokens,
            thinking_tokens=row.thinking_tokens,
            cost_usd=row.cost_usd,
            cache_creation_1h_input_tokens=row.cache_creation_1h_input_tokens,
        ),
        latency=duration(row.latency_seconds),
        forced_retry=row.forced_retry,
        created_at=ts(row.created_at),
        corrective_retries=row.corrective_retries,
        planner_mode=row.planner_mode,
        model_provider=provider_enum(row.provider),
        mode=mode_enum(row.planner_mode),
        thinking_kind=thinking_kind_to_proto(row.thinking_kind),
        retry_kind=retry_kind_to_proto(row.retry_kind),
        output_truncated=row.output_truncated,
        planner_transport=TRANSPORTS.get(row.planner_transport, 0),  # type: ignore[arg-type]
    )
    if row.outcome_executed is not None:
        out.outcome.CopyFrom(
            types_pb2.ActionOutcome(
                step_index=row.step_index,
                executed=row.outcome_executed,
                error=row.outcome_error or "",
                driver_output=row.outcome_driver_output or "",
                # The host's own check only (a check the cloud ran is in `verification`).
                verdict=types_pb2.VERDICT_UNSPECIFIED
                if row.verdict_by_cloud
                else verdict_to_proto(row.verdict),
                evidence="" if row.verdict_by_cloud else (row.verdict_evidence or ""),
            )
        )
    if row.verdict is not None or row.model_verdict is not None:
        out.verification.CopyFrom(verification(row))
    if row.previous_verdict is not None:
        out.previous_step.CopyFrom(
            types_pb2.StepJudgement(
                verdict=verdict_to_proto(row.previous_verdict), note=row.previous_note or ""
            )
        )
    if row.target_pb:
        out.target.ParseFromString(row.target_pb)
    out.flow_id = row.flow_id or ""
    out.flow_step = row.flow_step or 0
    out.replay_divergence = row.replay_divergence or ""
    out.flow_set_aside = row.flow_set_aside or ""
    if row.resumed_position is not None:
        out.resumed_from.CopyFrom(
            types_pb2.ResumedTurn(turn_id=row.resumed_turn_id or "", position=row.resumed_position)
        )
        if row.resumed_answered_at is not None:
            out.resumed_from.answered_at.CopyFrom(ts(row.resumed_answered_at))
    if row.action_pb:
        out.action.ParseFromString(row.action_pb)
    if include_observation and row.observation_pb:
        out.observation.ParseFromString(row.observation_pb)
    for block in row.thinking or []:
        out.thinking.append(
            types_pb2.ThinkingBlock(
                text=str(block.get("text", "")), redacted=bool(block.get("redacted", False))
            )
        )
    # Keep arguments_json canonical even for rows written by older code.
    if row.arguments_json:
        out.arguments_json = json.dumps(json.loads(row.arguments_json), ensure_ascii=False)
    return out
