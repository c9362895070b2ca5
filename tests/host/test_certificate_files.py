"""What the host says of its certificate files as it reads them (`host.cloud_channel.issued`,
at each connection, and `check_certificate`, at start): the problem an operator has to fix
first, and a wait only where one can help.

Real parts: certificate files issued by the fleet CA (`cloud.pki`, `tests/support/bad_certs`)
in a temporary folder, read by the host's own readers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud import cert_validity, pki
from cloud.cert_validity import CertificateInvalid
from host import cloud_channel
from host.settings import HostSettings

HOST_ID = "h1"


def _settings(pki_dir: Path, tmp_path: Path) -> HostSettings:
    return HostSettings(certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h")


def test_only_a_key_issued_with_another_certificate_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both readers told a key issued with another certificate (a pair caught between the
    renames of `amc certs`) by the start of the message, "the key …": a file that is no key at
    all matched as well, and was waited on (`PAIR_SETTLE_S`) though the rest of a pair being
    issued cannot mend it. The mismatch is its own class now, and only it is read again."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID, "h2"])
    pki_dir = tmp_path / "pki"
    key = pki_dir / pki.host_files(HOST_ID)[1]
    settings = _settings(pki_dir, tmp_path)
    waits: list[bool] = []
    monkeypatch.setattr(cloud_channel, "_pair_settles", lambda: waits.append(True))
    readers = (cloud_channel.check_certificate, cloud_channel.issued)
    key.write_bytes(b"not a key\n")
    refusals = []
    for read in readers:
        with pytest.raises(CertificateInvalid, match="is not a PEM private key") as refused:
            read(settings)
        refusals.append(refused.value)
    assert waits == []
    assert not any(isinstance(r, cert_validity.KeyNotTheCertificate) for r in refusals)
    key.write_bytes((pki_dir / pki.host_files("h2")[1]).read_bytes())  # another one's key
    for read in readers:
        with pytest.raises(cert_validity.KeyNotTheCertificate, match=f"the key {key} of"):
            read(settings)
    assert waits == [True, True]
