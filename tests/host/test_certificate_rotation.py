"""A host certificate issued again while the Python host runs (`amc certs host`), then the old
one revoked (docs/deployment.md, "Certificates and rotation"): the host presents the new one
without a restart, as host.js does (tests/node/test_node_host_certificates.py).

Real parts: the runner's host (`build_host`, cloud planner transport) with virtual phones, its
certificate files issued by the fleet CA (`cloud.pki`), and the in-test LeaseService of
lease_fake.py beside a PlannerService on one mTLS server, which note the serial of the client
certificate of each stream and each Decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest
from cryptography import x509

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    lease_service_pb2,
    lease_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
)
from cloud import cert_validity, pki
from cloud.identity import peer_serial
from host import cloud_channel
from host.lease_client import HostRefused
from host.outbox import OutboxSender, OutboxStore
from host.outbox.kinds import DECISION
from host.runner import HostApp, build_host, serve_host, start_virtual_phones
from host.settings import HostSettings
from tests.cloud.test_shipping import shipped
from tests.host.lease_fake import SERVER_OPTIONS, FakeCloud, host_settings
from tests.support.bad_certs import expired, flawed_copy
from tests.support.mtls import start_mtls
from tests.support.waiting import until

HOST_ID = "h1"
PHONE = "emulator-5554"
#: How the planner below ends every step: a refusal that ends the attempt (no decisions here).
BUDGET = "budget exhausted: 10,412 tokens of the task's 10,000"
PROVIDER_REFUSED = "the model provider refused the cloud's credentials"


class _Planner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Notes the certificate serial of each Decide and ends the attempt (BUDGET); a Decide
    made with the `revoked` certificate is refused as the cloud refuses every call of a
    revoked one (UNAUTHENTICATED), ending that certificate's Lease stream as the cloud does."""

    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud, self.revoked = cloud, ""
        #: A Decide made with this certificate is refused as the model provider refusing the
        #: cloud's credentials is (PERMISSION_DENIED, docs/deployment.md).
        self.denied = ""
        self.serials: list[str | None] = []
        #: Done once, while the next Decide is in flight (before it is answered): the files
        #: issued again then present the old certificate on that call, the new one after.
        self.meanwhile: Callable[[], object] | None = None

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        serial = peer_serial(context)
        self.serials.append(serial)
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        if serial == self.revoked:
            said = f"certificate revoked (serial {serial})"
            self.cloud.cut(grpc.StatusCode.UNAUTHENTICATED, said)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, said)
        if serial == self.denied:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, PROVIDER_REFUSED)
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, BUDGET)
        raise AssertionError("abort returns only by raising")


class _DecisionLog(decision_log_service_pb2_grpc.DecisionLogServiceServicer):
    """Takes every shipment, noting its certificate serial and its decisions' ids; one made
    with the `revoked` certificate is refused (UNAUTHENTICATED) as the cloud refuses it."""

    def __init__(self) -> None:
        self.serials: list[str | None] = []
        self.ids: list[str] = []
        self.revoked = ""

    async def ShipDecisions(
        self,
        request: decision_log_service_pb2.ShipDecisionsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> decision_log_service_pb2.ShipDecisionsResponse:
        serial = peer_serial(context)
        self.serials.append(serial)
        if serial == self.revoked:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"certificate revoked (serial {serial})"
            )
        self.ids += [e.host_decision_id for e in request.entries]
        return decision_log_service_pb2.ShipDecisionsResponse()


@dataclass
class _Rig:
    cloud: FakeCloud
    planner: _Planner
    log: _DecisionLog
    app: HostApp
    served: asyncio.Task[None]
    cert: Path


@contextlib.asynccontextmanager
async def _host_against_cloud(
    tmp_path: Path, certs: Callable[[Path], Path] | None = None
) -> AsyncIterator[_Rig]:
    """The host served against the in-test cloud, connected when the block starts; its
    certificate files in the fleet's folder, or in the one `certs` makes of it."""
    pki_dir = tmp_path / "pki"
    pki.ensure_embedded_pki(pki_dir.parent, [HOST_ID])
    host_certs = pki_dir if certs is None else certs(pki_dir)
    cloud = FakeCloud()
    planner = _Planner(cloud)
    log = _DecisionLog()  # type: ignore[abstract]  # serves ShipDecisions only
    server = grpc.aio.server(options=SERVER_OPTIONS)
    lease_service_pb2_grpc.add_LeaseServiceServicer_to_server(cloud, server)
    planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(planner, server)
    decision_log_service_pb2_grpc.add_DecisionLogServiceServicer_to_server(log, server)
    port = await start_mtls(server, pki_dir)
    virtual, settings = start_virtual_phones(
        host_settings(tmp_path, port, host_certs, HOST_ID).model_copy(
            update={
                "planner_transport": "cloud",
                "virtual_phones": 1,
                "planner_wait_initial_s": 0.1,
            }
        )
    )
    stop = asyncio.Event()
    app = build_host(settings)
    served = asyncio.create_task(serve_host(app, stop))
    try:
        await asyncio.wait_for(app.lease.wait_connected(), 30)
        yield _Rig(cloud, planner, log, app, served, host_certs / pki.host_files(HOST_ID)[0])
    finally:
        stop.set()
        with contextlib.suppress(HostRefused, cloud_channel.AnotherHostsCertificate):
            await served
        virtual.stop()
        await server.stop(grace=None)


async def _step_planned(rig: _Rig, task_id: str) -> None:
    """Assign `task_id` and wait for its result (its one Decide refused: BUDGET)."""
    await rig.cloud.assign(task_id, PHONE, "Turn on dark theme")
    await rig.cloud.wait_for(
        lambda: any(r.task_id == task_id for r in rig.cloud.results) or rig.served.done(), 60
    )
    assert not rig.served.done()


async def test_a_certificate_issued_again_is_presented_by_the_next_stream_and_decide(
    tmp_path: Path,
) -> None:
    """The planner's channel was opened once, at start: after the certificate was issued again
    (and the lease stream reconnected with it), every Decide still presented the old one, and
    once that was revoked every step failed until the host was restarted."""
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        await _step_planned(rig, "t1")
        pki.write_host_cert(rig.cert.parent, HOST_ID)  # as `amc certs host` issues it again
        second = pki.serial_hex(rig.cert.read_bytes())
        rig.cloud.cut()  # the stream is lost: the host reconnects
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2, 30)
        await _step_planned(rig, "t2")
    assert first != second
    assert rig.cloud.serials == [first, second]
    assert rig.planner.serials == [first, second]
    assert [r.summary for r in rig.cloud.results] == [BUDGET, BUDGET]


async def test_a_host_whose_old_certificate_is_revoked_connects_with_the_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rotating ends with revoking the old certificate, and the cloud ends its open stream
    UNAUTHENTICATED. A host whose stream stayed up from the new certificate's issue to the
    revocation stopped there (exit 4, `HostRefused`) with the new certificate on its disk. It
    now connects with that; a refusal of the certificate its files hold still stops it."""
    revoked = grpc.StatusCode.UNAUTHENTICATED
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        pki.write_host_cert(rig.cert.parent, HOST_ID)
        second = pki.serial_hex(rig.cert.read_bytes())
        rig.cloud.cut(revoked, f"certificate revoked (serial {first})")  # `amc certs revoke`
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2 or rig.served.done(), 30)
        assert not rig.served.done()
        await _step_planned(rig, "t1")  # the planner's channel presents the new one too
        rig.cloud.cut(revoked, f"certificate revoked (serial {second})")
        with pytest.raises(HostRefused) as refused:
            await asyncio.wait_for(asyncio.shield(rig.served), 30)
    assert rig.cloud.serials == [first, second]
    assert rig.planner.serials == [second]
    assert f"certificate revoked (serial {second})" in str(refused.value)
    assert f"serial {first} -> {second}" in caplog.text


async def test_a_refusal_stands_when_the_files_hold_another_host_s_certificate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The files holding a different certificate overruled the cloud's refusal even when it
    named another host (h2's files copied over h1's): the host reconnected, silently, as h2.
    A replacement counts only when it names this host; else the refusal stands (exit 4)."""
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        pki.write_host_cert(rig.cert.parent, "h2")
        for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
            os.replace(rig.cert.parent / theirs, rig.cert.parent / mine)
        said = f"certificate revoked (serial {first})"
        rig.cloud.cut(grpc.StatusCode.UNAUTHENTICATED, said)
        with pytest.raises(HostRefused) as refused:
            await asyncio.wait_for(asyncio.shield(rig.served), 30)
    assert rig.cloud.serials == [first]
    assert said in str(refused.value)
    assert "now hold another host's certificate (h2" in caplog.text


async def test_a_reconnect_keeps_this_host_s_certificate_when_the_files_name_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the cloud's refusal checked whom the files named: an ordinary reconnect (the stream
    lost) after h2's files were copied over h1's took them, and the host went on, silently, as
    h2 (its stream, then its Decide calls). Once connected as h1, every read of files naming
    another host is refused: it reconnects presenting its own certificate, and says so."""
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        pki.write_host_cert(rig.cert.parent, "h2")
        for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
            os.replace(rig.cert.parent / theirs, rig.cert.parent / mine)
        other = pki.serial_hex(rig.cert.read_bytes())
        rig.cloud.cut()  # the stream is lost: the host reconnects
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2 or rig.served.done(), 30)
        await _step_planned(rig, "t1")
    assert rig.cloud.serials == [first, first]
    assert rig.planner.serials == [first]
    assert (
        f"now hold another host's certificate (h2, serial {other}, in {rig.cert}; this host "
        f"connected as {HOST_ID}): it keeps presenting its own (serial {first})"
    ) in caplog.text


async def test_a_host_stops_rather_than_connect_as_the_host_its_files_now_name(
    tmp_path: Path,
) -> None:
    """The host's own certificate expires while its files hold h2's (copied over them): with
    none of its own left to present, it stops (exit 4, `AnotherHostsCertificate`) at its next
    reconnect, naming both hosts and the file, rather than connect as h2."""

    def short(pki_dir: Path) -> Path:
        into = tmp_path / "short"
        soon = dt.timedelta(seconds=15)  # the host starts and connects with it first
        flawed_copy(pki_dir, f"host-{HOST_ID}", "expires_in_seconds", into, soon)
        pki.write_host_cert(into, "h2")
        return into

    async with _host_against_cloud(tmp_path, short) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        end = x509.load_pem_x509_certificate(rig.cert.read_bytes()).not_valid_after_utc
        for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
            os.replace(rig.cert.parent / theirs, rig.cert.parent / mine)
        await until(lambda: expired(end), 60, "the host certificate expired")
        rig.cloud.cut()  # the stream is lost: the host reconnects
        with pytest.raises(cloud_channel.AnotherHostsCertificate) as stopped:
            await asyncio.wait_for(asyncio.shield(rig.served), 30)
    assert rig.cloud.serials == [first]
    assert f"(h2, serial {pki.serial_hex(rig.cert.read_bytes())}, in {rig.cert};" in str(
        stopped.value
    )
    assert f"connected as {HOST_ID}), and its own certificate (serial {first})" in str(
        stopped.value
    )


async def _shipped(rig: _Rig, decision_id: str) -> None:
    """A decision put in the host's outbox, waited for at the cloud's decision log."""
    assert rig.app.outbox is not None
    lease = lease_service_pb2.Assignment(task_id="t1", attempt=1, lease_id="l1")
    rig.app.outbox.put(DECISION, decision_id, shipped(lease, decision_id).SerializeToString())
    await rig.cloud.wait_for(lambda: decision_id in rig.log.ids, 30)


async def test_the_outbox_ships_with_a_certificate_issued_again(tmp_path: Path) -> None:
    """The outbox's channel was opened once, at start: after the certificate was issued again
    (and the lease stream reconnected with it), every shipment still presented the old one."""
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        await _shipped(rig, "d1")
        pki.write_host_cert(rig.cert.parent, HOST_ID)
        second = pki.serial_hex(rig.cert.read_bytes())
        rig.cloud.cut()
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2, 30)
        await _shipped(rig, "d2")
    assert rig.cloud.serials == [first, second]
    assert rig.log.serials == [first, second]


async def test_a_batch_refused_for_a_certificate_revoked_in_flight_ships_with_the_new_one(
    tmp_path: Path,
) -> None:
    """The old certificate is revoked while a batch is in flight: the sender asked its channel
    only before each batch and tried the refused batch again (UNAUTHENTICATED is temporary) on
    the revoked certificate's channel forever. Each try now asks for the channel, which is
    made again from the new certificate once the lease stream reconnected with it."""
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        rig.log.revoked = first  # `amc certs revoke` before the new one is installed
        assert rig.app.outbox is not None
        lease = lease_service_pb2.Assignment(task_id="t1", attempt=1, lease_id="l1")
        rig.app.outbox.put(DECISION, "d1", shipped(lease, "d1").SerializeToString())
        await rig.cloud.wait_for(lambda: first in rig.log.serials, 30)  # refused in flight
        pki.write_host_cert(rig.cert.parent, HOST_ID)
        second = pki.serial_hex(rig.cert.read_bytes())
        rig.cloud.cut(grpc.StatusCode.UNAUTHENTICATED, f"certificate revoked (serial {first})")
        await rig.cloud.wait_for(lambda: len(rig.cloud.hellos) == 2 or rig.served.done(), 30)
        assert not rig.served.done()
        await rig.cloud.wait_for(lambda: "d1" in rig.log.ids, 60)
    assert rig.cloud.serials == [first, second]
    assert rig.log.serials[-1] == second
    assert rig.log.ids == ["d1"]


async def test_a_step_refused_for_a_certificate_revoked_after_its_rotation_is_asked_again(
    tmp_path: Path,
) -> None:
    """The certificate is issued again and the old one revoked (the last step of rotating it)
    while a step's Decide is in flight on the old one: the cloud refuses that Decide
    UNAUTHENTICATED and ends the Lease stream. The attempt failed for good on that refusal (a
    task failed for a certificate rotation). The step is now asked again, and answered on a
    channel made from the new certificate."""
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        rig.planner.meanwhile = lambda: pki.write_host_cert(rig.cert.parent, HOST_ID)
        rig.planner.revoked = first  # `amc certs revoke` of the old one
        await _step_planned(rig, "t1")
        second = pki.serial_hex(rig.cert.read_bytes())
    [result] = rig.cloud.results
    assert result.summary == BUDGET
    assert rig.planner.serials[0] == first
    assert rig.planner.serials[-1] == second
    assert rig.cloud.serials == [first, second]


async def test_a_step_the_model_provider_refuses_fails_at_once_after_a_rotation(
    tmp_path: Path,
) -> None:
    """Decide's PERMISSION_DENIED is also the model provider refusing the cloud's credentials
    (docs/deployment.md): taken as the certificate's refusal when the files had changed, the
    step was asked again instead of failing at once. Only UNAUTHENTICATED is taken so."""
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        # Issued again while the Decide is in flight on the old one; the stream stays up.
        rig.planner.meanwhile = lambda: pki.write_host_cert(rig.cert.parent, HOST_ID)
        rig.planner.denied = first
        await _step_planned(rig, "t1")
    [result] = rig.cloud.results
    assert PROVIDER_REFUSED in result.summary
    assert rig.planner.serials == [first]


def _rewrite_in_the_same_tick(path: Path, body: bytes, size: int) -> None:
    """`body`, padded to `size` with newlines, written in place with the file's old mtime: a
    rewrite within the timestamp tick of the file's last change (same size, inode, mtime)."""
    before = path.stat()
    path.write_bytes(body + b"\n" * (size - len(body)))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_files_issued_again_within_the_tick_of_the_last_read_are_read_again(
    tmp_path: Path,
) -> None:
    """The files are read again only when their mtime, size or inode changed; file times are
    coarse, so a certificate issued again within the tick of the last read, as large as the
    old one, in place, looked unchanged and the host kept presenting the old one."""
    pki_dir = tmp_path / "pki"
    pki.ensure_embedded_pki(tmp_path, [HOST_ID, "h2"])
    settings = HostSettings(certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h")
    cert_name, key_name = pki.host_files(HOST_ID)
    other_cert, other_key = pki.host_files("h2")
    pairs = ((cert_name, other_cert), (key_name, other_key))
    for mine, theirs in pairs:  # each as large as its counterpart: one of them padded
        size = max((pki_dir / name).stat().st_size for name in (mine, theirs))
        for name in (mine, theirs):
            _rewrite_in_the_same_tick(pki_dir / name, (pki_dir / name).read_bytes(), size)
    old = cloud_channel.issued(settings)
    for mine, theirs in pairs:  # h2's certificate and key, in h1's files, within the tick
        body = (pki_dir / theirs).read_bytes()
        _rewrite_in_the_same_tick(pki_dir / mine, body, len(body))
    now = cloud_channel.issued(settings)
    assert now.serial == pki.serial_hex((pki_dir / other_cert).read_bytes()) != old.serial


def test_a_reader_of_the_files_being_issued_again_reads_either_whole(tmp_path: Path) -> None:
    """`amc certs host` rewrote the certificate, then the key, in place (truncated, then
    written): a host reading them meanwhile (at each connection) could read an empty or
    half-written file, or a new certificate beside the old key, and refused to start (exit 5).
    Each is now written whole beside the old one and renamed over it: a reader that opened the
    old files reads them whole, old, and the names then give the new pair."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    cert_name, key_name = pki.host_files(HOST_ID)
    cert, key = tmp_path / "pki" / cert_name, tmp_path / "pki" / key_name
    old = (cert.read_bytes(), key.read_bytes())
    with cert.open("rb") as reading_cert, key.open("rb") as reading_key:
        pki.write_host_cert(cert.parent, HOST_ID)  # issued again while the host reads
        assert (reading_cert.read(), reading_key.read()) == old
    new = (cert.read_bytes(), key.read_bytes())
    assert new[0] != old[0] and new[1] != old[1]
    assert key.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in cert.parent.iterdir() if p.name.startswith(".")) == []
    settings = HostSettings(certs_dir=cert.parent, host_id=HOST_ID, data_dir=tmp_path / "h")
    assert cloud_channel.issued(settings).cert == new[0]


def test_a_key_not_the_certificate_s_is_read_once_more_before_it_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the renames of a pair issued again, the new key stands beside the old
    certificate: a host starting then refused to start (exit 5). It now reads them once more
    after `PAIR_SETTLE_S` (here: the issuing finishes during that wait)."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID, "h2"])
    pki_dir = tmp_path / "pki"
    key = pki_dir / pki.host_files(HOST_ID)[1]
    mine = key.read_bytes()
    key.write_bytes((pki_dir / pki.host_files("h2")[1]).read_bytes())  # a key, not its pair
    waits: list[bool] = []

    def renamed() -> None:  # the rest of the issuing, during the host's first wait
        if not waits:
            key.write_bytes(mine)
        waits.append(True)

    monkeypatch.setattr(cloud_channel, "_pair_settles", renamed, raising=False)
    settings = HostSettings(certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h")
    assert cloud_channel.check_certificate(settings) is not None
    assert waits == [True]
    key.write_bytes((pki_dir / pki.host_files("h2")[1]).read_bytes())  # for good this time
    with pytest.raises(cloud_channel.CertificateInvalid, match="is not the key of this"):
        cloud_channel.check_certificate(settings)
    assert waits == [True, True]


def test_a_pair_rotated_between_its_check_and_its_read_is_not_handed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files were checked, then read again for the credentials: a pair issued again in
    between (the key renamed into place, the certificate not yet) reached gRPC unchecked, a new
    key beside the old certificate. The bytes checked are now the bytes used; a key not the
    certificate's is read once more after the rest of the pair is renamed into place."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    pki_dir = tmp_path / "pki"
    settings = HostSettings(certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h")
    cert_name, key_name = pki.host_files(HOST_ID)
    staged = tmp_path / "staged"  # the pair issued again, by the same CA, to be renamed in
    shutil.copytree(pki_dir, staged)
    pki.write_host_cert(staged, HOST_ID)
    reads: list[str] = []
    real_read = cloud_channel._read

    def read(path: Path | None, what: str) -> bytes:
        if what == "CA certificate" and not reads:  # rotated meanwhile: the key renamed first
            os.replace(staged / key_name, pki_dir / key_name)
        reads.append(what)
        return real_read(path, what)

    monkeypatch.setattr(cloud_channel, "_read", read)
    monkeypatch.setattr(  # the certificate renamed next, while the reader waits
        cloud_channel, "_pair_settles", lambda: os.replace(staged / cert_name, pki_dir / cert_name)
    )
    now = cloud_channel.issued(settings)
    assert cert_validity.key_mismatch(now.cert, now.key) == ""


async def test_closing_the_channel_lets_the_caller_s_own_cancellation_through(
    tmp_path: Path,
) -> None:
    """`ChannelOnce.close` waited for the opening it cancelled under
    `suppress(BaseException)`: the cancellation of the caller itself (a host stopping the
    shutdown it waits on) was swallowed with the opening's, and close returned as if done."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    settings = HostSettings(certs_dir=tmp_path / "pki", host_id=HOST_ID, data_dir=tmp_path / "h")
    once = cloud_channel.ChannelOnce(settings)
    once.open()  # the files are being read: the opening is under way
    closing = asyncio.create_task(once.close())
    await asyncio.sleep(0)  # closing waits for the opening it cancelled
    assert not closing.done()
    closing.cancel()
    await asyncio.wait([closing])
    assert closing.cancelled()


async def test_the_outbox_sender_outlives_certificate_files_it_cannot_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The outbox's channel could not be opened from files the cloud would refuse (here: the
    certificate expired, as a read between a start and a renewal finds it): only an OSError
    was tried again, so `CertificateInvalid` ended the sender's task, silently, and the
    decision it kept waited on the disk until a restart. It now says so once and tries again
    with its backoff: the files fixed, the kept decision ships."""
    pki_dir = tmp_path / "pki"
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    certs = tmp_path / "certs"
    cert = flawed_copy(pki_dir, f"host-{HOST_ID}", "expired", certs)
    log = _DecisionLog()  # type: ignore[abstract]  # serves ShipDecisions only
    server = grpc.aio.server(options=SERVER_OPTIONS)
    decision_log_service_pb2_grpc.add_DecisionLogServiceServicer_to_server(log, server)
    port = await start_mtls(server, pki_dir)
    settings = host_settings(tmp_path, port, certs, HOST_ID)
    once = cloud_channel.ChannelOnce(settings)
    tries: list[bool] = []

    async def channel() -> grpc.aio.Channel:
        tries.append(True)
        return await once.get()

    store = OutboxStore(tmp_path / "outbox.sqlite3")
    sender = OutboxSender(store, channel, initial_s=0.05, max_s=0.2, follow=True)
    lease = lease_service_pb2.Assignment(task_id="t1", attempt=1, lease_id="l1")
    store.put(DECISION, "d1", shipped(lease, "d1").SerializeToString())
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="host.outbox.sender")
    running = asyncio.create_task(sender.run(stop))
    try:
        await until(lambda: len(tries) >= 4 or running.done(), 30, "tries to open the channel")
        assert not running.done(), running.exception()
        assert sender.last_error is not None and "expired" in sender.last_error
        os.replace(pki_dir / cert.name, cert)  # the fleet's valid certificate put back
        await until(lambda: "d1" in log.ids or running.done(), 30, "the kept decision shipped")
    finally:
        stop.set()
        await asyncio.wait([running])
        await once.close()
        await server.stop(grace=None)
        store.close()
    assert log.ids == ["d1"]
    assert sender.last_error is None
    said = [
        r.getMessage() for r in caplog.records if "no channel to the cloud yet" in r.getMessage()
    ]
    assert len(said) == 1 and f"host certificate {cert} expired" in said[0], said


async def test_keeping_its_own_certificate_is_said_once_per_other_certificate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once connected as h1, files naming h2 are refused at every read of them, and the host
    said so at every read: each reconnect (every few seconds while the cloud is away) and
    each channel made again logged the same warning. It is said once per file and
    certificate: again only for another certificate in the files."""
    pki_dir = tmp_path / "pki"
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    settings = HostSettings(certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h")
    dialer = cloud_channel.LeaseDialer(settings)
    channel = await dialer()
    await channel.close(grace=None)
    dialer.welcomed()  # connected as h1
    caplog.set_level(logging.WARNING, logger="host.cloud_channel")

    def copied_over() -> str:
        """h2's files issued anew and copied over h1's; the serial of its certificate."""
        pki.write_host_cert(pki_dir, "h2")
        for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
            shutil.copy(pki_dir / theirs, pki_dir / mine)
        return pki.serial_hex((pki_dir / pki.host_files(HOST_ID)[0]).read_bytes())

    first, second = copied_over(), ""
    for read in range(6):
        if read == 3:
            second = copied_over()
        kept = await cloud_channel.read_issued(settings)  # a reconnect's read
        assert kept.identity == HOST_ID
    said = [r.getMessage() for r in caplog.records if "keeps presenting its own" in r.getMessage()]
    assert len(said) == 2, said
    assert f"(h2, serial {first}," in said[0] and f"(h2, serial {second}," in said[1], said


async def test_planner_and_outbox_calls_present_new_files_while_the_stream_stays_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The certificate is issued again while the lease stream stays up. The files were read
    again only at a reconnect (or a refusal): every Decide and every shipment kept presenting
    the old certificate for as long as the stream lasted. Each new call now looks at the
    files first (off the event loop; at each call here, not every few seconds): the next
    Decide and the next shipment present the new one, on the stream that never reconnected."""
    monkeypatch.setattr(cloud_channel, "LOOK_AGAIN_EVERY_S", 0.0)
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        await _step_planned(rig, "t1")
        await _shipped(rig, "d1")
        pki.write_host_cert(rig.cert.parent, HOST_ID)  # as `amc certs host` issues it again
        second = pki.serial_hex(rig.cert.read_bytes())
        await _step_planned(rig, "t2")
        await _shipped(rig, "d2")
    assert first != second
    assert rig.cloud.serials == [first]  # one stream: no reconnect read the files
    assert rig.planner.serials == [first, second]
    assert rig.log.serials == [first, second]


async def test_new_calls_keep_this_host_s_certificate_when_the_files_name_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity pin holds for the look before each call: files copied over from another
    host (h2) while the stream stays up are not presented by the next Decide."""
    monkeypatch.setattr(cloud_channel, "LOOK_AGAIN_EVERY_S", 0.0)  # it looks at each call
    async with _host_against_cloud(tmp_path) as rig:
        first = pki.serial_hex(rig.cert.read_bytes())
        await _step_planned(rig, "t1")
        pki.write_host_cert(rig.cert.parent, "h2")
        for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
            shutil.copy(rig.cert.parent / theirs, rig.cert.parent / mine)
        await _step_planned(rig, "t2")
    assert rig.planner.serials == [first, first]


async def test_a_channel_made_from_another_hosts_files_before_the_welcome_is_not_kept(
    tmp_path: Path,
) -> None:
    """h2's files copied over h1's after the lease stream read h1's but before its welcome: a
    Decide's or a shipment's look made the planner channel again from h2's (before the welcome
    any host's files are read). The welcome then pinned h1, yet the latest read stayed h2's,
    and every later call presented h2 for as long as the host ran. After the welcome, calls
    present h1 again."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID, "h2"])
    pki_dir = tmp_path / "pki"
    settings = HostSettings(
        certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h", cloud_address="localhost:1"
    )
    once = cloud_channel.ChannelOnce(settings)
    await once.get()  # opened at the build from h1's files
    dialer = cloud_channel.LeaseDialer(settings)
    stream = await dialer()  # the lease stream read h1's files; its welcome is on its way
    for mine, theirs in zip(pki.host_files(HOST_ID), pki.host_files("h2"), strict=True):
        shutil.copy(pki_dir / theirs, pki_dir / mine)
    try:
        await once.get()  # a call's look before the welcome: made again from h2's
        dialer.welcomed()  # welcomed as h1: this process is h1
        for _ in range(2):
            await once.get()
            made = once._made_from
            assert made is not None and made.identity == HOST_ID, made and made.identity
        assert cloud_channel.latest(settings) is dialer.made_from
    finally:
        await stream.close(grace=None)
        await once.close()


async def test_the_look_before_each_call_is_made_at_most_every_few_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Decide and shipment looked at the certificate files first, waiting up to
    `LOOK_AGAIN_S` for them: a certs disk slow but answering added up to 2 s to every call.
    One look is made every `LOOK_AGAIN_EVERY_S` at most: a call within that of the last look
    goes on the channel it has; one after it looks, and presents a certificate issued again."""
    pki.ensure_embedded_pki(tmp_path, [HOST_ID])
    pki_dir = tmp_path / "pki"
    settings = HostSettings(
        certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h", cloud_address="localhost:1"
    )
    once = cloud_channel.ChannelOnce(settings)
    monkeypatch.setattr(cloud_channel, "LOOK_AGAIN_EVERY_S", 3600.0)
    try:
        await once.get()  # opened from the first certificate
        first = once._made_from
        await once.get()  # looks: the files as they were
        pki.write_host_cert(pki_dir, HOST_ID)  # issued again
        await once.get()  # within the hour of the last look: not looked at
        assert once._made_from is first
        monkeypatch.setattr(cloud_channel, "LOOK_AGAIN_EVERY_S", 0.0)
        await once.get()
        made = once._made_from
        assert made is not None and first is not None and made.serial != first.serial
    finally:
        await once.close()
