"""The host's mTLS gRPC channel to the cloud, with keepalive so a dead link is noticed in < 30 s.

The host's identity is its client certificate (SAN `amc://host/<id>`); nothing the host sends
names it. Keepalive pings every 10 s (not below the server's minimum ping interval, which the
cloud must allow: `grpc.http2.min_ping_interval_without_data_ms` <= 10000 and
`grpc.keepalive_permit_without_calls`), a 10 s ack timeout: a silent peer is dropped in ~20 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509

from cloud import cert_validity
from cloud.cert_validity import CertificateInvalid, KeyNotTheCertificate
from host.devices.lanes import Lane
from host.settings import HostSettings

log = logging.getLogger(__name__)

#: How a host certificate names its host (`cloud/pki.py`: HOST_URI_PREFIX).
HOST_URI_PREFIX = "amc://host/"

#: The largest message the host sends or takes (the cloud's own default limit too,
#: `AMC_CLOUD_MAX_MESSAGE_BYTES`): an outbox item bigger than this can never be sent.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

#: A host certificate that expires within this many days is warned about at start.
EXPIRY_WARNING_DAYS = cert_validity.EXPIRY_WARNING_DAYS

#: How long a connection attempt's read of the certificate files may take (`connect`).
CERT_READ_S = 10.0

__all__ = [
    "EXPIRY_WARNING_DAYS",
    "AnotherHostsCertificate",
    "CertificateInvalid",
    "CertificateMissing",
    "CertificatesHung",
    "CertificatesUnreadable",
]

#: Per client certificate file, what it and the CA file held when the host last read them
#: (`credentials`): what its channels present, checked by `failure` without the disk.
_presented: dict[Path, tuple[bytes, bytes]] = {}


class CertificateMissing(RuntimeError):
    """The settings do not name a CA, client certificate and key that exist. `path`: the file
    named that is not there (None: none is named), for the lease stream, which says it is
    missing and checks again once it has connected with the files (`LeaseClient.run`)."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class AnotherHostsCertificate(Exception):
    """The certificate files name another host than the one this process connected as (another
    host's files copied over these), and the certificate it connected with cannot be used any
    more (expired): the host stops (exit 4) rather than become that host (`issued`)."""


class _NamesAnotherHost(Exception):
    """A read of the files whose certificate names `named`, not the host this process is."""

    def __init__(self, named: str, cert: bytes) -> None:
        super().__init__(named)
        self.named, self.cert = named, cert


class CertificatesHung(OSError):
    """Reading the certificate files did not return within `CERT_READ_S` (a disk that hangs):
    an OSError, so the lease client says so and tries again with its backoff."""


#: The cloud's default minimum interval between a client's pings
#: (`AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS`). The host cannot read the cloud's own value.
CLOUD_MIN_PING_INTERVAL_S = 10.0


def keepalive_warning(settings: HostSettings) -> str | None:
    """What to say at start when the host's keepalive pings come faster than a cloud with
    its default settings accepts: that cloud closes the connection after a few pings
    ("too_many_pings"), and the host loses its stream every few seconds, again and again,
    with nothing in its own log but the lost streams. Said, not refused: the cloud may allow
    faster pings, which the host cannot know."""
    if settings.keepalive_time_s >= CLOUD_MIN_PING_INTERVAL_S:
        return None
    return (
        f"AMC_HOST_KEEPALIVE_TIME_S is {settings.keepalive_time_s:g} s, below the cloud's "
        f"default AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS ({CLOUD_MIN_PING_INTERVAL_S:g} s): "
        "unless the cloud sets it to no more than that, it closes the connection after a few "
        "pings (too_many_pings) and the lease stream is lost again and again; set "
        f"AMC_HOST_KEEPALIVE_TIME_S to {CLOUD_MIN_PING_INTERVAL_S:g} or more"
    )


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


class CertificatesUnreadable(OSError):
    """A certificate file is there but cannot be read (an I/O error, a permission taken away):
    an OSError, tried again with the backoff; its own class so the lease client says it as
    a problem with the files, once (`host.not_connecting`), not as a lost stream each time."""

    def __str__(self) -> str:
        return str(self.strerror)  # the file is named in it, once


def _read(path: Path | None, what: str) -> bytes:
    if path is None:
        raise CertificateMissing(
            f"no {what} configured (set AMC_HOST_CERTS_DIR + AMC_HOST_HOST_ID)"
        )
    try:
        if not path.is_file():
            raise CertificateMissing(f"{what} {path} does not exist", path)
        return path.read_bytes()
    except OSError as exc:
        raise CertificatesUnreadable(
            exc.errno, f"{what} {path} cannot be read ({exc.strerror or exc})", str(path)
        ) from exc


def certificate_name(path: Path | None) -> str:
    """The host id the client certificate at `path` names (its `amc://host/<id>` SAN, what the
    cloud reads as this host's identity), else the certificate's subject; "" when there is no
    certificate or it cannot be read. What a host says it is before the cloud's welcome names
    it (a pause's words, `host.timeline.data_folder`)."""
    if path is None:
        return ""
    try:
        return _name_of(path.read_bytes())
    except OSError:
        return ""


def _name_of(pem: bytes) -> str:
    """`certificate_name` of the certificate `pem`; "" when it cannot be parsed."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
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
    only when they changed. A key that is not the certificate's is read once more after
    `PAIR_SETTLE_S` before it is refused: the files may be being issued again."""
    ca, cert = settings.ca_cert, settings.client_cert
    if ca is None or cert is None or not ca.is_file() or not cert.is_file():
        return None
    try:
        return cert_validity.check(cert, ca, "host certificate", key=settings.client_key)
    except KeyNotTheCertificate:
        pass
    # Not a pair: maybe caught between the renames of a pair issued again (`cloud.pki`
    # renames the new key into place, then the new certificate). Read once more, after them.
    _pair_settles()
    return cert_validity.check(cert, ca, "host certificate", key=settings.client_key)


#: How long a host waits before it reads again a certificate and key that are not a pair.
PAIR_SETTLE_S = 0.5


def _pair_settles() -> None:
    """Wait `PAIR_SETTLE_S` (in the thread that reads the files, never on the event loop)."""
    time.sleep(PAIR_SETTLE_S)


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


@dataclass(frozen=True, slots=True, eq=False)
class Issued:
    """What the certificate files held at one read, and the channel credentials made of it: a
    new one only when their contents changed (`read_issued`), so a channel made from an older
    one is known to present a certificate the files no longer hold (`ChannelOnce`)."""

    #: (mtime_ns, size, inode) of the CA, key and certificate files when they were read.
    stamp: tuple[tuple[int, int, int], ...]
    ca: bytes
    key: bytes
    cert: bytes
    credentials: grpc.ChannelCredentials

    def same_files(self, other: Issued) -> bool:
        return (self.ca, self.key, self.cert) == (other.ca, other.key, other.cert)

    @property
    def identity(self) -> str:
        """Whom the certificate names (`certificate_name`): a certificate the files now hold
        overrules the cloud's refusal of the one in use only when it names the same host."""
        return _name_of(self.cert)

    @property
    def serial(self) -> str:
        """The certificate's serial (`amc certs revoke --serial`'s form), "?" if unreadable."""
        try:
            return format(x509.load_pem_x509_certificate(self.cert).serial_number, "x")
        except ValueError:
            return "?"


_FilesKey = tuple[Path | None, Path | None, Path | None]

#: The latest read of each (CA, key, certificate) files (`issued`): what a channel opened now
#: presents, and what the channels made before are compared with.
_latest: dict[_FilesKey, Issued] = {}


def _files(settings: HostSettings) -> _FilesKey:
    return (settings.ca_cert, settings.client_key, settings.client_cert)


#: A file changed less than this long before it was read may change again within the same
#: timestamp tick (the kernel's clock for file times is coarse) and keep its size and inode
#: (a copy made with `cp` rewrites in place): its stamp is not trusted, the next read reads it.
_RACY_NS = 2_000_000_000


def _stamp(paths: _FilesKey) -> tuple[tuple[int, int, int], ...]:
    """The files' (mtime_ns, size, inode); () when one changed too recently to be told from
    a change still to come (`_RACY_NS`): compared with nothing, the files are read."""
    stamps = []
    for path in paths:
        st = path.stat() if path is not None else None
        stamps.append((st.st_mtime_ns, st.st_size, st.st_ino) if st is not None else (0, 0, 0))
    if any(time.time_ns() - mtime < _RACY_NS for mtime, _, _ in stamps):
        return ()
    return tuple(stamps)


def issued(settings: HostSettings) -> Issued:
    """The certificate files as they are now (read from the disk, blocking: while the host
    runs, only through `read_issued`), checked as the cloud would check them. Read again only
    when a file's mtime, size or inode changed (or changed just before the last read,
    `_stamp`); the previous `Issued` is kept when the contents are the same (a `touch`), so
    channels are made again only for new files."""
    paths = _files(settings)
    before = _latest.get(paths)
    try:
        stamp = _stamp(paths)
    except OSError:
        stamp = ()
    mine = _connected.get(paths)
    if before is not None and mine is not None and before.identity != mine.identity:
        before = None  # read before the welcome pinned whom this host is: not its own
    if before is not None and stamp and before.stamp == stamp:
        read = before  # its key was checked when read; its dates are checked now
        if settings.ca_cert is not None and settings.client_cert is not None:
            cert_validity.check_read(
                read.cert, read.ca, settings.client_cert, settings.ca_cert, "host certificate"
            )
    else:
        try:
            ca, key, cert = _read_checked(settings, mine.identity if mine else "")
        except _NamesAnotherHost as other:
            assert mine is not None  # only then is a certificate another host's
            read = _kept(settings, before or mine, other)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=ca, private_key=key, certificate_chain=cert
            )
            read = Issued(stamp, ca, key, cert, creds)
            if before is not None and before.same_files(read):
                read = before if before.stamp == stamp else replace(before, stamp=stamp)
            _latest[paths] = read
    if settings.client_cert is not None:
        _presented[settings.client_cert] = (read.cert, read.ca)
    return read


def _read_checked(settings: HostSettings, identity: str = "") -> tuple[bytes, bytes, bytes]:
    """The CA, key and certificate bytes, read once and checked as read (`check_certificate`'s
    checks): checked, then read again, a pair rotated in between reached gRPC unchecked, a
    new key beside the old certificate. A key not the certificate's is read once more after
    `PAIR_SETTLE_S`, as `check_certificate` does (caught between the renames of a new pair).

    The certificate is checked before its key is read: a missing key beside an expired
    certificate was said to be missing, and the operator who put one there learned only then
    that the certificate itself had to be issued again (which writes a new key as well).
    A certificate naming another host than `identity` (the host this process connected as,
    "" before it did) is `_NamesAnotherHost`, whatever else is wrong with it."""
    for last in (False, True):
        ca = _read(settings.ca_cert, "CA certificate")
        cert = _read(settings.client_cert, "client certificate")
        assert settings.ca_cert and settings.client_cert  # `_read`
        named = _name_of(cert)
        if identity and named and named != identity:
            raise _NamesAnotherHost(named, cert)
        cert_validity.check_read(
            cert, ca, settings.client_cert, settings.ca_cert, "host certificate"
        )
        key = _read(settings.client_key, "client key")
        assert settings.client_key  # `_read`
        try:
            cert_validity.check_pair(
                cert, ca, key, settings.client_cert, settings.ca_cert, settings.client_key,
                "host certificate",
            )  # fmt: skip
        except KeyNotTheCertificate:
            if last:
                raise
            _pair_settles()
            continue
        return ca, key, cert
    raise AssertionError("the loop returns or raises")


#: Per certificate files, the certificate the lease stream was last welcomed with
#: (`LeaseDialer.welcomed`): whom this process is for the cloud. Files naming another host are
#: refused at every read from then on (`issued`): the host never becomes that host.
_connected: dict[_FilesKey, Issued] = {}


#: The (file, serial) of each other host's certificate `_kept` has said it keeps its own
#: beside: said at every read (each reconnect, each channel made again), the same warning
#: filled the log every few seconds for as long as the files stayed wrong.
_kept_said: set[tuple[Path, str]] = set()


def _kept(settings: HostSettings, mine: Issued, other: _NamesAnotherHost) -> Issued:
    """`mine` (the last read of this host's own files), presented again while the files hold
    `other`'s certificate, when the cloud would still take it; else `AnotherHostsCertificate`.
    Reconnecting with whatever the files held, a host whose files were copied from the wrong
    folder became that other host, silently, at its next reconnect."""
    where = settings.client_cert
    try:
        serial = format(x509.load_pem_x509_certificate(other.cert).serial_number, "x")
    except ValueError:
        serial = "?"
    said = (
        f"the host certificate files now hold another host's certificate ({other.named}, "
        f"serial {serial}, in {where}; this host connected as {mine.identity})"
    )
    assert settings.ca_cert is not None and where is not None  # read: `_read`
    try:
        cert_validity.check_read(mine.cert, mine.ca, where, settings.ca_cert, "host certificate")
    except CertificateInvalid as exc:
        raise AnotherHostsCertificate(
            f"{said}, and its own certificate (serial {mine.serial}) cannot be used any more: "
            f"{exc}. It stops rather than connect as {other.named}: put the certificate and "
            f"key of {mine.identity} back (`amc certs host DIR {mine.identity}` issues new "
            "ones) and start it again"
        ) from None
    if (where, serial) not in _kept_said:  # once per file and certificate, not per read
        _kept_said.add((where, serial))
        log.warning(
            "%s: it keeps presenting its own (serial %s); put the certificate and key of %s "
            "back", said, mine.serial, mine.identity,
        )  # fmt: skip
    return mine


def latest(settings: HostSettings) -> Issued | None:
    """The last read of `settings`' certificate files (no disk read), None before the first."""
    return _latest.get(_files(settings))


def credentials(settings: HostSettings) -> grpc.ChannelCredentials:
    """The channel credentials from the certificate files (`issued`)."""
    return issued(settings).credentials


#: The certificate read under way, per (CA, key, certificate) files: one at a time (`_read_once`).
_reading: dict[_FilesKey, Future[Issued]] = {}
_reading_lock = threading.Lock()


def _read_once(settings: HostSettings) -> Future[Issued]:
    """The read of `settings`' certificate files under way, else a new one in a daemon thread
    of its own. A read that hangs (a dead NFS mount) keeps its thread until the disk answers:
    a new thread per reconnect piled up one more blocked thread every few seconds for as long
    as the disk hung. A later caller waits on the read in flight instead; once it is done,
    the next caller reads the files anew (a certificate replaced meanwhile is picked up)."""
    key = _files(settings)
    with _reading_lock:
        job = _reading.get(key)
        if job is not None:
            return job
        lane = Lane("", name="certificate-read")
        job = lane.submit(issued, settings)
        lane.shutdown(wait=False)  # the thread ends after the read
        _reading[key] = job

    def done(_: Future[Issued]) -> None:
        with _reading_lock:
            if _reading.get(key) is job:
                del _reading[key]

    job.add_done_callback(done)
    return job


async def read_credentials(settings: HostSettings) -> grpc.ChannelCredentials:
    """`read_issued`'s credentials."""
    return (await read_issued(settings)).credentials


async def read_issued(settings: HostSettings) -> Issued:
    """`issued`, read off the event loop and waited for at most `CERT_READ_S`: the one
    way every channel of the host reads its certificate files (`connect`). Read on the event
    loop, a certs folder on a disk that hangs (a dead NFS mount) stalled the whole host: every
    other phone's attempt, the outbox, the console. A read that does not return in time is
    `CertificatesHung` (an OSError: the caller tries again later); its thread is left to the
    disk, and the next caller waits on that same read (`_read_once`)."""
    within = CERT_READ_S
    job = asyncio.wrap_future(_read_once(settings))
    try:
        async with asyncio.timeout(within):
            # Shielded: a waiter that gives up must not cancel the read others wait on.
            return await asyncio.shield(job)
    except TimeoutError:
        raise CertificatesHung(
            f"reading the host certificate files ({settings.certs_dir or settings.client_cert})"
            f" did not return within {within:g} s: the disk hangs"
        ) from None


async def connect(
    settings: HostSettings, interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None
) -> grpc.aio.Channel:
    """`open_channel` with the certificate files read off the event loop, bounded
    (`read_credentials`): for every channel opened while the host runs."""
    return secure_channel(settings, await read_issued(settings), interceptors)


#: How long a call waits for a new look at the certificate files (`ChannelOnce._look_again`)
#: before it goes on the channel it has: a look is three `stat`s, unless the files changed.
LOOK_AGAIN_S = 2.0

#: The least time between two of those looks (`ChannelOnce._look_again`): a certs disk that
#: is slow but answers added up to `LOOK_AGAIN_S` to every Decide and shipment; a certificate
#: issued again is picked up within seconds all the same. Tests set it to 0 to look at each call.
LOOK_AGAIN_EVERY_S = 5.0

#: How long a channel the certificate files replaced is left for its calls under way (a
#: Decide's deadline is 120 s by default) before the calls still on it are cancelled.
RETIRED_GRACE_S = 300.0


class LeaseDialer:
    """The lease stream's channel for each connection attempt (`connect`), remembering what
    certificate it presented: when the cloud refuses that one (revoked: the last step of
    rotating it), `replaced` says whether the files hold another to reconnect with."""

    def __init__(self, settings: HostSettings) -> None:
        self._settings = settings
        self.made_from: Issued | None = None

    async def __call__(self) -> grpc.aio.Channel:
        made = await read_issued(self._settings)
        self.made_from = made
        return secure_channel(self._settings, made)

    def welcomed(self) -> None:
        """The cloud welcomed the stream made from `made_from`: this process is the host it
        names, and files naming another are refused from now on (`issued`). A read of another
        host's files made meanwhile (copied in after this stream read its own, before the
        welcome: a planner or outbox call's look) is no longer the latest: left so, every
        channel made from then on presented that other host."""
        if self.made_from is not None:
            key = _files(self._settings)
            _connected[key] = self.made_from
            read = _latest.get(key)
            if read is None or read.identity != self.made_from.identity:
                _latest[key] = self.made_from

    async def replaced(self) -> str | None:
        """What changed ("serial OLD -> NEW") when the certificate files now hold another
        certificate than the last channel presented, read off the event loop; None when they
        hold the same one, or cannot be read or would be refused (the refusal stands). Files
        naming another host read as this host's own certificate (`issued`), or raise
        `AnotherHostsCertificate` when that cannot be used: the host stops on it (exit 4)."""
        before = self.made_from
        if before is None:
            return None
        try:
            now = await read_issued(self._settings)
        except (OSError, CertificateMissing, CertificateInvalid):
            return None
        if now.cert == before.cert or not _same_host(before, now):
            return None
        return f"serial {before.serial} -> {now.serial}"


def _same_host(before: Issued, now: Issued) -> bool:
    """Whether `now` names the host `before` named: files holding another host's certificate
    (copied from the wrong folder) would have this host reconnect, silently, as that one;
    the refusal of `before` stands instead (said here, once per refusal)."""
    if now.identity == before.identity:
        return True
    log.warning(
        "the host certificate files now hold another host's certificate (%s, serial %s; "
        "this host connected as %s, serial %s): the cloud's refusal stands",
        now.identity or "?", now.serial, before.identity or "?", before.serial,
    )  # fmt: skip
    return False


def secure_channel(
    settings: HostSettings,
    made: Issued,
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    """A channel to the cloud presenting the certificate `made` was read with."""
    return grpc.aio.secure_channel(
        settings.cloud_address,
        made.credentials,
        options=channel_options(settings),
        interceptors=interceptors,
    )


class ChannelOnce:
    """A channel kept for all calls (the outbox's, the planner's), by `connect`: its opening
    starts with `open` (the host's build), and `get` waits for it. One that failed
    (`CertificatesHung`: the disk hangs) is tried again at the next `get`. Once the
    certificate files were read again with other contents (by the lease stream at each
    connection, or by `get` itself, which looks at them off the event loop before each call:
    a certificate issued again while the host runs), `get` makes a new channel from them; the
    old one takes no new call and is closed once its calls under way end (`RETIRED_GRACE_S`),
    so a step being planned is not cut. Files naming another host than the one the lease
    stream connected as are never made a channel of (`issued`)."""

    def __init__(
        self,
        settings: HostSettings,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
        *,
        factory: Callable[[], grpc.aio.Channel] | None = None,
    ) -> None:
        self._settings = settings
        self._interceptors = interceptors
        #: Made by this instead (tests: a channel to an in-test cloud), at once; never again.
        self._factory = factory
        self._opening: asyncio.Future[grpc.aio.Channel] | None = None
        #: The files the channel was made from (None: not yet, or by `factory`).
        self._made_from: Issued | None = None
        #: Old channels being closed once their calls end (`_renewed`).
        self._retiring: dict[grpc.aio.Channel, asyncio.Task[None]] = {}
        #: What each of those was made from (`replaced`: whom it presented).
        self._retired_from: dict[grpc.aio.Channel, Issued] = {}
        #: When (`time.monotonic`) `_look_again` last looked at the files; None: never.
        self._looked_at: float | None = None

    def open(self) -> None:
        """Start opening it (at once: the certificate is read while it is the one the start
        checked), if not under way or done. Needs a running event loop."""
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(
                self._made(), name="channel-open"
            )

    async def _made(self) -> grpc.aio.Channel:
        if self._factory is not None:
            return self._factory()
        made = await read_issued(self._settings)
        self._made_from = made
        return secure_channel(self._settings, made, self._interceptors)

    async def get(self) -> grpc.aio.Channel:
        """The channel; raises what opening it raised (an OSError when the files hang). Once
        made, the files are looked at again first (`_look_again`): a channel made again from
        new ones is what the call gets."""
        if self._made_from is not None:
            await self._look_again()
        self.open()
        opening = self._opening
        assert opening is not None
        try:
            channel = await asyncio.shield(opening)
        except asyncio.CancelledError:
            raise  # this waiter gave up: the opening goes on
        except Exception:
            if self._opening is opening:
                self._opening = None  # tried again at the next use
            raise
        if self._opening is None:
            return channel  # closed meanwhile: the call fails as on any closed channel
        if self._opening is not opening:
            return await self.get()  # made again meanwhile
        return self._renewed(channel)

    async def _look_again(self) -> None:
        """Read the certificate files again (off the event loop, `read_issued`: a look at
        their times, sizes and inodes, the contents read only when one changed), waiting at
        most `LOOK_AGAIN_S`, so `_renewed` sees new files. Only the lease stream's reconnects
        read them: while its stream stayed up, the planner's and the outbox's calls presented
        the old certificate after `amc certs` had issued a new one, until its revocation ended
        the stream. Whatever keeps the files from being read or used (they hang, are missing,
        refused, another host's) leaves the channel as it is: the lease stream says it, once.
        A read already in flight (the disk hangs) is not waited on, and at most one look is
        made every `LOOK_AGAIN_EVERY_S`."""
        if _files(self._settings) in _reading:
            return
        at = time.monotonic()
        if self._looked_at is not None and at - self._looked_at < LOOK_AGAIN_EVERY_S:
            return
        self._looked_at = at
        with contextlib.suppress(
            TimeoutError, OSError, CertificateMissing, CertificateInvalid, AnotherHostsCertificate
        ):
            async with asyncio.timeout(LOOK_AGAIN_S):
                await read_issued(self._settings)

    def _renewed(self, channel: grpc.aio.Channel) -> grpc.aio.Channel:
        """`channel`, or a new one when the files were read since with other contents. Once
        the welcome pinned whom this host is (`_connected`), only a channel naming that host
        is kept or made: one made before it from another host's files (copied in while the
        stream was being welcomed) is made again from this host's own."""
        before, now = self._made_from, latest(self._settings)
        if before is None or now is None:
            return channel
        mine = _connected.get(_files(self._settings))
        if mine is not None and now.identity != mine.identity:
            if before.identity == mine.identity:
                return channel  # read before the welcome, another host's: never presented
            now = mine
        if now is before:
            return channel
        self._made_from = now
        if now.same_files(before):
            return channel
        log.warning(
            "the host certificate files changed (serial %s -> %s): new calls go on a channel "
            "made from them", before.serial, now.serial,
        )  # fmt: skip
        fresh = secure_channel(self._settings, now, self._interceptors)
        done: asyncio.Future[grpc.aio.Channel] = asyncio.get_running_loop().create_future()
        done.set_result(fresh)
        self._opening = done
        retire = asyncio.get_running_loop().create_task(
            channel.close(RETIRED_GRACE_S), name="channel-retire"
        )
        self._retiring[channel] = retire
        self._retired_from[channel] = before
        retire.add_done_callback(lambda _: self._retiring.pop(channel, None))
        retire.add_done_callback(lambda _: self._retired_from.pop(channel, None))
        return fresh

    async def replaced(self, channel: grpc.aio.Channel) -> bool:
        """Whether a call the cloud refused on `channel` for its certificate (revoked: the
        last step of rotating it) is to be asked again on a channel made from the files as
        they are now: `channel` was made again meanwhile, or the files, read now (off the
        event loop), hold another certificate than it presents. False for a factory's, and
        when the files cannot be read or would be refused (the refusal stands)."""
        before = self._made_from
        if channel in self._retiring:  # made again meanwhile, from `before`
            presented = self._retired_from.get(channel)
            return before is None or presented is None or _same_host(presented, before)
        if before is None:
            return False
        try:
            now = await read_issued(self._settings)
        except (OSError, CertificateMissing, CertificateInvalid, AnotherHostsCertificate):
            return False  # the lease stream stops the host on the last one
        return now.cert != before.cert and _same_host(before, now)

    async def close(self, grace: float | None = None) -> None:
        """Close the channel (once opened), or stop opening it; and the old ones still open."""
        for old, retire in list(self._retiring.items()):
            retire.cancel()
            await _ended(retire)
            await old.close(grace)
        self._retiring.clear()
        self._retired_from.clear()
        opening, self._opening = self._opening, None
        if opening is None:
            return
        if not opening.done():
            opening.cancel()
            await _ended(opening)
            return
        if not opening.cancelled() and opening.exception() is None:
            await opening.result().close(grace)


async def _ended(task: asyncio.Future[Any]) -> None:
    """Wait for `task` to end, however it ends (its failure is the closing's to ignore); the
    caller's own cancellation propagates: suppressed around `await task`, it was swallowed
    with the task's, and a host stopping its own shutdown waited on."""
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" at exit


def open_channel(
    settings: HostSettings, interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None
) -> grpc.aio.Channel:
    """A new secure channel to `settings.cloud_address` (the caller closes it); `interceptors`
    for the planner's channel (trace propagation, `telemetry.tracing.client_interceptors`).
    Reads the certificate files where it is called: not on a running host's event loop
    (`connect` there), for tools and tests."""
    return grpc.aio.secure_channel(
        settings.cloud_address,
        credentials(settings),
        options=channel_options(settings),
        interceptors=interceptors,
    )
