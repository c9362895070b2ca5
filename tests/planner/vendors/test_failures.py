"""Provider failures become operator-readable reasons that never carry a key."""

from __future__ import annotations

from typing import Any

import pytest

from planner.errors import (
    PlannerAuthError,
    PlannerContextExceeded,
    PlannerRateLimited,
    PlannerRejected,
    PlannerTransient,
    PlannerUnavailable,
)
from planner.vendors.failures import IncompleteStream, StreamError, planner_error


class SdkError(Exception):
    """The shape both official SDKs' APIStatusError share (status_code, body); a stand-in
    because building the SDKs' own exceptions needs an httpx response object."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status_code = status
        self.body = {"error": {"message": message}}


def test_echoed_key_is_scrubbed_from_the_reason() -> None:
    echoed = "Incorrect API key provided: sk-proj-abc1*****************xyz9. See your keys."
    error = planner_error(SdkError(401, echoed), "OpenAI", retries=2)
    assert isinstance(error, PlannerAuthError)
    assert str(error).startswith("planner: OpenAI rejected the API key")
    assert "abc1" not in str(error)
    assert "xyz9" not in str(error)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(429, PlannerRateLimited), (503, PlannerUnavailable), (None, PlannerUnavailable)],
)
def test_status_maps_to_the_right_error(status: int | None, kind: type[Exception]) -> None:
    assert isinstance(planner_error(SdkError(status, "boom"), "Anthropic", retries=2), kind)


class StreamStatusError(SdkError):
    """What the Anthropic SDK raises for an `event: error` after HTTP 200."""

    def __init__(self, kind: str) -> None:
        super().__init__(200, "stream error")
        self.body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": kind}}


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (StreamStatusError("overloaded_error"), PlannerUnavailable),
        (StreamStatusError("api_error"), PlannerUnavailable),
        (StreamStatusError("rate_limit_error"), PlannerRateLimited),
        (StreamStatusError("invalid_request_error"), PlannerRejected),
        (SdkError(529, "Overloaded"), PlannerUnavailable),
        (SdkError(408, "timeout"), PlannerUnavailable),
        (SdkError(400, "bad"), PlannerRejected),
        (SdkError(404, "no such model"), PlannerRejected),
        (SdkError(402, "Your credit balance is too low"), PlannerAuthError),
        (SdkError(403, "not allowed"), PlannerAuthError),
        (StreamError("the Responses stream failed", "server_is_overloaded"), PlannerUnavailable),
        (
            StreamError("the Responses stream failed", "context_length_exceeded"),
            PlannerContextExceeded,
        ),
        (
            SdkError(400, "prompt is too long: 208656 tokens > 200000 maximum"),
            PlannerContextExceeded,
        ),
        (IncompleteStream("cut off"), PlannerUnavailable),
    ],
)
def test_error_classes(error: Exception, kind: type[Exception]) -> None:
    """Transient (wait and ask again), credentials (fail fast), invalid request (the one-time
    checkpoint): an overload inside a stream is transient whatever status the SDK carries."""
    mapped = planner_error(error, "anthropic", retries=2)
    assert type(mapped) is kind, mapped
    if kind in (PlannerUnavailable, PlannerRateLimited):
        assert isinstance(mapped, PlannerTransient)


def test_quota_exhausted_is_billing_not_a_rate_limit() -> None:
    """OpenAI answers an exhausted quota with 429 `insufficient_quota`: waiting cannot help."""
    error = SdkError(429, "You exceeded your current quota")
    error.body = {
        "error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}
    }
    mapped = planner_error(error, "openai", retries=2)
    assert isinstance(mapped, PlannerAuthError)
    assert str(mapped).startswith("planner: OpenAI refused the request for billing")
