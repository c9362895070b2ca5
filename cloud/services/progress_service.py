"""ProgressService.WatchProgress: the current snapshot, then every change. Operators only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from amc.v1 import progress_service_pb2 as pb
from amc.v1 import progress_service_pb2_grpc
from cloud.events import EventBus
from cloud.services.status import abort
from cloud.store import convert, states, tasks
from cloud.store.database import Store

_SNAPSHOT_CHUNK = 200


class ProgressServicer(progress_service_pb2_grpc.ProgressServiceServicer):
    """Streams task changes; changes arriving faster than a watcher reads are coalesced."""

    def __init__(self, store: Store, bus: EventBus) -> None:
        self._store = store
        self._bus = bus

    async def WatchProgress(
        self,
        request: pb.WatchProgressRequest,
        context: grpc.aio.ServicerContext[pb.WatchProgressRequest, pb.WatchProgressResponse],
    ) -> AsyncIterator[pb.WatchProgressResponse]:
        # Subscribe before reading the snapshot so no change falls between the two.
        sub = self._bus.subscribe(
            thinking=request.include_thinking, task_id=request.task_id or None
        )
        try:
            if request.task_id:
                view = await tasks.get(self._store, request.task_id)
                if view is None:
                    await abort(
                        context, grpc.StatusCode.NOT_FOUND, f"task {request.task_id} not found"
                    )
                yield pb.WatchProgressResponse(
                    task=convert.task(view, with_attempts=False), snapshot=True
                )
                if view.task.status in states.TERMINAL:
                    return
            else:
                ids = await tasks.active_task_ids(self._store)
                for i in range(0, len(ids), _SNAPSHOT_CHUNK):
                    for view in await tasks.load_views(self._store, ids[i : i + _SNAPSHOT_CHUNK]):
                        yield pb.WatchProgressResponse(
                            task=convert.task(view, with_attempts=False), snapshot=True
                        )
            while True:
                changed = await sub.next()
                for task_id, attempt, text in sub.take_thinking():
                    yield pb.WatchProgressResponse(
                        thinking=pb.LiveThinking(task_id=task_id, attempt=attempt, delta=text)
                    )
                if request.task_id:
                    if changed is not None and request.task_id not in changed:
                        continue
                    wanted = [request.task_id]
                elif changed is None:  # anything may have changed: re-read every active task
                    wanted = await tasks.active_task_ids(self._store)
                else:
                    wanted = sorted(changed)
                for i in range(0, len(wanted), _SNAPSHOT_CHUNK):
                    for view in await tasks.load_views(
                        self._store, wanted[i : i + _SNAPSHOT_CHUNK]
                    ):
                        yield pb.WatchProgressResponse(task=convert.task(view, with_attempts=False))
                        if request.task_id and view.task.status in states.TERMINAL:
                            return
        finally:
            sub.close()
