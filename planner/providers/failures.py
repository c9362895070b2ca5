"""Turn SDK exceptions into planner errors with a reason an operator understands.

Both official SDKs already retried 429s and 5xx with backoff (honouring retry-after) by the time
an exception reaches us, so every error here is final for this decision.
"""

from __future__ import annotations

import re
from typing import Any

from planner.errors import (
    PlannerAuthError,
    PlannerError,
    PlannerRateLimited,
    PlannerRejected,
    PlannerUnavailable,
)

#: Key-like tokens (`sk-…`, `sk-ant-…`, also the partly masked `sk-abc***xyz` some providers echo
#: back in a 401 message): an error reason ends up in task results, logs and the decision log.
_KEY_LIKE = re.compile(r"\b(sk|key)-[A-Za-z0-9_*.\-]{4,}")


def _detail(err: BaseException) -> str:
    body: Any = getattr(err, "body", None)
    text = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            text = str(inner["message"])
    if text is None:
        text = str(getattr(err, "message", None) or err)
    return _KEY_LIKE.sub(r"\1-•••", text)


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
    return PlannerRejected(f"planner: {vendor} rejected the request (HTTP {status}: {detail})")
