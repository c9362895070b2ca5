"""The JSON API under /api: tasks, decisions, hosts and live events, one gRPC call per route."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import grpc
from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from amc.v1 import decision_log_service_pb2, fleet_service_pb2, types_pb2
from amc.v1.artifact_service_pb2 import SCREENSHOT_PHASE_AFTER, SCREENSHOT_PHASE_BEFORE
from console.exporting import cloud_run, export_name
from console.gateway.auth import API_TOKEN_USER, ApiUser, StreamAllowed, require_api_user
from console.gateway.cloud import MAX_DECISIONS, CloudClient
from console.gateway.events import event_stream, host_event_stream
from console.gateway.history import group_history
from console.gateway.models import (
    CancelIn,
    ConversationItemOut,
    ConversationOut,
    DecisionOut,
    DecisionPage,
    DispatchOut,
    ErrorOut,
    FailedCallsOut,
    FlowOut,
    FlowPage,
    FlowStatusFilter,
    FlowStatusIn,
    HostConnectionFilter,
    HostOut,
    HostPage,
    LeaseEventOut,
    LeaseEventPage,
    PrunedOut,
    ScreenOut,
    SpendOut,
    SubmitIn,
    SubmitOut,
    TaskDetailOut,
    TaskOut,
    TaskPage,
    TaskStatusFilter,
    flow_status_value,
    host_connection_value,
    task_status_value,
)
from console.limits import INT32_MAX
from webui.headers import SCREENSHOT_CACHE

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorOut, "description": "the request body is not valid JSON"},
    401: {"model": ErrorOut, "description": "no session and no valid bearer token"},
    403: {"model": ErrorOut, "description": "session write without X-CSRF-Token"},
    404: {"model": ErrorOut, "description": "the cloud does not know the id"},
    409: {"model": ErrorOut, "description": "the cloud refused (FAILED_PRECONDITION)"},
    422: {"model": ErrorOut, "description": "invalid request (INVALID_ARGUMENT)"},
    500: {"model": ErrorOut, "description": "the console failed (the error is in its log)"},
    503: {"model": ErrorOut, "description": "the cloud is not reachable"},
}

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api", dependencies=[Depends(require_api_user)], responses=_ERRORS)


def cloud_of(request: Request) -> CloudClient:
    client: CloudClient = request.app.state.cloud
    return client


Cloud = Annotated[CloudClient, Depends(cloud_of)]


async def named_hosts(cloud: CloudClient, host_ids: set[str]) -> dict[str, HostOut]:
    """These hosts as the cloud knows them (a task's: at most its 20 attempts' hosts), in one
    call: the task page listed the whole fleet, on every render and every live refresh."""
    if not host_ids:
        return {}
    page = await cloud.hosts_page(page_size=len(host_ids), host_ids=sorted(host_ids))
    return {h.host_id: HostOut.of(h) for h in page.hosts}


async def task_detail(
    cloud: CloudClient, task_id: str, *, attempt: int = 0, after_step: int = 0, newest: int = 0
) -> TaskDetailOut:
    """The task, its attempts, its lease history and its decision log grouped by attempt, each
    step with its screenshots, and which of its hosts still hold some of its record (shared with
    the page). With `attempt`, the events are only that attempt's and the log and screenshots
    only its steps after `after_step`: what a live page has not shown yet (it read the whole
    log, lease history and screenshot list again on every change). With `newest`, only each
    attempt's newest `newest` steps (`newest_steps`). The log stops at `MAX_DECISIONS`, and
    `decisions_next_page_token` says where it goes on: a longer task's detail gave its first
    5,000 steps and no word of the rest."""
    task = TaskOut.of(await cloud.get_task(task_id))
    events = [LeaseEventOut.of(e) for e in await cloud.events(task_id, attempt)]
    counted: dict[int, decision_log_service_pb2.AttemptStepCounts] = {}
    rest = ""
    if newest:
        found, failed, deleted, counted = await newest_steps(cloud, task, newest)
        shots = [
            shot
            for n, first in _first_steps(found).items()
            for shot in await cloud.screenshots(task_id, n, first - 1)
        ]
    else:
        found, failed, deleted, rest = await cloud.decision_log_head(
            task_id, attempt=attempt, after_step=after_step, limit=MAX_DECISIONS
        )
        shots = await cloud.screenshots(task_id, attempt, after_step)
    pruned = PrunedOut.of(deleted) if deleted is not None else None
    decisions = [DecisionOut.of(d) for d in found]
    screens: dict[tuple[int, int], list[ScreenOut]] = {}
    for shot in shots:
        screens.setdefault((shot.attempt, shot.step_index), []).append(ScreenOut.of(shot))
    for d in decisions:
        d.screens = screens.get((d.attempt, d.step_index), [])
    used = {a.host_id for a in task.attempts if a.host_id}
    hosts = await named_hosts(cloud, used)
    transports = {k: v.planner_transport for k, v in hosts.items()}
    history, note = group_history(
        task, decisions, transports, [FailedCallsOut.of(f) for f in failed], pruned
    )
    for h in history:
        if (c := counted.get(h.attempt)) is not None:
            h.logged = c.decisions
            h.verdicts = {
                "met": c.met,
                "not met": c.not_met,
                "unknown": c.unknown,
                "unchecked": c.unchecked,
            }
    notes = [outbox_note(hosts[h]) for h in sorted(used) if h in hosts and hosts[h].outbox]
    return TaskDetailOut(
        task=task,
        events=events,
        history=history,
        history_note=note,
        pruned=pruned,
        outbox_notes=[n for n in notes if n],
        decisions_next_page_token=rest,
    )


async def newest_steps(
    cloud: CloudClient, task: TaskOut, newest: int
) -> tuple[
    list[types_pb2.Decision],
    list[decision_log_service_pb2.FailedCalls],
    decision_log_service_pb2.PrunedRecord | None,
    dict[int, decision_log_service_pb2.AttemptStepCounts],
]:
    """Each attempt's newest `newest` decisions, one page of its log newest first, with its
    step and verdict counts as the cloud counts them: the task page shows only those, yet read
    the whole log (up to 5,000 decisions with their prompts) on every view. Also what
    `CloudClient.decision_log` answers beside the decisions."""
    found: list[types_pb2.Decision] = []
    failed: list[decision_log_service_pb2.FailedCalls] = []
    pruned: decision_log_service_pb2.PrunedRecord | None = None
    counted: dict[int, decision_log_service_pb2.AttemptStepCounts] = {}
    for a in task.attempts:
        page = await cloud.list_decisions(
            task.task_id,
            attempt=a.attempt,
            page_size=newest,
            page_token="",
            newest_first=True,
            count_steps=True,
        )
        found.extend(page.decisions)
        failed.extend(page.failed_calls)
        pruned = page.pruned if page.HasField("pruned") else None
        counted.update((c.attempt, c) for c in page.step_counts)
    return found, failed, pruned, counted


def _first_steps(found: list[types_pb2.Decision]) -> dict[int, int]:
    """Each attempt's first step index among `found`."""
    first: dict[int, int] = {}
    for d in found:
        first[d.attempt] = min(first.get(d.attempt, d.step_index), d.step_index)
    return first


def outbox_note(host: HostOut) -> str:
    """ "host-a still has 3 decisions and 5 screenshots … in its outbox, the oldest from …", or
    "" when its outbox is empty."""
    o = host.outbox
    if o is None or not o.items:
        return ""
    others = o.items - o.decisions
    parts = [f"{o.decisions} decision{'s' * (o.decisions != 1)}"] if o.decisions else []
    if others:
        parts.append(f"{others} other item{'s' * (others != 1)} (screenshots, outcomes)")
    since = f", the oldest written {o.oldest_at:%Y-%m-%d %H:%M:%S} UTC" if o.oldest_at else ""
    return (
        f"Host {host.host_id} still has {' and '.join(parts)} in its outbox{since}: "
        "this record may be incomplete until they arrive."
    )


@router.get("/tasks", response_model=TaskPage, summary="List tasks, newest first")
async def list_tasks(
    cloud: Cloud,
    status_: Annotated[
        list[TaskStatusFilter] | None, Query(alias="status", description="repeatable")
    ] = None,
    host: Annotated[str, Query(description="only tasks that ran on this host or target it")] = "",
    q: Annotated[str, Query(description="goal contains this text (case-insensitive)")] = "",
    page_size: Annotated[int, Query(ge=1, le=500)] = 50,
    page_token: str = "",
) -> TaskPage:
    statuses = [task_status_value(s) for s in status_ or []]
    page = await cloud.list_tasks(
        statuses=statuses, host_id=host, query=q, page_size=page_size, page_token=page_token
    )
    return TaskPage(tasks=[TaskOut.of(t) for t in page.tasks], next_page_token=page.next_page_token)


@router.post(
    "/tasks",
    response_model=SubmitOut,
    status_code=status.HTTP_201_CREATED,
    summary="Submit a task",
)
async def submit_task(cloud: Cloud, body: SubmitIn) -> SubmitOut:
    response = await cloud.submit_task(
        goal=body.goal,
        host_id=body.host_id,
        device_serial=body.device_serial,
        max_attempts=body.max_attempts,
        lease_duration_s=body.lease_duration_s,
        timeout_s=body.timeout_s,
        client_request_id=body.client_request_id,
        secrets=body.secrets,
        no_replay=body.no_replay,
        validate_only=body.validate_only,
        budget=None if body.budget is None else body.budget.to_proto(),
    )
    return SubmitOut(
        task=TaskOut.of(response.task) if response.HasField("task") else None,
        deduplicated=response.deduplicated,
        warnings=list(response.warnings),
    )


@router.get(
    "/tasks/{task_id}",
    response_model=TaskDetailOut,
    summary="One task with attempts and its LLM history",
)
async def get_task(cloud: Cloud, task_id: str) -> TaskDetailOut:
    return await task_detail(cloud, task_id)


@router.get(
    "/tasks/{task_id}/lease-events",
    response_model=LeaseEventPage,
    summary="A task's lease history (assigned, resumed, revoked, expired, cancelled, result…)",
)
async def task_lease_events(cloud: Cloud, task_id: str) -> LeaseEventPage:
    return LeaseEventPage(events=[LeaseEventOut.of(e) for e in await cloud.events(task_id)])


async def export_download(cloud: CloudClient, task_id: str) -> Response:
    """The cloud's export of a task as a zip download (docs/export.md); 404 for an unknown task.
    Made in a worker thread: encoding the video takes a moment per step."""
    from export.bundle import bundle_bytes

    run = await cloud_run(cloud, task_id, cloud)
    data = await run_in_threadpool(bundle_bytes, run)
    return Response(
        data,
        media_type="application/zip",
        headers={
            "Content-Disposition": f'attachment; filename="{export_name(run.task_id)}"',
            "Cache-Control": "no-store",
        },
    )


@router.get(
    "/tasks/{task_id}/export",
    response_class=Response,
    summary="Export a task: a zip with report.html, run.gif, run.mp4, steps.jsonl",
    responses={200: {"content": {"application/zip": {}}}},
)
async def export_task(cloud: Cloud, task_id: str) -> Response:
    return await export_download(cloud, task_id)


@router.post("/tasks/{task_id}/cancel", response_model=TaskOut, summary="Cancel a task")
async def cancel_task(
    cloud: Cloud, user: ApiUser, task_id: str, body: CancelIn | None = None
) -> TaskOut:
    who = "API token" if user == API_TOKEN_USER else user
    return TaskOut.of(await cloud.cancel_task(task_id, body.reason if body else "", who))


@router.get(
    "/tasks/{task_id}/decisions",
    response_model=DecisionPage,
    summary="A task's decision log, paged",
)
async def list_decisions(
    cloud: Cloud,
    task_id: str,
    attempt: Annotated[int, Query(ge=0, le=INT32_MAX, description="0: every attempt")] = 0,
    page_size: Annotated[int, Query(ge=1, le=500)] = 100,
    page_token: str = "",
) -> DecisionPage:
    page = await cloud.list_decisions(
        task_id, attempt=attempt, page_size=page_size, page_token=page_token
    )
    return DecisionPage(
        decisions=[DecisionOut.of(d) for d in page.decisions],
        next_page_token=page.next_page_token,
        failed_calls=[FailedCallsOut.of(f) for f in page.failed_calls],
        pruned=PrunedOut.of(page.pruned) if page.HasField("pruned") else None,
    )


@router.get(
    "/tasks/{task_id}/attempts/{attempt}/conversation",
    response_model=ConversationOut,
    summary="A session-mode attempt's whole conversation with the model",
)
async def conversation(
    cloud: Cloud, task_id: str, attempt: Annotated[int, PathParam(ge=1, le=INT32_MAX)]
) -> ConversationOut:
    items = await cloud.conversation(task_id, attempt)
    return ConversationOut(
        task_id=task_id, attempt=attempt, items=[ConversationItemOut.of(i) for i in items]
    )


@router.get(
    "/tasks/{task_id}/attempts/{attempt}/steps/{step}/screens/{phase}",
    response_class=StreamingResponse,
    responses={200: {"content": {"image/png": {}, "image/jpeg": {}}}},
    summary="A step's before or after screenshot, from the cloud's artifact store",
)
async def step_screen(
    cloud: Cloud,
    task_id: str,
    attempt: Annotated[int, PathParam(ge=1, le=INT32_MAX)],
    step: Annotated[int, PathParam(ge=1, le=INT32_MAX)],
    phase: Literal["before", "after"],
) -> StreamingResponse:
    value = SCREENSHOT_PHASE_BEFORE if phase == "before" else SCREENSHOT_PHASE_AFTER
    chunks = cloud.screenshot_chunks(task_id, attempt, step, value)
    try:
        first = await anext(chunks)  # a NOT_FOUND here is a 404 page, not a broken stream
    except BaseException:
        await chunks.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        """The image's bytes. A failure once they flow can only close the connection short
        of Content-Length (the client sees an incomplete body): it is raised for that, and
        logged here first, as the server's own log of it names neither task nor cause."""
        sent = 0
        try:
            yield first.data
            sent += len(first.data)
            async for chunk in chunks:
                yield chunk.data
                sent += len(chunk.data)
        except Exception as exc:
            cause = type(exc).__name__
            if isinstance(exc, grpc.aio.AioRpcError):
                _, message, code = cloud.describe(exc)
                cause = f"{code} {message}"
            log.warning(
                "the %s screenshot of step %d of task %s attempt %d broke off after %d of %d "
                "bytes: %s",
                phase, step, task_id, attempt, sent, first.screenshot.size_bytes, cause,
            )  # fmt: skip
            raise
        finally:
            await chunks.aclose()

    return StreamingResponse(
        body(),
        media_type=first.screenshot.content_type or "application/octet-stream",
        headers={
            "Content-Length": str(first.screenshot.size_bytes),
            "Cache-Control": SCREENSHOT_CACHE,
        },
    )


@router.get("/decisions/{decision_id}", response_model=DecisionOut, summary="One decision")
async def get_decision(cloud: Cloud, decision_id: str) -> DecisionOut:
    return DecisionOut.of(await cloud.get_decision(decision_id))


@router.get("/flows", response_model=FlowPage, summary="Learned flows, newest first")
async def list_flows(
    cloud: Cloud,
    status_: Annotated[
        list[FlowStatusFilter] | None, Query(alias="status", description="repeatable")
    ] = None,
    page_size: Annotated[int, Query(ge=1, le=500)] = 50,
    page_token: str = "",
) -> FlowPage:
    page = await cloud.list_flows(
        statuses=[flow_status_value(s) for s in status_ or []],
        page_size=page_size,
        page_token=page_token,
    )
    return FlowPage(flows=[FlowOut.of(f) for f in page.flows], next_page_token=page.next_page_token)


@router.get("/flows/{flow_id}", response_model=FlowOut, summary="One learned flow with its steps")
async def get_flow(cloud: Cloud, flow_id: str) -> FlowOut:
    return FlowOut.of(await cloud.get_flow(flow_id))


@router.post("/flows/{flow_id}/status", response_model=FlowOut, summary="Disable or enable a flow")
async def set_flow_status(cloud: Cloud, flow_id: str, body: FlowStatusIn) -> FlowOut:
    return FlowOut.of(await cloud.set_flow_status(flow_id, body.active, body.reason))


@router.get("/hosts", response_model=HostPage, summary="Hosts and their phones, by id, paged")
async def list_hosts(
    cloud: Cloud,
    connected_only: Annotated[bool, Query(description="the same as connection=connected")] = False,
    connection: Annotated[
        HostConnectionFilter,
        Query(
            description="only hosts connected now (an open Lease stream a cloud replica "
            "vouches for), or only those not connected now"
        ),
    ] = "any",
    q: Annotated[str, Query(description="only hosts whose id contains this text (any case)")] = "",
    page_size: Annotated[int, Query(ge=1, le=500)] = 100,
    page_token: str = "",
) -> HostPage:
    """One page of the fleet: every host at once was thousands of them in one answer."""
    if connected_only and connection == "disconnected":
        raise HTTPException(422, "connected_only: contradicts connection=disconnected")
    if connected_only:
        connection = "connected"
    fleet = await cloud.hosts_page(
        page_size=page_size,
        page_token=page_token,
        connection=host_connection_value(connection),
        query=q,
    )
    return HostPage(
        hosts=[HostOut.of(h) for h in fleet.hosts],
        dispatch=DispatchOut.of(fleet.dispatch),
        next_page_token=fleet.next_page_token,
    )


@router.get(
    "/spend/today",
    response_model=SpendOut,
    summary="Today's fleet model spending (UTC) against the daily budget",
)
async def spend_today(cloud: Cloud) -> SpendOut:
    return SpendOut.of(await cloud.spend())


_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/event-stream": {}},
        "description": "`task` events (TaskOut JSON) as tasks change; `end` when a watched "
        "task ended; `cloud-error` (ErrorOut JSON) when the cloud stream failed, "
        "`stream-error` (ErrorOut JSON) when the gateway did; the stream ends after either",
    }
}


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses=_SSE_DOC,
    summary="Live changes of every task (server-sent events)",
)
async def fleet_events(
    request: Request,
    cloud: Cloud,
    allowed: StreamAllowed,
    snapshot: Annotated[
        bool,
        Query(
            description="false: only what changes from now on, without every unfinished task "
            "first (for a client that has just listed the tasks it shows)"
        ),
    ] = True,
) -> StreamingResponse:
    return await event_stream(cloud, request.app.state.streams, allowed, snapshot=snapshot)


@router.get(
    "/hosts/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`host` events (HostOut JSON): every host, then `snapshot-complete`, "
            "then each host whose state changed (connected, disconnected, phones); with "
            "`page_size`, the hosts of that page of GET /api/hosts only (its `connection` and "
            "`page_token`): the page's hosts, then changes of hosts in its range of ids (one "
            "added to it too; one leaving the `connection` filter once more, as it is now), "
            'after a `scope` event ({"last_key": the page\'s last host id, empty when no host '
            "followed it}) saying where the range ends; `cloud-error` (ErrorOut JSON) when the "
            "cloud stream failed (INVALID_ARGUMENT for a page token of another listing), "
            "`stream-error` (ErrorOut JSON) when the gateway did; the stream ends after either",
        }
    },
    summary="Live changes of the fleet's hosts (server-sent events)",
)
async def host_events(
    request: Request,
    cloud: Cloud,
    allowed: StreamAllowed,
    snapshot: Annotated[
        bool,
        Query(
            description="false: only what changes from now on, without every host and "
            "`snapshot-complete` first (for a client that has just listed the hosts it shows)"
        ),
    ] = True,
    connection: Annotated[
        HostConnectionFilter,
        Query(description="only hosts connected now, or only those not connected now"),
    ] = "any",
    page_size: Annotated[
        int,
        Query(ge=0, le=500, description="the page of GET /api/hosts to watch; 0: every host"),
    ] = 0,
    page_token: Annotated[
        str, Query(description="that page's token (from GET /api/hosts with this connection)")
    ] = "",
) -> StreamingResponse:
    """A fleet page's hosts, not the fleet: every browser got every host's change and kept
    its fifty (issue 21: 10,000 hosts)."""
    scope = fleet_service_pb2.WatchHostsRequest(
        connection=host_connection_value(connection), page_size=page_size, page_token=page_token
    )
    return await host_event_stream(
        cloud, request.app.state.streams, allowed, snapshot=snapshot, scope=scope
    )


@router.get(
    "/tasks/{task_id}/events",
    response_class=StreamingResponse,
    responses=_SSE_DOC,
    summary="Live changes of one task (server-sent events)",
)
async def task_events(
    request: Request, cloud: Cloud, allowed: StreamAllowed, task_id: str
) -> StreamingResponse:
    """404 for an unknown task, asked before the stream starts: once it has, the status is 200
    and a NOT_FOUND could only be a `cloud-error` event. A cloud out of reach is not an
    answer about the task: the stream starts and says so (`cloud-error`), as the fleet's
    streams do, because a browser's EventSource refused with a 503 never tries again and the
    page would stay dead after the cloud came back."""
    try:
        await cloud.get_task(task_id)
    except grpc.aio.AioRpcError as error:
        if cloud.describe(error)[0] < 500:
            raise
    return await event_stream(cloud, request.app.state.streams, allowed, task_id)
