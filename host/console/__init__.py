"""The host's local console: live progress and the timeline of every task that ran here."""

from host.console.app import create_app
from host.console.binding import RemoteBindRefused, check_bind_address
from host.console.server import (
    ConsoleServer,
    build_console_server,
    serve_console,
    start_console_task,
)
from host.console.settings import HostConsoleSettings

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
