"""Who may call what: one table of RPC -> allowed callers, enforced by one server interceptor.

The caller is who the client certificate says (`cloud.identity`), never what a message claims.
Operators call the operator services, hosts the lease and planner ones; health checks and
reflection are open to any peer the TLS handshake let in (so `grpcurl` works). An RPC that is
served but missing from `ACCESS` is refused: a new method stays closed until someone decides
who may call it (a test checks every served method is listed).

A refusal is PERMISSION_DENIED before the servicer runs, with one of these details:
"no amc identity in certificate" (a fleet-signed certificate without an `amc://` identity),
"this RPC needs an operator certificate, not a host one" (and the other way round), or the
RPC's own refusal text (`Rule.refusal`: the Lease stream keeps the wording hosts know). A
servicer reads the authorized caller with `caller()`.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import grpc

from cloud.identity import Caller, CallerKind, peer_caller

NO_IDENTITY = "no amc identity in certificate"


@dataclass(frozen=True, slots=True)
class Rule:
    """Who may call one RPC: callers of these kinds (none listed: any peer, identity or not)."""

    allowed: frozenset[CallerKind]
    #: The detail of every refusal of this RPC, when it has its own wording.
    refusal: str | None = None

    @property
    def any_peer(self) -> bool:
        return not self.allowed


OPERATORS: Final = Rule(frozenset({"operator"}))
HOSTS: Final = Rule(frozenset({"host"}))
ANY_PEER: Final = Rule(frozenset())

#: Every RPC the cloud serves (full method name, as gRPC routes it) and who may call it.
ACCESS: Final[Mapping[str, Rule]] = {
    "/amc.v1.TaskService/SubmitTask": OPERATORS,
    "/amc.v1.TaskService/GetTask": OPERATORS,
    "/amc.v1.TaskService/ListTasks": OPERATORS,
    "/amc.v1.TaskService/CancelTask": OPERATORS,
    "/amc.v1.ProgressService/WatchProgress": OPERATORS,
    "/amc.v1.FleetService/ListHosts": OPERATORS,
    "/amc.v1.FleetService/WatchHosts": OPERATORS,
    "/amc.v1.FleetService/GetSpend": OPERATORS,
    "/amc.v1.DecisionLogService/ListDecisions": OPERATORS,
    "/amc.v1.DecisionLogService/GetDecision": OPERATORS,
    "/amc.v1.DecisionLogService/GetConversation": OPERATORS,
    "/amc.v1.LeaseService/Lease": Rule(
        frozenset({"host"}), refusal="a host certificate (amc://host/<id>) is required"
    ),
    "/amc.v1.PlannerService/Decide": HOSTS,
    "/grpc.health.v1.Health/Check": ANY_PEER,
    "/grpc.health.v1.Health/List": ANY_PEER,
    "/grpc.health.v1.Health/Watch": ANY_PEER,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": ANY_PEER,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": ANY_PEER,
}

_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("amc_caller")


def caller() -> Caller:
    """The caller the current RPC was authorized as (only inside a servicer that has a rule
    naming caller kinds; elsewhere it raises LookupError)."""
    return _CALLER.get()


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def refusal(method: str, rule: Rule | None, who: Caller | None) -> str | None:
    """Why `who` may not call `method` under `rule` (None: it may)."""
    if rule is None:
        return f"{method} is not open to any caller (it is missing from the access table)"
    if rule.any_peer:
        return None
    if who is None:
        return rule.refusal or NO_IDENTITY
    if who.kind in rule.allowed:
        return None
    needed = " or ".join(_a(kind) for kind in sorted(rule.allowed))
    return rule.refusal or f"this RPC needs {needed} certificate, not {_a(who.kind)} one"


Behavior = Callable[..., Any]


class Authorization(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Applies `ACCESS` to every call before its servicer runs (deny by default)."""

    def __init__(self, access: Mapping[str, Rule] = ACCESS, *, insecure: bool = False) -> None:
        self._access = access
        self._insecure = insecure

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
            return None
        method: str = handler_call_details.method
        return _guarded(handler, self._check(method, self._access.get(method)))

    def _check(
        self, method: str, rule: Rule | None
    ) -> Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]:
        insecure = self._insecure

        async def check(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            who = peer_caller(context, insecure=insecure)
            problem = refusal(method, rule, who)
            if problem is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
            if who is not None:
                # Each RPC runs in its own context (see grpc.aio.ServerInterceptor), so this
                # is seen by this call's servicer and the tasks it starts, and by no other.
                _CALLER.set(who)

        return check


def _guarded(
    handler: grpc.RpcMethodHandler,
    check: Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]],
) -> grpc.RpcMethodHandler:
    """`handler` with `check` run before its behavior, keeping its shape (unary or streaming,
    coroutine or async generator) and its (de)serializers."""
    if handler.request_streaming and handler.response_streaming:
        wrap, behavior = grpc.stream_stream_rpc_method_handler, handler.stream_stream
    elif handler.request_streaming:
        wrap, behavior = grpc.stream_unary_rpc_method_handler, handler.stream_unary
    elif handler.response_streaming:
        wrap, behavior = grpc.unary_stream_rpc_method_handler, handler.unary_stream
    else:
        wrap, behavior = grpc.unary_unary_rpc_method_handler, handler.unary_unary
    return wrap(
        _checked(behavior, check),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _checked(
    behavior: Behavior, check: Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]
) -> Behavior:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(context)
            # Closed with this call, so the servicer's own cleanup (its `finally`) runs now.
            async with contextlib.aclosing(behavior(request, context)) as responses:
                async for response in responses:
                    yield response

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await check(context)
        return await behavior(request, context)

    return call
