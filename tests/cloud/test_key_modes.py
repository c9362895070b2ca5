"""A private key file that others on the machine can read is warned about once, naming the file,
its mode and the `chmod 600` that fixes it (`cloud/key_files.py`): by a starting cloud (its
server key, the CA key beside it), a host (its key) and `amc certs` (the CA key it signs with).
Before, such keys were used without a word. Real files, a real cloud start, the real CLI."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from cloud.pki import ensure_embedded_pki
from cloud.server import build_server
from cloud.settings import CloudSettings
from host.cloud_channel import check_certificate
from host.settings import HostSettings
from tests.support.processes import AMC, _clean_env

HOST_ID = "h1"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _said(key: Path, mode: str, who: str) -> str:
    return (
        f"the private key {key} can be read by {who} (mode {mode}): whoever reads it can act as "
        f"its certificate's owner; run `chmod 600 {key}`"
    )


async def test_a_starting_cloud_warns_once_about_its_keys_others_can_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Said, not refused: the cloud starts (and a second start in the process says nothing
    again). The host key, owner-only as `amc certs` writes it, is not named."""
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    (pki / "server.key").chmod(0o644)
    (pki / "ca.key").chmod(0o640)
    caplog.set_level(logging.WARNING)
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki,
    )
    for _ in range(2):
        cloud = await build_server(settings)
        await cloud.start()
        await cloud.stop(grace=0)
    said = [w for w in _warnings(caplog) if "private key" in w]
    assert said == [
        _said(pki / "server.key", "0644", "its group and everyone"),
        _said(pki / "ca.key", "0640", "its group"),
    ], said


def test_a_host_warns_once_about_a_key_others_can_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The host checks its certificate at start and at each connection attempt: said once."""
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    key = pki / f"host-{HOST_ID}.key"
    key.chmod(0o604)
    settings = HostSettings(
        cloud_address="127.0.0.1:1", certs_dir=pki, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        assert check_certificate(settings) is not None
    assert _warnings(caplog) == [_said(key, "0604", "everyone")]


def test_amc_certs_warns_about_a_ca_key_others_can_read(tmp_path: Path) -> None:
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    (pki / "ca.key").chmod(0o644)
    done = subprocess.run(
        [AMC, "certs", "host", str(pki), "h2"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _said(pki / "ca.key", "0644", "its group and everyone") in done.stderr, done.stderr
    assert (pki / "host-h2.pem").is_file()
