"""The console's pages: login, now (live phones), tasks, one task's timeline (its newest steps,
the earlier ones a page at a time, a step's prompts on their own), screenshots.

Read-only apart from logging in and out. Every page but /login needs a session; every form
posts a CSRF token (sessions, CSRF and the login page frame are the shared `webui` pieces).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Query, Request, status
from fastapi import Path as PathParam
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from starlette.concurrency import run_in_threadpool

from host.console import present
from host.console.login_token import OneTimeToken
from host.console.state import (
    HostState,
    cloud_link,
    host_id,
    paused,
    phones_now,
    planner_transport,
)
from host.timeline.artifacts import safe_component
from host.timeline.record import TimelineRecord
from host.timeline.store import TaskRow, TimelineStore
from planner.decision import OMITTED_BLOCK
from planner.unsettled import unsettled_words
from webui import login
from webui.headers import SCREENSHOT_CACHE
from webui.id_prefixes import ID_LENGTH, SHOWN, IdPrefixError, as_prefix, pick
from webui.pages import Pages
from webui.sessions import PageUser, session_user

HOME = "/now"


def _console_context(request: Request) -> dict[str, Any]:
    """What this console's pages add: how often they poll, where "home" is."""
    return {
        "poll_ms": int(request.app.state.poll_interval_s * 1000),
        "home_url": HOME,
        "home_label": "Back to the console",
    }


PAGES = Pages(Path(__file__).parent / "templates", _console_context)
PAGES.env.filters.update(
    when=present.when, ago=present.ago, seconds=present.seconds, task_badge=present.task_badge
)
PAGES.env.globals["omitted_block"] = OMITTED_BLOCK

#: Screenshot types the artifact route serves; anything else in the folder is not for browsers.
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
OPERATOR = "operator"
#: The largest attempt or step number a request may name (int32, as on the wire): a number past
#: SQLite's 64 bits made the store's query raise, a 500 instead of a 422.
MAX_NUMBER = 2**31 - 1

router = APIRouter(include_in_schema=False)


def _state(request: Request) -> HostState:
    state: HostState = request.app.state.host
    return state


def _store(request: Request) -> TimelineStore:
    return _state(request).store


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str = HOME, token: str = "") -> Response:
    return login.login_page(PAGES, request, next, HOME, token=token)


@router.post("/login", response_class=HTMLResponse)
async def login_submit(
    _csrf: login.LoginCsrfChecked,
    request: Request,
    token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = HOME,
) -> Response:
    tokens: OneTimeToken = request.app.state.login_token

    async def verify() -> str | None:
        # On the event loop, not a thread: redeeming must be atomic (the token works once).
        return OPERATOR if tokens.redeem(token) else None

    return await login.attempt(
        PAGES,
        request,
        user=None,  # one token, no user names: throttled per client address
        verify=verify,
        next_path=next,
        home=HOME,
        error=(
            "That token is not valid (each token works once; the host's log shows the current one)."
        ),
        token="",
    )


@router.get("/")
async def home(_: PageUser) -> Response:
    return RedirectResponse(HOME, status_code=303)


def _now_context(request: Request) -> dict[str, Any]:
    state = _state(request)
    connected, link = cloud_link(state)
    return {
        "phones": phones_now(state),
        "connected": connected,
        "link": link,
        "transport": planner_transport(state),
        "paused": paused(state),
    }


@router.get("/now", response_class=HTMLResponse)
async def now_page(request: Request, _: PageUser) -> Response:
    return PAGES.render(request, "now.html", {"nav": "now", **_now_context(request)})


@router.get("/now/phones", response_class=HTMLResponse)
async def now_fragment(request: Request) -> Response:
    """The phones panel alone, which the "now" page fetches about once a second."""
    if session_user(request) is None:  # a fetch: no redirect; the script says "session ended"
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "log in again")
    response = PAGES.render(request, "_phones.html", _now_context(request))
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get("/tasks", response_class=HTMLResponse)
async def tasks_page(
    request: Request, _: PageUser, page: Annotated[int, Query(ge=1, le=10_000)] = 1
) -> Response:
    size: int = request.app.state.page_size
    rows = await run_in_threadpool(_store(request).list_tasks, size + 1, (page - 1) * size)
    context = {
        "nav": "tasks",
        "tasks": rows[:size],
        "page": page,
        "has_next": len(rows) > size,
    }
    return PAGES.render(request, "tasks.html", context)


def _attempts(store: TimelineStore, task_id: str) -> list[TaskRow]:
    """Every attempt of a task this host still holds, newest first."""
    latest = store.get_task(task_id)
    if latest is None:
        return []
    rows = [latest]
    for attempt in range(latest.attempt - 1, 0, -1):
        row = store.get_task(task_id, attempt)
        if row is not None:
            rows.append(row)
    return rows


#: Steps of an attempt the task page shows, its newest; the earlier ones are pages of their own
#: (`steps_page`), as on the operators' console: every step rendered made a long attempt's page
#: megabytes.
SHOWN_STEPS = 50


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
async def task_page(
    request: Request,
    _: PageUser,
    task_id: str,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_NUMBER)] = None,
) -> Response:
    store = _store(request)
    attempts = await run_in_threadpool(_attempts, store, task_id)
    if not attempts:
        full = await _by_prefix(store, task_id)
        target = f"/tasks/{full}" + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(target, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    chosen = (
        attempts[0]
        if attempt is None
        else next((a for a in attempts if a.attempt == attempt), None)
    )
    if chosen is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no attempt {attempt} of {task_id!r}")
    every, steps = await run_in_threadpool(_newest_steps, store, task_id, chosen.attempt)
    failed, failed_usage = await run_in_threadpool(store.failed_calls, task_id, chosen.attempt)
    lost, at_most = await run_in_threadpool(store.unsettled_calls, task_id, chosen.attempt)
    earlier = len(every) - len(steps)
    context = {
        "nav": "tasks",
        "task": chosen,
        "attempts": attempts,
        "steps": steps,
        "count": len(every),
        "earlier": earlier,
        "earlier_through": every[earlier - 1].index if earlier > 0 else 0,
        "cost": present.steps_cost(every, failed_usage),
        "failed_calls": present.failed_calls_words(failed, failed_usage) if failed else "",
        "unsettled_calls": unsettled_words(lost, at_most) if lost else "",
        "verdicts": present.verdict_counts(every),
    }
    return PAGES.render(request, "task.html", context)


def _newest_steps(
    store: TimelineStore, task_id: str, attempt: int
) -> tuple[list[present.StepView], list[present.StepView]]:
    """Every step of the attempt in outline (`TimelineStore.step_outlines`: what the page's
    counts and cost need), and its newest SHOWN_STEPS as the page shows them."""
    every = present.step_views(store.step_outlines(task_id, attempt))
    first = max(0, len(every) - SHOWN_STEPS)
    return every, _views(store, store.steps(task_id, attempt, offset=first, limit=SHOWN_STEPS))


@router.get("/tasks/{task_id}/attempts/{attempt}/steps", response_class=HTMLResponse)
async def steps_page(
    request: Request,
    _: PageUser,
    task_id: str,
    attempt: Annotated[int, PathParam(ge=1, le=MAX_NUMBER)],
    through: Annotated[int, Query(ge=1, le=MAX_NUMBER)],
) -> Response:
    """Steps `through` - SHOWN_STEPS + 1 to `through` of one attempt: the task page's earlier
    steps, read from the store alone, with links to the steps before and after."""
    store = _store(request)
    task = await run_in_threadpool(store.get_task, task_id, attempt)
    if task is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no attempt {attempt} of {task_id!r}")
    start = max(0, through - SHOWN_STEPS)
    # One step past the window: it carries the model's judgement of the window's last one.
    records = await run_in_threadpool(
        store.steps, task_id, attempt, after_step=start, limit=SHOWN_STEPS + 1
    )
    views = await run_in_threadpool(_views, store, records)
    steps = [v for v in views if v.index <= through]
    context = {
        "nav": "tasks",
        "task": task,
        "steps": steps,
        "first": start + 1,
        "through": through,
        "earlier": start,
        "later": through + SHOWN_STEPS if len(steps) < len(views) else 0,
    }
    return PAGES.render(request, "steps.html", context)


@router.get("/tasks/{task_id}/attempts/{attempt}/steps/{step}/prompts", response_class=HTMLResponse)
async def prompts_page(
    request: Request,
    _: PageUser,
    task_id: str,
    attempt: Annotated[int, PathParam(ge=1, le=MAX_NUMBER)],
    step: Annotated[int, PathParam(ge=0, le=MAX_NUMBER)],
) -> Response:
    """One step's prompts, which the timeline's step loads when opened: inline, every step's
    two prompts (kilobytes each) made a long attempt's page megabytes."""
    store = _store(request)
    task = await run_in_threadpool(store.get_task, task_id, attempt)
    records = await run_in_threadpool(store.steps, task_id, attempt, after_step=step - 1, limit=1)
    if task is None or not records or records[0].step_index != step:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no step {step} of attempt {attempt} of {task_id!r}"
        )
    context = {"nav": "tasks", "task": task, "s": present.step_view(records[0])}
    return PAGES.render(request, "prompts.html", context)


async def _by_prefix(store: TimelineStore, typed: str) -> str:
    """The one task held here whose id starts with `typed` (a prefix as a terminal or the
    cloud console shows it, which the cloud console already took); a 404 saying none or
    which several do otherwise (`webui.id_prefixes`, the cloud console's rules)."""
    prefix = as_prefix(typed)
    if prefix is None or (prefix == typed and len(prefix) == ID_LENGTH):  # asked as it is
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no task {typed!r} on this host")
    found = await run_in_threadpool(store.task_ids_starting, prefix, SHOWN + 1)
    try:
        return pick(prefix, found, "on this host")
    except IdPrefixError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{error}; {error.hint}") from None


def _screen_size(store: TimelineStore, relative: str | None) -> tuple[int, int] | None:
    """The size of a stored screenshot (its PNG header), None when it cannot be read."""
    path = store.artifacts.find(relative) if relative else None
    return present.png_size(path) if path is not None else None


def _views(store: TimelineStore, records: list[TimelineRecord]) -> list[present.StepView]:
    """The steps as the page shows them (in a worker thread: it reads each screenshot's
    header)."""
    sizes = [
        None if present.screen_size(r) else _screen_size(store, r.before_screenshot_path)
        for r in records
    ]
    # A step gets the model's judgement of it from the next step's record; one appended by a
    # live poll before its next step existed shows it when the page is loaded again.
    return present.step_views(records, sizes)


def _export(store: TimelineStore, task_id: str, host: str) -> tuple[str, bytes] | None:
    from export.bundle import bundle_bytes
    from host.timeline.export_source import run_from_timeline

    run = run_from_timeline(store, task_id, host)
    return (run.task_id, bundle_bytes(run)) if run is not None else None


@router.get("/tasks/{task_id}/export")
async def task_export(request: Request, _: PageUser, task_id: str) -> Response:
    """The "Download" link: this host's export of the task (every attempt it holds, with
    screenshots) as a zip; 404 for a task it does not hold."""
    made = await run_in_threadpool(_export, _store(request), task_id, host_id(_state(request)))
    if made is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no task {task_id!r} on this host")
    name = safe_component(f"amc-export-{made[0]}") + ".zip"
    return Response(
        made[1],
        media_type="application/zip",
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
        },
    )


def _live_thinking(request: Request, task_id: str, attempt: int) -> str:
    """The model's thinking while this attempt's step is planned (direct session mode with
    streaming), "" otherwise or when the console runs without a live host."""
    live = getattr(request.app.state.host, "thinking", None)
    return str(live.text(task_id, attempt)) if live is not None else ""


@router.get("/tasks/{task_id}/live")
async def task_live(
    request: Request,
    task_id: str,
    attempt: Annotated[int, Query(ge=1, le=MAX_NUMBER)],
    after: Annotated[int, Query(ge=0, le=MAX_NUMBER)] = 0,
) -> Response:
    """What a running task's timeline page lacks: status, progress, the steps past `after`.

    The page polls this (about once a second) and appends the returned sections, so a step a
    person has opened stays open.
    """
    if session_user(request) is None:  # a fetch: no redirect; the script says "session ended"
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "log in again")
    store = _store(request)
    task = await run_in_threadpool(store.get_task, task_id, attempt)
    if task is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no attempt {attempt} of {task_id!r}")
    count, records = await run_in_threadpool(store.steps_since, task_id, attempt, after)
    steps = await run_in_threadpool(_views, store, records)
    template = PAGES.env.get_template("_step.html")
    html = "".join(template.render(s=view) for view in steps)
    body: dict[str, object] = {
        "status": task.status,
        "progress": present.task_badge(task) or "—",
        "summary": task.summary,
        "count": count,
        "html": html,
        "thinking": _live_thinking(request, task_id, attempt),
    }
    if records or task.status != "running":
        # The summary's counts and cost change only with a step (or at the end, with the
        # failed decisions' calls): read the attempt's outlines then, not on every poll.
        body.update(await run_in_threadpool(_live_facts, store, task_id, attempt))
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


def _live_facts(store: TimelineStore, task_id: str, attempt: int) -> dict[str, str]:
    """The task page's summary lines that grow with its steps (verified-steps counts, tokens and
    cost), as the page renders them: without them a running attempt's page kept the counts it
    was opened with."""
    every = present.step_views(store.step_outlines(task_id, attempt))
    _, failed_usage = store.failed_calls(task_id, attempt)
    counts = PAGES.env.get_template("_verdict_counts.html")
    return {
        "verdicts_html": counts.render(verdicts=present.verdict_counts(every)),
        "cost": present.steps_cost(every, failed_usage),
    }


@router.get("/artifacts/{path:path}")
async def artifact(request: Request, _: PageUser, path: str) -> Response:
    """A screenshot from the artifact folder; any path that would leave it is a 404."""
    store = _store(request)
    file = await run_in_threadpool(store.artifacts.find, path)
    media = None if file is None else IMAGE_TYPES.get(file.suffix.lower())
    if file is None or media is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such artifact")
    return FileResponse(
        file,
        media_type=media,
        headers={"Cache-Control": SCREENSHOT_CACHE, "X-Content-Type-Options": "nosniff"},
    )


def store_closed(exc: sqlite3.ProgrammingError) -> bool:
    """The host closed its store (it is shutting down) while a page was being served."""
    return "closed" in str(exc).lower()
