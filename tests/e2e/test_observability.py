"""A real run is observable: metrics move on both endpoints, one trace per step crosses from the
host to the cloud, JSON log lines carry the task's fields, and the cost of each decision adds
up to the task's on the operators' task page.

The embedded stack runs every real part (cloud over mTLS with its SQLite file, host with OCR,
the virtual phone over the adb protocol, the offline planner behind PlannerService.Decide). The
offline model gets a price through an operator price file (`AMC_PLANNER_PRICES_FILE`), so its
decisions cost something. Spans go to an in-memory exporter; both /metrics endpoints are
scraped over HTTP with httpx, before the task and while the stack still runs after it.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from amc.v1 import decision_log_service_pb2, task_service_pb2, types_pb2
from console.embedded import OPERATOR, embedded_stack, follow_tasks
from console.gateway.app import create_app
from console.settings import ConsoleSettings
from telemetry import logs
from tests.console.console_stack import UvicornThread
from tests.support.migrated import seeded
from tests.support.tracing import memory_exporter

GOAL = "Turn on dark theme"
DECIDE = "/amc.v1.PlannerService/Decide"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One scrape: (sample name, sorted labels) -> value."""
    text = httpx.get(url, timeout=10).raise_for_status().text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Every log line at INFO and above, as JSON, into a buffer."""
    buffer = io.StringIO()
    handler = logs.handler("json", buffer)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture
def priced_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An operator price file that makes the offline model cost $1 per thousand input tokens."""
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."amc-offline"]\ninput = 1000.0\noutput = 2000.0\n')
    for name in ("AMC_PLANNER_PROVIDER", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AMC_PLANNER_PRICES_FILE", str(prices))
    monkeypatch.setenv("AMC_CLOUD_DAILY_MAX_COST_USD", "100")  # far from reached
    return prices


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_a_run_is_scraped_traced_logged_and_priced(
    tmp_path: Path, json_log: io.StringIO, priced_offline: Path
) -> None:
    exporter = memory_exporter()
    async with embedded_stack(
        seeded(tmp_path / "stack"), transport="cloud", metrics=("127.0.0.1:0", "127.0.0.1:0")
    ) as stack:
        assert stack.cloud_metrics is not None and stack.host_metrics is not None
        cloud_before = scrape(stack.cloud_metrics.url)
        host_before = scrape(stack.host_metrics.url)

        submitted = await stack.operator.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal=GOAL)
        )
        task_id = submitted.task.task_id
        final = await follow_tasks(stack.operator, [task_id], Console(file=io.StringIO()), 30)
        assert final[task_id].status == types_pb2.TASK_STATUS_SUCCEEDED, final[task_id]

        cloud_after = scrape(stack.cloud_metrics.url)
        host_after = scrape(stack.host_metrics.url)
        decisions = list(
            (
                await stack.operator.decisions.ListDecisions(
                    decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
                )
            ).decisions
        )
        task = (
            await stack.operator.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        ).task
        page, fleet = await _pages(stack.cloud_address, stack.pki_dir, task_id)

    steps = len(decisions)
    assert steps >= 3

    # --- metrics moved on both endpoints ------------------------------------------------------
    def moved(after: dict, before: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved(cloud_after, cloud_before, "amc_cloud_task_submits_total") == 1
    assert moved(cloud_after, cloud_before, "amc_cloud_decide_seconds_count", outcome="ok") == steps
    assert moved(cloud_after, cloud_before, "amc_cloud_model_call_seconds_count") >= steps
    assert moved(cloud_after, cloud_before, "amc_cloud_model_tokens_total", kind="input") > 0
    assert moved(cloud_after, cloud_before, "amc_cloud_model_cost_usd_total") > 0
    assert moved(cloud_after, cloud_before, "amc_cloud_lease_renewals_total", outcome="acked") > 0
    assert moved(cloud_after, cloud_before, "amc_cloud_results_total", status="succeeded") == 1
    assert moved(cloud_after, cloud_before, "amc_cloud_dispatch_latency_seconds_count") == 1
    assert moved(cloud_after, cloud_before, "amc_cloud_db_batch_seconds_count") > 0
    assert value(cloud_after, "amc_cloud_lease_streams") >= 1
    assert moved(host_after, host_before, "amc_host_steps_total", outcome="succeeded") == steps
    for phase in ("perceive", "plan", "act", "record"):
        assert moved(host_after, host_before, "amc_host_step_phase_seconds_count", phase=phase) > 0
    assert moved(host_after, host_before, "amc_host_decide_seconds_count", outcome="ok") == steps
    assert moved(host_after, host_before, "amc_host_ocr_seconds_count") > 0
    assert moved(host_after, host_before, "amc_host_lease_renewals_total", outcome="sent") > 0
    assert moved(host_after, host_before, "amc_host_attempts_total", outcome="succeeded") == 1
    assert value(host_after, "amc_host_phones") >= 1

    # --- one connected trace per step, host to cloud --------------------------------------------
    spans = list(exporter.get_finished_spans())
    step_spans = [
        s for s in spans if s.name == "step" and (s.attributes or {}).get("amc.task_id") == task_id
    ]
    assert sorted(_int(s, "amc.step") for s in step_spans) == list(range(1, steps + 1))
    for step_span in step_spans:
        assert step_span.parent is None, "each step is the root of its own trace"
        assert step_span.context is not None
        trace_id = step_span.context.trace_id
        in_trace = [s for s in spans if s.context is not None and s.context.trace_id == trace_id]
        attrs = step_span.attributes or {}
        assert attrs["amc.attempt"] == 1 and attrs["amc.host_id"] == "embedded-host"
        assert _int(step_span, "gen_ai.usage.input_tokens") > 0
        phases = {s.name: s for s in _children(in_trace, step_span)}
        assert {"perceive", "plan", "act"} <= set(phases)
        (client,) = [s for s in _children(in_trace, phases["plan"]) if s.name == DECIDE]
        assert client.kind == SpanKind.CLIENT
        (server,) = [s for s in in_trace if s.name == DECIDE and s.kind == SpanKind.SERVER]
        assert server.parent is not None and server.parent.is_remote, "carried in gRPC metadata"
        assert client.context is not None and server.parent.span_id == client.context.span_id
        server_attrs = server.attributes or {}
        step_no = attrs["amc.step"]
        assert server_attrs["amc.task_id"] == task_id and server_attrs["amc.step"] == step_no
        assert _int(server, "gen_ai.usage.input_tokens") > 0
        below_server = [s.name for s in in_trace if _descends(s, server, in_trace)]
        assert "model call" in below_server and "decision log write" in below_server
        (model_call,) = [s for s in in_trace if s.name == "model call"]
        assert (model_call.attributes or {})["gen_ai.system"] == "offline"

    # --- JSON log lines carry the task's fields, on host and cloud alike ------------------------
    lines = [json.loads(line) for line in json_log.getvalue().splitlines() if line.strip()]
    mine = [line for line in lines if line.get("task_id") == task_id]
    host_lines = [line for line in mine if line["logger"] == "host.agent.loop"]
    cloud_lines = [line for line in mine if line["logger"].startswith("cloud.")]
    assert host_lines and cloud_lines
    assert all(line["attempt"] == 1 and line["host_id"] == "embedded-host" for line in host_lines)
    assert {line.get("step") for line in host_lines} >= set(range(1, steps + 1))
    assert any(line.get("step") == 1 for line in cloud_lines)
    assert all("trace_id" in line for line in cloud_lines if "decided" in line["message"])

    # --- cost per decision, summed: the RPC and the operators' task page ------------------------
    costs = [d.usage.cost_usd for d in decisions]
    assert all(c > 0 for c in costs)
    assert task.totals.usage.cost_usd == pytest.approx(sum(costs))
    assert task.attempts[0].usage.cost_usd == pytest.approx(sum(costs))
    shown = f"${sum(costs):,.2f}" if sum(costs) >= 1 else f"${sum(costs):.4f}"
    assert f'<span data-field="cost">{shown}</span>' in page
    for d in decisions:
        cost = d.usage.cost_usd
        assert (f"${cost:,.2f}" if cost >= 1 else f"${cost:.4f}") in page
    # The fleet page: today's spending against the daily budget.
    assert "Model spending today" in fleet
    assert f"{shown} / $100.00" in fleet


def _int(span: ReadableSpan, key: str) -> int:
    value = (span.attributes or {})[key]
    assert isinstance(value, int), (key, value)
    return value


def _descends(span: ReadableSpan, ancestor: ReadableSpan, spans: list[ReadableSpan]) -> bool:
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    assert ancestor.context is not None
    parent = span.parent
    while parent is not None:
        if parent.span_id == ancestor.context.span_id:
            return True
        above = by_id.get(parent.span_id)
        parent = above.parent if above is not None else None
    return False


async def _pages(cloud_address: str, pki_dir: Path, task_id: str) -> tuple[str, str]:
    """The operators' task page and fleet page, from the real gateway (uvicorn) logged in
    through its form."""
    settings = ConsoleSettings(
        cloud_address=cloud_address,
        certs_dir=pki_dir,
        operator_name=OPERATOR,
        tls_server_name="localhost",
        admin_username="ops",
        admin_password="correct horse battery staple",
        session_secret="observability-test-session-secret",
    )
    server = UvicornThread(create_app(settings))
    base = server.start()
    try:
        async with httpx.AsyncClient(base_url=base, timeout=20) as client:
            form = (await client.get("/login")).text
            csrf = form.split('name="csrf_token" value="')[1].split('"')[0]
            done = await client.post(
                "/login",
                data={
                    "username": "ops",
                    "password": "correct horse battery staple",
                    "csrf_token": csrf,
                    "next": "/tasks",
                },
            )
            assert done.status_code == 303, done.text
            page = await client.get(f"/tasks/{task_id}")
            assert page.status_code == 200, page.text
            fleet = await client.get("/fleet")
            assert fleet.status_code == 200, fleet.text
            return page.text, fleet.text
    finally:
        server.stop()
