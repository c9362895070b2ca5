"""Real `amc cloud serve` / `amc host run` processes for fault tests, with their logs kept.

The fault suite kills, restarts and starves real processes, so the parts under test run exactly as
an operator starts them: the `amc` console script next to `sys.executable`, configured only by
`AMC_CLOUD_*` / `AMC_HOST_*` environment variables. Each process writes stdout and stderr into one
log file so a failing test can show what the process said (and the canary scan can read it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc.v1 import task_service_pb2, types_pb2
from cloud import pki
from console.client import OperatorClient, secure_channel
from tests.support.migrated import migrated_sqlite_url

AMC = str(Path(sys.executable).with_name("amc"))
OPERATOR = "ops"
TERMINAL = {
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_CANCELLED,
}


def free_port() -> int:
    """A loopback port that was free a moment ago (the cloud needs a fixed one to restart on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_pki(directory: Path, host_ids: list[str]) -> Path:
    """A fleet CA, a server certificate, the hosts' and the `ops` operator's certificates."""
    pki.init_ca(directory)
    pki.write_server_cert(directory)
    for host_id in host_ids:
        pki.write_host_cert(directory, host_id)
    pki.write_operator_cert(directory, OPERATOR)
    return directory


#: Prefixes of the variables a process started here does not inherit: amc's and the providers'
#: settings, which only what the test gives it may set.
CLEAN_ENV_DROPS = ("AMC_", "ANTHROPIC_", "OPENAI_", "AI_PLANNER_", "HOST_AGENT_")


def _clean_env() -> dict[str, str]:
    """The test's environment without any AMC_/provider settings that could leak in."""
    return {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_ENV_DROPS)}


@dataclass
class AmcProcess:
    """One `amc …` child process; its output goes to `log_path`."""

    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)

    def start(self) -> AmcProcess:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [AMC, *self.args],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no goodbye, no graceful shutdown, nothing flushed."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close_log()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit within `timeout`."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_log()
        return self.proc.returncode

    def terminate(self) -> None:
        """SIGTERM without waiting: `stop_all` waits for several processes' shutdowns at once."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def stop_all(processes: list[AmcProcess], timeout: float = 15.0) -> None:
    """`stop` each of `processes`, their graceful shutdowns side by side: a test's hosts, say,
    stopped one after the other took one shutdown each (1-3 s on a loaded machine)."""
    for p in processes:
        p.terminate()
    for p in processes:
        p.stop(timeout)


def cloud_process(
    workdir: Path,
    name: str,
    *,
    database_url: str,
    pki_dir: Path,
    port: int,
    extra: Mapping[str, str] | None = None,
) -> AmcProcess:
    """`amc cloud serve` on 127.0.0.1:`port` with short leases and fast background jobs, planning
    with the offline provider for its cloud-transport hosts."""
    env = _clean_env()
    env.update(
        {
            "AMC_CLOUD_DATABASE_URL": database_url,
            "AMC_CLOUD_ARTIFACT_DIR": str(workdir / "cloud-artifacts"),
            "AMC_CLOUD_LISTEN_ADDRESS": f"127.0.0.1:{port}",
            "AMC_CLOUD_PKI_DIR": str(pki_dir),
            "AMC_CLOUD_DEFAULT_LEASE_SECONDS": "2.5",
            "AMC_CLOUD_MIN_LEASE_SECONDS": "0.5",
            "AMC_CLOUD_SWEEP_INTERVAL_SECONDS": "0.2",
            "AMC_CLOUD_DISPATCH_INTERVAL_SECONDS": "0.5",
            "AMC_CLOUD_HOST_HEARTBEAT_SECONDS": "1",
            "AMC_CLOUD_SHUTDOWN_GRACE_SECONDS": "1",
            "AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS": "0.5",
            # Clouds of parallel tests would all try 127.0.0.1:9471 (and log that they cannot).
            "AMC_CLOUD_METRICS_ADDRESS": "off",
            "AMC_PLANNER_PROVIDER": "offline",
        }
    )
    env.update(extra or {})
    return AmcProcess(name, ["cloud", "serve"], env, workdir / f"{name}.log")


def host_process(
    workdir: Path,
    host_id: str,
    *,
    cloud_address: str,
    pki_dir: Path,
    phones: int = 1,
    settle_delay_s: float = 0.05,
    transport: str = "cloud",
    extra: Mapping[str, str] | None = None,
    name: str | None = None,
) -> AmcProcess:
    """`amc host run` with `phones` virtual phones and no OCR, planning through the cloud (the
    embedded stack's choice) or, with `transport="direct"`, with the offline planner itself."""
    env = _clean_env()
    name = name or f"host-{host_id}"  # two processes of one host id need two names
    data = workdir / name
    env.update(
        {
            "AMC_HOST_HOST_ID": host_id,
            "AMC_HOST_CERTS_DIR": str(pki_dir),
            "AMC_HOST_CLOUD_ADDRESS": cloud_address,
            "AMC_HOST_TLS_SERVER_NAME": "localhost",
            "AMC_HOST_DATA_DIR": str(data),
            "AMC_HOST_DEVICE_SOURCE": "virtual",
            "AMC_HOST_VIRTUAL_PHONES": str(phones),
            "AMC_HOST_OCR_ENABLED": "false",
            "AMC_HOST_SETTLE_DELAY_S": str(settle_delay_s),
            "AMC_HOST_DEVICE_POLL_INTERVAL_S": "1",
            "AMC_HOST_RECONNECT_INITIAL_S": "0.2",
            "AMC_HOST_RECONNECT_MAX_S": "1",
            "AMC_HOST_KEEPALIVE_TIME_S": "1",
            "AMC_HOST_KEEPALIVE_TIMEOUT_S": "2",
            "AMC_HOST_PROGRESS_RENEW_MIN_INTERVAL_S": "0.2",
            # A step that meets a stopped cloud asks again as the stream reconnects (0.2-1 s),
            # not on the product's backoff (1 s doubling to 30 s): after a few seconds' outage
            # that slept up to ~6 s more once the cloud was back, in every outage test.
            "AMC_HOST_PLANNER_WAIT_INITIAL_S": "0.2",
            "AMC_HOST_PLANNER_WAIT_MAX_S": "1",
            "AMC_HOST_PLANNER_TRANSPORT": transport,
            "AMC_HOST_METRICS_ADDRESS": "off",  # as the cloud's: 9472 for every test's host
            "AMC_PLANNER_PROVIDER": "offline",
        }
    )
    env.update(extra or {})
    return AmcProcess(name, ["host", "run"], env, workdir / f"{name}.log")


def refused_start(
    workdir: Path, pki_dir: Path, database_url: str, extra: Mapping[str, str] | None = None
) -> str:
    """What `amc cloud serve` on `database_url` says when it must refuse to start: it exits 2
    by itself (within 60 s), never listening."""
    cloud = cloud_process(
        workdir, "cloud", database_url=database_url, pki_dir=pki_dir, port=free_port(), extra=extra
    ).start()
    try:
        assert cloud.proc is not None
        try:
            code = cloud.proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        cloud.stop()
    said = cloud.output()
    assert code == 2, said
    assert "listening" not in said, said
    return said


class HostOptions(TypedDict, total=False):
    """What `host_process` takes besides where its cloud is."""

    phones: int
    settle_delay_s: float
    transport: str
    extra: Mapping[str, str]
    name: str


@dataclass
class Fleet:
    """One cloud's fixed port and database, which its `amc cloud serve` processes take turns on
    (a restart, a deploy) and its hosts dial: the setup every fault test starts with, said once
    so that a test shows only what it does to the processes."""

    workdir: Path
    pki_dir: Path
    #: Default: the workdir's cloud.sqlite3, a copy of a database at head (support.migrated).
    database_url: str = ""
    cloud_env: Mapping[str, str] | None = None
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        if not self.database_url:
            self.database_url = migrated_sqlite_url(self.workdir / "cloud.sqlite3")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cloud(self, name: str = "cloud") -> AmcProcess:
        """A cloud process on the fleet's port and database (not started)."""
        return cloud_process(
            self.workdir,
            name,
            database_url=self.database_url,
            pki_dir=self.pki_dir,
            port=self.port,
            extra=self.cloud_env,
        )

    def host(self, host_id: str, **options: Unpack[HostOptions]) -> AmcProcess:
        """A host process dialing the fleet's cloud (not started)."""
        return host_process(
            self.workdir, host_id, cloud_address=self.address, pki_dir=self.pki_dir, **options
        )


def operator(address: str, pki_dir: Path) -> OperatorClient:
    """An operator client (certificate `operator-ops`) for `address`."""
    return OperatorClient.over(
        secure_channel(
            address,
            ca=pki_dir / "ca.pem",
            cert=pki_dir / f"operator-{OPERATOR}.pem",
            key=pki_dir / f"operator-{OPERATOR}.key",
        )
    )


async def wait_serving(address: str, pki_dir: Path, within: float = 90.0) -> None:
    """Until the cloud at `address` answers its health check with SERVING. The bound is for a
    cloud that never will: a loaded machine (load 12-20) once took over 30 s to start one."""
    deadline = time.monotonic() + within
    client = operator(address, pki_dir)
    try:
        stub: Any = health_pb2_grpc.HealthStub(client.channel)
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"cloud at {address} not serving within {within}s")
            await asyncio.sleep(0.1)
    finally:
        await client.close()


async def get_task(client: OperatorClient, task_id: str) -> types_pb2.Task:
    reply: task_service_pb2.GetTaskResponse = await client.tasks.GetTask(
        task_service_pb2.GetTaskRequest(task_id=task_id), timeout=5
    )
    return reply.task


async def wait_task(
    client: OperatorClient,
    task_id: str,
    predicate: Any,
    within: float = 60.0,
    what: str = "condition",
) -> types_pb2.Task:
    """Poll GetTask until `predicate(task)`; UNAVAILABLE (a restarting cloud) is retried."""
    deadline = time.monotonic() + within
    last: types_pb2.Task | None = None
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):
            last = await get_task(client, task_id)
            if predicate(last):
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id}: {what} not reached within {within}s: {last}")
        await asyncio.sleep(0.1)


async def dark_theme_running(client: OperatorClient, host_id: str, step: int = 1) -> str:
    """Submit "Turn on dark theme" (three attempts) and wait until `host_id` runs it at `step`
    or later; its task id. The fault suites' usual start: a task under way on a known host."""
    submitted = await client.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(goal="Turn on dark theme", max_attempts=3)
    )
    task_id: str = submitted.task.task_id
    await wait_task(
        client,
        task_id,
        lambda t: (
            t.status == types_pb2.TASK_STATUS_RUNNING
            and t.host_id == host_id
            and t.progress.step_index >= step
        ),
        what=f"running on host {host_id} at step {step}",
    )
    return task_id


async def connected_hosts(client: OperatorClient) -> set[str]:
    """Ids of the hosts the cloud sees as connected now."""
    from amc.v1 import fleet_service_pb2

    reply = await client.fleet.ListHosts(fleet_service_pb2.ListHostsRequest(), timeout=5)
    return {h.host_id for h in reply.hosts if h.connected}


async def wait_connected(client: OperatorClient, host_ids: set[str], within: float = 30.0) -> float:
    """Until every host in `host_ids` is connected; returns the seconds it took."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):
            if host_ids <= await connected_hosts(client):
                return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(f"hosts {sorted(host_ids)} not all connected within {within}s")
        await asyncio.sleep(0.1)
