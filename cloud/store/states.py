"""Status names stored in the database and their protobuf enum values."""

from __future__ import annotations

from typing import Final

from amc.v1 import types_pb2

QUEUED: Final = "QUEUED"
ASSIGNED: Final = "ASSIGNED"
RUNNING: Final = "RUNNING"
SUCCEEDED: Final = "SUCCEEDED"
FAILED: Final = "FAILED"
CANCELLED: Final = "CANCELLED"

LIVE: Final = (ASSIGNED, RUNNING)
ACTIVE: Final = (QUEUED, ASSIGNED, RUNNING)
TERMINAL: Final = (SUCCEEDED, FAILED, CANCELLED)

LEASE_EXPIRED: Final = "lease expired"
DEADLINE_EXCEEDED: Final = "deadline exceeded"
#: Why an attempt was released (ended without a result, before its lease ran out).
HOST_RESTARTED: Final = "released: a new process of the host connected"
#: (An attempt released for this one never ran: it does not count against max_attempts.)
STREAM_LOST: Final = "released: the host's stream closed before its assignment was sent"
CERTIFICATE_REVOKED: Final = "released: the host's certificate was revoked"
RELEASED: Final = (HOST_RESTARTED, STREAM_LOST, CERTIFICATE_REVOKED)


def to_proto(status: str) -> types_pb2.TaskStatus.ValueType:
    """Stored name -> TaskStatus enum value."""
    return types_pb2.TaskStatus.Value("TASK_STATUS_" + status)


def from_proto(value: types_pb2.TaskStatus.ValueType) -> str:
    """TaskStatus enum value -> stored name (UNSPECIFIED raises ValueError)."""
    if value == types_pb2.TASK_STATUS_UNSPECIFIED:
        raise ValueError("status is unspecified")
    return types_pb2.TaskStatus.Name(value).removeprefix("TASK_STATUS_")
