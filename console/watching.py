"""A watch that outlives the cloud's restarts (`amc task watch`).

One WatchProgress stream ends with the replica that serves it: a deploy (SIGTERM) or a crash
took `amc task watch` down with it, exit 4, while the task went on and ended on the next
process. An operator watching a task through a deploy, or a script waiting for its exit code,
had to start again by hand. Here the watch opens a new stream whenever the old one broke or
ended before its task did, with a doubling pause, and gives up (the gRPC error, as before)
only once the cloud stayed away for `GIVE_UP_S`. The caller reaches the cloud first (a watch
of one task resolves its id, a watch of the fleet lists a task), so a wrong address or
certificate is still said at once, as by every other command. Each new stream starts with a
snapshot: tasks unchanged since they were last shown are not shown again, so the output goes
on where it stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable

import grpc

from amc.v1 import progress_service_pb2, progress_service_pb2_grpc, types_pb2
from console.client import watch_progress
from console.formatting import TERMINAL

#: What a stream ends with when its replica stopped, crashed or could not be reached.
GONE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
#: The first pause before watching again, and the longest (the channel's reconnect backoff:
#: `console.client.secure_channel`).
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 5.0
#: How long the cloud may stay away before the watch gives up: longer than a deploy.
GIVE_UP_S = 300.0


async def watch_through_restarts(
    stub: progress_service_pb2_grpc.ProgressServiceStub,
    task_id: str = "",
    *,
    thinking: bool = False,
    gone: Callable[[str], None] = lambda why: None,
) -> AsyncGenerator[progress_service_pb2.WatchProgressResponse, None]:
    """`console.client.watch_progress`, opened again after the cloud went away; ends when a
    watched single task ends. `gone(why)` is told once each time the cloud went away."""
    shown: dict[str, types_pb2.Task] = {}
    away_since: float | None = None
    pause = FIRST_PAUSE_S

    def back() -> None:
        # The cloud watches again: the outage is over, though a quiet fleet sends nothing (a
        # later restart is a new outage, not the old one's, given up on at once).
        nonlocal away_since, pause
        away_since, pause = None, FIRST_PAUSE_S

    while True:
        try:
            async for change in watch_progress(stub, task_id, thinking=thinking, watching=back):
                if change.HasField("task"):
                    if change.snapshot and shown.get(change.task.task_id) == change.task:
                        continue
                    shown[change.task.task_id] = change.task
                yield change
            why = "its stream ended before the task did"
        except grpc.aio.AioRpcError as error:
            if error.code() not in GONE:
                raise
            if away_since is not None and time.monotonic() - away_since > GIVE_UP_S:
                raise
            why = (error.details() or error.code().name).splitlines()[0]
        if task_id and task_id in shown and shown[task_id].status in TERMINAL:
            return
        if away_since is None:
            away_since = time.monotonic()
            gone(why)
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE_S)
