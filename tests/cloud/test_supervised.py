"""The supervised background loop (`cloud.supervised`): what the replica's jobs rely on.

Proves: a failing step does not end the loop, and the loop says so (the first failure with its
traceback, later ones in a line, and when the step works again); pauses double while failures
continue, up to a cap; a wake cuts a pause short; cancelling the task ends the loop
cleanly, even one woken at that moment, and a task that ignores a cancellation is cancelled
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from cloud import supervised


@pytest.mark.parametrize(
    ("failures", "interval", "expected"),
    [
        (0, 2.0, 2.0),
        (1, 2.0, 2.0),
        (2, 2.0, 4.0),
        (4, 2.0, 16.0),
        (6, 2.0, 30.0),  # capped
        (3, 3600.0, 3600.0),  # a loop slower than the cap keeps its own pace
    ],
)
def test_pause_after_failures(failures: int, interval: float, expected: float) -> None:
    assert supervised.pause_after(failures, interval) == expected


async def test_a_failing_step_is_logged_and_retried_until_it_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0
    recovered = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise ConnectionError(f"database away ({calls})")
        recovered.set()

    caplog.set_level(logging.INFO, logger="cloud.supervised")
    job = supervised.start("flaky", step, interval=0.001, max_backoff=0.01)
    try:
        await asyncio.wait_for(recovered.wait(), 10)
    finally:
        await supervised.stop([job])
    records = [r for r in caplog.records if r.name == "cloud.supervised"]
    assert [r.levelno for r in records[:4]] == [
        logging.ERROR,
        logging.WARNING,
        logging.WARNING,
        logging.INFO,
    ]
    assert records[0].exc_info is not None  # the first failure carries its traceback
    assert "database away (2)" in records[1].getMessage()
    assert "3 failed tries" in records[3].getMessage()


async def test_a_wake_cuts_the_pause_short() -> None:
    wake = asyncio.Event()
    ran = asyncio.Queue[int]()
    count = 0

    async def step() -> None:
        nonlocal count
        count += 1
        ran.put_nowait(count)

    # An hour between steps: only the wake can make the second step happen within the test.
    job = supervised.start("woken", step, interval=3600.0, wake=wake)
    try:
        assert await asyncio.wait_for(ran.get(), 10) == 1
        wake.set()
        assert await asyncio.wait_for(ran.get(), 10) == 2
    finally:
        await supervised.stop([job])


async def test_pause_first_waits_for_the_wake() -> None:
    wake = asyncio.Event()
    ran = asyncio.Event()

    async def step() -> None:
        ran.set()

    job = supervised.start("patient", step, interval=3600.0, wake=wake, pause_first=True)
    try:
        await asyncio.sleep(0)  # let the loop reach its first pause
        assert not ran.is_set()
        wake.set()
        await asyncio.wait_for(ran.wait(), 10)
    finally:
        await supervised.stop([job])


async def test_stop_ends_the_loop_even_mid_step() -> None:
    inside = asyncio.Event()

    async def step() -> None:
        inside.set()
        await asyncio.Event().wait()  # a step that never finishes on its own

    job = supervised.start("stuck", step, interval=1.0)
    await asyncio.wait_for(inside.wait(), 10)
    await supervised.stop([job])
    assert job.cancelled()


@pytest.mark.parametrize("turns", range(4))
async def test_stop_ends_a_loop_woken_as_it_is_cancelled(turns: int) -> None:
    """A wake set in the same moment as the cancellation: the pause must not swallow it (the
    `asyncio.wait_for` of Python 3.11 did, three times in four, and a replica's shutdown then
    waited forever; CI hung on it)."""
    wake = asyncio.Event()
    stepped = asyncio.Event()

    async def step() -> None:
        stepped.set()

    job = supervised.start("woken", step, interval=60.0, wake=wake)
    await stepped.wait()
    await asyncio.sleep(0)  # into the pause
    wake.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    # Not wait_for around stop(): its own timeout would cancel the job a second time.
    stopping = asyncio.create_task(supervised.stop([job]))
    try:
        await asyncio.wait({stopping}, timeout=10)
        assert stopping.done(), "stop() did not return"
    finally:
        job.cancel()
        await asyncio.gather(stopping, return_exceptions=True)


async def test_stop_cancels_again_a_task_that_ignored_one_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def stubborn() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # lost, as some library code does
            await asyncio.Event().wait()
        await asyncio.Event().wait()

    job = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="cloud.supervised"):
        await asyncio.wait_for(supervised.stop([job]), 10)
    assert job.cancelled()
    assert "still stopping stubborn" in caplog.text
