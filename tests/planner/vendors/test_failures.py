"""Provider failures become operator-readable reasons that never carry a key."""

from __future__ import annotations

import pytest

from planner.errors import PlannerAuthError, PlannerRateLimited, PlannerUnavailable
from planner.vendors.failures import planner_error


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
