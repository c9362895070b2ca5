"""The edge every RPC crosses after authorization: malformed requests refused, failures mapped.

One interceptor for every servicer (the style of httpx's `map_exceptions`: one mapper per
boundary, not one per caller):

- Requests are parsed by `cloud.wire.parser`: bytes that do not parse, invalid UTF-8 and NUL
  characters in text fields are answered INVALID_ARGUMENT naming the field before any servicer
  runs (for streamed requests: the servicer's request iterator ends the call the same way; the
  Lease stream reads `wire.Malformed` items itself and answers them in-stream; ShipDecisions,
  which refuses records alone, gets a request whose only problem is a NUL: `PER_RECORD`).
- An exception a servicer lets escape becomes a status through `status_for`: the database
  cannot be reached → UNAVAILABLE "the cloud's database is unavailable; retry", with trailing
  metadata `amc-waiting-for: the cloud's database` (and the
  database probe is woken, so health turns NOT_SERVING at once); any other failure → INTERNAL
  "internal error; retry later" — never gRPC's UNKNOWN with Python's text, never driver text,
  SQL, parameters, host or port (a generated servicer's unimplemented method, which raises
  NotImplementedError, stays UNIMPLEMENTED). What happened is logged once, scrubbed
  (`errors.report`). A row another transaction held past a bounded wait (`RowHeld`: a host's
  row locked in an open psql session) → UNAVAILABLE with its own message, which names the row:
  the database answers, so no `amc-waiting-for` and no probe.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc

from cloud import wire
from cloud.handlers import Behavior, Context, guard, rewrap
from cloud.store import errors
from cloud.store.lock_waits import RowHeld
from planner.errors import CLOUD_DATABASE, WAITING_FOR_KEY

log = logging.getLogger(__name__)

INTERNAL_MESSAGE: Final = "internal error; retry later (the cloud logged it)"


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status (code, details) a client gets for a failure of the cloud's own."""
    if isinstance(exc, RowHeld):  # the database answers; one row is held elsewhere
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if errors.unavailable(exc):
        return grpc.StatusCode.UNAVAILABLE, errors.UNAVAILABLE_MESSAGE
    if isinstance(exc, NotImplementedError):  # a generated servicer's unimplemented method
        return grpc.StatusCode.UNIMPLEMENTED, "method not implemented"
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


#: Methods whose records are refused alone (the contract: a record's own problem refuses only
#: it): a request that only holds a NUL reaches the servicer as its `wire.Malformed`, which
#: checks each record's text. Refused whole here, a NUL in one record lost every other one.
PER_RECORD: Final = frozenset({"/amc.v1.DecisionLogService/ShipDecisions"})


async def refuse_malformed(request: Any, context: Context) -> None:
    """INVALID_ARGUMENT for a request `wire.parser` could not use."""
    if isinstance(request, wire.Malformed):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.problem)


async def refuse_unparsed(request: Any, context: Context) -> None:
    """`refuse_malformed` for a `PER_RECORD` method: one whose only problem is a NUL in its
    text, or whose bytes twin parsed (`wire.bytes_twin`: text that is not UTF-8, which the
    servicer reads record by record), goes on to the servicer."""
    if isinstance(request, wire.Malformed) and not request.text_only and request.partial is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.problem)


async def _checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
    async for request in requests:
        await refuse_malformed(request, context)
        yield request


def _checked_requests(behavior: Behavior) -> Behavior:
    """A request-streaming behavior whose request iterator ends the call on a malformed
    message (a servicer that reads with `context.read()` sees `wire.Malformed` itself)."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(requests: AsyncIterator[Any], context: Context) -> Any:
            responses = behavior(_checked(requests, context), context)
            async with contextlib.aclosing(responses):
                async for response in responses:
                    yield response

        return stream

    async def call(requests: AsyncIterator[Any], context: Context) -> Any:
        return await behavior(_checked(requests, context), context)

    return call


class Boundary(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Parses every request with `wire.parser` and maps every failure with `status_for`."""

    def __init__(self, on_unavailable: Callable[[], None] | None = None) -> None:
        #: Called when a call failed because the database is unreachable (wakes the probe).
        self._on_unavailable = on_unavailable

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        recover = self._recover(method)
        deserialize = handler.request_deserializer
        if handler.request_streaming:

            def wrap(behavior: Behavior) -> Behavior:
                return guard(_checked_requests(behavior), recover=recover)
        else:
            before = refuse_unparsed if method in PER_RECORD else refuse_malformed

            def wrap(behavior: Behavior) -> Behavior:
                return guard(behavior, before=before, recover=recover)

        return rewrap(
            handler,
            wrap,
            request_deserializer=wire.parser(deserialize) if deserialize is not None else None,
        )

    def _recover(self, method: str) -> Callable[[Exception, Context], Awaitable[None]]:
        async def recover(exc: Exception, context: Context) -> None:
            if isinstance(exc, RowHeld):  # said in full, no traceback: nothing failed here
                log.warning("%s refused: %s", method, exc)
            elif not isinstance(exc, NotImplementedError):
                errors.report(log, "%s failed", exc, method)
            if errors.unavailable(exc) and self._on_unavailable is not None:
                self._on_unavailable()
            code, message = status_for(exc)
            # Says which part is away, so a client tells this answer from a cloud it could not
            # reach (both are UNAVAILABLE): `amc` sent operators to look for another cloud.
            waiting = ((WAITING_FOR_KEY, CLOUD_DATABASE),) if errors.unavailable(exc) else ()
            await context.abort(code, message, waiting)

        return recover
