"""Security headers on every answer of a console: no sniffing, no framing, nothing foreign,
nothing kept.

Both consoles serve everything themselves (one stylesheet, one script, no inline code), so the
policy allows only 'self'; pages get the framing and script policy, a JSON API (`is_api`) only
what applies to data. What a console answers is an operator's view of the fleet (goals, results,
what the model said), so no cache (the browser's disk, a proxy) keeps it unless the route says
otherwise (a screenshot's `private` caching); only the static assets are cacheable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response

#: Where both consoles mount their static assets (`webui.pages.static_files`).
STATIC_PREFIX = "/static/"


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
) -> None:
    """Add the headers to every response of `app` (a response's own values win)."""

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", referrer_policy)
        if not request.url.path.startswith(STATIC_PREFIX):
            response.headers.setdefault("Cache-Control", "no-store")
        if is_api is None or not is_api(request):
            response.headers.setdefault("X-Frame-Options", "DENY")
            response.headers.setdefault("Content-Security-Policy", csp)
        return response
