"""The latest progress of one running task, shared by the agent loop, lease renewals and console.

A snapshot, not a history: the loop overwrites it each step; readers take a copy. Listeners
are told of each change (the lease client uses that to renew promptly, rate-limited).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TypeAlias

from amc.v1 import types_pb2

SUMMARY_LIMIT = 200

StepStatus: TypeAlias = types_pb2.StepStatus.ValueType

_STATUS_NAMES: dict[int, str] = {
    types_pb2.STEP_STATUS_UNSPECIFIED: "unspecified",
    types_pb2.STEP_STATUS_PERCEIVING: "perceiving",
    types_pb2.STEP_STATUS_PLANNING: "planning",
    types_pb2.STEP_STATUS_ACTING: "acting",
    types_pb2.STEP_STATUS_SUCCEEDED: "succeeded",
    types_pb2.STEP_STATUS_FAILED: "failed",
}


def truncate(text: str, limit: int = SUMMARY_LIMIT) -> str:
    """One line, at most `limit` characters, an ellipsis when cut."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def status_name(status: StepStatus) -> str:
    return _STATUS_NAMES.get(int(status), "unspecified")


@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    step_index: int = 0
    step_status: StepStatus = types_pb2.STEP_STATUS_UNSPECIFIED
    summary: str = ""
    version: int = 0
    updated_at: datetime | None = None
    #: The attempt's step limit ("step 3 of at most 30"); 0 when not said.
    max_steps: int = 0

    def to_proto(self) -> types_pb2.Progress:
        return types_pb2.Progress(
            step_index=self.step_index,
            step_status=self.step_status,
            summary=self.summary,
            max_steps=self.max_steps,
        )

    @property
    def status_name(self) -> str:
        return status_name(self.step_status)


Listener = Callable[[ProgressSnapshot], None]


class ProgressHolder:
    """Thread-safe latest progress with change listeners."""

    def __init__(self, initial: ProgressSnapshot | None = None) -> None:
        self._lock = threading.Lock()
        self._snap = initial or ProgressSnapshot()
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def snapshot(self) -> ProgressSnapshot:
        with self._lock:
            return self._snap

    def update(
        self,
        step_index: int,
        step_status: StepStatus,
        summary: str,
        max_steps: int | None = None,
    ) -> ProgressSnapshot:
        """A new snapshot; `max_steps` None keeps the one already set."""
        with self._lock:
            snap = replace(
                self._snap,
                step_index=step_index,
                step_status=step_status,
                summary=truncate(summary),
                version=self._snap.version + 1,
                updated_at=datetime.now(UTC),
                max_steps=self._snap.max_steps if max_steps is None else max_steps,
            )
            self._snap = snap
            listeners = list(self._listeners)
        for listener in listeners:
            listener(snap)
        return snap
