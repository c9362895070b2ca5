"""A model call whose answer was lost after the request went out is in the task's export, and
on the direct transport (the host calls the model itself) on the task at all.

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
from sqlalchemy import select

from amc.v1 import task_service_pb2, types_pb2
from cloud.store.models import AttemptRow
from console.embedded import embedded_stack, follow_tasks
from console.exporting import export_host_task
from export import dataset
from export.bundle import read_bundle
from host.outbox import OutboxStore
from host.outbox.calls import OutboxCallLedger
from planner.decision import Usage
from planner.unsettled import unsettled_words
from tests.console.test_cli import amc
from tests.support.fakes import FakeModelServer
from tests.support.migrated import seeded
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
    async with embedded_stack(seeded(tmp_path / "stack"), transport="cloud") as stack:
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
    words = unsettled_words(lost.calls, lost.at_most)  # the consoles' words
    assert f'<dd data-field="unsettled">{words}</dd>' in report, report
    (back,) = read_bundle(path).unsettled
    assert (back.attempt, back.calls) == (attempt.attempt, lost.calls)
    assert back.at_most.cost_usd == pytest.approx(lost.at_most.cost_usd)


async def test_a_direct_host_s_call_whose_answer_was_lost_shows_on_its_task(
    tmp_path: Path, cut_model: FakeModelServer
) -> None:
    """A host on the direct transport calls the model itself: a call whose answer was lost
    after the request went out left nothing anywhere (its outbox recorded a call only once the
    planner had its answer), so the task read as fully accounted for. The host now writes the
    call down in its outbox before making it and ships it when it ended unknown; GetTask shows
    it exactly as a cloud-transport call of unknown cost (the attempt's and the task's)."""
    async with embedded_stack(seeded(tmp_path / "stack"), transport="direct") as stack:
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Open the settings")
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        get = task_service_pb2.GetTaskRequest(task_id=task_id)

        async def lost_one() -> bool:
            task: types_pb2.Task = (await ops.tasks.GetTask(get)).task
            return task.totals.unsettled.calls >= 1

        await until(lost_one, what="the direct host's call of unknown cost shipped")
        await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id))
        await follow_tasks(ops, [task_id], Console(file=io.StringIO()), 30)
        task = (await ops.tasks.GetTask(get)).task

    (attempt,) = task.attempts
    assert attempt.planner_transport == types_pb2.PLANNER_TRANSPORT_DIRECT
    lost = task.totals.unsettled
    assert attempt.unsettled.calls == lost.calls >= 1
    assert lost.calls <= len(cut_model.bodies("/v1/messages"))
    assert lost.at_most.cost_usd > 0 and lost.at_most.output_tokens > 0
    assert attempt.unsettled.at_most.cost_usd == pytest.approx(lost.at_most.cost_usd)
    assert task.totals.usage.input_tokens == 0  # nothing was reported: the totals say so


async def test_a_call_a_dead_direct_host_was_making_is_shipped_when_it_starts_again(
    tmp_path: Path, cut_model: FakeModelServer
) -> None:
    """A direct host killed during a model call left nothing of it. Its marker (written by
    the host's own ledger into its outbox before the call, as the killed process did) now
    outlives the process, and the next start ships it: the task shows one more call of
    unknown cost, with the bound the marker carried."""
    data = tmp_path / "stack"
    async with embedded_stack(seeded(data), transport="direct") as stack:
        ops = stack.operator
        request = task_service_pb2.SubmitTaskRequest(goal="Open the settings")
        task_id = (await ops.tasks.SubmitTask(request)).task.task_id
        get = task_service_pb2.GetTaskRequest(task_id=task_id)

        async def lost_one() -> bool:
            task: types_pb2.Task = (await ops.tasks.GetTask(get)).task
            return task.totals.unsettled.calls >= 1

        await until(lost_one, what="the direct host's call of unknown cost shipped")
        await ops.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task_id))
        await follow_tasks(ops, [task_id], Console(file=io.StringIO()), 30)
        async with stack.cloud.store.read() as session:
            row = (
                await session.execute(select(AttemptRow).where(AttemptRow.task_id == task_id))
            ).scalar_one()
            attempt, lease_id = row.attempt, row.lease_id
    outbox = data / "host" / "outbox.sqlite3"
    async with embedded_stack(seeded(data), transport="direct") as stack:
        # What the first run still held (a call its stop cut off) is shipped first.
        reader = OutboxStore(outbox)
        try:
            await until(
                lambda: reader.backlog().items == 0 and not reader.open_calls(),
                what="the first run's outbox shipped",
            )
        finally:
            reader.close()
        before: types_pb2.UnsettledCalls = (
            await stack.operator.tasks.GetTask(get)
        ).task.totals.unsettled
    # The process that dies during its call: its marker is in the outbox file, nothing else.
    store = OutboxStore(outbox)
    try:
        ledger = OutboxCallLedger(store, task_id, attempt, lease_id)
        bound = Usage(input_tokens=12_000, output_tokens=8_192, cost_usd=0.159)
        call_id = await ledger.opened("anthropic", "claude-sonnet-4-6", bound)
        assert store.open_calls() == [call_id]
    finally:
        store.close()
    async with embedded_stack(seeded(data), transport="direct") as stack:

        async def shipped() -> bool:
            task: types_pb2.Task = (await stack.operator.tasks.GetTask(get)).task
            return task.totals.unsettled.calls == before.calls + 1

        await until(shipped, what="the dead process's call shipped at the next start")
        task = (await stack.operator.tasks.GetTask(get)).task
    after = task.totals.unsettled
    assert after.at_most.input_tokens == before.at_most.input_tokens + 12_000
    assert after.at_most.cost_usd == pytest.approx(before.at_most.cost_usd + 0.159)
    (shown,) = task.attempts
    assert shown.unsettled.calls == after.calls
    # The host's own export says the same as the cloud: the calls its attempts shipped as of
    # unknown cost and the one found at its start, with their bound.
    host = data / "host"
    _, run = export_host_task(
        host / "task_progress.sqlite3", host / "artifacts", "h", task_id, tmp_path / "h.zip"
    )
    (mine,) = run.unsettled
    assert (mine.attempt, mine.calls) == (shown.attempt, after.calls)
    assert mine.at_most.input_tokens == after.at_most.input_tokens
    assert mine.at_most.cost_usd == pytest.approx(after.at_most.cost_usd)
