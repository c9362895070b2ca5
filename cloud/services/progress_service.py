"""ProgressService.WatchProgress: the current snapshot, then every change. Operators only."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from typing import Final, Literal

import grpc

from amc.v1 import progress_service_pb2 as pb
from amc.v1 import progress_service_pb2_grpc, types_pb2
from cloud import supervised
from cloud.events import EventBus, Extension
from cloud.services.status import abort
from cloud.store import convert, states, tasks
from cloud.store.database import Store
from cloud.store.spend import TaskSpent
from cloud.store.tasks import TaskView
from planner.convert import usage_from_proto, usage_to_proto

_SNAPSHOT_CHUNK = 200
#: `_Shown.extend`: the task stays as sent.
KEPT: Final = "kept"


class _Shown:
    """The live tasks as one stream last sent them, to apply lease extensions, progress,
    totals and calls of unknown cost to."""

    def __init__(self) -> None:
        self._tasks: dict[str, types_pb2.Task] = {}
        #: Per task sent: the steps of its attempts but the current one (`TaskTotals.steps`).
        self._other_steps: dict[str, int] = {}
        #: Per task sent: when the reading of its unsettled calls as sent began.
        self._read_at: dict[str, dt.datetime | None] = {}

    def keep(self, view: TaskView) -> types_pb2.Task:
        """`view` as the stream sends it, remembered while the task is not finished."""
        task = convert.task(view, with_attempts=False)
        if view.task.status in states.TERMINAL:
            self._tasks.pop(task.task_id, None)
            self._other_steps.pop(task.task_id, None)
            self._read_at.pop(task.task_id, None)
        else:
            self._tasks[task.task_id] = task
            self._other_steps[task.task_id] = sum(
                a.step_index or 0 for a in view.attempts if a.attempt != view.task.attempt
            )
            self._read_at[task.task_id] = view.read_at
        return task

    def extend(self, e: Extension) -> types_pb2.Task | Literal["kept"] | None:
        """The task as sent with the extension (its progress, its start) applied and remembered, or
        None when it must be reloaded: not sent yet, sent without a live lease, or, for new progress
        or a start, sent with another attempt current. An extension written no later than the
        task as sent was last updated (it raced a reload that read its write or a newer one)
        leaves the task as sent: `KEPT`, nothing to send. The write's time orders them, not the
        expiry: a write far from expiry keeps the expiry it found (decision 0070)."""
        shown = self._tasks.get(e.task_id)
        if shown is None or not shown.HasField("lease_expires_at"):
            return None
        if (e.progress is not None or e.started) and shown.attempt != e.attempt:
            return None
        renewed_at = convert.ts(e.renewed_at)
        if renewed_at.ToNanoseconds() <= shown.updated_at.ToNanoseconds():
            return KEPT
        task = types_pb2.Task()
        task.CopyFrom(shown)
        task.lease_expires_at.CopyFrom(convert.ts(e.expires_at))
        task.updated_at.CopyFrom(renewed_at)
        if e.started:
            task.status = types_pb2.TASK_STATUS_RUNNING
        p = e.progress
        if p is not None:
            # As `convert.progress` shows the row the renewal wrote.
            task.progress.CopyFrom(
                types_pb2.Progress(
                    step_index=p.step_index,
                    step_status=p.step_status,  # type: ignore[arg-type]
                    summary=p.summary,
                    updated_at=renewed_at,
                    max_steps=p.max_steps or 0,
                )
            )
            task.totals.steps = self._other_steps.get(e.task_id, 0) + p.step_index
        self._tasks[e.task_id] = task
        return task

    def spend(self, s: TaskSpent) -> types_pb2.Task | Literal["kept"] | None:
        """The task as sent with the newer of its totals and unsettled calls as sent and `s`
        (`TaskSpent.newest`), remembered; `KEPT` when those sent are as new (a reload read
        them, or a later reading came first); None when the task was not sent or has ended
        since (a shipment can come after the end)."""
        shown = self._tasks.get(s.task_id)
        if shown is None:
            return None
        u = shown.totals.unsettled
        sent = TaskSpent(
            s.task_id,
            usage_from_proto(shown.totals.usage),
            shown.totals.decisions,
            (u.calls, usage_from_proto(u.at_most)),
            self._read_at.get(s.task_id),
        )
        newest = sent.newest(s)
        self._read_at[s.task_id] = newest.read_at
        if newest.shown() == sent.shown():
            return KEPT
        task = types_pb2.Task()
        task.CopyFrom(shown)
        task.totals.usage.CopyFrom(usage_to_proto(newest.usage))
        task.totals.decisions = newest.decisions
        if newest.unsettled is not None:
            convert.unsettled(task.totals, newest.unsettled)
        self._tasks[s.task_id] = task
        return task


class _Rereads:
    """The re-read after a LISTEN gap (every active task, and those that ended since the gap
    began), one for every fleet watcher of the replica: the bus tells them all of a gap at
    once, and each re-read the same tasks itself, 500 watchers making 500 identical reads
    of every active task at the same moment. A watcher takes a read of the same gap start only
    while that read has not begun: taking its gap dropped the changes its mailbox held
    (`Mailbox.next`), and a read begun before then may have missed them (a task that ended
    meanwhile, then shown as still running for good). The watchers the bus woke at once take
    their gaps in one turn of the loop, before the read they share begins."""

    def __init__(self, store: Store) -> None:
        self._store = store
        #: The read of each gap start that has not begun yet.
        self._waiting: dict[dt.datetime | None, asyncio.Task[list[TaskView]]] = {}
        #: Every read not ended yet, begun or not (`stop`).
        self._reads: set[asyncio.Task[list[TaskView]]] = set()

    async def read(self, since: dt.datetime | None) -> list[TaskView]:
        """The tasks to send again after a gap that began at `since`, called once the watcher
        took its gap: a read not begun by now begins after it."""
        read = self._waiting.get(since)
        if read is None or read.done():  # done: cancelled before it began
            read = self._waiting[since] = asyncio.create_task(self._read(since))
            read.add_done_callback(_retrieved)
            self._reads.add(read)
            read.add_done_callback(self._reads.discard)
        # A watcher that leaves does not cancel the read the others wait for.
        return await asyncio.shield(read)

    async def stop(self) -> None:
        """The replica stops: every read is cancelled and awaited. Its watchers are gone (the
        server cancelled their handlers), and the shield that kept a read going for the others
        kept it going past the stop, into the closed store."""
        self._waiting.clear()
        await supervised.finish(self._reads, 0)

    async def _read(self, since: dt.datetime | None) -> list[TaskView]:
        if self._waiting.get(since) is asyncio.current_task():
            del self._waiting[since]  # begun: no watcher takes it from now on
        ids = await tasks.active_task_ids(self._store, ended_since=since)
        views: list[TaskView] = []
        for i in range(0, len(ids), _SNAPSHOT_CHUNK):
            chunk = ids[i : i + _SNAPSHOT_CHUNK]
            views += await tasks.load_views(self._store, chunk, usage=False)
        return views


def _retrieved(read: asyncio.Future[list[TaskView]]) -> None:
    """A shared read's error is raised to each watcher that waited; none may be left."""
    if not read.cancelled():
        read.exception()


def _messages(
    found: list[types_pb2.Task], request: pb.WatchProgressRequest, *, snapshot: bool = False
) -> Iterator[pb.WatchProgressResponse]:
    """The responses that carry `found`: one per task, or, for a `batched` watcher, one per
    `_SNAPSHOT_CHUNK` tasks. Each response is a message of its own on the stream, with its own
    write and system call: at a fleet's start (every task turning RUNNING within seconds) one
    message per task kept a fleet-wide watcher two seconds behind (docs/benchmarks.md, issue 21)."""
    if not request.batched:
        for task in found:
            yield pb.WatchProgressResponse(task=task, snapshot=snapshot)
        return
    for i in range(0, len(found), _SNAPSHOT_CHUNK):
        yield pb.WatchProgressResponse(tasks=found[i : i + _SNAPSHOT_CHUNK], snapshot=snapshot)


class ProgressServicer(progress_service_pb2_grpc.ProgressServiceServicer):
    """Streams task changes; changes arriving faster than a watcher reads are coalesced.

    A task's new totals (`EventBus.totals_moved`: a decision or a failed decision's calls were
    counted) are applied to the task as this stream last sent it too, not reloaded: every step
    of every task would cost each watcher a reload. So is a lease extension with nothing else
    changed but, perhaps, the attempt's progress or its start
    (`EventBus.leases_extended`), not reloaded:
    with the default lease, renewal interval and write margin nearly every renewal is written only
    to extend its lease or to store a new step, a fleet's start is every attempt's first renewal,
    and each would cost every watcher a reload (~1 ms of the replica's loop; at 10,000 hosts the
    watcher's reloads were a tenth of its CPU). A task this stream has not sent, or whose sent form
    has no live lease or another current attempt, is reloaded.

    A `batched` watcher gets what one pass over its mailbox found in one message (`_messages`)."""

    def __init__(self, store: Store, bus: EventBus) -> None:
        self._store = store
        self._bus = bus
        self._rereads = _Rereads(store)

    async def stop(self) -> None:
        """Cancel and await what the watchers left running (`_Rereads.stop`); after the
        server stopped, before the store closes."""
        await self._rereads.stop()

    async def WatchProgress(
        self,
        request: pb.WatchProgressRequest,
        context: grpc.aio.ServicerContext[pb.WatchProgressRequest, pb.WatchProgressResponse],
    ) -> AsyncIterator[pb.WatchProgressResponse]:
        # Subscribe before reading the snapshot so no change falls between the two.
        sub = self._bus.subscribe(
            thinking=request.include_thinking, task_id=request.task_id or None
        )
        shown = _Shown()
        try:
            ended = False
            snapshot: list[types_pb2.Task] = []
            if request.task_id:
                view = await tasks.get(self._store, request.task_id)
                if view is None:
                    await abort(
                        context, grpc.StatusCode.NOT_FOUND, f"task {request.task_id} not found"
                    )
                snapshot = [shown.keep(view)]
                ended = view.task.status in states.TERMINAL
            elif not request.skip_snapshot:
                ids = await tasks.active_task_ids(self._store)
                for i in range(0, len(ids), _SNAPSHOT_CHUNK):
                    views = await tasks.load_views(
                        self._store, ids[i : i + _SNAPSHOT_CHUNK], usage=False
                    )
                    snapshot.extend(shown.keep(v) for v in views)
            # The response's headers say "every change from now on follows", even when no
            # snapshot message does (no unfinished task), so they wait for the whole snapshot
            # read: a renewal written before it is in the snapshot, and not sent again (`KEPT`).
            # A watcher that leaves the snapshot out (the console's tasks page) reads its own
            # rows once the headers came (console/gateway/events.py); with the headers sent
            # before the read, a step written in between was in neither. It asks for none
            # (`skip_snapshot`): a fleet's is not read at all, and its headers come at once.
            await context.send_initial_metadata(())
            if not request.skip_snapshot:
                for msg in _messages(snapshot, request, snapshot=True):
                    yield msg
            if ended:
                return
            while True:
                changed = await sub.next()
                extended = sub.take_extended()
                spent = sub.take_spent()
                for task_id, attempt, text in sub.take_thinking():
                    yield pb.WatchProgressResponse(
                        thinking=pb.LiveThinking(task_id=task_id, attempt=attempt, delta=text)
                    )
                if changed is None:  # anything may have changed: re-read (every active task,
                    # and those that ended while notifications may have been lost). Taken here
                    # only: a gap offered while a pass for named tasks yields is kept for the
                    # re-read it asks for, not consumed by that pass and lost.
                    missed_since = sub.take_missed_since()
                    if not request.task_id:  # one read for every fleet watcher (`_Rereads`)
                        views = await self._rereads.read(missed_since)
                        for i in range(0, len(views), _SNAPSHOT_CHUNK):
                            again = [shown.keep(v) for v in views[i : i + _SNAPSHOT_CHUNK]]
                            for msg in _messages(again, request):
                                yield msg
                        continue
                    wanted = [request.task_id]
                else:
                    if request.task_id:
                        changed &= {request.task_id}
                    wanted = sorted(changed)
                    # Each task as last patched, sent once (an extension and totals of one task).
                    patched_tasks: dict[str, types_pb2.Task] = {}
                    reloaded = set(changed)
                    news: list[Extension | TaskSpent] = [*extended, *spent]
                    for e in news:  # of `request.task_id` only, when given
                        if e.task_id in reloaded:
                            continue  # reloaded below
                        patched = shown.extend(e) if isinstance(e, Extension) else shown.spend(e)
                        if patched == KEPT:
                            continue
                        if patched is None:
                            patched_tasks.pop(e.task_id, None)
                            reloaded.add(e.task_id)
                            wanted.append(e.task_id)
                        else:
                            patched_tasks[e.task_id] = patched
                    for msg in _messages(list(patched_tasks.values()), request):
                        yield msg
                for i in range(0, len(wanted), _SNAPSHOT_CHUNK):
                    chunk = wanted[i : i + _SNAPSHOT_CHUNK]
                    views = await tasks.load_views(self._store, chunk, usage=False)
                    for msg in _messages([shown.keep(v) for v in views], request):
                        yield msg
                    if request.task_id and any(v.task.status in states.TERMINAL for v in views):
                        return
        finally:
            sub.close()
