"""Templates and static files of a console: its own first, then the shared ones from here.

A console's `base.html` extends `webui/layout.html` (page skeleton, header, logout form), its
login page extends `webui/login.html`, and errors render `webui/error.html` inside its base;
`webui.css` holds the look both consoles share. Every page gets the logged-in user and the CSRF
token its forms post back, and every template the filters both consoles write with (`grouped`:
a count with thousands separators).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from webui.counts import grouped
from webui.csrf import csrf_token
from webui.sessions import session_user

SHARED_TEMPLATES = Path(__file__).parent / "templates"

ConsoleContext = Callable[[Request], dict[str, Any]]
"""What one console adds to every page (its home link, how often it polls)."""


def page_context(request: Request) -> dict[str, Any]:
    """What every page needs: who is logged in and the CSRF token its forms post back."""
    return {"user": session_user(request), "csrf_token": csrf_token(request)}


class Pages:
    """One console's templates (its own folder, then the shared one) and how it renders them."""

    def __init__(self, own: Path, context: ConsoleContext | None = None) -> None:
        self.templates = Jinja2Templates(directory=[own, SHARED_TEMPLATES])
        self.templates.env.filters["grouped"] = grouped
        self._context = context

    @property
    def env(self) -> jinja2.Environment:
        """The Jinja environment (for a console's own filters and fragments)."""
        return self.templates.env

    def render(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> HTMLResponse:
        """Render `name` with the shared and the console's page context under `context`."""
        base = page_context(request)
        if self._context is not None:
            base |= self._context(request)
        return self.templates.TemplateResponse(
            request, name, base | context, status_code=status_code
        )


def static_files(own: Path) -> StaticFiles:
    """A console's static folder, with the shared assets (`webui.css`) served beside its own."""
    return StaticFiles(directory=own, packages=[("webui", "static")])
