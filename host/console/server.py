"""Serve the local console next to the host, in the host's own event loop.

`serve_console(app, settings)` is what `amc host run --console` and `amc up` await beside
`serve_host`: it refuses a non-loopback address unless `allow_remote`, starts uvicorn on the
running loop (so pages read the lease client's state without crossing threads), prints the URL
and the one-time login token, and returns when `stop` is set or the task is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from urllib.parse import quote

import uvicorn

from host.console.app import create_app
from host.console.binding import check_bind_address
from host.console.login_token import URL_FILE, OneTimeToken, served_url, token_dir
from host.console.settings import HostConsoleSettings
from host.console.state import HostState

log = logging.getLogger(__name__)

Announce = Callable[[str], None]


_TOKEN_IN_QUERY = re.compile(r"([?&]token=)[^&#\s]*")


class HideLoginTokens(logging.Filter):
    """uvicorn's access log writes each request's path with its query, and the login link is
    `/login?token=…`: at `AMC_HOST_CONSOLE_LOG_LEVEL=info` a login token reached the log. The
    path (the access record's third argument) is logged with the token's value left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], _TOKEN_IN_QUERY.sub(r"\1…", args[2]), *args[3:])
        return True


def _hide_login_tokens() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, HideLoginTokens) for f in access.filters):
        access.addFilter(HideLoginTokens())


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the host owns SIGINT/SIGTERM and stops us."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ConsoleServer:
    """One console server: the app, its uvicorn server and its login token."""

    def __init__(self, app_state: HostState, settings: HostConsoleSettings) -> None:
        check_bind_address(settings.bind_host, settings.allow_remote)
        self.settings = settings
        self.token_dir = settings.token_dir or _host_token_dir(app_state)
        self.login_token = OneTimeToken(issued_dir=self.token_dir)
        self.app = create_app(app_state, settings, self.login_token)
        config = uvicorn.Config(
            self.app,
            host=settings.bind_host,
            port=settings.bind_port,
            proxy_headers=False,
            server_header=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            log_level=settings.log_level,
            # Through the host's handler (`telemetry.logs`), not uvicorn's own logging config.
            log_config=None,
        )
        _hide_login_tokens()  # after the Config: it sets uvicorn's loggers' levels
        self.server = _EmbeddedServer(config)
        self._socket: socket.socket | None = None
        self._published: str | None = None

    def bind(self) -> socket.socket:
        """Bind the listening socket now, so a taken port is an `OSError` here.

        (uvicorn binding it itself would `sys.exit` on failure, taking the host down with it.)
        """
        if self._socket is None:
            host = self.settings.bind_host.strip("[]")
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._socket = socket.create_server((host, self.settings.bind_port), family=family)
        return self._socket

    @property
    def started(self) -> bool:
        return bool(self.server.started)

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        return int(self.bind().getsockname()[1])

    @property
    def url(self) -> str:
        host = self.settings.bind_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        if host in ("0.0.0.0", "[::]"):  # reachable everywhere; show the local way in
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    @property
    def login_url(self) -> str:
        """The login page with the current token filled in (the token still works once)."""
        return f"{self.url}/login?token={quote(self.login_token.current)}"

    def stop(self) -> None:
        self.server.should_exit = True

    async def serve(
        self,
        stop: asyncio.Event | None = None,
        announce: Announce | None = None,
        ready: Callable[[ConsoleServer], None] | None = None,
    ) -> None:
        """Serve until `stop` is set (or cancelled); announce URL and token once listening."""
        sock = self.bind()
        serving = asyncio.create_task(self.server.serve([sock]), name="host-console")
        try:
            while not self.server.started:
                if serving.done():
                    break
                await asyncio.sleep(0.02)
            if self.server.started:
                say = announce or _stderr
                say(f"host console: {self.url}  (one-time login token: {self.login_token.current})")
                say(f"host console: log in at {self.login_url}")
                self.login_token.on_rotate = lambda _token: say(
                    f"host console: a login token was used; the next login: {self.login_url}"
                )
                self._publish_url()
                log.info("host console listening on %s", self.url)
                if ready is not None:
                    ready(self)
                if stop is not None:
                    waiter = asyncio.create_task(stop.wait())
                    try:
                        await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waiter.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await waiter
                    self.stop()
            await serving  # returns once uvicorn has shut down; raises what broke it
        finally:
            self.stop()
            if not serving.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(serving)
            sock.close()
            self._unpublish_url()

    def _publish_url(self) -> None:
        """Say where this console serves, in its token folder: `amc host token` prints a login
        link with it (best effort: a read-only folder only costs that link)."""
        if self.token_dir is None:
            return
        try:
            self.token_dir.mkdir(parents=True, exist_ok=True)
            self.token_dir.chmod(0o700)
            (self.token_dir / URL_FILE).write_text(self.url + "\n")
            self._published = self.url
        except OSError as exc:
            log.warning("cannot write the console's URL into %s: %s", self.token_dir, exc)

    def _unpublish_url(self) -> None:
        """Remove the URL this console wrote (another console's, written since, stays)."""
        if self.token_dir is None or self._published is None:
            return
        if served_url(self.token_dir) == self._published:
            with contextlib.suppress(OSError):
                (self.token_dir / URL_FILE).unlink()
        self._published = None


def _host_token_dir(app_state: HostState) -> Path | None:
    """The token folder in the data folder of the host being served (None: no host settings,
    e.g. a console over a bare store in tests)."""
    data_dir = getattr(getattr(app_state, "settings", None), "data_dir", None)
    return token_dir(Path(data_dir)) if data_dir is not None else None


def build_console_server(
    app_state: HostState, settings: HostConsoleSettings | None = None
) -> ConsoleServer:
    """A console server for a host (not started); raises `RemoteBindRefused` on a bad address."""
    return ConsoleServer(app_state, settings or HostConsoleSettings())


async def serve_console(
    app_state: HostState,
    settings: HostConsoleSettings | None = None,
    *,
    stop: asyncio.Event | None = None,
    announce: Announce | None = None,
    ready: Callable[[ConsoleServer], None] | None = None,
) -> None:
    """Serve the console for `app_state` in this event loop until `stop` is set or cancelled.

    Prints the URL and the one-time login token (to stderr, or through `announce`); `ready`
    is called with the running `ConsoleServer` (its `.url`, `.login_token`) once it listens.
    """
    await build_console_server(app_state, settings).serve(stop, announce, ready)


def start_console_task(
    app_state: HostState,
    settings: HostConsoleSettings,
    stop: asyncio.Event,
    announce: Announce | None = None,
) -> asyncio.Task[None]:
    """Serve the console beside a host: address checks and binding happen *now* (so a refused
    or taken address fails before the host starts), serving in a task that never raises (a
    console failure is logged and never stops the host). The task ends once `stop` is set.
    """
    server = build_console_server(app_state, settings)
    server.bind()

    async def run() -> None:
        try:
            await server.serve(stop, announce)
        except Exception:
            log.exception("the host console stopped")

    return asyncio.create_task(run(), name="host-console")
