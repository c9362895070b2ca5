"""`amc`: the one command line for running the stack and operating the fleet.

Subcommands import their part lazily so `amc task list` does not pay for loading the host's OCR
engine or the cloud's database drivers. Built to be scripted: full task ids (a unique prefix
is accepted anywhere an id is), `--json` on every read command, exit codes that say how a
watched task ended (`console.exit_codes`), text printed exactly as written, and every error one
line with a hint (`console.cli_errors`; `--debug` adds the traceback).
"""

from __future__ import annotations

# First, before the slow imports: Ctrl-C while amc loads exits 130 without a traceback.
from console import loading  # isort: split

import asyncio
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import grpc
import typer
from google.protobuf.duration_pb2 import Duration
from rich.text import Text

from amc.v1 import (
    decision_log_service_pb2,
    fleet_service_pb2,
    flow_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud import cert_validity
from cloud.default_address import DEFAULT_CLOUD_ADDRESS
from console import context, exit_codes, formatting, task_ids, wording
from console.cli_errors import CloudTarget, UserError, from_rpc, run_main
from console.cli_help import PlainCommand, PlainGroup
from console.cli_output import err, out, print_json, print_json_line, print_text
from console.client import OperatorClient, hosts_kept, list_hosts_request, secure_channel
from console.limits import INT32_MAX, INT64_MAX, MAX_SECONDS, whole_number
from console.watching import watch_through_restarts
from planner.budget import dollars

if TYPE_CHECKING:
    from export.run import Run
    from host.settings import HostSettings


def _typer(help: str) -> typer.Typer:
    return typer.Typer(
        no_args_is_help=True,
        help=help,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
        cls=PlainGroup,
    )


app = _typer("Agentic Mobile Control: run the stack and operate the fleet.")
cloud_app = _typer("Run the control plane.")
host_app = _typer("Run a host agent, log in to its console, list the fleet's hosts.")
console_app = _typer("Run the operators' web console.")
certs_app = _typer("Manage the fleet CA and certificates.")
task_app = _typer("Submit, list, show, watch and cancel tasks; read their lease history.")
flows_app = _typer("Learned flows: list, show, disable and enable them.")
app.add_typer(cloud_app, name="cloud")
app.add_typer(host_app, name="host")
app.add_typer(console_app, name="console")
app.add_typer(certs_app, name="certs")
app.add_typer(task_app, name="task")
app.add_typer(flows_app, name="flows")

T = TypeVar("T")

#: What `amc demo` runs, one goal per virtual phone (the first is the quickstart's job).
DEMO_GOALS = (
    "Turn on dark theme",
    "Create a contact named Ada Lovelace with phone 555 0100",
    "Set an alarm for 10:15 PM",
    "Turn off Wi-Fi, then return to the home screen",
)
#: Where `amc up` keeps its state, and so where the operator commands look by default.
UP_DIR = Path(".amc/up")

DataDir = Annotated[
    Path,
    typer.Option(
        envvar="AMC_DATA_DIR", metavar="DIR", help="Where the embedded stack keeps its state."
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON (the console API's shapes).")]
TaskIdArg = Annotated[
    str,
    typer.Argument(metavar="TASK_ID", help="A task id, or any unique prefix of one."),
]


def _examples(*lines: str) -> str:
    """A command's epilog: examples, kept as written (click's `\\b` stops re-wrapping)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


def _run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


class Status(StrEnum):
    """Task statuses as `--status` takes them."""

    queued = "queued"
    assigned = "assigned"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


# --- global options ----------------------------------------------------------------------------


@dataclass(slots=True)
class Connection:
    """Where the operator commands go and as whom (options > environment > `amc up`'s
    context file > the defaults of `amc up`)."""

    address: str
    pki_dir: Path
    #: The name of the certificate used (an operator's, or a viewer's when `kind` says so).
    operator: str
    #: Where the values came from, said after a missing folder (": no `amc up` is running…").
    source: str
    #: "viewer" with `--viewer NAME`: a certificate the cloud lets read, never change.
    kind: str = "operator"

    @property
    def target(self) -> CloudTarget:
        return CloudTarget(self.address, self.operator, str(self.pki_dir / "ca.pem"), self.kind)

    def files(self) -> tuple[Path, Path, Path]:
        """(ca, cert, key), or a UserError saying which is missing and how to get it."""
        ca = self.pki_dir / "ca.pem"
        kind, name = self.kind, self.operator
        cert = self.pki_dir / f"{kind}-{name}.pem"
        key = self.pki_dir / f"{kind}-{name}.key"
        flag = "--viewer" if kind == "viewer" else "--operator"
        if not self.pki_dir.is_dir():
            raise UserError(
                f"no certificate folder {self.pki_dir}{self.source}",
                "start the stack with `amc up`, or pass --pki-dir DIR (AMC_PKI_DIR) with the "
                "fleet CA and operator certificates",
            )
        if not ca.is_file():
            raise UserError(
                f"no fleet CA certificate ca.pem in {self.pki_dir}",
                "pass --pki-dir DIR with the folder `amc certs init DIR` wrote",
            )
        if not cert.is_file() or not key.is_file():
            raise UserError(
                f"no certificate for {kind} {name!r} in {self.pki_dir} "
                f"({kind}-{name}.pem and .key)",
                f"issue one with `amc certs {kind} {self.pki_dir} {name}`, or pass "
                f"{flag} NAME of one that exists",
            )
        try:
            cert_validity.check(cert, ca, f"{kind} certificate", key=key)
        except cert_validity.CertificateInvalid as exc:
            raise UserError(
                str(exc),
                f"issue a new one with `amc certs {kind} {self.pki_dir} {name}` "
                "from this fleet's CA",
                exit_codes.CERTIFICATE,
            ) from None
        return ca, cert, key

    def client(self) -> OperatorClient:
        ca, cert, key = self.files()
        return OperatorClient.over(secure_channel(self.address, ca=ca, cert=cert, key=key))


_connection: Connection | None = None
_debug = False


def debugging() -> bool:
    return _debug or os.environ.get("AMC_DEBUG", "").lower() in ("1", "true", "yes")


@app.callback()
def global_options(
    cloud: Annotated[
        str | None,
        typer.Option(
            envvar="AMC_CLOUD",
            metavar="HOST:PORT",
            help=f"Cloud address (default: the running `amc up`, else {DEFAULT_CLOUD_ADDRESS}).",
            show_default=False,
        ),
    ] = None,
    pki_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="AMC_PKI_DIR",
            metavar="DIR",
            help="Folder with ca.pem and the operator's certificate (default: the running "
            "`amc up`'s, else .amc/up/pki).",
            show_default=False,
        ),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option(
            envvar="AMC_OPERATOR",
            metavar="NAME",
            help="Operator certificate to use: operator-NAME.pem in the PKI folder "
            "(default: admin).",
            show_default=False,
        ),
    ] = None,
    viewer: Annotated[
        str | None,
        typer.Option(
            envvar="AMC_VIEWER",
            metavar="NAME",
            help="Use the viewer certificate viewer-NAME.pem in the PKI folder instead: the "
            "read commands work, the cloud refuses any change.",
            show_default=False,
        ),
    ] = None,
    debug: Annotated[
        bool,
        typer.Option(envvar="AMC_DEBUG", help="Print the traceback of an error, too."),
    ] = False,
) -> None:
    """Operator commands (task, decisions, host list) find the cloud from these options, the
    AMC_* variables, or the context file a running `amc up` writes."""
    global _connection, _debug
    _debug = debug
    if viewer is not None and operator is not None:
        raise typer.BadParameter(
            "name --operator (AMC_OPERATOR) or --viewer (AMC_VIEWER), not both",
            param_hint="'--viewer'",
        )
    port = (cloud or "").rpartition(":")[2]
    number = whole_number(port)
    if port.isdigit() and (number is None or number > 65535):
        # gRPC takes the port modulo 65536: 127.0.0.1:99999 dialled 127.0.0.1:34463; digits
        # of another script ("٣", "²": isdigit() says yes) are no port at all.
        raise typer.BadParameter(f"{cloud}: a port is 0 to 65535", param_hint="'--cloud'")
    running = context.read() if cloud is None or pki_dir is None else None
    source = ""
    if pki_dir is None:
        source = (
            f", named by the running `amc up` in {context.path()}"
            if running is not None
            else ": no `amc up` is running here and neither --pki-dir nor AMC_PKI_DIR is set"
        )
    _connection = Connection(
        address=cloud or (running.cloud if running else DEFAULT_CLOUD_ADDRESS),
        pki_dir=pki_dir or (Path(running.pki_dir) if running else UP_DIR / "pki"),
        operator=viewer or operator or (running.operator if running else "admin"),
        source=source,
        kind="viewer" if viewer is not None else "operator",
    )


def _with_client(action: Callable[[OperatorClient], Awaitable[T]]) -> T:
    """Run `action` with an operator client; gRPC failures become one-line UserErrors."""
    if _connection is None:
        raise UserError("no cloud connection configured")
    connection = _connection

    async def go() -> T:
        client = connection.client()
        try:
            return await action(client)
        except grpc.aio.AioRpcError as error:
            raise from_rpc(error, connection.target) from error
        finally:
            await client.close()

    return _run(go())


# --- the embedded stack ------------------------------------------------------------------------


@app.command(
    cls=PlainCommand,
    epilog=_examples(
        "amc demo",
        'amc demo -g "Turn on dark theme" -g "Set an alarm for 7:30 AM" --phones 2',
    ),
)
def demo(
    data_dir: DataDir = Path(".amc/demo"),
    goal: Annotated[
        list[str] | None,
        typer.Option("--goal", "-g", metavar="GOAL", help="Goal to run (repeatable)."),
    ] = None,
    phones: Annotated[
        int, typer.Option(metavar="N", help="Virtual phones on the host.", min=1)
    ] = 3,
) -> None:
    """Run the embedded stack, execute the goals (by default one per phone, all at once) with
    live progress; exit 0 if all succeed, 1 if one did not."""
    from console.embedded import DemoInterrupted, run_demo

    goals = goal or list(DEMO_GOALS[:phones]) or ["Turn on dark theme"]
    try:
        ok = _run(run_demo(data_dir, goals, phones=phones, out=out))
    except DemoInterrupted as stopped:
        err.print(f"amc demo: interrupted: {stopped}")
        raise typer.Exit(exit_codes.INTERRUPTED) from None
    raise typer.Exit(exit_codes.OK if ok else exit_codes.TASK_FAILED)


@app.command(
    cls=PlainCommand,
    epilog=_examples(
        "amc up                      # then, in another terminal: amc task list",
        "amc up --console-port 9090 --phones 3",
    ),
)
def up(
    data_dir: DataDir = UP_DIR,
    phones: Annotated[
        int, typer.Option(metavar="N", help="Virtual phones on the host.", min=1)
    ] = 2,
    console_port: Annotated[
        int,
        typer.Option(metavar="PORT", help="Port of the operators' console.", min=0, max=65535),
    ] = 8080,
    host_console_port: Annotated[
        int, typer.Option(metavar="PORT", help="Port of the host's console.", min=0, max=65535)
    ] = 8765,
    listen: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help=f"Where the cloud listens (default: {DEFAULT_CLOUD_ADDRESS}, or any free port "
            "when that one is taken; the context file tells the other commands which).",
            show_default=False,
        ),
    ] = None,
    metrics: Annotated[
        bool,
        typer.Option(help="Serve Prometheus metrics (cloud 127.0.0.1:9471, host :9472)."),
    ] = False,
) -> None:
    """Run the embedded stack (cloud, consoles, a host with virtual phones) until Ctrl-C, and
    leave a context file so `amc task …` in another terminal talks to it."""
    from console.embedded import run_up

    _run(
        run_up(
            data_dir,
            phones=phones,
            console_port=console_port,
            host_console_port=host_console_port,
            listen_address=listen,
            out=out,
            metrics=metrics,
        )
    )


# --- parts of a real deployment ----------------------------------------------------------------


@cloud_app.command(
    "serve",
    cls=PlainCommand,
    epilog=_examples(
        "AMC_CLOUD_PKI_DIR=pki amc cloud serve",
        "AMC_CLOUD_DATABASE_URL=postgresql+psycopg://amc@db/amc amc cloud serve",
    ),
)
def cloud_serve(
    insecure: Annotated[
        bool, typer.Option(help="Plaintext on loopback only, for local experiments.")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(envvar="AMC_DEBUG", help="Show the full traceback when it cannot start."),
    ] = False,
) -> None:
    """Serve every cloud gRPC service (settings from AMC_CLOUD_* and AMC_PLANNER_* variables).

    Prints where it listens, the store, the planner and the certificates once it serves; a
    setting that keeps it from starting is one line naming the setting and the fix (exit 2).
    """
    from cloud.startup import run
    from telemetry import logs

    logs.configure()
    raise typer.Exit(
        run(insecure=insecure, debug=debug or debugging(), say=lambda line: print(line, flush=True))
    )


@host_app.command(
    "run",
    cls=PlainCommand,
    epilog=_examples(
        "AMC_HOST_CLOUD_ADDRESS=cloud:50051 AMC_HOST_CERTS_DIR=pki AMC_HOST_HOST_ID=h1 \\",
        "  amc host run",
        "amc host run --console",
    ),
)
def host_run(
    console: Annotated[
        bool, typer.Option(help="Serve the host's local console (127.0.0.1:8765 by default).")
    ] = False,
    allow_remote: Annotated[
        bool, typer.Option(help="Let the local console bind a non-loopback address.")
    ] = False,
) -> None:
    """Run a host agent: connect to the cloud, drive the phones (settings from AMC_HOST_*).

    Prints what it runs (phones, planner, certificates, metrics at AMC_HOST_METRICS_ADDRESS,
    default 127.0.0.1:9472, tracing, logs) once it is up."""
    from host.console.settings import HostConsoleSettings
    from host.runner import run_host
    from host.settings import HostSettings
    from telemetry import logs, tracing

    logs.configure()
    try:
        tracing.configure("amc-host")
    except tracing.TracingConfigError as error:
        err.print(f"tracing: {error}")
        raise typer.Exit(2) from None
    console_settings = HostConsoleSettings(allow_remote=allow_remote) if console else None
    say = lambda line: print(line, flush=True)  # noqa: E731
    settings = HostSettings()
    try:
        _run(run_host(settings, console=console_settings, serve_metrics=True, say=say))
    except (OSError, sqlite3.Error) as exc:
        data = _data_dir_error(exc, settings)
        if data is not None:
            raise data from exc
        if isinstance(exc, OSError):
            raise _bind_error(exc, "the host console", "AMC_HOST_CONSOLE_BIND_PORT") from exc
        raise


def _data_dir_error(exc: OSError | sqlite3.Error, settings: HostSettings) -> UserError | None:
    """A data folder the host cannot write (read-only, full, not its own, a file) as one line naming
    the setting, not an "unexpected OSError" (exit 70, a bug's code) the operator must decode.
    A disk's refusal is told by the host's one table (`storage_fault`), also as SQLite says it
    (naming no file) when the folder already holds the databases; a start also refuses a folder
    that is not the host's own or is a file."""
    import errno

    from host.timeline.storage_faults import storage_fault

    reason = storage_fault(exc)
    if isinstance(exc, sqlite3.Error):
        if reason is None:
            return None
        path = settings.resolved_db_path.parent.absolute()  # the databases' folder
    else:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST):
            reason = exc.strerror or str(exc)
        if reason is None or not exc.filename:
            return None
        path = Path(os.fsdecode(exc.filename)).absolute()
        folders = {
            settings.data_dir,
            settings.resolved_db_path.parent,
            settings.resolved_artifact_dir,
        }
        if not any(path.is_relative_to(Path(f).absolute()) for f in folders):
            return None
    return UserError(
        f"cannot write the host's data folder: {reason}: {path}",
        "make it writable and give it space, or point AMC_HOST_DATA_DIR elsewhere",
    )


def _bind_error(exc: OSError, what: str, setting: str) -> UserError | OSError:
    """A port that is taken (or an address not on this machine) as one line, else `exc`."""
    import errno

    if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
        return UserError(
            f"{what} cannot listen: {exc.strerror or exc}",
            f"pick another port ({setting}) or stop what uses it",
        )
    return exc


@host_app.command(
    "token",
    cls=PlainCommand,
    epilog=_examples(
        "amc host token                          # the host of a running `amc up`",
        "amc host token --data-dir /var/lib/amc-host",
    ),
)
def host_token(
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="AMC_HOST_DATA_DIR",
            metavar="DIR",
            help="The host's data folder (default: the running `amc up`'s host, else "
            "amc_host_data).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print a fresh one-time login link for the host's local console (valid 10 minutes,
    good for one login). Anyone who can write the host's data folder can make one."""
    from host.console.login_token import ISSUED_TTL_S, issue, served_url, token_dir

    running = context.read()
    folder = data_dir or (Path(running.host_data_dir) if running else Path("amc_host_data"))
    if not folder.is_dir():
        raise UserError(
            f"no host data folder {folder}",
            "pass --data-dir DIR (AMC_HOST_DATA_DIR) of the host whose console you want",
        )
    tokens = token_dir(folder)
    token = issue(tokens)
    url = served_url(tokens)
    minutes = int(ISSUED_TTL_S // 60)
    if url is None:
        out.print(token)
        err.print(
            f"note: no host console serves from {folder} now; the token works for {minutes} "
            "minutes once one does (`amc host run --console`)"
        )
        return
    out.print(f"{url}/login?token={token}")
    err.print(f"one login, within {minutes} minutes")


@host_app.command(
    "list",
    cls=PlainCommand,
    epilog=_examples(
        "amc host list",
        "amc host list --disconnected",
        "amc host list --connected --json | jq '.hosts[].host_id'",
    ),
)
def host_list(
    connected: Annotated[bool, typer.Option(help="Only hosts connected now.")] = False,
    disconnected: Annotated[
        bool, typer.Option(help="Only hosts not connected now (down, or never back).")
    ] = False,
    json_out: Json = False,
) -> None:
    """List the fleet's hosts: connected or not, last seen, each phone busy (with its task)
    or idle. Connected: its Lease stream is open on a cloud replica that vouches for it."""
    from console.gateway.models import DispatchOut, HostList, HostOut

    if connected and disconnected:
        raise typer.BadParameter("name at most one of --connected and --disconnected")
    connection = (
        fleet_service_pb2.HOST_CONNECTION_CONNECTED
        if connected
        else fleet_service_pb2.HOST_CONNECTION_DISCONNECTED
        if disconnected
        else fleet_service_pb2.HOST_CONNECTION_UNSPECIFIED
    )

    async def fetch(client: OperatorClient) -> fleet_service_pb2.ListHostsResponse:
        fleet = fleet_service_pb2.ListHostsResponse()
        token = ""
        while True:
            # Said in a form an older cloud, which ignores `connection`, filters by too.
            page = hosts_kept(
                await client.fleet.ListHosts(
                    list_hosts_request(connection, page_size=500, page_token=token)
                ),
                connection,
            )
            fleet.hosts.extend(page.hosts)
            if not token:
                fleet.dispatch.CopyFrom(page.dispatch)
            token = page.next_page_token
            if not token:
                # Connected first: ListHosts pages by id (a key no host changes), and the
                # whole fleet is here to order.
                fleet.hosts.sort(key=lambda h: (not h.connected, h.host_id))
                return fleet

    fleet = _with_client(fetch)
    hosts = [HostOut.of(h) for h in fleet.hosts]
    if json_out:
        print_json(HostList(hosts=hosts, dispatch=DispatchOut.of(fleet.dispatch)))
        return
    if fleet.dispatch.paused:
        err.print(f"dispatch paused: {fleet.dispatch.reason}")
        err.print(formatting.hold_line(DispatchOut.of(fleet.dispatch)))
    if not hosts:
        out.print(
            "no host is disconnected"
            if disconnected
            else "no host is connected"
            if connected
            else "no host has connected yet"
        )
    for host in fleet.hosts:
        state = Text("connected", style="green") if host.connected else Text("disconnected")
        if host.connected and host.HasField("stopping_since"):
            # It takes no new task and hands back the ones it runs, then leaves.
            state = Text("stopping", style="yellow")
        # Connected: its replica vouches for its stream every heartbeat (last_seen_at is that
        # vouch, migration 0032); else when it last spoke or left.
        seen = "now" if host.connected else formatting.ago(host.last_seen_at) or "never"
        out.print(
            Text.assemble(Text(host.host_id, style="bold"), " ", state, f" · last seen {seen}")
        )
        if host.HasField("held_back"):
            out.print(f"  no new task: {host.held_back.reason}")
        busy = {b.device_serial: b for b in host.busy_phones}
        for device in host.devices:
            word = formatting.enum_word(types_pb2.DeviceState, device.state, "DEVICE_STATE_")
            b = busy.pop(device.serial, None)
            now = f"busy: {b.task_id} {b.goal}" if b else "idle"
            if device.reason:  # kept out of work by its host, which says why
                word += f": {device.reason}"
            out.print(f"  {device.serial} ({device.model or '-'}, {word}) {now}")
        for b in busy.values():
            out.print(f"  {b.device_serial} (not announced) busy: {b.task_id} {b.goal}")


@host_app.command(
    "export",
    cls=PlainCommand,
    epilog=_examples(
        "amc host export 3f2a9c01d2e54b6f8a7c9e0b1d2f3a4b",
        "amc host export 3f2a9c01d2e54b6f8a7c9e0b1d2f3a4b -o dark-theme.zip",
    ),
)
def host_export(
    task_id: Annotated[
        str, typer.Argument(metavar="TASK_ID", help="The task's full id (as this host ran it).")
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="ZIP", help="Zip to write (amc-export-ID.zip)."),
    ] = None,
) -> None:
    """Export a task from this host's timeline (with screenshots) as one zip: report.html,
    run.gif, run.mp4, steps.jsonl, screenshots/ (docs/export.md). Settings from AMC_HOST_*."""
    from console.exporting import export_host_task
    from host.settings import HostSettings

    settings = HostSettings()
    _export_done(
        lambda: export_host_task(
            settings.resolved_db_path,
            settings.resolved_artifact_dir,
            settings.host_id or "",
            task_id,
            output,
        )
    )


@console_app.command("serve", cls=PlainCommand)
def console_serve() -> None:
    """Serve the operators' web console and JSON API (settings from AMC_CONSOLE_*)."""
    from console.gateway.app import serve
    from console.settings import ConsoleSettings
    from telemetry import logs

    logs.configure()
    settings = ConsoleSettings()
    try:
        _run(serve(settings))
    except OSError as exc:
        raise _bind_error(exc, "the console", "AMC_CONSOLE_BIND_PORT") from exc


# --- certificates ------------------------------------------------------------------------------


@certs_app.command("init", cls=PlainCommand, epilog=_examples("amc certs init pki"))
def certs_init(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="Where to write the CA and server cert.")
    ],
    server_name: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME", help="Extra DNS name of the cloud (repeatable)."),
    ] = None,
) -> None:
    """Create a fleet CA and a server certificate."""
    from cloud import pki

    try:
        pki.init_ca(directory)
        pki.write_server_cert(directory, server_name or [])
    except OSError as exc:
        raise _unwritable(directory, exc) from exc
    out.print(f"fleet CA and server certificate written to {directory}")


@certs_app.command("host", cls=PlainCommand, epilog=_examples("amc certs host pki lab-host-1"))
def certs_host(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Folder holding the fleet CA.")],
    host_id: Annotated[
        str, typer.Argument(metavar="HOST_ID", help="Host id; becomes the certificate's identity.")
    ],
) -> None:
    """Issue a host client certificate signed by the fleet CA."""
    from cloud import pki

    cert = _certificate(lambda: pki.write_host_cert(directory, host_id), directory)
    serial = pki.serial_hex(cert.read_bytes())
    out.print(f"host certificate: {cert} (key beside it, readable by you only)")
    out.print(f"serial {serial} (what `amc certs revoke --serial` names)")


@certs_app.command("operator", cls=PlainCommand, epilog=_examples("amc certs operator pki alice"))
def certs_operator(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Folder holding the fleet CA.")],
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Operator name; becomes the identity.")
    ],
) -> None:
    """Issue an operator client certificate signed by the fleet CA."""
    from cloud import pki

    cert = _certificate(lambda: pki.write_operator_cert(directory, name), directory)
    serial = pki.serial_hex(cert.read_bytes())
    out.print(f"operator certificate: {cert} (key beside it, readable by you only)")
    out.print(f"serial {serial} (what `amc certs revoke --serial` names)")


@certs_app.command("viewer", cls=PlainCommand, epilog=_examples("amc certs viewer pki dana"))
def certs_viewer(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Folder holding the fleet CA.")],
    name: Annotated[str, typer.Argument(metavar="NAME", help="Viewer name; becomes the identity.")],
) -> None:
    """Issue a viewer client certificate: the cloud's reads only (tasks, progress, decisions,
    screenshots, flows, hosts, spend); submitting, cancelling and changing flows are refused."""
    from cloud import pki

    cert = _certificate(lambda: pki.write_viewer_cert(directory, name), directory)
    serial = pki.serial_hex(cert.read_bytes())
    out.print(f"viewer certificate: {cert} (key beside it, readable by you only)")
    out.print(f"serial {serial} (what `amc certs revoke --serial` names)")


CloudDatabase = Annotated[
    str,
    typer.Option(
        envvar="AMC_CLOUD_DATABASE_URL",
        metavar="URL",
        help="The cloud's database (what the replicas use); revocations are recorded there.",
    ),
]
CertFile = Annotated[
    Path | None,
    typer.Option(
        "--cert", metavar="PEM_FILE", help="The certificate (PEM) to revoke, by its serial."
    ),
]
Serial = Annotated[
    str | None, typer.Option(metavar="HEX", help="A certificate serial (hex) to revoke.")
]
HostId = Annotated[
    str | None,
    typer.Option("--host", metavar="HOST_ID", help="Revoke every certificate of this host id."),
]


def _revocation_target(cert: Path | None, serial: str | None, host: str | None) -> dict[str, str]:
    from cloud import pki

    given = [x for x in (cert, serial, host) if x is not None]
    if len(given) != 1:
        raise typer.BadParameter("name exactly one of --cert, --serial and --host")
    if cert is not None:
        return {"serial": pki.serial_hex(cert.read_bytes())}
    return {"serial": serial} if serial is not None else {"host_id": str(host)}


def _on_database(url: str, action: Callable[[Any], Awaitable[T]]) -> T:
    """`action` on the replicas' database at `url`, migrated first. One it cannot open (no
    driver here for the URL, a server down, a wrong password) was "unexpected
    OperationalError", SQLAlchemy's text and exit 70; one that is not a cloud's (no file
    there, or no amc tables: a typo in the path) was made and migrated, and `amc certs revoke`
    said "revoked" while every replica still accepted the certificate. Both are one line."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from cloud.store.database import Store
    from cloud.store.engine import upgrade
    from cloud.store.sqlite_file import sqlite_file, sqlite_in_memory
    from telemetry.redaction import shown_url

    try:
        parsed = make_url(url)
    except ArgumentError:
        # Not quoted: a URL that cannot be read has no password that could be masked in it
        # (`postgresql+psycopg//amc:PASSWORD@db/amc` was shown whole, its password with it).
        raise UserError(
            "the database URL is not one (not shown: it may hold a password); a database URL"
            " starts DIALECT+DRIVER:// (postgresql+psycopg://, sqlite+aiosqlite:///)",
            _DATABASE_HINT,
        ) from None
    shown = shown_url(parsed)
    # By the file an SQLite URI (`file:…?uri=true`) names, not its text: read as a path,
    # `file:/data/cloud.sqlite3` was "no such file" for a database that was there.
    if sqlite_in_memory(parsed):
        raise UserError(
            f"no cloud database at {shown}: an in-memory database holds none", _DATABASE_HINT
        )
    file = sqlite_file(parsed)
    if file is not None and not file.is_file():
        raise UserError(f"no cloud database at {shown}: there is no such file", _DATABASE_HINT)

    async def go() -> T:
        store = Store.from_url(url)
        try:
            async with store.engine.connect() as connection:
                revision = await connection.run_sync(
                    lambda c: MigrationContext.configure(c).get_current_revision()
                )
            if revision is None:
                raise UserError(
                    f"no cloud database at {shown}: it holds no amc tables", _DATABASE_HINT
                )
            await upgrade(store.engine)
            return await action(store)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except (DBAPIError, OSError, ImportError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise UserError(f"cannot open the database {shown}: {reason}", _DATABASE_HINT) from exc


#: What to do about a database `amc certs revoke|unrevoke` cannot use.
_DATABASE_HINT = (
    "--database-url (AMC_CLOUD_DATABASE_URL) must be the database the replicas use, as their "
    "AMC_CLOUD_DATABASE_URL says; a replica makes its tables when it first starts"
)


@certs_app.command(
    "revoke",
    cls=PlainCommand,
    epilog=_examples(
        "amc certs revoke --cert pki/host-h7.pem --reason 'laptop stolen'",
        "amc certs revoke --host h7",
    ),
)
def certs_revoke(
    database_url: CloudDatabase,
    cert: CertFile = None,
    serial: Serial = None,
    host: HostId = None,
    reason: Annotated[
        str, typer.Option(metavar="TEXT", help="Why, kept with the revocation.")
    ] = "",
) -> None:
    """Revoke a certificate (by file or serial) or a whole host id, on every replica.

    Replicas on PostgreSQL refuse it at once (and drop its open streams); otherwise within
    AMC_CLOUD_REVOCATION_REFRESH_SECONDS.
    """
    from cloud import revocations

    target = _revocation_target(cert, serial, host)
    try:
        added = _on_database(
            database_url, lambda store: revocations.revoke(store, reason=reason, **target)
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    what = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in target.items())
    out.print(f"revoked: {what}" if added else f"already revoked: {what}")


@certs_app.command(
    "unrevoke", cls=PlainCommand, epilog=_examples("amc certs unrevoke --serial 4f1c2a")
)
def certs_unrevoke(
    database_url: CloudDatabase,
    cert: CertFile = None,
    serial: Serial = None,
    host: HostId = None,
) -> None:
    """Lift a revocation made by mistake."""
    from cloud import revocations

    target = _revocation_target(cert, serial, host)
    try:
        removed = _on_database(database_url, lambda store: revocations.lift(store, **target))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    what = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in target.items())
    out.print(f"revocation lifted: {what}" if removed else f"was not revoked: {what}")


@certs_app.command("secrets-key")
def certs_secrets_key() -> None:
    """Print a new key for AMC_CLOUD_SECRETS_KEY (encrypts tasks' secret parameters)."""
    from cloud.secret_box import new_key

    print(new_key())


def _certificate(write: Callable[[], Path], directory: Path) -> Path:
    """Issue a certificate; a missing CA, a bad name or a folder that cannot be written is a
    UserError."""
    try:
        return write()
    except FileNotFoundError as exc:
        raise UserError(
            f"no fleet CA in {directory} ({exc.filename})",
            f"create one with `amc certs init {directory}`",
        ) from exc
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    except OSError as exc:
        raise _unwritable(directory, exc) from exc


def _unwritable(directory: Path, exc: OSError) -> UserError:
    """A certificates folder that cannot be made or written (taken by a file, read-only, not
    allowed): it was an "unexpected" FileExistsError/PermissionError, exit 70."""
    where = f"{exc.filename}: " if exc.filename and Path(exc.filename) != directory else ""
    return UserError(
        f"cannot write certificates in {directory}: {where}{exc.strerror or exc}",
        "pass a folder you can write to",
    )


# --- operating the fleet -----------------------------------------------------------------------


@task_app.command(
    "submit",
    cls=PlainCommand,
    epilog=_examples(
        'amc task submit "Turn on dark theme"',
        'id=$(amc task submit "Set an alarm for 7:30 AM" --host lab-1) && amc task watch "$id"',
        'amc task submit "Open the clock" --request-id nightly-42 --json',
    ),
)
def task_submit(
    goal: Annotated[str, typer.Argument(metavar="GOAL", help="The goal in plain language.")],
    host: Annotated[str, typer.Option(metavar="HOST_ID", help="Run only on this host.")] = "",
    device: Annotated[
        str, typer.Option(metavar="SERIAL", help="Run only on this phone serial.")
    ] = "",
    max_attempts: Annotated[
        int, typer.Option(metavar="N", help="Attempts before failing; 0 = the cloud's default.")
    ] = 0,
    request_id: Annotated[
        str, typer.Option(metavar="KEY", help="Idempotency key: a retry returns the same task.")
    ] = "",
    lease_seconds: Annotated[
        int, typer.Option(metavar="SECONDS", help="Lease length; 0 = the cloud's default.")
    ] = 0,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="A secret parameter NAME the goal refers to as {{secret:NAME}} (repeatable). "
            "Its value comes from the environment variable AMC_SECRET_<NAME> (upper case), "
            "else a hidden prompt; never from the command line.",
        ),
    ] = None,
    no_replay: Annotated[
        bool, typer.Option("--no-replay", help="Plan every step with the model (no learned flow).")
    ] = False,
    max_tokens: Annotated[
        int,
        typer.Option(metavar="N", help="Token budget of the task; 0 = the cloud's default.", min=0),
    ] = 0,
    max_cost: Annotated[
        float,
        typer.Option(
            metavar="USD", help="Cost budget in US dollars; 0 = the cloud's default.", min=0
        ),
    ] = 0.0,
    json_out: Json = False,
) -> None:
    """Queue a task and print its id. The cloud checks the target against the fleet: a
    malformed host or phone is refused, one it never saw is queued with a warning (stderr), as
    is a goal that looks like it holds a credential (pass it with --secret instead)."""
    from console.gateway.models import SubmitOut, TaskOut

    _sendable("--max-attempts", max_attempts, INT32_MAX)
    _sendable("--lease-seconds", lease_seconds, int(MAX_SECONDS))
    _sendable("--max-tokens", max_tokens, INT64_MAX)
    request = task_service_pb2.SubmitTaskRequest(
        goal=goal,
        target=types_pb2.TaskTarget(host_id=host, device_serial=device),
        max_attempts=max_attempts,
        client_request_id=request_id,
        secrets={name: _secret_value(name) for name in secret or []},
        no_replay=no_replay,
        budget=types_pb2.TaskBudget(max_tokens=max_tokens, max_cost_usd=max_cost),
    )
    if lease_seconds:
        request.lease_duration.CopyFrom(Duration(seconds=lease_seconds))
    response = _with_client(lambda c: c.tasks.SubmitTask(request))
    if json_out:
        task = TaskOut.of(response.task) if response.HasField("task") else None
        print_json(
            SubmitOut(
                task=task, deduplicated=response.deduplicated, warnings=list(response.warnings)
            )
        )
        return
    for warning in response.warnings:
        err.print(f"warning: {warning}")
    if response.deduplicated:
        err.print("note: already submitted with this request id; this is the first task")
    out.print(response.task.task_id)


def _sendable(option: str, value: int, limit: int) -> None:
    """A usage error for a number no request can carry (`console.limits`): protobuf refused
    it with a ValueError, an "unexpected" exit 70. A wrong number in range is the cloud's to
    refuse, in its own words ("max_attempts: 0 (default) to 20")."""
    if not -limit <= value <= limit:
        raise typer.BadParameter(
            f"{value} is out of range ({-limit} to {limit})", param_hint=f"'{option}'"
        )


def _secret_value(name: str, given_as: str = "--secret") -> str:
    """A secret's value from AMC_SECRET_<NAME>, else a hidden prompt (a terminal only);
    `given_as` names where the name came from in a refusal."""
    import getpass
    import os
    import sys

    variable = f"AMC_SECRET_{name.upper()}"
    value = os.environ.get(variable)
    if value is None:
        if not sys.stdin.isatty():
            raise typer.BadParameter(
                f"set {variable} (no terminal to ask for it)", param_hint=given_as
            )
        value = getpass.getpass(f"value of secret {name} (not shown): ")
    try:
        value.encode()
    except UnicodeEncodeError:
        # Checked here, so the failure names the variable: the general "is not UTF-8 text"
        # message (cli_errors.not_utf8) quotes the text, which must not happen to a secret.
        raise typer.BadParameter(
            f"the value of {variable} is not UTF-8 text (not shown)", param_hint=given_as
        ) from None
    return value


@task_app.command(
    "list",
    cls=PlainCommand,
    epilog=_examples(
        "amc task list --status running --status queued",
        "amc task list --host lab-1 --text alarm",
        "amc task list --json | jq -r '.tasks[].task_id'",
    ),
)
def task_list(
    status: Annotated[
        list[Status] | None,
        typer.Option(
            metavar="STATUS",
            help="queued, assigned, running, succeeded, failed or cancelled (repeatable).",
            case_sensitive=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(metavar="HOST_ID", help="Only this host.")] = "",
    query: Annotated[
        str, typer.Option("--text", metavar="TEXT", help="Goal contains this text.")
    ] = "",
    limit: Annotated[int, typer.Option(metavar="N", help="At most this many (1 to 500).")] = 50,
    json_out: Json = False,
) -> None:
    """List tasks, newest first, with their full ids."""
    from console.gateway.models import TaskOut, TaskPage

    if not 1 <= limit <= 500:
        raise typer.BadParameter("1 to 500", param_hint="'--limit'")
    statuses = [types_pb2.TaskStatus.Value(f"TASK_STATUS_{s.value.upper()}") for s in status or []]
    request = task_service_pb2.ListTasksRequest(
        page_size=limit, statuses=statuses, host_id=host, query=query
    )
    response = _with_client(lambda c: c.tasks.ListTasks(request))
    if json_out:
        print_json(
            TaskPage(
                tasks=[TaskOut.of(t) for t in response.tasks],
                next_page_token=response.next_page_token,
            )
        )
        return
    if not response.tasks:
        filtered = bool(status or host or query)
        out.print("no tasks match these filters" if filtered else "no tasks yet")
        return
    for task in response.tasks:
        for line in formatting.task_lines(task):
            out.print(line)


async def _task_and_events(
    client: OperatorClient, text: str
) -> tuple[types_pb2.Task, list[task_service_pb2.LeaseEvent]]:
    task_id = await task_ids.resolve(client, text)
    got: task_service_pb2.GetTaskResponse = await client.tasks.GetTask(
        task_service_pb2.GetTaskRequest(task_id=task_id)
    )
    events = await _all_events(client, task_id)
    return got.task, events


async def _all_events(client: OperatorClient, task_id: str) -> list[task_service_pb2.LeaseEvent]:
    events: list[task_service_pb2.LeaseEvent] = []
    token = ""
    while True:
        page: task_service_pb2.ListTaskEventsResponse = await client.tasks.ListTaskEvents(
            task_service_pb2.ListTaskEventsRequest(
                task_id=task_id, page_size=1000, page_token=token
            )
        )
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            return events


def _event_word(event: task_service_pb2.LeaseEvent) -> str:
    kind = formatting.enum_word(task_service_pb2.LeaseEventKind, event.kind, "LEASE_EVENT_KIND_")
    result = formatting.status_name(event.result_status) if event.result_status else ""
    after = formatting.status_name(event.task_status) if event.task_status else ""
    return wording.event_line(
        kind,
        host_id=event.host_id,
        device_serial=event.device_serial,
        operator=event.operator,
        reason=event.reason,
        result_status=result,
        task_status=after,
    )


def _print_events(events: list[task_service_pb2.LeaseEvent], attempt: int) -> None:
    for event in events:
        if event.attempt == attempt:
            at = event.at.ToDatetime().strftime("%H:%M:%S")
            out.print(f"    {at} {_event_word(event)}")


@task_app.command(
    "show",
    cls=PlainCommand,
    epilog=_examples("amc task show 3f2a", "amc task show 3f2a9c01 --json | jq .task.status"),
)
def task_show(task_id: TaskIdArg, json_out: Json = False) -> None:
    """Show one task: status, totals, and every attempt with its lease history."""
    from console.gateway.models import LeaseEventOut, TaskOut

    task, events = _with_client(lambda c: _task_and_events(c, task_id))
    if json_out:
        print_json(
            {
                "task": TaskOut.of(task).model_dump(mode="json"),
                "events": [LeaseEventOut.of(e).model_dump(mode="json") for e in events],
            }
        )
        return
    out.print(
        Text.assemble(Text(task.task_id, style="bold"), " ", formatting.styled_status(task.status))
    )
    out.print(f"goal:    {task.goal}")
    line = formatting.progress_badge(task.progress, task.status)
    if line:
        out.print(f"step:    {line}")
    out.print(f"totals:  {formatting.totals_line(task.totals)}")
    out.print(f"spent:   {formatting.spending(task.totals.usage, task.budget)}")
    if task.totals.unsettled.calls:
        out.print(f"unknown: {formatting.unsettled_words(task.totals.unsettled)}")
    if task.result_summary:
        out.print(f"result:  {task.result_summary}")
    if task.cancelled_by:
        out.print(f"cancel asked by {task.cancelled_by}")
    if any(e.attempt == 0 for e in events):
        out.print("  before the first attempt:")
        _print_events(events, 0)
    for attempt in task.attempts:
        reason = f" — {attempt.failure_reason}" if attempt.failure_reason else ""
        out.print(
            Text.assemble(
                f"  attempt {attempt.attempt}: ",
                formatting.styled_status(attempt.status),
                f" on {attempt.host_id}/{attempt.device_serial}{reason}",
            )
            + f" · {formatting.usage_words(attempt.usage)}"
        )
        if attempt.unsettled.calls:
            print_text(f"    unknown: {formatting.unsettled_words(attempt.unsettled)}")
        if attempt.HasField("flow"):
            use = attempt.flow
            line = f"flow {use.flow_id}: " if use.flow_id else "no flow: "
            line += use.reason
            if use.flow_id:
                line += f"; {use.steps_replayed} step(s) replayed"
            if use.diverged_at_step:
                line += f"; diverged at step {use.diverged_at_step}: {use.divergence}"
            print_text(f"    {line}")
        _print_events(events, attempt.attempt)
        if attempt.renewals:
            out.print(
                f"    lease renewed {attempt.renewals} time{'s' if attempt.renewals > 1 else ''}"
            )


@task_app.command(
    "events",
    cls=PlainCommand,
    epilog=_examples("amc task events 3f2a", "amc task events 3f2a --json"),
)
def task_events(
    task_id: TaskIdArg,
    attempt: Annotated[int, typer.Option(metavar="N", help="Only this attempt; 0 = all.")] = 0,
    json_out: Json = False,
) -> None:
    """Print a task's lease history: assigned, resumed, revoked, expired, cancel requested (by
    whom, why), result, requeued — oldest first."""
    from console.gateway.models import LeaseEventOut, LeaseEventPage

    async def fetch(client: OperatorClient) -> list[task_service_pb2.LeaseEvent]:
        return await _all_events(client, await task_ids.resolve(client, task_id))

    events = [e for e in _with_client(fetch) if not attempt or e.attempt == attempt]
    if json_out:
        print_json(LeaseEventPage(events=[LeaseEventOut.of(e) for e in events]))
        return
    for event in events:
        at = event.at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
        out.print(f"{at}  attempt {event.attempt}  {_event_word(event)}")


#: How a watched task's end becomes the exit code.
_ENDINGS = {
    types_pb2.TASK_STATUS_SUCCEEDED: exit_codes.OK,
    types_pb2.TASK_STATUS_FAILED: exit_codes.TASK_FAILED,
    types_pb2.TASK_STATUS_CANCELLED: exit_codes.TASK_CANCELLED,
}


@task_app.command(
    "watch",
    cls=PlainCommand,
    epilog=_examples(
        "amc task watch 3f2a && echo succeeded",
        "amc task watch 3f2a --json | jq -r .task.status",
        "amc task watch                 # the whole fleet, until Ctrl-C",
    )
    + "\n\nExit codes: 0 succeeded, 1 failed, 3 cancelled (see docs/cli.md).",
)
def task_watch(
    task_id: Annotated[
        str,
        typer.Argument(
            metavar="[TASK_ID]", help="A task id or unique prefix; omit to watch the fleet."
        ),
    ] = "",
    thinking: Annotated[
        bool, typer.Option(help="Also print the model's thinking as it streams (session mode).")
    ] = False,
    json_out: Json = False,
) -> None:
    """Stream live progress until the task ends (or Ctrl-C for the fleet), through restarts of
    the cloud (up to 5 minutes away); the exit code says how the task ended."""
    from console.gateway.models import TaskOut

    async def watch(client: OperatorClient) -> int:
        if task_id:
            resolved = await task_ids.resolve(client, task_id)
        else:  # reach the cloud first: from then on a stream that breaks is opened again
            resolved = ""
            await client.tasks.ListTasks(task_service_pb2.ListTasksRequest(page_size=1))
        last: types_pb2.Task | None = None

        def gone(why: str) -> None:
            err.print(f"the cloud went away ({why}); watching again as soon as it answers")

        assert _connection is not None
        # An operator certificate that expired during the watch: exit 5 naming it, not 5 min.
        changes = watch_through_restarts(
            client, resolved, thinking=thinking, gone=gone, check=_connection.files
        )
        async for change in changes:
            if change.HasField("thinking"):
                live = change.thinking
                if json_out:
                    print_json_line(
                        {
                            "thinking": {
                                "task_id": live.task_id,
                                "attempt": live.attempt,
                                "delta": live.delta,
                            }
                        }
                    )
                else:
                    out.print(Text(live.delta, style="dim italic"), end="")
                continue
            task = last = change.task
            if json_out:
                print_json_line({"task": TaskOut.of(task).model_dump(mode="json")})
                continue
            badge = formatting.progress_badge(task.progress, task.status)
            spent = formatting.spent_words(task.totals)
            unknown = task.totals.unsettled
            out.print(
                Text.assemble(
                    task.task_id,
                    " ",
                    formatting.styled_status(task.status),
                    f" {badge}" if badge else "",
                    (f" · {spent}" if spent else "", "dim"),
                    # A call under way, or one whose cost stays unknown (decision 0080).
                    (
                        f" · unknown: {formatting.unsettled_words(unknown)}"
                        if unknown.calls
                        else "",
                        "yellow",
                    ),
                )
            )
        if not resolved:
            return exit_codes.OK
        assert last is not None  # the watch of one task ends only once its task did
        return _ENDINGS[last.status]

    raise typer.Exit(_with_client(watch))


@task_app.command(
    "cancel",
    cls=PlainCommand,
    epilog=_examples('amc task cancel 3f2a --reason "wrong phone"'),
)
def task_cancel(
    task_id: TaskIdArg,
    reason: Annotated[
        str, typer.Option(metavar="TEXT", help="Why; recorded and shown to operators.")
    ] = "cancelled from the command line",
    json_out: Json = False,
) -> None:
    """Cancel a task (a queued one at once; a running one when its host stops, within one step,
    or when its lease runs out)."""
    from console.gateway.models import TaskOut

    async def cancel(client: OperatorClient) -> types_pb2.Task:
        resolved = await task_ids.resolve(client, task_id)
        try:
            response: task_service_pb2.CancelTaskResponse = await client.tasks.CancelTask(
                task_service_pb2.CancelTaskRequest(task_id=resolved, reason=reason)
            )
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # "task … already ended: cancelled", the cloud's words; what to do next is ours.
            hint = f"nothing to cancel; `amc task show {resolved}` says how it ended"
            raise UserError(error.details() or "the task already ended", hint) from error
        return response.task

    task = _with_client(cancel)
    if json_out:
        print_json(TaskOut.of(task))
        return
    word = "cancelling" if task.cancel_requested else formatting.status_name(task.status)
    out.print(f"{task.task_id}: {word}")


#: The idempotency key of a retry of task X: a second `amc task retry X` (another operator,
#: a resent command) answers the task the first one queued instead of running X twice more.
RETRY_KEY = "retry-of-{}"


@task_app.command(
    "retry",
    cls=PlainCommand,
    epilog=_examples(
        "amc task retry 3f2a",
        'id=$(amc task retry 3f2a) && amc task watch "$id"',
        "AMC_SECRET_PIN=4711 amc task retry 3f2a   # a goal with {{secret:pin}}",
    ),
)
def task_retry(task_id: TaskIdArg, json_out: Json = False) -> None:
    """Queue a failed or cancelled task again, as a new task with what it was submitted with
    (goal, target, attempts, lease length, timeout from now, budget, --no-replay), and print
    its id. The task's secrets were deleted when it ended: each comes again from
    AMC_SECRET_<NAME>, else a hidden prompt. A task retried before answers that retry."""
    from console.gateway.models import SubmitOut, TaskOut
    from planner import secret_refs

    async def retry(client: OperatorClient) -> task_service_pb2.SubmitTaskResponse:
        resolved = await task_ids.resolve(client, task_id)
        got: task_service_pb2.GetTaskResponse = await client.tasks.GetTask(
            task_service_pb2.GetTaskRequest(task_id=resolved)
        )
        old = got.task
        if old.status not in (types_pb2.TASK_STATUS_FAILED, types_pb2.TASK_STATUS_CANCELLED):
            hint = (
                "`amc task submit` runs its goal again as a new task"
                if old.status == types_pb2.TASK_STATUS_SUCCEEDED
                else f"`amc task cancel {resolved}` first, or `amc task watch {resolved}`"
            )
            raise UserError(
                f"task {resolved} is {formatting.status_name(old.status)}: only a failed or "
                "cancelled task is retried",
                hint,
            )
        request = task_service_pb2.SubmitTaskRequest(
            goal=old.goal,
            target=old.target,
            max_attempts=old.max_attempts,
            lease_duration=old.lease_duration,
            client_request_id=RETRY_KEY.format(resolved),
            secrets={
                name: _secret_value(name, f"the goal's {secret_refs.reference(name)}")
                for name in secret_refs.names_in(old.goal)
            },
            no_replay=old.no_replay,
            budget=old.budget,
        )
        request.timeout.FromTimedelta(old.deadline.ToDatetime() - old.created_at.ToDatetime())
        response: task_service_pb2.SubmitTaskResponse = await client.tasks.SubmitTask(request)
        return response

    response = _with_client(retry)
    if json_out:
        print_json(
            SubmitOut(
                task=TaskOut.of(response.task),
                deduplicated=response.deduplicated,
                warnings=list(response.warnings),
            )
        )
        return
    for warning in response.warnings:
        err.print(f"warning: {warning}")
    if response.deduplicated:
        err.print("note: this task was retried before; this is the task that retry queued")
    out.print(response.task.task_id)


@task_app.command(
    "export",
    cls=PlainCommand,
    epilog=_examples(
        "amc task export 3f2a",
        "amc task export 3f2a --merge amc-export-host.zip -o dark-theme.zip",
    ),
)
def task_export(
    task_id: TaskIdArg,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="ZIP", help="Zip to write (amc-export-ID.zip)."),
    ] = None,
    merge: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="ZIP",
            help="A host's export of the task (amc host export) to merge in (repeatable).",
        ),
    ] = None,
) -> None:
    """Export a task from the cloud as one zip: report.html, run.gif, run.mp4, steps.jsonl and
    the steps' screenshots the hosts shipped to the cloud (docs/export.md). --merge a host's
    export to add what only it still holds."""
    from console.exporting import export_task
    from console.gateway.cloud import CloudClient

    if _connection is None:
        raise UserError("no cloud connection configured")
    c = _connection
    ca, cert, key = c.files()
    resolved = _with_client(lambda client: task_ids.resolve(client, task_id))

    async def go() -> tuple[Path, Run]:
        cloud = CloudClient(c.address, ca=ca, cert=cert, key=key, timeout_s=60)
        try:
            return await export_task(cloud, resolved, output, merge or [])
        except grpc.aio.AioRpcError as error:
            raise from_rpc(error, c.target) from error
        finally:
            await cloud.close()

    _export_done(lambda: _run(go()))


def _export_done(make: Callable[[], tuple[Path, Run]]) -> None:
    """Run an export; say where it went (stdout), or why not in one line (exit 2)."""
    from console.exporting import ExportError

    try:
        path, run = make()
    except ExportError as error:
        raise UserError(f"export: {error}") from error
    shots = sum(1 for s in run.steps if s.before_png)
    out.print(f"{path} ({len(run.steps)} steps, {shots} with screenshots, {run.origin})")


def _no_decisions_yet(transports: set[types_pb2.PlannerTransport.ValueType]) -> str:
    """Why a task has no decision yet: an operator told "the direct transport's outbox" about a
    cloud-planned task, or one that never started, looks in the wrong place."""
    if not transports:
        return "no decisions logged yet: no attempt has started"
    if types_pb2.PLANNER_TRANSPORT_DIRECT in transports:
        return (
            "no decisions logged yet (a host on the direct transport sends its own from its "
            "outbox in the background)"
        )
    return "no decisions logged yet: the cloud logs each step's as it plans it"


@app.command(
    cls=PlainCommand,
    epilog=_examples(
        "amc decisions 3f2a",
        "amc decisions 3f2a --attempt 2 --prompts",
        "amc decisions 3f2a --json | jq '.decisions[].usage'",
    ),
)
def decisions(
    task_id: TaskIdArg,
    attempt: Annotated[int, typer.Option(metavar="N", help="Only this attempt; 0 = all.")] = 0,
    prompts: Annotated[bool, typer.Option(help="Also print the prompts sent, as sent.")] = False,
    json_out: Json = False,
) -> None:
    """Print the per-step LLM record of a task (either transport: direct-transport hosts ship
    theirs from their outbox), text as the model wrote it."""
    from console.gateway.models import DecisionOut, DecisionPage, FailedCallsOut, PrunedOut
    from planner.convert import resumed_from_proto

    _sendable("--attempt", attempt, INT32_MAX)

    async def fetch(
        client: OperatorClient,
    ) -> tuple[
        list[types_pb2.Decision],
        decision_log_service_pb2.ListDecisionsResponse,
        set[types_pb2.PlannerTransport.ValueType] | None,
    ]:
        resolved = await task_ids.resolve(client, task_id)
        found: list[types_pb2.Decision] = []
        token = ""
        while True:
            page: decision_log_service_pb2.ListDecisionsResponse = (
                await client.decisions.ListDecisions(
                    decision_log_service_pb2.ListDecisionsRequest(
                        task_id=resolved, attempt=attempt, page_size=500, page_token=token
                    )
                )
            )
            found.extend(page.decisions)
            token = page.next_page_token
            if not token:
                break
        if found:  # every page has the same failed calls and pruned record
            return found, page, None
        # Nothing yet: which transports its attempts plan on says why (the hint below).
        got: task_service_pb2.GetTaskResponse = await client.tasks.GetTask(
            task_service_pb2.GetTaskRequest(task_id=resolved)
        )
        ran = [a for a in got.task.attempts if attempt in (0, a.attempt)]
        return found, page, {a.planner_transport for a in ran}

    found, last, transports = _with_client(fetch)
    failed = list(last.failed_calls)
    pruned = last.pruned if last.HasField("pruned") else None
    if json_out:
        print_json(
            DecisionPage(
                decisions=[DecisionOut.of(d) for d in found],
                next_page_token="",
                failed_calls=[FailedCallsOut.of(f) for f in failed],
                pruned=None if pruned is None else PrunedOut.of(pruned),
            )
        )
        return
    if not found and pruned is not None:
        err.print("no decisions left: the cloud's retention deleted them (see below)")
    elif not found:
        err.print(_no_decisions_yet(transports or set()))
    else:
        c = formatting.verdict_counts(found)
        out.print(
            f"verified steps: {c['met']} met · {c['not_met']} not met · {c['unknown']} unknown"
            + (f" · {c['unchecked']} not checked" if c["unchecked"] else "")
        )
    for d in found:
        out.rule(f"attempt {d.attempt} · step {d.step_index} · {d.provider}/{d.model}")
        print_text(f"rationale: {d.rationale or '-'}")
        resumed = resumed_from_proto(d)
        if resumed is not None:
            print_text(resumed.words())
        thinking = formatting.thinking_text(d)
        kind = formatting.thinking_kind(d)
        print_text(f"thinking ({kind})" + (f": {thinking}" if thinking else ""))
        print_text(f"action: {d.tool_name} {d.arguments_json}")
        print_text(f"purpose: {d.purpose}  expected: {d.expected_outcome}")
        if d.tool_name not in ("complete", "get_ui_tree"):
            out.print(Text("verdict: ") + formatting.verdict_words(d.verification))
        if d.mode == types_pb2.PLANNER_MODE_REPLAY:
            print_text(f"replayed: flow {d.flow_id} step {d.flow_step}")
        elif d.replay_divergence:
            print_text(
                f"took over from flow {d.flow_id} at step {d.flow_step}: {d.replay_divergence}"
            )
        elif d.flow_set_aside:
            print_text(f"flow {d.flow_id} set aside at step {d.flow_step}: {d.flow_set_aside}")
        latency_ms = d.latency.seconds * 1000 + d.latency.nanos // 1_000_000
        usage = d.usage
        notes = [formatting.retry_word(d)] if d.forced_retry else []
        if d.output_truncated:
            notes.append("cut off at the output limit")
        out.print(
            f"tokens in/out {usage.input_tokens}/{usage.output_tokens} · cache read/write "
            f"{usage.cache_read_input_tokens}/{usage.cache_creation_input_tokens} · "
            f"{dollars(usage.cost_usd)} · "
            f"{latency_ms} ms" + "".join(f" · {n}" for n in notes)
        )
        if prompts:
            session = d.planner_mode == "session"
            added = " (what this step added to the conversation)" if session else ""
            out.print(Text("── system prompt ──", style="bold"))
            print_text(d.system_prompt)
            out.print(Text(f"── user prompt{added} ──", style="bold"))
            print_text(d.user_prompt)
    plus = formatting.failed_calls_words(failed)
    if plus:
        out.print(plus)
    if pruned is not None:
        out.print(formatting.pruned_words(pruned) + (" (every attempt)" if attempt else ""))
    # The pruned record is the task's, not one attempt's: counted in the task's total only.
    total = formatting.total_usage(found, failed, None if attempt else pruned)
    if found or failed or pruned is not None:
        out.print(f"total: {formatting.usage_words(total)}")


def main() -> None:
    """The `amc` console script: the commands, with their failures as one line each."""
    groups = {group.name for group in app.registered_groups if group.name}
    code = run_main(
        lambda: app(standalone_mode=False), sys.argv[1:], debug=debugging, groups=groups
    )
    sys.exit(code)


# --- learned flows ---------------------------------------------------------------------------


class FlowStatus(StrEnum):
    """What `--status` accepts for flows."""

    active = "active"
    disabled = "disabled"
    retired = "retired"


FlowIdArg = Annotated[
    str,
    typer.Argument(metavar="FLOW_ID", help="A flow id, or a unique prefix of one."),
]
Reason = Annotated[str, typer.Option(metavar="TEXT", help="Why; recorded with your name.")]


async def _flow_id(client: OperatorClient, text: str) -> str:
    """The one flow id `text` is, or is a unique prefix of (flows are few: read them all).
    Blank is refused first: every id starts with it, so it named the only flow there was."""
    if not text.strip():
        raise UserError(f"{text!r} is not a flow id", "list flows with `amc flows list`")
    found: list[str] = []
    token = ""
    while True:
        page: flow_service_pb2.ListFlowsResponse = await client.flows.ListFlows(
            flow_service_pb2.ListFlowsRequest(page_size=500, page_token=token)
        )
        found += [f.flow_id for f in page.flows if f.flow_id.startswith(text)]
        token = page.next_page_token
        if not token:
            break
    if text in found:
        return text
    if len(found) == 1:
        return found[0]
    if not found:
        raise UserError(f"flow {text} not found", "list flows with `amc flows list`")
    raise UserError(f"{text!r} is the start of {len(found)} flow ids", "give more of the id")


@flows_app.command(
    "list",
    cls=PlainCommand,
    epilog=_examples(
        "amc flows list --status active", "amc flows list --json | jq '.flows[].goal_template'"
    ),
)
def flows_list(
    status: Annotated[
        list[FlowStatus] | None,
        typer.Option(
            metavar="STATUS",
            help="active, disabled or retired (repeatable).",
            case_sensitive=False,
        ),
    ] = None,
    limit: Annotated[int, typer.Option(metavar="N", help="At most this many (1 to 500).")] = 50,
    json_out: Json = False,
) -> None:
    """List learned flows, newest first, with their full ids."""
    from console.gateway.models import FlowOut, FlowPage

    if not 1 <= limit <= 500:
        raise typer.BadParameter("1 to 500", param_hint="'--limit'")
    statuses = [types_pb2.FlowStatus.Value(f"FLOW_STATUS_{s.value.upper()}") for s in status or []]
    request = flow_service_pb2.ListFlowsRequest(page_size=limit, statuses=statuses)
    response = _with_client(lambda c: c.flows.ListFlows(request))
    if json_out:
        print_json(
            FlowPage(
                flows=[FlowOut.of(f) for f in response.flows],
                next_page_token=response.next_page_token,
            )
        )
        return
    if not response.flows:
        err.print("no flows learned yet (every task that succeeds teaches one)")
        return
    out.print(formatting.flow_table(list(response.flows)))


@flows_app.command(
    "show",
    cls=PlainCommand,
    epilog=_examples("amc flows show 9c2e", "amc flows show 9c2e41d0 --json | jq .steps"),
)
def flows_show(flow_id: FlowIdArg, json_out: Json = False) -> None:
    """Show one flow: its steps, how often it was replayed, where it diverged."""
    from console.gateway.models import FlowOut

    async def read(c: OperatorClient) -> types_pb2.Flow:
        request = flow_service_pb2.GetFlowRequest(flow_id=await _flow_id(c, flow_id))
        response: flow_service_pb2.GetFlowResponse = await c.flows.GetFlow(request)
        return response.flow

    flow = _with_client(read)
    if json_out:
        print_json(FlowOut.of(flow))
        return
    out.print(
        Text(f"flow {flow.flow_id}", style="bold")
        + f" · {formatting.FLOW_STATUS_WORDS[flow.status]}"
    )
    print_text(f"goal: {flow.goal_template}")
    print_text(f"apps: {', '.join(flow.apps)}")
    print_text(f"learned from task {flow.source_task_id} attempt {flow.source_attempt}")
    print_text(f"status: {flow.status_reason}")
    out.print(
        f"used {flow.uses}× · replayed to the end {flow.replays_completed}× · diverged "
        f"{flow.divergences}× ({flow.consecutive_divergences} in a row)"
    )
    if flow.last_divergence:
        print_text(f"last divergence: {flow.last_divergence}")
    for step in flow.steps:
        where = flow.divergences_by_step.get(step.index, 0)
        target = f" on {formatting.target_words(step.target)}" if step.HasField("target") else ""
        param = f" (types {{{step.text_parameter}}})" if step.text_parameter else ""
        diverged = f" · diverged here {where}×" if where else ""
        print_text(f"  {step.index}. {step.tool_name}{target}{param}{diverged}")
        print_text(f"     purpose: {step.purpose} · expected: {step.expected_outcome}")
        print_text(f"     on {step.page_before} → {step.page_after}")


def _set_flow_status(flow_id: str, status: types_pb2.FlowStatus.ValueType, reason: str) -> None:
    async def change(c: OperatorClient) -> types_pb2.Flow:
        request = flow_service_pb2.SetFlowStatusRequest(
            flow_id=await _flow_id(c, flow_id), status=status, reason=reason
        )
        response: flow_service_pb2.SetFlowStatusResponse = await c.flows.SetFlowStatus(request)
        return response.flow

    flow = _with_client(change)
    print_text(
        f"{flow.flow_id}: {formatting.FLOW_STATUS_WORDS[flow.status]} ({flow.status_reason})"
    )


@flows_app.command(
    "disable",
    cls=PlainCommand,
    epilog=_examples("amc flows disable 9c2e --reason 'the Settings app changed'"),
)
def flows_disable(flow_id: FlowIdArg, reason: Reason = "") -> None:
    """Stop replaying a flow (until enabled again)."""
    _set_flow_status(flow_id, types_pb2.FLOW_STATUS_DISABLED, reason)


@flows_app.command("enable", cls=PlainCommand, epilog=_examples("amc flows enable 9c2e"))
def flows_enable(flow_id: FlowIdArg, reason: Reason = "") -> None:
    """Replay a disabled or retired flow again (its run of divergences starts over)."""
    _set_flow_status(flow_id, types_pb2.FLOW_STATUS_ACTIVE, reason)


@app.command(
    cls=PlainCommand,
    epilog=_examples("amc spend", "amc spend --days 7 --json | jq '.rows[].usage.cost_usd'"),
)
def spend(
    days: Annotated[
        int, typer.Option(metavar="N", help="Days back from today (UTC), 1 = today.", min=1)
    ] = 1,
    json_out: Json = False,
) -> None:
    """The fleet's model spending per day, host and model (every billed model call: logged
    decisions and failed decisions' calls; "decisions" counts the logged ones), and today's
    against the daily budget."""
    import datetime as dt

    from amc.v1 import fleet_service_pb2
    from console.gateway.models import SpendOut

    today = dt.datetime.now(dt.UTC).date()
    # Never before year 1 (a date cannot be): the cloud then says how many days it answers.
    back = min(days - 1, (today - dt.date.min).days)
    request = fleet_service_pb2.GetSpendRequest(
        since_day=(today - dt.timedelta(days=back)).isoformat(), until_day=today.isoformat()
    )
    response = _with_client(lambda c: c.fleet.GetSpend(request))
    if json_out:
        print_json(SpendOut.of(response, rows=True))
        return
    out.print(formatting.spend_table(list(response.rows)))
    out.print(f"today: {formatting.spending(response.today, response.daily_budget, 'daily')}")


# Last: the command line is loaded; from here on `run_main` handles Ctrl-C.
loading.finished()
