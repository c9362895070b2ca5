"""Certificates carry identity in SAN URIs; the embedded PKI is made once and kept."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509

from cloud import pki
from cloud.identity import Caller, caller_from_auth_context, caller_from_uri


def test_identities_in_certificates(tmp_path: Path) -> None:
    pki.init_ca(tmp_path)
    host_pem = pki.write_host_cert(tmp_path, "h1").read_bytes()
    op_pem = pki.write_operator_cert(tmp_path, "alice").read_bytes()
    assert pki.uri_sans(host_pem) == ["amc://host/h1"]
    assert caller_from_auth_context({"x509_pem_cert": [host_pem]}) == Caller("host", "h1")
    assert caller_from_auth_context({"x509_pem_cert": [op_pem]}) == Caller("operator", "alice")
    viewer_pem = pki.write_viewer_cert(tmp_path, "dana").read_bytes()
    assert pki.uri_sans(viewer_pem) == ["amc://viewer/dana"]
    assert caller_from_auth_context({"x509_pem_cert": [viewer_pem]}) == Caller("viewer", "dana")
    assert caller_from_auth_context({}) is None
    assert (tmp_path / "host-h1.key").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("key", ["ca.key", "server.key", "host-h1.key", "operator-alice.key"])
def test_a_key_issued_again_is_owner_only_whatever_the_old_file_allowed(
    tmp_path: Path, key: str
) -> None:
    pki.init_ca(tmp_path)

    def issue() -> None:
        if key == "ca.key":
            pki.init_ca(tmp_path, overwrite=True)
        elif key == "server.key":
            pki.write_server_cert(tmp_path)
        elif key == "host-h1.key":
            pki.write_host_cert(tmp_path, "h1")
        else:
            pki.write_operator_cert(tmp_path, "alice")

    issue()
    old = (tmp_path / key).read_bytes()
    (tmp_path / key).chmod(0o644)  # left readable by all (a copy, a chmod for a service)
    issue()
    assert (tmp_path / key).read_bytes() != old  # a new key, in the same file
    assert (tmp_path / key).stat().st_mode & 0o777 == 0o600


def test_server_certificate_names(tmp_path: Path) -> None:
    pki.init_ca(tmp_path)
    pki.write_server_cert(tmp_path, ["cloud.example.net", "10.0.0.5"])
    cert = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "cloud.example.net"}
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.0.0.5",
    }


def test_names_are_validated() -> None:
    with pytest.raises(ValueError, match="host id"):
        pki.create_host_cert(pki.create_ca(), "../etc")
    assert caller_from_uri("amc://host/../x") is None
    assert caller_from_uri("spiffe://host/x") is None
    assert caller_from_uri("amc://viewer/../x") is None
    with pytest.raises(ValueError, match="viewer name"):
        pki.create_viewer_cert(pki.create_ca(), "a/b")


def test_embedded_pki_is_made_once(tmp_path: Path) -> None:
    d = pki.ensure_embedded_pki(tmp_path, ["h1"], "local")
    names = {p.name for p in d.iterdir()}
    assert {"ca.pem", "ca.key", "server.pem", "server.key", "host-h1.pem"} <= names
    assert "operator-local.pem" in names
    ca_before = (d / "ca.pem").read_bytes()
    host_before = (d / "host-h1.pem").read_bytes()
    again = pki.ensure_embedded_pki(tmp_path, ["h1", "h2"], "local")
    assert again == d
    assert (d / "ca.pem").read_bytes() == ca_before
    assert (d / "host-h1.pem").read_bytes() == host_before
    assert (d / "host-h2.pem").exists()


def test_a_symlink_planted_at_the_temporary_name_does_not_receive_the_key(
    tmp_path: Path,
) -> None:
    """The pair was written to temporary files of predictable names (`.NAME.PID.tmp`), opened
    with O_CREAT and without O_EXCL: a symlink planted at the key's name received the new
    private key wherever it pointed. The names are now random, made with O_EXCL."""
    pki_dir = tmp_path / "pki"
    pki.ensure_embedded_pki(tmp_path, ["h1"])
    stolen = tmp_path / "stolen"
    for name in pki.host_files("h1"):
        (pki_dir / f".{name}.{os.getpid()}.tmp").symlink_to(stolen)
    pki.write_host_cert(pki_dir, "h1")
    assert not stolen.exists()
    leftovers = {p.name for p in pki_dir.iterdir() if p.name.endswith(".tmp")}
    assert leftovers == {f".{name}.{os.getpid()}.tmp" for name in pki.host_files("h1")}


def test_a_temporary_file_a_dead_writer_left_is_removed_at_the_next_write(
    tmp_path: Path,
) -> None:
    """A writer that died between its write and its rename (a crash, a kill) left its
    temporary file (a whole copy of the key) beside the key for good. The next write deletes
    those of pids no longer running written more than `STALE_TEMP_S` ago; a writer's still
    running keeps its own, and so does one whose pid is not seen here (another pid namespace,
    another machine on an NFS folder: it was deleted mid-write) while it is recent."""
    pki_dir = tmp_path / "pki"
    pki.ensure_embedded_pki(tmp_path, ["h1"])
    dead = subprocess.Popen(["true"])  # its pid no longer runs once it ended
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        key, cert = (pki_dir / name for name in pki.host_files("h1")[::-1])
        left = [
            pki_dir / f".{key.name}.{dead.pid}.k3y9x0aq.tmp",
            pki_dir / f".{cert.name}.{dead.pid}.tmp",  # as older versions named it
        ]
        running = pki_dir / f".{key.name}.{alive.pid}.q8w7e6r5.tmp"
        unseen = pki_dir / f".{cert.name}.{dead.pid}.u5n1s2e3.tmp"  # a writer's elsewhere
        old = time.time() - pki.STALE_TEMP_S - 60
        for path in (*left, running, unseen):
            path.write_bytes(key.read_bytes())
        for path in (*left, running):
            os.utime(path, (old, old))
        pki.write_host_cert(pki_dir, "h1")
        leftovers = {p.name for p in pki_dir.iterdir() if p.name.endswith(".tmp")}
    finally:
        alive.kill()
        alive.wait()
    assert leftovers == {running.name, unseen.name}


NOBODY = 65534
_ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (as `amc certs` run by ops)")


def _linked_key(tmp_path: Path) -> tuple[Path, Path]:
    """h1's key in `pki/` made a symlink to `shared/k`, an existing file: (link, target)."""
    pki.ensure_embedded_pki(tmp_path, ["h1"])
    link = tmp_path / "pki" / pki.host_files("h1")[1]
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    target = shared / "k"
    target.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")  # stands for /etc/passwd
    link.unlink()
    link.symlink_to(target)
    return link, target


@pytest.mark.parametrize(
    ("whose", "why"),
    [
        pytest.param("link", "the link is owned by uid 65534", marks=_ROOT_ONLY),
        pytest.param("folder", "is owned by uid 65534", marks=_ROOT_ONLY),
        ("writable", "is writable by group or others"),
    ],
)
def test_a_link_someone_else_controls_is_not_written_through(
    tmp_path: Path, whose: str, why: str
) -> None:
    """`amc certs` run as root wrote through any symlink at a certificate's or key's name:
    one planted by whoever could write the certificates folder (`host-h1.pem -> /etc/passwd`)
    had root overwrite that file, and one into another user's folder handed them the new key.
    A link is written through only when root or this user owns it and the folder it points
    into, which no one else may write; else nothing is written, and the refusal names the
    link and why."""
    link, target = _linked_key(tmp_path)
    if whose == "link":
        os.lchown(link, NOBODY, NOBODY)  # planted by another user
    elif whose == "folder":
        os.chown(target.parent, NOBODY, NOBODY)
    else:
        target.parent.chmod(0o777)
    with pytest.raises(pki.UnsafeLink) as refused:
        pki.write_host_cert(tmp_path / "pki", "h1")
    assert str(link) in str(refused.value) and why in str(refused.value)
    assert target.read_bytes().startswith(b"root:x:")
    assert link.is_symlink()


@_ROOT_ONLY
def test_a_file_reached_through_a_link_is_not_given_its_owner(tmp_path: Path) -> None:
    """Run as root, the new file took the owner of the file it replaced (a service account
    keeps reading its key), also one reached through a link: a file another user put at the
    link's target had the new private key chowned to them. Through a link it is root's."""
    link, target = _linked_key(tmp_path)
    os.chown(target, NOBODY, NOBODY)
    pki.write_host_cert(tmp_path / "pki", "h1")
    assert link.is_symlink()
    assert b"PRIVATE KEY" in target.read_bytes()
    assert target.stat().st_uid == 0
    assert target.stat().st_mode & 0o077 == 0
