"""The error handlers both consoles install: a login redirect, and error pages for people.

A page asked for without a session goes to /login (and back afterwards). An HTTP error or an
invalid request shows `webui/error.html` inside the console's own layout; on a console's JSON
API (`is_api`) FastAPI's JSON answers are kept, since scripts read them.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from webui.pages import Pages
from webui.redirects import login_url
from webui.sessions import LoginRequired

ERROR_PAGE = "webui/error.html"


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


def install_error_handlers(
    app: FastAPI, pages: Pages, is_api: Callable[[Request], bool] | None = None
) -> None:
    """Register the login redirect and the error pages on `app` (`is_api`: JSON API paths)."""

    def api(request: Request) -> bool:
        return is_api is not None and is_api(request)

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
        if api(request):
            return await request_validation_exception_handler(request, exc)
        return error_page(pages, request, 422, validation_message(exc))
