"""Viewers watch, operators act: the one place the console refuses a viewer any change.

The gateway calls the cloud with its own operator certificate, so the cloud cannot tell a
viewer's click from an operator's: the console must refuse it itself. It does so in one
app-wide dependency (`refuse_viewer_changes`), not in each route: every request that may change
something (any method but GET, HEAD and OPTIONS) from a viewer's session or token is answered
403 with `VIEWER_REFUSAL` before its route runs, so a route added later is covered without
anyone remembering to. Logging in and out are the only posts a viewer makes like anyone.
The pages draw no control a viewer could not use (`read_only` in every page's context), and
the forms' own pages (`OperatorPage`) answer the same 403 to a viewer who follows a link to one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from console.gateway.auth import BearerRole, Credentials, Role
from webui.csrf import SAFE_METHODS
from webui.sessions import session_user

VIEWER_REFUSAL = (
    "this console login may only watch: submitting, cancelling and changing flows need an "
    "operator login (a viewer account or token cannot change anything)"
)
#: Posts a viewer makes like anyone (changing nothing on the cloud).
OPEN_POSTS = frozenset({"/login", "/logout"})


def session_role(request: Request) -> Role | None:
    """The role of the request's logged-in user (None: nobody is logged in)."""
    user = session_user(request)
    if user is None:
        return None
    credentials: Credentials = request.app.state.credentials
    return credentials.role_of(user)


def read_only(request: Request) -> bool:
    """Whether the page being drawn is a viewer's (its controls that change things left out)."""
    return session_role(request) == "viewer"


async def refuse_viewer_changes(request: Request, token: BearerRole) -> None:
    """App-wide dependency: a viewer's request that may change something is refused (403)."""
    if request.method in SAFE_METHODS or request.url.path in OPEN_POSTS:
        return
    role = token if token is not None else session_role(request)
    if role == "viewer":
        raise HTTPException(status.HTTP_403_FORBIDDEN, VIEWER_REFUSAL)


async def require_operator_page(request: Request) -> None:
    """Dependency of a form's page (submit, cancel): a viewer gets the refusal, not a form
    whose post would be refused."""
    if read_only(request):
        raise HTTPException(status.HTTP_403_FORBIDDEN, VIEWER_REFUSAL)


OperatorPage = Annotated[None, Depends(require_operator_page)]
VIEWERS_REFUSED = Depends(refuse_viewer_changes)
