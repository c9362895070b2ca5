"""Ending an RPC with a status and a message for the client."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from planner.errors import MAX_STATUS_DETAILS
from planner.observation import clip
from telemetry.redaction import scrub


async def abort(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, msg: str
) -> NoReturn:
    """Abort the RPC (typed as never returning), its message cut to MAX_STATUS_DETAILS (many
    echo what the client sent, of any length) and scrubbed as a log line is
    (`telemetry.redaction`): some quote a library's error, and S3's quotes its endpoint URL,
    credentials and all."""
    await context.abort(code, clip(scrub(msg), MAX_STATUS_DETAILS))
    raise AssertionError("unreachable")  # pragma: no cover
