"""Planning that is temporarily impossible, and how a step waits it out inside its lease.

A step can fail to get a decision for reasons that say nothing about its task: the model
provider is overloaded or down, it rate-limits, or the planner behind the cloud is unreachable.
Failing the attempt for that would spend the task's attempts on an outage (a ten-minute provider
incident would fail every running task). So such a step "could not be planned right now" — a
state distinct from "the task failed": the step waits with backoff and jitter, the lease stays
renewed (the loop's progress says "waiting for the model provider since …"), and it asks again.
Only the lease (revoked, lost) or the task's deadline ends the wait; at the deadline the attempt
ends with a retryable outcome, so the task keeps its remaining attempts.

This module is the one place that decides what counts as temporarily impossible, for every
planner transport and every cause; a new cause (a cloud restarting, say) is one more case in
`temporarily_impossible`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import grpc

from host.planner_client import CloudPlanError
from planner.errors import PlannerTransient

log = logging.getLogger(__name__)
T = TypeVar("T")

#: What the cloud answers while planning is temporarily impossible (and what gRPC itself
#: reports while the cloud cannot be reached).
_RETRY_LATER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


def temporarily_impossible(exc: BaseException) -> str | None:
    """Why planning cannot happen right now, or None when `exc` is a real failure.

    Direct transport: the planner's transient class (provider overloaded, failing, rate
    limited, unreachable). Cloud transport: Decide answered UNAVAILABLE or RESOURCE_EXHAUSTED.
    """
    if isinstance(exc, PlannerTransient):
        return str(exc)
    if isinstance(exc, CloudPlanError) and exc.code in _RETRY_LATER:
        return str(exc)
    return None


class PlanningPostponed(Exception):
    """Planning stayed impossible until the task's deadline came near: this attempt ends with a
    retryable outcome (the task is not failed for it)."""

    def __init__(self, reason: str, since: datetime) -> None:
        super().__init__(
            f"the model provider stayed unavailable since {since:%H:%M:%S} UTC until the "
            f"deadline came near: {reason}"
        )
        self.reason = reason
        self.since = since


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    """Backoff between attempts to plan: doubling from `initial_s` up to `max_s`, each wait
    drawn between half and all of that (so a fleet of waiting steps does not ask in step)."""

    initial_s: float = 1.0
    max_s: float = 30.0

    def delay(self, waits: int, rng: random.Random) -> float:
        base = min(self.max_s, self.initial_s * (2 ** min(waits, 30)))
        return float(base / 2 + rng.uniform(0, base / 2))


OnWait = Callable[[datetime, str], None]
"""Told (waiting since, reason) before each wait: the loop reports it as the step's progress."""


async def plan_patiently(
    plan: Callable[[], Awaitable[T]],
    *,
    on_wait: OnWait,
    deadline: datetime | None,
    policy: WaitPolicy,
    rng: random.Random | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`plan()`, asked again after each temporarily impossible answer until it gives a
    decision. Raises `PlanningPostponed` when the next wait would reach `deadline`; any other
    failure propagates at once. Cancelling the caller (the lease was revoked) ends the wait."""
    rng = rng or random.Random()
    since: datetime | None = None
    waits = 0
    while True:
        try:
            return await plan()
        except Exception as exc:
            reason = temporarily_impossible(exc)
            if reason is None:
                raise
        now = clock()
        since = since or now
        delay = policy.delay(waits, rng)
        waits += 1
        if deadline is not None and now + timedelta(seconds=delay) >= deadline:
            raise PlanningPostponed(reason, since)
        log.warning("planning impossible right now (wait %d, %.1fs): %s", waits, delay, reason)
        on_wait(since, reason)
        await sleep(delay)
