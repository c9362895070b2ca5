"""Planning that is temporarily impossible, and how a step waits it out inside its lease.

A step can fail to get a decision for reasons that say nothing about its task: the model
provider is overloaded or down, it rate-limits, the cloud planning for the host is restarting or
unreachable, its database is away, or the answer was lost on the way back (a reset stream, a
call past its deadline). Failing the attempt for that would spend the task's attempts on an
outage (a ten-minute provider incident, or a rolling deploy of the cloud, would fail every
running task). So such a step "could not be planned right now" — a state distinct from "the
task failed": the step waits with backoff and jitter, the lease stays renewed (the loop's
progress says "waiting for the model provider since …", or the cloud, or its database), and it
asks again. Asking again is safe on the cloud transport: the request names its step
(`DecideRequest.step_key`), so a decision already made for it is returned, not made twice.
Only the lease (revoked, lost, run out) or the task's deadline ends the wait; at the deadline
the attempt ends with a retryable outcome, so the task keeps its remaining attempts.

This module is the one place that decides what counts as temporarily impossible, for every
planner transport and every cause: `temporarily_impossible`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import grpc

from host.planner_client import CloudPlanError
from planner.errors import MODEL_PROVIDER, PlannerTransient

log = logging.getLogger(__name__)
T = TypeVar("T")

#: What the cloud answers while planning is temporarily impossible (UNAVAILABLE also while it
#: cannot be reached or its database is away), and what gRPC reports when an answer was lost:
#: the call cancelled by a restarting cloud or a reset stream, or past its deadline. ABORTED is
#: a session-mode conversation continued by another call at the same moment: ask again.
_RETRY_LATER = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    }
)
#: gRPC reports a stream the peer reset mid-call as INTERNAL with this in its details; any
#: other INTERNAL is a fault of the cloud that asking again would only repeat.
_RESET_STREAM = "RST_STREAM"


@dataclass(frozen=True, slots=True)
class Impossible:
    """Why planning cannot happen right now: what is unavailable (for the progress line), the
    error's own words, and how long the model provider asked to wait (seconds; None when it
    did not say; on the cloud transport the cloud passes it on as `amc-retry-after-s`)."""

    waiting_for: str
    reason: str
    retry_after: float | None = None


def temporarily_impossible(exc: BaseException) -> Impossible | None:
    """Why planning cannot happen right now, or None when `exc` is a real failure.

    Direct transport: the planner's transient class (provider overloaded, failing, rate
    limited, unreachable). Cloud transport: Decide answered UNAVAILABLE or RESOURCE_EXHAUSTED
    (the cloud says what is unavailable in its trailing metadata; without it, the cloud itself
    could not be reached), or the answer was lost (CANCELLED, DEADLINE_EXCEEDED, a reset
    stream), or a session conversation was busy (ABORTED).
    """
    if isinstance(exc, PlannerTransient):
        return Impossible(MODEL_PROVIDER, str(exc), exc.retry_after)
    if not isinstance(exc, CloudPlanError):
        return None
    reset = exc.code == grpc.StatusCode.INTERNAL and _RESET_STREAM in str(exc)
    if exc.code in _RETRY_LATER or reset:
        return Impossible(exc.waiting_for or "the cloud", str(exc), exc.retry_after)
    return None


class PlanningPostponed(Exception):
    """Planning stayed impossible until the task's deadline came near: this attempt ends with a
    retryable outcome (the task is not failed for it)."""

    def __init__(self, impossible: Impossible, since: datetime) -> None:
        super().__init__(
            f"{impossible.waiting_for} stayed unavailable since {since:%H:%M:%S} UTC until the "
            f"deadline came near: {impossible.reason}"
        )
        self.reason = impossible.reason
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


class CloudBack:
    """Said each time the lease stream is welcomed (again): the cloud that could not plan a
    moment ago (restarting in a rolling deploy, unreachable) may plan now.

    A step waiting out its backoff asks again at once instead of sleeping on: the backoff grows
    to `WaitPolicy.max_s` (30 s) during an outage, and without this every running step of the
    host idled up to that long after the cloud came back. Asking early is safe (a Decide names
    its step) and costs one ask if planning is still impossible; the backoff then carries on
    where it was. Each ask waits for the next welcome after it was sent."""

    def __init__(self) -> None:
        self._next = asyncio.Event()

    def said(self) -> None:
        """The stream was welcomed: wake every step waiting now."""
        self._next.set()
        self._next = asyncio.Event()

    def next(self) -> asyncio.Event:
        """Set at the next welcome."""
        return self._next


async def _sleep_unless_back(sleeping: Awaitable[None], back: asyncio.Event) -> None:
    """`sleeping`, cut short when `back` is set."""
    waits = [asyncio.ensure_future(sleeping), asyncio.ensure_future(back.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


OnWait = Callable[[datetime, Impossible], Awaitable[None]]
"""Told (waiting since, why) before each wait: the loop reports it as the step's progress."""


async def plan_patiently(
    plan: Callable[[], Awaitable[T]],
    *,
    on_wait: OnWait,
    deadline: float | None,
    policy: WaitPolicy,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    cloud_back: CloudBack | None = None,
) -> T:
    """`plan()`, asked again after each temporarily impossible answer until it gives a
    decision. Each wait is at least what the provider asked for (a rate limit's retry-after,
    which the planner leaves to us when it is long): asking sooner only meets the same limit.
    Raises `PlanningPostponed` when the next wait would reach `deadline`; any other failure
    propagates at once. Cancelling the caller (the lease was revoked) ends the wait.

    `deadline` is on `clock`, the monotonic clock (`TaskSpec.deadline`): the host's wall clock
    can step while a step waits (NTP, an operator), and a deadline compared with it would be
    read as past (the attempt given up early) or as hours away (a wait past the task's end).
    The wall clock only dates the wait for the progress line. `cloud_back`: a welcome of the
    lease stream ends the current wait early (`CloudBack`)."""
    rng = rng or random.Random()
    since: datetime | None = None
    waits = 0
    while True:
        # Taken before asking: a welcome while the ask failed (likely in a rolling deploy, as
        # the stream reconnects first) ends the wait at once instead of being missed.
        welcome = cloud_back.next() if cloud_back is not None else None
        try:
            return await plan()
        except Exception as exc:
            impossible = temporarily_impossible(exc)
            if impossible is None:
                raise
        since = since or datetime.now(UTC)
        delay = max(policy.delay(waits, rng), impossible.retry_after or 0.0)
        waits += 1
        if deadline is not None and clock() + delay >= deadline:
            raise PlanningPostponed(impossible, since)
        log.warning(
            "planning impossible right now (wait %d, %.1fs): %s", waits, delay, impossible.reason
        )
        # The provider's outage or rate limit is not ended by the cloud coming back.
        cloud_was_away = impossible.waiting_for != MODEL_PROVIDER and not impossible.retry_after
        back = welcome if cloud_was_away else None
        await on_wait(since, impossible)
        if back is None:
            await sleep(delay)
        else:
            await _sleep_unless_back(sleep(delay), back)
