"""ProviderHealth: when the cloud calls its model provider down, and when it is back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cloud.dispatch_holds import DispatchHolds
from cloud.provider_health import ProviderHealth
from cloud.store.database import Store
from cloud.store.engine import upgrade
from planner.errors import PlannerAuthError, PlannerUnavailable

NOON = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
async def holds(tmp_path: Path) -> AsyncIterator[DispatchHolds]:
    """The shared holds on a migrated SQLite store whose clock says noon."""
    store = Store.from_url(f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}")
    store.now = lambda: NOON  # type: ignore[method-assign]  # the pause's time is asserted
    await upgrade(store.engine)
    try:
        yield DispatchHolds(store, "r1")
    finally:
        await store.close()


async def test_down_after_failures_in_a_row_and_back_on_a_probe(holds: DispatchHolds) -> None:
    answers: list[Exception | None] = [PlannerUnavailable("still down"), None]

    async def probe() -> None:
        outcome = answers.pop(0)
        if outcome is not None:
            raise outcome

    health = ProviderHealth(holds, probe, threshold=3)
    woken: list[bool] = []
    holds.on_lifted.append(lambda: woken.append(True))
    await health.failed("overloaded")
    await health.failed("overloaded")
    await health.succeeded()  # one answer in between: not down for everyone
    await health.failed("overloaded")
    await health.failed("overloaded")
    assert health.pause is None
    await health.failed("planner: Anthropic is unavailable (HTTP 529 …)")
    assert health.pause is not None
    assert health.pause.describe() == (
        "the model provider is unavailable since 12:00:00 UTC (seen by replica r1): "
        "planner: Anthropic is unavailable (HTTP 529 …); dispatch resumes when a probe call "
        "or a Decide succeeds (next probe at 12:00:05 UTC)"
    )
    with pytest.raises(PlannerUnavailable):
        await health.probe_step()  # the supervised loop logs it and backs off
    assert health.pause is not None and not woken
    await health.probe_step()
    assert health.pause is None and woken == [True]
    await health.probe_step()  # nothing to probe while it answers
    assert answers == []


async def test_a_planner_that_cannot_be_down_never_pauses_dispatch(holds: DispatchHolds) -> None:
    health = ProviderHealth(holds, None, threshold=1)  # the offline provider: no probe
    await health.failed("?")
    assert health.pause is None


async def test_refused_credentials_pause_at_once_and_name_the_setting(
    holds: DispatchHolds,
) -> None:
    """One refusal of the key is enough (every call will be refused until an operator acts);
    an outage's pause becomes one for the key when the probe is refused, and a probe that
    succeeds resumes dispatch."""
    answers: list[Exception | None] = [PlannerAuthError("planner: Anthropic rejected the API key")]
    answers.append(None)

    async def probe() -> None:
        outcome = answers.pop(0)
        if outcome is not None:
            raise outcome

    health = ProviderHealth(holds, probe, threshold=3)
    health.key_setting = "AMC_PLANNER_ANTHROPIC_API_KEY"
    for _ in range(3):
        await health.failed("planner: Anthropic is unavailable (HTTP 529 …)")
    assert health.pause is not None and health.pause.key_setting is None
    with pytest.raises(PlannerAuthError):
        await health.probe_step()
    assert health.pause is not None
    assert health.pause.describe().startswith(
        "the model provider refused the API key since 12:00:00 UTC (seen by replica r1): "
        "planner: Anthropic rejected the API key; set AMC_PLANNER_ANTHROPIC_API_KEY to a key "
        "it accepts"
    )
    await health.probe_step()
    assert health.pause is None
    await health.refused("planner: Anthropic rejected the API key")  # a Decide: no threshold
    assert health.pause is not None and health.pause.key_setting is not None
