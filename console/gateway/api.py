"""The JSON API under /api: tasks, decisions, hosts and live events, one gRPC call per route."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from console.exporting import cloud_run, export_name
from console.gateway.auth import require_api_user
from console.gateway.cloud import CloudClient
from console.gateway.events import event_stream, host_event_stream
from console.gateway.history import group_history
from console.gateway.models import (
    TASK_STATUSES,
    CancelIn,
    ConversationItemOut,
    ConversationOut,
    DecisionOut,
    DecisionPage,
    DispatchOut,
    ErrorOut,
    HostList,
    HostOut,
    SpendOut,
    SubmitIn,
    SubmitOut,
    TaskDetailOut,
    TaskOut,
    TaskPage,
    TaskStatusName,
    task_status_value,
)

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorOut, "description": "no session and no valid bearer token"},
    403: {"model": ErrorOut, "description": "session write without X-CSRF-Token"},
    404: {"model": ErrorOut, "description": "the cloud does not know the id"},
    409: {"model": ErrorOut, "description": "the cloud refused (FAILED_PRECONDITION)"},
    422: {"model": ErrorOut, "description": "invalid request (INVALID_ARGUMENT)"},
    503: {"model": ErrorOut, "description": "the cloud is not reachable"},
}

router = APIRouter(prefix="/api", dependencies=[Depends(require_api_user)], responses=_ERRORS)


def cloud_of(request: Request) -> CloudClient:
    client: CloudClient = request.app.state.cloud
    return client


Cloud = Annotated[CloudClient, Depends(cloud_of)]


async def host_transports(cloud: CloudClient) -> dict[str, HostOut]:
    return {h.host_id: HostOut.of(h) for h in await cloud.list_hosts()}


async def task_detail(cloud: CloudClient, task_id: str) -> TaskDetailOut:
    """The task, its attempts and its decision log grouped by attempt (shared with the page)."""
    task = TaskOut.of(await cloud.get_task(task_id))
    decisions = [DecisionOut.of(d) for d in await cloud.all_decisions(task_id)]
    transports = {}
    if any(a.planner_transport == "unspecified" for a in task.attempts):
        transports = {k: v.planner_transport for k, v in (await host_transports(cloud)).items()}
    history, note = group_history(task, decisions, transports)
    return TaskDetailOut(task=task, history=history, history_note=note)


@router.get("/tasks", response_model=TaskPage, summary="List tasks, newest first")
async def list_tasks(
    cloud: Cloud,
    status_: Annotated[
        list[TaskStatusName] | None, Query(alias="status", description="repeatable")
    ] = None,
    host: Annotated[str, Query(description="only tasks whose last attempt ran here")] = "",
    q: Annotated[str, Query(description="goal contains this text (case-insensitive)")] = "",
    page_size: Annotated[int, Query(ge=1, le=500)] = 50,
    page_token: str = "",
) -> TaskPage:
    statuses = [task_status_value(s) for s in status_ or [] if s in TASK_STATUSES]
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
    )
    return SubmitOut(task=TaskOut.of(response.task), deduplicated=response.deduplicated)


@router.get(
    "/tasks/{task_id}",
    response_model=TaskDetailOut,
    summary="One task with attempts and its LLM history",
)
async def get_task(cloud: Cloud, task_id: str) -> TaskDetailOut:
    return await task_detail(cloud, task_id)


async def export_download(cloud: CloudClient, task_id: str) -> Response:
    """The cloud's export of a task as a zip download (docs/export.md); 404 for an unknown task.
    Made in a worker thread: encoding the video takes a moment per step."""
    from export.bundle import bundle_bytes

    run = await cloud_run(cloud, task_id)
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
async def cancel_task(cloud: Cloud, task_id: str, body: CancelIn | None = None) -> TaskOut:
    return TaskOut.of(await cloud.cancel_task(task_id, body.reason if body else ""))


@router.get(
    "/tasks/{task_id}/decisions",
    response_model=DecisionPage,
    summary="A task's decision log, paged",
)
async def list_decisions(
    cloud: Cloud,
    task_id: str,
    attempt: Annotated[int, Query(ge=0, description="0: every attempt")] = 0,
    page_size: Annotated[int, Query(ge=1, le=500)] = 100,
    page_token: str = "",
) -> DecisionPage:
    page = await cloud.list_decisions(
        task_id, attempt=attempt, page_size=page_size, page_token=page_token
    )
    return DecisionPage(
        decisions=[DecisionOut.of(d) for d in page.decisions],
        next_page_token=page.next_page_token,
    )


@router.get(
    "/tasks/{task_id}/attempts/{attempt}/conversation",
    response_model=ConversationOut,
    summary="A session-mode attempt's whole conversation with the model",
)
async def conversation(
    cloud: Cloud, task_id: str, attempt: Annotated[int, PathParam(ge=1)]
) -> ConversationOut:
    items = await cloud.conversation(task_id, attempt)
    return ConversationOut(
        task_id=task_id, attempt=attempt, items=[ConversationItemOut.of(i) for i in items]
    )


@router.get("/decisions/{decision_id}", response_model=DecisionOut, summary="One decision")
async def get_decision(cloud: Cloud, decision_id: str) -> DecisionOut:
    return DecisionOut.of(await cloud.get_decision(decision_id))


@router.get("/hosts", response_model=HostList, summary="Hosts and their phones")
async def list_hosts(cloud: Cloud, connected_only: bool = False) -> HostList:
    fleet = await cloud.fleet(connected_only=connected_only)
    return HostList(
        hosts=[HostOut.of(h) for h in fleet.hosts], dispatch=DispatchOut.of(fleet.dispatch)
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
        "task ended; `cloud-error` (ErrorOut JSON) when the cloud stream failed",
    }
}


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses=_SSE_DOC,
    summary="Live changes of every task (server-sent events)",
)
async def fleet_events(request: Request, cloud: Cloud) -> StreamingResponse:
    return event_stream(cloud, request.app.state.streams)


@router.get(
    "/hosts/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`host` events (HostOut JSON): every host, then `snapshot-complete`, "
            "then each host whose state changed (connected, disconnected, phones); "
            "`cloud-error` (ErrorOut JSON) when the cloud stream failed",
        }
    },
    summary="Live changes of the fleet's hosts (server-sent events)",
)
async def host_events(request: Request, cloud: Cloud) -> StreamingResponse:
    return host_event_stream(cloud, request.app.state.streams)


@router.get(
    "/tasks/{task_id}/events",
    response_class=StreamingResponse,
    responses=_SSE_DOC,
    summary="Live changes of one task (server-sent events)",
)
async def task_events(request: Request, cloud: Cloud, task_id: str) -> StreamingResponse:
    return event_stream(cloud, request.app.state.streams, task_id)
