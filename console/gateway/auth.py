"""Who may use the operators' console: the operator login and the API bearer token.

Pages use the shared session and CSRF pieces (`webui`). The JSON API accepts either that session
(with the CSRF token in an `X-CSRF-Token` header for writes) or `Authorization: Bearer <token>`.
Secrets are only ever held as salted hashes and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from webui.csrf import CSRF_HEADER, SAFE_METHODS, csrf_matches
from webui.sessions import session_alive, session_user
from webui.throttle import LoginThrottle, attempt_keys, wait_message


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


def credentials_of(request: Request) -> Credentials:
    """The gateway's credentials (set on the app by `create_app`)."""
    creds: Credentials = request.app.state.credentials
    return creds


OperatorCredentials = Annotated[Credentials, Depends(credentials_of)]

#: Documents the bearer scheme in the OpenAPI schema; the check itself is below.
_bearer = HTTPBearer(
    auto_error=False,
    description="AMC_CONSOLE_API_TOKEN; browsers use the session cookie instead",
)


async def require_api_user(
    request: Request,
    credentials: OperatorCredentials,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """Dependency of the JSON API: a bearer token, or a session (plus CSRF header for writes).

    Wrong tokens are throttled per client address as wrong passwords are (`webui.throttle`):
    without it a script could try tokens as fast as the gateway answers. A throttled address
    is refused (429, Retry-After) without its token being checked; a valid one never counts."""
    if bearer is not None:
        throttle: LoginThrottle = request.app.state.login_throttle
        keys = attempt_keys(request, None, "token")
        wait = throttle.retry_after(keys)
        if wait > 0:
            message, after = wait_message(wait)
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS, message, headers={"Retry-After": str(after)}
            )
        if credentials.check_token(bearer.credentials.strip()):
            throttle.succeeded(keys)
            return API_TOKEN_USER
        throttle.failed(keys)
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
    if request.method not in SAFE_METHODS and not csrf_matches(
        request, request.headers.get(CSRF_HEADER)
    ):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "missing or invalid X-CSRF-Token header")
    return user


#: Who `require_api_user` says called with the bearer token (it names no person).
API_TOKEN_USER = "api-token"
ApiUser = Annotated[str, Depends(require_api_user)]


def _always() -> bool:
    return True


async def still_allowed(
    request: Request,
    _user: Annotated[str, Depends(require_api_user)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Callable[[], bool]:
    """Dependency of the live streams: asks later whether the caller may still see them. A
    valid bearer token stays valid for the gateway's life; a session can end (logout, expiry)
    while its stream is open, and the stream must end with it."""
    return _always if bearer is not None else session_alive(request)


StreamAllowed = Annotated[Callable[[], bool], Depends(still_allowed)]
