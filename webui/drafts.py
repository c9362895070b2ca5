"""Forms posted after their session ended, kept on the server for the login they lead to.

A form posted without a live session (it expired, another tab logged out, the console
restarted) leads to /login and back, doing nothing: the CSRF token went with the session. What
was typed into it went too, and a goal of several lines had to be typed again. Now the posted
fields wait here, in the console's memory (bounded, a few minutes, taken once), named by a
random id in the signed session cookie, which a login keeps (`webui.sessions.log_in`). The
form's page fills itself in from them and says nothing was submitted: the operator checks it
and submits it, rather than a post replayed behind their back after a login that may come much
later, to a fleet that may have changed. Nothing typed is put in a URL or the cookie (a goal
may hold a credential), and only a post from the console's own pages is kept, so another site
cannot prefill an operator's form by posting to it.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

from fastapi import Request

from webui.csrf import CSRF_FIELD

#: Session key of the id of this browser's kept form.
SESSION_DRAFT = "draft"
#: How long a kept form waits for its login.
MAX_AGE_S = 15 * 60
#: Forms kept at most (anyone can post one); beyond it the oldest is forgotten.
MAX_DRAFTS = 200
#: Characters of one form kept at most; a longer one is not kept (a goal is at most 2,000).
MAX_CHARS = 16_384


class DraftStore:
    """Kept forms of one console process: id -> (path posted to, fields, when it is forgotten)."""

    def __init__(
        self,
        max_age_s: float = MAX_AGE_S,
        max_drafts: int = MAX_DRAFTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_age_s = max_age_s
        self._max = max_drafts
        self._clock = clock
        self._kept: OrderedDict[str, tuple[str, dict[str, str], float]] = OrderedDict()

    def keep(self, path: str, fields: dict[str, str]) -> str:
        """Keep `fields` posted to `path`; returns the id to take them back with."""
        now = self._clock()
        for gone in [k for k, (_, _, ends) in self._kept.items() if ends <= now]:
            del self._kept[gone]
        while len(self._kept) >= self._max:
            self._kept.popitem(last=False)
        draft_id = secrets.token_urlsafe(24)
        self._kept[draft_id] = (path, dict(fields), now + self._max_age_s)
        return draft_id

    def take(self, draft_id: str, path: str) -> dict[str, str] | None:
        """The fields kept under `draft_id` for a post to `path`, once; None when there are
        none (taken, forgotten, or kept for another form)."""
        found = self._kept.get(draft_id)
        if found is None or found[0] != path:
            return None
        del self._kept[draft_id]
        return found[1] if found[2] > self._clock() else None

    def __len__(self) -> int:
        return len(self._kept)


def _store(request: Request) -> DraftStore:
    store: DraftStore = request.app.state.drafts
    return store


def same_origin(request: Request) -> bool:
    """Whether a post comes from this console's own pages (its Origin, else its Referer)."""
    source = request.headers.get("origin") or request.headers.get("referer", "")
    return bool(source) and urlsplit(source).netloc == request.url.netloc


async def keep_posted_form(request: Request) -> None:
    """Keep what a post without a session carried, for the form's page after the login."""
    if not same_origin(request):
        return
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str) and k != CSRF_FIELD}
    if not fields or sum(len(k) + len(v) for k, v in fields.items()) > MAX_CHARS:
        return
    request.session[SESSION_DRAFT] = _store(request).keep(request.url.path, fields)


def take_posted_form(request: Request, path: str) -> dict[str, str] | None:
    """The fields this browser posted to `path` when its session had ended, once."""
    draft_id = request.session.get(SESSION_DRAFT)
    if not isinstance(draft_id, str):
        return None
    fields = _store(request).take(draft_id, path)
    if fields is not None:
        del request.session[SESSION_DRAFT]
    return fields
