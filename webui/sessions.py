"""Who is logged in: a signed session cookie (Starlette's SessionMiddleware) holding the user.

How a person proves who they are differs per console (the operators' password, a host's one-time
token); what happens after is the same and lives here: a fresh session on login (so a session
made before login cannot be fixated), pages that redirect to /login without one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from webui.csrf import SESSION_CSRF, new_token

SESSION_USER = "user"


def session_user(request: Request) -> str | None:
    """The logged-in user's name, or None."""
    user = request.session.get(SESSION_USER)
    return user if isinstance(user, str) and user else None


def log_in(request: Request, username: str) -> None:
    """Start a fresh session (new CSRF token) so a pre-login session cannot be fixated."""
    request.session.clear()
    request.session[SESSION_USER] = username
    request.session[SESSION_CSRF] = new_token()


def log_out(request: Request) -> None:
    """End the session."""
    request.session.clear()


class LoginRequired(Exception):
    """A page was asked for without a session; the app answers with a redirect to /login."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


async def require_page_user(request: Request) -> str:
    """Dependency of every page but /login: the logged-in user, or a redirect to /login."""
    user = session_user(request)
    if user is None:
        target = request.url.path
        if request.url.query:
            target += "?" + request.url.query
        raise LoginRequired(target)
    return user


PageUser = Annotated[str, Depends(require_page_user)]
