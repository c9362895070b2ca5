"""The Host-header guard of both consoles, against DNS rebinding.

A web page can re-point its own domain at 127.0.0.1 (or at a console's address on the office
network) after the visitor's browser loaded it; its scripts then talk to the console as if
they were the same site, from inside the network, through the visitor's browser. The one
thing such a request cannot hide is the name it was sent to: its Host header carries the page's
domain. So a console answers only to the names it is known by (loopback, its bind address and
the names an operator lists) and refuses any other before anything else runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse

if TYPE_CHECKING:
    # Only named in annotations: the host's settings read `host_list` at every `amc host run`,
    # console or not, and loading FastAPI for them cost a host start a quarter of its imports.
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Receive, Scope, Send

#: The names a console on this machine is reached by without any setting.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
#: In a list of allowed hosts: answer to any Host header (an explicit opt-out of the guard).
ANY_HOST = "*"


def host_of(header: str) -> str:
    """The name in a Host header without its port (`[::1]:8765` → `::1`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_list(value: object) -> object:
    """An allowed-hosts setting as a list: a comma-separated string from the environment
    (`a.example,b.example`), a JSON list (as pydantic-settings reads a list by default, so a
    value set that way keeps working), or a list already. Anything else is left to the
    field's own validation to refuse."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json.loads(text)
    return [name.strip() for name in text.split(",") if name.strip()]


def allowed_host_names(
    bind_host: str, extra: Iterable[str], *, any_when_unlisted: bool = False
) -> frozenset[str] | None:
    """The Host names a console answers to; None means any.

    Loopback names, the bind address and the names in `extra`; `*` in `extra` opts out of the
    guard. `any_when_unlisted`: with no names listed, answer to any (the host console with
    `allow_remote`, which predates this guard's setting)."""
    names = {host_of(h) for h in extra if h.strip()}
    if ANY_HOST in names or (any_when_unlisted and not names):
        return None
    return LOOPBACK_NAMES | names | {host_of(bind_host)}


def install_host_guard(
    app: FastAPI,
    hosts: frozenset[str] | None,
    *,
    setting: str,
    exempt: frozenset[str] = frozenset(),
) -> None:
    """Refuse (400) a request whose Host header names none of `hosts` (None: guard nothing).

    Install it last so it is the outermost middleware: a refused request reaches no session,
    throttle or route. `setting` is the environment variable that lists the names, said in
    the refusal so whoever reaches the console by a new name knows what to set. `exempt`:
    paths answered whatever the Host (health probes: a load balancer's carries the address
    it dialled, and they show nothing a rebinding page could use)."""
    if hosts is not None:
        app.add_middleware(_KnownHostOnly, hosts=hosts, setting=setting, exempt=exempt)


class _KnownHostOnly:
    """Plain ASGI, not `@app.middleware("http")`, for the reason `webui.headers` gives: a
    streamed answer (a screenshot, live updates) passes through untouched."""

    def __init__(
        self, app: ASGIApp, hosts: frozenset[str], setting: str, exempt: frozenset[str]
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.exempt = exempt
        self.refusal = (
            "unknown Host header: this console answers only to its loopback names, its bind "
            f"address and the names in {setting} (comma-separated; * for any)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        name = host_of(Headers(scope=scope).get("host", ""))
        if name in self.hosts:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "unknown Host"})
        else:
            await PlainTextResponse(self.refusal, status_code=400)(scope, receive, send)
