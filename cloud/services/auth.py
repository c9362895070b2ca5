"""Who may call what: operators call the operator services, hosts the lease and planner ones."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from cloud.identity import Caller, CallerKind, peer_caller

_KIND: dict[CallerKind, str] = {"host": "a host", "operator": "an operator"}


async def abort(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, msg: str
) -> NoReturn:
    """Abort the RPC (typed as never returning)."""
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # pragma: no cover


async def require(
    context: grpc.aio.ServicerContext[Any, Any], kind: CallerKind, *, insecure: bool
) -> Caller:
    """The caller if it is of `kind`; PERMISSION_DENIED otherwise."""
    caller = peer_caller(context, insecure=insecure)
    if caller is None:
        await abort(context, grpc.StatusCode.PERMISSION_DENIED, "no amc identity in certificate")
    if caller.kind != kind:
        await abort(
            context,
            grpc.StatusCode.PERMISSION_DENIED,
            f"this RPC needs {_KIND[kind]} certificate, not {_KIND[caller.kind]} one",
        )
    return caller
