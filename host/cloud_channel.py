"""The host's mTLS gRPC channel to the cloud, with keepalive so a dead link is noticed in < 30 s.

The host's identity is its client certificate (SAN `amc://host/<id>`); nothing the host sends
names it. Keepalive pings every 10 s (not below the server's minimum ping interval, which the
cloud must allow: `grpc.http2.min_ping_interval_without_data_ms` <= 10000 and
`grpc.keepalive_permit_without_calls`), a 10 s ack timeout: a silent peer is dropped in ~20 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import grpc
from cryptography import x509

from cloud import cert_validity
from cloud.cert_validity import CertificateInvalid
from host.devices.lanes import in_own_thread
from host.settings import HostSettings

#: How a host certificate names its host (`cloud/pki.py`: HOST_URI_PREFIX).
HOST_URI_PREFIX = "amc://host/"

#: The largest message the host sends or takes (the cloud's own default limit too,
#: `AMC_CLOUD_MAX_MESSAGE_BYTES`): an outbox item bigger than this can never be sent.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

#: A host certificate that expires within this many days is warned about at start.
EXPIRY_WARNING_DAYS = cert_validity.EXPIRY_WARNING_DAYS

#: How long a connection attempt's read of the certificate files may take (`connect`).
CERT_READ_S = 10.0

__all__ = ["EXPIRY_WARNING_DAYS", "CertificateInvalid", "CertificateMissing"]

#: Per client certificate file, what it and the CA file held when the host last read them
#: (`credentials`): what its channels present, checked by `failure` without the disk.
_presented: dict[Path, tuple[bytes, bytes]] = {}


class CertificateMissing(RuntimeError):
    """The settings do not name a CA, client certificate and key that exist."""


class CertificatesHung(OSError):
    """Reading the certificate files did not return within `CERT_READ_S` (a disk that hangs):
    an OSError, so the lease client says so and tries again with its backoff."""


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
    return cert_validity.check(cert, ca, "host certificate", key=settings.client_key)


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
    "Socket closed", so with `settings` an UNAVAILABLE checks the host certificate again, as
    the host last read it (`_check_presented`, no disk read): a channel opened at start
    outlives the certificate it was opened with, and its next handshake fails once that
    expired."""
    details = error.details() or ""
    said = cert_validity.cloud_refused(details)
    if not said and settings is not None and error.code() is grpc.StatusCode.UNAVAILABLE:
        try:
            _check_presented(settings)
        except CertificateInvalid as exc:
            said = f"{exc} (the cloud refuses it)"
    return said or f"{error.code().name}: {details}"


def _check_presented(settings: HostSettings) -> None:
    """`check_certificate` of what the host last read of its files (`_presented`), not of the
    disk: `failure` runs on the event loop, where a read of a certs folder on a disk that
    hangs stalled the whole host at each UNAVAILABLE."""
    ca, cert = settings.ca_cert, settings.client_cert
    if ca is None or cert is None or cert not in _presented:
        return
    cert_pem, ca_pem = _presented[cert]
    cert_validity.check_read(cert_pem, ca_pem, cert, ca, "host certificate")


def credentials(settings: HostSettings) -> grpc.ChannelCredentials:
    """The channel credentials from the certificate files (read from the disk: off the event
    loop but at start, `connect`)."""
    check_certificate(settings)
    ca = _read(settings.ca_cert, "CA certificate")
    key = _read(settings.client_key, "client key")
    cert = _read(settings.client_cert, "client certificate")
    if settings.client_cert is not None:
        _presented[settings.client_cert] = (cert, ca)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


async def connect(settings: HostSettings) -> grpc.aio.Channel:
    """`open_channel` for a connection attempt while the host runs: the certificate files are
    read in a thread of their own (`in_own_thread`) for at most `CERT_READ_S`. Read on the
    event loop, a certs folder on a disk that hangs (a dead NFS mount) stalled the whole host
    at each reconnect: every other phone's attempt, the outbox, the console. A read that does
    not return in time is `CertificatesHung`; its thread is left to the disk."""
    within = CERT_READ_S
    try:
        async with asyncio.timeout(within):
            creds = await in_own_thread(credentials, settings, name="certificate-read")
    except TimeoutError:
        raise CertificatesHung(
            f"reading the host certificate files ({settings.certs_dir or settings.client_cert})"
            f" did not return within {within:g} s: the disk hangs"
        ) from None
    return grpc.aio.secure_channel(settings.cloud_address, creds, options=channel_options(settings))


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
