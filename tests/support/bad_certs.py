"""Copies of a PKI folder whose one client certificate the other side refuses: expired, not
valid yet, or signed by another CA (what an outside review used to reproduce "Socket closed")."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cloud import pki

Flaw = Literal["expired", "not_yet_valid", "other_ca", "expires_soon", "expires_in_seconds"]

#: The dates of each flaw, relative to midnight UTC today: "valid until yesterday".
DAY = dt.timedelta(days=1)
#: How long an "expires_in_seconds" certificate is valid for (X.509 dates are whole seconds).
EXPIRES_IN = dt.timedelta(seconds=3)


def expired(end: dt.datetime) -> bool:
    """Whether TLS now refuses a certificate valid until `end`: a second after it. The
    handshake compares whole seconds with `time()`, which reads a coarse clock up to a tick
    behind `datetime.now()`: just past `end` a handshake was still accepted once (CI)."""
    return dt.datetime.now(dt.UTC) > end + dt.timedelta(seconds=1)


def midnight() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def flawed_copy(
    pki_dir: Path, stem: str, flaw: Flaw, into: Path, expires_in: dt.timedelta = EXPIRES_IN
) -> Path:
    """`pki_dir` copied to `into`, with `<stem>.pem` re-issued (same key, same SANs) with
    `flaw`; returns the new certificate's path. "expires_soon" is valid for 3 more days,
    "expires_in_seconds" for `expires_in` (one that expires while a test runs: longer for a
    test that has a process start and connect with it first)."""
    shutil.copytree(pki_dir, into)
    original = x509.load_pem_x509_certificate((pki_dir / f"{stem}.pem").read_bytes())
    key = serialization.load_pem_private_key((pki_dir / f"{stem}.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    ca = pki.load_ca(pki_dir) if flaw != "other_ca" else pki.create_ca("another CA")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    start, end = {
        "expired": (midnight() - 30 * DAY, midnight() - DAY),
        "not_yet_valid": (midnight() + 2 * DAY, midnight() + 30 * DAY),
        "other_ca": (midnight() - DAY, midnight() + 30 * DAY),
        "expires_soon": (midnight() - DAY, midnight() + 3 * DAY),
        "expires_in_seconds": (midnight() - DAY, dt.datetime.now(dt.UTC) + expires_in),
    }[flaw]
    builder = (
        x509.CertificateBuilder()
        .subject_name(original.subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )
    for extension in original.extensions:
        if not isinstance(extension.value, x509.AuthorityKeyIdentifier):
            builder = builder.add_extension(extension.value, extension.critical)
    cert = builder.sign(ca_key, hashes.SHA256())
    path = into / f"{stem}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def under_an_empty_passphrase(key: Path) -> None:
    """`key` rewritten as PKCS#8 encrypted under an empty passphrase, by openssl (`cryptography`
    refuses to write one), owner-only as `amc certs` writes keys."""
    encrypted = key.with_suffix(".p8")
    subprocess.run(
        ["openssl", "pkcs8", "-topk8", "-in", str(key), "-out", str(encrypted), "-passout",
         "pass:"],
        check=True, capture_output=True,
    )  # fmt: skip
    encrypted.chmod(0o600)
    encrypted.replace(key)
    assert key.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
