"""How a gRPC status from the cloud becomes an HTTP status, keeping the cloud's own message.

The gateway has no rules of its own, so the cloud's wording is what operators must see: "task
already ended" is more useful than "409 Conflict".
"""

from __future__ import annotations

import re
from collections.abc import Callable

import grpc

from cloud import cert_validity

_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 422,
    grpc.StatusCode.OUT_OF_RANGE: 422,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    # Only ever a message past a channel's limit here, never "slow down": the cloud aborts no
    # call with it (a spent budget is FAILED_PRECONDITION; the planner's "provider rate
    # limited" answers Decide, which the gateway never calls). Waiting gets the same answer.
    grpc.StatusCode.RESOURCE_EXHAUSTED: 502,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    # The gateway's own certificate was refused: a deployment problem, not the operator's.
    grpc.StatusCode.UNAUTHENTICATED: 502,
    grpc.StatusCode.PERMISSION_DENIED: 502,
}


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status for a gRPC status code; 502 for anything unexpected."""
    return _HTTP_STATUS.get(code, 502)


#: What people see when the gateway cannot reach the cloud at all.
UNREACHABLE = "the cloud is not reachable"
#: What people see when an answer is past what the gateway's channel reads (gRPC's own words
#: with its numbers follow in brackets).
TOO_LARGE = "the cloud's answer was too large for this console"
#: Where gRPC's own words about a failed connection name a machine: "ipv4:10.0.0.5:50051",
#: "unix:/run/amc.sock", a bare IP, "errors resolving cloud.internal:443", "lookup failed for …".
_ADDRESS = re.compile(
    r"\b(?:ipv4|ipv6|unix|unix-abstract|vsock|dns):|\b\d{1,3}(?:\.\d{1,3}){3}\b|\[[0-9a-f:.]+\]"
    r"|resolving |lookup failed",
    re.IGNORECASE,
)


#: What to do when the cloud would refuse the console's own operator certificate.
RENEW = (
    "issue a new one from the fleet CA with `amc certs operator DIR NAME` "
    "(AMC_CONSOLE_CERTS_DIR, AMC_CONSOLE_OPERATOR_NAME)"
)


def describe(
    error: grpc.aio.AioRpcError, own_certificate: Callable[[], str] | None = None
) -> tuple[int, str, str]:
    """(HTTP status, message for people, gRPC code name) of a failed call. The cloud's own
    UNAVAILABLE reasons ("the cloud's database is unavailable; retry") are kept; the channel's
    words when it could not reach the cloud at all name internal addresses, which are the
    log's business, not a browser's: people read only that the cloud is not reachable.

    `own_certificate()` says why the cloud would refuse the console's operator certificate
    now ("" when it would not; `CloudClient.certificate_problem`): asked on UNAVAILABLE, as a
    refused handshake says only "Socket closed", and a certificate that expired while the
    console ran showed as a cloud not reachable, which waiting never heals. Then 502, as
    for the cloud refusing it outright: a deployment problem, not the operator's."""
    code: grpc.StatusCode = error.code()
    details: str = error.details() or ""
    refused = cert_validity.verify_failed(details)
    own = ""
    if code is grpc.StatusCode.UNAVAILABLE and not refused and own_certificate is not None:
        own = own_certificate()
    if own:
        said = f"this console's {own}: the cloud refuses it; {RENEW} and restart the console"
        return 502, said, code.name
    if code is grpc.StatusCode.UNAVAILABLE and refused:
        # Waiting will not heal it: say whose certificate, not that the cloud is away (the
        # address the words name stays in the log).
        details = f"this console does not accept the cloud's certificate: {refused}"
    elif code is grpc.StatusCode.UNAVAILABLE and (not details or _ADDRESS.search(details)):
        details = UNREACHABLE
    elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        details = f"{TOO_LARGE} ({details or 'resource exhausted'})"
    return http_status(code), details or code.name.lower().replace("_", " "), code.name
