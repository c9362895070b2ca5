"""Model calls counted after their decision was cancelled.

A decision cancelled while a call not streamed was under way (a revoked or cancelled attempt,
a Decide its host gave up on) leaves that call to finish (`planner.errors.InFlight`): the
provider answers and bills it whether or not anyone waits. Whoever counts the decision's
spending (the cloud's Decide, the direct host's agent loop) hands it here with how to count
it; the count happens when the provider answers, in a task of its own, since the cancelled
caller is gone by then. A call that fails (the provider failed, the planner was closed first)
was not billed for an answer and counts nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from planner.decision import Billed
from planner.errors import InFlight

log = logging.getLogger(__name__)

#: The counts waiting for their call to answer (asyncio keeps only weak references to tasks).
_waiting: set[asyncio.Task[None]] = set()


def count_when_answered(
    in_flight: InFlight, count: Callable[[Billed], Awaitable[None]]
) -> asyncio.Task[None]:
    """`count(billed)` once the call answers, in a task of its own (returned)."""

    async def counted() -> None:
        try:
            turn = await in_flight.call
        except BaseException:  # no answer: nothing billed for one
            return
        billed = Billed(in_flight.provider, turn.model or in_flight.model, turn.usage)
        try:
            await count(billed)
        except Exception as failure:
            log.error(
                "a model call answered after its decision was cancelled (%d tokens, $%.4f) "
                "was not counted: %s",
                billed.usage.billed_tokens,
                billed.usage.cost_usd,
                type(failure).__name__,
            )

    task = asyncio.create_task(counted(), name="count-late-model-call")
    _waiting.add(task)
    task.add_done_callback(_waiting.discard)
    return task


async def settle() -> None:
    """Wait for the calls waited on to answer and be counted (a process about to close its
    planner and database bounds the wait)."""
    waiting = set(_waiting)
    if waiting:
        await asyncio.wait(waiting)
