"""The fleet's certificates: one CA, a server certificate, host, operator and viewer client
certificates.

Identity lives in the certificate, never in a message field: a host certificate carries the SAN URI
`amc://host/<id>`, an operator certificate `amc://operator/<name>`, a viewer certificate (an
operator who may only read, `cloud.authz`) `amc://viewer/<name>`. File names in a PKI directory
are fixed (`ca.pem`, `server.pem`, `server.key`, `host-<id>.pem`, ...) so every part of the system
finds them without configuration.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cloud.key_files import warn_if_readable

HOST_URI_PREFIX = "amc://host/"
OPERATOR_URI_PREFIX = "amc://operator/"
VIEWER_URI_PREFIX = "amc://viewer/"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
SERVER_CERT_FILE = "server.pem"
SERVER_KEY_FILE = "server.key"


def host_files(host_id: str) -> tuple[str, str]:
    """(certificate, key) file names of a host."""
    return f"host-{host_id}.pem", f"host-{host_id}.key"


def operator_files(name: str) -> tuple[str, str]:
    """(certificate, key) file names of an operator."""
    return f"operator-{name}.pem", f"operator-{name}.key"


def viewer_files(name: str) -> tuple[str, str]:
    """(certificate, key) file names of a viewer."""
    return f"viewer-{name}.pem", f"viewer-{name}.key"


def validate_name(name: str, what: str) -> str:
    """Host ids and operator names end up in URIs and file names, so they are kept plain."""
    if not _NAME_RE.match(name):
        raise ValueError(f"{what} must match {_NAME_RE.pattern!r}, got {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class CertPair:
    """PEM bytes of a certificate and its private key."""

    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def create_ca(common_name: str = "amc fleet CA", days: int = 3650) -> CertPair:
    """A self-signed CA that signs every server and client certificate of one fleet."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _issue(
    ca: CertPair,
    common_name: str,
    sans: list[x509.GeneralName],
    usage: list[x509.ObjectIdentifier],
    days: int,
) -> CertPair:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the fleet CA key must be an EC key")
    key = _new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return CertPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def create_server_cert(
    ca: CertPair, extra_names: list[str] | None = None, days: int = 825
) -> CertPair:
    """Server certificate for `localhost` and 127.0.0.1 plus any extra DNS names or IPs."""
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    for name in extra_names or []:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    return _issue(ca, "amc cloud", sans, [ExtendedKeyUsageOID.SERVER_AUTH], days)


def create_host_cert(ca: CertPair, host_id: str, days: int = 365) -> CertPair:
    """Client certificate whose only identity is the SAN URI `amc://host/<host_id>`."""
    validate_name(host_id, "host id")
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(HOST_URI_PREFIX + host_id)]
    return _issue(ca, f"host {host_id}", sans, [ExtendedKeyUsageOID.CLIENT_AUTH], days)


def create_operator_cert(ca: CertPair, name: str, days: int = 365) -> CertPair:
    """Client certificate whose only identity is the SAN URI `amc://operator/<name>`."""
    validate_name(name, "operator name")
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(OPERATOR_URI_PREFIX + name)]
    return _issue(ca, f"operator {name}", sans, [ExtendedKeyUsageOID.CLIENT_AUTH], days)


def create_viewer_cert(ca: CertPair, name: str, days: int = 365) -> CertPair:
    """Client certificate whose only identity is the SAN URI `amc://viewer/<name>`: its own
    kind, not an operator flag, so an operator certificate issued before viewers existed keeps
    every right and a viewer's can never be read as an operator's."""
    validate_name(name, "viewer name")
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(VIEWER_URI_PREFIX + name)]
    return _issue(ca, f"viewer {name}", sans, [ExtendedKeyUsageOID.CLIENT_AUTH], days)


def _write(directory: Path, cert_name: str, key_name: str, pair: CertPair) -> None:
    """Write the pair into `directory`, each file whole into a temporary file first and then
    renamed over the old one, the key first: rewritten in place (truncated, then written), a
    host reading its files meanwhile (it reads them at each connection) could read an empty or
    half-written certificate or key, or a new certificate beside the old key, and refused to
    start (exit 5). A reader now sees either file whole, old or new; only between the two
    renames does the new key stand beside the old certificate (`host.cloud_channel` reads a
    mismatched pair once more before it refuses it).

    A file that is a symlink is written through to the file it names (`_target`): renamed
    over, the link became a regular file, and an ops team's link into a secrets mount was
    silently cut from it."""
    directory.mkdir(parents=True, exist_ok=True)
    key_path, cert_path = _target(directory / key_name), _target(directory / cert_name)
    key_linked = key_path != directory / key_name
    cert_linked = cert_path != directory / cert_name
    # Owner-only before a byte of the key is written (a new file, made 0600): the key issued
    # again over one left group- or world-readable (copied with its mode, chmod-ed for a
    # service account) is not readable by all.
    key_tmp = _written(key_path, pair.key_pem, 0o600, keep_owner=not key_linked)
    try:
        cert_tmp = _written(cert_path, pair.cert_pem, 0o644, keep_owner=not cert_linked)
    except BaseException:
        key_tmp.unlink(missing_ok=True)
        raise
    try:
        os.replace(key_tmp, key_path)
        os.replace(cert_tmp, cert_path)
    finally:  # a rename that failed leaves no temporary file behind
        key_tmp.unlink(missing_ok=True)
        cert_tmp.unlink(missing_ok=True)
    for folder in {directory, key_path.parent, cert_path.parent}:
        _sync_directory(folder)


class UnsafeLink(ValueError):
    """A certificate or key that is a symlink `amc certs` will not write through (`_target`)."""


def _target(path: Path) -> Path:
    """Where to write `path`: the file a symlink there names (through every link, relative
    ones too; it may not exist yet), else `path` itself. Only through a link that root or
    this user owns, into a folder root or this user owns that no one else can write to:
    run as root, a link planted by whoever could write the certificates folder
    (`host-h1.pem -> /etc/passwd`) had root replace any file, and one into another user's
    folder handed them the new private key. Else `UnsafeLink` (`amc certs`: exit 2)."""
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    mine = {0, os.geteuid()}
    link = path.lstat()
    try:
        folder = target.parent.stat()
    except OSError as exc:
        raise UnsafeLink(
            f"{path} is a symlink to {target}, whose folder cannot be read: {exc.strerror or exc}"
        ) from None
    why = ""
    if link.st_uid not in mine:
        why = f"the link is owned by uid {link.st_uid}"
    elif folder.st_uid not in mine:
        why = f"its folder {target.parent} is owned by uid {folder.st_uid}"
    elif folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"its folder {target.parent} is writable by group or others"
    if why:
        raise UnsafeLink(
            f"{path} is a symlink to {target} that is not written through: {why} (replace "
            "the link with a file, or link into a folder owned by root or you that only its "
            "owner can write)"
        )
    return target


#: How old (by mtime) a temporary file of a pid not running must be before `_clean_stale`
#: deletes it: a writer's pid is not seen from another pid namespace (a container) or
#: another machine (an NFS folder), and its write takes well under a second.
STALE_TEMP_S = 600.0


def _clean_stale(path: Path) -> None:
    """Delete the temporary files of `path` (`_written`: `.NAME.PID.XXXXXXXX.tmp`; older
    versions wrote `.NAME.PID.tmp`) left by writers that died between their write and their
    rename (a crash, a kill): each one left a copy of a key beside it, for good. Only those
    of pids not running here AND written more than `STALE_TEMP_S` ago: a writer under way
    (another `amc certs`) keeps its own, also one in another pid namespace or on another
    machine sharing the folder, whose pid is not seen here (deleted mid-write, its rename
    failed). A leftover younger than that is deleted by a later write."""
    prefix, suffix = f".{path.name}.", ".tmp"
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            name = entry.name
            if not (name.startswith(prefix) and name.endswith(suffix)):
                continue
            pid = name[len(prefix) : -len(suffix)].partition(".")[0]  # or `.NAME.PID.tmp`
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            if not _running(int(pid)) and _older_than(entry, STALE_TEMP_S):
                entry.unlink(missing_ok=True)


def _older_than(path: Path, seconds: float) -> bool:
    """Whether `path` was last written more than `seconds` ago (False if it cannot be told)."""
    try:
        return time.time() - path.lstat().st_mtime > seconds
    except OSError:
        return False


def _running(pid: int) -> bool:
    """Whether a process `pid` runs (one of another user's counts: it cannot be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _written(path: Path, data: bytes, mode: int, *, keep_owner: bool = True) -> Path:
    """`data` in a new file beside `path` (its mode `mode`: 0644 for a certificate, 0600
    for a key), flushed to the disk; the caller renames it over `path`. The name
    is random and made with O_EXCL (`mkstemp`, 0600 from the start): a predictable name,
    opened with O_CREAT, followed a symlink planted there and wrote the private key to where
    it pointed. It holds this process's pid (`.NAME.PID.XXXXXXXX.tmp`), so the leftovers of
    a writer that died before its rename are told from a writer's under way and deleted
    once old (`_clean_stale`). The owner and group of the file replaced are kept when run as
    root (a service account keeps reading its key), unless `keep_owner` is False: a file
    reached through a symlink (`_target`), whose owner a link's planter may have chosen
    (the new key chowned to them)."""
    _clean_stale(path)
    fd, name = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent
    )
    tmp = Path(name)
    try:
        if mode != 0o600:
            # As given: reading the umask means setting it, process-wide and not thread-safe.
            os.fchmod(fd, mode)
        if keep_owner and os.geteuid() == 0:
            with contextlib.suppress(FileNotFoundError, PermissionError):
                st = path.stat()
                os.fchown(fd, st.st_uid, st.st_gid)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _sync_directory(directory: Path) -> None:
    """The renames flushed to the disk (the directory's entries), where the platform can."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def load_ca(directory: Path) -> CertPair:
    """Read the CA (certificate and key) from a PKI directory (a CA key others can read is
    warned about: `key_files`)."""
    warn_if_readable(directory / CA_KEY_FILE)
    return CertPair((directory / CA_FILE).read_bytes(), (directory / CA_KEY_FILE).read_bytes())


def init_ca(directory: Path, *, overwrite: bool = False) -> CertPair:
    """Create the fleet CA in `directory` (keeps an existing one unless `overwrite`)."""
    if (directory / CA_FILE).exists() and (directory / CA_KEY_FILE).exists() and not overwrite:
        return load_ca(directory)
    ca = create_ca()
    _write(directory, CA_FILE, CA_KEY_FILE, ca)
    return ca


def write_server_cert(directory: Path, extra_names: list[str] | None = None) -> Path:
    """Issue `server.pem`/`server.key` from the CA in `directory`; returns the certificate path."""
    pair = create_server_cert(load_ca(directory), extra_names)
    _write(directory, SERVER_CERT_FILE, SERVER_KEY_FILE, pair)
    return directory / SERVER_CERT_FILE


def write_host_cert(directory: Path, host_id: str) -> Path:
    """Issue `host-<id>.pem`/`.key` from the CA in `directory`; returns the certificate path."""
    cert_name, key_name = host_files(host_id)
    _write(directory, cert_name, key_name, create_host_cert(load_ca(directory), host_id))
    return directory / cert_name


def write_operator_cert(directory: Path, name: str) -> Path:
    """Issue `operator-<name>.pem`/`.key` from the CA in `directory`; returns the cert path."""
    cert_name, key_name = operator_files(name)
    _write(directory, cert_name, key_name, create_operator_cert(load_ca(directory), name))
    return directory / cert_name


def write_viewer_cert(directory: Path, name: str) -> Path:
    """Issue `viewer-<name>.pem`/`.key` from the CA in `directory`; returns the cert path."""
    cert_name, key_name = viewer_files(name)
    _write(directory, cert_name, key_name, create_viewer_cert(load_ca(directory), name))
    return directory / cert_name


def ensure_embedded_pki(
    data_dir: Path,
    host_ids: list[str],
    operator: str = "local",
    extra_server_names: list[str] | None = None,
) -> Path:
    """Make (once) everything the embedded stack needs under `data_dir/pki` and return that dir.

    Existing files are kept, so restarting the embedded stack keeps its identities; missing host or
    operator certificates are added.
    """
    directory = data_dir / "pki"
    init_ca(directory)
    if not (directory / SERVER_CERT_FILE).exists():
        write_server_cert(directory, extra_server_names)
    for host_id in host_ids:
        if not (directory / host_files(host_id)[0]).exists():
            write_host_cert(directory, host_id)
    if not (directory / operator_files(operator)[0]).exists():
        write_operator_cert(directory, operator)
    return directory


def uri_sans(cert_pem: bytes) -> list[str]:
    """The URI entries of a certificate's subject alternative names."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(ext.value.get_values_for_type(x509.UniformResourceIdentifier))


def serial_hex(cert_pem: bytes) -> str:
    """A certificate's serial number as lowercase hex without leading zeros (how revocations
    name a certificate: `amc certs revoke --serial`)."""
    return format(x509.load_pem_x509_certificate(cert_pem).serial_number, "x")


def normalize_serial(text: str) -> str:
    """A serial typed by a person ("0x1A:2B", "1a2b", "01 A2") in `serial_hex`'s form."""
    cleaned = text.strip().lower().removeprefix("0x").replace(":", "").replace(" ", "")
    if not cleaned or any(c not in "0123456789abcdef" for c in cleaned):
        raise ValueError(f"a certificate serial is hexadecimal, got {text!r}")
    return format(int(cleaned, 16), "x")
