"""Ending an RPC with a status and a message for the client."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from planner.errors import MAX_STATUS_DETAILS
from planner.observation import clip


async def abort(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, msg: str
) -> NoReturn:
    """Abort the RPC (typed as never returning), its message cut to MAX_STATUS_DETAILS: many
    echo what the client sent, of any length."""
    await context.abort(code, clip(msg, MAX_STATUS_DETAILS))
    raise AssertionError("unreachable")  # pragma: no cover
