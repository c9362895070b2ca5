"""A progress snapshot as the store writes it (with renewals and results).

The summary is cut, never refused: a host that writes too much still keeps its lease.
"""

from __future__ import annotations

from dataclasses import dataclass

SUMMARY_LIMIT = 200
ELLIPSIS = "…"


def truncate_summary(text: str) -> str:
    """At most 200 characters; longer summaries end in an ellipsis (never rejected)."""
    if len(text) <= SUMMARY_LIMIT:
        return text
    return text[: SUMMARY_LIMIT - 1] + ELLIPSIS


@dataclass(frozen=True, slots=True)
class ProgressIn:
    """A progress snapshot as the host reported it (summary already truncated; `step_status`
    is the protocol's StepStatus number, which the store keeps as it is)."""

    step_index: int
    step_status: int
    summary: str
