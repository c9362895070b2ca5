"""Both hosts stop at once when the cloud revokes their identity while they run (decision 0084).

Real parts: `amc cloud serve` (SQLite, mTLS), `amc certs revoke --host` writing the deny-list
to its database (the cloud reads it on its refresh timer and drops the open streams
UNAUTHENTICATED), the Python host as `amc host run` with its virtual phone, and host.js as its
own process with a virtual phone served over the adb protocol.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amc.v1 import fleet_service_pb2
from cloud import pki
from console import exit_codes
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import cloud_and_phone, start_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.processes import AMC, host_process
from tests.support.waiting import until

__all__ = ["node"]

PY_HOST = "py-1"


async def test_both_hosts_stop_at_once_when_the_cloud_revokes_them_mid_run(
    node: str, tmp_path: Path
) -> None:
    """The Node host exited 1 at once on UNAUTHENTICATED (host.js `FINAL`); the Python host
    waited its longest backoff (an hour here, `AMC_HOST_RECONNECT_MAX_S`) and tried again,
    refused each time, for ever. Now both stop at once and say why in their last line:
    both exit 4 (the cloud refused it, docs/cli.md "Exit codes"; host.js exited 1)."""
    refresh = {"AMC_CLOUD_REVOCATION_REFRESH_SECONDS": "0.2"}
    async with cloud_and_phone(tmp_path, VirtualPhone("emulator-5554"), HOST_ID, refresh) as rig:
        issued = pki.create_host_cert(pki.load_ca(rig.pki), PY_HOST)
        (rig.pki / f"host-{PY_HOST}.pem").write_bytes(issued.cert_pem)
        (rig.pki / f"host-{PY_HOST}.key").write_bytes(issued.key_pem)
        python = host_process(
            tmp_path,
            PY_HOST,
            cloud_address=rig.address,
            pki_dir=rig.pki,
            extra={"AMC_HOST_RECONNECT_MAX_S": "3600"},
        ).start()
        js = await start_host(node, rig, HOST_ID, tmp_path / "node-data", tasks=None)
        try:

            async def connected() -> set[str]:
                listed = await rig.client.fleet.ListHosts(
                    fleet_service_pb2.ListHostsRequest(connected_only=True), timeout=5
                )
                return {h.host_id for h in listed.hosts}

            async def both_connected() -> bool:
                return await connected() == {HOST_ID, PY_HOST}

            await until(both_connected, within=60, what="both hosts connected")
            database = f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}"
            for host_id in (HOST_ID, PY_HOST):
                revoking = await asyncio.create_subprocess_exec(
                    *[AMC, "certs", "revoke", "--host", host_id, "--database-url", database],
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                out, _ = await asyncio.wait_for(revoking.communicate(), 60)
                assert revoking.returncode == 0, out.decode()
            _, err = await asyncio.wait_for(js.communicate(), 60)
            await asyncio.to_thread(python.proc.wait, 60)  # type: ignore[union-attr]
        finally:
            if js.returncode is None:
                js.kill()
                await js.wait()
            python.stop()
    node_said = err.decode().strip().splitlines()
    assert js.returncode == exit_codes.CLOUD, node_said
    assert node_said[-1] == f"[node-host] error: code 16: host {HOST_ID} revoked", node_said
    python_said = python.output().strip().splitlines()
    assert python.proc is not None and python.proc.returncode == exit_codes.CLOUD, python_said
    assert python_said[-1].startswith(
        f"amc host run: the cloud refused this host: UNAUTHENTICATED: host {PY_HOST} revoked ("
    ), python_said
