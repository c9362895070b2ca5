"""Server-sent events fed by ProgressService.WatchProgress and FleetService.WatchHosts.

Each change the cloud streams becomes one `task` event whose data is the task as JSON (the same
shape as the API's TaskOut), so the page's script can patch its badges in place. The fleet's
stream sends one `host` event per host (HostOut JSON): the snapshot, `snapshot-complete`, then
every host whose state changed; scoped to a fleet page (its connection, page size and token),
only the hosts of that page's range of ids, after a `scope` event saying where the range ends
(`last_key`: the page's last host, empty when no host followed it). A single
task's stream also carries `thinking` events: the model's thinking as it streams (session mode),
shown live and replaced by the decision's stored thinking once the step is decided. A failed
cloud stream ends with a `cloud-error` event, a failure of the gateway's own with
`stream-error` (both ErrorOut JSON; the latter logged naming the stream). A comment line
goes out every few seconds so proxies keep the connection open; when the browser leaves, the
response is cancelled and the gRPC stream with it.

A stream outlives the request that opened it, so whether its caller may still see it is asked
again (`allowed`) before every frame and at least every `CHECK_S`: a stream opened with a session
ends within a second of that session ending (logout, expiry), as docs/deployment.md promises for
every other use of the cookie, instead of streaming on until the tab closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import grpc
from starlette.responses import StreamingResponse

from amc.v1 import fleet_service_pb2
from console.gateway.cloud import CloudClient
from console.gateway.models import ErrorOut, HostOut, TaskOut
from webui.errors import UNEXPECTED

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
#: How often a quiet stream asks whether its caller may still see it (seconds).
CHECK_S = 1.0
#: How soon the browser's EventSource reconnects after the stream drops (milliseconds).
RETRY_MS = 1000


class StreamGauge:
    """How many live-update streams are open now (reported by /healthz)."""

    def __init__(self) -> None:
        self.open = 0


#: What ends a line in an event stream (and nothing else: str.splitlines also splits at
#: U+2028, U+2029, U+0085 and more, which JSON leaves unescaped in a phone's or a model's text,
#: so the browser got a newline inside a JSON string and could not parse the event).
_SSE_LINE_END = re.compile(r"\r\n|\r|\n")


def _event(name: str, data: str) -> str:
    lines = "".join(f"data: {line}\n" for line in _SSE_LINE_END.split(data))
    return f"event: {name}\n{lines}\n"


async def _task_frames(
    cloud: CloudClient, task_id: str, snapshot: bool, watching: Callable[[], object]
) -> AsyncIterator[str]:
    """SSE frames of WatchProgress (one task's, or every task's when task_id is empty); without
    `snapshot`, only the changes after it (not every unfinished task first)."""
    async for change in cloud.watch(
        task_id, thinking=bool(task_id), snapshot=snapshot, watching=watching
    ):
        if change.snapshot and not snapshot:
            continue  # a cloud from before `skip_snapshot` sends it all the same
        if change.HasField("thinking"):
            live = change.thinking
            data = {"task_id": live.task_id, "attempt": live.attempt, "delta": live.delta}
            yield _event("thinking", json.dumps(data, ensure_ascii=False))
        else:
            yield _event("task", TaskOut.of(change.task).model_dump_json())
    if task_id:
        yield _event("end", json.dumps({"task_id": task_id}))


async def _host_frames(
    cloud: CloudClient,
    snapshot: bool,
    watching: Callable[[], object],
    scope: fleet_service_pb2.WatchHostsRequest,
) -> AsyncIterator[str]:
    """SSE frames of WatchHosts; without `snapshot`, only the changes after it (not every
    host first, nor the end of that).

    A scoped stream says where its range of ids ends (`scope`, with or without the snapshot):
    the page compares it with its own last host and watches again when they differ. Hosts
    that left the page's filter pulled later ones onto it, past the range the cloud fixed at
    the snapshot, whose changes the page would never hear. A cloud from before scopes sends
    more hosts than the page size and no `scope` event: it sends every host's change."""
    last, count = "", 0
    async for change in cloud.watch_hosts(watching, scope):
        if change.snapshot:
            last, count = change.host.host_id, count + 1
        if change.snapshot_complete and scope.page_size and count <= scope.page_size:
            ends = {"last_key": last if change.next_page_token else ""}
            yield _event("scope", json.dumps(ends, ensure_ascii=False))
        if not snapshot and (change.snapshot or change.snapshot_complete):
            continue
        if change.snapshot_complete:
            yield _event("snapshot-complete", "{}")
        else:
            yield _event("host", HostOut.of(change.host).model_dump_json())


async def _pump(
    frames: AsyncIterator[str],
    queue: asyncio.Queue[str | None],
    what: str,
    describe: Callable[[grpc.aio.AioRpcError], tuple[int, str, str]],
) -> None:
    """Copy a gRPC stream's frames into the queue; None marks its end.

    A failure of the gateway's own (a change it cannot present) is a `stream-error` event
    and the stream's proper end: raised, it cut the response after it began, uvicorn logged
    it without saying which stream, and the browser reconnected every second, for ever."""
    try:
        async for frame in frames:
            await queue.put(frame)
    except grpc.aio.AioRpcError as error:
        _, message, code = describe(error)
        log.info("live stream ended: %s %s", code, error.details())
        await queue.put(
            _event(
                "cloud-error",
                ErrorOut(detail=message, grpc_code=code).model_dump_json(exclude_none=True),
            )
        )
    except Exception:
        log.exception("live stream of %s failed", what)
        failed = ErrorOut(detail=UNEXPECTED).model_dump_json(exclude_none=True)
        await queue.put(_event("stream-error", failed))
    finally:
        await queue.put(None)


#: A stream's first frame, queued once the cloud watches for it.
_CONNECTED = f"retry: {RETRY_MS}\n: connected\n\n"


async def _frames(
    cloud: CloudClient,
    source: Callable[[Callable[[], object]], AsyncIterator[str]],
    gauge: StreamGauge,
    allowed: Callable[[], bool],
    what: str,
) -> AsyncGenerator[str, None]:
    """The frames of `source` (given what to call once the cloud watches) plus keepalives,
    until it ends or `allowed()` says no more (`what`: the stream, for the log). The first
    frame comes once the cloud watches, or its stream failed first."""
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    ready = source(lambda: queue.put_nowait(_CONNECTED))
    pump = asyncio.create_task(_pump(ready, queue, what, cloud.describe))
    gauge.open += 1
    loop = asyncio.get_running_loop()
    try:
        first = await queue.get()
        yield _CONNECTED
        if first is None:
            return
        if first != _CONNECTED:
            yield first  # the cloud's stream failed before it watched
        last_write = loop.time()
        while True:
            frame: str | None = ""
            try:
                async with asyncio.timeout(CHECK_S):
                    frame = await queue.get()
            except TimeoutError:
                pass
            if frame is None or not allowed():
                return
            if frame:
                yield frame
            elif loop.time() - last_write >= KEEPALIVE_S:
                yield ": keepalive\n\n"
            else:
                continue
            last_write = loop.time()
    finally:
        gauge.open -= 1
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


async def event_stream(
    cloud: CloudClient,
    gauge: StreamGauge,
    allowed: Callable[[], bool],
    task_id: str = "",
    *,
    snapshot: bool = True,
) -> StreamingResponse:
    """An SSE response of one task's changes, or of the whole fleet's when task_id is empty,
    for as long as `allowed()`; `snapshot=False` leaves out the current state the stream
    begins with."""
    what = f"task {task_id}" if task_id else "every task"
    return await _sse(
        _frames(
            cloud,
            lambda ready: _task_frames(cloud, task_id, snapshot, ready),
            gauge,
            allowed,
            what,
        )
    )


async def host_event_stream(
    cloud: CloudClient,
    gauge: StreamGauge,
    allowed: Callable[[], bool],
    *,
    snapshot: bool = True,
    scope: fleet_service_pb2.WatchHostsRequest | None = None,
) -> StreamingResponse:
    """An SSE response of every host's changes (or those of a fleet page's `scope`), for as
    long as `allowed()`; `snapshot=False` leaves out the hosts' current state the stream
    begins with."""
    scope = scope or fleet_service_pb2.WatchHostsRequest()
    what = "a page of hosts" if scope.page_size else "every host"
    return await _sse(
        _frames(
            cloud,
            lambda ready: _host_frames(cloud, snapshot, ready, scope),
            gauge,
            allowed,
            what,
        )
    )


async def _sse(frames: AsyncGenerator[str, None]) -> StreamingResponse:
    """The response, begun only once the cloud watches: a browser's EventSource opens (the page
    says "live", the tasks page fetches its rows again) at the response's headers, and a change
    between those and the cloud's subscription was in neither the rows nor a stream without
    its snapshot; the row stayed as it was until a reload."""
    first = await anext(frames)
    return StreamingResponse(
        _resumed(first, frames),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _resumed(first: str, rest: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    try:
        yield first
        async for frame in rest:
            yield frame
    finally:
        await rest.aclose()
