"""Ending an RPC with a status and a message for the client."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import grpc

from cloud.lease.validate import MAX_ID
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


async def check_ids(
    context: grpc.aio.ServicerContext[Any, Any], field: str, ids: Sequence[str], most: int
) -> None:
    """Refuse (INVALID_ARGUMENT, naming the field and the limit) a repeated id field of more
    than `most` ids or with an id empty or over `MAX_ID` characters: a list request's id
    filter is a query the store runs as it is."""
    if len(ids) > most:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}: at most {most} ids")
    for i, one in enumerate(ids):
        if not 1 <= len(one) <= MAX_ID:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}[{i}]: 1 to {MAX_ID} characters"
            )
