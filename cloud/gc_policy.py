"""The garbage collector's policy for a replica process that holds thousands of host streams.

CPython's full collection walks every tracked object. A replica holding 10,000 host streams
keeps millions of long-lived objects (each stream's call, tasks, queue, messages), and measured
(docs/benchmarks.md, issue 21) its full collections came every 15-20 s and stopped the event
loop for 1.2-1.7 s each: every renewal waiting behind such a pause made the ack p99, and they
took 14 CPU-seconds in 7 minutes. Objects that have survived a while are nearly always still
live (a stream lasts hours), so every `freeze_every` seconds the policy calls `gc.freeze()`:
what exists now leaves the collector's sight, and collections walk only what is newer than the
last freeze. While it runs, young collections wait for `YOUNG_THRESHOLD` net allocations, so
the streams' short-lived but live objects are not walked again and again before they die.

A step freezes without collecting first. A young collection before each freeze would keep
fresh cyclic garbage out of the frozen set, but a busy replica's young objects are nearly all
alive (every stream's pending read, the renewals in flight): at 2,000 renewals/s it walked
tens of thousands of them every second, stopping the loop for 30-55 ms, and found 20-100 dead
objects (docs/decisions/0071-gc-freeze.md, tenth pass of issue 21).
What freezing costs instead: garbage in a reference cycle (a stream that ended in one, an
exception's frames) is not reclaimed while frozen. Every `thaw_every` seconds the policy
unfreezes everything and runs one full collection (the one long pause, logged with its length
and what it found), then freezes again, so frozen garbage is bounded by what the process
leaves in cycles in that time.

The collector is process-wide, so the policy belongs to the process's entry point
(`cloud.server.serve`), not to a `CloudServer`, of which a process (the tests) may hold several.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

from cloud import metrics, supervised

log = logging.getLogger(__name__)


#: Net allocations of tracked objects that start a young collection between two freezes
#: (CPython's default is 700; a freeze resets the count). A replica's young objects are mostly
#: alive, not garbage: each host stream's pending read (its coroutine, future and callbacks)
#: lives until the host's next message, and the renewals in flight until their batch is
#: answered. At 700 the collector walked them again and again before they died or were frozen:
#: about 30 young collections a second at 2,000 renewals/s, each walking thousands of live
#: objects (8,000-30,000 on a busy replica) and finding next to nothing. At this threshold they
#: are frozen before the collector looks at them (docs/benchmarks.md, issue 21). The collector
#: still runs by itself should something allocate this much between two of the policy's steps.
YOUNG_THRESHOLD = 100_000


class GcPolicy:
    """Freeze survivors every `freeze_every` s; thaw and collect fully every `thaw_every` s."""

    def __init__(self, freeze_every: float, thaw_every: float) -> None:
        self.freeze_every = freeze_every
        self.thaw_every = thaw_every
        self._thawed_at = time.monotonic()
        self._started_at = 0.0

    def step(self) -> None:
        """One pass: a freeze, after (when due) a thaw and a full collection."""
        now = time.monotonic()
        if now - self._thawed_at >= self.thaw_every:
            self._thawed_at = now
            gc.unfreeze()
            found = gc.collect()
            seconds = time.monotonic() - now
            log.info("full garbage collection: %d unreachable objects in %.3f s", found, seconds)
        gc.freeze()

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        """`gc.callbacks` hook: every collection's pause, by generation, in the metrics."""
        if phase == "start":
            self._started_at = time.perf_counter()
        elif self._started_at:
            pause = time.perf_counter() - self._started_at
            metrics.current().gc_pause.labels(generation=str(info["generation"])).observe(pause)

    async def run(self) -> None:
        """Until cancelled: the collector's pauses are timed, survivors frozen periodically.
        On the way out everything is unfrozen (the process may go on, as the tests do)."""

        async def step() -> None:
            self.step()

        gc.callbacks.append(self._timed)
        thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, *thresholds[1:])
        try:
            await supervised.run_forever("gc", step, interval=self.freeze_every, pause_first=True)
        finally:
            gc.set_threshold(*thresholds)
            gc.callbacks.remove(self._timed)
            gc.unfreeze()


def start(freeze_every: float, thaw_every: float) -> asyncio.Task[None] | None:
    """The policy as a background task, or None when `freeze_every` is 0 (collector left as
    CPython sets it). Stop it with `cloud.supervised.stop`."""
    if freeze_every <= 0:
        return None
    return asyncio.create_task(GcPolicy(freeze_every, thaw_every).run(), name="gc-policy")
