"""Group a task's decision log by attempt and say why a history is empty.

An empty LLM history is ambiguous on its own: the agent may not have planned a step yet, or the
host plans on the direct transport and its decisions are still on their way from its outbox.
Operators must not read either as "it's broken", so every empty history carries its reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from console.gateway.models import (
    AttemptHistory,
    DecisionOut,
    FailedCallsOut,
    PrunedOut,
    TaskOut,
    TransportName,
)

NO_STEP_YET = "no step reported yet"
NO_DECISION_YET = "no decision logged yet for this attempt"
NOT_ASSIGNED_YET = "no step reported yet: the task has not reached a host"
DIRECT_TRANSPORT = (
    "this host uses the direct transport: it ships its decisions from its outbox in the "
    "background, and none has arrived yet"
)


def pruned_reason(pruned: PrunedOut) -> str:
    """Why a history is empty once the cloud's retention deleted the task's log."""
    when = f" on {pruned.pruned_at:%Y-%m-%d %H:%M} UTC" if pruned.pruned_at else ""
    return (
        f"the cloud's retention deleted this task's decision log{when}; the task's totals "
        "still count what it cost"
    )


def empty_reason(transport: TransportName, step_index: int = 0) -> str:
    """Why an attempt on a host with this planner transport, at this step, has no decisions."""
    if transport == "direct":
        return DIRECT_TRANSPORT
    return NO_DECISION_YET if step_index else NO_STEP_YET


def verdict_counts(decisions: list[DecisionOut]) -> dict[str, int]:
    """How many device steps the checker found met, not met, unknown, or has not checked yet."""
    counts = {"met": 0, "not met": 0, "unknown": 0, "unchecked": 0}
    for d in decisions:
        if d.tool_name in ("complete", "get_ui_tree"):
            continue
        counts[d.verification.verdict or "unchecked"] += 1
    return counts


def group_history(
    task: TaskOut,
    decisions: list[DecisionOut],
    host_transports: dict[str, TransportName],
    failed: Sequence[FailedCallsOut] = (),
    pruned: PrunedOut | None = None,
) -> tuple[list[AttemptHistory], str | None]:
    """Per-attempt histories (newest attempt first) and a note when the whole log is empty.

    The attempt's own transport (recorded when the lease was granted) wins; the host's current
    transport from the fleet fills in when the attempt did not record one. Each history
    carries what its failed decisions' answered calls cost (`failed`, per attempt), which the
    task's totals count though no decision is listed for them. Once the retention deleted
    the task's log (`pruned`), that is why an attempt lists nothing.
    """
    failed_in = {f.attempt: f for f in failed}
    by_attempt: dict[int, list[DecisionOut]] = {}
    for decision in decisions:
        by_attempt.setdefault(decision.attempt, []).append(decision)

    histories: list[AttemptHistory] = []
    seen: set[int] = set()
    for attempt in task.attempts:
        seen.add(attempt.attempt)
        transport: TransportName = attempt.planner_transport
        if transport == "unspecified":
            transport = host_transports.get(attempt.host_id, "unspecified")
        steps = sorted(by_attempt.get(attempt.attempt, []), key=lambda d: d.step_index)
        histories.append(
            AttemptHistory(
                attempt=attempt.attempt,
                planner_transport=transport,
                decisions=steps,
                empty_reason=None
                if steps
                else pruned_reason(pruned)
                if pruned is not None
                else empty_reason(transport, attempt.progress.step_index),
                verdicts=verdict_counts(steps),
                failed_calls=failed_in.get(attempt.attempt),
            )
        )
    for number, steps in by_attempt.items():
        if number not in seen:
            histories.append(
                AttemptHistory(
                    attempt=number,
                    planner_transport="cloud",
                    decisions=sorted(steps, key=lambda d: d.step_index),
                    empty_reason=None,
                    verdicts=verdict_counts(steps),
                    failed_calls=failed_in.get(number),
                )
            )
    histories.sort(key=lambda h: h.attempt, reverse=True)

    note: str | None = None
    if not decisions:
        fallback = pruned_reason(pruned) if pruned is not None else NOT_ASSIGNED_YET
        note = histories[0].empty_reason if histories else fallback
    return histories, note
