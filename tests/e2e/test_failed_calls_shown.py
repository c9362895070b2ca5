"""A task whose decision failed after billed model calls shows one spending total everywhere:
GetTask's totals, GetSpend, `amc decisions` (text and JSON) and the operators' console (its
JSON API and its task page) agree, the failed decision's calls listed beside the decisions.

Every real part runs: the embedded stack (cloud over mTLS with SQLite, host, virtual phone over
the adb protocol), the real Anthropic SDK against the local fake Messages server, `amc` as its
own process, and the console's gateway under uvicorn. Each scripted answer reports 500 input and
100 output tokens (claude-sonnet-4-6: $0.003 a call): the first step launches an app (600
tokens), then the model answers four times without a tool call (the forced retry, the corrective
turn and its retry) and the second decision fails after 2,400 billed tokens, $0.012.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import html
import io
import json
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from rich.console import Console
from sqlalchemy import update

from amc.v1 import fleet_service_pb2, task_service_pb2, types_pb2
from cloud.store.models import TaskRow
from console.embedded import OPERATOR, embedded_stack, follow_tasks
from console.exporting import export_host_task
from console.gateway import create_app
from console.settings import ConsoleSettings
from export import dataset
from export.bundle import read_bundle
from export.run import FailedCalls
from host.outbox import OutboxStore
from planner.decision import Usage
from tests.console.console_stack import UvicornThread
from tests.console.test_cli import amc
from tests.support.fakes import FakeModelServer, anthropic_message, text, tool_use
from tests.support.migrated import seeded
from tests.support.waiting import until

KEY = "sk-ant-failed-calls-test-key"
TOKEN = "failed-calls-api-token-0123456789"
PASSWORD = "correct horse battery staple"


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key=KEY) as fake:
        for name in list(os.environ):
            if name.startswith(("AMC_PLANNER_", "ANTHROPIC_", "OPENAI_", "AI_PLANNER_")):
                monkeypatch.delenv(name)
        monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
        monkeypatch.setenv("AMC_PLANNER_MODEL", "claude-sonnet-4-6")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
        monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
        launch = tool_use(
            "launch_app",
            {
                "package_name": "com.android.settings",
                "purpose": "open it",
                "expected_outcome": "it opens",
            },
        )
        fake.script_anthropic(
            anthropic_message(launch, input_tokens=500, output_tokens=100),
            *[
                anthropic_message(text("Let me look first."), input_tokens=500, output_tokens=100)
                for _ in range(4)
            ],
        )
        yield fake


def _tokens(u: types_pb2.Usage) -> int:
    return (
        u.input_tokens + u.output_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    )


async def _console_views(
    cloud_address: str, pki_dir: Path, task_id: str
) -> tuple[dict[str, Any], dict[str, Any], str, bytes]:
    """The console's decision log and task detail (JSON API, bearer token), its task page
    (logged in through the form) and the task's export (the zip), from the real gateway."""
    settings = ConsoleSettings(
        cloud_address=cloud_address,
        certs_dir=pki_dir,
        operator_name=OPERATOR,
        tls_server_name="localhost",
        admin_username="ops",
        admin_password=SecretStr(PASSWORD),
        api_token=SecretStr(TOKEN),
        session_secret=SecretStr("failed-calls-session-secret-0123456789"),
    )
    server = UvicornThread(create_app(settings))
    base = server.start()
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=20) as api:
            log = (await api.get(f"/api/tasks/{task_id}/decisions")).json()
            detail = (await api.get(f"/api/tasks/{task_id}")).json()
            exported = await api.get(f"/api/tasks/{task_id}/export")
            assert exported.status_code == 200, exported.text
        async with httpx.AsyncClient(base_url=base, timeout=20) as browser:
            form = (await browser.get("/login")).text
            csrf = form.split('name="csrf_token" value="')[1].split('"')[0]
            done = await browser.post(
                "/login",
                data={"username": "ops", "password": PASSWORD, "csrf_token": csrf, "next": "/"},
            )
            assert done.status_code == 303, done.text
            page = (await browser.get(f"/tasks/{task_id}")).text
        return log, detail, page, exported.content
    finally:
        server.stop()


async def test_a_failed_decision_s_calls_show_wherever_the_task_s_spending_shows(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    async with embedded_stack(seeded(tmp_path / "stack"), transport="cloud") as stack:
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Open two apps")
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        await follow_tasks(ops, [task_id], Console(file=io.StringIO()), 30)
        get = task_service_pb2.GetTaskRequest(task_id=task_id)
        task = (await ops.tasks.GetTask(get)).task
        spend = await ops.fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
        conn = ["--cloud", stack.cloud_address, "--pki-dir", str(stack.pki_dir)]
        code, printed = await amc(*conn, "decisions", task_id)
        assert code == 0, printed
        code, as_json = await amc(*conn, "decisions", task_id, "--json")
        assert code == 0, as_json
        log, detail, page, export = await _console_views(
            stack.cloud_address, stack.pki_dir, task_id
        )

    assert len(fake_model.bodies("/v1/messages")) == 5
    assert task.status == types_pb2.TASK_STATUS_FAILED, task.result_summary
    assert "unusable tool call twice" in task.result_summary
    # What every view must agree with: the task's totals are GetSpend's (this task is the
    # fleet's only spending), the one decision's 600 tokens and the failed one's 2,400.
    total = task.totals.usage
    assert (total.input_tokens, total.output_tokens) == (2500, 500)
    assert total.cost_usd == pytest.approx(0.015)
    assert sum(_tokens(r.usage) for r in spend.rows) == _tokens(total) == 3000
    assert sum(r.usage.cost_usd for r in spend.rows) == pytest.approx(total.cost_usd)

    assert "plus 1 failed decision's model calls: 2,400 tokens · $0.0120" in printed, printed
    assert "total: 3,000 tokens · $0.0150" in printed, printed

    for listing in (json.loads(as_json), log):
        assert len(listing["decisions"]) == 1
        (failed,) = listing["failed_calls"]
        assert (failed["attempt"], failed["decisions"]) == (1, 1)
        assert (failed["usage"]["input_tokens"], failed["usage"]["output_tokens"]) == (2000, 400)
        used = [listing["decisions"][0]["usage"], failed["usage"]]
        assert sum(u["cost_usd"] for u in used) == pytest.approx(total.cost_usd)

    (history,) = detail["history"]
    assert history["failed_calls"]["decisions"] == 1
    assert history["failed_calls"]["usage"]["cost_usd"] == pytest.approx(0.012)
    shown = re.search(r'<p [^>]*data-field="failed-calls"[^>]*>(.*?)</p>', page, re.S)
    assert shown is not None, page
    words = html.unescape(re.sub(r"<[^>]+>", "", shown.group(1)))
    assert words == "Plus 1 failed decision's model calls: 2,400 tokens · $0.0120", words

    # The export: run.json (amc.export.run/4) lists the failed calls and the task's total; the
    # report's totals are the task's, with a line for the failed decision.
    with zipfile.ZipFile(io.BytesIO(export)) as z:
        head = dataset.parse_run(z.read("run.json"))
        report = z.read("report.html").decode()
    assert isinstance(head, dataset.RunRecord) and head.schema_version == "amc.export.run/4"
    assert head.pruned is None
    (failed_record,) = head.failed_calls
    assert (failed_record.attempt, failed_record.decisions) == (1, 1)
    assert failed_record.cost_usd == pytest.approx(0.012)
    u = head.total.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens) == (2500, 500, 0)
    assert head.total.cost_usd == pytest.approx(total.cost_usd)
    assert '<dd id="tokens">2500 in · 500 out' in report
    assert '<dd id="cost">$0.0150</dd>' in report
    assert (
        '<dd data-field="failed-calls">1, whose billed model calls (no step came of them) took '
        "2000 in · 400 out · $0.0120</dd>"
    ) in report
    assert read_bundle(export).failed_calls == [
        FailedCalls(1, 1, Usage(2000, 400, cost_usd=pytest.approx(0.012)))  # type: ignore[arg-type]  # approx compares equal
    ]


async def test_a_direct_host_s_own_export_lists_its_failed_decision_s_calls(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """The same model on the direct transport: the host made the calls itself, shipped the
    failed decision's cost from its outbox (which then forgets it) and kept it in its timeline.
    Its own export (`amc host export`) lists it, and its total is the task's totals as the
    cloud counted them."""
    async with embedded_stack(seeded(tmp_path / "stack"), transport="direct") as stack:
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Open two apps")
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        await follow_tasks(ops, [task_id], Console(file=io.StringIO()), 30)
        get = task_service_pb2.GetTaskRequest(task_id=task_id)

        async def counted() -> bool:
            return _tokens((await ops.tasks.GetTask(get)).task.totals.usage) == 3000

        await until(counted, what="the decision and the failed one's calls shipped and counted")
        task = (await ops.tasks.GetTask(get)).task
        host = stack.data_dir / "host"
        path, run = await asyncio.to_thread(
            export_host_task,
            host / "task_progress.sqlite3",
            host / "artifacts",
            "embedded-host",
            task_id,
            tmp_path / "host-export.zip",
        )

    assert task.status == types_pb2.TASK_STATUS_FAILED, task.result_summary
    assert run.failed_calls == [
        FailedCalls(1, 1, Usage(2000, 400, cost_usd=pytest.approx(0.012)))  # type: ignore[arg-type]  # approx compares equal
    ]
    # Every call was answered: the markers the host wrote before them went with their records.
    assert task.totals.unsettled.calls == 0
    outbox = OutboxStore(host / "outbox.sqlite3")
    try:
        assert outbox.open_calls() == []
    finally:
        outbox.close()
    with zipfile.ZipFile(path) as z:
        head = dataset.parse_run(z.read("run.json"))
    assert isinstance(head, dataset.RunRecord)
    u, total = head.total.usage, task.totals.usage
    assert (u.input_tokens, u.output_tokens) == (total.input_tokens, total.output_tokens)
    assert head.total.cost_usd == pytest.approx(total.cost_usd)


async def test_a_pruned_task_s_log_says_what_the_retention_deleted_and_when(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """The same task, then the cloud's retention pass after the task ended long ago: the log
    lists nothing, and every reader says what went (1 decision, 1 failed decision's call
    records), when, and what it cost, so the task's totals that remain are explained."""
    async with embedded_stack(seeded(tmp_path / "stack"), transport="cloud") as stack:
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Open two apps")
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        await follow_tasks(ops, [task_id], Console(file=io.StringIO()), 30)
        store = stack.cloud.store
        long_ago = store.now() - dt.timedelta(days=stack.cloud.settings.retention_days + 1)
        async with store.write() as session:
            await session.execute(
                update(TaskRow).where(TaskRow.task_id == task_id).values(finished_at=long_ago)
            )
        assert await stack.cloud.prune_decisions() == 1
        pruned_by = store.now()
        get = task_service_pb2.GetTaskRequest(task_id=task_id)
        task = (await ops.tasks.GetTask(get)).task
        conn = ["--cloud", stack.cloud_address, "--pki-dir", str(stack.pki_dir)]
        code, printed = await amc(*conn, "decisions", task_id)
        assert code == 0, printed
        code, as_json = await amc(*conn, "decisions", task_id, "--json")
        assert code == 0, as_json
        log, detail, page, export = await _console_views(
            stack.cloud_address, stack.pki_dir, task_id
        )

    total = task.totals.usage  # what the task spent stays in its totals
    assert (total.input_tokens, total.output_tokens) == (2500, 500)
    when = f"{pruned_by:%Y-%m-%d}"
    assert (
        f"pruned on {when}" in printed
        and "by the cloud's retention: 1 decision and 1 failed decision's call records, "
        "3,000 tokens · $0.0150 (the task's totals still count them)"
        in printed
    ), printed
    assert "total: 3,000 tokens · $0.0150" in printed, printed

    for listing in (json.loads(as_json), log):
        assert listing["decisions"] == [] and listing["failed_calls"] == []
        pruned = listing["pruned"]
        assert (pruned["decisions"], pruned["failed_decisions"]) == (1, 1)
        assert pruned["pruned_at"].startswith(when)
        assert (pruned["usage"]["input_tokens"], pruned["usage"]["output_tokens"]) == (2500, 500)
        assert pruned["usage"]["cost_usd"] == pytest.approx(total.cost_usd)

    assert detail["pruned"]["decisions"] == 1
    (history,) = detail["history"]
    assert history["empty_reason"].startswith("the cloud's retention deleted this task's"), history
    shown = re.search(r'<p [^>]*data-field="pruned"[^>]*>(.*?)</p>', page, re.S)
    assert shown is not None, page
    words = html.unescape(re.sub(r"<[^>]+>", "", shown.group(1)))
    assert words.startswith(f"Pruned on {when}") and words.endswith(
        "by the cloud's retention: 1 decision and 1 failed decision's call records, "
        "3,000 tokens · $0.0150 (the task's totals still count them)"
    ), words

    # The export (run.json amc.export.run/4 and the report) says the same, and its total is
    # the task's.
    with zipfile.ZipFile(io.BytesIO(export)) as z:
        head = dataset.parse_run(z.read("run.json"))
        report = html.unescape(z.read("report.html").decode())
    assert isinstance(head, dataset.RunRecord) and head.pruned is not None
    assert (head.pruned.decisions, head.pruned.failed_decisions) == (1, 1)
    assert head.pruned.pruned_at is not None and head.pruned.pruned_at.startswith(when)
    u = head.total.usage
    assert (u.input_tokens, u.output_tokens) == (2500, 500)
    assert head.total.cost_usd == pytest.approx(total.cost_usd)
    assert "1 decision and 1 failed decision's call records deleted by the cloud's retention" in (
        report
    )
    assert '<dd id="cost">$0.0150</dd>' in report
