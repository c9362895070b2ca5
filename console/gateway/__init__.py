"""The cloud console: a thin FastAPI gateway (JSON API and pages) over the cloud's gRPC services.

The app is loaded on first use (`console.gateway.create_app`, …), so importing one of its
small modules (the JSON models the `amc` command also prints) does not load FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from console.gateway.app import build_server, create_app, run, serve

__all__ = ["build_server", "create_app", "run", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from console.gateway import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
