"""What every Node host test runs between: `amc cloud serve` and a virtual phone served over the
adb protocol, both real processes or servers, torn down however the test ends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from console.client import OperatorClient
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from tests.support.migrated import migrated_sqlite_url
from tests.support.processes import (
    AmcProcess,
    cloud_process,
    free_port,
    make_pki,
    operator,
    wait_serving,
)

HOST = Path(__file__).resolve().parents[2] / "examples" / "node-host" / "host.js"


@dataclass(frozen=True, slots=True)
class Rig:
    """Where the Node host finds the cloud and the phone, and the operator's view of the cloud."""

    address: str
    pki: Path
    adb_port: int
    client: OperatorClient
    cloud: AmcProcess
    adb: VirtualAdbServer


@asynccontextmanager
async def cloud_and_phone(
    tmp_path: Path,
    phone: VirtualPhone,
    host_id: str,
    planner: Mapping[str, str] | None = None,
    more: Sequence[VirtualPhone] = (),
) -> AsyncIterator[Rig]:
    """A serving cloud (SQLite, mTLS, the offline planner unless `planner` gives other
    `AMC_PLANNER_*` settings) with certificates for `host_id`, and `phone` (and `more`) on
    their own adb server."""
    pki = make_pki(tmp_path / "pki", [host_id])
    adb = VirtualAdbServer([phone, *more])
    adb_port = await adb.start()
    port = free_port()
    cloud = cloud_process(
        tmp_path,
        "cloud",
        database_url=migrated_sqlite_url(tmp_path / "cloud.sqlite3"),
        pki_dir=pki,
        port=port,
        extra={"AMC_PLANNER_PROVIDER": "offline", **(planner or {})},
    ).start()
    address = f"127.0.0.1:{port}"
    client = operator(address, pki)
    try:
        await wait_serving(address, pki)
        yield Rig(address, pki, adb_port, client, cloud, adb)
    finally:
        await client.close()
        cloud.stop()
        await adb.stop()


async def start_host(
    node: str,
    rig: Rig,
    host_id: str,
    data_dir: Path,
    *,
    tasks: int | None = 1,
    path: str | None = None,
    address: str | None = None,
    **env: str,
) -> asyncio.subprocess.Process:
    """host.js as its own process against `rig`'s cloud (or the cloud at `address`, a proxy in
    front of it) and adb server, keeping its results under `data_dir`: it exits after `tasks`
    tasks (None: it runs until killed). `path` is its PATH (where it would find an `adb`
    program); `env` its settings besides; what it says goes to the process's stderr."""
    extra = dict(env) if tasks is None else {**env, "AMC_TASKS": str(tasks)}
    if path is not None:
        extra["PATH"] = path
    return await spawn_host(
        node,
        rig.address if address is None else address,
        rig.pki,
        host_id,
        rig.adb_port,
        data_dir,
        **extra,
    )


async def spawn_host(
    node: str,
    address: str,
    pki: Path,
    host_id: str,
    adb_port: int,
    data_dir: Path,
    **env: str,
) -> asyncio.subprocess.Process:
    """host.js as its own process against the cloud at `address` (a real one, or the fake
    LeaseService of tests/host/lease_fake.py) and the adb server on `adb_port`, with `env`'s
    settings besides; what it says goes to the process's stderr."""
    settings = {
        "PATH": os.environ.get("PATH", ""),
        "AMC_CLOUD_ADDRESS": address,
        "AMC_HOST_CERTS_DIR": str(pki),
        "AMC_HOST_ID": host_id,
        "ADB_PORT": str(adb_port),
        "AMC_HOST_DATA_DIR": str(data_dir),
        **env,
    }
    return await asyncio.create_subprocess_exec(
        node,
        str(HOST),
        env=settings,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def task_line(host: asyncio.subprocess.Process, said: list[str]) -> str:
    """The line host.js says when its task ends (its status and why), "" if it exits first;
    every line it said up to there is added to `said`, for the assertion's message."""
    assert host.stderr is not None
    while line := (await host.stderr.readline()).decode():
        said.append(line)
        if ": TASK_STATUS_" in line:
            return line
    return ""
