"""Rotating the fleet CA as docs/deployment.md says: every `ca.pem` holds the old and the new CA
while certificates are reissued, and a real cloud and the real `amc` command take either."""

from __future__ import annotations

import shutil
from pathlib import Path

from cloud import pki
from cloud.server import build_server
from cloud.settings import CloudSettings
from console import exit_codes
from tests.console.test_cli import amc


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
