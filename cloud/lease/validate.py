"""Checks of host messages. Each returns None or a message that names the offending field.

Text that cannot be stored at all (NUL characters, invalid UTF-8) never gets here: `cloud.wire`
refuses it as the message is parsed (or, for summaries, replaces the NULs)."""

from __future__ import annotations

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2

MAX_DEVICES = 256
MAX_ID = 128
MAX_STEPS = 10_000  # Progress.max_steps
_TERMINAL = (
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_CANCELLED,
)


def _devices(devices: list[types_pb2.Device], field: str) -> str | None:
    if len(devices) > MAX_DEVICES:
        return f"{field}: at most {MAX_DEVICES} devices, got {len(devices)}"
    seen: set[str] = set()
    for i, d in enumerate(devices):
        if not d.serial:
            return f"{field}[{i}].serial: required"
        if len(d.serial) > MAX_ID:
            return f"{field}[{i}].serial: at most {MAX_ID} characters"
        if d.serial in seen:
            return f"{field}[{i}].serial: duplicate serial {d.serial!r}"
        seen.add(d.serial)
    return None


def _lease_ref(prefix: str, task_id: str, attempt: int, lease_id: str) -> str | None:
    if not task_id:
        return f"{prefix}.task_id: required"
    if len(task_id) > MAX_ID:
        return f"{prefix}.task_id: at most {MAX_ID} characters"
    if attempt < 1:
        return f"{prefix}.attempt: must be >= 1"
    if not lease_id:
        return f"{prefix}.lease_id: required"
    if len(lease_id) > MAX_ID:
        return f"{prefix}.lease_id: at most {MAX_ID} characters"
    return None


#: Built once: `StepStatus.values()` makes a new list on every call (every renewal's progress).
_STEP_STATUSES = frozenset(types_pb2.StepStatus.values())


def _progress(field: str, p: types_pb2.Progress) -> str | None:
    if p.step_index < 0:
        return f"{field}.step_index: must be >= 0"
    if p.step_status not in _STEP_STATUSES:
        return f"{field}.step_status: unknown value {p.step_status}"
    if not 0 <= p.max_steps <= MAX_STEPS:
        return f"{field}.max_steps: must be 0 to {MAX_STEPS}"
    return None


def hello(msg: lease_pb.HostHello) -> str | None:
    """A hello's devices and held assignments."""
    problem = _devices(list(msg.devices), "hello.devices")
    if problem:
        return problem
    if len(msg.agent_version) > MAX_ID:
        return f"hello.agent_version: at most {MAX_ID} characters"
    if len(msg.process_id) > MAX_ID:
        return f"hello.process_id: at most {MAX_ID} characters"
    for i, h in enumerate(msg.held_assignments):
        problem = _lease_ref(f"hello.held_assignments[{i}]", h.task_id, h.attempt, h.lease_id)
        if problem:
            return problem
    if msg.HasField("outbox"):
        return outbox(msg.outbox, "hello.outbox")
    return None


MAX_OUTBOX = 100_000_000
_MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z


def outbox(msg: types_pb2.OutboxBacklog, field: str) -> str | None:
    """An outbox report's counts."""
    for name in ("items", "decisions", "refused"):
        value = getattr(msg, name)
        if not 0 <= value <= MAX_OUTBOX:
            return f"{field}.{name}: must be 0 to {MAX_OUTBOX}"
    if msg.decisions > msg.items:
        return f"{field}.decisions: more than {field}.items"
    ts = msg.oldest_at
    if msg.HasField("oldest_at") and not (
        0 <= ts.seconds <= _MAX_TIMESTAMP_S and 0 <= ts.nanos < 1_000_000_000
    ):
        return f"{field}.oldest_at: not a time between 1970 and 9999"
    return None


def device_update(msg: lease_pb.DeviceUpdate) -> str | None:
    """A device update's list."""
    return _devices(list(msg.devices), "device_update.devices")


def renewal(msg: lease_pb.LeaseRenewal) -> str | None:
    """A renewal's lease reference and progress (a long summary is truncated, not refused)."""
    problem = _lease_ref("renewal", msg.task_id, msg.attempt, msg.lease_id)
    if problem:
        return problem
    if msg.HasField("progress"):
        return _progress("renewal.progress", msg.progress)
    return None


def result(msg: lease_pb.TaskResult) -> str | None:
    """A result's lease reference and terminal status. Its summary is never a reason to refuse
    it (a finished result refused once would be refused forever): the lease manager cuts a long
    one, and `cloud.wire` has replaced any NUL."""
    problem = _lease_ref("result", msg.task_id, msg.attempt, msg.lease_id)
    if problem:
        return problem
    if msg.status not in _TERMINAL:
        return "result.status: must be SUCCEEDED, FAILED or CANCELLED"
    if msg.HasField("final_progress"):
        return _progress("result.final_progress", msg.final_progress)
    return None
