"""CSRF tokens: one per session, posted back by every form and sent as a header by API writes.

The token lives in the signed session cookie, so a page on another site can neither read it nor
forge the cookie; comparing in constant time keeps timing from leaking it byte by byte.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

SESSION_CSRF = "csrf"
#: The hidden form field every form posts the token in.
CSRF_FIELD = "csrf_token"
#: The header JSON API writes send the token in (session callers only).
CSRF_HEADER = "x-csrf-token"
#: Methods that change nothing, so they need no token.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def new_token() -> str:
    """A fresh unguessable token."""
    return secrets.token_urlsafe(32)


def csrf_token(request: Request) -> str:
    """The session's CSRF token, created on first use (also before login, for the login form)."""
    token = request.session.get(SESSION_CSRF)
    if not isinstance(token, str) or not token:
        token = new_token()
        request.session[SESSION_CSRF] = token
    return token


def csrf_matches(request: Request, sent: str | None) -> bool:
    """Whether `sent` is this session's token (False when either is missing)."""
    expected = request.session.get(SESSION_CSRF)
    if not isinstance(expected, str) or not expected or not sent:
        return False
    return hmac.compare_digest(sent.encode(), expected.encode())


async def require_csrf(request: Request) -> None:
    """Dependency of every form POST: 403 unless the form's csrf_token matches the session's."""
    form = await request.form()
    sent = form.get(CSRF_FIELD)
    if not csrf_matches(request, sent if isinstance(sent, str) else None):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "missing or invalid CSRF token")


#: Put first among a form route's parameters, so the token is checked before anything else
#: (a forged post is refused even when it also lacks a session).
CsrfChecked = Annotated[None, Depends(require_csrf)]
