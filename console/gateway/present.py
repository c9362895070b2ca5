"""How values read on the pages: progress badges, "updated 3s ago", tokens, JSON.

`static/live.js` formats the same badge for live updates; keep the two in step.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment

from console.gateway.models import HostOut, ProgressOut, TaskOut, UsageOut
from planner.budget import dollars
from planner.decision import OMITTED_BLOCK


def progress_badge(progress: ProgressOut) -> str:
    """`step 4 of at most 30 · acting · tap 'Display'`; empty before the first step."""
    if not progress.step_index:
        return ""
    at_most = f" of at most {progress.max_steps}" if progress.max_steps else ""
    parts = [f"step {progress.step_index}{at_most}"]
    if progress.step_status != "unspecified":
        parts.append(progress.step_status)
    if progress.summary:
        parts.append(progress.summary)
    return " · ".join(parts)


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
    the same from a `host` event and re-renders the fleet when the two differ."""
    phones = ";".join(f"{d.serial}={d.state}={d.model}" for d in host.devices)
    state = "on" if host.connected else "off"
    return f"{state}|{host.planner_transport}|{host.agent_version}|{phones}"


def iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment else ""


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"


def total_tokens(usage: UsageOut) -> int:
    return usage.input_tokens + usage.output_tokens + usage.cache_read_input_tokens


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def install(env: Environment) -> None:
    """Register the filters the templates use."""
    env.filters["badge"] = progress_badge
    env.filters["attempt_label"] = attempt_label
    env.filters["ago"] = ago
    env.filters["iso"] = iso
    env.filters["host_signature"] = host_signature
    env.filters["when"] = when
    env.filters["tokens"] = total_tokens
    env.filters["pretty_json"] = pretty_json
    env.filters["usd"] = dollars
    env.globals["omitted_block"] = OMITTED_BLOCK
