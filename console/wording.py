"""How amc says things to operators, the same in the terminal and on the console's pages.

The progress line says what the *step* did, never the task's status: a failed task whose last
step ran its "give up" action reads "last step 6 · action done · give up: …" beside a "failed"
status, not "succeeded". `console/gateway/static/live.js` repeats `step_line` for live
updates (a browser test holds the two to the same words).
"""

from __future__ import annotations

#: Both consoles and the terminal say a step the same way (`webui.steps`).
from webui.steps import STEP_WORDS as STEP_WORDS
from webui.steps import step_line as step_line

#: Lease history kinds as read on a timeline.
EVENT_WORDS = {
    "assigned": "assigned",
    "resumed": "resumed after the host reconnected",
    "revoked": "revoked",
    "expired": "lease expired",
    "deadline_exceeded": "deadline passed",
    "cancel_requested": "cancel requested",
    "cancelled": "cancelled",
    "result": "result",
    "requeued": "requeued",
    "unspecified": "event",
}


def duration(seconds: float | None) -> str:
    """`850 ms`, `42 s`, `3m 05s`, `2h 04m`; `—` for None."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def tokens(count: int) -> str:
    """`950`, `12.3k`, `4.1M` tokens (no unit)."""
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


def event_line(
    kind: str,
    *,
    host_id: str = "",
    device_serial: str = "",
    operator: str = "",
    reason: str = "",
    result_status: str = "",
    task_status: str = "",
) -> str:
    """One lease event as a sentence: `assigned to h1 / emu-1`, `cancel requested by ops:
    not needed`, `lease expired → queued again`, `result: failed — gave up`."""
    where = " / ".join(p for p in (host_id, device_serial) if p)
    by = f" by {operator}" if operator else ""
    if kind == "assigned":
        return f"assigned to {where}" if where else "assigned"
    if kind == "resumed":
        return f"{EVENT_WORDS[kind]} ({where})" if where else EVENT_WORDS[kind]
    if kind == "revoked":
        return f"revoked: {reason or 'no reason given'}"
    if kind == "expired":
        after = {"queued": "queued again", "failed": "task failed", "cancelled": "task cancelled"}
        text = EVENT_WORDS[kind]
        if reason and reason != "lease expired":
            text = reason
        return f"{text} → {after.get(task_status, task_status)}" if task_status else text
    if kind == "deadline_exceeded":
        return "deadline passed → task failed"
    if kind in ("cancel_requested", "cancelled"):
        return f"{EVENT_WORDS[kind]}{by}" + (f": {reason}" if reason else "")
    if kind == "result":
        return f"result: {result_status or 'unknown'}" + (f" — {reason}" if reason else "")
    if kind == "requeued":
        return f"requeued: {reason}" if reason else "requeued"
    return EVENT_WORDS.get(kind, kind)
