"""How tasks, progress and decisions read in a terminal (rich), shared by every `amc` command.

Styles are `rich.text.Text` spans built here; text from a model or an operator is never read
as markup (`console.cli_output` turns markup off), so it prints exactly as written.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from google.protobuf.timestamp_pb2 import Timestamp
from rich.table import Table
from rich.text import Text

from amc.v1 import decision_log_service_pb2, types_pb2
from console import wording
from planner.budget import dollars
from planner.convert import retry_kind_from_proto, thinking_kind_from_proto
from planner.decision import (
    OMITTED_BLOCK,
    RETRY_WORDS,
    THINKING_WORDS,
    billed_tokens,
    thinking_word,
)
from planner.targets import semantics
from planner.unsettled import unsettled_words as words_of_unknown_cost
from planner.verify import WORDS as VERDICT_WORDS
from planner.verify import verdict_from_proto

if TYPE_CHECKING:  # the CLI imports the console's models only for the commands that need them
    from console.gateway.models import DispatchOut

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


def enum_word(enum: Any, value: int, prefix: str, unknown: str = "") -> str:
    """`TASK_STATUS_RUNNING` → `running`. A number this console has no name for (a newer
    cloud's) reads `unknown (99)`: `Name` raised ValueError, and the whole command failed over
    one word. `unknown` replaces that wording where a closed set of words is promised (the
    JSON API's enums read `unspecified`)."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return unknown or f"unknown ({value})"
    return name.removeprefix(prefix).lower()


def status_name(status: int) -> str:
    return enum_word(types_pb2.TaskStatus, status, "TASK_STATUS_")


def step_status_name(status: int) -> str:
    return enum_word(types_pb2.StepStatus, status, "STEP_STATUS_")


def styled_status(status: int) -> Text:
    return Text(status_name(status), style=STATUS_STYLE.get(status, "white"))  # type: ignore[call-overload]


def progress_badge(progress: types_pb2.Progress, status: int) -> str:
    """What the last step did: `step 4 of at most 30 · acting · tap 'Display'`, `last step 6 ·
    action done · give up: …` once the task (in `status`) ended; empty before the first step.
    Never the task's status (`console.wording.step_line`)."""
    return wording.step_line(
        progress.step_index,
        step_status_name(progress.step_status),
        progress.summary,
        progress.max_steps,
        terminal=status in TERMINAL,
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


def spent_words(totals: types_pb2.TaskTotals) -> str:
    """`2 decisions · 4.0k tokens · $0.0250`: what a task has spent so far (cost only where the
    models have a price); empty while nothing was billed. A watcher's line carries it, since a
    decision counted changes nothing else the line says."""
    tokens = billed_tokens(totals.usage)
    if not totals.decisions and not tokens:
        return ""
    parts = [f"{totals.decisions} decision{'' if totals.decisions == 1 else 's'}"]
    parts.append(f"{wording.tokens(tokens)} tokens")
    if totals.usage.cost_usd:
        parts.append(dollars(totals.usage.cost_usd))
    return " · ".join(parts)


def totals_line(totals: types_pb2.TaskTotals) -> str:
    """`4 steps · 12.3k tokens · $0.0412 · 1m 05s` (tokens and cost only where the model was
    called, failed decisions' calls included, as the console's `present.totals_line`; cost only
    where the models have a price)."""
    parts = [f"{totals.steps} step{'' if totals.steps == 1 else 's'}"]
    tokens = billed_tokens(totals.usage)
    if tokens:
        parts.append(f"{wording.tokens(tokens)} tokens")
        if totals.usage.cost_usd:
            parts.append(dollars(totals.usage.cost_usd))
    parts.append(wording.duration(totals.wall_time.ToTimedelta().total_seconds()))
    return " · ".join(parts)


def task_lines(task: types_pb2.Task) -> list[Text]:
    """One task as a short block: the full id first (never cut, so it can be copied), status,
    attempt, where, when; then the goal; then the last step and the totals."""
    where = f"{task.host_id or '-'} / {task.device_serial or '-'}"
    updated = ago(task.updated_at)
    head = Text.assemble(
        Text(task.task_id, style="bold"),
        "  ",
        styled_status(task.status),
        f"  attempt {task.attempt} of {task.max_attempts}  {where}",
        f"  updated {updated}" if updated else "",
    )
    lines = [head, Text(f"  {task.goal}")]
    step = progress_badge(task.progress, task.status)
    lines.append(Text(f"  {step + ' · ' if step else ''}{totals_line(task.totals)}", style="dim"))
    return lines


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
    """The thinking blocks as plain text: redacted and omitted blocks say so."""
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


def verdict_words(verification: types_pb2.StepVerification) -> Text:
    """One line for a step's verification: the checker's verdict and evidence, the model's
    judgement, and a disagreement (styled spans; evidence and notes as written)."""
    checker = verdict_from_proto(verification.verdict)
    model = verdict_from_proto(verification.model.verdict)
    line = Text()
    if checker is not None:
        who = "cloud check" if verification.checked_by_cloud else "checker"
        line.append(VERDICT_WORDS[checker], style=_VERDICT_STYLE[checker])
        line.append(f" ({who}: {verification.evidence})")
    if model is not None:
        if line:
            line.append(" · ")
        note = f": {verification.model.note}" if verification.model.note else ""
        line.append(f"model says {VERDICT_WORDS[model]}{note}")
    if verification.disagree:
        if line:
            line.append(" · ")
        line.append("checker and model disagree", style="bold red")
    return line or Text("not checked")


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


def usage_words(usage: types_pb2.Usage) -> str:
    """`1,234 tokens · $0.0123`."""
    return f"{billed_tokens(usage):,} tokens · {dollars(usage.cost_usd)}"


def unsettled_words(unsettled: types_pb2.UnsettledCalls) -> str:
    """`1 model call whose cost was never recorded: at most 12,345 tokens · $0.0123` (decision
    0080: the process making it died, or it is under way); not in the totals. The phrasing is
    `planner.unsettled`'s, which the host's console shares."""
    return words_of_unknown_cost(unsettled.calls, unsettled.at_most)


def total_usage(
    decisions: Iterable[types_pb2.Decision],
    failed: Iterable[decision_log_service_pb2.FailedCalls] = (),
    pruned: decision_log_service_pb2.PrunedRecord | None = None,
) -> types_pb2.Usage:
    """The decisions' usage summed, with the failed decisions' calls and what the retention
    deleted (`pruned`): what the task's totals and GetSpend count (the provider billed those
    calls too)."""
    total = types_pb2.Usage()
    deleted = [pruned.usage] if pruned is not None else []
    for u in [d.usage for d in decisions] + [f.usage for f in failed] + deleted:
        total.input_tokens += u.input_tokens
        total.output_tokens += u.output_tokens
        total.cache_read_input_tokens += u.cache_read_input_tokens
        total.cache_creation_input_tokens += u.cache_creation_input_tokens
        total.thinking_tokens += u.thinking_tokens
        total.cost_usd += u.cost_usd
    return total


def failed_calls_words(failed: Iterable[decision_log_service_pb2.FailedCalls]) -> str | None:
    """`plus 1 failed decision's model calls: 2,400 tokens · $0.0120`, or None when there are none:
    no decision is logged for them, yet the provider billed them."""
    found = list(failed)
    if not found:
        return None
    n = sum(f.decisions for f in found)
    whose = f"{n} failed decision's" if n == 1 else f"{n} failed decisions'"
    return f"plus {whose} model calls: {usage_words(total_usage((), found))}"


def pruned_words(pruned: decision_log_service_pb2.PrunedRecord) -> str:
    """`pruned on 2026-12-05 10:00 UTC by the cloud's retention: 3 decisions and 1 failed
    decision's call records, 1,800 tokens · $0.0090 (the task's totals still count them)`: why
    the log lists less than the task's totals."""
    parts = [f"{pruned.decisions} decision{'' if pruned.decisions == 1 else 's'}"]
    if pruned.failed_decisions:
        n = pruned.failed_decisions
        whose = "failed decision's" if n == 1 else "failed decisions'"
        parts.append(f"{n} {whose} call records")
    when = pruned.pruned_at.ToDatetime(tzinfo=UTC)
    return (
        f"pruned on {when:%Y-%m-%d %H:%M} UTC by the cloud's retention: {' and '.join(parts)}, "
        f"{usage_words(pruned.usage)} (the task's totals still count them)"
    )


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


def hold_line(d: DispatchOut) -> str:
    """A dispatch hold's parts on one line under its sentence, for a reader who scans for the
    kind and what lifts it (`amc host list`; --json has them as fields)."""
    parts = [f"hold: {d.kind}"]
    if d.seen_by:
        parts.append(f"seen by replica {d.seen_by}")
    if d.next_probe_at is not None:
        parts.append(f"next probe {d.next_probe_at:%H:%M:%S} UTC")
    if d.resumes_at is not None:
        parts.append(f"resumes {d.resumes_at:%Y-%m-%d %H:%M} UTC")
    if d.lifted_by:
        parts.append(f"lifted by {d.lifted_by}")
    return "  " + " · ".join(parts)
