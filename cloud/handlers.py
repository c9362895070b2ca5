"""Wrapping a grpc.aio method handler: code before its behavior, code around its failures.

The cloud's interceptors (`cloud.authz`, `cloud.boundary`) each need the same thing: the
handler gRPC routed the call to, with something run first (a check that may abort) and, for the
boundary, exceptions turned into a status. gRPC hands interceptors a `RpcMethodHandler` of one
of four shapes (unary or streaming requests and responses) whose behavior is a coroutine or an
async generator; `rewrap` keeps shape, kind and serializers, so a wrapped method looks to gRPC
exactly like the original.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc

Behavior: TypeAlias = Callable[..., Any]
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
#: Run before the behavior with (request, context); it may abort the call.
Before = Callable[[Any, Context], Awaitable[None]]
#: Given an exception the behavior raised (never an abort or a cancellation): abort the call
#: with a status, or re-raise.
Recover = Callable[[Exception, Context], Awaitable[None]]


def passes_through(exc: BaseException) -> bool:
    """Exceptions that are gRPC's own control flow (an abort already on its way, a misuse)."""
    return isinstance(exc, grpc.aio.BaseError)


def guard(
    behavior: Behavior, *, before: Before | None = None, recover: Recover | None = None
) -> Behavior:
    """`behavior` with `before` awaited first and its failures handed to `recover`."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Context) -> Any:
            if before is not None:
                await before(request, context)
            try:
                # Closed with this call, so the servicer's own cleanup (its `finally`) runs now.
                async with contextlib.aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        yield response
            except Exception as exc:
                if recover is None or passes_through(exc):
                    raise
                await recover(exc, context)

        return stream

    async def call(request: Any, context: Context) -> Any:
        if before is not None:
            await before(request, context)
        try:
            return await behavior(request, context)
        except Exception as exc:
            if recover is None or passes_through(exc):
                raise
            await recover(exc, context)
            return None

    return call


def rewrap(
    handler: grpc.RpcMethodHandler,
    wrap: Callable[[Behavior], Behavior],
    *,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """`handler` with its behavior replaced by `wrap(behavior)`, same shape and serializers
    (the request deserializer replaced when one is given)."""
    if handler.request_streaming and handler.response_streaming:
        make, behavior = grpc.stream_stream_rpc_method_handler, handler.stream_stream
    elif handler.request_streaming:
        make, behavior = grpc.stream_unary_rpc_method_handler, handler.stream_unary
    elif handler.response_streaming:
        make, behavior = grpc.unary_stream_rpc_method_handler, handler.unary_stream
    else:
        make, behavior = grpc.unary_unary_rpc_method_handler, handler.unary_unary
    return make(
        wrap(behavior),
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
