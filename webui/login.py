"""The login flow both consoles share: the form, a throttled attempt, where a person goes after
it, logging out.

How a person proves who they are is each console's (a password, a one-time token: `verify` in
`attempt`); the rest is here, so "next" is checked the same way everywhere, failed attempts are
throttled the same way (`webui.throttle`: 429 with Retry-After) and a login always starts a
fresh session.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from webui.csrf import CSRF_FIELD, SESSION_CSRF, csrf_matches, require_csrf
from webui.pages import Pages
from webui.redirects import safe_next
from webui.sessions import LoginRequired, log_in, log_out, session_user
from webui.throttle import LoginThrottle, attempt_keys, wait_message

LOGIN_PAGE = "login.html"


def login_form(
    pages: Pages,
    request: Request,
    next_path: str,
    home: str,
    *,
    error: str | None = None,
    status_code: int = 200,
    **fields: Any,
) -> Response:
    """The console's login page (`login.html`), coming back to `next_path` (if it is on this
    site, else `home`); `error` says why the last try failed, `fields` prefill the form."""
    context = {"next": safe_next(next_path, home), "error": error, **fields}
    return pages.render(request, LOGIN_PAGE, context, status_code=status_code)


def login_page(
    pages: Pages, request: Request, next_path: str, home: str, **fields: Any
) -> Response:
    """GET /login: the form, or straight on to `next_path` for someone already logged in."""
    if session_user(request):
        return RedirectResponse(safe_next(next_path, home), status_code=303)
    return login_form(pages, request, next_path, home, **fields)


def logged_in(request: Request, user: str, next_path: str, home: str) -> Response:
    """After a successful login: a fresh session for `user`, then on to `next_path`."""
    log_in(request, user)
    return RedirectResponse(safe_next(next_path, home), status_code=303)


async def attempt(
    pages: Pages,
    request: Request,
    *,
    user: str | None,
    verify: Callable[[], Awaitable[str | None]],
    next_path: str,
    home: str,
    error: str,
    **fields: Any,
) -> Response:
    """A login attempt: refused at once while throttled (429, Retry-After, the secret not even
    checked), else `verify()` names the user (None: wrong, 401 with `error`). It is awaited, so
    a slow check (a password hash) can run off the event loop; that is why an attempt counts
    as failed from the moment it is checked until it succeeds: counted only once its check
    had ended, every guess sent before the first answer passed the throttle."""
    throttle: LoginThrottle = request.app.state.login_throttle
    keys = attempt_keys(request, user)
    wait = throttle.retry_after(keys)
    if wait > 0:
        message, after = wait_message(wait)
        page = login_form(pages, request, next_path, home, error=message, status_code=429, **fields)
        page.headers["Retry-After"] = str(after)
        return page
    throttle.failed(keys)
    who = await verify()
    if who is None:
        return login_form(pages, request, next_path, home, error=error, status_code=401, **fields)
    throttle.succeeded(keys)
    return logged_in(request, who, next_path, home)


async def require_login_csrf(request: Request) -> None:
    """Dependency of a login form's post: its CSRF token, or the login page again.

    The token lives in the session, which another tab's login or logout (or the cookie's
    expiry) replaces while this form stays open; "invalid CSRF token" then told the person
    nothing they could act on. When the session holds no token, or already a user, the post
    logs nobody in and leads to the login page (which goes straight on for a logged-in
    person). A wrong token against the session's own is still refused (403)."""
    form = await request.form()
    sent = form.get(CSRF_FIELD)
    if csrf_matches(request, sent if isinstance(sent, str) else None):
        return
    if request.session.get(SESSION_CSRF) and session_user(request) is None:
        await require_csrf(request)  # raises its 403
    next_path = form.get("next")
    raise LoginRequired(next_path if isinstance(next_path, str) else "/")


#: Put first among a login route's parameters: the token is checked before the credentials.
LoginCsrfChecked = Annotated[None, Depends(require_login_csrf)]

#: POST /logout, the same on both consoles.
logout_router = APIRouter(include_in_schema=False)


@logout_router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session on the server: the cookie, even a copy of it, logs nobody in again.
    Without a live session (logged out in another tab, expired) there is nothing to end or
    forge, and the login page is where the person was going: no token is asked for. With
    one, a post without its token (a forged logout) is refused (403)."""
    if session_user(request) is not None:
        await require_csrf(request)
    log_out(request)
    return RedirectResponse("/login", status_code=303)
