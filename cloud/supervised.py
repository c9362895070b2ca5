"""The replica's background loops (dispatch, sweep, host heartbeat, retention, database probe)
as one helper.

Each loop runs a step, pauses, and runs it again for as long as the replica lives, so a step
that fails (the database restarting, a bug hit by one row) must not end it: the failure is
logged (a database error scrubbed of its text, `cloud.store.errors.report`) and the step tried
again after a pause that doubles while failures continue (a database that is down is not
hammered, and its log is not flooded), and the loop says when the step works again. A wake
event cuts any pause short: work that just arrived is worth a try. The loop ends only when
its task is cancelled (`stop`), which is also how the replica shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Awaitable, Callable, Iterable
from typing import NoReturn

from cloud import metrics
from cloud.store import errors

log = logging.getLogger(__name__)

#: The longest pause after repeated failures (unless the loop's own interval is longer).
MAX_BACKOFF_S = 30.0

Step = Callable[[], Awaitable[object]]


def pause_after(failures: int, interval: float, max_backoff: float = MAX_BACKOFF_S) -> float:
    """Seconds to wait before the next try: `interval` after a success or a first failure,
    doubling with each further failure in a row, at most max(`interval`, `max_backoff`)."""
    if failures <= 1:
        return interval
    return min(interval * 2.0 ** (failures - 1), max(interval, max_backoff))


async def _pause(seconds: float, wake: asyncio.Event | None) -> None:
    """Sleep `seconds`, or less when `wake` is set (it is cleared for the next pause)."""
    if wake is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()
    wake.clear()


async def run_forever(
    name: str,
    step: Step,
    *,
    interval: float,
    wake: asyncio.Event | None = None,
    pause_first: bool = False,
    max_backoff: float = MAX_BACKOFF_S,
) -> NoReturn:
    """Run `step` every `interval` seconds (sooner when `wake` is set) until cancelled.

    With `pause_first` the loop waits before its first step (a set `wake` makes that at once).
    """
    failures = 0
    if pause_first:
        await _pause(interval, wake)
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            metrics.current().loop_failures.labels(loop=name).inc()
            seconds = pause_after(failures, interval, max_backoff)
            if failures == 1:
                errors.report(log, "%s failed; trying again in %.1f s", exc, name, seconds)
            elif errors.database_error(exc) is not None:
                log.warning(
                    "%s failed again (%d in a row): %s; trying again in %.1f s",
                    name, failures, errors.describe(exc), seconds,
                )  # fmt: skip
            else:
                log.warning(
                    "%s failed again (%d in a row): %s; trying again in %.1f s",
                    name, failures, exc, seconds,
                )  # fmt: skip
        else:
            if failures:
                log.info("%s works again after %d failed tries", name, failures)
            failures = 0
            seconds = interval
        await _pause(seconds, wake)


def start(
    name: str,
    step: Step,
    *,
    interval: float,
    wake: asyncio.Event | None = None,
    pause_first: bool = False,
    max_backoff: float = MAX_BACKOFF_S,
) -> asyncio.Task[None]:
    """`run_forever` as a task named `name` (stop it with `stop`)."""
    loop = run_forever(
        name,
        step,
        interval=interval,
        wake=wake,
        pause_first=pause_first,
        max_backoff=max_backoff,
    )
    return asyncio.create_task(loop, name=name)


async def finish(tasks: Iterable[asyncio.Task[object]], within: float) -> None:
    """Give `tasks` `within` seconds at most to end by themselves, then `stop` those left.

    For work a caller started under `asyncio.shield` (a new term after a clock gap, a read
    shared by several watchers): cancelling the caller at shutdown left it running, unawaited,
    on into a closed store, or destroyed pending with the loop ("Task was destroyed but it is
    pending")."""
    every = list(tasks)
    pending = [task for task in every if not task.done()]
    if pending and within > 0:
        await asyncio.wait(pending, timeout=within)
    await stop(every)


async def stop(tasks: Iterable[asyncio.Task[object]]) -> None:
    """Cancel every task and wait until each has ended (whatever it ended with)."""
    every = list(tasks)
    pending = [task for task in every if not task.done()]
    while pending:
        for task in pending:
            task.cancel()
        # Cancelled again until it ends: code that loses one cancellation (as `asyncio.wait_for`
        # did before Python 3.12 when its awaitable finished at the same moment) must not leave
        # shutdown waiting forever.
        await asyncio.wait(pending, timeout=1.0)
        pending = [task for task in pending if not task.done()]
        if pending:
            log.warning("still stopping %s", ", ".join(task.get_name() for task in pending))
    for task in every:
        try:
            # Retrieved: a loop that failed as it stopped ends quietly. (A cancelled task hands
            # its CancelledError over: it no longer keeps it.)
            ended = task.exception()
        except asyncio.CancelledError as cancelled:
            ended = cancelled
        if ended is not None:
            # Its traceback holds each frame it passed through with their locals: the step,
            # and through it the replica. A library frame that keeps the exception in a local
            # (SQLAlchemy's `_run_to_completion`) made that a cycle, and a stopped replica
            # waited for the cycle collector.
            traceback.clear_frames(ended.__traceback__)
        # A CancelledError raised here holds this frame in its traceback: kept in `ended` past
        # the loop, the frame and the exception were a cycle, and through the cleared frames'
        # functions (a closure over the store) the replica waited for the cycle collector.
        ended = None
