"""The cloud console: a thin FastAPI gateway (JSON API and pages) over the cloud's gRPC services."""

from console.gateway.app import build_server, create_app, run, serve

__all__ = ["build_server", "create_app", "run", "serve"]
