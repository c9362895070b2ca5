"""Whether a client certificate will be refused, checked before it is sent.

A certificate that has expired, is not valid yet or was not signed by the fleet CA is refused
in the TLS handshake; gRPC tells the client only "Socket closed" (the reason is in the other
side's log), so the CLI and the host check their own certificate first and say which file,
which date or which CA. Parsed once per file content (`certificate`), so a host can check on
every reconnect attempt for the price of two date comparisons.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from cloud.key_files import warn_if_readable

#: A certificate that expires within this many days is warned about (host and cloud, at start;
#: the cloud daily too): `amc certs` issues them for 365 days, and two weeks leave an operator
#: who reads the log after a restart (a deploy, a weekend) the time to issue and install a new
#: one before the other side refuses it.
EXPIRY_WARNING_DAYS = 14

#: What gRPC's details hold when this side refused the other side's certificate in the handshake.
VERIFY_FAILED = "CERTIFICATE_VERIFY_FAILED: "
#: Where gRPC's details name the peer whose handshake failed ("ipv4:127.0.0.1:50051: Tls …").
_PEER = re.compile(r"(?:ipv4|ipv6|dns|unix):(\S+?): (?:Tls|Ssl) handshake failed")


class CertificateInvalid(Exception):
    """A certificate the other side would refuse (the message names the file and why).

    `kind` (what is wrong: "expired", "not valid yet", …; "" when not told) and `path` (the
    file it is wrong with) are the problem apart from its words: a reader that says each
    problem once compares them, as the words of one may change at every check ("not valid
    before …" holds this machine's clock, and was said anew each minute)."""

    def __init__(self, message: str, *, kind: str = "", path: Path | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.path = path


class KeyNotTheCertificate(CertificateInvalid):
    """The key beside a certificate was issued with another one. Its own class because a reader
    acts on it: `amc certs` renames a new key into place before its certificate, so a reader
    between the two renames finds this, and reads once more before it refuses the pair (the
    host, `host.cloud_channel`). Told apart by the start of its message, every other problem
    of the key (not a key at all) was waited on as well."""


def when(moment: dt.datetime) -> str:
    """A certificate date as people read it, to the minute, in UTC."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True, slots=True)
class Validity:
    """What matters of a certificate for a handshake: its dates, and whether the CA signed it."""

    not_before: dt.datetime
    not_after: dt.datetime
    #: Why the CA given does not vouch for it ("" when it does).
    not_from_ca: str
    #: The dates of the CA certificate that signed it (None: no CA given, or none signed it).
    issuer: Validity | None = None

    def problem(self, what: str, now: dt.datetime | None = None) -> str:
        """Why `what` ("host certificate pki/host-h1.pem") would be refused now; "" if not."""
        return self.why(what, now)[1]

    def why(self, what: str, now: dt.datetime | None = None) -> tuple[str, str]:
        """(the kind of `problem`, its words); ("", "") when there is none."""
        now = now or dt.datetime.now(dt.UTC)
        if self.not_from_ca:
            return "not signed by the CA", f"{what} {self.not_from_ca}"
        if now >= self.not_after:
            return "expired", f"{what} expired {when(self.not_after)}"
        if now < self.not_before:
            return "not valid yet", (
                f"{what} is not valid before {when(self.not_before)} "
                f"(this machine's clock says {when(now)})"
            )
        return "", ""

    def days_left(self, now: dt.datetime | None = None) -> float:
        return (self.not_after - (now or dt.datetime.now(dt.UTC))).total_seconds() / 86400


def _dates(cert: x509.Certificate) -> Validity:
    return Validity(cert.not_valid_before_utc, cert.not_valid_after_utc, "")


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


@functools.lru_cache(maxsize=16)
def certificate(cert_pem: bytes, ca_pem: bytes | None, ca_name: str = "the fleet CA") -> Validity:
    """The validity of `cert_pem`, checked against `ca_pem` (the CA that must have signed it,
    named `ca_name` in the message); None skips that check (the CA certificate's own dates).

    `ca_pem` may hold several CA certificates, as TLS reads it: while the fleet CA is rotated
    every `ca.pem` holds the old and the new one (docs/deployment.md), and a certificate
    signed by either is accepted. Only the first used to be read, so a certificate from the
    new CA was refused here though the handshake would have taken it."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertificateInvalid(f"is not a PEM certificate ({exc})") from None
    if ca_pem is None:
        return _dates(cert)
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise CertificateInvalid(f"{ca_name} is not a PEM certificate ({exc})") from None
    issuer = next((ca for ca in cas if _signed_by(cert, ca)), None)
    if issuer is None:
        why = f"is not signed by {ca_name} (issued by {cert.issuer.rfc4514_string()})"
        return Validity(cert.not_valid_before_utc, cert.not_valid_after_utc, why)
    return Validity(cert.not_valid_before_utc, cert.not_valid_after_utc, "", _dates(issuer))


#: What to do about a key under a passphrase (gRPC has no way to be given one).
PASSPHRASE_HELP = (
    "is encrypted under a passphrase, which gRPC cannot be given: write it out without one "
    "(`openssl pkey -in {key} -out <new file>`, then `chmod 600` it) and point the setting "
    "at that file, or issue a new certificate and key (`amc certs`)"
)


@functools.lru_cache(maxsize=16)
def key_mismatch(cert_pem: bytes, key_pem: bytes) -> str | None:
    """Why `key_pem` cannot be used with `cert_pem` ("" when it can): not a private key (PKCS#8
    and the traditional PKCS#1 / SEC 1 forms are read alike), or another key than the one the
    certificate was issued for. gRPC says only "Invalid private key" in its own log: a client
    then retried "Failed to create security handshaker" forever as if the cloud were down,
    and a cloud said its port could not be bound.

    None: the key is encrypted, which `cryptography` cannot tell apart from gRPC's own case
    (a PKCS#8 key under an empty passphrase, which gRPC opens: an empty password counts as
    none in `cryptography`); `encrypted_key_problem` reads such a key as gRPC does."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        return None
    except (ValueError, UnsupportedAlgorithm) as exc:
        return f"is not a PEM private key ({str(exc).splitlines()[0]})"
    public = x509.load_pem_x509_certificate(cert_pem).public_key()
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != public.public_bytes(*spki):
        return KEY_NOT_THE_CERTIFICATE_S
    return ""


#: `key_mismatch`'s words for a key issued with another certificate.
KEY_NOT_THE_CERTIFICATE_S = "is not the key of this certificate (it belongs to another one)"


@functools.lru_cache(maxsize=16)
def encrypted_key_problem(cert: Path, key: Path, contents: tuple[bytes, bytes]) -> str:
    """Why gRPC will refuse the encrypted key file `key` for `cert` ("" when it will take it);
    `contents` (the two files' bytes) only keys the cache, so a file changed is read again.

    gRPC hands its PEM reader an empty passphrase, and nothing else: a key under a real one
    got gRPC's vague "Invalid private key" (and a client retrying "Failed to create security
    handshaker" as if the cloud were down) since `key_mismatch` stopped calling every
    encrypted key encrypted. Python's `ssl` reads the files the same way when given "" as
    the password, and checks the key against the certificate as it does."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(cert, key, password="")
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            return KEY_NOT_THE_CERTIFICATE_S
        return PASSPHRASE_HELP.format(key=key)
    return ""


def check(
    cert: Path, ca: Path, what: str, now: dt.datetime | None = None, key: Path | None = None
) -> Validity:
    """Raise CertificateInvalid when `cert` (a `what`: "operator certificate") or the CA
    certificate `ca` would be refused now, or `key` (when given, and a file) is not the
    certificate's private key; else the certificate's validity. A key others can read is
    warned about (`key_files`). Reads the files (the caller made sure `cert` and `ca`
    exist)."""
    cert_pem = cert.read_bytes()
    ca_pem = ca.read_bytes()
    key_pem = key.read_bytes() if key is not None and key.is_file() else None
    return check_pair(cert_pem, ca_pem, key_pem, cert, ca, key, what, now)


def check_pair(
    cert_pem: bytes,
    ca_pem: bytes,
    key_pem: bytes | None,
    cert: Path,
    ca: Path,
    key: Path | None,
    what: str,
    now: dt.datetime | None = None,
) -> Validity:
    """`check` of contents read already (`key_pem` None: no key to check): a reader that
    builds credentials from the bytes it checked cannot hand on a pair rotated in between."""
    validity = check_read(cert_pem, ca_pem, cert, ca, what, now)
    if key is not None and key_pem is not None:
        warn_if_readable(key)  # once per process: every start (cloud, host, CLI) checks here
        mismatch = key_mismatch(cert_pem, key_pem)
        if mismatch is None:
            mismatch = encrypted_key_problem(cert, key, (cert_pem, key_pem))
        if mismatch:
            why = (
                KeyNotTheCertificate
                if mismatch == KEY_NOT_THE_CERTIFICATE_S
                else CertificateInvalid
            )
            kind = "another certificate's key" if why is KeyNotTheCertificate else "key unusable"
            raise why(f"the key {key} of {what} {cert} {mismatch}", kind=kind, path=key)
    return validity


def check_read(
    cert_pem: bytes, ca_pem: bytes, cert: Path, ca: Path, what: str, now: dt.datetime | None = None
) -> Validity:
    """`check` of the contents read from `cert` and `ca` already (a channel's, read when it
    was opened: the certificate it presents, whatever the files hold now)."""
    try:
        validity = certificate(cert_pem, ca_pem, str(ca))
    except CertificateInvalid as exc:
        raise CertificateInvalid(f"{what} {cert} {exc}", kind="not a PEM", path=cert) from None
    own = validity.issuer  # the CA of `ca` that signed it (of several while the CA is rotated)
    kind, problem = own.why(f"fleet CA certificate {ca}", now) if own else ("", "")
    path = ca
    if not problem:
        kind, problem = validity.why(f"{what} {cert}", now)
        path = cert
    if problem:
        raise CertificateInvalid(problem, kind=kind, path=path)
    return validity


def expiry_warning(validity: Validity | None, what: str, renew: str) -> str:
    """What to warn when `what` ("the host certificate") expires within `EXPIRY_WARNING_DAYS`
    ("" when not); `renew` says how to get a new one."""
    if validity is None or validity.days_left() > EXPIRY_WARNING_DAYS:
        return ""
    return (
        f"{what} expires {when(validity.not_after)} (in {validity.days_left():.1f} days): "
        f"it is refused from then on; {renew}"
    )


def verify_failed(details: str) -> str:
    """Why this side refused the other side's certificate in the handshake ("certificate has
    expired"), when `details` (a failed gRPC call's) say it did; "" when they do not. The one
    reader of gRPC's words for it: the CLI, the console's gateway and the host each read them."""
    if VERIFY_FAILED not in details:
        return ""
    reason = details.split(VERIFY_FAILED, 1)[1].splitlines()[0].removesuffix(": OK")
    return reason or "certificate verify failed"


def cloud_refused(details: str) -> str:
    """Whose certificate and why, when `details` (a failed gRPC call's) say this side refused
    the cloud's certificate in the handshake; "" when they do not. gRPC's words name neither
    ("… Tls handshake failed … CERTIFICATE_VERIFY_FAILED: certificate has expired: OK"), and a
    cloud whose certificate expired while it ran looked like any unreachable one."""
    reason = verify_failed(details)
    if not reason:
        return ""
    peer = _PEER.search(details)
    where = f", as presented at {peer.group(1)}," if peer else ""
    return f"the cloud's certificate{where} is not accepted: {reason}"
