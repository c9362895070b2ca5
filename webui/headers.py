"""Security headers on every answer of a console: no sniffing, no framing, nothing foreign,
nothing kept.

Both consoles serve everything themselves (one stylesheet, one script, no inline code), so the
policy allows only 'self'; pages get the framing and script policy, a JSON API (`is_api`) only
what applies to data. What a console answers is an operator's view of the fleet (goals, results,
what the model said), so no cache (the browser's disk, a proxy) keeps it; only the static
assets are cacheable.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Where both consoles mount their static assets (`webui.pages.static_files`).
STATIC_PREFIX = "/static/"
#: What a console that serves HTTPS itself tells browsers (a year; no subdomains: the console's
#: name may be shared with other services it cannot speak for).
HSTS = "max-age=31536000"
#: How both consoles serve a step's screenshot (a phone's screen: what the page around it shows
#: and more). It was `private, max-age=3600`: for an hour after logging out, the browser showed
#: the screenshots again from its cache to whoever used it next, no login asked. Kept by no
#: cache, each view asks the console, which asks for the session.
SCREENSHOT_CACHE = "no-store"


def content_security_policy(img_src: str = "'self'") -> str:
    """Nothing from elsewhere, no inline script or style; `img_src` may add e.g. `data:`."""
    return (
        f"default-src 'self'; img-src {img_src}; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    )


def add_security_headers(
    app: FastAPI,
    *,
    csp: str,
    referrer_policy: str,
    is_api: Callable[[Request], bool] | None = None,
    serves_tls: bool = False,
) -> None:
    """Add the headers to every response of `app` (a response's own values win).

    `serves_tls`: the console terminates HTTPS itself, so every answer also says
    Strict-Transport-Security. Without it a browser that once typed the address without
    `https://` (or followed a plain link) sent the login form's password over plain HTTP to
    whoever sat in between, who could also keep it from ever reaching the HTTPS console."""

    def headers_for(request: Request) -> dict[str, str]:
        headers = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": referrer_policy}
        if serves_tls:
            headers["Strict-Transport-Security"] = HSTS
        if not request.url.path.startswith(STATIC_PREFIX):
            headers["Cache-Control"] = "no-store"
        if is_api is None or not is_api(request):
            headers["X-Frame-Options"] = "DENY"
            headers["Content-Security-Policy"] = csp
        return headers

    app.add_middleware(_SecurityHeaders, headers_for=headers_for)


class _SecurityHeaders:
    """Adds the headers as an answer starts, and changes nothing else.

    Plain ASGI, not `@app.middleware("http")`: Starlette's BaseHTTPMiddleware ended a streamed
    answer that failed midway as if it were complete (the last chunk sent, the error raised
    after it), so a client took the part it got for the whole answer. Here the error reaches
    the server while the answer is open, and it closes the connection short of the end."""

    def __init__(self, app: ASGIApp, headers_for: Callable[[Request], dict[str, str]]) -> None:
        self.app = app
        self.headers_for = headers_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self.headers_for(Request(scope))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in extra.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)
