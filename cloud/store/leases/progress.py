"""A progress snapshot as the store writes it (with renewals and results), and the summaries'
limits.

Summaries are cut, never refused: a host that writes too much still keeps its lease, and a
finished result is recorded rather than refused forever.
"""

from __future__ import annotations

from typing import NamedTuple

SUMMARY_LIMIT = 200
#: A result's summary (the agent's closing words or the failure reason).
RESULT_SUMMARY_LIMIT = 2000
ELLIPSIS = "…"


def truncate_summary(text: str, limit: int = SUMMARY_LIMIT) -> str:
    """At most `limit` characters; longer summaries end in an ellipsis (never rejected)."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + ELLIPSIS


class ProgressIn(NamedTuple):
    """A progress snapshot as the host reported it (summary already truncated; `step_status`
    is the protocol's StepStatus number, which the store keeps as it is). A NamedTuple, not a
    frozen dataclass: every renewal with progress builds one, and a frozen dataclass's
    `__init__` (one `object.__setattr__` per field) cost 4-5 us against 1.3 (bench/renewal_path.py,
    docs/benchmarks.md twenty-fourth pass)."""

    step_index: int
    step_status: int
    summary: str
    #: The host's step limit for the attempt (Progress.max_steps); None when it did not say.
    max_steps: int | None = None
