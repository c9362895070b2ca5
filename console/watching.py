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
on where it stopped. Nor are tasks a stream sends again unchanged (a replica whose LISTEN
connection came back re-reads every task it shows).

A snapshot holds the unfinished tasks only, and nothing marks its end: a fleet watch back
from an outage could not tell the tasks that ended meanwhile from those still to come, and
never showed them (it went on saying they were queued or running). Once a new stream's
headers came (every change from then on follows) it reads what changed while it was away
itself (`_missed`): every unfinished task, the ones it showed unfinished that are not among
them (listed by their ids), and the ended ones made since the newest it knew of. That stream
asks for no snapshot (`skip_snapshot`): it would be the first of these reads again, read
before the headers. What a watch remembers of the tasks it showed is bounded (`Shown`): every
unfinished one, and only the ended ones shown last.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from amc.v1 import progress_service_pb2, task_service_pb2, types_pb2
from cloud.cert_validity import verify_failed
from console.client import OperatorClient, watch_progress
from console.formatting import TERMINAL

#: What a stream ends with when its replica stopped, crashed or could not be reached.
GONE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
#: The first pause before watching again, and the longest (the channel's reconnect backoff:
#: `console.client.secure_channel`).
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 5.0
#: How long the cloud may stay away before the watch gives up: longer than a deploy.
GIVE_UP_S = 300.0
#: How much older than the newest task a watch knew of a task made while it was away may be:
#: creation times are taken before the commit, and concurrent commits land in any order.
CREATED_SLACK_S = 60
_UNFINISHED = [
    types_pb2.TASK_STATUS_QUEUED,
    types_pb2.TASK_STATUS_ASSIGNED,
    types_pb2.TASK_STATUS_RUNNING,
]
#: How many ended tasks a watch remembers, those shown ending last: what tells an end sent again
#: (a catch-up lists those made in the last `CREATED_SLACK_S` or so; a replica back on LISTEN,
#: those ended since shortly before the last notification it heard, which on a quiet fleet
#: can be long ago) from a new one. An end forgotten and sent again is shown
#: twice; an unfinished task is never forgotten (a catch-up looks for its end).
ENDED_KEPT = 2_000
#: Task ids per ListTasks call of a catch-up (`ListTasksRequest.task_ids` holds at most 500).
IDS_PER_CALL = 500


class Shown:
    """The tasks a watch showed, each as last shown: every unfinished one and the last
    `ended_kept` that ended. A watch kept every task it ever showed: a fleet watch left running
    on a busy cloud grew by every task the fleet ran."""

    def __init__(self, ended_kept: int = ENDED_KEPT) -> None:
        self._tasks: dict[str, types_pb2.Task] = {}
        self._ended: dict[str, None] = {}  # in the order they were shown ending
        self._ended_kept = ended_kept

    def __len__(self) -> int:
        return len(self._tasks)

    def get(self, task_id: str) -> types_pb2.Task | None:
        """The task as last shown; None when never shown (or forgotten since it ended)."""
        return self._tasks.get(task_id)

    def put(self, task: types_pb2.Task) -> None:
        """`task` was shown as it is now."""
        self._tasks[task.task_id] = task
        self._ended.pop(task.task_id, None)
        if task.status in TERMINAL:
            self._ended[task.task_id] = None
            while len(self._ended) > self._ended_kept:
                oldest = next(iter(self._ended))
                del self._ended[oldest], self._tasks[oldest]

    def unfinished(self) -> list[types_pb2.Task]:
        """The tasks last shown unfinished."""
        return [t for t in self._tasks.values() if t.status not in TERMINAL]


def _age(task: types_pb2.Task, shown: types_pb2.Task | None) -> int:
    """How `task` compares with `shown`, the same task as last shown: below 0 older (a read may
    be older than what a stream sent since), 0 unchanged, above 0 newer. By the time of its last
    write, which every change but a decision's spend and a call of unknown cost moves, then by
    that spend and those calls: two reads of an unchanged live task differ all the same
    (`totals.wall_time` is counted at the read)."""
    if shown is None:
        return 1
    if task.status in TERMINAL and shown.status not in TERMINAL:
        # An end is never older than what it ends, whatever the clock of the replica that
        # wrote it said (a replica a few milliseconds behind would hide it for good).
        return 1
    moved = task.updated_at.ToNanoseconds() - shown.updated_at.ToNanoseconds()
    if moved:
        return moved
    # A decision counted moves the task's totals, not its updated_at: every figure only grows.
    spent, was = _spent(task), _spent(shown)
    if spent != was:
        return (spent > was) - (spent < was)
    # Calls of unknown cost come and go (decision 0080), so they cannot say which is older: a
    # change of them is newer (a stream sends them in order, after the reads it catches up with).
    return int(task.totals.unsettled != shown.totals.unsettled)


def _spent(task: types_pb2.Task) -> tuple[int, int, int, int, int, float]:
    totals, usage = task.totals, task.totals.usage
    return (
        totals.decisions,
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_input_tokens,
        usage.cache_creation_input_tokens,
        usage.cost_usd,
    )


async def _listed(
    client: OperatorClient,
    statuses: list[types_pb2.TaskStatus.ValueType],
    after: int | None,
    task_ids: list[str] | None = None,
) -> AsyncIterator[types_pb2.Task]:
    """ListTasks' tasks in `statuses` (and among `task_ids`, when given), newest first, down
    to those made at `after` (ns)."""
    token = ""
    while True:
        page: task_service_pb2.ListTasksResponse = await client.tasks.ListTasks(
            task_service_pb2.ListTasksRequest(
                page_size=500, page_token=token, statuses=statuses, task_ids=task_ids or ()
            )
        )
        for task in page.tasks:
            if after is not None and task.created_at.ToNanoseconds() < after:
                return
            yield task
        token = page.next_page_token
        if not token:
            return


async def _missed(
    client: OperatorClient, shown: Shown, newest: Timestamp | None
) -> list[types_pb2.Task]:
    """The tasks that changed since `shown` (a fleet watch back from an outage): every
    unfinished one, the ones shown unfinished but not among them (ended), and the ended ones
    made since `newest` (the newest made that the watch knew of; None: none). The ended ones
    shown unfinished are listed by their ids, `IDS_PER_CALL` a call: read one GetTask each, a
    watch of a busy fleet back from a deploy made as many calls as tasks ended meanwhile."""
    now = {t.task_id: t async for t in _listed(client, _UNFINISHED, None)}
    after = None if newest is None else newest.ToNanoseconds() - CREATED_SLACK_S * 10**9
    now.update({t.task_id: t async for t in _listed(client, sorted(TERMINAL), after)})
    gone = [t.task_id for t in shown.unfinished() if t.task_id not in now]
    for i in range(0, len(gone), IDS_PER_CALL):
        ids = gone[i : i + IDS_PER_CALL]
        wanted = set(ids)  # kept to: a cloud of an earlier release lists every task
        now.update(
            {t.task_id: t async for t in _listed(client, [], None, ids) if t.task_id in wanted}
        )
    return [t for t in now.values() if _age(t, shown.get(t.task_id)) > 0]


async def watch_through_restarts(
    client: OperatorClient,
    task_id: str = "",
    *,
    thinking: bool = False,
    gone: Callable[[str], None] = lambda why: None,
    check: Callable[[], object] = lambda: None,
) -> AsyncGenerator[progress_service_pb2.WatchProgressResponse, None]:
    """`console.client.watch_progress`, opened again after the cloud went away; ends when a
    watched single task ends. `gone(why)` is told once each time the cloud went away.
    `check()` raises when this side's own certificate would be refused now (it expired while
    the watch ran): called before each new stream, as a refused handshake says only "Socket
    closed". A cloud certificate this side refused (`verify_failed`) is raised at once too:
    neither heals by waiting, and the watch retried it for `GIVE_UP_S`."""
    shown = Shown()
    #: The newest task made that a fleet watch knew of (`_missed`), once it watched.
    newest: Timestamp | None = None
    watched = False
    away_since: float | None = None
    pause = FIRST_PAUSE_S

    def back() -> None:
        # The cloud watches again: the outage is over, though a quiet fleet sends nothing (a
        # later restart is a new outage, not the old one's, given up on at once).
        nonlocal away_since, pause
        away_since, pause = None, FIRST_PAUSE_S

    async def catch_up() -> list[types_pb2.Task]:
        nonlocal newest, watched
        if watched:
            return await _missed(client, shown, newest)
        first: task_service_pb2.ListTasksResponse = await client.tasks.ListTasks(
            task_service_pb2.ListTasksRequest(page_size=1)
        )
        newest, watched = (first.tasks[0].created_at if first.tasks else None), True
        return []

    while True:
        try:
            async for change in watch_progress(
                client.progress,
                task_id,
                thinking=thinking,
                # What `catch_up` reads: the cloud need not read it again before the headers.
                snapshot=bool(task_id) or not watched,
                watching=back,
                catch_up=None if task_id else catch_up,
            ):
                if change.HasField("task"):
                    task, before = change.task, shown.get(change.task.task_id)
                    if _age(task, before) <= 0:  # shown already, or older than shown
                        continue
                    shown.put(task)
                    if newest is None or task.created_at.ToNanoseconds() > newest.ToNanoseconds():
                        newest = task.created_at
                yield change
            why = "its stream ended before the task did"
        except grpc.aio.AioRpcError as error:
            if error.code() not in GONE or verify_failed(error.details() or ""):
                raise
            if away_since is not None and time.monotonic() - away_since > GIVE_UP_S:
                raise
            why = (error.details() or error.code().name).splitlines()[0]
        last = shown.get(task_id) if task_id else None
        if last is not None and last.status in TERMINAL:
            return
        if away_since is None:
            away_since = time.monotonic()
            gone(why)
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE_S)
        check()
