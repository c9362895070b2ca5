"""The direct transport's model-call markers (decision 0080) as the agent loop leaves them: a
call the host never learned the cost of is shipped as such however its decision ended, and
nothing else is.

Real parts: the virtual phone, the real Anthropic SDK against the local fake Messages server
(each call it answers writes its marker through the real `ObservedAdapter`), the outbox's own
SQLite file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import decision_log_service_pb2
from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.outbox import OutboxStore
from host.outbox.kinds import UNSETTLED
from host.outbox.shipments import Shipments
from host.perception.perceive import Perceiver
from planner.decision import Decision
from planner.history import WorldEvent
from planner.planner import Planner
from planner.scene import Scene
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
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


def _planner(model: FakeModelServer) -> Planner:
    settings = PlannerSettings(
        provider="anthropic",
        model="claude-sonnet-4-6",
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=model.anthropic_base_url,
        max_retries=0,
    )
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
