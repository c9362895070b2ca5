"""The direct transport's model-call markers (decision 0080) as the agent loop leaves them: a
call the host never learned the cost of is shipped as such however its decision ended, and
nothing else is; the host's own timeline keeps it for its console and export until the call
is settled or the attempt is pruned.

Real parts: the virtual phone, the real Anthropic SDK against the local fake Messages server
(each call it answers writes its marker through the real `ObservedAdapter`), the outbox's and
the timeline's own SQLite files, the host console's app and the export's writer.
"""

from __future__ import annotations

import sqlite3
import zipfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from amc.v1 import decision_log_service_pb2
from console.exporting import export_host_task
from export import dataset
from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.console import create_app
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.outbox import OutboxStore
from host.outbox.kinds import FAILED_CALLS, UNSETTLED
from host.outbox.shipments import Shipments
from host.perception.perceive import Perceiver
from host.planner_client import DirectPlanner
from host.timeline.store import TimelineStore, UnsettledCall
from planner.convert import usage_from_proto
from planner.decision import Billed, Decision, Usage
from planner.history import WorldEvent
from planner.planner import Planner
from planner.scene import Scene
from planner.session.factory import open_session_planner
from planner.session.store import SqliteSessionStore
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.host.console.host_console_support import StoreOnly, log_in
from tests.support.fakes import ANTHROPIC_KEY, FakeModelServer, anthropic_message, text, tool_use

_LAUNCH = {
    "package_name": "com.android.settings",
    "purpose": "open Settings",
    "expected_outcome": "Settings shows",
}


class _FailsAfterTheAnswer:
    """The real planner, then a bug past its model call (a KeyError where a provider adapter
    or the planner reads the answer): the provider answered and billed the call, and the
    decision with its usage is lost."""

    def __init__(self, inner: Planner) -> None:
        self.inner = inner

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        await self.inner.decide(goal, scene, history, screenshot)
        raise KeyError("usage")


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as fake:
        yield fake


def _settings(model: FakeModelServer) -> PlannerSettings:
    return PlannerSettings(
        provider="anthropic",
        model="claude-sonnet-4-6",
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=model.anthropic_base_url,
        max_retries=0,
    )


def _planner(model: FakeModelServer) -> Planner:
    settings = _settings(model)
    return Planner(make_adapter(settings), settings)


async def test_a_call_whose_decision_ended_in_a_bug_is_shipped_as_of_unknown_cost(
    tmp_path: Path, model: FakeModelServer
) -> None:
    """Markers were shipped only when the planner raised a planner error or was cancelled: a
    bug after the provider answered (a KeyError, an OSError) left the call's marker in place
    until the next start of the host (lost if that came over a day later). The attempt now
    ships it when its decision ends, however it ends, as a call of unknown cost."""
    model.script_anthropic(
        anthropic_message(text("Open Display."), tool_use("launch_app", _LAUNCH))
    )
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    planner = _planner(model)
    try:
        loop = AgentLoop(
            VirtualDriver(VirtualPhone("emulator-5554")),
            _FailsAfterTheAnswer(planner),
            Perceiver(None, retries=2, retry_delay_s=0),
            settings=LoopSettings(max_steps=3, settle_delay_s=0, ocr=False),
            shipments=Shipments(store, "direct", screenshots=False),
        )
        spec = TaskSpec("t1", 1, "Turn on dark theme", "emulator-5554", lease_id="l1")
        outcome = await loop.run(spec)
        assert outcome.status == "failed" and "KeyError" in outcome.summary
        assert len(model.bodies("/v1/messages")) == 1, "the call was made and answered"
        assert store.open_calls() == [], "no marker left for the next start to find"
        (item,) = store.head(10)
        assert item.kind == UNSETTLED
        call = decision_log_service_pb2.ShippedUnsettledCall.FromString(item.body)
        assert (call.task_id, call.attempt, call.lease_id) == ("t1", 1, "l1")
        assert call.host_call_id == item.item_id
        assert call.at_most.output_tokens > 0 and call.at_most.cost_usd > 0
    finally:
        await planner.aclose()
        store.close()


#: The session store refuses the model's turn (its tool call row), as a disk that filled or
#: failed just as the model answered does: the provider has answered and billed the call.
_REFUSE_THE_TURN = (
    "CREATE TRIGGER refuse_turn BEFORE INSERT ON planner_session_items "
    "WHEN NEW.item_type = 'tool_call' BEGIN SELECT RAISE(ABORT, 'disk refused the turn'); END"
)


async def test_a_session_turn_the_store_refuses_ships_its_known_cost(
    tmp_path: Path, model: FakeModelServer
) -> None:
    """Session mode on the direct transport commits the model's turn to the host's session
    store before anything else. When that write fails, the decision fails with the store's
    error carrying what the answered call cost (`deciding.decide` bills any error), yet the
    loop and `DirectPlanner` took the cost only from a planner error: the call was shipped as
    of *unknown* cost (its `at_most` bound in the task's totals) and this attempt's budget
    did not count it, though the host knew exactly what the provider billed. Now its cost is
    shipped as a failed decision's calls, and the call is not left of unknown cost."""
    model.script_anthropic(
        anthropic_message(text("Open Display."), tool_use("launch_app", _LAUNCH), input_tokens=1234)
    )
    sessions = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    with sqlite3.connect(sessions.path) as conn:
        conn.execute(_REFUSE_THE_TURN)
    conn.close()
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    direct = DirectPlanner(
        await open_session_planner(_settings(model), store=sessions, task_id="t1", attempt=1)
    )
    try:
        loop = AgentLoop(
            VirtualDriver(VirtualPhone("emulator-5554")),
            direct,
            Perceiver(None, retries=2, retry_delay_s=0),
            settings=LoopSettings(max_steps=3, settle_delay_s=0, ocr=False),
            shipments=Shipments(store, "direct", screenshots=False),
        )
        spec = TaskSpec("t1", 1, "Turn on dark theme", "emulator-5554", lease_id="l1")
        outcome = await loop.run(spec)
        assert outcome.status == "failed" and "disk refused the turn" in outcome.summary
        assert len(model.bodies("/v1/messages")) == 1, "the call was made and answered"
        assert store.open_calls() == []
        items = store.head(10)
        assert [i.kind for i in items] == [FAILED_CALLS], "not a call of unknown cost"
        record = decision_log_service_pb2.ShippedFailedCalls.FromString(items[0].body)
        assert (record.task_id, record.attempt, record.lease_id) == ("t1", 1, "l1")
        assert record.usage.input_tokens == 1234 and record.error == "IntegrityError"
        assert direct.spent.input_tokens == 1234, "this attempt's budget counts the call"
    finally:
        await direct.aclose()
        store.close()


async def test_a_decision_that_answered_ships_no_call_of_unknown_cost(
    tmp_path: Path, model: FakeModelServer
) -> None:
    """The other side of the same rule: a call whose decision was answered and shipped leaves
    no marker and no call of unknown cost (its cost went with the decision)."""
    model.script_anthropic(
        anthropic_message(text("Open Display."), tool_use("launch_app", _LAUNCH))
    )
    store = OutboxStore(tmp_path / "outbox.sqlite3")
    planner = _planner(model)
    try:
        loop = AgentLoop(
            VirtualDriver(VirtualPhone("emulator-5554")),
            planner,
            Perceiver(None, retries=2, retry_delay_s=0),
            settings=LoopSettings(max_steps=1, settle_delay_s=0, ocr=False),
            shipments=Shipments(store, "direct", screenshots=False),
        )
        spec = TaskSpec("t1", 1, "Turn on dark theme", "emulator-5554", lease_id="l1")
        await loop.run(spec)
        assert store.open_calls() == []
        kinds = [i.kind for i in store.head(10)]
        assert UNSETTLED not in kinds and "decision" in kinds
    finally:
        await planner.aclose()
        store.close()


async def test_a_call_of_unknown_cost_shows_in_the_host_s_console_and_export_until_settled(
    tmp_path: Path, model: FakeModelServer
) -> None:
    """The cloud's console and export said "1 call, cost unknown, at most $X", but the host's
    own task page and export (`amc host export`) did not: the outbox forgets a call once the
    cloud has it. The timeline now keeps each call shipped as of unknown cost with its bound:
    the task page shows it beside the cost, the export lists it per attempt as the cloud's
    export does (run.json's `unsettled`, a line of the report). A late answer's cost settles it
    there as on the cloud, and the retention prunes it with its attempt."""
    model.script_anthropic(
        anthropic_message(text("Open Display."), tool_use("launch_app", _LAUNCH))
    )
    outbox = OutboxStore(tmp_path / "outbox.sqlite3")
    db = tmp_path / "task_progress.sqlite3"
    timeline = TimelineStore(db, tmp_path / "artifacts")
    planner = _planner(model)
    try:
        loop = AgentLoop(
            VirtualDriver(VirtualPhone("emulator-5554")),
            _FailsAfterTheAnswer(planner),
            Perceiver(None, retries=2, retry_delay_s=0),
            timeline,
            LoopSettings(max_steps=3, settle_delay_s=0, ocr=False),
            shipments=Shipments(outbox, "direct", screenshots=False),
        )
        await loop.run(TaskSpec("t1", 1, "Turn on dark theme", "emulator-5554", lease_id="l1"))
        (item,) = outbox.head(10)
        shipped = decision_log_service_pb2.ShippedUnsettledCall.FromString(item.body)
        bound = usage_from_proto(shipped.at_most)
        assert timeline.unsettled_calls("t1", 1) == (1, bound)

        app = create_app(StoreOnly(timeline))
        with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as client:
            log_in(client, app.state.login_token.current)
            page = client.get("/tasks/t1").text
        words = (
            "1 model call whose cost was never recorded: at most "
            f"{bound.billed_tokens:,} tokens · ${bound.cost_usd:.4f}"
        )
        assert 'data-field="unsettled"' in page and words in page, page

        path, run = export_host_task(db, tmp_path / "artifacts", "h1", "t1", tmp_path / "x.zip")
        (unknown,) = run.unsettled
        assert (unknown.attempt, unknown.calls, unknown.at_most) == (1, 1, bound)
        with zipfile.ZipFile(path) as z:
            head = dataset.parse_run(z.read("run.json"))
            report = z.read("report.html").decode()
        assert isinstance(head, dataset.RunRecord) and head.schema_version == "amc.export.run/4"
        (record,) = head.unsettled
        assert (record.attempt, record.calls) == (1, 1)
        assert record.at_most.output_tokens == bound.output_tokens
        assert record.at_most_cost_usd == pytest.approx(bound.cost_usd)
        # The report says it in the consoles' words (it had a phrasing of its own).
        assert f'<dd data-field="unsettled">{words}</dd>' in report, report

        # Its answer came late: its cost is known, and it is no longer of unknown cost.
        late = Usage(input_tokens=500, output_tokens=100, cost_usd=0.003)
        late.calls.append(shipped.host_call_id)
        timeline.add_failed_calls("t1", 1, Billed("anthropic", "m", late), "CancelledError")
        assert timeline.unsettled_calls("t1", 1) == (0, Usage())

        # A call still of unknown cost goes with its attempt when the retention prunes it.
        timeline.add_unsettled_calls(
            [UnsettledCall("c2", "t1", 1, "anthropic", "m", Usage(output_tokens=8))]
        )
        assert timeline.unsettled_calls("t1", 1)[0] == 1
        later = datetime.now(UTC) + timedelta(days=30)
        assert timeline.prune(50, 7.0, now=later) == [("t1", 1)]
    finally:
        await planner.aclose()
        outbox.close()
        timeline.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT COUNT(*) FROM unsettled_calls").fetchone() == (0,)
