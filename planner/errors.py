"""Planner failures, each carrying a message an operator can act on (never a stack trace)."""

from __future__ import annotations


class PlannerError(Exception):
    """The planner could not produce a decision. `str(err)` is the operator-facing reason."""


class PlannerAuthError(PlannerError):
    """The provider rejected the credentials ("planner: Anthropic rejected the API key")."""


class PlannerUnavailable(PlannerError):
    """The provider failed (5xx, overloaded, network, timeout) after the SDK's own retries."""


class PlannerRejected(PlannerError):
    """The provider refused the request itself (HTTP 4xx other than credentials and rate
    limits): sending it again unchanged fails the same way."""


class PlannerRateLimited(PlannerError):
    """The provider kept answering 429 after the SDK's own retries with backoff."""


class SessionStateError(PlannerError):
    """A session was used out of order (a tool result with no call waiting, or for a call the
    conversation never made)."""


class ToolCallError(ValueError):
    """A tool call the model made is unusable. The message is sent back to the model verbatim in
    the one corrective retry, so it says exactly what was wrong and how to fix it."""
