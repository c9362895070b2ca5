"""The error handlers both consoles install: a login redirect, and error pages for people.

A page asked for without a session goes to /login (and back afterwards). An HTTP error or an
invalid request shows `webui/error.html` inside the console's own layout; on a console's JSON
API (`is_api`) the answer is JSON of one shape, `{"detail": "<for people>"}` (an invalid
request adds `errors`, each problem's loc, msg and type: 422, or 400 for a body that is not
JSON at all), since scripts read them. Anything unexpected is logged and answered the same
way (500), never as Starlette's plain-text page, which also drops the keep-alive connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from webui.pages import Pages
from webui.redirects import login_url
from webui.sessions import LoginRequired

log = logging.getLogger(__name__)

ERROR_PAGE = "webui/error.html"
#: What a person or script is told about a failure of the console itself (details: its log).
UNEXPECTED = "the console failed to answer this request; the error is in its log"


def error_page(
    pages: Pages, request: Request, status: int, message: object, code: str | None = None
) -> Response:
    """The error page: HTTP status, a message for people and, for a cloud refusal, its code."""
    context = {"status": status, "message": message, "code": code}
    return pages.render(request, ERROR_PAGE, context, status_code=status)


def validation_message(exc: RequestValidationError) -> str:
    """Every problem of an invalid request on one line, naming the parameter."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg', '')}"
        for e in exc.errors()
    )


def not_json(exc: RequestValidationError) -> str | None:
    """What is wrong with a request body that is not JSON at all ("request body: not valid
    JSON: Expecting ',' delimiter at character 12"), None when the body parsed. Such a request
    was not read, so it is a 400, not the 422 of a value refused."""
    for e in exc.errors():
        if e.get("type") == "json_invalid":
            loc = e.get("loc", ())
            why = str((e.get("ctx") or {}).get("error", "")) or "cannot be parsed"
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            return f"request body: not valid JSON: {why}{where}"
    return None


def validation_errors(exc: RequestValidationError) -> list[dict[str, object]]:
    """Each problem's loc, msg and type, without the input (it may be a secret's value)."""
    return [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type", "")}
        for e in exc.errors()
    ]


class _Unexpected:
    """Answers an exception no handler took as a 500 error page or JSON (and logs it).

    Innermost of the app's middleware, so the session (for the page) and the security headers
    apply to its answer; Starlette's own catch-all sits outside all of them and re-raises.
    """

    def __init__(self, app: ASGIApp, answer: Callable[[Request], Response]) -> None:
        self.app = app
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            if started:  # a streamed answer broke midway: nothing left to say but to stop
                raise
            log.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            await self.answer(Request(scope, receive))(scope, receive, send)


def install_error_handlers(
    app: FastAPI, pages: Pages, is_api: Callable[[Request], bool] | None = None
) -> None:
    """Register the login redirect and the error pages on `app` (`is_api`: JSON API paths)."""

    def api(request: Request) -> bool:
        return is_api is not None and is_api(request)

    def unexpected(request: Request) -> Response:
        if api(request):
            return JSONResponse({"detail": UNEXPECTED}, status_code=500)
        return error_page(pages, request, 500, UNEXPECTED)

    # Appended, not added: innermost whatever else is installed before or after.
    app.user_middleware.append(Middleware(_Unexpected, answer=unexpected))

    @app.exception_handler(LoginRequired)
    async def to_login(request: Request, exc: LoginRequired) -> Response:
        return RedirectResponse(login_url(exc.next_path), status_code=303)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if api(request):
            return await http_exception_handler(request, exc)
        return error_page(pages, request, exc.status_code, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        unread = not_json(exc)
        status, message = (422, validation_message(exc)) if unread is None else (400, unread)
        if api(request):
            body = {"detail": message, "errors": validation_errors(exc)}
            return JSONResponse(body, status_code=status)
        return error_page(pages, request, status, message)
