"""The app factory (routes, sessions, error pages, the cloud connection) and its uvicorn server."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from cloud import cert_validity
from cloud.settings import SettingError
from console.gateway import api, errors, pages
from console.gateway.auth import Credentials
from console.gateway.cloud import CloudClient
from console.gateway.events import StreamGauge
from console.gateway.models import ErrorOut, HealthOut
from console.gateway.roles import VIEWERS_REFUSED
from console.settings import ConsoleSettings
from webui import hosts
from webui.errors import error_page, install_error_handlers
from webui.headers import add_security_headers, content_security_policy
from webui.limits import install_body_limit
from webui.listening import is_loopback, is_wildcard
from webui.login import logout_router
from webui.pages import static_files
from webui.params import WHOLE_NUMBERS
from webui.sessions import install_sessions
from webui.throttle import install_throttle

log = logging.getLogger(__name__)

SESSION_COOKIE = "amc_console_session"
#: Answered whatever the Host header names: a load balancer's probe carries the address it
#: dialled, and they need no login and show nothing a rebinding page could use.
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})


def _is_api(request: Request) -> bool:
    return request.url.path.startswith("/api")


def _check_operator_certificate(ca: Path, cert: Path, key: Path) -> None:
    """Refuse to start with an operator certificate the cloud would refuse (expired, not valid
    yet, another CA's): the gateway served, and every page failed on "Socket closed", the
    reason only in the cloud's log. Files not there are left to the channel to say."""
    if not ca.is_file() or not cert.is_file():
        return
    try:
        cert_validity.check(cert, ca, "operator certificate", key=key)
    except cert_validity.CertificateInvalid as exc:
        raise SettingError(
            "AMC_CONSOLE_CLIENT_CERT",
            str(exc),
            errors.RENEW,
        ) from None


def create_app(settings: ConsoleSettings) -> FastAPI:
    """The console gateway for these settings; it connects to the cloud when it starts serving."""
    ca, cert, key = settings.tls_files()
    _check_operator_certificate(ca, cert, key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cloud = CloudClient(
            settings.cloud_address,
            ca=ca,
            cert=cert,
            key=key,
            server_name=settings.tls_server_name,
            timeout_s=settings.grpc_timeout_s,
            reconnect_initial_s=settings.reconnect_initial_s,
            reconnect_max_s=settings.reconnect_max_s,
        )
        app.state.cloud = cloud
        log.info("console gateway talks to the cloud at %s", settings.cloud_address)
        try:
            yield
        finally:
            await cloud.close()

    app = FastAPI(
        title="amc console",
        summary="Operators' gateway to the amc cloud: tasks, live progress, decisions, fleet.",
        version="1",
        lifespan=lifespan,
        # No interactive docs page: FastAPI's loads Swagger UI from a CDN (floating version, no
        # integrity check) onto the console's own origin, where it could read the session's
        # answers. The schema is served as JSON; docs/cli.md says how to browse it.
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
        dependencies=[WHOLE_NUMBERS, VIEWERS_REFUSED],
    )
    app.state.streams = StreamGauge()
    app.state.credentials = Credentials(
        settings.admin_username,
        settings.admin_password,
        settings.api_token,
        viewer=settings.viewer_account,
        viewer_token=settings.viewer_api_token,
    )
    install_sessions(
        app,
        secret=settings.session_secret.get_secret_value(),
        cookie=SESSION_COOKIE,
        max_age_s=settings.session_max_age_s,
        same_site="lax",
        https_only=settings.secure_cookies,
    )
    install_throttle(app)
    install_body_limit(app)

    add_security_headers(
        app,
        csp=content_security_policy(),
        referrer_policy="same-origin",
        is_api=_is_api,
        serves_tls=settings.serves_tls,
    )
    install_error_handlers(app, pages.PAGES, is_api=_is_api)

    @app.exception_handler(grpc.aio.AioRpcError)
    async def cloud_error(request: Request, exc: grpc.aio.AioRpcError) -> Response:
        cloud: CloudClient = request.app.state.cloud
        status, message, code = cloud.describe(exc)
        if status >= 500:
            log.warning("cloud call failed: %s %s", code, exc.details())
        if _is_api(request):
            body = ErrorOut(detail=message, grpc_code=code).model_dump(exclude_none=True)
            return JSONResponse(body, status_code=status)
        return error_page(pages.PAGES, request, status, message, code)

    @app.get("/healthz", response_model=HealthOut, tags=["health"], summary="Gateway health")
    async def healthz(request: Request) -> HealthOut:
        """Unauthenticated: is the gateway up, can it reach the cloud, how many live streams."""
        return await _health(request)

    @app.get(
        "/readyz",
        response_model=HealthOut,
        tags=["health"],
        summary="Gateway readiness",
        responses={503: {"model": HealthOut, "description": "the cloud is not serving"}},
    )
    async def readyz(request: Request) -> Response:
        """Unauthenticated, for a load balancer's readiness probe: 503 while the cloud is not
        SERVING (unreachable, or its database down), when every page and API call would fail;
        /healthz stays 200 (the gateway itself is alive: restarting it would not help)."""
        health = await _health(request)
        ready = health.cloud == "SERVING"
        return JSONResponse(health.model_dump(), status_code=200 if ready else 503)

    app.include_router(api.router)
    app.include_router(pages.router)
    app.include_router(logout_router)
    app.mount("/static", static_files(Path(__file__).parent / "static"), name="static")
    hosts.install_host_guard(
        app,
        hosts.allowed_host_names(
            settings.bind_host,
            settings.allowed_hosts,
            any_when_unlisted=_names_unknowable(settings),
        ),
        setting="AMC_CONSOLE_ALLOWED_HOSTS",
        exempt=HEALTH_PATHS,
    )
    return app


async def _health(request: Request) -> HealthOut:
    cloud: CloudClient = request.app.state.cloud
    return HealthOut(
        status="ok", cloud=await cloud.health(), open_streams=request.app.state.streams.open
    )


#: Seconds an open live-update stream may delay shutdown before it is cut.
GRACEFUL_SHUTDOWN_S = 3


def plain_http_warning(settings: ConsoleSettings) -> str | None:
    """What to say when the console would take its login over plain HTTP from other machines
    (None: it listens on loopback only, serves HTTPS, or is told a TLS proxy is in front).

    A warning, not a refusal (as the host console's loopback rule is): a plain-HTTP console on
    a private network behind a TLS proxy on another machine is a setup people run, and only
    `AMC_CONSOLE_COOKIE_SECURE` says so. Unsaid, the password and the session cookie crossed
    the network readable by anyone on the way, and nothing told the person who started it."""
    if settings.serves_tls or settings.cookie_secure or is_loopback(settings.bind_host):
        return None
    return (
        f"the console listens on {settings.bind_host} over plain HTTP: the operator password, "
        "the API token and the session cookie cross the network unencrypted. Set "
        "AMC_CONSOLE_TLS_CERT_FILE and AMC_CONSOLE_TLS_KEY_FILE, or put a TLS proxy in front "
        "and set AMC_CONSOLE_COOKIE_SECURE=true (or bind 127.0.0.1, the default)"
    )


def _names_unknowable(settings: ConsoleSettings) -> bool:
    """Whether the console cannot know the Host names it is reached by: it listens on every
    address (a container, a VM behind a balancer), or a TLS proxy is in front
    (`AMC_CONSOLE_COOKIE_SECURE=true` without a certificate of its own; a proxy that passes
    the browser's Host on, as `proxy_set_header Host $host` does)."""
    behind_proxy = settings.cookie_secure is True and not settings.serves_tls
    return is_wildcard(settings.bind_host) or behind_proxy


def unguarded_warning(settings: ConsoleSettings) -> str | None:
    """What to say when the console answers to any Host name because no names are listed and
    it cannot know them (`_names_unknowable`; None: it is guarded).

    Refusing every name but loopback and the bind address there would turn an upgrade into a
    console that answers 400 to everyone. So it answers to any name, as the host console with
    `--allow-remote` does, and says how to turn the guard on."""
    if settings.allowed_hosts or not _names_unknowable(settings):
        return None
    return (
        f"the console (listening on {settings.bind_host}) answers to any Host name: a web page "
        "that re-points its domain at this machine or its proxy (DNS rebinding) can use it "
        "through an operator's browser. List the names browsers use in "
        "AMC_CONSOLE_ALLOWED_HOSTS (comma-separated) to refuse the others"
    )


def check_tls_files(settings: ConsoleSettings) -> None:
    """Load the console's certificate and key once before serving: uvicorn loads them only as
    it starts, and a typo'd path, a file that is not PEM or a key of another certificate left
    `ssl`'s bare text (no file named, "[Errno 2]", "PEM lib") as an unexpected error, exit 70.
    Raises `SettingError` naming the setting and the file (exit 2)."""
    cert, key = settings.tls_cert_file, settings.tls_key_file
    if cert is None or key is None:
        return
    for setting, path in (("AMC_CONSOLE_TLS_CERT_FILE", cert), ("AMC_CONSOLE_TLS_KEY_FILE", key)):
        try:
            path.read_bytes()
        except OSError as exc:
            raise SettingError(
                setting,
                f"cannot read {path} ({exc.strerror or exc})",
                "point it at the console's PEM file",
            ) from exc
    try:
        # An encrypted key is refused here (no password setting), not prompted for on a terminal.
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise SettingError(
            "AMC_CONSOLE_TLS_CERT_FILE",
            f"cannot serve TLS with {cert} and the key {key}: {exc}",
            "point AMC_CONSOLE_TLS_CERT_FILE at a PEM certificate (chain) and"
            " AMC_CONSOLE_TLS_KEY_FILE at its unencrypted PEM key",
        ) from exc


def build_server(settings: ConsoleSettings, *, log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for the console on settings.bind_host:bind_port (port 0: any free one),
    over HTTPS when a TLS certificate and key are set (logs `plain_http_warning` if any;
    unusable TLS files: `check_tls_files`)."""
    check_tls_files(settings)
    for warning in (plain_http_warning(settings), unguarded_warning(settings)):
        if warning is not None:
            log.warning("%s", warning)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.bind_host,
        port=settings.bind_port,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_level=log_level,
        # uvicorn's loggers write through the process's handler (`telemetry.logs`: its format,
        # scrubbed of secrets), not the handlers of uvicorn's own logging config.
        log_config=None,
        ssl_certfile=settings.tls_cert_file,
        ssl_keyfile=settings.tls_key_file,
    )
    return uvicorn.Server(config)


async def serve(settings: ConsoleSettings) -> None:
    """Serve until cancelled or signalled (inside an existing event loop, e.g. `amc up`)."""
    await build_server(settings).serve()


def run(settings: ConsoleSettings) -> None:
    """Serve in a fresh event loop until Ctrl-C."""
    asyncio.run(serve(settings))
