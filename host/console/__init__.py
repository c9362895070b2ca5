"""The host's local console: live progress and the timeline of every task that ran here.

Its names load on first use (`host.console.create_app`, …), so `amc host run` without
`--console`, which needs only `HostConsoleSettings` (or nothing of it), does not load FastAPI,
uvicorn and the templates at every host start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from host.console.app import create_app
    from host.console.binding import RemoteBindRefused, check_bind_address
    from host.console.server import (
        ConsoleServer,
        build_console_server,
        serve_console,
        start_console_task,
    )
    from host.console.settings import HostConsoleSettings

#: Each public name and the module that holds it.
_HOMES = {
    "ConsoleServer": "server",
    "HostConsoleSettings": "settings",
    "RemoteBindRefused": "binding",
    "build_console_server": "server",
    "check_bind_address": "binding",
    "create_app": "app",
    "serve_console": "server",
    "start_console_task": "server",
}

__all__ = [
    "ConsoleServer",
    "HostConsoleSettings",
    "RemoteBindRefused",
    "build_console_server",
    "check_bind_address",
    "create_app",
    "serve_console",
    "start_console_task",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
