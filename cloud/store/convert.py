"""Rows to protobuf messages (the only place that knows both shapes)."""

from __future__ import annotations

import datetime as dt
import json

from google.protobuf import duration_pb2, timestamp_pb2

from amc.v1 import types_pb2
from cloud.store import states
from cloud.store.models import AttemptRow, DecisionRow, HostRow
from cloud.store.tasks import TaskView
from planner.convert import (
    mode_enum,
    provider_enum,
    retry_kind_to_proto,
    thinking_kind_to_proto,
    usage_to_proto,
)
from planner.decision import Usage


def ts(value: dt.datetime) -> timestamp_pb2.Timestamp:
    """Aware datetime -> Timestamp."""
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(value.astimezone(dt.UTC))
    return out


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
    )
    p = progress(row)
    if p is not None:
        out.progress.CopyFrom(p)
    if row.ended_at is not None:
        out.ended_at.CopyFrom(ts(row.ended_at))
    else:
        out.lease_expires_at.CopyFrom(ts(row.lease_expires_at))
    if usage is not None:
        out.usage.CopyFrom(usage_to_proto(usage))
    return out


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
        budget=types_pb2.TaskBudget(max_tokens=t.max_tokens, max_cost_usd=t.max_cost_usd),
        usage=usage_to_proto(view.total_usage()),
    )
    if t.finished_at is not None:
        out.finished_at.CopyFrom(ts(t.finished_at))
    p = progress(view.latest_progress_attempt())
    if p is not None:
        out.progress.CopyFrom(p)
    if with_attempts:
        out.attempts.extend(attempt(a, view.usage.get(a.attempt)) for a in view.attempts)
    return out


def host(row: HostRow, connected: bool) -> types_pb2.Host:
    """A host with its phones."""
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
                state=int(d.get("state", 0)),  # type: ignore[arg-type]
            )
        )
    if row.last_seen_at is not None:
        out.last_seen_at.CopyFrom(ts(row.last_seen_at))
    return out


def device_dicts(devices: list[types_pb2.Device]) -> list[dict[str, object]]:
    """Devices as stored in the hosts table."""
    return [{"serial": d.serial, "model": d.model, "state": int(d.state)} for d in devices]


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
    )
    if row.outcome_executed is not None:
        out.outcome.CopyFrom(
            types_pb2.ActionOutcome(
                step_index=row.step_index,
                executed=row.outcome_executed,
                error=row.outcome_error or "",
                driver_output=row.outcome_driver_output or "",
            )
        )
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
