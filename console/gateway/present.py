"""How values read on the pages: progress badges, "updated 3s ago", tokens, JSON.

`static/live.js` formats the same badge for live updates; keep the two in step.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Protocol

from jinja2 import Environment

from console import wording
from console.gateway.models import (
    TERMINAL_STATUSES,
    HostOut,
    ProgressOut,
    TaskOut,
    TotalsOut,
)
from console.gateway.overlay import overlay
from console.gateway.timeline import attempt_timelines
from planner.budget import dollars
from planner.decision import OMITTED_BLOCK


class HasProgress(Protocol):
    """A task or an attempt: a status and its latest progress."""

    @property
    def status(self) -> str: ...

    @property
    def progress(self) -> ProgressOut: ...


def progress_badge(item: HasProgress) -> str:
    """What the last step did (`step 4 of at most 30 · acting · tap 'Display'`, `last step 6 ·
    action done · give up: …` once ended), never the task's status; empty before step 1."""
    p = item.progress
    return wording.step_line(
        p.step_index,
        p.step_status,
        p.summary,
        p.max_steps,
        terminal=item.status in TERMINAL_STATUSES,
    )


def attempt_label(task: TaskOut) -> str:
    """`attempt 2 of 3`, or `not assigned yet (3 allowed)`."""
    if not task.attempt:
        return f"not assigned yet ({task.max_attempts} allowed)"
    return f"attempt {task.attempt} of {task.max_attempts}"


def ago(moment: datetime | None) -> str:
    """`12s ago`, for the first paint; live.js keeps it ticking."""
    if moment is None:
        return ""
    seconds = max(int((datetime.now(UTC) - moment).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def host_signature(host: HostOut) -> str:
    """What the fleet page shows of a host besides "last seen", as one string: live.js builds
    the same from a `host` event and re-renders the host's card when the two differ."""
    phones = ";".join(f"{d.serial}={d.state}={d.model}={d.reason}" for d in host.devices)
    busy = ";".join(f"{b.device_serial}={b.task_id}={b.attempt}" for b in host.busy_phones)
    state = ("stopping" if host.stopping_since else "on") if host.connected else "off"
    waiting = host.outbox.items if host.outbox else ""
    held = host.held_back.task_id if host.held_back else ""
    return f"{state}|{host.planner_transport}|{host.agent_version}|{phones}|{busy}|{waiting}|{held}"


def host_key(host: HostOut) -> str:
    """Where a host sorts in the fleet (by id, as ListHosts pages) as one string that compares
    the same way in JavaScript: live.js places a host event's host with it."""
    return host.host_id


def until(moment: datetime | None) -> str:
    """`in 23s`, or `2s ago` once passed, for the first paint; live.js keeps it counting."""
    if moment is None:
        return ""
    seconds = int((moment - datetime.now(UTC)).total_seconds())
    if seconds >= 0:
        return f"in {wording.duration(seconds) if seconds else '0 s'}"
    return f"{wording.duration(-seconds)} ago"


def clock(moment: datetime | None) -> str:
    """`14:03:07 UTC` (the full date is in the element's title): said, since a bare time
    reads as the reader's own zone."""
    return moment.strftime("%H:%M:%S UTC") if moment else "—"


def iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment else ""


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"


def totals_line(totals: TotalsOut) -> str:
    """`4 steps · 12.3k tokens · $0.0412 · 1m 05s` (tokens and cost only where the model was
    called, failed decisions' calls included; cost only where the models have a price)."""
    parts = [f"{totals.steps} step{'' if totals.steps == 1 else 's'}"]
    if totals.tokens:
        parts.append(f"{wording.tokens(totals.tokens)} tokens")
        if totals.usage.cost_usd:
            parts.append(dollars(totals.usage.cost_usd))
    parts.append(wording.duration(totals.wall_time_s))
    return " · ".join(parts)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def install(env: Environment) -> None:
    """Register the filters the templates use."""
    env.filters["badge"] = progress_badge
    env.filters["attempt_label"] = attempt_label
    env.filters["ago"] = ago
    env.filters["until"] = until
    env.filters["clock"] = clock
    env.filters["iso"] = iso
    env.filters["host_signature"] = host_signature
    env.filters["host_key"] = host_key
    env.filters["when"] = when
    env.filters["pretty_json"] = pretty_json
    env.filters["totals"] = totals_line
    env.filters["duration"] = wording.duration
    env.filters["token_count"] = wording.tokens
    env.filters["timelines"] = attempt_timelines
    env.filters["usd"] = dollars
    env.globals["omitted_block"] = OMITTED_BLOCK
    env.globals["overlay"] = overlay
