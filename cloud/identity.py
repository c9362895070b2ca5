"""Who is calling: taken from the peer's client certificate (SAN URI), never from a message."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import grpc

from cloud import pki

CallerKind = Literal["host", "operator", "viewer"]

# Only honoured when the server runs plaintext on loopback with the explicit insecure flag: there is
# no certificate then, so tests that need plaintext say who they are in this metadata key.
INSECURE_IDENTITY_METADATA = "amc-insecure-identity"


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated peer: a host (by host id), an operator or a viewer (by name)."""

    kind: CallerKind
    name: str


def caller_from_uri(uri: str) -> Caller | None:
    """Map `amc://host/<id>` / `amc://operator/<name>` / `amc://viewer/<name>` to a Caller;
    None for anything else."""
    for prefix, kind in (
        (pki.HOST_URI_PREFIX, "host"),
        (pki.OPERATOR_URI_PREFIX, "operator"),
        (pki.VIEWER_URI_PREFIX, "viewer"),
    ):
        if uri.startswith(prefix):
            name = uri[len(prefix) :]
            try:
                pki.validate_name(name, kind)
            except ValueError:
                return None
            return Caller(kind, name)  # type: ignore[arg-type]
    return None


@functools.lru_cache(maxsize=4096)
def _caller_from_pem(pem: bytes) -> Caller | None:
    callers = {c for c in (caller_from_uri(u) for u in pki.uri_sans(pem)) if c is not None}
    # A certificate naming two identities is ambiguous, so it names none.
    return callers.pop() if len(callers) == 1 else None


@functools.lru_cache(maxsize=4096)
def _serial_from_pem(pem: bytes) -> str:
    return pki.serial_hex(pem)


def caller_from_auth_context(auth: dict[str, list[bytes]]) -> Caller | None:
    """Identity from a gRPC auth context: the verified peer certificate's SAN URI."""
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        return None
    return _caller_from_pem(pems[0])


def peer_serial(context: grpc.aio.ServicerContext) -> str | None:
    """The serial (lowercase hex) of the peer's verified client certificate, if it sent one."""
    pems = dict(context.auth_context()).get("x509_pem_cert") or []
    return _serial_from_pem(pems[0]) if pems else None


def peer_caller(context: grpc.aio.ServicerContext, *, insecure: bool = False) -> Caller | None:
    """The caller of an RPC, or None when it presented no usable identity."""
    auth: dict[str, list[bytes]] = dict(context.auth_context())
    caller = caller_from_auth_context(auth)
    if caller is not None or not insecure:
        return caller
    for key, value in context.invocation_metadata() or ():
        if key == INSECURE_IDENTITY_METADATA:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return caller_from_uri("amc://" + text)
    return None
