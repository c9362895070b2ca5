"""ProviderHealth: when the cloud calls its model provider down, and when it is back."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cloud.provider_health import ProviderHealth
from planner.errors import PlannerAuthError, PlannerUnavailable

NOON = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


async def test_down_after_failures_in_a_row_and_back_on_a_probe() -> None:
    answers: list[Exception | None] = [PlannerUnavailable("still down"), None]

    async def probe() -> None:
        outcome = answers.pop(0)
        if outcome is not None:
            raise outcome

    health = ProviderHealth(probe, threshold=3, clock=lambda: NOON)
    woken: list[bool] = []
    health.on_available.append(lambda: woken.append(True))
    health.failed("overloaded")
    health.failed("overloaded")
    health.succeeded()  # one answer in between: not down for everyone
    health.failed("overloaded")
    health.failed("overloaded")
    assert health.pause is None
    health.failed("planner: Anthropic is unavailable (HTTP 529 …)")
    assert health.pause is not None
    assert health.pause.describe() == (
        "the model provider is unavailable since 12:00:00 UTC: "
        "planner: Anthropic is unavailable (HTTP 529 …)"
    )
    with pytest.raises(PlannerUnavailable):
        await health.probe_step()  # the supervised loop logs it and backs off
    assert health.pause is not None and not woken
    await health.probe_step()
    assert health.pause is None and woken == [True]
    await health.probe_step()  # nothing to probe while it answers
    assert answers == []


def test_a_planner_that_cannot_be_down_never_pauses_dispatch() -> None:
    health = ProviderHealth(None, threshold=1)  # the offline provider: no probe
    health.failed("?")
    assert health.pause is None


async def test_refused_credentials_pause_at_once_and_name_the_setting() -> None:
    """One refusal of the key is enough (every call will be refused until an operator acts);
    an outage's pause becomes one for the key when the probe is refused, and a probe that
    succeeds resumes dispatch."""
    answers: list[Exception | None] = [PlannerAuthError("planner: Anthropic rejected the API key")]
    answers.append(None)

    async def probe() -> None:
        outcome = answers.pop(0)
        if outcome is not None:
            raise outcome

    health = ProviderHealth(probe, threshold=3, clock=lambda: NOON)
    health.key_setting = "AMC_PLANNER_ANTHROPIC_API_KEY"
    for _ in range(3):
        health.failed("planner: Anthropic is unavailable (HTTP 529 …)")
    assert health.pause is not None and health.pause.key_setting is None
    with pytest.raises(PlannerAuthError):
        await health.probe_step()
    assert health.pause is not None
    assert health.pause.describe().startswith(
        "the model provider refused the API key since 12:00:00 UTC: planner: Anthropic "
        "rejected the API key; set AMC_PLANNER_ANTHROPIC_API_KEY to a key it accepts"
    )
    await health.probe_step()
    assert health.pause is None
    health.refused("planner: Anthropic rejected the API key")  # a Decide: no threshold
    assert health.pause is not None and health.pause.key_setting is not None
