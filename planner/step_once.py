"""One plan per planning step: a Decide retried after a lost answer is not planned twice.

A host names each planning step of an attempt (`DecideRequest.step_key`) and sends the same key
when it asks again because the answer did not reach it (the stream was reset, the cloud
restarted, the call's deadline passed). The decision log stores the key with the decision,
unique per attempt, so a retry that arrives after the decision was logged gets that decision
back. `StepPlans` covers the two windows before that, inside one replica:

- a retry that arrives while the first call is still planning (its caller went away, the plan
  did not) waits for that plan instead of calling the model a second time;
- a plan whose logging failed (the database went away after the model answered) is kept, and
  the retry logs it without calling the model again.

A plan therefore runs to its end even when the call that started it is cancelled (the model
call is paid for either way, and its answer is what the retry will need); Decide then logs it
when it ends, as a retry may never come. Plans that were never logged are forgotten after
`keep_s`; a failed plan is forgotten at once (the retry plans anew).
Across replicas the decision log's unique key is the backstop: two replicas may both plan one
step, but only one decision is logged and both answer with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from planner.decision import Decision

MAX_STEP_KEY = 64

StepId = tuple[str, int, str]
"""(task id, attempt, step key)."""


def step_key_problem(key: str) -> str | None:
    """INVALID_ARGUMENT text for a step key outside the contract, or None."""
    if len(key) > MAX_STEP_KEY:
        return f"step_key: at most {MAX_STEP_KEY} characters"
    if not all("!" <= c <= "~" for c in key):
        return "step_key: printable ASCII characters without spaces only"
    return None


class StepPlans:
    """This replica's plans by step, from the first call until the decision is logged."""

    def __init__(self, keep_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._keep_s = keep_s
        self._clock = clock
        self._plans: dict[StepId, tuple[float, asyncio.Future[Decision]]] = {}

    def __len__(self) -> int:
        return len(self._plans)

    async def plan(self, step: StepId, make: Callable[[], Awaitable[Decision]]) -> Decision:
        """The step's decision: the plan already running or made for it, else a new one."""
        self._expire()
        held = self._plans.get(step)
        if held is None:
            future: asyncio.Future[Decision] = asyncio.ensure_future(make())
            self._plans[step] = (self._clock(), future)
            future.add_done_callback(lambda done: self._on_done(step, done))
        else:
            future = held[1]
        return await asyncio.shield(future)

    def running(self, step: StepId) -> asyncio.Future[Decision] | None:
        """The plan held for the step (still planning, or planned and not logged), if any."""
        held = self._plans.get(step)
        return None if held is None else held[1]

    def unfinished(self) -> list[asyncio.Future[Decision]]:
        """The plans still asking the model."""
        return [future for _, future in self._plans.values() if not future.done()]

    def logged(self, step: StepId) -> None:
        """The step's decision is in the decision log: the log answers from now on."""
        self._plans.pop(step, None)

    def _on_done(self, step: StepId, future: asyncio.Future[Decision]) -> None:
        # A failed plan is not kept (the next call plans anew); reading the exception here also
        # keeps asyncio from reporting it as never retrieved when every caller went away.
        if future.cancelled() or future.exception() is not None:
            held = self._plans.get(step)
            if held is not None and held[1] is future:
                del self._plans[step]

    def _expire(self) -> None:
        """Forget plans made more than `keep_s` ago that ended. The dict is in the order the
        plans were made, so this looks at the old ones only, not at every plan in flight on
        every Decide (thousands, on a replica of a big fleet)."""
        cutoff = self._clock() - self._keep_s
        old: list[StepId] = []
        for step, (at, future) in self._plans.items():
            if at >= cutoff:
                break
            if future.done():
                old.append(step)
        for step in old:
            del self._plans[step]
