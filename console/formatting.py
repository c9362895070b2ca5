"""How tasks, progress and decisions read in a terminal (rich), shared by every `amc` command."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp
from rich.table import Table

from amc.v1 import types_pb2

STATUS_STYLE = {
    types_pb2.TASK_STATUS_QUEUED: "yellow",
    types_pb2.TASK_STATUS_ASSIGNED: "cyan",
    types_pb2.TASK_STATUS_RUNNING: "blue",
    types_pb2.TASK_STATUS_SUCCEEDED: "green",
    types_pb2.TASK_STATUS_FAILED: "red",
    types_pb2.TASK_STATUS_CANCELLED: "magenta",
}
TERMINAL = {
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_CANCELLED,
}


def status_name(status: int) -> str:
    return types_pb2.TaskStatus.Name(status).removeprefix("TASK_STATUS_").lower()  # type: ignore[arg-type]


def step_status_name(status: int) -> str:
    return types_pb2.StepStatus.Name(status).removeprefix("STEP_STATUS_").lower()  # type: ignore[arg-type]


def styled_status(status: int) -> str:
    style = STATUS_STYLE.get(status, "white")  # type: ignore[call-overload]
    return f"[{style}]{status_name(status)}[/{style}]"


def progress_badge(progress: types_pb2.Progress) -> str:
    """`step 4 of at most 30 · acting · tap 'Display'`, or an empty string before the first
    step ("of at most" only when the host says its step limit)."""
    if not progress.step_index:
        return ""
    at_most = f" of at most {progress.max_steps}" if progress.max_steps else ""
    return (
        f"step {progress.step_index}{at_most} · {step_status_name(progress.step_status)} · "
        f"{progress.summary}"
    )


def ago(ts: Timestamp) -> str:
    if not ts.seconds:
        return ""
    seconds = int((datetime.now(UTC) - ts.ToDatetime(tzinfo=UTC)).total_seconds())
    if seconds < 60:
        return f"{max(seconds, 0)}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


def task_table(tasks: list[types_pb2.Task]) -> Table:
    table = Table(show_lines=False)
    for column in ("task", "status", "attempt", "host / phone", "progress", "updated", "goal"):
        table.add_column(column)
    for task in tasks:
        table.add_row(
            task.task_id,
            styled_status(task.status),
            f"{task.attempt} of {task.max_attempts}",
            f"{task.host_id or '-'} / {task.device_serial or '-'}",
            progress_badge(task.progress),
            ago(task.updated_at),
            task.goal,
        )
    return table


def thinking_text(decision: types_pb2.Decision) -> str:
    parts = ["[redacted thinking]" if b.redacted else b.text for b in decision.thinking]
    return "\n".join(p for p in parts if p)
