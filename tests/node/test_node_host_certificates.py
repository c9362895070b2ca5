"""host.js presents a certificate issued again while it runs from its next connection on, as
the Python host does (host/cloud_channel.py, `read_credentials`): operators rotate host
certificates (`amc certs host`) without restarting hosts.

Real parts: host.js as its own process, its certificate files on disk issued by the fleet CA
(`cloud.pki`), a virtual phone over adb, and the in-test LeaseService of tests/host/lease_fake.py
over real mTLS, which reads the serial of the certificate each stream was opened with.
"""

from __future__ import annotations

from pathlib import Path

from cloud import pki
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
