"""The embedded stack: cloud, host, virtual phones and (for `amc up`) the console in one process.

It runs exactly the parts of a real deployment — the cloud gRPC server over mTLS with a SQLite
file, a host agent whose lease stream and planner calls go through that server, phones reached
through the adb protocol by the real adbutils client — only wired on loopback, with certificates
it makes for itself. Nothing here is a shortcut the production path would not take.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.text import Text

from amc.v1 import (
    decision_log_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud.pki import ensure_embedded_pki
from cloud.server import CloudServer, build_server
from cloud.settings import DEFAULT_CLOUD_ADDRESS, DEFAULT_METRICS_ADDRESS, CloudSettings
from console import context, formatting
from console.cli_errors import UserError
from console.client import OperatorClient, secure_channel, watch_progress
from console.gateway.app import build_server as build_console_server
from console.settings import ConsoleSettings
from host import metrics as host_metrics
from host.console import HostConsoleSettings
from host.devices.virtual.adb_server import VirtualAdbServer
from host.devices.virtual.phone import VirtualPhone
from host.runner import run_host
from host.settings import DEFAULT_HOST_METRICS_ADDRESS, HostSettings
from telemetry import logs, metrics_http, tracing
from telemetry.metrics_http import MetricsServer

HOST_ID = "embedded-host"
OPERATOR = "admin"
#: The cloud's SQLite database in the data folder: migrated at start when new.
CLOUD_DATABASE = "cloud.sqlite3"
Transport = Literal["direct", "cloud"]


@dataclass(slots=True)
class EmbeddedStack:
    """Handles of a running embedded stack."""

    data_dir: Path
    pki_dir: Path
    cloud: CloudServer
    adb: VirtualAdbServer
    operator: OperatorClient
    host_stop: asyncio.Event
    host_task: asyncio.Task[None]
    #: The cloud's and the host's /metrics endpoints, when asked for (both parts run in this
    #: process, each with its own registry on its own address, as separate processes would).
    cloud_metrics: MetricsServer | None = None
    host_metrics: MetricsServer | None = None

    @property
    def cloud_address(self) -> str:
        return self.cloud.address


@contextlib.asynccontextmanager
async def embedded_stack(
    data_dir: Path,
    *,
    phones: int = 1,
    transport: Transport = "cloud",
    max_steps: int = 30,
    host_console: HostConsoleSettings | None = None,
    listen_address: str = "127.0.0.1:0",
    metrics: tuple[str, str] | None = None,
) -> AsyncIterator[EmbeddedStack]:
    """Start every part, yield, then stop them in reverse order (the cloud on a free port
    unless `listen_address` says where). `metrics`: the cloud's and the host's /metrics
    addresses (none are served by default: the embedded stack keeps to its gRPC port).

    `data_dir` is made owner-only (0700) when made here: it holds the cloud's database
    (prompts, the model's words), its screenshots, the console password and the fleet CA's
    key, none of them any other account's to read. One that exists keeps its mode."""
    await asyncio.to_thread(data_dir.mkdir, mode=0o700, parents=True, exist_ok=True)
    pki_dir = await asyncio.to_thread(ensure_embedded_pki, data_dir, [HOST_ID], operator=OPERATOR)
    # Each part is stopped on the way out, in reverse order, also when a later part fails to
    # start (a taken metrics port left the cloud, the host and the phones running).
    async with contextlib.AsyncExitStack() as parts:
        # The cloud first: a setting it refuses (a taken port, session mode on the offline
        # planner) stops the stack before anything else started.
        cloud = await build_server(
            CloudSettings(
                database_url=f"sqlite+aiosqlite:///{data_dir / CLOUD_DATABASE}",
                listen_address=listen_address,
                pki_dir=pki_dir,
                secrets_key_file=await asyncio.to_thread(_secrets_key_file, data_dir),
                artifact_dir=data_dir / "cloud-artifacts",
            )
        )
        parts.push_async_callback(cloud.stop, 1)
        await cloud.start()
        adb = VirtualAdbServer(VirtualPhone(f"virtual-{i + 1}") for i in range(phones))
        adb_port = await adb.start()
        parts.push_async_callback(adb.stop)
        host_settings = HostSettings(
            data_dir=data_dir / "host",
            device_source="adb",
            driver="adbutils",
            adb_host="127.0.0.1",
            adb_port=adb_port,
            cloud_address=cloud.address,
            certs_dir=pki_dir,
            host_id=HOST_ID,
            tls_server_name="localhost",
            planner_transport=transport,
            max_steps=max_steps,
            settle_delay_s=0.05,
            device_poll_interval_s=1.0,
        )
        host_stop = asyncio.Event()
        host_task = asyncio.create_task(
            run_host(host_settings, host_stop, console=host_console), name="host"
        )
        parts.push_async_callback(_stop_host, host_stop, host_task)
        operator = OperatorClient.over(
            secure_channel(
                cloud.address,
                ca=pki_dir / "ca.pem",
                cert=pki_dir / f"operator-{OPERATOR}.pem",
                key=pki_dir / f"operator-{OPERATOR}.key",
            )
        )
        parts.push_async_callback(operator.close)
        stack = EmbeddedStack(data_dir, pki_dir, cloud, adb, operator, host_stop, host_task)
        if metrics is not None:
            stack.cloud_metrics = cloud.serve_metrics(metrics[0])
            stack.host_metrics = served = metrics_http.serve(metrics[1], host_metrics.REGISTRY)
            if served is not None:
                parts.push_async_callback(asyncio.to_thread, served.stop)
        yield stack


async def _stop_host(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 15)


async def follow_tasks(
    client: OperatorClient, task_ids: list[str], out: Console, max_steps: int
) -> dict[str, types_pb2.Task]:
    """Print every progress change of the given tasks until all of them ended."""
    final: dict[str, types_pb2.Task] = {}
    seen: dict[str, tuple[int, int, int, str]] = {}
    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[badge]}"),
        console=out,
        transient=True,
    )
    with bars:
        ids = {t: bars.add_task(t, total=max_steps, badge="queued") for t in task_ids}
        async with contextlib.aclosing(watch_progress(client.progress)) as changes:
            async for change in changes:
                task = change.task
                if task.task_id not in ids:
                    continue
                key = (
                    task.status,
                    task.progress.step_index,
                    task.progress.step_status,
                    task.attempt,
                )
                key_full = (*key[:3], task.progress.summary)
                if seen.get(task.task_id) != key_full:
                    seen[task.task_id] = key_full
                    badge = formatting.progress_badge(task.progress, task.status)
                    out.print(
                        Text.assemble(
                            Text(task.task_id, style="dim"),
                            " ",
                            formatting.styled_status(task.status),
                            f" attempt {task.attempt}/{task.max_attempts}  {badge}",
                        )
                    )
                bars.update(
                    ids[task.task_id],
                    completed=task.progress.step_index,
                    badge=formatting.status_name(task.status),
                )
                if task.status in formatting.TERMINAL:
                    final[task.task_id] = task
                    if len(final) == len(task_ids):
                        break
    return final


async def _print_decisions(client: OperatorClient, task_id: str, out: Console) -> None:
    response = await client.decisions.ListDecisions(
        decision_log_service_pb2.ListDecisionsRequest(task_id=task_id, page_size=500)
    )
    for d in response.decisions:
        out.print(
            Text.assemble(
                Text(f"  step {d.step_index}", style="bold"), f" {d.tool_name} {d.arguments_json}"
            )
        )
        out.print(
            f"    rationale: {d.rationale or '-'}\n"
            f"    purpose:   {d.purpose or '-'}\n"
            f"    expected:  {d.expected_outcome or '-'}\n"
            f"    thinking:  {formatting.thinking_kind(d)}"
        )


class DemoInterrupted(Exception):
    """Ctrl-C (or SIGTERM) stopped the demo's host before its tasks ended."""


async def _unless_the_host_stops(
    following: Coroutine[Any, Any, dict[str, types_pb2.Task]], host: asyncio.Task[None]
) -> dict[str, types_pb2.Task]:
    """The tasks' ends, unless the host stops first.

    The host answers Ctrl-C itself (`run_host` takes SIGINT and SIGTERM to hand its work back
    gracefully), so Ctrl-C never reaches the demo's own wait: the tasks went back to the
    queue, no other host would take them, and `amc demo` waited for their end forever.
    """
    watching = asyncio.ensure_future(following)
    try:
        await asyncio.wait({watching, host}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not watching.done():
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    if not watching.cancelled():
        return watching.result()
    host.result()  # a host that failed on its own says why
    raise DemoInterrupted("the host handed its tasks back")


async def run_demo(
    data_dir: Path,
    goals: list[str],
    *,
    phones: int = 1,
    transport: Transport = "cloud",
    out: Console | None = None,
) -> bool:
    """Run the goals on a fresh embedded stack; True when every task succeeded."""
    out = out or Console()
    # The handler every other command writes through (AMC_LOG_FORMAT, scrubbed of secrets);
    # warnings only unless AMC_LOG_LEVEL says otherwise: the demo's own lines tell its story.
    log_settings = logs.LogSettings()
    if "level" not in log_settings.model_fields_set:
        log_settings.level = "WARNING"
    logs.configure(log_settings)
    tracing.configure("amc")
    # Each demo starts from an empty database and timeline; the certificates are kept.
    for stale in (
        "cloud.sqlite3",
        "cloud.sqlite3-wal",
        "cloud.sqlite3-shm",
        "cloud-artifacts",
        "host",
    ):
        path = data_dir / stale
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    max_steps = 30
    async with embedded_stack(
        data_dir, phones=phones, transport=transport, max_steps=max_steps
    ) as stack:
        out.print(
            f"amc embedded stack: cloud {stack.cloud_address} (mTLS, SQLite), host {HOST_ID} "
            f"with {phones} virtual phone(s), planner transport {transport}"
        )
        task_ids = []
        for goal in goals:
            response = await stack.operator.tasks.SubmitTask(
                task_service_pb2.SubmitTaskRequest(goal=goal)
            )
            task_ids.append(response.task.task_id)
            out.print(f"submitted {response.task.task_id}: {goal!r}")
        final = await _unless_the_host_stops(
            follow_tasks(stack.operator, task_ids, out, max_steps), stack.host_task
        )
        ok = True
        for task_id in task_ids:
            task = final[task_id]
            succeeded = task.status == types_pb2.TASK_STATUS_SUCCEEDED
            ok = ok and succeeded
            out.rule(f"{task.goal}: {formatting.status_name(task.status)}")
            if transport == "cloud":
                await _print_decisions(stack.operator, task_id, out)
            out.print(f"result: {task.result_summary or '-'}")
        return ok


def _secrets_key_file(data_dir: Path) -> Path:
    """The embedded cloud's key for tasks' secret parameters: made once, kept (0600) so a
    restarted stack can still open the secrets of tasks it has not run yet."""
    from cloud.secret_box import new_key

    path = data_dir / "secrets.key"
    if not path.exists():
        _create_private(path, new_key())
    return path


def _create_private(path: Path, text: str) -> None:
    """Write a new file readable by its owner only from the moment it exists (a file written
    first and chmod-ed after is, in between, as readable as the umask allows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)


def _console_password(data_dir: Path) -> str:
    """The embedded console's admin password: made once, kept (0600) so restarts keep logins."""
    path = data_dir / "console-password"
    if not path.exists():
        _create_private(path, secrets.token_urlsafe(18))
    return path.read_text().strip()


def _cannot_listen(port: int) -> str | None:
    """Why 127.0.0.1:`port` cannot be listened on (None: it can), checked by binding it."""
    try:
        with socket.create_server(("127.0.0.1", port)):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def _listen_address(requested: str | None) -> tuple[str, str]:
    """(address for the cloud, a note): the requested one as is, else the default port while
    it is free, else any free port (the context file says which)."""
    if requested is not None:
        return requested, ""
    host, port = DEFAULT_CLOUD_ADDRESS.rsplit(":", 1)
    taken = _cannot_listen(int(port))
    if taken is None:
        return DEFAULT_CLOUD_ADDRESS, ""
    return f"{host}:0", f" ({DEFAULT_CLOUD_ADDRESS} is taken: {taken})"


def _check_port(port: int, what: str, option: str) -> None:
    """A console port that is taken is one line, said before anything starts."""
    if port == 0:
        return
    taken = _cannot_listen(port)
    if taken is not None:
        raise UserError(
            f"{what} cannot listen on 127.0.0.1:{port} ({taken})",
            f"pick another port with {option} PORT, or stop what uses it",
        )


@contextlib.asynccontextmanager
async def _said_as_listen(requested: str | None) -> AsyncIterator[None]:
    """A listen address the cloud refuses is said as the `--listen` the person typed, not as
    the AMC_CLOUD_LISTEN_ADDRESS the stack passed it on as ("fix the variable" sent them
    looking for an environment variable they never set)."""
    from console.cli_errors import explain

    try:
        yield
    except Exception as exc:
        said = explain(exc) if requested is not None else None
        if said is None or not said.message.startswith(f"{_LISTEN_SETTING}: "):
            raise
        message = said.message.removeprefix(f"{_LISTEN_SETTING}: ")
        raise UserError(
            f"--listen {requested}: {message.split('; ')[0]}",
            "pick a free port on an address of this machine with --listen HOST:PORT, "
            "or leave --listen out for the default",
        ) from None


_LISTEN_SETTING = "AMC_CLOUD_LISTEN_ADDRESS"


async def run_up(
    data_dir: Path,
    *,
    phones: int = 2,
    console_port: int = 8080,
    host_console_port: int = 8765,
    transport: Transport = "cloud",
    listen_address: str | None = None,
    out: Console | None = None,
    metrics: bool = False,
) -> None:
    """Keep the embedded stack and both consoles running until Ctrl-C; print where they are
    (with `metrics`, the cloud's and the host's /metrics on their default loopback ports),
    and leave a context file (`console.context`) so `amc task …` elsewhere finds it.

    The cloud listens on `listen_address`, or by default on 127.0.0.1:50051 (any free port
    when that one is taken). A console port that is taken is refused before anything starts.
    """
    out = out or Console()
    logs.configure()
    traced = tracing.configure("amc")
    _check_port(console_port, "the operators' console", "--console-port")
    _check_port(host_console_port, "the host console", "--host-console-port")
    address, note = _listen_address(listen_address)
    sock = socket.create_server(("127.0.0.1", console_port))
    host_console = HostConsoleSettings(bind_port=host_console_port)
    addresses = (DEFAULT_METRICS_ADDRESS, DEFAULT_HOST_METRICS_ADDRESS) if metrics else None
    try:
        async with (
            _said_as_listen(listen_address),
            embedded_stack(
                data_dir,
                phones=phones,
                transport=transport,
                host_console=host_console,
                listen_address=address,
                metrics=addresses,
            ) as stack,
        ):
            password = await asyncio.to_thread(_console_password, data_dir)
            gateway = build_console_server(
                ConsoleSettings(
                    cloud_address=stack.cloud_address,
                    certs_dir=stack.pki_dir,
                    operator_name=OPERATOR,
                    tls_server_name="localhost",
                    admin_password=SecretStr(password),
                    bind_port=sock.getsockname()[1],
                ),
                log_level="warning",
            )
            serving = asyncio.create_task(gateway.serve(sockets=[sock]), name="console")
            console_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            written = context.write(
                context.Context(
                    cloud=stack.cloud_address,
                    pki_dir=str(stack.pki_dir.resolve()),
                    operator=OPERATOR,
                    console_url=console_url,
                    host_data_dir=str((data_dir / "host").resolve()),
                    pid=os.getpid(),
                )
            )
            out.print(
                f"console:  {console_url}/  (user admin, password in "
                f"{data_dir / 'console-password'})"
            )
            out.print(
                f"cloud:    {stack.cloud_address}{note} (mTLS; certificates in {stack.pki_dir})"
            )
            phones_list = ", ".join(stack.adb.phones)
            out.print(f"phones:   {phones_list} (adb server 127.0.0.1:{stack.adb.port})")
            out.print(
                f"operator: amc task list   (any shell finds this stack through {written}; "
                "a new host console login: amc host token)"
            )
            for part, served in (("cloud", stack.cloud_metrics), ("host", stack.host_metrics)):
                if served is not None:
                    out.print(f"metrics:  {part} {served.url}")
            out.print(f"tracing:  {traced}")
            try:
                await asyncio.wait({serving, stack.host_task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                context.remove(os.getpid())
                gateway.should_exit = True
                with contextlib.suppress(Exception):
                    await serving
            if stack.host_task.done() and not stack.host_task.cancelled():
                stack.host_task.result()  # the host stopped on its own: say why
    finally:
        sock.close()
