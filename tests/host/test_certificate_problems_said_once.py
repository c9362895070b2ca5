"""Problems with the host's certificate files said once per problem, not at every try: by the
outbox (its channel cannot be opened), and by the lease stream when the files hang on their
disk or cannot be read (docs/deployment.md, "Certificates and rotation"; host.js alike:
tests/node/test_node_host_certificate_files.py).

Real parts: certificate files issued by the fleet CA (`cloud.pki`), checked by the real checker
(`cloud.cert_validity`); the outbox's real store and sender; the runner's host against the
in-test LeaseService of lease_fake.py over mTLS.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import shutil
import threading
from pathlib import Path

import pytest

from cloud import cert_validity, pki
from host import cloud_channel
from host.metrics import REGISTRY
from host.outbox import OutboxSender, OutboxStore
from host.outbox.kinds import DECISION
from tests.host.test_certificate_rotation import _host_against_cloud
from tests.support.bad_certs import flawed_copy
from tests.support.waiting import until

HOST_ID = "h1"


def _lines(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


async def test_the_outbox_says_a_not_yet_valid_certificate_once_as_its_clock_moves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The outbox's warning that its channel cannot be opened was said again whenever its words
    changed, and the words of a certificate not valid yet hold this machine's clock ("this
    machine's clock says …", to the minute): the same problem was said about once a minute.
    It is keyed by the problem's kind and file now. Each try of the channel here checks the
    files as the host does, its clock a minute later than the last try's."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "not_yet_valid", tmp_path / "early")
    ca = cert.parent / "ca.pem"
    start = dt.datetime.now(dt.UTC)
    tries: list[str] = []

    def channel() -> object:
        """The files checked at a clock one minute on per try (raises: never a channel)."""
        now = start + dt.timedelta(minutes=len(tries))
        tries.append(cert_validity.when(now))
        cert_validity.check_read(
            cert.read_bytes(), ca.read_bytes(), cert, ca, "host certificate", now
        )
        raise AssertionError("a certificate not valid yet was taken")

    store = OutboxStore(tmp_path / "outbox.sqlite3")
    store.put(DECISION, "d1", b"kept")
    sender = OutboxSender(store, channel, initial_s=0.01, max_s=0.02)
    caplog.set_level(logging.WARNING, logger="host.outbox.sender")
    stop = asyncio.Event()
    running = asyncio.create_task(sender.run(stop))
    try:
        await until(lambda: len(tries) >= 5 or running.done(), 30, "five tries")
    finally:
        stop.set()
        await asyncio.wait([running])
        store.close()
    assert sender.last_error is not None and "is not valid before" in sender.last_error
    said = _lines(caplog, "no channel to the cloud yet")
    assert len(said) == 1, said
    assert f"host certificate {cert} is not valid before" in said[0], said


async def test_the_outbox_says_another_problem_of_the_files_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Keyed by kind and file, a problem that changes is still said: the certificate not valid
    yet is replaced by an expired one, which is said too (once)."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    early = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "not_yet_valid", tmp_path / "e")
    late = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "expired", tmp_path / "x")
    tries: list[Path] = []

    def channel() -> object:
        cert = early if len(tries) < 3 else late
        tries.append(cert)
        ca = cert.parent / "ca.pem"
        cert_validity.check_read(cert.read_bytes(), ca.read_bytes(), cert, ca, "host certificate")
        raise AssertionError("a refused certificate was taken")

    store = OutboxStore(tmp_path / "outbox.sqlite3")
    sender = OutboxSender(store, channel, initial_s=0.01, max_s=0.02)
    caplog.set_level(logging.WARNING, logger="host.outbox.sender")
    stop = asyncio.Event()
    running = asyncio.create_task(sender.run(stop))
    try:
        await until(lambda: len(tries) >= 6 or running.done(), 30, "six tries")
    finally:
        stop.set()
        await asyncio.wait([running])
        store.close()
    said = _lines(caplog, "no channel to the cloud yet")
    assert len(said) == 2, said
    assert "is not valid before" in said[0] and f"host certificate {late} expired" in said[1]


def _reconnects() -> float:
    """The lease stream's attempts after a failure so far (`amc_host_lease_reconnects`)."""
    return REGISTRY.get_sample_value("amc_host_lease_reconnects_total") or 0.0


async def test_certificate_files_that_hang_are_said_once_and_their_recovery_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The host connected, then its certs folder's disk hangs (a dead NFS mount) and its stream
    is lost: each connection attempt said "lease stream lost: reading the host certificate
    files (…) did not return within …", every few seconds for as long as the disk hung. It is
    said once now, as the other problems with the files are, and so is the connection once
    the disk answers. The hang: the files' look (`_stamp`) waits until the test lets it go."""
    caplog.set_level(logging.WARNING, logger="host.lease_client")
    monkeypatch.setattr(cloud_channel, "CERT_READ_S", 0.2, raising=False)
    release = threading.Event()
    stamp = cloud_channel._stamp

    def hangs(paths: cloud_channel._FilesKey) -> tuple[tuple[int, int, int], ...]:
        release.wait(20)
        return stamp(paths)

    async with _host_against_cloud(tmp_path) as rig:
        monkeypatch.setattr(cloud_channel, "_stamp", hangs)
        tried = _reconnects()
        rig.cloud.cut()  # the stream is lost: the host reconnects, its files hung
        try:
            await until(
                lambda: _reconnects() >= tried + 4 or rig.served.done(), 30, "four attempts"
            )
        finally:
            release.set()
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2 or rig.served.done(), 30)
        await until(lambda: rig.app.lease.connected or rig.served.done(), 30, "the welcome")
        assert not rig.served.done(), rig.served.exception()
    hung = "did not return within 0.2 s: the disk hangs"
    assert not [line for line in _lines(caplog, "lease stream lost") if hung in line]
    said = _lines(caplog, "not connecting")
    assert len(said) == 1, said
    assert said[0].startswith("not connecting: reading the host certificate files"), said
    assert f"{hung}; reconnecting in" in said[0], said
    [back] = _lines(caplog, "connected to the cloud again")
    assert back.startswith(
        "connected to the cloud again: the certificate files could be read (reading them hung: "
        f"reading the host certificate files ({rig.cert.parent})"
    ), back


async def test_certificate_files_that_hang_at_the_first_start_are_not_said_as_regained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The certs folder's disk hangs when the host first starts, then answers: its first ever
    welcome was said "connected to the cloud again: the certificate files can be used (they
    could not: … the disk hangs)", a connection it never had, and files that could not be
    read said to be files the cloud would have refused. It says it connected, and that the
    files could be read."""
    caplog.set_level(logging.WARNING, logger="host.lease_client")
    monkeypatch.setattr(cloud_channel, "CERT_READ_S", 0.2, raising=False)
    release = threading.Event()
    stamp = cloud_channel._stamp

    def hangs(paths: cloud_channel._FilesKey) -> tuple[tuple[int, int, int], ...]:
        release.wait(20)
        return stamp(paths)

    monkeypatch.setattr(cloud_channel, "_stamp", hangs)
    tried = _reconnects()

    async def answers_after_two_attempts() -> None:
        await until(lambda: _reconnects() >= tried + 2, 30, "two attempts")
        release.set()

    letting_go = asyncio.create_task(answers_after_two_attempts())
    try:
        async with _host_against_cloud(tmp_path) as rig:
            assert rig.app.lease.connects == 1  # its first welcome
    finally:
        release.set()
        await letting_go
    assert not _lines(caplog, "connected to the cloud again")
    [back] = _lines(caplog, "connected to the cloud: ")
    assert back.startswith(
        "connected to the cloud: the certificate files could be read (reading them hung: "
        f"reading the host certificate files ({rig.cert.parent})"
    ), back
    assert back.endswith("the disk hangs)"), back


async def test_a_certificate_file_that_cannot_be_read_is_said_once_and_its_recovery_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The host's key cannot be read after it connected (an I/O error; here a link to
    /proc/self/mem, whose read fails with EIO): each attempt said "lease stream lost: [Errno 5]
    Input/output error: …". Said once now, naming the file, and the connection once the file
    can be read again."""
    caplog.set_level(logging.WARNING, logger="host.lease_client")
    async with _host_against_cloud(tmp_path) as rig:
        key = rig.cert.with_suffix(".key")
        good = shutil.copy2(key, tmp_path / "good.key")
        key.unlink()
        key.symlink_to("/proc/self/mem")
        tried = _reconnects()
        rig.cloud.cut()  # the stream is lost: the host reconnects, and cannot read its key
        await until(lambda: _reconnects() >= tried + 4 or rig.served.done(), 30, "four attempts")
        os.replace(good, key)  # readable again
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2 or rig.served.done(), 30)
        await until(lambda: rig.app.lease.connected or rig.served.done(), 30, "the welcome")
        assert not rig.served.done(), rig.served.exception()
    assert not _lines(caplog, "lease stream lost: [Errno"), caplog.text
    said = _lines(caplog, "not connecting")
    assert len(said) == 1, said
    assert said[0].startswith(f"not connecting: client key {key} cannot be read ("), said
    assert "; reconnecting in" in said[0], said
    [back] = _lines(caplog, "connected to the cloud again")
    assert back.startswith(
        "connected to the cloud again: the certificate files could be read (reading them "
        f"failed: client key {key} cannot be read ("
    ), back
