"""The task page's attempt history: each attempt's lease events as one timeline.

The cloud records the events (assigned, resumed, revoked, expired, cancel requested, result,
requeued…) and counts renewals on the attempt; here they become one list per attempt, newest
attempt first, with the renewals as one line at the first renewal's time, and the live lease's
end for the page to count down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from console import wording
from console.gateway.models import AttemptOut, LeaseEventOut, TaskDetailOut


@dataclass(frozen=True, slots=True)
class TimelineItem:
    """One line of an attempt's timeline."""

    at: datetime | None
    kind: str
    text: str


@dataclass(slots=True)
class AttemptTimeline:
    """One attempt (or, as attempt 0, what happened before the first) on the task page."""

    number: int
    attempt: AttemptOut | None
    items: list[TimelineItem] = field(default_factory=list)
    #: Session-mode decisions were logged: the whole conversation can be read.
    conversation: bool = False

    @property
    def lease_until(self) -> datetime | None:
        """When the live lease runs out unless renewed (None once the attempt ended)."""
        if self.attempt is None or self.attempt.ended_at is not None:
            return None
        return self.attempt.lease_expires_at


def _event_item(event: LeaseEventOut) -> TimelineItem:
    text = wording.event_line(
        event.kind,
        host_id=event.host_id,
        device_serial=event.device_serial,
        operator=event.operator,
        reason=event.reason,
        result_status="" if event.result_status == "unspecified" else event.result_status,
        task_status="" if event.task_status == "unspecified" else event.task_status,
    )
    return TimelineItem(event.at, event.kind, text)


def _renewals_item(attempt: AttemptOut) -> TimelineItem | None:
    if not attempt.renewals:
        return None
    times = "once" if attempt.renewals == 1 else f"{attempt.renewals} times"
    last = attempt.last_renewed_at
    until = f", last at {last:%H:%M:%S} UTC" if last and attempt.renewals > 1 else ""
    return TimelineItem(attempt.first_renewed_at, "renewals", f"lease renewed {times}{until}")


def attempt_timelines(detail: TaskDetailOut) -> list[AttemptTimeline]:
    """Every attempt's timeline, newest first; attempt 0 (events before the first) last."""
    by_number: dict[int, AttemptTimeline] = {
        a.attempt: AttemptTimeline(a.attempt, a) for a in detail.task.attempts
    }
    for event in detail.events:
        timeline = by_number.setdefault(event.attempt, AttemptTimeline(event.attempt, None))
        timeline.items.append(_event_item(event))
    for timeline in by_number.values():
        if timeline.attempt is not None:
            renewals = _renewals_item(timeline.attempt)
            if renewals is not None:
                timeline.items.append(renewals)
        # Stable: events keep their recorded order; the renewals line goes where its time is.
        timeline.items.sort(key=lambda i: (i.at is None, i.at or datetime.min))
    for history in detail.history:
        if history.attempt in by_number and any(
            d.planner_mode == "session" for d in history.decisions
        ):
            by_number[history.attempt].conversation = True
    return sorted(by_number.values(), key=lambda t: (t.number == 0, -t.number))
