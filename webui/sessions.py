"""Who is logged in: a signed session cookie naming a session this console process holds.

How a person proves who they are differs per console (the operators' password, a host's one-time
token); what happens after is the same and lives here: a fresh session on login (so a session
made before login cannot be fixated), pages that redirect to /login without one.

The cookie (Starlette's SessionMiddleware, signed) carries only a random session id; who that is,
and whether the session still exists, is kept here on the server (`SessionStore`). Logging out
deletes it, so a copy of the cookie taken before (a shared machine, a proxy log, a stolen
backup) is refused afterwards, not honoured until it expires. Sessions live in the console's
memory: a restart logs everyone out, and several console processes behind one address need
sticky sessions.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Literal
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, Request
from starlette.middleware.sessions import SessionMiddleware

from webui.csrf import SESSION_CSRF, new_token, require_csrf
from webui.drafts import SESSION_DRAFT, DraftStore, keep_posted_form

SESSION_ID = "sid"
#: Sessions a console keeps at most; beyond it the least recently used one ends.
MAX_SESSIONS = 10_000


class SessionStore:
    """The live sessions of one console process: id -> (user, when it ends)."""

    def __init__(
        self,
        max_age_s: float,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_age_s = max_age_s
        self._max = max_sessions
        self._clock = clock
        self._live: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def start(self, user: str) -> str:
        """A new session for `user`; returns its id (what the cookie carries)."""
        now = self._clock()
        for sid in [s for s, (_, ends) in self._live.items() if ends <= now]:
            del self._live[sid]
        while len(self._live) >= self._max:
            self._live.popitem(last=False)
        sid = secrets.token_urlsafe(32)
        self._live[sid] = (user, now + self._max_age_s)
        return sid

    def user(self, sid: str) -> str | None:
        """Who session `sid` belongs to, or None when it ended (logged out, expired, unknown)."""
        found = self._live.get(sid)
        if found is None:
            return None
        user, ends = found
        if ends <= self._clock():
            del self._live[sid]
            return None
        self._live.move_to_end(sid)
        return user

    def end(self, sid: str) -> None:
        """End session `sid` (a logout): its cookie no longer logs anyone in."""
        self._live.pop(sid, None)

    def __len__(self) -> int:
        return len(self._live)


def install_sessions(
    app: FastAPI,
    *,
    secret: str,
    cookie: str,
    max_age_s: int,
    same_site: Literal["lax", "strict", "none"],
    https_only: bool,
) -> SessionStore:
    """Signed session cookies plus the server-side store (`app.state.sessions`) on `app`."""
    app.add_middleware(
        SessionMiddleware,
        secret_key=secret,
        session_cookie=cookie,
        max_age=max_age_s,
        same_site=same_site,
        https_only=https_only,
    )
    store = SessionStore(max_age_s)
    app.state.sessions = store
    app.state.drafts = DraftStore()
    return store


def _store(request: Request) -> SessionStore:
    store: SessionStore = request.app.state.sessions
    return store


def session_user(request: Request) -> str | None:
    """The logged-in user's name, or None (no cookie, or its session ended)."""
    sid = request.session.get(SESSION_ID)
    return _store(request).user(sid) if isinstance(sid, str) and sid else None


def session_alive(request: Request) -> Callable[[], bool]:
    """Asks, whenever called later, whether the request's session still exists: for answers
    that outlive their request (a live stream), so logging out or expiry ends them too."""
    sid = request.session.get(SESSION_ID)
    store = _store(request)
    return lambda: isinstance(sid, str) and bool(sid) and store.user(sid) is not None


def log_in(request: Request, username: str) -> None:
    """Start a fresh session (new id, new CSRF token) so a pre-login session cannot be fixated.
    Only the id of a form posted while logged out is kept (`webui.drafts`): its page fills
    itself in from it once, for the person to check and submit."""
    draft = request.session.get(SESSION_DRAFT)
    request.session.clear()
    if isinstance(draft, str):
        request.session[SESSION_DRAFT] = draft
    request.session[SESSION_ID] = _store(request).start(username)
    request.session[SESSION_CSRF] = new_token()


def log_out(request: Request) -> None:
    """End the session on the server and clear the cookie."""
    sid = request.session.get(SESSION_ID)
    if isinstance(sid, str):
        _store(request).end(sid)
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


def _posted_from(request: Request) -> str:
    """The page a form was posted from (its Referer, when on this site), else the home page."""
    referer = urlsplit(request.headers.get("referer", ""))
    if referer.netloc != request.url.netloc or not referer.path.startswith("/"):
        return "/"
    return referer.path + (f"?{referer.query}" if referer.query else "")


async def require_form_user(request: Request) -> str:
    """Dependency of every form a logged-in person posts: the user, once the form's CSRF
    token matched. A post without a session (logged out in another tab, a console restart)
    leads to /login and back to the page it came from, without doing anything: the token
    went with the session, and "invalid CSRF token" told the person nothing they could act
    on. What the form carried is kept for its page after the login (`webui.drafts`). A post
    with a session and a wrong token is still refused (403)."""
    user = session_user(request)
    if user is None:
        await keep_posted_form(request)
        raise LoginRequired(_posted_from(request))
    await require_csrf(request)
    return user


FormUser = Annotated[str, Depends(require_form_user)]
