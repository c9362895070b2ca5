"""What every Node host test runs between: a cloud and a virtual phone served over the adb
protocol, both real servers, torn down however the test ends.

The cloud is the replica `amc cloud serve` runs, built in the test's process from the same
`AMC_*` settings (`cloud_process`'s): a process of its own costs an interpreter start and the
cloud's imports (about 2 s of CPU, far more on a loaded machine) per test, and only a test of
the cloud going away needs one (`own_process`).

A test that must script the cloud (send what the real one sends only in a race, leave a result
unanswered, cut a stream) runs host.js against the in-test LeaseService of
tests/host/lease_fake.py instead (`fake_cloud_and_phones`, `running_host`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import planner_service_pb2_grpc, task_service_pb2
from cloud.server import build_server
from cloud.settings import CloudSettings
from console.client import OperatorClient
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from tests.host.lease_fake import FakeCloud, Lease, RunningCloud, start_fake_cloud
from tests.support.migrated import migrated_sqlite_url
from tests.support.processes import (
    CLEAN_ENV_DROPS,
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
    #: The cloud's own `amc cloud serve` process, with `own_process` (None: it runs in the
    #: test's process).
    cloud: AmcProcess | None
    adb: VirtualAdbServer


@asynccontextmanager
async def cloud_and_phone(
    tmp_path: Path,
    phone: VirtualPhone,
    host_id: str,
    planner: Mapping[str, str] | None = None,
    more: Sequence[VirtualPhone] = (),
    *,
    own_process: bool = False,
) -> AsyncIterator[Rig]:
    """A serving cloud (SQLite, mTLS, the offline planner unless `planner` gives other
    `AMC_PLANNER_*` settings) with certificates for `host_id`, and `phone` (and `more`) on
    their own adb server. The cloud runs in this process unless `own_process` (a test that
    kills and restarts it)."""
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
    )
    address = f"127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as env:
        if own_process:
            cloud.start()
        else:
            # The process's environment is this one's without AMC_/provider variables, plus
            # the cloud's settings: the same here, for as long as the cloud runs (its planner
            # reads its settings when it builds a provider).
            for name in [name for name in os.environ if name.startswith(CLEAN_ENV_DROPS)]:
                env.delenv(name)
            for name, value in cloud.env.items():
                if name.startswith(CLEAN_ENV_DROPS):
                    env.setenv(name, value)
        server = None
        client = operator(address, pki)
        try:
            if not own_process:
                server = await build_server(CloudSettings())
                await server.start()
            await wait_serving(address, pki)
            yield Rig(address, pki, adb_port, client, cloud if own_process else None, adb)
        finally:
            await client.close()
            if server is not None:
                await server.stop()
            cloud.stop()
            await adb.stop()


async def dark_theme_task(client: OperatorClient, **request: Any) -> str:
    """Submits "Turn on dark theme", the task most tests of host.js run (the offline planner
    knows it), with `request`'s other fields (max_attempts, a lease duration, a target): its
    id."""
    submitted = task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", **request)
    return str((await client.tasks.SubmitTask(submitted, timeout=10)).task.task_id)


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


@dataclass(frozen=True, slots=True)
class FakeRig:
    """The in-test LeaseService a Node host test scripts, and the adb server of its phones."""

    fake: RunningCloud
    adb: VirtualAdbServer
    adb_port: int

    @property
    def cloud(self) -> FakeCloud:
        return self.fake.cloud

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.fake.port}"


@asynccontextmanager
async def fake_cloud_and_phones(
    tmp_path: Path,
    host_id: str,
    phones: Sequence[VirtualPhone] | None = None,
    *,
    cloud: FakeCloud | None = None,
    planner: planner_service_pb2_grpc.PlannerServiceServicer | None = None,
) -> AsyncIterator[FakeRig]:
    """The fake LeaseService (`cloud`, or a new one; `planner` beside it) with certificates
    for `host_id` under `tmp_path`/pki, and `phones` (one phone, emulator-5554, unless
    given) on their own adb server; both stopped however the test ends."""
    fake = await start_fake_cloud(tmp_path / "pki", host_id, cloud=cloud, planner=planner)
    try:
        adb = VirtualAdbServer(
            list(phones) if phones is not None else [VirtualPhone("emulator-5554")]
        )
        adb_port = await adb.start()
        try:
            yield FakeRig(fake, adb, adb_port)
        finally:
            await adb.stop()
    finally:
        await fake.server.stop(grace=None)


@dataclass(slots=True)
class HostRun:
    """host.js started by `running_host`. What a test asserts on once it ends is set when the
    context exits: its assertions read `alive` and `said` after the host was let go, so a
    failed one never leaves a process behind."""

    process: asyncio.subprocess.Process
    #: Whether host.js still ran when the test's body ended (it is killed then).
    alive: bool = False
    #: What host.js said on stderr that the test's body did not read itself.
    said: str = ""


@asynccontextmanager
async def running_host(
    node: str,
    rig: FakeRig,
    host_id: str,
    data_dir: Path,
    *,
    certs: Path | None = None,
    **env: str,
) -> AsyncIterator[HostRun]:
    """host.js against `rig`'s fake cloud and adb server, presenting the certificate files
    in `certs` (the fleet's, under the rig's pki folder, unless given), with `env`'s
    settings besides. On exit it is killed if it still runs, and what it said is collected."""
    process = await spawn_host(
        node,
        rig.address,
        rig.fake.pki_dir if certs is None else certs,
        host_id,
        rig.adb_port,
        data_dir,
        **env,
    )
    run = HostRun(process)
    try:
        yield run
    finally:
        run.alive = process.returncode is None
        if run.alive:
            process.kill()
        _, err = await process.communicate()
        run.said = err.decode()


@dataclass(slots=True)
class AssignedRun:
    """host.js running task t1 on emulator-5554, which the fake cloud assigned it
    (`assigned_host`): what it said so far, line by line, read as it runs."""

    run: HostRun
    #: The fake cloud's lease of that assignment.
    lease: Lease
    lines: list[str]
    #: The adb server of its phones (a test stops it, as an adb server killed).
    adb: VirtualAdbServer
    #: Everything host.js said, set once the block ended (it was let go by then).
    said: str = ""

    @property
    def process(self) -> asyncio.subprocess.Process:
        return self.run.process

    def text(self) -> str:
        """What host.js said so far, in one string (for waits and assertion messages)."""
        return "".join(self.lines)


async def _read_lines(stderr: asyncio.StreamReader, lines: list[str]) -> None:
    """Collects what host.js says, line by line, until it exits."""
    while line := (await stderr.readline()).decode():
        lines.append(line)


@asynccontextmanager
async def assigned_host(
    node: str,
    tmp_path: Path,
    host_id: str,
    cloud: FakeCloud,
    planner: planner_service_pb2_grpc.PlannerServiceServicer | None = None,
    phones: Sequence[VirtualPhone] | None = None,
    **env: str,
) -> AsyncIterator[AssignedRun]:
    """host.js (`env` its settings) against `cloud` (and `planner`) and `phones`
    (`fake_cloud_and_phones`), its stderr read as it runs, once `cloud` heard its hello and
    assigned it "Go home" as task t1 on emulator-5554: the start every test of a lease the
    fake cloud scripts shares. The host is let go when the block ends, then `said` is set."""
    lines: list[str] = []
    async with (
        fake_cloud_and_phones(tmp_path, host_id, phones, cloud=cloud, planner=planner) as rig,
        running_host(node, rig, host_id, tmp_path / "host-data", certs=None, **env) as run,
    ):
        assert run.process.stderr is not None
        reader = asyncio.create_task(_read_lines(run.process.stderr, lines))
        try:
            await cloud.wait_for(lambda: cloud.hellos, 60)
            lease = await cloud.assign("t1", "emulator-5554", "Go home")
            assigned = AssignedRun(run, lease, lines, rig.adb)
            yield assigned
        finally:
            reader.cancel()
    assigned.said = "".join(lines) + run.said
