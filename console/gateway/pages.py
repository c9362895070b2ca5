"""Server-rendered pages: login, fleet, tasks, task detail, submit, cancel and learned flows.

Pages read the same models the API returns, so what a script sees and what a person sees agree.
Every form posts a CSRF token; every page but /login needs a session.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlencode

import grpc
from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from amc.v1 import task_service_pb2
from console.gateway import present
from console.gateway.api import Cloud, export_download, task_detail
from console.gateway.auth import OperatorCredentials
from console.gateway.cloud import CloudClient
from console.gateway.history import verdict_counts
from console.gateway.models import (
    HOST_CONNECTIONS,
    TASK_STATUSES,
    AttemptHistory,
    ConversationItemOut,
    DecisionOut,
    DispatchOut,
    FlowOut,
    HostConnectionFilter,
    HostOut,
    ScreenOut,
    SpendOut,
    TaskOut,
    host_connection_value,
    task_status_value,
)
from console.gateway.roles import OperatorPage, read_only
from console.limits import INT32_MAX, whole_number
from webui import login
from webui.drafts import take_posted_form
from webui.id_prefixes import ID_LENGTH, SHOWN, IdPrefixError, as_prefix, pick
from webui.pages import Pages
from webui.sessions import FormUser, PageUser

HOME = "/tasks"
PAGES = Pages(
    Path(__file__).parent / "templates",
    lambda request: {
        "home_url": HOME,
        "home_label": "Back to tasks",
        "read_only": read_only(request),
    },
)
present.install(PAGES.env)

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)

PAGE_SIZES = (10, 25, 50, 100)
#: The tasks page remembers this many earlier pages for its "Newer" link (older ones are
#: forgotten: from there only "First page" leads back), each token at most MAX_BACK_TOKEN long,
#: so its URLs stay a few KB at most.
MAX_BACK = 20
MAX_BACK_TOKEN = 512
#: Flows on one page of /flows unless its `page_size` says otherwise.
FLOWS_PAGE = 100
#: Hosts on one page of /fleet unless its `page_size` says otherwise.
FLEET_PAGE = 50
#: Hosts a host field suggests (by id; those whose id holds what it says).
PICKER = 20


async def host_choices(cloud: CloudClient, typed: str = "") -> list[HostOut]:
    """A host field's suggestions: one page of the hosts whose id contains `typed` (the
    field's value). The pickers listed the whole fleet on every render; live.js fetches the
    same from /api/hosts as the operator types, and without it any id can still be typed."""
    page = await cloud.hosts_page(page_size=PICKER, query=typed[:128])
    return [HostOut.of(h) for h in page.hosts]


def pager_links(
    path: str, filters: list[tuple[str, str]], back: list[str], page_token: str, next_token: str
) -> dict[str, str | None]:
    """First, newer and older links of a page of `path` (the tasks, the flows).

    ListTasks and ListFlows page forward only, so the links carry the way back: `back` holds
    the page tokens of the pages this one was reached through, oldest first ("" is the first
    page, which has no token). A "Newer" link pops the last one; an "Older" link pushes this
    page's token. Without a remembered previous page (a shared link, or a walk longer than
    MAX_BACK) there is no "Newer" link, only "First page".
    """
    if any(len(token) > MAX_BACK_TOKEN for token in back):
        back = []
    back = back[-MAX_BACK:]
    first_url = f"{path}?" + urlencode(filters)

    def url(token: str, trail: list[str]) -> str:
        query = [*filters, *(("back", t) for t in trail)]
        if token:
            query.append(("page_token", token))
        return f"{path}?" + urlencode(query)

    newer_url = None
    if page_token and back:
        newer_url = first_url if back[-1] == "" else url(back[-1], back[:-1])
    older_url = url(next_token, [*back, page_token][-MAX_BACK:]) if next_token else None
    return {
        "first_url": first_url if page_token and newer_url != first_url else None,
        "newer_url": newer_url,
        "next_url": older_url,
    }


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str = HOME) -> Response:
    return login.login_page(PAGES, request, next, HOME)


@router.post("/login", response_class=HTMLResponse)
async def login_submit(
    _csrf: login.LoginCsrfChecked,
    request: Request,
    credentials: OperatorCredentials,
    username: Annotated[str, Form()] = "",
    password: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = HOME,
) -> Response:
    async def verify() -> str | None:
        # scrypt takes ~70 ms: in a worker thread, not stalling every page and stream meanwhile.
        role = await run_in_threadpool(credentials.login_role, username, password)
        return username if role is not None else None

    return await login.attempt(
        PAGES,
        request,
        user=username,
        verify=verify,
        next_path=next,
        home=HOME,
        error="Wrong username or password.",
    )


@router.get("/")
async def home(_: PageUser) -> Response:
    return RedirectResponse(HOME, status_code=303)


@router.get("/fleet", response_class=HTMLResponse)
async def fleet_page(
    request: Request,
    _: PageUser,
    cloud: Cloud,
    page_token: str = "",
    page_size: Annotated[int, Query(ge=1, le=500)] = FLEET_PAGE,
    connection: HostConnectionFilter = "any",
    back: Annotated[list[str] | None, Query()] = None,
) -> Response:
    """A page of the fleet, as ListHosts pages it (by id): the whole fleet on one page was
    thousands of cards at fleet scale, each live change fetching it all again. The pager
    carries the page's first and last host and the connection filter, so live.js fetches the
    page again only for a host that belongs on it. At fleet scale the order by id no longer
    shows the hosts that are down (or up) together: `connection` lists just those."""
    fleet = await cloud.hosts_page(
        page_size=page_size,
        page_token=page_token,
        connection=host_connection_value(connection),
    )
    hosts = [HostOut.of(h) for h in fleet.hosts]
    filters: list[tuple[str, str]] = [("connection", connection)] if connection != "any" else []
    if page_size != FLEET_PAGE:
        filters.append(("page_size", str(page_size)))
    context = {
        "nav": "fleet",
        "hosts": hosts,
        "connection": connection,
        "connections": HOST_CONNECTIONS,
        "page_size": page_size,
        "page_sizes": sorted({*PAGE_SIZES, FLEET_PAGE, page_size}),
        "dispatch": DispatchOut.of(fleet.dispatch),
        "spend": SpendOut.of(await cloud.spend()),
        "page_token": page_token,
        "more": bool(fleet.next_page_token),
        **pager_links("/fleet", filters, back or [], page_token, fleet.next_page_token),
    }
    return PAGES.render(request, "fleet.html", context)


@router.get("/tasks", response_class=HTMLResponse)
async def tasks_page(
    request: Request,
    _: PageUser,
    cloud: Cloud,
    status: Annotated[list[str] | None, Query()] = None,
    host: str = "",
    q: str = "",
    page_token: str = "",
    page_size: Annotated[int, Query(ge=1, le=500)] = 25,
    back: Annotated[list[str] | None, Query()] = None,
) -> Response:
    chosen = [s for s in status or [] if s in TASK_STATUSES]
    unknown = [s for s in status or [] if s not in TASK_STATUSES]
    if unknown:
        return _unknown_status(request, unknown, chosen, host, q, page_size)
    page = await cloud.list_tasks(
        statuses=[task_status_value(s) for s in chosen],
        host_id=host,
        query=q,
        page_size=page_size,
        page_token=page_token,
    )
    hosts = await host_choices(cloud, host)
    filters: list[tuple[str, str]] = [("status", s) for s in chosen]
    filters += [(k, v) for k, v in (("host", host), ("q", q)) if v]
    if page_size != 25:
        filters.append(("page_size", str(page_size)))
    context = {
        **_tasks_form(chosen, host, q, page_size),
        "tasks": [TaskOut.of(t) for t in page.tasks],
        "hosts": hosts,
        **pager_links("/tasks", filters, back or [], page_token, page.next_page_token),
        # New tasks are inserted live only where they would appear: an unfiltered first page.
        "live_insert": not (chosen or host or q or page_token),
        # An empty page says "no tasks yet" only when nothing narrowed it.
        "filtered": bool(chosen or host or q or page_token),
    }
    return PAGES.render(request, "tasks.html", context)


def _tasks_form(chosen: Sequence[str], host: str, q: str, page_size: int) -> dict[str, object]:
    """What the tasks page's filter form shows, the same whether the filter listed tasks or
    was refused (an unknown status keeps the rest of the form as it was asked)."""
    return {
        "nav": "tasks",
        "picker": PICKER,
        "statuses": TASK_STATUSES,
        "chosen": chosen,
        "host": host,
        "q": q,
        "page_size": page_size,
        "page_sizes": PAGE_SIZES,
    }


def _unknown_status(
    request: Request, unknown: list[str], chosen: Sequence[str], host: str, q: str, page_size: int
) -> Response:
    """The tasks page for a status filter naming no status (a mistyped or outdated link): it
    dropped the unknown word and listed every task as if they were the ones filtered for.
    Now it lists none and says which words are allowed (422, as the API answers the same
    filter), keeping the rest of the filter form as it was asked."""
    words = ", ".join(repr(s) for s in unknown[:5])
    message = (
        f"Unknown status {words}: the status filter takes {', '.join(TASK_STATUSES)}. "
        "No tasks are shown; choose statuses below."
    )
    context = {
        **_tasks_form(chosen, host, q, page_size),
        "error": message,
        "tasks": [],
        "hosts": [],
        "first_url": None,
        "newer_url": None,
        "next_url": None,
        "live_insert": False,
        "filtered": True,
    }
    return PAGES.render(request, "tasks.html", context, status_code=422)


#: What a task id looks like, said when a text is not one (without repeating the text).
_ID_SHAPE = f"task ids are {ID_LENGTH} hexadecimal digits; a unique prefix of one works too"


@router.get("/tasks/new", response_class=HTMLResponse)
async def submit_page(
    request: Request, _: PageUser, _operator: OperatorPage, cloud: Cloud, again: str = ""
) -> Response:
    """The submit form; `again` (a task's id: its page's "Submit again…") fills it in from
    that task, so an ended task is retried without typing its goal and target anew. A form
    posted after its session ended comes back as it was typed, once, after the login it led
    to (`webui.drafts`), with its idempotency key: nothing was queued, the operator checks
    it and submits it."""
    kept = take_posted_form(request, "/tasks/new")
    form: dict[str, object] = {} if kept is None else _typed_form(kept)
    again_prefix = as_prefix(again) if again else ""
    if again_prefix is None:
        # Asked of the cloud, any text came back as its 404 with the text in it, kilobytes
        # of it for a long one: what is not an id is refused here, without repeating it.
        raise HTTPException(422, f"again= is not a task id: {_ID_SHAPE}")
    unavailable: dict[str, object] | None = None
    try:
        if again_prefix and kept is None:
            # A prefix (as the task page takes one) was the cloud's plain 404.
            again = again_prefix
            if len(again_prefix) < ID_LENGTH:
                again = await _task_by_prefix(cloud, again_prefix)
            task = TaskOut.of(await cloud.get_task(again))
            form = {
                "goal": task.goal,
                "host_id": task.target.host_id,
                "device_serial": task.target.device_serial,
                "max_attempts": str(task.max_attempts),
                "no_replay": task.no_replay,
            }
        hosts = await host_choices(cloud, str(form.get("host_id", "")))
    except grpc.aio.AioRpcError as error:
        # The cloud out of reach was a 503 page: nothing to type into until it came back. The
        # form needs the cloud only for its suggestions (and a retry's values), so it renders
        # without them and says so; posting it keeps what was typed if the cloud is still away.
        code, message, _name = cloud.describe(error)
        if code < 500:
            raise  # an unknown task to submit again is the 404 it was
        hosts = []
        missing = ["host and phone suggestions"]
        if again and not form:
            missing.insert(0, f"the goal and target of task {again} (to submit it again)")
        unavailable = {"what": missing, "why": message}
    form["client_request_id"] = form.get("client_request_id") or new_request_id()
    context = {
        "nav": "submit",
        "hosts": hosts,
        "picker": PICKER,
        "form": form,
        "unavailable": unavailable,
        "restored": kept is not None,
    }
    return PAGES.render(request, "submit.html", context)


def _typed_form(fields: dict[str, str]) -> dict[str, object]:
    """The submit form's values from the fields a post carried."""
    typed: dict[str, object] = {
        name: fields.get(name, "")
        for name in ("goal", "host_id", "device_serial", "max_attempts", "client_request_id")
    }
    typed["no_replay"] = bool(fields.get("no_replay"))
    return typed


def new_request_id() -> str:
    """The idempotency key of one rendered submit form: the form posted again (a second click
    while a busy cloud answers the first, a resent post) is the same submission, and the
    cloud answers it with the task it queued instead of queueing the goal twice."""
    return f"console-{uuid.uuid4().hex}"


@router.post("/tasks/new", response_class=HTMLResponse)
async def submit_form(
    request: Request,
    _: FormUser,
    cloud: Cloud,
    goal: Annotated[str, Form()] = "",
    host_id: Annotated[str, Form()] = "",
    device_serial: Annotated[str, Form()] = "",
    max_attempts: Annotated[str, Form()] = "",
    client_request_id: Annotated[str, Form()] = "",
    no_replay: Annotated[str, Form()] = "",
    confirmed: Annotated[str, Form()] = "",
) -> Response:
    host_id, device_serial = host_id.strip(), device_serial.strip()
    form = {
        "goal": goal,
        "host_id": host_id,
        "device_serial": device_serial,
        "no_replay": bool(no_replay),
        "max_attempts": max_attempts,
        "client_request_id": client_request_id.strip(),
    }
    target = _target_key(host_id, device_serial)

    async def again(message: str, status_code: int, warnings: list[str] | None = None) -> Response:
        try:
            hosts = await host_choices(cloud, host_id)
        except grpc.aio.AioRpcError:
            hosts = []  # only suggestions: the form and what was typed in it matter more
        context = {
            "nav": "submit",
            "hosts": hosts,
            "picker": PICKER,
            "form": form,
            "error": message,
            "warnings": warnings or [],
            "confirmation": target,
        }
        return PAGES.render(request, "submit.html", context, status_code=status_code)

    attempts = whole_number(max_attempts.strip() or "0")
    if attempts is None:
        return await again("Max attempts must be a whole number (0: the cloud's default).", 422)
    # A number past what protobuf's int32 carries is still a whole number, only too many: the
    # largest one that can be sent gets the cloud's own refusal, which names its allowed range.
    attempts = min(attempts, INT32_MAX)

    async def submit(validate_only: bool) -> task_service_pb2.SubmitTaskResponse:
        return await cloud.submit_task(
            goal=goal,
            host_id=host_id,
            device_serial=device_serial,
            max_attempts=attempts,
            lease_duration_s=None,
            timeout_s=None,
            client_request_id=client_request_id.strip(),
            no_replay=bool(no_replay),
            validate_only=validate_only,
        )

    try:
        # The cloud checks the target against the fleet; warnings are shown before anything
        # is queued, and "Submit anyway" (for this same target) queues it.
        if confirmed != target:
            checked = await submit(validate_only=True)
            if checked.warnings:
                return await again("", 200, list(checked.warnings))
        response = await submit(validate_only=False)
    except grpc.aio.AioRpcError as error:
        code, message, name = cloud.describe(error)
        if code in (409, 422):
            return await again(message, code)
        # An error page lost the goal typed into the form: it comes back as it was, with its
        # idempotency key, so submitting it again queues it once even if the cloud took the
        # first try. Only a cloud out of reach or too slow is worth simply trying again; any
        # other refusal (the gateway's certificate refused, an internal error) is said as it
        # is and logged as the gateway's other failed cloud calls are.
        if code >= 500:
            log.warning("cloud call failed: %s %s", name, error.details())
        if error.code() in _TRY_AGAIN:
            message = f"{message}. Submit again when the cloud answers"
        return await again(f"Not submitted: {message}.", code)
    if response.warnings:
        request.session[_WARNINGS] = {response.task.task_id: list(response.warnings)}
    return RedirectResponse(f"/tasks/{response.task.task_id}", status_code=303)


#: The failures of a submit that a later try may not meet: the cloud away or slow.
_TRY_AGAIN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: Session key of the warnings a submission got, shown once on the new task's page.
_WARNINGS = "submit_warnings"


def _target_key(host_id: str, device_serial: str) -> str:
    """What "Submit anyway" confirms: this host and phone (another target is checked again)."""
    return f"{host_id}/{device_serial}"


async def _task_by_prefix(cloud: CloudClient, prefix: str) -> str:
    """The whole id of the one task `prefix` starts (as a terminal shows ids); none or several
    are a 404 saying which (several: the first few, to pick from)."""
    page = await cloud.list_tasks(
        statuses=[], host_id="", query="", page_size=SHOWN + 1, page_token="",
        task_id_prefix=prefix,
    )  # fmt: skip
    try:
        return pick(prefix, [t.task_id for t in page.tasks])
    except IdPrefixError as unknown:
        raise HTTPException(404, f"{unknown}; {unknown.hint}") from None


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
async def task_page(request: Request, _: PageUser, cloud: Cloud, task_id: str) -> Response:
    try:
        detail = await task_detail(cloud, task_id, newest=SHOWN_STEPS)
    except grpc.aio.AioRpcError as error:
        # A unique prefix of an id (as a terminal shows it) leads to the task; none or several
        # are a 404 saying which (several: the first few, to pick from).
        prefix = as_prefix(task_id)
        if error.code() == grpc.StatusCode.NOT_FOUND and prefix is None:
            # The cloud's 404 repeats the text, kilobytes of it for a long one.
            raise HTTPException(404, f"not a task id: {_ID_SHAPE}") from None
        whole = prefix == task_id and len(task_id) == ID_LENGTH  # as the cloud writes ids
        if error.code() != grpc.StatusCode.NOT_FOUND or prefix is None or whole:
            raise  # the whole id: the cloud's own "not found"
        full = await _task_by_prefix(cloud, prefix)
        return RedirectResponse(f"/tasks/{full}", status_code=307)
    flashed = request.session.pop(_WARNINGS, None) or {}
    context = {
        "nav": "tasks",
        "detail": detail,
        "warnings": flashed.get(task_id, []),
        "earlier": _newest_steps(detail.history),
    }
    return PAGES.render(request, "task_detail.html", context)


@dataclass(frozen=True)
class EarlierSteps:
    """What the task page leaves out of an attempt: how many steps, the last one's index, and
    their verdict counts (`history.verdict_counts`)."""

    count: int
    through: int
    verdicts: dict[str, int]


#: Steps of an attempt the task page shows, its newest; the earlier ones are pages of their own
#: (`steps_page`). Every step rendered made a task of 600 steps a page of seconds.
SHOWN_STEPS = 50


def _newest_steps(history: Sequence[AttemptHistory]) -> dict[int, EarlierSteps]:
    """Says, per attempt whose log holds more than the newest steps read (`task_detail`'s
    `newest`), what was left out. The verdict counts stay the whole attempt's (the cloud's):
    live.js recounts the steps shown and adds those of the earlier ones, whose verdicts no
    longer change."""
    earlier: dict[int, EarlierSteps] = {}
    for h in history:
        left_out = (h.logged or 0) - len(h.decisions)
        if left_out > 0 and h.decisions:
            shown = verdict_counts(h.decisions)
            earlier[h.attempt] = EarlierSteps(
                count=left_out,
                through=h.decisions[0].step_index - 1,
                verdicts={k: n - shown[k] for k, n in h.verdicts.items()},
            )
    return earlier


@router.get("/tasks/{task_id}/attempts/{attempt}/steps", response_class=HTMLResponse)
async def steps_page(
    request: Request,
    _: PageUser,
    cloud: Cloud,
    task_id: str,
    attempt: Annotated[int, PathParam(ge=1, le=INT32_MAX)],
    through: Annotated[int, Query(ge=1, le=INT32_MAX)],
) -> Response:
    """Steps `through` - SHOWN_STEPS + 1 to `through` of one attempt: the task page's earlier
    steps, read from the cloud as one page of its decision log after a step index (the
    listing's own keyset), with links to the pages before and after."""
    task = TaskOut.of(await cloud.get_task(task_id))
    start = max(0, through - SHOWN_STEPS)
    page = await cloud.list_decisions(
        task_id, attempt=attempt, page_size=SHOWN_STEPS, page_token="", after_step=start
    )
    decisions = [DecisionOut.of(d) for d in page.decisions if d.step_index <= through]
    screens: dict[int, list[ScreenOut]] = {}
    for shot in await cloud.screenshots(task_id, attempt, start):
        if shot.step_index <= through:
            screens.setdefault(shot.step_index, []).append(ScreenOut.of(shot))
    for d in decisions:
        d.screens = screens.get(d.step_index, [])
    context = {
        "nav": "tasks",
        "task": task,
        "attempt": attempt,
        "decisions": decisions,
        "first": start + 1,
        "through": through,
        "earlier": start,
        "later": through + SHOWN_STEPS,
    }
    return PAGES.render(request, "steps.html", context)


@router.get("/tasks/{task_id}/live", response_class=HTMLResponse)
async def task_live(
    request: Request,
    _: PageUser,
    cloud: Cloud,
    task_id: str,
    attempt: Annotated[int, Query(ge=1, le=INT32_MAX)],
    after_step: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> Response:
    """What a running task's page merges on a live change (live.js): the card of `attempt` and
    its steps after `after_step`. It fetched the whole page again on every step, its whole
    decision log with it (13 kB a step and growing)."""
    detail = await task_detail(cloud, task_id, attempt=attempt, after_step=after_step)
    context = {"detail": detail, "attempt": attempt}
    return PAGES.render(request, "task_live.html", context)


@router.get("/decisions/{decision_id}/prompts", response_class=HTMLResponse)
async def prompts_page(request: Request, _: PageUser, cloud: Cloud, decision_id: str) -> Response:
    """One step's prompts, which the task page's step loads when opened: inline, every step's
    prompts made a task of 600 steps a 5 MB page."""
    decision = DecisionOut.of(await cloud.get_decision(decision_id))
    return PAGES.render(request, "prompts.html", {"nav": "tasks", "d": decision})


@router.get("/tasks/{task_id}/export")
async def export_page(_: PageUser, cloud: Cloud, task_id: str) -> Response:
    """The "Download" link: the cloud's export of the task (a zip)."""
    return await export_download(cloud, task_id)


@router.get("/tasks/{task_id}/attempts/{attempt}/conversation", response_class=HTMLResponse)
async def conversation_page(
    request: Request,
    _: PageUser,
    cloud: Cloud,
    task_id: str,
    attempt: Annotated[int, PathParam(ge=1, le=INT32_MAX)],
) -> Response:
    task = TaskOut.of(await cloud.get_task(task_id))
    items = [ConversationItemOut.of(i) for i in await cloud.conversation(task_id, attempt)]
    context = {"nav": "tasks", "task": task, "attempt": attempt, "items": items}
    return PAGES.render(request, "conversation.html", context)


@router.get("/flows", response_class=HTMLResponse)
async def flows_page(
    request: Request,
    _: PageUser,
    cloud: Cloud,
    page_token: str = "",
    page_size: Annotated[int, Query(ge=1, le=500)] = FLOWS_PAGE,
    back: Annotated[list[str] | None, Query()] = None,
) -> Response:
    page = await cloud.list_flows(page_size=page_size, page_token=page_token)
    filters = [("page_size", str(page_size))] if page_size != FLOWS_PAGE else []
    context = {
        "nav": "flows",
        "flows": [FlowOut.of(f) for f in page.flows],
        "page_token": page_token,  # an empty page past the first: no more, not none learned
        **pager_links("/flows", filters, back or [], page_token, page.next_page_token),
    }
    return PAGES.render(request, "flows.html", context)


@router.get("/flows/{flow_id}", response_class=HTMLResponse)
async def flow_page(request: Request, _: PageUser, cloud: Cloud, flow_id: str) -> Response:
    flow = FlowOut.of(await cloud.get_flow(flow_id))
    return PAGES.render(request, "flow_detail.html", {"nav": "flows", "flow": flow})


@router.post("/flows/{flow_id}/status")
async def flow_status_submit(
    _: FormUser,
    cloud: Cloud,
    flow_id: str,
    active: Annotated[str, Form()] = "",
) -> Response:
    await cloud.set_flow_status(flow_id, active == "1", "from the console")
    return RedirectResponse(f"/flows/{flow_id}", status_code=303)


@router.get("/tasks/{task_id}/cancel", response_class=HTMLResponse)
async def cancel_page(
    request: Request, _: PageUser, _operator: OperatorPage, cloud: Cloud, task_id: str
) -> Response:
    """The cancel form; posted after its session ended, it comes back after the login with
    the reason typed (`webui.drafts`), and nothing cancelled until it is posted again."""
    task = TaskOut.of(await cloud.get_task(task_id))
    kept = take_posted_form(request, f"/tasks/{task_id}/cancel")
    context = {"nav": "tasks", "task": task, "kept": kept}
    return PAGES.render(request, "cancel.html", context)


@router.post("/tasks/{task_id}/cancel")
async def cancel_submit(
    user: FormUser,
    cloud: Cloud,
    task_id: str,
    reason: Annotated[str, Form()] = "",
) -> Response:
    await cloud.cancel_task(task_id, reason.strip() or "cancelled from the console", user)
    return RedirectResponse(f"/tasks/{task_id}", status_code=303)
