"""Ending an RPC with a status and a message for the client."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc


async def abort(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, msg: str
) -> NoReturn:
    """Abort the RPC (typed as never returning)."""
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # pragma: no cover
