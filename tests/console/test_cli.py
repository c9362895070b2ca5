"""The `amc` command line as an operator runs it: a new process per command, against a real
cloud server over mTLS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from amc.v1 import fleet_service_pb2, types_pb2
from cloud.cert_validity import when
from cloud.identity import Caller, caller_from_auth_context
from cloud.pki import ensure_embedded_pki
from cloud.server import CloudServer, build_server
from cloud.services.fleet_service import FleetServicer
from cloud.settings import CloudSettings
from cloud.store import decisions, spend, unsettled
from console import exit_codes
from console.gateway.cloud import CloudClient
from console.gateway.errors import describe
from planner.decision import Billed, Decision, ResumedFrom, ThinkingBlock, Usage
from tests.support.bad_certs import Flaw, flawed_copy
from tests.support.fleet_rows import register

AMC = str(Path(sys.executable).with_name("amc"))
#: No `amc up` context leaks in from the machine running the tests.
ENV = {**os.environ, "COLUMNS": "200", "AMC_CONTEXT_FILE": "/nonexistent/amc-context.json"}


async def amc(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        AMC, *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, output.decode()


@contextlib.asynccontextmanager
async def cli_cloud(
    tmp_path: Path, **settings: Any
) -> AsyncIterator[tuple[CloudServer, list[str]]]:
    """A cloud on a SQLite file with its own PKI (operator "admin"), and the `--cloud …
    --pki-dir …` that points an `amc` command at it."""
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            pki_dir=pki,
            **settings,
        )
    )
    await cloud.start()
    try:
        yield cloud, ["--cloud", cloud.address, "--pki-dir", str(pki)]
    finally:
        await cloud.stop(grace=0)


def test_certs_commands_make_a_fleet(tmp_path: Path) -> None:
    made = (["init", "pki"], ["host", "pki", "h1"], ["operator", "pki", "alice"])
    for args in (*made, ["viewer", "pki", "dana"]):
        subprocess.run([AMC, "certs", *args], cwd=tmp_path, check=True, env=ENV, timeout=60)
    names = sorted(p.name for p in (tmp_path / "pki").iterdir())
    assert names == [
        "ca.key", "ca.pem", "host-h1.key", "host-h1.pem",
        "operator-alice.key", "operator-alice.pem", "server.key", "server.pem",
        "viewer-dana.key", "viewer-dana.pem",
    ]  # fmt: skip
    assert (tmp_path / "pki" / "host-h1.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "pki" / "viewer-dana.key").stat().st_mode & 0o077 == 0
    viewer = (tmp_path / "pki" / "viewer-dana.pem").read_bytes()
    assert caller_from_auth_context({"x509_pem_cert": [viewer]}) == Caller("viewer", "dana")


def test_certs_issued_again_over_symlinks_write_through_to_their_targets(
    tmp_path: Path,
) -> None:
    """Ops teams link a host's certificate and key from a secrets mount. `amc certs host` issued
    again renamed its new files over the links: the links became regular files, cut from the
    mount (which kept the old pair). The new pair is written through to the links' targets
    now (relative links too), the links kept."""
    subprocess.run([AMC, "certs", "init", "pki"], cwd=tmp_path, check=True, env=ENV, timeout=60)
    subprocess.run(
        [AMC, "certs", "host", "pki", "h1"], cwd=tmp_path, check=True, env=ENV, timeout=60
    )
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name in ("host-h1.pem", "host-h1.key"):
        (tmp_path / "pki" / name).rename(secrets / name)
        (tmp_path / "pki" / name).symlink_to(Path("..") / "secrets" / name)
    before = (secrets / "host-h1.pem").read_bytes()
    subprocess.run(
        [AMC, "certs", "host", "pki", "h1"], cwd=tmp_path, check=True, env=ENV, timeout=60
    )
    for name in ("host-h1.pem", "host-h1.key"):
        link = tmp_path / "pki" / name
        assert link.is_symlink(), name
        assert link.read_bytes() == (secrets / name).read_bytes()
    after = (secrets / "host-h1.pem").read_bytes()
    assert after != before
    assert (secrets / "host-h1.key").stat().st_mode & 0o077 == 0
    key = serialization.load_pem_private_key((secrets / "host-h1.key").read_bytes(), None)
    assert x509.load_pem_x509_certificate(after).public_key() == key.public_key()
    assert not [
        p.name
        for p in (*secrets.iterdir(), *(tmp_path / "pki").iterdir())
        if p.name.endswith(".tmp")
    ]


def test_certs_into_a_path_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    """`amc certs init` where a file is (or under one) was an unexpected FileExistsError /
    NotADirectoryError, exit 70: it is one line naming the folder, exit 2."""
    taken = tmp_path / "pki"
    taken.write_text("not a folder")
    for args, why in ((["init", str(taken)], "File exists"), (["host", str(taken), "h1"], "")):
        ran = subprocess.run(
            [AMC, "certs", *args], capture_output=True, text=True, env=ENV, timeout=60
        )
        assert ran.returncode == 2, ran.stderr
        assert ran.stderr.startswith(f"amc certs {args[0]}: cannot write certificates in {taken}")
        assert why in ran.stderr and len(ran.stderr.splitlines()) == 1, ran.stderr
        assert ran.stderr.rstrip().endswith("(pass a folder you can write to)")


async def test_a_viewer_certificate_reads_and_is_refused_changes(tmp_path: Path) -> None:
    """`--viewer NAME` (AMC_VIEWER) uses viewer-NAME.pem: the read commands work, a change is
    the cloud's refusal in one line with what to do (exit 4), and nothing changed."""
    async with cli_cloud(tmp_path) as (_, conn):
        pki = conn[conn.index("--pki-dir") + 1]
        code, out = await amc("certs", "viewer", pki, "dana")
        assert code == 0, out
        code, out = await amc(*conn, "task", "submit", "Watched by dana", "--request-id", "v1")
        assert code == 0, out
        task_id = out.strip()
        for read in (["task", "list"], ["task", "show", task_id], ["host", "list"]):
            code, out = await amc(*conn, "--viewer", "dana", *read)
            assert code == 0, (read, out)
        assert "Watched by dana" in out or read[0] == "host"
        code, out = await amc(*conn, "--viewer", "dana", "task", "cancel", task_id)
        assert code == exit_codes.CLOUD, out
        assert out.strip() == (
            f"amc task cancel: the cloud at {conn[1]} refused viewer 'dana': this RPC needs an "
            "operator certificate, not a viewer one (a viewer certificate may only read; to "
            "change anything, use an operator certificate (--operator NAME))"
        )
        code, out = await amc(*conn, "--viewer", "dana", "task", "submit", "Not by a viewer")
        assert code == exit_codes.CLOUD and "refused viewer 'dana'" in out, out
        code, out = await amc(*conn, "task", "show", task_id)
        assert "queued" in out and "cancel" not in out.lower(), out
        code, out = await amc(*conn, "--viewer", "nobody", "task", "list")
        assert code == exit_codes.USAGE, out
        assert f"no certificate for viewer 'nobody' in {pki} (viewer-nobody.pem and .key)" in out
        assert f"`amc certs viewer {pki} nobody`" in out
        code, out = await amc(*conn, "--viewer", "dana", "--operator", "admin", "task", "list")
        assert code == exit_codes.USAGE and "not both" in out, out


async def test_task_commands_against_a_real_cloud(tmp_path: Path) -> None:
    async with cli_cloud(tmp_path) as (cloud, conn):
        code, out = await amc(*conn, "task", "submit", "Turn on dark theme", "--request-id", "r1")
        assert code == 0, out
        task_id = out.strip()
        code, again = await amc(*conn, "task", "submit", "Turn on dark theme", "--request-id", "r1")
        assert task_id in again.splitlines() and "already submitted" in again
        code, listing = await amc(*conn, "task", "list", "--status", "queued")
        assert code == 0 and task_id in listing and "queued" in listing
        code, shown = await amc(*conn, "task", "show", task_id)
        assert code == 0 and "Turn on dark theme" in shown
        # `task watch --thinking` prints the model's live thinking until the task ends.
        watching = asyncio.ensure_future(amc(*conn, "task", "watch", task_id, "--thinking"))
        for _ in range(1200):  # until it has subscribed (or gave up: see the assert below)
            if any(sub._wants_thinking for sub in cloud.bus._subs) or watching.done():
                break
            await asyncio.sleep(0.05)
        cloud.bus.thinking(task_id, 1, "Settings first, then Display.")
        code, cancelled = await amc(*conn, "task", "cancel", task_id)
        assert code == 0 and "cancelled" in cancelled
        code, watched = await watching
        assert code == 3 and "Settings first, then Display." in watched, watched  # cancelled
        assert "cancelled" in watched
        code, missing = await amc(*conn, "task", "show", "no-such-task")
        assert code == 2 and "'no-such-task' is not a task id" in missing
        code, decisions = await amc(*conn, "decisions", task_id)
        assert code == 0 and "no decisions logged" in decisions


async def test_decisions_print_model_text_literally(tmp_path: Path) -> None:
    """Model text is not Rich markup: "[/b]" used to crash the command, "[e12]" vanished and
    the redacted-thinking note printed as an empty line."""
    async with cli_cloud(tmp_path) as (cloud, conn):
        code, out = await amc(*conn, "task", "submit", "Open [bold]Display[/bold]")
        assert code == 0, out
        task_id = out.strip()
        action = types_pb2.Action(purpose="open [e12]", expected_outcome="[/b] shows")
        action.tap.element_id = "e12"
        await decisions.append(
            cloud.store,
            "h1",
            task_id,
            1,
            Decision(
                tool_name="tap",
                arguments={"element_id": "e12"},
                action=action,
                purpose="open [e12]",
                expected_outcome="[/b] shows",
                rationale="Tapped [e12] last step [/b]; now [red]Display[/red].",
                thinking=[ThinkingBlock("Row [e12] is [b]Display"), ThinkingBlock("", True)],
                usage=Usage(input_tokens=10, output_tokens=5, cache_read_input_tokens=7),
                provider="anthropic",
                model="claude-sonnet-4-6",
                latency_s=0.1,
                forced_retry=True,
                system_prompt="s",
                user_prompt="u",
                thinking_kind="summarized",
                retry_kind="nudge",
            ),
        )
        code, printed = await amc(*conn, "decisions", task_id)
        assert code == 0, printed
        assert "Tapped [e12] last step [/b]; now [red]Display[/red]." in printed
        assert "Row [e12] is [b]Display" in printed
        assert "(redacted: the provider returned this block encrypted)" in printed
        assert "thinking (summarized thinking)" in printed
        assert "purpose: open [e12]" in printed and "expected: [/b] shows" in printed
        assert "cache read/write 7/0" in printed and "nudged retry" in printed
        assert "resumed from the kept answer" not in printed  # it asked the model
        code, listing = await amc(*conn, "task", "list")
        assert code == 0 and "Open [bold]Display[/bold]" in listing


async def test_decisions_say_which_went_on_from_a_kept_answer(tmp_path: Path) -> None:
    """A decision that went on from an answer an earlier decision kept (from a provider that
    sends no turn id) says so in the text and in the JSON, so its rationale is not read as an
    answer to its own request, and when that answer was given. Before, neither said
    anything."""
    answered = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    async with cli_cloud(tmp_path) as (cloud, conn):
        code, out = await amc(*conn, "task", "submit", "Open Display")
        assert code == 0, out
        task_id = out.strip()
        action = types_pb2.Action(purpose="open it", expected_outcome="it opens")
        action.tap.element_id = "e1"
        await decisions.append(
            cloud.store,
            "h1",
            task_id,
            1,
            Decision(
                tool_name="tap",
                arguments={"element_id": "e1"},
                action=action,
                purpose="open it",
                expected_outcome="it opens",
                rationale="Opening Display.",
                thinking=[],
                usage=Usage(),
                provider="openai",
                model="gpt-5-mini",
                latency_s=0.0,
                forced_retry=False,
                system_prompt="s",
                user_prompt="u",
                resumed_from=ResumedFrom("", 4, answered),
            ),
        )
        code, printed = await amc(*conn, "decisions", task_id)
        assert code == 0, printed
        said = " ".join(printed.split())
        assert ResumedFrom("", 4, answered).words() in said
        assert "answered at 2026-03-04 05:06:07 UTC" in said
        code, printed = await amc(*conn, "decisions", task_id, "--json")
        assert code == 0, printed
        (listed,) = json.loads(printed)["decisions"]
        assert (listed["resumed_from"]["turn_id"], listed["resumed_from"]["position"]) == ("", 4)
        assert dt.datetime.fromisoformat(listed["resumed_from"]["answered_at"]) == answered


async def test_decisions_of_a_task_not_started_say_so(tmp_path: Path) -> None:
    """A task with no decision yet was always explained by a direct-transport host's outbox,
    which sent an operator of a queued or cloud-planned task to look in the wrong place."""
    async with cli_cloud(tmp_path) as (_, conn):
        code, out = await amc(*conn, "task", "submit", "Open Settings")
        assert code == 0, out
        code, printed = await amc(*conn, "decisions", out.strip())
        assert code == 0, printed
        assert "no decisions logged yet: no attempt has started" in printed
        assert "direct transport" not in printed


async def test_submit_with_a_secret_from_the_environment_and_a_warning(tmp_path: Path) -> None:
    """`--secret NAME` reads the value from AMC_SECRET_<NAME> (never the command line); a goal
    that holds a credential is queued with the cloud's warning on stderr."""
    from cloud.secret_box import new_key

    async with cli_cloud(tmp_path, secrets_key=new_key()) as (_, conn):
        ENV["AMC_SECRET_WIFI_PASSWORD"] = "hunter22"
        try:
            code, out = await amc(
                *conn,
                "task",
                "submit",
                "Join HomeNet with password {{secret:wifi_password}}",
                "--secret",
                "wifi_password",
            )
        finally:
            del ENV["AMC_SECRET_WIFI_PASSWORD"]
        assert code == 0, out
        assert "warning" not in out and "hunter22" not in out
        code, out = await amc(*conn, "task", "submit", "Join HomeNet with password hunter22")
        assert code == 0, out
        assert "warning: the goal looks like it holds a credential" in out
        code, out = await amc(*conn, "task", "submit", "Use {{secret:pin}}", "--secret", "pin")
        assert code != 0 and "AMC_SECRET_PIN" in out  # no terminal to ask: says what to set


def test_certs_secrets_key_prints_a_fernet_key() -> None:
    from cryptography.fernet import Fernet

    result = subprocess.run(
        [AMC, "certs", "secrets-key"], capture_output=True, text=True, env=ENV, timeout=60
    )
    assert result.returncode == 0, result.stderr
    Fernet(result.stdout.strip().encode())  # a valid key


async def test_a_task_s_totals_line_counts_calls_of_failed_decisions(tmp_path: Path) -> None:
    """`amc task show`'s totals line says the tokens and cost of a task whose only billed calls
    were a failed decision's (the provider billed them; no decision was logged), as the
    console's task list does; it said only its steps and time."""
    async with cli_cloud(tmp_path) as (cloud, conn):
        code, out = await amc(*conn, "task", "submit", "Turn on dark theme")
        assert code == 0, out
        task_id = out.strip()
        billed = Billed("anthropic", "claude-sonnet-4-6", Usage(2000, 400, cost_usd=0.012))
        await spend.count_failed(cloud.store, "h1", task_id, 1, billed, "PlannerRefused")
        code, shown = await amc(*conn, "task", "show", task_id)
        assert code == 0, shown
        (line,) = [t for t in shown.splitlines() if t.startswith("totals:")]
        assert line.startswith("totals:  0 steps · 2.4k tokens · $0.0120 · "), line


async def test_tokens_and_cost_per_step_task_and_day(tmp_path: Path) -> None:
    """`amc task show`, `amc decisions` and `amc spend` print what the model calls cost, per
    step, attempt, task and day, against the task's and the fleet's budgets."""
    async with cli_cloud(tmp_path, daily_max_cost_usd=10.0) as (cloud, conn):
        code, out = await amc(
            *conn,
            "task",
            "submit",
            "Turn on dark theme",
            "--max-tokens",
            "5000",
            "--max-cost",
            "2.5",
        )
        assert code == 0, out
        task_id = out.strip()
        for cost in (0.125, 0.25):
            action = types_pb2.Action(purpose="p", expected_outcome="e")
            action.tap.element_id = "e1"
            await decisions.append(
                cloud.store,
                "h1",
                task_id,
                1,
                Decision(
                    tool_name="tap",
                    arguments={"element_id": "e1"},
                    action=action,
                    purpose="p",
                    expected_outcome="e",
                    rationale="r",
                    thinking=[],
                    usage=Usage(input_tokens=15, output_tokens=5, cost_usd=cost),
                    provider="anthropic",
                    model="claude-sonnet-4-6",
                    latency_s=0.1,
                    forced_retry=False,
                    system_prompt="s",
                    user_prompt="u",
                ),
            )
        code, shown = await amc(*conn, "task", "show", task_id)
        assert code == 0, shown
        assert (
            "spent:   40 tokens · $0.3750 (task budget: 40 of 5,000 tokens; $0.3750 of $2.50)"
            in shown
        )
        code, printed = await amc(*conn, "decisions", task_id)
        assert code == 0 and "$0.1250" in printed and "total: 40 tokens · $0.3750" in printed
        code, spent = await amc(*conn, "spend", "--days", "2")
        assert code == 0, spent
        assert "anthropic/claude-sonnet-4-6" in spent and "$0.3750" in spent
        assert "today: 40 tokens · $0.3750 (daily budget: $0.3750 of $10.00)" in spent
        code, told = await amc("spend", "--help")
        assert code == 0, told
        assert "every billed model call: logged decisions and failed decisions' calls" in " ".join(
            told.split()
        )


async def test_task_show_says_which_calls_cost_is_unknown(tmp_path: Path) -> None:
    """A model call the cloud started and never recorded (decision 0080: a cloud killed during
    it) is printed beside the totals, with its bound, and is in `--json`'s totals."""
    async with cli_cloud(tmp_path) as (cloud, conn):
        code, out = await amc(*conn, "task", "submit", "Turn on dark theme")
        assert code == 0, out
        task_id = out.strip()
        code, shown = await amc(*conn, "task", "show", task_id)
        assert code == 0 and "unknown:" not in shown, shown
        ledger = unsettled.StoreCallLedger(cloud.store, "h1", task_id, 1)
        bound = Usage(input_tokens=9000, output_tokens=1000, cost_usd=0.042)
        await ledger.opened("anthropic", "claude-sonnet-4-6", bound)
        code, shown = await amc(*conn, "task", "show", task_id)
        assert code == 0, shown
        said = (
            "unknown: 1 model call whose cost was never recorded: at most 10,000 tokens · $0.0420"
        )
        assert said in shown
        code, printed = await amc(*conn, "task", "show", task_id, "--json")
        assert code == 0, printed
        totals = json.loads(printed)["task"]["totals"]
        assert totals["unsettled"]["calls"] == 1
        assert totals["unsettled"]["at_most"]["cost_usd"] == 0.042


async def test_host_list_connected_or_disconnected(tmp_path: Path) -> None:
    """`amc host list --disconnected` lists just the hosts that are down (and `--connected`
    those up): at fleet scale the listing by id scatters them. Both at once is a usage
    error naming the two."""
    async with cli_cloud(tmp_path) as (cloud, conn):
        made = await register(cloud, 12)  # fleet-0000 and fleet-0010 connected
        code, out = await amc(*conn, "host", "list", "--disconnected", "--json")
        assert code == 0, out
        listed = [(h["host_id"], h["connected"]) for h in json.loads(out)["hosts"]]
        assert listed == [(h, c) for h, c in made if not c]
        code, out = await amc(*conn, "host", "list", "--connected")
        assert code == 0, out
        assert [line.split()[0] for line in out.splitlines()] == ["fleet-0000", "fleet-0010"]
        code, out = await amc(*conn, "host", "list", "--connected", "--disconnected")
        assert code == 2 and "name at most one of --connected and --disconnected" in out, out


async def test_host_filters_hold_against_a_cloud_that_ignores_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cloud from before `ListHostsRequest.connection` does not know the field and answers
    every host: `amc host list --connected`/`--disconnected` and the gateway's host listing
    (`/api/hosts?connection=…`, the fleet page) listed the whole fleet. They say CONNECTED in
    `connected_only` too now, and drop connected hosts from a DISCONNECTED answer themselves.
    The cloud here is real; its ListHosts drops the field before serving, as such a cloud
    reads the request."""
    serve = FleetServicer.ListHosts

    async def older(self: FleetServicer, request: Any, context: Any) -> Any:
        request.ClearField("connection")
        return await serve(self, request, context)

    monkeypatch.setattr(FleetServicer, "ListHosts", older)
    async with cli_cloud(tmp_path) as (cloud, conn):
        made = await register(cloud, 12)  # fleet-0000 and fleet-0010 connected
        up = [h for h, c in made if c]
        down = [h for h, c in made if not c]
        for flag, wanted in (("--connected", up), ("--disconnected", down)):
            code, out = await amc(*conn, "host", "list", flag, "--json")
            assert code == 0, out
            assert [h["host_id"] for h in json.loads(out)["hosts"]] == wanted, flag
        pki = Path(conn[conn.index("--pki-dir") + 1])
        gateway = CloudClient(
            cloud.address,
            ca=pki / "ca.pem",
            cert=pki / "operator-admin.pem",
            key=pki / "operator-admin.key",
        )
        try:
            for connection, wanted in (
                (fleet_service_pb2.HOST_CONNECTION_CONNECTED, up),
                (fleet_service_pb2.HOST_CONNECTION_DISCONNECTED, down),
            ):
                page = await gateway.hosts_page(page_size=500, connection=connection)
                assert [h.host_id for h in page.hosts] == wanted, connection
        finally:
            await gateway.close()


@pytest.mark.parametrize(
    ("flaw", "says"),
    [
        ("expired", "expired {end}"),
        ("not_yet_valid", "is not valid before {start}"),
        ("other_ca", "is not signed by {ca}"),
    ],
)
async def test_an_operator_certificate_the_cloud_would_refuse_is_named(
    tmp_path: Path, flaw: Flaw, says: str
) -> None:
    """The cloud is up; before, the TLS handshake failed and the CLI said "cannot reach the
    cloud … Socket closed (is it running? …)" with exit 4."""
    async with cli_cloud(tmp_path) as (cloud, _):
        bad = tmp_path / "pki_bad"
        cert = flawed_copy(tmp_path / "pki", "operator-admin", flaw, bad)
        parsed = x509.load_pem_x509_certificate(cert.read_bytes())
        code, output = await amc("--cloud", cloud.address, "--pki-dir", str(bad), "task", "list")
    expected = says.format(
        end=when(parsed.not_valid_after_utc),
        start=when(parsed.not_valid_before_utc),
        ca=bad / "ca.pem",
    )
    assert code == exit_codes.CERTIFICATE, output
    assert output.startswith(f"amc task list: operator certificate {cert} {expected}"), output
    assert "amc certs operator" in output and "Socket closed" not in output


async def test_a_pki_folder_of_another_fleet_says_the_cloud_s_certificate_is_not_its_ca_s(
    tmp_path: Path,
) -> None:
    """The operator's certificate is fine for its own CA, but the cloud is another fleet's: the
    handshake fails on the cloud's certificate. Before: exit 4, "cannot reach the cloud … (is
    it running? …)"."""
    async with cli_cloud(tmp_path / "ours") as (cloud, _):
        theirs = ensure_embedded_pki(tmp_path / "theirs", [], operator="admin")
        code, output = await amc("--cloud", cloud.address, "--pki-dir", str(theirs), "task", "list")
    assert code == exit_codes.CERTIFICATE, output
    # (gRPC's core logs the handshake failure on stderr too, before amc's line.)
    assert (
        f"amc task list: the cloud at {cloud.address} presented a certificate that "
        f"{theirs / 'ca.pem'} does not vouch for: unable to get local issuer certificate ("
    ) in output, output
    assert "is it running?" not in output


async def test_a_watch_stops_at_once_when_the_cloud_comes_back_with_a_certificate_it_refuses(
    tmp_path: Path,
) -> None:
    """The cloud restarts on the same address with another fleet's server certificate (a new
    server.pem from the wrong CA): no wait heals that. Before, `amc task watch` treated the
    handshake failure as the cloud being away and retried for 5 minutes (here: the 60 s bound
    of `amc` ran out)."""
    async with cli_cloud(tmp_path / "ours") as (cloud, conn):
        code, out = await amc(*conn, "task", "submit", "Turn on dark theme")
        assert code == 0, out
        task_id = out.strip()
        watching = asyncio.ensure_future(amc(*conn, "task", "watch", task_id))
        for _ in range(1200):  # until it has subscribed (or gave up: see the assert below)
            if cloud.bus._subs or watching.done():
                break
            await asyncio.sleep(0.05)
        address = cloud.address
    assert not watching.done(), await watching
    theirs = ensure_embedded_pki(tmp_path / "theirs", [], operator="admin")
    other = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'theirs.sqlite3'}",
            listen_address=address,
            pki_dir=theirs,
        )
    )
    await other.start()
    try:
        code, watched = await watching
    finally:
        await other.stop(grace=0)
    assert code == exit_codes.CERTIFICATE, watched
    assert (
        f"amc task watch: the cloud at {address} presented a certificate that "
        f"{tmp_path / 'ours' / 'pki' / 'ca.pem'} does not vouch for: "
    ) in watched, watched


@pytest.mark.parametrize(
    ("flaw", "says"),
    [
        ("expired", "expired"),
        ("not_yet_valid", "is not valid before"),
        ("other_ca", "is not signed"),
    ],
)
async def test_the_console_refuses_to_start_with_an_operator_certificate_the_cloud_refuses(
    tmp_path: Path, flaw: Flaw, says: str
) -> None:
    """Before, `amc console serve` started and every page then failed on "Socket closed"."""
    pki = ensure_embedded_pki(tmp_path, [], operator="console")
    cert = flawed_copy(pki, "operator-console", flaw, tmp_path / "pki_bad")
    env = {
        **ENV,
        "AMC_CONSOLE_CERTS_DIR": str(tmp_path / "pki_bad"),
        "AMC_CONSOLE_BIND_PORT": "0",
        "AMC_CONSOLE_CLOUD_ADDRESS": "127.0.0.1:1",
        "AMC_CONSOLE_ADMIN_PASSWORD": "not-a-real-password",
    }
    process = await asyncio.create_subprocess_exec(
        AMC, "console", "serve", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    said = output.decode()
    assert process.returncode == 2, said
    assert f"AMC_CONSOLE_CLIENT_CERT: operator certificate {cert} {says}" in said, said
    assert "amc certs operator" in said


async def test_the_console_says_when_it_does_not_accept_the_cloud_s_certificate(
    tmp_path: Path,
) -> None:
    """The cloud's certificate is not the console's CA's (another fleet's, or one that expired
    while the cloud ran): pages said "the cloud is not reachable", as if waiting would help."""
    async with cli_cloud(tmp_path / "ours") as (cloud, _):
        theirs = ensure_embedded_pki(tmp_path / "theirs", [], operator="admin")
        gateway = CloudClient(
            cloud.address,
            ca=theirs / "ca.pem",
            cert=theirs / "operator-admin.pem",
            key=theirs / "operator-admin.key",
        )
        try:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await gateway.hosts_page(page_size=10)
        finally:
            await gateway.close()
    status, message, _ = describe(failed.value)
    assert status == 503
    assert message == (
        "this console does not accept the cloud's certificate: unable to get local issuer "
        "certificate"
    ), message


def test_certs_through_a_link_into_a_folder_others_can_write_is_one_line(tmp_path: Path) -> None:
    """A certificate that is a symlink into a folder anyone can write is not written through
    (`amc certs` as root replaced whatever file such a link named): exit 2, one line naming
    the link and why, nothing written."""
    subprocess.run([AMC, "certs", "init", "pki"], cwd=tmp_path, check=True, env=ENV, timeout=60)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    victim = shared / "victim"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "pki" / "host-h1.pem").symlink_to(victim)
    done = subprocess.run(
        [AMC, "certs", "host", "pki", "h1"],
        cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=60,
    )  # fmt: skip
    assert done.returncode == exit_codes.USAGE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "pki/host-h1.pem is a symlink to" in lines[0]
    assert "writable by group or others" in lines[0]
    assert victim.read_text().startswith("root:x:")
