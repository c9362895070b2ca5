"""How tasks, progress and decisions read in a terminal (rich), shared by every `amc` command.

Rich reads `[...]` in a printed string as markup, and text from a model or an operator (a
rationale, a goal, a progress summary) can hold anything: "[/b]" would crash the command,
"[e12]" would vanish. Such text goes through `literal()` (or into a `Text` cell) before it is
printed; only this module's own styles are markup.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from amc.v1 import types_pb2
from planner.budget import dollars
from planner.convert import retry_kind_from_proto, thinking_kind_from_proto
from planner.decision import OMITTED_BLOCK, RETRY_WORDS, THINKING_WORDS, thinking_word

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


def billed_tokens(usage: types_pb2.Usage) -> int:
    """Input, output, cache reads and writes: what a token budget counts."""
    return (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_read_input_tokens
        + usage.cache_creation_input_tokens
    )


def usage_words(usage: types_pb2.Usage) -> str:
    """`1,234 tokens · $0.0123`."""
    return f"{billed_tokens(usage):,} tokens · {dollars(usage.cost_usd)}"


def total_usage(decisions: Iterable[types_pb2.Decision]) -> types_pb2.Usage:
    """The decisions' usage summed."""
    total = types_pb2.Usage()
    for d in decisions:
        u = d.usage
        total.input_tokens += u.input_tokens
        total.output_tokens += u.output_tokens
        total.cache_read_input_tokens += u.cache_read_input_tokens
        total.cache_creation_input_tokens += u.cache_creation_input_tokens
        total.thinking_tokens += u.thinking_tokens
        total.cost_usd += u.cost_usd
    return total


def spending(usage: types_pb2.Usage, budget: types_pb2.TaskBudget, whose: str = "task") -> str:
    """What was spent, against the caps when there are any."""
    caps = []
    if budget.max_tokens:
        caps.append(f"{billed_tokens(usage):,} of {budget.max_tokens:,} tokens")
    if budget.max_cost_usd:
        caps.append(f"{dollars(usage.cost_usd)} of {dollars(budget.max_cost_usd)}")
    against = f" ({whose} budget: {'; '.join(caps)})" if caps else f" (no {whose} budget)"
    return usage_words(usage) + against


def spend_table(rows: list[Any]) -> Table:
    """GetSpend rows: day, host, provider/model, decisions, tokens, cost."""
    table = Table(show_lines=False)
    for column in ("day", "host", "model", "decisions", "tokens", "cost"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.day,
            Text(r.host_id),
            Text(f"{r.provider}/{r.model}"),
            f"{r.decisions:,}",
            f"{billed_tokens(r.usage):,}",
            dollars(r.usage.cost_usd),
        )
    return table
