"""A model call whose answer was lost after the request went out is in the task's export.

Every real part runs: the embedded stack (cloud over mTLS with SQLite, host, virtual phone over
the adb protocol), the real Anthropic SDK against the local fake Messages server, which reads
each request and then drops the connection before its answer's end (the provider may have
billed it: decision 0080), and `amc task export` as its own process.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from amc.v1 import task_service_pb2, types_pb2
from console.embedded import embedded_stack, follow_tasks
from export import dataset
from export.bundle import read_bundle
from tests.console.test_cli import amc
from tests.support.fakes import FakeModelServer
from tests.support.waiting import until

KEY = "sk-ant-unsettled-export-test-key"


@pytest.fixture
def cut_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    """The planner's provider: every answer's connection drops before the answer's end."""
    with FakeModelServer(anthropic_key=KEY) as fake:
        for name in list(os.environ):
            if name.startswith(("AMC_PLANNER_", "ANTHROPIC_", "OPENAI_", "AI_PLANNER_")):
                monkeypatch.delenv(name)
        monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
        monkeypatch.setenv("AMC_PLANNER_MODEL", "claude-sonnet-4-6")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
        monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
        fake.answer_with_page("<html>" + "x" * 4096, cut=True)
        yield fake


async def test_the_export_lists_the_calls_of_unknown_cost_with_their_bound(
    tmp_path: Path, cut_model: FakeModelServer
) -> None:
    """GetTask, `amc task show` and the console said "1 call, cost unknown, at most $X", but
    the export an auditor downloads (run.json, the report) did not: it read as fully accounted
    for. It now lists each attempt's calls of unknown cost and their bound, beside a total
    that still counts only what the provider reported."""
    async with embedded_stack(tmp_path / "stack", transport="cloud") as stack:
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Open the settings")
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        get = task_service_pb2.GetTaskRequest(task_id=task_id)

        async def lost_one() -> bool:
            task: types_pb2.Task = (await ops.tasks.GetTask(get)).task
            return task.totals.unsettled.calls >= 1

        await until(lost_one, what="a model call whose answer was lost")
        await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id))
        await follow_tasks(ops, [task_id], Console(file=io.StringIO()), 30)
        task = (await ops.tasks.GetTask(get)).task
        conn = ["--cloud", stack.cloud_address, "--pki-dir", str(stack.pki_dir)]
        path = tmp_path / "export.zip"
        code, printed = await amc(*conn, "task", "export", task_id, "-o", str(path))
        assert code == 0, printed

    assert task.status == types_pb2.TASK_STATUS_CANCELLED, task.result_summary
    (attempt,) = task.attempts
    lost = task.totals.unsettled
    assert lost.calls >= 1 and lost.at_most.cost_usd > 0
    with zipfile.ZipFile(path) as z:
        head = dataset.parse_run(z.read("run.json"))
        report = z.read("report.html").decode()
    assert isinstance(head, dataset.RunRecord) and head.schema_version == "amc.export.run/4"
    (record,) = head.unsettled
    assert (record.attempt, record.calls) == (attempt.attempt, lost.calls)
    assert record.at_most.input_tokens == lost.at_most.input_tokens
    assert record.at_most.output_tokens == lost.at_most.output_tokens
    assert record.at_most_cost_usd == pytest.approx(lost.at_most.cost_usd)
    # The total counts what the provider reported (nothing here), as the task's totals do.
    assert head.total.usage.input_tokens == task.totals.usage.input_tokens == 0
    calls = f"{lost.calls} model call{'s' if lost.calls != 1 else ''}"
    assert (
        f'<dd data-field="unsettled">{calls} whose cost was never recorded (not in the totals), '
        f"at most {lost.at_most.input_tokens} in · {lost.at_most.output_tokens} out · "
        f"${lost.at_most.cost_usd:.4f}</dd>"
    ) in report, report
    (back,) = read_bundle(path).unsettled
    assert (back.attempt, back.calls) == (attempt.attempt, lost.calls)
    assert back.at_most.cost_usd == pytest.approx(lost.at_most.cost_usd)
