"""The local console's app factory: sessions, security headers, error pages, the routes."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from fastapi import FastAPI, Request, Response

from host.console import routes
from host.console.login_token import OneTimeToken
from host.console.settings import HostConsoleSettings
from host.console.state import HostState
from webui import hosts
from webui.errors import error_page, install_error_handlers
from webui.headers import add_security_headers, content_security_policy
from webui.limits import install_body_limit
from webui.login import logout_router
from webui.pages import static_files
from webui.params import WHOLE_NUMBERS
from webui.sessions import install_sessions
from webui.throttle import install_throttle

log = logging.getLogger(__name__)


def allowed_host_names(settings: HostConsoleSettings) -> frozenset[str] | None:
    """Host header names the console answers to; None means any (remote, no list given).

    A console on loopback answers only to loopback names, so a web page that re-points its own
    domain at 127.0.0.1 (DNS rebinding) cannot talk to it through the visitor's browser.
    """
    return hosts.allowed_host_names(
        settings.bind_host, settings.allowed_hosts, any_when_unlisted=settings.allow_remote
    )


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
        dependencies=[WHOLE_NUMBERS],
    )
    app.state.host = app_state
    app.state.login_token = login_token or OneTimeToken()
    app.state.poll_interval_s = settings.poll_interval_s
    app.state.page_size = settings.page_size
    install_sessions(
        app,
        secret=settings.session_secret.get_secret_value(),
        cookie=session_cookie_name(settings),
        max_age_s=settings.session_max_age_s,
        same_site="strict",
        https_only=settings.cookie_secure,
    )
    install_throttle(app)
    install_body_limit(app)

    add_security_headers(app, csp=content_security_policy(), referrer_policy="no-referrer")
    install_error_handlers(app, routes.PAGES)
    hosts.install_host_guard(
        app, allowed_host_names(settings), setting="AMC_HOST_CONSOLE_ALLOWED_HOSTS"
    )

    @app.exception_handler(sqlite3.ProgrammingError)
    async def store_gone(request: Request, exc: sqlite3.ProgrammingError) -> Response:
        if not routes.store_closed(exc):
            raise exc
        return error_page(routes.PAGES, request, 503, "The host is shutting down.")

    app.include_router(routes.router)
    app.include_router(logout_router)
    app.mount("/static", static_files(Path(__file__).parent / "static"), name="static")
    return app
