"""Turn SDK exceptions into planner errors with a reason an operator understands.

Both official SDKs already retried 429s and 5xx with backoff (honouring retry-after) by the time
an exception reaches us, so every error here is final for this decision.
"""

from __future__ import annotations

from typing import Any

from planner.errors import PlannerAuthError, PlannerError, PlannerRateLimited, PlannerUnavailable


def _detail(err: BaseException) -> str:
    body: Any = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    message = getattr(err, "message", None)
    return str(message or err)


def planner_error(err: BaseException, vendor: str, *, retries: int) -> PlannerError:
    """Map an SDK exception (anthropic or openai; they share the shape) to a PlannerError."""
    status = getattr(err, "status_code", None)
    detail = _detail(err)
    if status in (401, 403):
        return PlannerAuthError(f"planner: {vendor} rejected the API key ({detail})")
    if status == 429:
        return PlannerRateLimited(
            f"planner: {vendor} rate limit still hit after {retries} retries ({detail})"
        )
    if isinstance(status, int) and status >= 500:
        return PlannerUnavailable(
            f"planner: {vendor} is unavailable (HTTP {status} after {retries} retries: {detail})"
        )
    if status is None:
        return PlannerUnavailable(f"planner: cannot reach {vendor} ({detail})")
    return PlannerError(f"planner: {vendor} rejected the request (HTTP {status}: {detail})")
