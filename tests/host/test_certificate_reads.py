"""A host whose certificate files hang on the disk when it connects: the read is off the event
loop, bounded, said and tried again. The host is the runner's (`build_host`), its lease stream
over mTLS to the in-test LeaseService (lease_fake.py), its phones virtual."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from cloud import cert_validity
from cloud.cert_validity import when
from cloud.pki import ensure_embedded_pki
from host import cloud_channel, runner
from host.runner import build_host, start_virtual_phones
from host.settings import HostSettings
from tests.host.lease_fake import host_settings, start_fake_cloud
from tests.host.scripted_planner import ScriptedPlanner
from tests.support.bad_certs import expired, flawed_copy
from tests.support.waiting import until

HOST_ID = "h1"


async def test_a_certificate_read_that_hangs_holds_nothing_up_and_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease client read the certificate files on the event loop at each connection: a
    certs folder on a disk that hangs (a dead NFS mount) stopped the whole host, every other
    phone's attempt, the outbox and the console with it. Now the read runs in a thread of its
    own for at most `CERT_READ_S`; one that does not return is the lease client's last error
    and the connection is tried again, which waits on that same read (one thread, not one
    per attempt: the next test) and connects once it returns. The hang is a read of the key
    file that waits until the test lets it go (bounded, so that a loop it held ends the
    test); the files, the TLS handshake and the lease stream are real."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        host_settings(tmp_path, cloud.port, cloud.pki_dir, HOST_ID).model_copy(
            update={"planner_transport": "direct"}
        )
    )
    monkeypatch.setattr(cloud_channel, "CERT_READ_S", 0.5, raising=False)
    release, hung = threading.Event(), threading.Event()
    freed: list[bool] = []  # whether the hung read was let go by the test (the loop was free)
    read = cloud_channel._read

    def hangs_once(path: Path | None, what: str) -> bytes:
        if what == "client key" and not hung.is_set():
            hung.set()
            freed.append(release.wait(10))
        return read(path, what)

    monkeypatch.setattr(cloud_channel, "_read", hangs_once)
    app = build_host(settings, planner=ScriptedPlanner([]))
    stop = asyncio.Event()
    running = asyncio.create_task(app.lease.run(stop))
    try:
        await until(
            lambda: "did not return within 0.5 s" in (app.lease.last_error or ""),
            20,
            "the hung read told",
        )
        assert not freed  # the loop ran while the read hung
        release.set()
        await asyncio.wait_for(app.lease.wait_connected(), 20)  # the read returned: connected
    finally:
        release.set()
        stop.set()
        await running
        app.close()
        virtual.stop()
        await cloud.server.stop(None)
    assert freed == [True]


async def test_a_refused_handshake_names_the_certificate_the_host_read_without_the_disk(
    tmp_path: Path,
) -> None:
    """A call ending UNAVAILABLE had `failure` read the certificate files again, on the event
    loop, to tell whether the cloud refused an expired certificate: on a disk that hangs, each
    failed call of the outbox or the planner stalled the host. It now checks what the host
    read when it opened its channels (the certificate they present). Here the certs folder is
    gone by then (its disk unmounted): the expired certificate is still named."""
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    short = tmp_path / "pki_short"
    cert = flawed_copy(pki, f"host-{HOST_ID}", "expires_in_seconds", short)
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    settings = HostSettings(
        cloud_address="127.0.0.1:1", certs_dir=short, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    cloud_channel.credentials(settings)  # a channel opened while it was valid
    await until(lambda: expired(end), 30, "the host certificate expired")
    shutil.rmtree(short)
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "Socket closed"
    )
    assert cloud_channel.failure(error, settings) == (
        f"host certificate {cert} expired {when(end)} (the cloud refuses it)"
    )


async def test_the_outbox_and_planner_channels_read_their_certificates_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease stream read its certificate files off the event loop, but the outbox's channel
    and the planner's (cloud transport) were still opened with a blocking read on it, once at
    start (`build_host`, the sender's `run`): a certs folder on a disk that hangs stalled the
    whole host there. Now they open through the same bounded read (`ChannelOnce`,
    `read_credentials`). Here the first read of the key hangs until the test, on the loop,
    lets it go (bounded: a loop it held ends the test); no read runs on the loop's thread."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        host_settings(tmp_path, cloud.port, cloud.pki_dir, HOST_ID).model_copy(
            update={"planner_transport": "cloud"}
        )
    )
    loop_thread = threading.get_ident()
    release, hung = threading.Event(), threading.Event()
    freed: list[bool] = []
    on_loop: list[str] = []
    read = cloud_channel._read

    def hangs_once(path: Path | None, what: str) -> bytes:
        if threading.get_ident() == loop_thread:
            on_loop.append(what)
        if what == "client key" and not hung.is_set():
            hung.set()
            freed.append(release.wait(10))
        return read(path, what)

    monkeypatch.setattr(cloud_channel, "_read", hangs_once)
    app = build_host(settings)
    assert app.outbox_sender is not None and app.planner_channel is not None
    stop = asyncio.Event()
    sending = asyncio.create_task(app.outbox_sender.run(stop))
    try:
        await until(hung.is_set, 20, "the key read hung")
        release.set()
        planner = await asyncio.wait_for(app.planner_channel.get(), 20)
        await planner.channel_ready()  # a real handshake with the files read
    finally:
        release.set()
        stop.set()
        await sending
        await app.planner_channel.close()
        app.close()
        virtual.stop()
        await cloud.server.stop(None)
    assert freed == [True]
    assert on_loop == []


async def test_reconnects_while_the_certificate_read_hangs_wait_on_the_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each connection attempt read the certificate files in a thread of its own: while the
    disk hung, every reconnect (each 0.05 to 0.2 s here) left one more thread blocked on it.
    Now an attempt waits on the read in flight (`_read_once`): one thread, however many
    attempts; once the disk answers, the host connects."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    virtual, settings = start_virtual_phones(
        host_settings(tmp_path, cloud.port, cloud.pki_dir, HOST_ID).model_copy(
            update={"planner_transport": "direct"}
        )
    )
    monkeypatch.setattr(cloud_channel, "CERT_READ_S", 0.2, raising=False)
    release = threading.Event()
    started: list[bool] = []  # one per read of the key that began while the disk hung
    read = cloud_channel._read

    def hangs(path: Path | None, what: str) -> bytes:
        if what == "client key" and not release.is_set():
            started.append(True)
            release.wait(20)
        return read(path, what)

    attempts: list[int] = []
    read_issued = cloud_channel.read_issued

    async def counted(settings: HostSettings) -> cloud_channel.Issued:
        attempts.append(1)  # the lease stream's connection attempts (`LeaseDialer`)
        return await read_issued(settings)

    monkeypatch.setattr(cloud_channel, "_read", hangs)
    monkeypatch.setattr(cloud_channel, "read_issued", counted)
    app = build_host(settings, planner=ScriptedPlanner([]))
    stop = asyncio.Event()
    running = asyncio.create_task(app.lease.run(stop))
    try:
        await until(lambda: len(attempts) >= 4, 30, "four connection attempts")
        reading = [t for t in threading.enumerate() if t.name == "certificate-read"]
        assert len(started) == 1 and len(reading) == 1, (started, reading)
        release.set()
        await asyncio.wait_for(app.lease.wait_connected(), 20)
    finally:
        release.set()
        stop.set()
        await running
        app.close()
        virtual.stop()
        await cloud.server.stop(None)


async def test_the_start_banner_reads_no_certificate_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The banner's "valid until" read the certificate files again, on the event loop, after
    the start had read them off it (`_open_data`): a certs folder on a disk that hangs stalled
    the host at its banner. It now shows the date the start read."""
    cloud = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    settings = host_settings(tmp_path, cloud.port, cloud.pki_dir, HOST_ID).model_copy(
        update={"planner_transport": "direct"}
    )
    loop_thread = threading.get_ident()
    on_loop: list[Path] = []
    check = cert_validity.check

    def recorded(cert: Path, *args: Any, **kwargs: Any) -> cert_validity.Validity:
        if threading.get_ident() == loop_thread:
            on_loop.append(cert)
        return check(cert, *args, **kwargs)

    monkeypatch.setattr(cert_validity, "check", recorded)
    banner: list[str] = []
    stop = asyncio.Event()

    def say(line: str) -> None:
        banner.append(line)
        stop.set()  # the banner said: enough

    try:
        await asyncio.wait_for(
            runner.run_host(settings, stop, planner=ScriptedPlanner([]), say=say), 60
        )
    finally:
        await cloud.server.stop(None)
    cert = cloud.pki_dir / f"host-{HOST_ID}.pem"
    until = when(x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc)
    assert any(f"certificate {cert} (valid until {until})" in line for line in banner), banner
    assert on_loop == []
