"""What the host says of its certificate files as it reads them (`host.cloud_channel.issued`,
at each connection, and `check_certificate`, at start): the problem an operator has to fix
first, and a wait only where one can help.

Real parts: certificate files issued by the fleet CA (`cloud.pki`, `tests/support/bad_certs`)
in a temporary folder, read by the host's own readers.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography import x509

from cloud import cert_validity, pki
from cloud.cert_validity import CertificateInvalid
from console import exit_codes
from console.cli_errors import explain
from host import cloud_channel
from host.settings import HostSettings
from tests.support.bad_certs import Flaw, expired, flawed_copy
from tests.support.waiting import until

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


@pytest.mark.parametrize("flaw", ["expired", "other_ca"])
def test_a_missing_key_beside_a_refused_certificate_names_the_certificate(
    tmp_path: Path, flaw: Flaw
) -> None:
    """The files were all read before any was checked: a key missing beside an expired
    certificate (or one another CA signed) was reported as CertificateMissing, "client key …
    does not exist", and an operator who put the key back learned only then that the
    certificate had to be issued again, which writes a new key too. The certificate's own
    problem is said first now, as `amc host run` says it at start (`check_certificate`)."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    flawed = tmp_path / "flawed"
    cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", flaw, flawed)
    (flawed / pki.host_files(HOST_ID)[1]).unlink()
    settings = _settings(flawed, tmp_path)
    said = "expired" if flaw == "expired" else "is not signed by"
    with pytest.raises(CertificateInvalid, match=f"^host certificate {cert} {said}"):
        cloud_channel.check_certificate(settings)
    with pytest.raises(CertificateInvalid, match=f"^host certificate {cert} {said}"):
        cloud_channel.issued(settings)


async def test_a_host_whose_own_certificate_expired_stops_rather_than_become_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once connected as h1, files naming h2 are refused at every read: the host keeps the
    certificate it connected with while the cloud would take it; once that expired there is
    none of its own left, and it stops (`AnotherHostsCertificate`, exit 4) naming both hosts
    and the file, rather than connect as h2."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID, "h2"])
    certs = tmp_path / "short"
    soon = dt.timedelta(seconds=10)  # the time to read and dial it, on a busy machine too
    cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "expires_in_seconds", certs, soon)
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    first = pki.serial_hex(cert.read_bytes())
    dialer = cloud_channel.LeaseDialer(_settings(certs, tmp_path))
    await (await dialer()).close()
    dialer.welcomed()  # the cloud welcomed this host as h1
    for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
        os.replace(certs / theirs, certs / mine)
    other = pki.serial_hex(cert.read_bytes())
    await (await dialer()).close()
    assert dialer.made_from is not None and dialer.made_from.serial == first
    assert f"another host's certificate (h2, serial {other}, in {cert};" in caplog.text
    await until(lambda: expired(end), 30, "the host certificate expired")
    with pytest.raises(cloud_channel.AnotherHostsCertificate) as stopped:
        await dialer()
    said = str(stopped.value)
    assert said.startswith(
        f"the host certificate files now hold another host's certificate (h2, serial {other}, "
        f"in {cert}; this host connected as {HOST_ID}), and its own certificate (serial "
        f"{first}) cannot be used any more: host certificate {cert} expired"
    ), said
    explained = explain(stopped.value)
    assert explained is not None and explained.code == exit_codes.CLOUD
