"""Checks of host messages. Each returns None or a message that names the offending field.

Only what leaves a message unusable is refused: a lease reference that names no lease, a phone
list the dispatcher cannot address. What a host merely reports (progress, its outbox) is brought
within the contract's ranges instead (`cloud.lease.messages`), so that no report costs a host its
lease, its hello or a finished result. A result's replay report (`replay`) writes on a learned
flow's record, so one about a flow or step the attempt was not handed is left out of the result
(logged) rather than trusted; the result itself is recorded.

Text that cannot be stored at all (NUL characters, invalid UTF-8) never gets here: `cloud.wire`
refuses it as the message is parsed (or, for summaries, replaces it)."""

from __future__ import annotations

from collections.abc import Mapping

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2

MAX_DEVICES = 256
MAX_ID = 128
#: Held assignments a hello may list (a host holds at most one lease per phone; four times
#: `MAX_DEVICES` leaves room for phones it no longer has). Each one costs the replica a lookup
#: while its other hosts wait: 20,000 took 8 s.
MAX_HELD = 4 * MAX_DEVICES
_TRANSPORTS = (
    types_pb2.PLANNER_TRANSPORT_UNSPECIFIED,
    types_pb2.PLANNER_TRANSPORT_DIRECT,
    types_pb2.PLANNER_TRANSPORT_CLOUD,
)
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


def hello(msg: lease_pb.HostHello) -> str | None:
    """A hello's devices, identifiers and planner transport. Neither a held assignment (each
    is answered on its own: `held`), nor the outbox report (cut to sense:
    `messages.backlog_in`), nor the agent version (cut like a phone's model:
    `convert.AGENT_VERSION_LIMIT`) refuses a hello: a refused hello gets no Welcome, and the
    host's live leases would not be resumed."""
    problem = _devices(list(msg.devices), "hello.devices")
    if problem:
        return problem
    if len(msg.process_id) > MAX_ID:
        return f"hello.process_id: at most {MAX_ID} characters"
    if msg.planner_transport not in _TRANSPORTS:
        # Another transport (a newer host's) may plan neither way: guessing would pause it
        # wrongly, or hand it work while the model provider is down.
        return (
            f"hello.planner_transport: {msg.planner_transport} is not a transport this cloud "
            "knows (PLANNER_TRANSPORT_DIRECT, PLANNER_TRANSPORT_CLOUD; UNSPECIFIED counts as CLOUD)"
        )
    return None


def held(index: int, h: lease_pb.HeldAssignment) -> str | None:
    """A held assignment that cannot name a lease, or one past `MAX_HELD` (answered with
    Revoked, reason UNKNOWN)."""
    if index >= MAX_HELD:
        return f"hello.held_assignments[{index}]: at most {MAX_HELD} held assignments"
    return _lease_ref(f"hello.held_assignments[{index}]", h.task_id, h.attempt, h.lease_id)


def device_update(msg: lease_pb.DeviceUpdate) -> str | None:
    """A device update's list."""
    return _devices(list(msg.devices), "device_update.devices")


def renewal(msg: lease_pb.LeaseRenewal) -> str | None:
    """A renewal's lease reference. Its progress never refuses it (a host that reports oddly
    still keeps its lease): `messages.progress_in` brings it within the contract's ranges."""
    return _lease_ref("renewal", msg.task_id, msg.attempt, msg.lease_id)


def result(msg: lease_pb.TaskResult) -> str | None:
    """A result's lease reference and terminal status. Its summary is never a reason to refuse
    it (a finished result refused once would be refused forever): the lease manager cuts a long
    one, and `cloud.wire` has replaced any NUL or byte that is not UTF-8. Nor is its final
    progress (brought within range, like a renewal's)."""
    problem = _lease_ref("result", msg.task_id, msg.attempt, msg.lease_id)
    if problem:
        return problem
    if msg.status not in _TERMINAL:
        return "result.status: must be SUCCEEDED, FAILED or CANCELLED"
    return None


def replay(report: types_pb2.FlowReplayReport, handed: Mapping[str, int | None]) -> str | None:
    """A result's replay report against the flows the cloud handed its attempt (flow id → its
    steps, None when the flow was deleted since). The learning loop counts the report on the
    flow it names, divergences included (they retire a flow): one naming a flow the attempt was
    not given, or a step that flow does not have, would rewrite another flow's record."""
    if report.flow_id not in handed:  # which flows it was handed is the lease holder's to know
        return (
            f"result.replay.flow_id: {report.flow_id[:40]!r} is not a flow this attempt was handed"
        )
    steps = handed[report.flow_id]
    if steps is None:
        return None
    # The replay may go on with an alternative that shares the path (planner/flows/replay.py).
    most = max(s or 0 for s in handed.values())
    if not 0 <= report.steps_replayed <= most:
        return f"result.replay.steps_replayed: must be 0 to {most}, got {report.steps_replayed}"
    # One past the last step is the replayed `complete`.
    if report.diverged and not 1 <= report.diverged_at_step <= steps + 1:
        return (
            f"result.replay.diverged_at_step: must be 1 to {steps + 1} (a step of flow "
            f"{report.flow_id!r}), got {report.diverged_at_step}"
        )
    return None
