"""The one place SDK exceptions become planner errors, for every vendor and both planning modes.

Both official SDKs already retried 429s and 5xx with backoff (honouring retry-after) by the time
an exception reaches us, so every error here is final for this call. The reason an operator
reads never carries an API key: providers echo (partly masked) keys in 401 messages, and a
reason ends up in task results, logs and the decision log.
"""

from __future__ import annotations

import re
from typing import Any

import anthropic
import httpx
import httpx2
import openai

from planner.errors import (
    PlannerAuthError,
    PlannerError,
    PlannerRateLimited,
    PlannerRejected,
    PlannerUnavailable,
)

#: Key-like tokens (`sk-…`, `sk-ant-…`, also the partly masked `sk-abc***xyz` some providers echo
#: back in a 401 message).
_KEY_LIKE = re.compile(r"\b(sk|key)-[A-Za-z0-9_*.\-]{4,}")


class IncompleteStream(RuntimeError):
    """A streamed answer ended before it was complete; the partial turn is discarded."""


def scrub(text: str) -> str:
    """`text` with anything that looks like an API key replaced."""
    return _KEY_LIKE.sub(r"\1-•••", text)


def _detail(err: BaseException) -> str:
    body: Any = getattr(err, "body", None)
    text = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            text = str(inner["message"])
    if text is None:
        text = str(getattr(err, "message", None) or err)
    return scrub(text)


def planner_error(err: BaseException, vendor: str, *, retries: int) -> PlannerError:
    """Map an SDK exception (anthropic or openai; they share the shape) to a PlannerError.

    `vendor` is the adapter name ("anthropic", "openai") or its label ("Anthropic", "OpenAI").
    """
    label = {"anthropic": "Anthropic", "openai": "OpenAI"}.get(vendor, vendor)
    if isinstance(err, PlannerError):
        return err
    if isinstance(err, IncompleteStream):
        return PlannerUnavailable(f"planner: {label} stream broke off ({scrub(str(err))})")
    if not hasattr(err, "status_code") and not _is_connection_error(err):
        return PlannerError(f"planner: {label} call failed: {scrub(str(err))}")
    status = getattr(err, "status_code", None)
    detail = _detail(err)
    if status == 401:
        return PlannerAuthError(f"planner: {label} rejected the API key")
    if status == 403:
        return PlannerAuthError(f"planner: {label} rejected the API key ({detail})")
    if status == 429:
        return PlannerRateLimited(
            f"planner: {label} rate limit still hit after {retries} retries ({detail})"
        )
    if isinstance(status, int) and status >= 500:
        return PlannerUnavailable(
            f"planner: {label} is unavailable (HTTP {status} after {retries} retries: {detail})"
        )
    if status is None:
        return PlannerUnavailable(f"planner: cannot reach {label} ({detail})")
    return PlannerRejected(f"planner: {label} rejected the request (HTTP {status}: {detail})")


def _is_connection_error(err: BaseException) -> bool:
    """The SDKs' connection and timeout errors, and a transport error raised mid-stream (the
    Anthropic SDK lets those through unwrapped while it reads the events)."""
    return isinstance(
        err,
        anthropic.APIConnectionError
        | openai.APIConnectionError
        | httpx2.RequestError
        | httpx.RequestError,
    )
