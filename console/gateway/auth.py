"""Who may use the operators' console: the operator login and the API bearer token, and the
viewer login and token (read-only: `console.gateway.roles` refuses them every change).

Pages use the shared session and CSRF pieces (`webui`). The JSON API accepts either that session
(with the CSRF token in an `X-CSRF-Token` header for writes) or `Authorization: Bearer <token>`.
Secrets are only ever held as salted hashes and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import SecretStr

from webui.csrf import CSRF_HEADER, SAFE_METHODS, csrf_matches
from webui.sessions import session_alive, session_user
from webui.throttle import LoginThrottle, attempt_keys, wait_message


def _digest(secret: str, salt: bytes) -> bytes:
    """A slow salted hash (scrypt), so a leaked memory dump does not give the password away."""
    return hashlib.scrypt(secret.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)


#: What a console login or API token may do: everything, or only watch (`console.gateway.roles`).
Role = Literal["operator", "viewer"]


class Credentials:
    """The operator login and API token of one gateway, and its viewer login and token when
    it has them, held as salted hashes only."""

    def __init__(
        self,
        username: str,
        password: SecretStr,
        api_token: SecretStr | None,
        *,
        viewer: tuple[str, SecretStr] | None = None,
        viewer_token: SecretStr | None = None,
    ) -> None:
        self._salt = os.urandom(16)
        accounts: list[tuple[str, SecretStr, Role]] = [(username, password, "operator")]
        if viewer is not None:
            accounts.append((viewer[0], viewer[1], "viewer"))
        self._accounts = [
            (self._name(name), _digest(secret.get_secret_value(), self._salt), role)
            for name, secret, role in accounts
        ]
        self._tokens: list[tuple[bytes, Role]] = []
        if api_token is not None:
            self._tokens.append((self._token(api_token.get_secret_value()), "operator"))
        if viewer_token is not None:
            self._tokens.append((self._token(viewer_token.get_secret_value()), "viewer"))

    @staticmethod
    def _name(username: str) -> bytes:
        return hashlib.sha256(username.encode()).digest()

    def _token(self, token: str) -> bytes:
        return hashlib.sha256(self._salt + token.encode()).digest()

    def login_role(self, username: str, password: str) -> Role | None:
        """The role of the account these are the name and password of (None: no account).
        The password is hashed once and every account compared in full, so timing does not
        tell which part was wrong, nor which account a name is."""
        name = self._name(username)
        digest = _digest(password, self._salt)
        found: Role | None = None
        for account_name, account_password, role in self._accounts:
            name_ok = hmac.compare_digest(name, account_name)
            password_ok = hmac.compare_digest(digest, account_password)
            if name_ok and password_ok:
                found = role
        return found

    def check_login(self, username: str, password: str) -> bool:
        """Whether these are the name and password of an account (either role)."""
        return self.login_role(username, password) is not None

    def token_role(self, token: str) -> Role | None:
        """The role `token` gives (None: it is no token of this gateway)."""
        candidate = self._token(token)
        found: Role | None = None
        for known, role in self._tokens:
            if hmac.compare_digest(candidate, known):
                found = role
        return found

    def check_token(self, token: str) -> bool:
        """Whether `token` is a token of this gateway (either role)."""
        return self.token_role(token) is not None

    def role_of(self, user: str) -> Role:
        """The role of a logged-in user by name: the settings keep the viewer's name apart
        from the operator's, so a session needs to hold nothing more than the name."""
        name = self._name(user)
        viewer = any(
            hmac.compare_digest(name, known)
            for known, _, role in self._accounts
            if role == "viewer"
        )
        return "viewer" if viewer else "operator"


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


def _bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, as `_bearer` reads it. Read here
    and not through `_bearer`, so the app-wide role check (which runs on /healthz too) does
    not mark every route of the OpenAPI schema as taking the token."""
    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    return token if scheme.lower() == "bearer" and token else None


async def bearer_role(request: Request, credentials: OperatorCredentials) -> Role | None:
    """Dependency: the role the request's bearer token gives; None when it sent none, or is
    not a JSON API request (only the API takes a token; elsewhere the header is ignored).

    Wrong tokens are throttled per client address as wrong passwords are (`webui.throttle`):
    without it a script could try tokens as fast as the gateway answers. A throttled address
    is refused (429, Retry-After) without its token being checked; a valid one never counts.
    FastAPI runs a dependency once per request, so the app-wide role check and the API's
    login check share one look at the token (a wrong one counted once)."""
    bearer = _bearer_token(request)
    if bearer is None or not request.url.path.startswith("/api"):
        return None
    throttle: LoginThrottle = request.app.state.login_throttle
    keys = attempt_keys(request, None, "token")
    wait = throttle.retry_after(keys)
    if wait > 0:
        message, after = wait_message(wait)
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS, message, headers={"Retry-After": str(after)}
        )
    role = credentials.token_role(bearer.strip())
    if role is not None:
        throttle.succeeded(keys)
        return role
    throttle.failed(keys)
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        "invalid bearer token",
        headers={"WWW-Authenticate": "Bearer"},
    )


BearerRole = Annotated[Role | None, Depends(bearer_role)]


async def require_api_user(
    request: Request,
    token: BearerRole,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """Dependency of the JSON API: a bearer token (`bearer_role`; `_bearer` puts the scheme in
    the API's OpenAPI schema), or a session (plus CSRF header for writes)."""
    if token is not None:
        return API_TOKEN_USER if token == "operator" else VIEWER_TOKEN_USER
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
#: Who it says called with the viewer's token.
VIEWER_TOKEN_USER = "viewer-api-token"
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
