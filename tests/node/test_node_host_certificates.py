"""host.js presents a certificate issued again while it runs from its next connection on, as
the Python host does (host/cloud_channel.py, `read_credentials`): operators rotate host
certificates (`amc certs host`) without restarting hosts.

Real parts: host.js as its own process, its certificate files on disk issued by the fleet CA
(`cloud.pki`), a virtual phone over adb, and the in-test LeaseService of tests/host/lease_fake.py
over real mTLS, which reads the serial of the certificate each stream was opened with and
ends a stream as the cloud ends that of a revoked certificate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from cloud import pki
from console import exit_codes
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from tests.host.lease_fake import start_fake_cloud
from tests.node.rig import spawn_host
from tests.node.test_node_host import HOST_ID, node

__all__ = ["node"]


async def test_a_certificate_issued_again_is_presented_at_the_next_connection(
    node: str, tmp_path: Path
) -> None:
    """The host's certificate is issued again while it runs, and its stream is then lost. host.js
    read the new files before reconnecting, found them valid, and presented the old
    certificate all the same (its clients were made once, from the first files): a host went on
    with a certificate its operator had replaced, and once that one expired or was revoked, it
    could not connect again until restarted. It now reconnects with the new one."""
    fake = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    cloud = fake.cloud
    adb = VirtualAdbServer([VirtualPhone("emulator-5554")])
    adb_port = await adb.start()
    cert = fake.pki_dir / pki.host_files(HOST_ID)[0]
    first = pki.serial_hex(cert.read_bytes())
    host = await spawn_host(
        node,
        f"127.0.0.1:{fake.port}",
        fake.pki_dir,
        HOST_ID,
        adb_port,
        tmp_path / "host-data",
        AMC_HOST_RECONNECT_INITIAL_S="0.1",
    )
    try:
        await cloud.wait_for(lambda: len(cloud.hellos) == 1 or host.returncode is not None, 60)
        pki.write_host_cert(fake.pki_dir, HOST_ID)  # as `amc certs host` issues it again
        second = pki.serial_hex(cert.read_bytes())
        cloud.cut()  # the stream is lost: the host reconnects
        await cloud.wait_for(lambda: len(cloud.hellos) == 2 or host.returncode is not None, 60)
    finally:
        alive = host.returncode is None
        if alive:
            host.kill()
        _, err = await host.communicate()
        await adb.stop()
        await fake.server.stop(grace=None)
    said = err.decode()
    assert alive, said
    assert first != second
    assert cloud.serials == [first, second], said
    assert cloud.host_ids == [HOST_ID, HOST_ID], said
    assert "the host certificate files changed" in said, said


async def test_a_node_host_whose_old_certificate_is_revoked_connects_with_the_new_one(
    node: str, tmp_path: Path
) -> None:
    """Rotating a host certificate ends with revoking the old one (docs/deployment.md), and the
    cloud ends the open stream of a revoked certificate UNAUTHENTICATED. A host whose stream
    stayed up from the new certificate's issue to that revocation had never connected with the
    new one, and host.js stopped there (exit 4) with the new certificate on its disk. When its
    files hold another certificate than the one refused, it now connects with that; the
    refusal of the certificate its files hold still stops it (exit 4)."""
    fake = await start_fake_cloud(tmp_path / "pki", HOST_ID)
    cloud = fake.cloud
    adb = VirtualAdbServer([VirtualPhone("emulator-5554")])
    adb_port = await adb.start()
    cert = fake.pki_dir / pki.host_files(HOST_ID)[0]
    first = pki.serial_hex(cert.read_bytes())
    host = await spawn_host(
        node,
        f"127.0.0.1:{fake.port}",
        fake.pki_dir,
        HOST_ID,
        adb_port,
        tmp_path / "host-data",
        AMC_HOST_RECONNECT_INITIAL_S="0.1",
    )
    revoked = grpc.StatusCode.UNAUTHENTICATED
    try:
        await cloud.wait_for(lambda: len(cloud.hellos) == 1 or host.returncode is not None, 60)
        pki.write_host_cert(fake.pki_dir, HOST_ID)
        second = pki.serial_hex(cert.read_bytes())
        cloud.cut(revoked, f"certificate revoked (serial {first})")  # `amc certs revoke`
        await cloud.wait_for(lambda: len(cloud.hellos) == 2 or host.returncode is not None, 60)
        cloud.cut(revoked, f"certificate revoked (serial {second})")
        code = await asyncio.wait_for(host.wait(), 60)
    finally:
        if host.returncode is None:
            host.kill()
        _, err = await host.communicate()
        await adb.stop()
        await fake.server.stop(grace=None)
    said = err.decode()
    assert cloud.serials == [first, second], said
    assert code == exit_codes.CLOUD, said
    assert said.strip().splitlines()[-1] == (
        f"[node-host] error: code {revoked.value[0]}: certificate revoked (serial {second})"
    ), said
