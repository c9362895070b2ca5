"""Who may use the console: operator login, session, CSRF tokens and the API bearer token.

Pages use a signed session cookie (Starlette's SessionMiddleware: httponly, SameSite=Lax) and a
per-session CSRF token that every form posts back. The JSON API accepts either that session (with
the CSRF token in an `X-CSRF-Token` header for writes) or `Authorization: Bearer <token>`.
Secrets are only ever held as salted hashes and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

SESSION_USER = "user"
SESSION_CSRF = "csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _digest(secret: str, salt: bytes) -> bytes:
    """A slow salted hash (scrypt), so a leaked memory dump does not give the password away."""
    return hashlib.scrypt(secret.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)


class Credentials:
    """The operator login and API token of one gateway, held as salted hashes only."""

    def __init__(self, username: str, password: SecretStr, api_token: SecretStr | None) -> None:
        self._salt = os.urandom(16)
        self._username = hashlib.sha256(username.encode()).digest()
        self._password = _digest(password.get_secret_value(), self._salt)
        self._token = (
            None
            if api_token is None
            else hashlib.sha256(self._salt + api_token.get_secret_value().encode()).digest()
        )

    def check_login(self, username: str, password: str) -> bool:
        """Both parts are always hashed and compared, so timing does not tell which was wrong."""
        name_ok = hmac.compare_digest(hashlib.sha256(username.encode()).digest(), self._username)
        password_ok = hmac.compare_digest(_digest(password, self._salt), self._password)
        return name_ok and password_ok

    def check_token(self, token: str) -> bool:
        if self._token is None:
            return False
        candidate = hashlib.sha256(self._salt + token.encode()).digest()
        return hmac.compare_digest(candidate, self._token)


def csrf_token(request: Request) -> str:
    """The session's CSRF token, created on first use (also before login, for the login form)."""
    token = request.session.get(SESSION_CSRF)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        request.session[SESSION_CSRF] = token
    return token


def _csrf_matches(request: Request, sent: str | None) -> bool:
    expected = request.session.get(SESSION_CSRF)
    if not isinstance(expected, str) or not expected or not sent:
        return False
    return hmac.compare_digest(sent.encode(), expected.encode())


def session_user(request: Request) -> str | None:
    user = request.session.get(SESSION_USER)
    return user if isinstance(user, str) and user else None


def log_in(request: Request, username: str) -> None:
    """Start a fresh session (new CSRF token) so a pre-login session cannot be fixated."""
    request.session.clear()
    request.session[SESSION_USER] = username
    request.session[SESSION_CSRF] = secrets.token_urlsafe(32)


def log_out(request: Request) -> None:
    request.session.clear()


class LoginRequired(Exception):
    """A page was asked for without a session; the app answers with a redirect to /login."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


async def require_page_user(request: Request) -> str:
    """Dependency of every page but /login: the logged-in operator, or a redirect."""
    user = session_user(request)
    if user is None:
        target = request.url.path
        if request.url.query:
            target += "?" + request.url.query
        raise LoginRequired(target)
    return user


async def require_csrf(request: Request) -> None:
    """Dependency of every form POST: 403 unless the form's csrf_token matches the session's."""
    form = await request.form()
    sent = form.get(CSRF_FIELD)
    if not _csrf_matches(request, sent if isinstance(sent, str) else None):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "missing or invalid CSRF token")


def _credentials(request: Request) -> Credentials:
    creds: Credentials = request.app.state.credentials
    return creds


#: Documents the bearer scheme in the OpenAPI schema; the check itself is below.
_bearer = HTTPBearer(
    auto_error=False,
    description="AMC_CONSOLE_API_TOKEN; browsers use the session cookie instead",
)


async def require_api_user(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """Dependency of the JSON API: a bearer token, or a session (plus CSRF header for writes)."""
    if bearer is not None:
        if _credentials(request).check_token(bearer.credentials.strip()):
            return "api-token"
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    user = session_user(request)
    if user is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "log in or send Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if request.method not in SAFE_METHODS and not _csrf_matches(
        request, request.headers.get(CSRF_HEADER)
    ):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "missing or invalid X-CSRF-Token header")
    return user


PageUser = Annotated[str, Depends(require_page_user)]
ApiUser = Annotated[str, Depends(require_api_user)]
CsrfChecked = Depends(require_csrf)
