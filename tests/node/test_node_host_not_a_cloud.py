"""The Node example host pointed at something that is not an amc cloud: a gRPC server that
answers the Lease stream UNIMPLEMENTED. No reconnect makes it one, so the host stops at once
naming the address and what answered, in the Python host's words (host/lease_client.py,
`not_a_cloud`).

Real parts: host.js as its own process, a real gRPC server over mTLS (the fleet's certificates,
so the handshake passes) that serves no LeaseService, and a virtual phone over adb.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from cloud import pki
from console import exit_codes
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from tests.host.lease_fake import SERVER_OPTIONS
from tests.node.rig import spawn_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.mtls import start_mtls

__all__ = ["node"]


async def test_the_node_host_stops_at_once_where_no_lease_service_answers(
    node: str, tmp_path: Path
) -> None:
    """Before, host.js said "lease stream lost (code 12 ...)" and reconnected with backoff for
    ever; now it stops with one line naming the address and the answer, and exits 4 as
    `amc host run` does for the same cause (docs/cli.md, "Exit codes"; it exited 1)."""
    pki_dir = tmp_path / "pki"
    pki.ensure_embedded_pki(pki_dir.parent, [HOST_ID])
    server = grpc.aio.server(options=SERVER_OPTIONS)  # no service: every method UNIMPLEMENTED
    port = await start_mtls(server, pki_dir)
    adb = VirtualAdbServer([VirtualPhone("emulator-5554")])
    adb_port = await adb.start()
    address = f"127.0.0.1:{port}"
    host = await spawn_host(node, address, pki_dir, HOST_ID, adb_port, tmp_path / "host-data")
    try:
        _, err = await asyncio.wait_for(host.communicate(), 60)
    except TimeoutError:
        host.kill()
        _, err = await host.communicate()
        raise AssertionError(f"the host did not stop:\n{err.decode()}") from None
    finally:
        await adb.stop()
        await server.stop(grace=None)
    said = err.decode().strip().splitlines()
    assert host.returncode == exit_codes.CLOUD, said
    assert said[-1].startswith(
        f"[node-host] error: {address} is not an amc cloud: it answered the Lease stream "
        "UNIMPLEMENTED ("
    ), said
    assert said[-1].endswith("); check AMC_CLOUD_ADDRESS"), said
    assert not any("lease stream lost" in line for line in said), said
