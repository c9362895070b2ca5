"""The lease protocol's messages, built from what the lease store returns (and the other way).

The store answers in its own types (`leases.Claimed`, `leases.HeldCheck`, `leases.Revocation`);
this is the one place that turns them into `LeaseResponse`s and a host's progress into the
store's `ProgressIn`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TypeAlias

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.store import convert, hosts, leases, states
from planner.convert import usage_to_proto

RevokeReason: TypeAlias = lease_pb.RevokeReason.ValueType

_REVOKE_REASONS: dict[leases.Revocation, RevokeReason] = {
    leases.Revocation.UNKNOWN: lease_pb.REVOKE_REASON_UNKNOWN,
    leases.Revocation.SUPERSEDED: lease_pb.REVOKE_REASON_SUPERSEDED,
    leases.Revocation.NOT_YOURS: lease_pb.REVOKE_REASON_PERMISSION_DENIED,
    leases.Revocation.CANCELLED: lease_pb.REVOKE_REASON_CANCELLED,
    leases.Revocation.EXPIRED: lease_pb.REVOKE_REASON_EXPIRED,
    leases.Revocation.DEADLINE_EXCEEDED: lease_pb.REVOKE_REASON_DEADLINE_EXCEEDED,
    leases.Revocation.FINISHED: lease_pb.REVOKE_REASON_FINISHED,
    # Released by a newer process of the host (or a revocation): the nearest reason there is.
    leases.Revocation.RELEASED: lease_pb.REVOKE_REASON_SUPERSEDED,
}

#: What a host is told when the sweeper ended its attempt.
_SWEPT: dict[leases.Revocation, str] = {
    leases.Revocation.EXPIRED: "lease expired",
    leases.Revocation.DEADLINE_EXCEEDED: states.DEADLINE_EXCEEDED,
}


def transport_in(hello: lease_pb.HostHello) -> int:
    """The hello's planner transport, UNSPECIFIED read as CLOUD (types.proto says why: a host
    that does not say plans through Decide, as one built from proto/ alone does)."""
    if hello.planner_transport == types_pb2.PLANNER_TRANSPORT_UNSPECIFIED:
        return types_pb2.PLANNER_TRANSPORT_CLOUD
    return int(hello.planner_transport)


def revoke_reason(revocation: leases.Revocation) -> RevokeReason:
    """The protocol's RevokeReason for the store's reason."""
    return _REVOKE_REASONS[revocation]


def swept_message(revocation: leases.Revocation) -> str:
    """The message of a Revoked sent because the sweeper ended the attempt."""
    return _SWEPT.get(revocation, "cancelled")


#: Progress.max_steps at most (the contract's limit; a larger one is stored as this).
MAX_STEPS = 10_000
#: Built once: `StepStatus.values()` makes a new list on every call (every renewal's progress).
_STEP_STATUSES = frozenset(types_pb2.StepStatus.values())


def progress_in(progress: types_pb2.Progress) -> leases.ProgressIn:
    """A host's progress as the store writes it: the summary cut to its limit, and numbers out
    of the contract's ranges brought into them rather than refused (a renewal refused for its
    progress would cost the host its lease; a result, its finished work). A step status this
    cloud does not know (a newer host's; proto3 enums are open) is kept as UNSPECIFIED."""
    status = int(progress.step_status)
    steps = progress.max_steps
    return leases.ProgressIn(
        max(progress.step_index, 0),
        status if status in _STEP_STATUSES else types_pb2.STEP_STATUS_UNSPECIFIED,
        leases.truncate_summary(progress.summary),
        min(steps, MAX_STEPS) if steps > 0 else None,
    )


def replay_in(report: types_pb2.FlowReplayReport) -> leases.ReplayIn:
    """A host's replay report as the store writes it (ids and reasons cut to their columns)."""
    return leases.ReplayIn(
        flow_id=report.flow_id[:32],
        steps_replayed=max(0, report.steps_replayed),
        diverged_at=max(0, report.diverged_at_step) if report.diverged else 0,
        reason=report.reason[:512],
        completed=report.completed if report.HasField("completed") else None,
    )


def revoked(
    task_id: str, attempt: int, lease_id: str, reason: int, message: str, task_status: str = ""
) -> lease_pb.LeaseResponse:
    """Tell the host to stop an attempt (`reason`: a RevokeReason number, as events carry it;
    `task_status` the stored name, "" when the host is not to know it)."""
    return lease_pb.LeaseResponse(
        revoked=lease_pb.Revoked(
            task_id=task_id,
            attempt=attempt,
            lease_id=lease_id,
            reason=lease_pb.RevokeReason.ValueType(reason),
            message=message,
            task_status=states.to_proto(task_status)
            if task_status
            else types_pb2.TASK_STATUS_UNSPECIFIED,
        )
    )


def rejected(message: str, task_id: str = "") -> lease_pb.LeaseResponse:
    """A host message the cloud cannot use (INVALID_ARGUMENT; `message` names the field)."""
    return lease_pb.LeaseResponse(
        rejected=lease_pb.Rejected(
            code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=message, task_id=task_id
        )
    )


def refused(
    task_id: str,
    attempt: int,
    lease_id: str,
    revocation: leases.Revocation | None,
    message: str,
    task_status: str = "",
) -> lease_pb.LeaseResponse:
    """A renewal, result or held assignment the store refused, as a Revoked."""
    reason = lease_pb.REVOKE_REASON_UNSPECIFIED if revocation is None else revoke_reason(revocation)
    return revoked(task_id, attempt, lease_id, reason, message, task_status)


def assignment(
    claimed: leases.Claimed,
    secrets: Mapping[str, str] | None = None,
    flows: Sequence[types_pb2.Flow] = (),
) -> lease_pb.LeaseResponse:
    """A fresh lease for the host, with the task's secrets opened (for the lease holder only)
    and the learned flows retrieval chose for it (best first)."""
    a = lease_pb.Assignment(
        task_id=claimed.task_id,
        attempt=claimed.attempt,
        lease_id=claimed.lease_id,
        device_serial=claimed.device_serial,
        goal=claimed.goal,
        lease_expires_at=convert.ts(claimed.lease_expires_at),
        lease_remaining=convert.remaining(claimed.lease_expires_at),
        lease_duration=convert.duration(claimed.lease_seconds),
        deadline=convert.ts(claimed.deadline),
        deadline_remaining=convert.remaining(claimed.deadline),
        resumed=False,
        renew_interval=convert.renew_interval(claimed.lease_seconds),
        secrets=secrets or {},
        budget=types_pb2.TaskBudget(
            max_tokens=claimed.max_tokens, max_cost_usd=claimed.max_cost_usd
        ),
        spent=usage_to_proto(claimed.spent),
    )
    p = convert.progress(claimed.last_progress)
    if p is not None:
        a.last_progress.CopyFrom(p)
    if flows:
        a.flow.CopyFrom(flows[0])
        a.alternatives.extend(flows[1:])
    return lease_pb.LeaseResponse(assignment=a)


def resumed(check: leases.HeldCheck) -> lease_pb.LeaseResponse:
    """A held assignment that is still the host's live lease, confirmed after its reconnect.
    No flows: the host is still running the attempt with the ones it was handed."""
    live, task = check.live, check.task
    assert live is not None and task is not None, "only a live held assignment resumes"
    a = lease_pb.Assignment(
        task_id=live.task_id,
        attempt=live.attempt,
        lease_id=live.lease_id,
        device_serial=live.device_serial,
        goal=task.goal,
        lease_expires_at=convert.ts(live.lease_expires_at),
        lease_remaining=convert.remaining(live.lease_expires_at),
        lease_duration=convert.duration(task.lease_seconds),
        deadline=convert.ts(task.deadline),
        deadline_remaining=convert.remaining(task.deadline),
        resumed=True,
        renew_interval=convert.renew_interval(task.lease_seconds),
        budget=types_pb2.TaskBudget(max_tokens=task.max_tokens, max_cost_usd=task.max_cost_usd),
    )
    p = convert.progress(check.last_progress)
    if p is not None:
        a.last_progress.CopyFrom(p)
    return lease_pb.LeaseResponse(assignment=a)


#: OutboxBacklog counts at most (a larger one is stored as this).
MAX_OUTBOX = 100_000_000
_MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z


def backlog_in(backlog: types_pb2.OutboxBacklog) -> hosts.Backlog:
    """A host's outbox report as the store keeps it (`reported_at` is the cloud's own).

    A report is shown to operators, never a reason to refuse a host (in its hello that would
    cost it its Welcome): counts are brought within 0 to `MAX_OUTBOX` and `decisions` within
    `items`, and an `oldest_at` at or before 1970-01-01 (a client's zero time: Go's year 1,
    JavaScript's epoch) or beyond 9999 is read as unset."""
    items = _count(backlog.items)
    ts = backlog.oldest_at
    oldest = (
        ts.ToDatetime(tzinfo=dt.UTC)
        if backlog.HasField("oldest_at")
        and 0 < ts.seconds <= _MAX_TIMESTAMP_S
        and 0 <= ts.nanos < 1_000_000_000
        else None
    )
    return hosts.Backlog(
        items, min(_count(backlog.decisions), items), _count(backlog.refused), oldest
    )


def _count(value: int) -> int:
    return min(max(value, 0), MAX_OUTBOX)
