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
from typing import TYPE_CHECKING, Annotated, TypeVar

import grpc
import typer
from google.protobuf.duration_pb2 import Duration
from rich.console import Console

from amc.v1 import decision_log_service_pb2, progress_service_pb2, task_service_pb2, types_pb2
from cloud.settings import DEFAULT_CLOUD_ADDRESS
from console import formatting
from console.client import OperatorClient, secure_channel
from planner.budget import dollars
from planner.errors import PlannerConfigError

if TYPE_CHECKING:
    from export.run import Run

app = typer.Typer(no_args_is_help=True, help="Agentic Mobile Control.", add_completion=False)
cloud_app = typer.Typer(no_args_is_help=True, help="Run the control plane.")
host_app = typer.Typer(no_args_is_help=True, help="Run a host agent.")
console_app = typer.Typer(no_args_is_help=True, help="Run the operators' web console.")
certs_app = typer.Typer(no_args_is_help=True, help="Manage the fleet CA and certificates.")
task_app = typer.Typer(no_args_is_help=True, help="Submit, list, watch and cancel tasks.")
app.add_typer(cloud_app, name="cloud")
app.add_typer(host_app, name="host")
app.add_typer(console_app, name="console")
app.add_typer(certs_app, name="certs")
app.add_typer(task_app, name="task")

out = Console()
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
    metrics: Annotated[
        bool,
        typer.Option(help="Serve Prometheus metrics (cloud 127.0.0.1:9471, host :9472)."),
    ] = False,
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
            metrics=metrics,
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
    from telemetry import logs

    logs.configure()
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
    """Run a host agent: connect to the cloud, drive the phones (settings from AMC_HOST_*).

    Prints what it runs (phones, planner, certificates, metrics at AMC_HOST_METRICS_ADDRESS,
    default 127.0.0.1:9472, tracing, logs) once it is up."""
    from host.console import HostConsoleSettings
    from host.runner import run_host
    from host.settings import HostSettings
    from telemetry import logs, tracing

    logs.configure()
    try:
        tracing.configure("amc-host")
    except tracing.TracingConfigError as error:
        out.print(f"[red]tracing[/red]: {formatting.literal(str(error))}", soft_wrap=True)
        raise typer.Exit(2) from None
    console_settings = HostConsoleSettings(allow_remote=allow_remote) if console else None
    say = lambda line: print(line, flush=True)  # noqa: E731
    _run(run_host(HostSettings(), console=console_settings, serve_metrics=True, say=say))


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
    out.print(f"host certificate: {cert} (key beside it, readable by you only)")


@certs_app.command("operator")
def certs_operator(
    directory: Annotated[Path, typer.Argument(help="Folder holding the fleet CA.")],
    name: Annotated[str, typer.Argument(help="Operator name; becomes the identity.")],
) -> None:
    """Issue an operator client certificate signed by the fleet CA."""
    from cloud import pki

    cert = pki.write_operator_cert(directory, name)
    out.print(f"operator certificate: {cert} (key beside it, readable by you only)")


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
    max_tokens: Annotated[
        int, typer.Option(help="Token budget of the task; 0 = the cloud's default.", min=0)
    ] = 0,
    max_cost: Annotated[
        float, typer.Option(help="Cost budget in US dollars; 0 = the cloud's default.", min=0)
    ] = 0.0,
) -> None:
    """Queue a task and print its id."""
    request = task_service_pb2.SubmitTaskRequest(
        goal=goal,
        target=types_pb2.TaskTarget(host_id=host, device_serial=device),
        max_attempts=max_attempts,
        client_request_id=request_id,
        budget=types_pb2.TaskBudget(max_tokens=max_tokens, max_cost_usd=max_cost),
    )
    if lease_seconds:
        request.lease_duration.CopyFrom(Duration(seconds=lease_seconds))
    response = _with_client(lambda c: c.tasks.SubmitTask(request))
    note = " (already submitted with this request id)" if response.deduplicated else ""
    out.print(f"{response.task.task_id}{note}")


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
    """Show one task with every attempt, and tokens and cost per task, attempt and step."""
    request = task_service_pb2.GetTaskRequest(task_id=task_id)
    listing = decision_log_service_pb2.ListDecisionsRequest(task_id=task_id, page_size=500)

    async def read(
        c: OperatorClient,
    ) -> tuple[task_service_pb2.GetTaskResponse, decision_log_service_pb2.ListDecisionsResponse]:
        return await c.tasks.GetTask(request), await c.decisions.ListDecisions(listing)

    response, logged = _with_client(read)
    task = response.task
    out.print(formatting.task_table([task]))
    if task.result_summary:
        out.print(f"result: {formatting.literal(task.result_summary)}")
    out.print(f"spent: {formatting.spending(task.usage, task.budget)}")
    for attempt in task.attempts:
        reason = f" — {attempt.failure_reason}" if attempt.failure_reason else ""
        out.print(
            f"  attempt {attempt.attempt}: {formatting.styled_status(attempt.status)} on "
            + formatting.literal(
                f"{attempt.host_id}/{attempt.device_serial} "
                f"{formatting.progress_badge(attempt.progress)}{reason}"
            )
            + f" · {formatting.usage_words(attempt.usage)}"
        )
    for d in logged.decisions:
        out.print(
            f"    attempt {d.attempt} step {d.step_index} {formatting.literal(d.tool_name)}: "
            f"{formatting.usage_words(d.usage)}"
        )


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
    """Print the per-step LLM record of a task (cloud transport only)."""
    request = decision_log_service_pb2.ListDecisionsRequest(
        task_id=task_id, attempt=attempt, page_size=500
    )
    response = _with_client(lambda c: c.decisions.ListDecisions(request))
    if not response.decisions:
        out.print("no decisions logged (none yet, or the host uses the direct transport)")
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
    if response.decisions:
        total = formatting.total_usage(response.decisions)
        out.print(f"[bold]total[/bold]: {formatting.usage_words(total)}")
        if prompts:
            out.print(
                json.dumps({"system": d.system_prompt, "user": d.user_prompt}, indent=2),
                markup=False,
            )


@app.command()
def spend(
    days: Annotated[int, typer.Option(help="Days back from today (UTC), 1 = today.", min=1)] = 1,
) -> None:
    """The fleet's model spending per day, host and model (cloud transport), and today's
    against the daily budget."""
    import datetime as dt

    from amc.v1 import fleet_service_pb2

    today = dt.datetime.now(dt.UTC).date()
    request = fleet_service_pb2.GetSpendRequest(
        since_day=(today - dt.timedelta(days=days - 1)).isoformat(), until_day=today.isoformat()
    )
    response = _with_client(lambda c: c.fleet.GetSpend(request))
    out.print(formatting.spend_table(list(response.rows)))
    out.print(f"today: {formatting.spending(response.today, response.daily_budget, 'daily')}")
