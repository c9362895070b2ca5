"""`amc`: the one command line for running the stack and operating the fleet.

Subcommands import their part lazily so `amc task list` does not pay for loading the host's OCR
engine or the cloud's database drivers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import grpc
import typer
from google.protobuf.duration_pb2 import Duration
from rich.console import Console

from amc.v1 import (
    decision_log_service_pb2,
    flow_service_pb2,
    progress_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud.settings import DEFAULT_CLOUD_ADDRESS
from console import formatting
from console.client import OperatorClient, secure_channel
from planner.errors import PlannerConfigError

if TYPE_CHECKING:
    from export.run import Run

app = typer.Typer(no_args_is_help=True, help="Agentic Mobile Control.", add_completion=False)
cloud_app = typer.Typer(no_args_is_help=True, help="Run the control plane.")
host_app = typer.Typer(no_args_is_help=True, help="Run a host agent.")
console_app = typer.Typer(no_args_is_help=True, help="Run the operators' web console.")
certs_app = typer.Typer(no_args_is_help=True, help="Manage the fleet CA and certificates.")
task_app = typer.Typer(no_args_is_help=True, help="Submit, list, watch and cancel tasks.")
flows_app = typer.Typer(
    no_args_is_help=True, help="Learned flows: list, show, disable and enable them."
)
app.add_typer(cloud_app, name="cloud")
app.add_typer(host_app, name="host")
app.add_typer(console_app, name="console")
app.add_typer(certs_app, name="certs")
app.add_typer(task_app, name="task")
app.add_typer(flows_app, name="flows")

out = Console()
err = Console(stderr=True)
T = TypeVar("T")

#: What `amc demo` runs, one goal per virtual phone (the first is the quickstart's job).
DEMO_GOALS = (
    "Turn on dark theme",
    "Create a contact named Ada Lovelace with phone 555 0100",
    "Set an alarm for 10:15 PM",
    "Turn off Wi-Fi, then return to the home screen",
)

DataDir = Annotated[
    Path,
    typer.Option(envvar="AMC_DATA_DIR", help="Where the embedded stack keeps its state."),
]


def _run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    try:
        return asyncio.run(main())
    except grpc.aio.AioRpcError as error:
        out.print(f"[red]{error.code().name}[/red]: {formatting.literal(error.details() or '')}")
        raise typer.Exit(2) from None
    except PlannerConfigError as error:
        out.print(f"[red]configuration[/red]: {formatting.literal(str(error))}", soft_wrap=True)
        raise typer.Exit(2) from None


# --- the embedded stack ----------------------------------------------------------------------


@app.command()
def demo(
    data_dir: DataDir = Path(".amc/demo"),
    goal: Annotated[
        list[str] | None, typer.Option("--goal", "-g", help="Goal to run (repeatable).")
    ] = None,
    phones: Annotated[int, typer.Option(help="Virtual phones on the host.", min=1)] = 3,
) -> None:
    """Run the embedded stack, execute the goals (by default one per phone, all at once) with
    live progress, exit 0 if all succeed."""
    from console.embedded import run_demo

    goals = goal or list(DEMO_GOALS[:phones]) or ["Turn on dark theme"]
    ok = _run(run_demo(data_dir, goals, phones=phones, out=out))
    raise typer.Exit(0 if ok else 1)


@app.command()
def up(
    data_dir: DataDir = Path(".amc/up"),
    phones: Annotated[int, typer.Option(help="Virtual phones on the host.")] = 2,
    console_port: Annotated[int, typer.Option(help="Port of the operators' console.")] = 8080,
    host_console_port: Annotated[int, typer.Option(help="Port of the host's console.")] = 8765,
    listen: Annotated[
        str, typer.Option(help="Where the cloud listens (the `amc task` commands' default).")
    ] = DEFAULT_CLOUD_ADDRESS,
) -> None:
    """Run the embedded stack (cloud, consoles, a host with virtual phones) until Ctrl-C."""
    from console.embedded import run_up

    _run(
        run_up(
            data_dir,
            phones=phones,
            console_port=console_port,
            host_console_port=host_console_port,
            listen_address=listen,
            out=out,
        )
    )


# --- parts of a real deployment --------------------------------------------------------------


@cloud_app.command("serve")
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

    raise typer.Exit(run(insecure=insecure, debug=debug, say=lambda line: print(line, flush=True)))


@host_app.command("run")
def host_run(
    console: Annotated[
        bool, typer.Option(help="Serve the host's local console (127.0.0.1:8765 by default).")
    ] = False,
    allow_remote: Annotated[
        bool, typer.Option(help="Let the local console bind a non-loopback address.")
    ] = False,
) -> None:
    """Run a host agent: connect to the cloud, drive the phones (settings from AMC_HOST_*)."""
    from host.console import HostConsoleSettings
    from host.runner import run_host
    from host.settings import HostSettings

    console_settings = HostConsoleSettings(allow_remote=allow_remote) if console else None
    _run(run_host(HostSettings(), console=console_settings))


@host_app.command("export")
def host_export(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Zip to write (amc-export-ID.zip).")
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


@console_app.command("serve")
def console_serve() -> None:
    """Serve the operators' web console and JSON API (settings from AMC_CONSOLE_*)."""
    from console.gateway.app import serve
    from console.settings import ConsoleSettings

    _run(serve(ConsoleSettings()))


# --- certificates ----------------------------------------------------------------------------


@certs_app.command("init")
def certs_init(
    directory: Annotated[Path, typer.Argument(help="Where to write the CA and server cert.")],
    server_name: Annotated[
        list[str] | None, typer.Option(help="Extra DNS name of the cloud (repeatable).")
    ] = None,
) -> None:
    """Create a fleet CA and a server certificate."""
    from cloud import pki

    pki.init_ca(directory)
    pki.write_server_cert(directory, server_name or [])
    out.print(f"fleet CA and server certificate written to {directory}")


@certs_app.command("host")
def certs_host(
    directory: Annotated[Path, typer.Argument(help="Folder holding the fleet CA.")],
    host_id: Annotated[str, typer.Argument(help="Host id; becomes the certificate's identity.")],
) -> None:
    """Issue a host client certificate signed by the fleet CA."""
    from cloud import pki

    cert = pki.write_host_cert(directory, host_id)
    serial = pki.serial_hex(cert.read_bytes())
    out.print(f"host certificate: {cert} (key beside it, readable by you only)")
    out.print(f"serial {serial} (what `amc certs revoke --serial` names)")


@certs_app.command("operator")
def certs_operator(
    directory: Annotated[Path, typer.Argument(help="Folder holding the fleet CA.")],
    name: Annotated[str, typer.Argument(help="Operator name; becomes the identity.")],
) -> None:
    """Issue an operator client certificate signed by the fleet CA."""
    from cloud import pki

    cert = pki.write_operator_cert(directory, name)
    serial = pki.serial_hex(cert.read_bytes())
    out.print(f"operator certificate: {cert} (key beside it, readable by you only)")
    out.print(f"serial {serial} (what `amc certs revoke --serial` names)")


CloudDatabase = Annotated[
    str,
    typer.Option(
        envvar="AMC_CLOUD_DATABASE_URL",
        help="The cloud's database (what the replicas use); revocations are recorded there.",
    ),
]
CertFile = Annotated[
    Path | None, typer.Option("--cert", help="The certificate (PEM) to revoke, by its serial.")
]
Serial = Annotated[str | None, typer.Option(help="A certificate serial (hex) to revoke.")]
HostId = Annotated[
    str | None, typer.Option("--host", help="Revoke every certificate of this host id.")
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
    from cloud.store.database import Store
    from cloud.store.engine import upgrade

    async def go() -> T:
        store = Store.from_url(url)
        try:
            await upgrade(store.engine)
            return await action(store)
        finally:
            await store.close()

    return asyncio.run(go())


@certs_app.command("revoke")
def certs_revoke(
    database_url: CloudDatabase,
    cert: CertFile = None,
    serial: Serial = None,
    host: HostId = None,
    reason: Annotated[str, typer.Option(help="Why, kept with the revocation.")] = "",
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


@certs_app.command("unrevoke")
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


# --- operating the fleet ---------------------------------------------------------------------


@dataclass(slots=True)
class Connection:
    address: str
    ca: Path
    cert: Path
    key: Path

    def client(self) -> OperatorClient:
        return OperatorClient.over(
            secure_channel(self.address, ca=self.ca, cert=self.cert, key=self.key)
        )


_connection: Connection | None = None


@app.callback()
def connection_options(
    cloud: Annotated[
        str, typer.Option(envvar="AMC_CLOUD", help="Cloud address host:port.")
    ] = DEFAULT_CLOUD_ADDRESS,
    pki_dir: Annotated[
        Path, typer.Option(envvar="AMC_PKI_DIR", help="Folder with ca.pem and operator certs.")
    ] = Path(".amc/up/pki"),
    operator: Annotated[str, typer.Option(envvar="AMC_OPERATOR", help="Operator name.")] = (
        "admin"
    ),
) -> None:
    """Connection options for the operator commands (task, decisions)."""
    global _connection
    _connection = Connection(
        address=cloud,
        ca=pki_dir / "ca.pem",
        cert=pki_dir / f"operator-{operator}.pem",
        key=pki_dir / f"operator-{operator}.key",
    )


def _with_client(action: Callable[[OperatorClient], Awaitable[T]]) -> T:
    if _connection is None:
        raise typer.BadParameter("no cloud connection configured")
    connection = _connection

    async def go() -> T:
        client = connection.client()
        try:
            return await action(client)
        finally:
            await client.close()

    return _run(go())


@task_app.command("submit")
def task_submit(
    goal: Annotated[str, typer.Argument(help="The goal in plain language.")],
    host: Annotated[str, typer.Option(help="Run only on this host.")] = "",
    device: Annotated[str, typer.Option(help="Run only on this phone serial.")] = "",
    max_attempts: Annotated[int, typer.Option(help="Attempts before failing; 0 = default.")] = 0,
    request_id: Annotated[str, typer.Option(help="Idempotency key for retries.")] = "",
    lease_seconds: Annotated[int, typer.Option(help="Lease length; 0 = default.")] = 0,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            help="A secret parameter NAME the goal refers to as {{secret:NAME}} (repeatable). "
            "Its value comes from the environment variable AMC_SECRET_<NAME> (upper case), "
            "else a hidden prompt; never from the command line."
        ),
    ] = None,
    no_replay: Annotated[
        bool, typer.Option("--no-replay", help="Plan every step with the model (no learned flow).")
    ] = False,
) -> None:
    """Queue a task and print its id (and any warning about its goal)."""
    request = task_service_pb2.SubmitTaskRequest(
        goal=goal,
        target=types_pb2.TaskTarget(host_id=host, device_serial=device),
        max_attempts=max_attempts,
        client_request_id=request_id,
        secrets={name: _secret_value(name) for name in secret or []},
        no_replay=no_replay,
    )
    if lease_seconds:
        request.lease_duration.CopyFrom(Duration(seconds=lease_seconds))
    response = _with_client(lambda c: c.tasks.SubmitTask(request))
    note = " (already submitted with this request id)" if response.deduplicated else ""
    out.print(f"{response.task.task_id}{note}")
    for warning in response.warnings:
        err.print(f"warning: {formatting.literal(warning)}")


def _secret_value(name: str) -> str:
    """A secret's value from AMC_SECRET_<NAME>, else a hidden prompt (a terminal only)."""
    import getpass
    import os
    import sys

    value = os.environ.get(f"AMC_SECRET_{name.upper()}")
    if value is not None:
        return value
    if not sys.stdin.isatty():
        raise typer.BadParameter(
            f"set AMC_SECRET_{name.upper()} (no terminal to ask for it)", param_hint="--secret"
        )
    return getpass.getpass(f"value of secret {name} (not shown): ")


@task_app.command("list")
def task_list(
    status: Annotated[
        list[str] | None, typer.Option(help="queued, running, succeeded, ... (repeatable).")
    ] = None,
    host: Annotated[str, typer.Option(help="Only this host.")] = "",
    query: Annotated[str, typer.Option("--text", help="Goal contains this text.")] = "",
    limit: Annotated[int, typer.Option(help="Page size.")] = 50,
) -> None:
    """List tasks, newest first."""
    statuses = [types_pb2.TaskStatus.Value(f"TASK_STATUS_{s.upper()}") for s in status or []]
    request = task_service_pb2.ListTasksRequest(
        page_size=limit, statuses=statuses, host_id=host, query=query
    )
    response = _with_client(lambda c: c.tasks.ListTasks(request))
    out.print(formatting.task_table(list(response.tasks)))


@task_app.command("show")
def task_show(task_id: Annotated[str, typer.Argument(help="Task id.")]) -> None:
    """Show one task with every attempt."""
    request = task_service_pb2.GetTaskRequest(task_id=task_id)
    response = _with_client(lambda c: c.tasks.GetTask(request))
    task = response.task
    out.print(formatting.task_table([task]))
    if task.result_summary:
        out.print(f"result: {formatting.literal(task.result_summary)}")
    for attempt in task.attempts:
        reason = f" — {attempt.failure_reason}" if attempt.failure_reason else ""
        out.print(
            f"  attempt {attempt.attempt}: {formatting.styled_status(attempt.status)} on "
            + formatting.literal(
                f"{attempt.host_id}/{attempt.device_serial} "
                f"{formatting.progress_badge(attempt.progress)}{reason}"
            )
        )
        if attempt.HasField("flow"):
            use = attempt.flow
            line = f"flow {use.flow_id}: " if use.flow_id else "no flow: "
            line += use.reason
            if use.flow_id:
                line += f"; {use.steps_replayed} step(s) replayed"
            if use.diverged_at_step:
                line += f"; diverged at step {use.diverged_at_step}: {use.divergence}"
            out.print(f"    {formatting.literal(line)}")


@task_app.command("watch")
def task_watch(
    task_id: Annotated[str, typer.Argument(help="Task id; omit to watch the fleet.")] = "",
    thinking: Annotated[
        bool, typer.Option(help="Also print the model's thinking as it streams (session mode).")
    ] = False,
) -> None:
    """Stream live progress until the task ends (or Ctrl-C for the fleet)."""

    async def watch(client: OperatorClient) -> None:
        request = progress_service_pb2.WatchProgressRequest(
            task_id=task_id, include_thinking=thinking
        )
        async for change in client.progress.WatchProgress(request):
            if change.HasField("thinking"):
                out.print(change.thinking.delta, end="", style="dim italic", markup=False)
                continue
            task = change.task
            out.print(
                f"{task.task_id} {formatting.styled_status(task.status)} "
                f"{formatting.literal(formatting.progress_badge(task.progress))}"
            )

    _with_client(watch)


@task_app.command("cancel")
def task_cancel(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    reason: Annotated[str, typer.Option(help="Why; shown to operators.")] = "cancelled from CLI",
) -> None:
    """Cancel a task (a running one stops within one step)."""
    request = task_service_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
    response = _with_client(lambda c: c.tasks.CancelTask(request))
    out.print(f"{response.task.task_id}: {formatting.styled_status(response.task.status)}")


@task_app.command("export")
def task_export(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Zip to write (amc-export-ID.zip).")
    ] = None,
    merge: Annotated[
        list[Path] | None,
        typer.Option(
            help="A host's export of the task (amc host export) to merge in (repeatable)."
        ),
    ] = None,
) -> None:
    """Export a task from the cloud as one zip: report.html, run.gif, run.mp4, steps.jsonl
    (docs/export.md). The cloud has no screenshots: --merge a host's export to add them."""
    from console.exporting import export_task
    from console.gateway.cloud import CloudClient

    if _connection is None:
        raise typer.BadParameter("no cloud connection configured")
    c = _connection

    async def go() -> tuple[Path, Run]:
        cloud = CloudClient(c.address, ca=c.ca, cert=c.cert, key=c.key, timeout_s=60)
        try:
            return await export_task(cloud, task_id, output, merge or [])
        finally:
            await cloud.close()

    _export_done(lambda: _run(go()))


def _export_done(make: Callable[[], tuple[Path, Run]]) -> None:
    """Run an export; say where it went, or why not in one line (exit 2)."""
    from console.exporting import ExportError

    try:
        path, run = make()
    except ExportError as error:
        out.print(f"[red]export[/red]: {formatting.literal(str(error))}", soft_wrap=True)
        raise typer.Exit(2) from None
    shots = sum(1 for s in run.steps if s.before_png)
    out.print(
        formatting.literal(
            f"{path} ({len(run.steps)} steps, {shots} with screenshots, {run.origin})"
        )
    )


@app.command()
def decisions(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    attempt: Annotated[int, typer.Option(help="Only this attempt; 0 = all.")] = 0,
    prompts: Annotated[bool, typer.Option(help="Also print the prompts sent.")] = False,
) -> None:
    """Print the per-step LLM record of a task (either transport: direct-transport hosts ship
    theirs from their outbox)."""
    request = decision_log_service_pb2.ListDecisionsRequest(
        task_id=task_id, attempt=attempt, page_size=500
    )
    response = _with_client(lambda c: c.decisions.ListDecisions(request))
    if not response.decisions:
        out.print(
            "no decisions logged yet (a host on the direct transport sends its own from its "
            "outbox in the background)"
        )
    else:
        c = formatting.verdict_counts(list(response.decisions))
        out.print(
            f"verified steps: {c['met']} met · {c['not_met']} not met · {c['unknown']} unknown"
            + (f" · {c['unchecked']} not checked" if c["unchecked"] else "")
        )
    lit = formatting.literal
    for d in response.decisions:
        out.rule(lit(f"attempt {d.attempt} · step {d.step_index} · {d.provider}/{d.model}"))
        out.print(f"[bold]rationale[/bold]: {lit(d.rationale or '-')}")
        out.print(f"[bold]thinking[/bold] ({lit(formatting.thinking_kind(d))})", end="")
        thinking = formatting.thinking_text(d)
        out.print(f": {lit(thinking)}" if thinking else "")
        out.print(f"[bold]action[/bold]: {lit(d.tool_name)} {lit(d.arguments_json)}")
        out.print(
            f"[bold]purpose[/bold]: {lit(d.purpose)}  "
            f"[bold]expected[/bold]: {lit(d.expected_outcome)}"
        )
        if d.tool_name not in ("complete", "get_ui_tree"):
            out.print(f"[bold]verdict[/bold]: {formatting.verdict_words(d.verification)}")
        if d.mode == types_pb2.PLANNER_MODE_REPLAY:
            out.print(f"[bold]replayed[/bold]: flow {lit(d.flow_id)} step {d.flow_step}")
        elif d.replay_divergence:
            out.print(
                f"[bold]took over from flow {lit(d.flow_id)}[/bold] at step {d.flow_step}: "
                f"{lit(d.replay_divergence)}"
            )
        latency_ms = d.latency.seconds * 1000 + d.latency.nanos // 1_000_000
        usage = d.usage
        notes = [formatting.retry_word(d)] if d.forced_retry else []
        if d.output_truncated:
            notes.append("cut off at the output limit")
        out.print(
            f"tokens in/out {usage.input_tokens}/{usage.output_tokens} · cache read/write "
            f"{usage.cache_read_input_tokens}/{usage.cache_creation_input_tokens} · "
            f"{latency_ms} ms" + "".join(f" · {n}" for n in notes)
        )
        if prompts:
            out.print(
                json.dumps({"system": d.system_prompt, "user": d.user_prompt}, indent=2),
                markup=False,
            )


# --- learned flows ---------------------------------------------------------------------------


@flows_app.command("list")
def flows_list(
    status: Annotated[
        list[str] | None, typer.Option(help="active, disabled or retired (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(help="Page size.")] = 50,
) -> None:
    """List learned flows, most recently changed first."""
    statuses = [types_pb2.FlowStatus.Value(f"FLOW_STATUS_{s.upper()}") for s in status or []]
    request = flow_service_pb2.ListFlowsRequest(page_size=limit, statuses=statuses)
    response = _with_client(lambda c: c.flows.ListFlows(request))
    if not response.flows:
        out.print("no flows learned yet (a task that succeeds on the cloud transport teaches one)")
        return
    out.print(formatting.flow_table(list(response.flows)))


@flows_app.command("show")
def flows_show(flow_id: Annotated[str, typer.Argument(help="Flow id.")]) -> None:
    """Show one flow: its steps, how often it was replayed, where it diverged."""
    request = flow_service_pb2.GetFlowRequest(flow_id=flow_id)
    flow = _with_client(lambda c: c.flows.GetFlow(request)).flow
    lit = formatting.literal
    out.print(
        f"[bold]flow {lit(flow.flow_id)}[/bold] · {formatting.FLOW_STATUS_WORDS[flow.status]}"
    )
    out.print(f"goal: {lit(flow.goal_template)}")
    out.print(f"apps: {lit(', '.join(flow.apps))}")
    out.print(f"learned from task {lit(flow.source_task_id)} attempt {flow.source_attempt}")
    out.print(f"status: {lit(flow.status_reason)}")
    out.print(
        f"used {flow.uses}× · replayed to the end {flow.replays_completed}× · diverged "
        f"{flow.divergences}× ({flow.consecutive_divergences} in a row)"
    )
    if flow.last_divergence:
        out.print(f"last divergence: {lit(flow.last_divergence)}")
    for step in flow.steps:
        where = flow.divergences_by_step.get(step.index, 0)
        target = (
            f" on {lit(formatting.target_words(step.target))}" if step.HasField("target") else ""
        )
        param = f" (types {{{lit(step.text_parameter)}}})" if step.text_parameter else ""
        diverged = f" · [red]diverged here {where}×[/red]" if where else ""
        out.print(f"  {step.index}. {lit(step.tool_name)}{target}{param}{diverged}")
        out.print(f"     purpose: {lit(step.purpose)} · expected: {lit(step.expected_outcome)}")
        out.print(f"     on {lit(step.page_before)} → {lit(step.page_after)}")


def _set_flow_status(flow_id: str, status: types_pb2.FlowStatus.ValueType, reason: str) -> None:
    request = flow_service_pb2.SetFlowStatusRequest(flow_id=flow_id, status=status, reason=reason)
    flow = _with_client(lambda c: c.flows.SetFlowStatus(request)).flow
    out.print(
        f"{flow.flow_id}: {formatting.FLOW_STATUS_WORDS[flow.status]} "
        f"({formatting.literal(flow.status_reason)})"
    )


@flows_app.command("disable")
def flows_disable(
    flow_id: Annotated[str, typer.Argument(help="Flow id.")],
    reason: Annotated[str, typer.Option(help="Why; recorded with your name.")] = "",
) -> None:
    """Stop replaying a flow (until enabled again)."""
    _set_flow_status(flow_id, types_pb2.FLOW_STATUS_DISABLED, reason)


@flows_app.command("enable")
def flows_enable(
    flow_id: Annotated[str, typer.Argument(help="Flow id.")],
    reason: Annotated[str, typer.Option(help="Why; recorded with your name.")] = "",
) -> None:
    """Replay a disabled or retired flow again (its run of divergences starts over)."""
    _set_flow_status(flow_id, types_pb2.FLOW_STATUS_ACTIVE, reason)
