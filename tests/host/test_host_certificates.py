"""A host whose own certificate the cloud would refuse says which file and why, against a real
cloud on loopback: `amc host run` refuses to start (exit 5), a running host's lease client says
it in its log and on its console at each connection attempt (it said "Socket closed", forever),
and a certificate about to expire is warned about at start."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import grpc
import pytest
from cryptography import x509

from amc.v1 import lease_service_pb2, lease_service_pb2_grpc
from cloud.cert_validity import when
from cloud.pki import ensure_embedded_pki
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings, SettingError
from console import exit_codes
from host.agent.loop import TaskOutcome, TaskSpec
from host.agent.progress import ProgressHolder
from host.cloud_channel import (
    EXPIRY_WARNING_DAYS,
    check_certificate,
    expiry_warning,
    failure,
    open_channel,
)
from host.console.state import HostState, cloud_link
from host.devices.registry import DeviceInfo
from host.lease_client import LeaseClient, LeaseClientConfig
from host.outbox import OutboxSender, OutboxStore
from host.outbox.kinds import DECISION
from host.settings import HostSettings
from tests.cloud.test_shipping import shipped
from tests.support.bad_certs import Flaw, expired, flawed_copy, under_an_empty_passphrase
from tests.support.processes import AMC, _clean_env, free_port
from tests.support.waiting import until

HOST_ID = "h1"


class _NoPhones:
    """A host without phones: these tests never get as far as an assignment."""

    def devices(self) -> list[DeviceInfo]:
        return []

    def add_listener(self, listener: Callable[[DeviceInfo, str], None]) -> None:
        pass


async def _never_runs(
    spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
) -> TaskOutcome:
    raise AssertionError("no task is assigned to a host that never connects")


@contextlib.asynccontextmanager
async def real_cloud(tmp_path: Path) -> AsyncIterator[CloudServer]:
    pki = ensure_embedded_pki(tmp_path, [HOST_ID], operator="admin")
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            pki_dir=pki,
        )
    )
    await cloud.start()
    try:
        yield cloud
    finally:
        await cloud.stop(grace=0)


async def test_amc_host_run_refuses_an_expired_certificate_naming_it(tmp_path: Path) -> None:
    """Before, the host started and logged "lease stream lost: UNAVAILABLE … Socket closed"
    every few seconds, never naming the certificate (here: the 60 s timeout ran out)."""
    async with real_cloud(tmp_path) as cloud:
        bad = tmp_path / "pki_exp"
        cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "expired", bad)
        end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
        env = {
            **_clean_env(),
            "AMC_HOST_DATA_DIR": str(tmp_path / "data"),
            "AMC_HOST_CLOUD_ADDRESS": cloud.address,
            "AMC_HOST_CERTS_DIR": str(bad),
            "AMC_HOST_HOST_ID": HOST_ID,
            "AMC_HOST_METRICS_ADDRESS": "127.0.0.1:0",
        }
        process = await asyncio.create_subprocess_exec(
            AMC, "host", "run", env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), 60)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    said = stderr.decode()
    assert process.returncode == exit_codes.CERTIFICATE, said
    assert f"amc host run: host certificate {cert} expired {when(end)}" in said
    assert "amc certs host" in said and "Socket closed" not in said


def test_amc_host_run_refuses_a_key_that_is_not_its_certificate_s(tmp_path: Path) -> None:
    """Before, gRPC logged "Invalid private key" and the host retried "Failed to create
    security handshaker" forever as if the cloud were down (here: the 60 s timeout ran out).
    Refused before any connection: no cloud is needed."""
    certs = ensure_embedded_pki(tmp_path, [HOST_ID], operator="admin")
    key = certs / f"host-{HOST_ID}.key"
    key.write_bytes((certs / "operator-admin.key").read_bytes())
    env = {
        **_clean_env(),
        "AMC_HOST_DATA_DIR": str(tmp_path / "data"),
        "AMC_HOST_CLOUD_ADDRESS": f"127.0.0.1:{free_port()}",
        "AMC_HOST_CERTS_DIR": str(certs),
        "AMC_HOST_HOST_ID": HOST_ID,
        "AMC_HOST_METRICS_ADDRESS": "127.0.0.1:0",
    }
    done = subprocess.run([AMC, "host", "run"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == exit_codes.CERTIFICATE, done.stderr
    assert done.stderr.startswith(
        f"amc host run: the key {key} of host certificate {certs / f'host-{HOST_ID}.pem'} is "
        "not the key of this certificate"
    ), done.stderr


async def _first_failed_attempt(address: str, certs: Path, tmp_path: Path) -> LeaseClient:
    """A lease client with the certificates in `certs`, run until its first attempt failed."""
    settings = HostSettings(
        cloud_address=address, certs_dir=certs, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    client = LeaseClient(
        lambda: open_channel(settings),
        _NoPhones(),
        _never_runs,
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
        rng=random.Random(7),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(client.run(stop))
    try:
        await until(lambda: client.last_error is not None, 30, "a failed attempt")
    finally:
        stop.set()
        await task
    return client


@pytest.mark.parametrize("flaw", ["expired", "not_yet_valid", "other_ca"])
async def test_a_running_host_names_its_certificate_at_each_attempt(
    tmp_path: Path, flaw: Flaw, caplog: pytest.LogCaptureFixture
) -> None:
    """The certificate went bad after the start (here: from the lease client's first
    attempt): its log and its console's "now" say which file and why."""
    async with real_cloud(tmp_path) as cloud:
        bad = tmp_path / "pki_bad"
        cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", flaw, bad)
        caplog.set_level(logging.ERROR, logger="host.lease_client")
        client = await _first_failed_attempt(cloud.address, bad, tmp_path)
    assert client.last_error is not None
    assert client.last_error.startswith(f"host certificate {cert} "), client.last_error
    connected, line = cloud_link(cast(HostState, SimpleNamespace(lease=client)))
    assert connected is False
    assert line == f"not connected to the cloud ({client.last_error})"
    assert f"not connecting: host certificate {cert}" in caplog.text


def test_a_certificate_about_to_expire_is_warned_about_at_start(tmp_path: Path) -> None:
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    fresh = HostSettings(certs_dir=pki, host_id=HOST_ID, data_dir=tmp_path / "h")
    assert expiry_warning(check_certificate(fresh)) == ""
    soon = flawed_copy(pki, f"host-{HOST_ID}", "expires_soon", tmp_path / "soon")
    end = x509.load_pem_x509_certificate(soon.read_bytes()).not_valid_after_utc
    settings = HostSettings(certs_dir=tmp_path / "soon", host_id=HOST_ID, data_dir=tmp_path / "h")
    warning = expiry_warning(check_certificate(settings))
    assert warning.startswith(f"the host certificate expires {when(end)} (in "), warning
    assert EXPIRY_WARNING_DAYS == 14


async def test_a_cloud_refuses_to_start_with_an_expired_server_certificate(tmp_path: Path) -> None:
    """Before, it served, and every host logged "lease stream lost: … Tls handshake failed …
    CERTIFICATE_VERIFY_FAILED: certificate has expired" (whose, it did not say) forever."""
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    cert = flawed_copy(pki, "server", "expired", tmp_path / "pki_srv")
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=tmp_path / "pki_srv",
    )
    built: list[CloudServer] = []
    with pytest.raises(SettingError) as refused:
        built.append(await build_server(settings))
    for server in built:  # only before the fix
        await server.stop(grace=0)
    assert str(refused.value).startswith(
        f"AMC_CLOUD_PKI_DIR: server certificate {cert} expired {when(end)}; "
    )


async def test_a_cloud_certificate_that_expired_while_it_ran_is_named_by_the_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cloud started with a valid server certificate that then expired: every host said
    "lease stream lost: UNAVAILABLE: … Tls handshake failed … CERTIFICATE_VERIFY_FAILED:
    certificate has expired: OK", never whose certificate."""
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    cert = flawed_copy(pki, "server", "expires_in_seconds", tmp_path / "pki_srv")
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            pki_dir=tmp_path / "pki_srv",
        )
    )
    await cloud.start()
    try:
        await until(lambda: expired(end), 30, "the server certificate expired")
        caplog.set_level(logging.WARNING, logger="host.lease_client")
        client = await _first_failed_attempt(cloud.address, pki, tmp_path)
    finally:
        await cloud.stop(grace=0)
    said = f"the cloud's certificate, as presented at {cloud.address}, is not accepted: "
    assert client.last_error == f"{said}certificate has expired", client.last_error
    assert f"lease stream lost: {said}certificate has expired" in caplog.text


async def test_a_cloud_warns_when_its_server_certificate_expires_soon(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The host warned at start of a certificate expiring within 14 days; the cloud said
    nothing of its own until every host refused it."""
    pki = ensure_embedded_pki(tmp_path, [HOST_ID])
    cert = flawed_copy(pki, "server", "expires_soon", tmp_path / "pki_srv")
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    caplog.set_level(logging.WARNING, logger="cloud.server")
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            pki_dir=tmp_path / "pki_srv",
        )
    )
    await cloud.start()
    try:
        said = f"the server certificate {cert} expires {when(end)} (in "
        await until(lambda: said in caplog.text, 30, "the expiry warning")
    finally:
        await cloud.stop(grace=0)
    assert "amc certs init" in caplog.text


async def test_the_outbox_names_a_host_certificate_that_expired_after_its_channel_opened(
    tmp_path: Path,
) -> None:
    """The outbox's channel is opened once, at start; once the host certificate expired, the
    cloud refuses its next handshake and the sender said "UNAVAILABLE: Socket closed"."""
    async with real_cloud(tmp_path) as cloud:
        short = tmp_path / "pki_short"
        cert = flawed_copy(tmp_path / "pki", f"host-{HOST_ID}", "expires_in_seconds", short)
        end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
        settings = HostSettings(
            cloud_address=cloud.address, certs_dir=short, host_id=HOST_ID, data_dir=tmp_path / "h"
        )
        store = OutboxStore(tmp_path / "outbox.sqlite3")
        sender = OutboxSender(
            store,
            lambda: open_channel(settings),
            initial_s=0.05,
            max_s=0.2,
            explain=functools.partial(failure, settings=settings),
        )
        stop = asyncio.Event()
        running = asyncio.create_task(sender.run(stop))
        try:
            await until(lambda: expired(end), 30, "the host certificate expired")
            lease = lease_service_pb2.Assignment(task_id="t1", attempt=1, lease_id="l1")
            store.put(DECISION, "d1", shipped(lease, "d1").SerializeToString())
            await until(lambda: sender.last_error is not None, 30, "a failed send")
        finally:
            stop.set()
            await running
            store.close()
    assert sender.last_error == (
        f"host certificate {cert} expired {when(end)} (the cloud refuses it)"
    ), sender.last_error


async def test_keys_under_an_empty_passphrase_are_taken_as_grpc_takes_them(tmp_path: Path) -> None:
    """gRPC opens a PKCS#8 key encrypted with an empty passphrase; the key check refused it
    ("is encrypted"), as the cloud's server key (the cloud did not start) and as the host's
    (the host never connected). Now such a key is not checked against its certificate (the
    check cannot read it) and the handshake, real here, says whether it works."""
    pki = ensure_embedded_pki(tmp_path, [HOST_ID], operator="admin")
    for name in ("server.key", f"host-{HOST_ID}.key"):
        under_an_empty_passphrase(pki / name)
    async with real_cloud(tmp_path) as cloud:
        settings = HostSettings(
            cloud_address=cloud.address, certs_dir=pki, host_id=HOST_ID, data_dir=tmp_path / "h"
        )
        assert check_certificate(settings) is not None
        channel = open_channel(settings)
        try:
            # The cloud answers only once the handshake took both keys (mTLS: the host's
            # certificate too); it refuses this stream for not starting with a hello.
            stub = lease_service_pb2_grpc.LeaseServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(
                    stub.Lease(iter([lease_service_pb2.LeaseRequest()])).read(), 20
                )
        finally:
            await channel.close(grace=None)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION, refused.value
    assert refused.value.details() == "the first message must be a hello"
