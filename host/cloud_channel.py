"""The host's mTLS gRPC channel to the cloud, with keepalive so a dead link is noticed in < 30 s.

The host's identity is its client certificate (SAN `amc://host/<id>`); nothing the host sends
names it. Keepalive pings every 10 s (not below the server's minimum ping interval, which the
cloud must allow: `grpc.http2.min_ping_interval_without_data_ms` <= 10000 and
`grpc.keepalive_permit_without_calls`), a 10 s ack timeout: a silent peer is dropped in ~20 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
from cryptography import x509

from cloud import cert_validity
from cloud.cert_validity import CertificateInvalid
from host.settings import HostSettings

#: How a host certificate names its host (`cloud/pki.py`: HOST_URI_PREFIX).
HOST_URI_PREFIX = "amc://host/"

#: The largest message the host sends or takes (the cloud's own default limit too,
#: `AMC_CLOUD_MAX_MESSAGE_BYTES`): an outbox item bigger than this can never be sent.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

#: A host certificate that expires within this many days is warned about at start.
EXPIRY_WARNING_DAYS = cert_validity.EXPIRY_WARNING_DAYS

__all__ = ["EXPIRY_WARNING_DAYS", "CertificateInvalid", "CertificateMissing"]


class CertificateMissing(RuntimeError):
    """The settings do not name a CA, client certificate and key that exist."""


def channel_options(settings: HostSettings) -> list[tuple[str, int | str]]:
    opts: list[tuple[str, int | str]] = [
        ("grpc.keepalive_time_ms", int(settings.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        # Newer gRPC cores time out unanswered pings with this (default 60 s), not the above.
        ("grpc.http2.ping_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Reconnect quickly after a drop; the lease client adds its own backoff on top.
        ("grpc.initial_reconnect_backoff_ms", 500),
        ("grpc.max_reconnect_backoff_ms", 5000),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if settings.tls_server_name:
        opts.append(("grpc.ssl_target_name_override", settings.tls_server_name))
    return opts


def _read(path: Path | None, what: str) -> bytes:
    if path is None:
        raise CertificateMissing(
            f"no {what} configured (set AMC_HOST_CERTS_DIR + AMC_HOST_HOST_ID)"
        )
    if not path.is_file():
        raise CertificateMissing(f"{what} {path} does not exist")
    return path.read_bytes()


def certificate_name(path: Path | None) -> str:
    """The host id the client certificate at `path` names (its `amc://host/<id>` SAN, what the
    cloud reads as this host's identity), else the certificate's subject; "" when there is no
    certificate or it cannot be read. What a host says it is before the cloud's welcome names
    it (a pause's words, `host.timeline.data_folder`)."""
    if path is None:
        return ""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return ""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = None
    if sans is not None:
        for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
            if uri.startswith(HOST_URI_PREFIX) and uri != HOST_URI_PREFIX:
                return uri.removeprefix(HOST_URI_PREFIX)
    return cert.subject.rfc4514_string()


def check_certificate(settings: HostSettings) -> cert_validity.Validity | None:
    """The host certificate's validity, or CertificateInvalid naming the file and why the
    cloud would refuse it (expired, not valid yet, not signed by the CA file); None when
    the files are not configured or not there (`credentials` says so). Called on every
    connection attempt: the files are read again (a new certificate is picked up), parsed
    only when they changed."""
    ca, cert = settings.ca_cert, settings.client_cert
    if ca is None or cert is None or not ca.is_file() or not cert.is_file():
        return None
    return cert_validity.check(cert, ca, "host certificate")


def expiry_warning(validity: cert_validity.Validity | None) -> str:
    """What the start says when the certificate expires within `EXPIRY_WARNING_DAYS`."""
    return cert_validity.expiry_warning(
        validity,
        "the host certificate",
        "issue a new one with `amc certs host DIR HOST_ID` and restart the host",
    )


def failure(error: grpc.aio.AioRpcError, settings: HostSettings | None = None) -> str:
    """What a failed call to the cloud says: whose certificate, when the handshake failed on
    one, else "CODE: details". The cloud refusing this host's certificate shows here only as
    "Socket closed", so with `settings` an UNAVAILABLE checks the host certificate again
    (parsed once per file content): a channel opened at start outlives the certificate it
    was opened with, and its next handshake fails once that expired."""
    details = error.details() or ""
    said = cert_validity.cloud_refused(details)
    if not said and settings is not None and error.code() is grpc.StatusCode.UNAVAILABLE:
        try:
            check_certificate(settings)
        except CertificateInvalid as exc:
            said = f"{exc} (the cloud refuses it)"
    return said or f"{error.code().name}: {details}"


def credentials(settings: HostSettings) -> grpc.ChannelCredentials:
    check_certificate(settings)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(settings.ca_cert, "CA certificate"),
        private_key=_read(settings.client_key, "client key"),
        certificate_chain=_read(settings.client_cert, "client certificate"),
    )


def open_channel(
    settings: HostSettings, interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None
) -> grpc.aio.Channel:
    """A new secure channel to `settings.cloud_address` (the caller closes it); `interceptors`
    for the planner's channel (trace propagation, `telemetry.tracing.client_interceptors`)."""
    return grpc.aio.secure_channel(
        settings.cloud_address,
        credentials(settings),
        options=channel_options(settings),
        interceptors=interceptors,
    )
