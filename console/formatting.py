"""How tasks, progress and decisions read in a terminal (rich), shared by every `amc` command.

Rich reads `[...]` in a printed string as markup, and text from a model or an operator (a
rationale, a goal, a progress summary) can hold anything: "[/b]" would crash the command,
"[e12]" would vanish. Such text goes through `literal()` (or into a `Text` cell) before it is
printed; only this module's own styles are markup.
"""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from amc.v1 import types_pb2
from planner.convert import retry_kind_from_proto, thinking_kind_from_proto
from planner.decision import OMITTED_BLOCK, RETRY_WORDS, THINKING_WORDS, thinking_word
from planner.targets import semantics
from planner.verify import WORDS as VERDICT_WORDS
from planner.verify import verdict_from_proto

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


def literal(text: str) -> str:
    """`text` escaped so it prints exactly as written inside a markup string."""
    return escape(text)


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
            Text(task.task_id),
            styled_status(task.status),
            f"{task.attempt} of {task.max_attempts}",
            Text(f"{task.host_id or '-'} / {task.device_serial or '-'}"),
            Text(progress_badge(task.progress)),
            ago(task.updated_at),
            Text(task.goal),
        )
    return table


def thinking_kind(decision: types_pb2.Decision) -> str:
    """The decision's thinking kind as a word ("summarized thinking", …), never a blank."""
    if decision.thinking_kind == types_pb2.THINKING_KIND_UNSPECIFIED:
        return THINKING_WORDS[""]
    return thinking_word(thinking_kind_from_proto(decision.thinking_kind))


def retry_word(decision: types_pb2.Decision) -> str:
    """ "forced retry", "nudged retry", or "" when the first answer called a tool."""
    if not decision.forced_retry:
        return ""
    return RETRY_WORDS.get(retry_kind_from_proto(decision.retry_kind), "forced retry")


def thinking_text(decision: types_pb2.Decision) -> str:
    """The thinking blocks as plain text (not markup): redacted and omitted blocks say so."""
    parts = [
        "(redacted: the provider returned this block encrypted)"
        if b.redacted
        else b.text or f"({OMITTED_BLOCK})"
        for b in decision.thinking
    ]
    return "\n".join(p for p in parts if p)


_VERDICT_STYLE = {"met": "green", "not_met": "red", "unknown": "yellow"}
FLOW_STATUS_WORDS = {
    types_pb2.FLOW_STATUS_ACTIVE: "active",
    types_pb2.FLOW_STATUS_DISABLED: "disabled",
    types_pb2.FLOW_STATUS_RETIRED: "retired",
}


def verdict_words(verification: types_pb2.StepVerification) -> str:
    """One line (rich markup; evidence and notes escaped) for a step's verification: the
    checker's verdict and evidence, the model's judgement, and a disagreement."""
    checker = verdict_from_proto(verification.verdict)
    model = verdict_from_proto(verification.model.verdict)
    parts = []
    if checker is not None:
        who = "cloud check" if verification.checked_by_cloud else "checker"
        style = _VERDICT_STYLE[checker]
        parts.append(
            f"[{style}]{VERDICT_WORDS[checker]}[/{style}] ({who}: {literal(verification.evidence)})"
        )
    if model is not None:
        note = f": {literal(verification.model.note)}" if verification.model.note else ""
        parts.append(f"model says {VERDICT_WORDS[model]}{note}")
    if verification.disagree:
        parts.append("[bold red]checker and model disagree[/bold red]")
    return " · ".join(parts) or "not checked"


def verdict_counts(decisions: list[types_pb2.Decision]) -> dict[str, int]:
    """How many steps the checker found met, not met, unknown (and how many were not checked)."""
    counts = {"met": 0, "not_met": 0, "unknown": 0, "unchecked": 0}
    for d in decisions:
        if d.tool_name in ("complete", "get_ui_tree"):
            continue
        name = verdict_from_proto(d.verification.verdict)
        counts[name or "unchecked"] += 1
    return counts


def flow_table(flows: list[types_pb2.Flow]) -> Table:
    """Flows as `amc flows list` prints them."""
    table = Table(show_lines=False)
    for column in ("flow", "status", "goal", "steps", "uses", "replayed", "diverged", "updated"):
        table.add_column(column)
    for f in flows:
        table.add_row(
            f.flow_id,
            FLOW_STATUS_WORDS.get(f.status, "?"),
            Text(f.goal_template),
            str(len(f.steps)),
            str(f.uses),
            str(f.replays_completed),
            str(f.divergences),
            ago(f.updated_at),
        )
    return table


def target_words(target: types_pb2.ElementTarget) -> str:
    """A semantic target as words ("'Display' title TextView")."""
    return semantics(target)
