"""Who may call what: one table of RPC -> allowed callers, enforced by one server interceptor.

The caller is who the client certificate says (`cloud.identity`), never what a message claims.
Operators call the operator services, hosts the lease and planner ones; viewers (operators who
may only watch, `amc://viewer/<name>`) call the operator services' reads (`READERS`) and nothing
that submits, cancels, changes a flow or reaches a host's secrets; health checks and
reflection are open to any peer the TLS handshake let in (so `grpcurl` works). An RPC that is
served but missing from `ACCESS` is refused: a new method stays closed until someone decides
who may call it (a test checks every served method is listed).

A refusal is PERMISSION_DENIED before the servicer runs, with one of these details:
"no amc identity in certificate" (a fleet-signed certificate without an `amc://` identity),
"this RPC needs an operator certificate, not a host one" (and the other way round; a viewer
calling a mutating RPC reads "… not a viewer one"), or the
RPC's own refusal text (`Rule.refusal`: the Lease stream keeps the wording hosts know). A
servicer reads the authorized caller with `caller()` (and its certificate's serial with
`caller_serial()`).

A revoked certificate (by serial) or any certificate of a revoked host id (`cloud.revocations`)
is refused first, on every RPC, with UNAUTHENTICATED "certificate revoked (serial …)" / "host …
revoked"; when the deny-list changes, `drop` ends the open streams it now refuses (their
servicer is cancelled, so its cleanup runs, and the client gets that same status).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from cloud import revocations
from cloud.handlers import Before, Behavior, Context, guard, rewrap
from cloud.identity import Caller, CallerKind, peer_caller, peer_serial
from cloud.store.revocations import Revoked

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
#: The operator services' reads: what a viewer may call too. Only RPCs that change nothing and
#: return nothing an operator could not show a viewer on a screen (no secret values: those are
#: sent to the lease holder only) belong here.
READERS: Final = Rule(frozenset({"operator", "viewer"}))
HOSTS: Final = Rule(frozenset({"host"}))
ANY_PEER: Final = Rule(frozenset())

#: Every RPC the cloud serves (full method name, as gRPC routes it) and who may call it.
ACCESS: Final[Mapping[str, Rule]] = {
    "/amc.v1.TaskService/SubmitTask": OPERATORS,
    "/amc.v1.TaskService/GetTask": READERS,
    "/amc.v1.TaskService/ListTasks": READERS,
    "/amc.v1.TaskService/CancelTask": OPERATORS,
    "/amc.v1.TaskService/ListTaskEvents": READERS,
    "/amc.v1.ProgressService/WatchProgress": READERS,
    "/amc.v1.FleetService/ListHosts": READERS,
    "/amc.v1.FleetService/WatchHosts": READERS,
    "/amc.v1.FleetService/GetSpend": READERS,
    "/amc.v1.DecisionLogService/ListDecisions": READERS,
    "/amc.v1.DecisionLogService/GetDecision": READERS,
    "/amc.v1.DecisionLogService/GetConversation": READERS,
    "/amc.v1.DecisionLogService/ShipDecisions": HOSTS,
    "/amc.v1.ArtifactService/UploadStepScreenshot": HOSTS,
    "/amc.v1.ArtifactService/ListStepScreenshots": READERS,
    "/amc.v1.ArtifactService/GetStepScreenshot": READERS,
    "/amc.v1.FlowService/ListFlows": READERS,
    "/amc.v1.FlowService/GetFlow": READERS,
    "/amc.v1.FlowService/SetFlowStatus": OPERATORS,
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
_SERIAL: contextvars.ContextVar[str | None] = contextvars.ContextVar("amc_serial", default=None)


def caller() -> Caller:
    """The caller the current RPC was authorized as (only inside a servicer that has a rule
    naming caller kinds; elsewhere it raises LookupError)."""
    return _CALLER.get()


def caller_serial() -> str | None:
    """The serial of the current RPC's client certificate (None without one)."""
    return _SERIAL.get()


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
    # A viewer is an operator who may only read: to a caller who is neither, an RPC both may
    # call "needs an operator certificate" (the wording hosts knew before viewers existed).
    kinds = rule.allowed - {"viewer"} if "operator" in rule.allowed else rule.allowed
    needed = " or ".join(_a(kind) for kind in sorted(kinds))
    return rule.refusal or f"this RPC needs {needed} certificate, not {_a(who.kind)} one"


@dataclass(eq=False, slots=True)
class _OpenStream:
    who: Caller | None
    serial: str | None
    task: asyncio.Task[Any]
    #: Set when the stream is being dropped: the status details its client gets.
    dropped: str | None = field(default=None)
    #: False while an async-generator servicer is suspended at a `yield` (gRPC is sending
    #: its message): a cancel then would land in gRPC's own code, which ends the call without
    #: a status, so the drop waits for the generator to be resumed instead.
    cancellable: bool = True


class OpenStreams:
    """The streaming calls in progress, so a revocation can end those it now refuses."""

    def __init__(self) -> None:
        self._open: set[_OpenStream] = set()

    @contextlib.contextmanager
    def track(self) -> Iterator[_OpenStream]:
        task = asyncio.current_task()
        assert task is not None
        stream = _OpenStream(_CALLER.get(None), _SERIAL.get(), task)
        self._open.add(stream)
        try:
            yield stream
        finally:
            self._open.discard(stream)

    def drop(self, revoked: Revoked) -> int:
        """End every open stream `revoked` refuses (at once, or when its servicer is next
        resumed); returns how many."""
        dropped = 0
        for stream in list(self._open):
            reason = revocations.refusal(revoked, stream.who, stream.serial)
            if reason is not None and stream.dropped is None:
                stream.dropped = reason
                if stream.cancellable:
                    stream.task.cancel()
                dropped += 1
        return dropped


def _droppable(behavior: Behavior, streams: OpenStreams) -> Behavior:
    """A streaming behavior that `streams.drop` can end with UNAUTHENTICATED."""

    async def end(stream: _OpenStream, context: Context, *, cancelled: bool) -> None:
        assert stream.dropped is not None
        if cancelled:  # the cancel was ours, not the client's: take it back
            stream.task.uncancel()
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, stream.dropped)

    if inspect.isasyncgenfunction(behavior):

        async def generate(request: Any, context: Context) -> Any:
            with streams.track() as stream:
                async with contextlib.aclosing(behavior(request, context)) as responses:
                    while True:
                        if stream.dropped is not None:
                            await end(stream, context, cancelled=False)
                        try:
                            response = await anext(responses)
                        except StopAsyncIteration:
                            return
                        except asyncio.CancelledError:
                            if stream.dropped is None:
                                raise
                            await end(stream, context, cancelled=True)
                        stream.cancellable = False
                        yield response
                        stream.cancellable = True

        return generate

    async def call(request: Any, context: Context) -> Any:
        with streams.track() as stream:
            try:
                return await behavior(request, context)
            except asyncio.CancelledError:
                if stream.dropped is None:
                    raise
                await end(stream, context, cancelled=True)
                return None

    return call


class Authorization(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Applies `ACCESS` (and the deny-list) to every call before its servicer runs (deny by
    default), and drops open streams the deny-list comes to refuse."""

    def __init__(
        self,
        access: Mapping[str, Rule] = ACCESS,
        *,
        insecure: bool = False,
        revoked: revocations.Revocations | None = None,
    ) -> None:
        self._access = access
        self._insecure = insecure
        self._revoked = revoked
        self.streams = OpenStreams()
        if revoked is not None:
            revoked.add_listener(self.streams.drop)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
            return None
        method: str = handler_call_details.method
        check = self._check(method, self._access.get(method))
        streaming = handler.request_streaming or handler.response_streaming

        def wrap(behavior: Behavior) -> Behavior:
            inner = _droppable(behavior, self.streams) if streaming else behavior
            return guard(inner, before=check)

        return rewrap(handler, wrap)

    def _check(self, method: str, rule: Rule | None) -> Before:
        insecure = self._insecure
        revoked = self._revoked

        async def check(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            who = peer_caller(context, insecure=insecure)
            serial = peer_serial(context)
            if revoked is not None:
                why = revoked.refusal(who, serial)
                if why is not None:
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
            problem = refusal(method, rule, who)
            if problem is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
            # Each RPC runs in its own context (see grpc.aio.ServerInterceptor), so these are
            # seen by this call's servicer and the tasks it starts, and by no other.
            _SERIAL.set(serial)
            if who is not None:
                _CALLER.set(who)

        return check
