"""Certificate files as operators hand them over, against a real cloud and the real `amc`
command: a `ca.pem` with two CAs (rotating the fleet CA as docs/deployment.md says), a key that
is not the certificate's, a key in the traditional (PKCS#1 / SEC 1) form."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from pydantic import SecretStr

from cloud import cert_validity, pki
from cloud.server import build_server
from cloud.settings import CloudSettings, SettingError
from console import exit_codes
from console.gateway import create_app
from console.settings import ConsoleSettings
from tests.console.test_cli import amc, cli_cloud
from tests.support.bad_certs import under_an_empty_passphrase


def _folder(into: Path, ca_pem: bytes, certs_from: Path, *names: str) -> Path:
    """A PKI folder with `ca_pem` and the `names` (server, operator-admin) from `certs_from`."""
    into.mkdir()
    (into / "ca.pem").write_bytes(ca_pem)
    for name in names:
        for suffix in (".pem", ".key"):
            shutil.copy(certs_from / f"{name}{suffix}", into / f"{name}{suffix}")
    return into


async def test_a_ca_file_with_the_old_and_the_new_ca_accepts_certificates_of_both(
    tmp_path: Path,
) -> None:
    """Before, only the first CA of `ca.pem` was read by the checks made before a handshake:
    the replica given a server certificate from the new CA refused to start ("server
    certificate … is not signed by …/ca.pem"), and so did every operator and host with one."""
    old = pki.ensure_embedded_pki(tmp_path / "old", [], operator="admin")
    new = pki.ensure_embedded_pki(tmp_path / "new", [], operator="admin")
    both = (old / "ca.pem").read_bytes() + (new / "ca.pem").read_bytes()
    # Step 2 of the rotation: the replica has the new server certificate, operators either.
    served = _folder(tmp_path / "cloud", both, new, "server")
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            pki_dir=served,
        )
    )
    await cloud.start()
    try:
        for which, issued_by in (("old", old), ("new", new)):
            folder = _folder(tmp_path / f"ops-{which}", both, issued_by, "operator-admin")
            code, output = await amc(
                "--cloud", cloud.address, "--pki-dir", str(folder), "task", "list", "--json"
            )
            assert code == exit_codes.OK, (which, output)
    finally:
        await cloud.stop(grace=0)


async def test_an_operator_key_that_is_not_its_certificate_s_is_named(tmp_path: Path) -> None:
    """Before, gRPC logged "Invalid private key" and the CLI said "cannot reach the cloud …
    Failed to create security handshaker (is it running? …)", exit 4, with the cloud up."""
    async with cli_cloud(tmp_path) as (cloud, _):
        folder = tmp_path / "pki"
        key = folder / "operator-admin.key"
        key.write_bytes((folder / "server.key").read_bytes())
        code, output = await amc("--cloud", cloud.address, "--pki-dir", str(folder), "task", "list")
    assert code == exit_codes.CERTIFICATE, output
    assert output.startswith(
        f"amc task list: the key {key} of operator certificate {folder / 'operator-admin.pem'} "
        "is not the key of this certificate"
    ), output
    assert "is it running?" not in output


async def test_a_key_in_the_traditional_form_is_taken(tmp_path: Path) -> None:
    """`openssl ec`/`openssl rsa` write "BEGIN EC PRIVATE KEY" (SEC 1 / PKCS#1), `amc certs`
    PKCS#8: the check before the handshake reads both, as TLS does."""
    async with cli_cloud(tmp_path) as (cloud, _):
        key = tmp_path / "pki" / "operator-admin.key"
        loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
        key.write_bytes(
            loaded.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        assert key.read_bytes().startswith(b"-----BEGIN EC PRIVATE KEY-----")
        code, output = await amc(
            "--cloud", cloud.address, "--pki-dir", str(tmp_path / "pki"), "task", "list", "--json"
        )
    assert code == exit_codes.OK, output


async def test_a_cloud_whose_server_key_is_not_its_certificate_s_says_so(tmp_path: Path) -> None:
    """Before: "AMC_CLOUD_LISTEN_ADDRESS: cannot listen on 127.0.0.1:… (Failed to bind …); pick
    a free port", the port being free."""
    folder = pki.ensure_embedded_pki(tmp_path, [], operator="admin")
    (folder / "server.key").write_bytes((folder / "operator-admin.key").read_bytes())
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=folder,
    )
    with pytest.raises(SettingError) as refused:  # before too: the bind failed
        await build_server(settings)
    assert str(refused.value).startswith(
        f"AMC_CLOUD_PKI_DIR: the key {folder / 'server.key'} of server certificate "
        f"{folder / 'server.pem'} is not the key of this certificate"
    ), refused.value


def _under_a_passphrase(key: Path, passphrase: bytes) -> None:
    """`key` rewritten encrypted (PKCS#8, as `openssl pkcs8 -topk8` writes it) under
    `passphrase`."""
    loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
    key.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(passphrase),
        )
    )
    assert key.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")


async def test_an_operator_key_under_a_passphrase_is_named_with_what_to_do(tmp_path: Path) -> None:
    """gRPC hands a key's PEM reader an empty passphrase and no other. Before, a key under a
    real one passed the check before the handshake (an encrypted key was not checked at all,
    for gRPC's empty-passphrase case) and gRPC said only "Invalid private key" in its log: the
    CLI said it could not reach the cloud, exit 4, with the cloud up."""
    async with cli_cloud(tmp_path) as (cloud, _):
        folder = tmp_path / "pki"
        key = folder / "operator-admin.key"
        _under_a_passphrase(key, b"correct horse battery staple")
        code, output = await amc("--cloud", cloud.address, "--pki-dir", str(folder), "task", "list")
    assert code == exit_codes.CERTIFICATE, output
    assert output.startswith(
        f"amc task list: the key {key} of operator certificate {folder / 'operator-admin.pem'} "
        "is encrypted under a passphrase, which gRPC cannot be given: write it out without one "
        f"(`openssl pkey -in {key} -out <new file>`"
    ), output
    assert "cannot reach" not in output


def test_the_console_gateway_will_not_start_on_an_operator_key_under_a_passphrase(
    tmp_path: Path,
) -> None:
    folder = pki.ensure_embedded_pki(tmp_path, [], operator="console")
    key = folder / "operator-console.key"
    _under_a_passphrase(key, b"correct horse battery staple")
    settings = ConsoleSettings(
        certs_dir=folder, operator_name="console", admin_password=SecretStr("an admin password")
    )
    with pytest.raises(SettingError) as refused:
        create_app(settings)
    assert str(refused.value).startswith(
        f"AMC_CONSOLE_CLIENT_CERT: the key {key} of operator certificate "
        f"{folder / 'operator-console.pem'} is encrypted under a passphrase"
    ), refused.value


def test_a_key_under_an_empty_passphrase_is_still_checked_against_its_certificate(
    tmp_path: Path,
) -> None:
    """gRPC opens a PKCS#8 key under an empty passphrase (tests/host/test_host_certificates.py
    runs one through a real handshake); it is now read as gRPC reads it, so one that is
    another certificate's key is named as such rather than let through unchecked."""
    folder = pki.ensure_embedded_pki(tmp_path, [], operator="admin")
    cert, key = folder / "operator-admin.pem", folder / "operator-admin.key"
    under_an_empty_passphrase(key)
    assert cert_validity.check(cert, folder / "ca.pem", "operator certificate", key=key)
    key.write_bytes((folder / "server.key").read_bytes())
    under_an_empty_passphrase(key)
    with pytest.raises(cert_validity.CertificateInvalid) as refused:
        cert_validity.check(cert, folder / "ca.pem", "operator certificate", key=key)
    assert str(refused.value) == (
        f"the key {key} of operator certificate {cert} is not the key of this certificate "
        "(it belongs to another one)"
    )
