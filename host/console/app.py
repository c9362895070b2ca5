"""The local console's app factory: sessions, security headers, error pages, the routes."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlencode

from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.sessions import SessionMiddleware

from console.gateway.auth import LoginRequired
from host.console import routes
from host.console.login_token import OneTimeToken
from host.console.settings import HostConsoleSettings
from host.console.state import HostState

log = logging.getLogger(__name__)

#: Same policy as the cloud console: nothing from elsewhere, no inline script or style.
_CSP = (
    "default-src 'self'; img-src 'self'; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def host_of(header: str) -> str:
    """The name in a Host header without its port (`[::1]:8765` → `::1`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_host_names(settings: HostConsoleSettings) -> frozenset[str] | None:
    """Host header names the console answers to; None means any (remote, no list given).

    A console on loopback answers only to loopback names, so a web page that re-points its own
    domain at 127.0.0.1 (DNS rebinding) cannot talk to it through the visitor's browser.
    """
    extra = {host_of(h) for h in settings.allowed_hosts if h}
    if settings.allow_remote and not extra:
        return None
    return LOOPBACK_NAMES | extra | {host_of(settings.bind_host)}


def session_cookie_name(settings: HostConsoleSettings) -> str:
    """Cookies ignore ports: a name per port keeps two consoles on one machine apart."""
    base = "amc_host_console_session"
    return f"{base}_{settings.bind_port}" if settings.bind_port else base


def create_app(
    app_state: HostState,
    settings: HostConsoleSettings | None = None,
    login_token: OneTimeToken | None = None,
) -> FastAPI:
    """The console over a host's store, lease client and phones (read-only).

    `app.state.login_token` holds the one-time token; `serve_console` prints it.
    """
    settings = settings or HostConsoleSettings()
    app = FastAPI(
        title="amc host console",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.host = app_state
    app.state.login_token = login_token or OneTimeToken()
    app.state.poll_interval_s = settings.poll_interval_s
    app.state.page_size = settings.page_size
    app.add_middleware(
        SessionMiddleware,
        secret_key=settings.session_secret.get_secret_value(),
        session_cookie=session_cookie_name(settings),
        max_age=settings.session_max_age_s,
        same_site="strict",
        https_only=settings.cookie_secure,
    )

    hosts = allowed_host_names(settings)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if hosts is not None and host_of(request.headers.get("host", "")) not in hosts:
            return PlainTextResponse("unknown Host header", status_code=400)
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Content-Security-Policy", _CSP)
        return response

    @app.exception_handler(LoginRequired)
    async def to_login(request: Request, exc: LoginRequired) -> Response:
        return RedirectResponse("/login?" + urlencode({"next": exc.next_path}), status_code=303)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        context = {"status": exc.status_code, "message": exc.detail}
        return routes.render(request, "error.html", context, status_code=exc.status_code)

    @app.exception_handler(sqlite3.ProgrammingError)
    async def store_gone(request: Request, exc: sqlite3.ProgrammingError) -> Response:
        if not routes.store_closed(exc):
            raise exc
        context = {"status": 503, "message": "The host is shutting down."}
        return routes.render(request, "error.html", context, status_code=503)

    app.include_router(routes.router)
    app.mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static")
    return app
