"""Session mode on the cloud transport: the cloud keeps the conversation in its database.

Real parts: the cloud gRPC server over mTLS on both backends (SQLite file, PostgreSQL), the
official `anthropic` and `openai` SDKs; only the model is a local fake
(`tests/support/fakes/`) that enforces the providers' rules for reasoning in
tool loops, since no real API is reachable here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select, update
from sqlalchemy import text as sql_text

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from cloud.events import EventBus
from cloud.server import CloudServer, build_server
from cloud.store import sessions, unsettled
from cloud.store.database import Store
from cloud.store.models import DecisionRow, FailedDecisionSpendRow, SessionItemRow, TaskRow
from cloud.store.ports import StoreSessionStore
from console.gateway import create_app
from console.settings import ConsoleSettings
from planner.conversation.items import (
    AssistantItem,
    Reasoning,
    SessionItem,
    ToolCall,
    ToolResult,
    UserObservation,
    dumps_item,
)
from planner.deciding import EXTRA_CALL
from planner.decision import CUT_MARK, MAX_RECORD_BYTES, MAX_THINKING_BLOCK_BYTES, Usage
from planner.observation import observation_from_scene
from planner.session.planner import NOT_CARRIED_OUT, NOT_RECORDED, NUDGE
from planner.session.store import SessionConflict
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    columns_added,
    result,
    submit,
    tasks_stub,
)
from tests.console.console_stack import UvicornThread
from tests.planner import scenes
from tests.support.fakes import (
    FakeModelServer,
    ScriptedTurn,
    anthropic_message,
    function_call,
    reasoning,
    text,
    thinking,
    tool_use,
)
from tests.support.postgres import PostgresServer
from tests.support.waiting import until

INTENT = {"purpose": "open it", "expected_outcome": "it opens"}
CONSOLE_TOKEN = "live-thinking-api-token-0123456789"
SCENE = '{"package":"com.android.settings","page":"Settings","elements":[{"id":"e1"}]}'


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


async def _cloud(make_settings: Any) -> AsyncIterator[CloudServer]:
    server = await build_server(make_settings(default_lease_seconds=30))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


def _use_anthropic(monkeypatch: pytest.MonkeyPatch, model: FakeModelServer) -> None:
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", model.anthropic_base_url)
    monkeypatch.setenv("AMC_PLANNER_THINKING", "budget")
    monkeypatch.setenv("AMC_PLANNER_THINKING_BUDGET_TOKENS", "2048")
    monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")


def _use_openai(monkeypatch: pytest.MonkeyPatch, model: FakeModelServer) -> None:
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "openai")
    monkeypatch.setenv("AMC_PLANNER_OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("AMC_PLANNER_OPENAI_BASE_URL", model.openai_base_url)
    # A reasoning model of the o-series (the default is one too, of another family).
    monkeypatch.setenv("AMC_PLANNER_MODEL", "o4-mini")
    monkeypatch.setenv("AMC_PLANNER_THINKING", "adaptive")
    monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")


async def _failed_spend(db_url: str) -> list[tuple[str, int, int]]:
    """(error, input tokens, output tokens) of each failed decision's counted call."""
    store = Store.from_url(db_url)
    try:
        async with store.read() as db:
            rows = (await db.execute(select(FailedDecisionSpendRow))).scalars().all()
    finally:
        await store.close()
    return [(r.error, r.input_tokens, r.output_tokens) for r in rows]


@pytest.fixture
async def anthropic_cloud(
    make_settings: Any, model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[CloudServer]:
    _use_anthropic(monkeypatch, model)
    async for server in _cloud(make_settings):
        yield server


@pytest.fixture
async def anthropic_session_cloud(
    make_settings: Any, model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[CloudServer]:
    """`anthropic_cloud` planning typed requests in session mode."""
    _use_anthropic(monkeypatch, model)
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    async for server in _cloud(make_settings):
        yield server


class Leased:
    """A scripted host holding one task's lease, with a Decide stub on its certificate."""

    def __init__(self, cloud: CloudServer, pki_dir: Path, host_id: str) -> None:
        self.ops = channel(cloud.address, pki_dir, "operator-ops")
        self.ch = channel(cloud.address, pki_dir, f"host-{host_id}")
        self.host = ScriptedHost(cloud.address, pki_dir, host_id)
        self.stub: Any = planner_service_pb2_grpc.PlannerServiceStub(self.ch)

    async def __aenter__(self) -> Leased:
        await self.host.connect(["p"])
        self.task = (await submit(tasks_stub(self.ops))).task
        self.assignment = (await self.host.next("assignment")).assignment
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.host.close()
        await self.ch.close()
        await self.ops.close()

    def request(
        self, outcome: planner_service_pb2.ToolOutcome | None = None, **step: Any
    ) -> planner_service_pb2.DecideRequest:
        a = self.assignment
        session = planner_service_pb2.SessionStep(
            goal=step.pop("goal", "Open Display"), scene_json=step.pop("scene_json", SCENE), **step
        )
        if outcome is not None:
            session.previous_outcome.CopyFrom(outcome)
        return planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            session=session,
            element_ids=["e1"],
            screen_width=1080,
            screen_height=2400,
        )


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details() or ""


async def test_the_cloud_keeps_the_conversation_with_signed_thinking(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    model.anthropic_script.extend(
        [
            ScriptedTurn(
                [
                    thinking("Settings is open."),
                    text("Tap e1."),
                    tool_use("tap", {"element_id": "e1", **INTENT}),
                ]
            ),
            ScriptedTurn(
                [
                    thinking("It opened."),
                    text("Done."),
                    tool_use("complete", {"success": True, "reason": "ok"}),
                ]
            ),
        ]
    )
    async with Leased(anthropic_cloud, pki_dir, "h20") as leased:
        first = await leased.stub.Decide(leased.request())
        assert first.session_call_id
        assert first.decision.tool_name == "tap"
        assert first.decision.thinking[0].text == "Settings is open."
        assert '"Open Display"' in first.decision.user_prompt  # the goal opens the conversation

        outcome = planner_service_pb2.ToolOutcome(
            call_id=first.session_call_id, output='{"ok":true}'
        )
        second = await leased.stub.Decide(leased.request(outcome))
        assert second.decision.tool_name == "complete"
        assert "Goal" not in second.decision.user_prompt  # only the first observation has it

        a = leased.assignment
        stored = await sessions.load(anthropic_cloud.store, a.task_id, a.attempt)
        # Both calls' markers settled with their decisions (decision 0080).
        assert await unsettled.of_task(anthropic_cloud.store, a.task_id) == (0, Usage())

    assert model.rejections == []
    messages = model.bodies("/v1/messages")[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assistant = messages[1]["content"]
    assert [b["type"] for b in assistant] == ["thinking", "text", "tool_use"]
    assert assistant[0]["signature"]
    results = [b for b in messages[2]["content"] if b["type"] == "tool_result"]
    assert results[0]["tool_use_id"] == first.session_call_id
    assert results[0]["content"] == '{"ok":true}'
    # Stored as the exact items, signature included.
    signatures = [b["signature"] for b in assistant if b["type"] == "thinking"]
    assert signatures[0] in "".join(stored)


async def test_bad_session_steps_get_clear_errors_and_lose_nothing(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    model.anthropic_script.extend(
        [
            ScriptedTurn(
                [thinking("a"), text("Tap."), tool_use("tap", {"element_id": "e1", **INTENT})]
            ),
            ScriptedTurn(
                [thinking("b"), text("Back."), tool_use("press_key", {"key": "back", **INTENT})]
            ),
        ]
    )
    async with Leased(anthropic_cloud, pki_dir, "h21") as leased:
        stub = leased.stub
        both = leased.request()
        both.user_prompt = "a compact prompt too"
        assert (await _code(stub.Decide(both)))[0] == grpc.StatusCode.INVALID_ARGUMENT
        big = leased.request(scene_json="x" * (512 * 1024 + 1))
        code, details = await _code(stub.Decide(big))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "session.scene_json" in details
        shot = leased.request()
        shot.screenshot = b"\x89PNG"
        assert (await _code(stub.Decide(shot)))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert (await _code(stub.Decide(leased.request(goal=" "))))[0] == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert model.bodies("/v1/messages") == []  # no tokens spent on any of those

        first = await stub.Decide(leased.request())
        unknown = planner_service_pb2.ToolOutcome(call_id="toolu_nope", output="{}")
        code, details = await _code(stub.Decide(leased.request(unknown)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "toolu_nope" in details

        # A retried step (its outcome already recorded) is accepted, not recorded twice.
        outcome = planner_service_pb2.ToolOutcome(call_id=first.session_call_id, output="{}")
        second = await stub.Decide(leased.request(outcome))
        assert second.decision.tool_name == "press_key"
        a = leased.assignment
        items = [b for b in await sessions.load(anthropic_cloud.store, a.task_id, a.attempt)]
        assert sum('"tool_result"' in b and first.session_call_id in b for b in items) == 1

        stale = leased.request()
        stale.lease_id = "not-live"
        assert (await _code(stub.Decide(stale)))[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert model.rejections == []


async def test_offline_cloud_answers_session_steps_unimplemented(
    make_settings: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    async for cloud in _cloud(make_settings):
        async with Leased(cloud, pki_dir, "h22") as leased:
            code, details = await _code(leased.stub.Decide(leased.request()))
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert "AMC_PLANNER_MODE=compact" in details


async def test_responses_reasoning_goes_back_with_its_encrypted_content(
    make_settings: Any,
    model: FakeModelServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _use_openai(monkeypatch, model)
    model.responses_script.extend(
        [
            ScriptedTurn(
                [reasoning("Tap e1."), function_call("tap", {"element_id": "e1", **INTENT})]
            ),
            ScriptedTurn(
                [reasoning("Done."), function_call("complete", {"success": True, "reason": "ok"})]
            ),
        ]
    )
    async for cloud in _cloud(make_settings):
        async with Leased(cloud, pki_dir, "h23") as leased:
            first = await leased.stub.Decide(leased.request())
            outcome = planner_service_pb2.ToolOutcome(call_id=first.session_call_id, output="{}")
            second = await leased.stub.Decide(leased.request(outcome))
    assert second.decision.tool_name == "complete"
    assert model.rejections == []
    sent = model.bodies("/v1/responses")[1]
    assert sent["store"] is False
    kinds = [item.get("type") for item in sent["input"]]
    assert (
        kinds.index("reasoning")
        < kinds.index("function_call")
        < kinds.index("function_call_output")
    )
    # The first answer's reasoning goes back with its encrypted content, as it was emitted.
    assert next(i for i in sent["input"] if i.get("type") == "reasoning")["encrypted_content"]


# --- the store underneath, on both backends ---------------------------------------------


ODD = "sig/+=\u2028\"\\'\x7f\U0001f600" * 50


async def test_items_round_trip_byte_for_byte(store: Store) -> None:
    items: list[SessionItem] = [
        UserObservation("screen", condensed="short"),
        Reasoning("anthropic", "t1", text="why", signature=ODD),
        Reasoning(
            "openai",
            "t2",
            item_id="rs_1",
            summary=("s",),
            encrypted_content=ODD[::-1],
            wire={"type": "reasoning", "id": "rs_1", "encrypted_content": ODD[::-1]},
        ),
        ToolCall("anthropic", "t1", "toolu_1", "tap", {"element_id": "e1"}),
    ]
    await StoreSessionStore(store).append("t", 1, items)
    loaded = await StoreSessionStore(store).load("t", 1)
    assert loaded == items
    assert [dumps_item(i) for i in loaded] == [dumps_item(i) for i in items]
    assert await StoreSessionStore(store).latest_attempt("t", before=2) == 1
    assert await StoreSessionStore(store).latest_attempt("t", before=1) is None


async def test_when_an_item_was_stored_follows_the_copy_of_a_new_attempt(store: Store) -> None:
    """`stored_at` (what a resumed decision's `answered_at` is read from): when the item was
    first stored, in the earliest attempt holding it, as a new attempt starts with a copy of
    the last one's conversation; an item that differs at that position in an earlier attempt
    is not it, and a position with no item is None."""
    items: list[SessionItem] = [
        UserObservation("screen"),
        ToolCall("anthropic", "t1", "toolu_1", "tap", {"element_id": "e1"}),
    ]
    await StoreSessionStore(store).append("t", 1, items)
    answered = dt.datetime(2026, 3, 4, 5, 6, 7, 89_000, tzinfo=dt.UTC)
    async with store.write() as session:
        await session.execute(
            update(SessionItemRow)
            .where(SessionItemRow.task_id == "t", SessionItemRow.attempt == 1)
            .values(created_at=answered)
        )
    await StoreSessionStore(store).append("t", 2, items)  # the next attempt's copy
    other = ToolCall("anthropic", "t2", "toolu_2", "tap", {"element_id": "e2"})
    await StoreSessionStore(store).append("t", 3, [items[0], other])
    sessions_store = StoreSessionStore(store)
    assert await sessions_store.stored_at("t", 2, 1) == answered
    copied_at = await sessions_store.stored_at("t", 3, 1)
    assert copied_at is not None and copied_at > answered  # a new answer: its own time
    assert await sessions_store.stored_at("t", 2, 2) is None


async def test_two_calls_continuing_one_conversation_cannot_interleave(store: Store) -> None:
    await StoreSessionStore(store).append("t", 1, [UserObservation("one")])
    a, b = StoreSessionStore(store), StoreSessionStore(store)
    await a.load("t", 1)
    await b.load("t", 1)
    await a.append("t", 1, [UserObservation("two (a)")])
    with pytest.raises(SessionConflict, match="continued by another call"):
        await b.append("t", 1, [UserObservation("two (b)"), UserObservation("three (b)")])
    loaded = await StoreSessionStore(store).load("t", 1)
    assert loaded == [UserObservation("one"), UserObservation("two (a)")]  # nothing of the loser's


async def test_retention_removes_conversations_of_old_finished_tasks(store: Store) -> None:
    from tests.cloud.test_store import _task

    old, fresh = await _task(store), await _task(store)
    for task_id in (old, fresh):
        await StoreSessionStore(store).append(task_id, 1, [UserObservation("x")] * 3)
    async with store.write() as session:
        await session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == old)
            .values(finished_at=store.now() - dt.timedelta(days=40), status="SUCCEEDED")
        )
    assert await sessions.prune(store, dt.timedelta(days=30)) == 3
    assert await sessions.load(store, old, 1) == []
    assert len(await sessions.load(store, fresh, 1)) == 3


# --- live thinking: streamed by the cloud's model call, watched by operators -----------------


async def test_operators_watch_the_model_think_live(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    thought = "The Settings list is open; Display sits second from the top, so tap it."
    model.anthropic_script.append(
        ScriptedTurn(
            [thinking(thought), text("Tap."), tool_use("tap", {"element_id": "e1", **INTENT})]
        )
    )
    async with Leased(anthropic_cloud, pki_dir, "h24") as leased:
        watcher: Any = progress_service_pb2_grpc.ProgressServiceStub(leased.ops)
        watch = watcher.WatchProgress(
            progress_service_pb2.WatchProgressRequest(
                task_id=leased.task.task_id, include_thinking=True
            )
        )
        assert (await watch.read()).snapshot
        decided = asyncio.ensure_future(leased.stub.Decide(leased.request()))
        live = ""
        while live != thought:
            message = await asyncio.wait_for(watch.read(), 10)

            if message.HasField("thinking"):
                assert (message.thinking.task_id, message.thinking.attempt) == (
                    leased.task.task_id,
                    leased.assignment.attempt,
                )
                live += message.thinking.delta
        watch.cancel()
        decision = (await decided).decision
    assert decision.thinking[0].text == thought  # what is kept is the decision's thinking
    assert len(model.bodies("/v1/messages")) == 1 and model.bodies("/v1/messages")[0]["stream"]


@pytest.mark.parametrize(
    ("reported", "output", "cost"),
    [("message_start", 1, 0.002565), ("message_delta", 40, 0.00315)],
)
async def test_a_streamed_call_cut_off_by_a_cancel_counts_what_the_provider_reported(
    anthropic_session_cloud: CloudServer,
    model: FakeModelServer,
    pki_dir: Path,
    db_url: str,
    reported: str,
    output: int,
    cost: float,
) -> None:
    """A Decide its host gives up on while the model's answer is streaming hangs the stream up,
    yet the provider billed the input it read (reported by `message_start`) and the output
    written so far (by the last `message_delta`, else `message_start`'s 1): counted once, in the
    task's totals and the day's spending, as a cut-off call (`StreamCutOff`)."""
    hold = threading.Event()
    blocks = [thinking("Look."), thinking("Display is second.")]
    turn = ScriptedTurn(
        [*blocks, tool_use("tap", {"element_id": "e1", **INTENT})],
        usage={
            "input_tokens": 500,
            "output_tokens": 300,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 200,
        },
        hold=hold,
        # The second block's first thinking delta (after the first block's delta and
        # signature): what the cloud shows live was read after everything before it.
        hold_after="content_block_delta",
        hold_nth=3,
    )
    if reported == "message_delta":
        turn.output_so_far = (0, 40)  # reported between the two blocks
    model.anthropic_script.append(turn)
    try:
        async with Leased(anthropic_session_cloud, pki_dir, "h25") as leased:
            watcher: Any = progress_service_pb2_grpc.ProgressServiceStub(leased.ops)
            watch = watcher.WatchProgress(
                progress_service_pb2.WatchProgressRequest(
                    task_id=leased.task.task_id, include_thinking=True
                )
            )
            assert (await watch.read()).snapshot
            call = leased.stub.Decide(leased.request())
            live = ""
            while "Display" not in live:  # the second block's delta reached the cloud
                message = await asyncio.wait_for(watch.read(), 10)
                live += message.thinking.delta if message.HasField("thinking") else ""
            watch.cancel()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            tasks = tasks_stub(leased.ops)
            get = task_service_pb2.GetTaskRequest(task_id=leased.task.task_id)

            async def counted() -> bool:
                return bool((await tasks.GetTask(get)).task.totals.usage.input_tokens)

            # Counted while the stream is still held: released before the cloud's handler saw
            # the cancel, the rest of the stream (its last message_delta) could still be read.
            await until(counted, within=15, what="the cut-off call counted")
            hold.set()  # the provider would go on; nobody listens any more
            # Its marker settled with its record (decision 0080): its cost is known.
            marked = await unsettled.of_task(anthropic_session_cloud.store, leased.task.task_id)
            assert marked[0] == 0
            totals = (await tasks.GetTask(get)).task.totals.usage
            fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(leased.ops)
            today = (await fleet.GetSpend(fleet_service_pb2.GetSpendRequest())).today
    finally:
        hold.set()
    assert await _failed_spend(db_url) == [("StreamCutOff", 500, output)]
    for usage in (totals, today):
        assert (
            usage.input_tokens,
            usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens,
            usage.output_tokens,
        ) == (500, 1000, 200, output)
        assert usage.cost_usd == pytest.approx(cost)


@pytest.mark.parametrize(
    ("reported", "output", "cost"),
    [("message_start", 1, 0.002565), ("message_delta", 40, 0.00315)],
)
async def test_a_stream_the_provider_breaks_counts_what_it_reported(
    anthropic_session_cloud: CloudServer,
    model: FakeModelServer,
    pki_dir: Path,
    db_url: str,
    reported: str,
    output: int,
    cost: float,
) -> None:
    """A stream that fails on its own after HTTP 200 (`event: error`, overloaded) ends the
    Decide UNAVAILABLE, yet the provider billed the input `message_start` reported and the output
    the last `message_delta` reported: counted once, in the task's totals and the day's spending,
    as a cut-off call (`StreamCutOff`), as for a stream cut off by a cancel."""
    turn = ScriptedTurn(
        [thinking("Look."), thinking("Display is second."), tool_use("tap", {"element_id": "e1"})],
        usage={
            "input_tokens": 500,
            "output_tokens": 300,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 200,
        },
        fail=("overloaded_error", "Overloaded"),
    )
    if reported == "message_delta":
        turn.output_so_far = (0, 40)  # reported after the first block, then the error
        turn.fail_after = "message_delta"
    model.anthropic_script.append(turn)
    async with Leased(anthropic_session_cloud, pki_dir, "h26") as leased:
        code, details = await _code(leased.stub.Decide(leased.request()))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "overloaded_error" in details
        get = task_service_pb2.GetTaskRequest(task_id=leased.task.task_id)
        totals = (await tasks_stub(leased.ops).GetTask(get)).task.totals.usage
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(leased.ops)
        today = (await fleet.GetSpend(fleet_service_pb2.GetSpendRequest())).today
    assert await _failed_spend(db_url) == [("StreamCutOff", 500, output)]
    for usage in (totals, today):
        assert (
            usage.input_tokens,
            usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens,
            usage.output_tokens,
        ) == (500, 1000, 200, output)
        assert usage.cost_usd == pytest.approx(cost)


def _failed_response() -> ScriptedTurn:
    """A Responses answer that ends `failed` with its usage: 1500 input tokens (1000 of them
    cached) and 300 output, counted as 500 input, 1000 cache read and 300 output."""
    return ScriptedTurn(
        [reasoning("Tap e1."), function_call("tap", {"element_id": "e1", **INTENT})],
        usage={
            "input_tokens": 1500,
            "input_tokens_details": {"cached_tokens": 1000},
            "output_tokens": 300,
            "output_tokens_details": {"reasoning_tokens": 250},
        },
        fail=("server_error", "The model failed to finish."),
        failed_event=True,
    )


async def test_a_responses_stream_that_failed_counts_the_usage_it_reported(
    make_settings: Any,
    model: FakeModelServer,
    pki_dir: Path,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Responses stream that ends `response.failed` fails the Decide UNAVAILABLE with the
    provider's error; the failed response carries the usage OpenAI billed, counted once under
    the error's class, as the same failure not streamed is. It was counted as a cut-off call
    (`StreamCutOff`) and told as "stream broke off": the stream ended as the API ends one, with
    its terminal event. OpenAI reports usage in no other event: a stream cut off before its end
    counts nothing."""
    _use_openai(monkeypatch, model)
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    model.responses_script.append(_failed_response())
    async for cloud in _cloud(make_settings):
        async with Leased(cloud, pki_dir, "h27") as leased:
            code, details = await _code(leased.stub.Decide(leased.request()))
            assert code == grpc.StatusCode.UNAVAILABLE
            assert "The model failed to finish." in details
            assert "server_error" in details and "broke off" not in details
            get = task_service_pb2.GetTaskRequest(task_id=leased.task.task_id)
            totals = (await tasks_stub(leased.ops).GetTask(get)).task.totals.usage
    assert await _failed_spend(db_url) == [("PlannerUnavailable", 500, 300)]
    assert (totals.input_tokens, totals.cache_read_input_tokens, totals.output_tokens) == (
        500,
        1000,
        300,
    )
    assert totals.cost_usd > 0


async def test_a_response_not_streamed_that_failed_is_counted_as_failed_not_cut_off(
    make_settings: Any,
    model: FakeModelServer,
    pki_dir: Path,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Responses call not streamed (AMC_PLANNER_SESSION_STREAM=false) that OpenAI answers
    HTTP 200 with `status: "failed"` and its usage was counted as `StreamCutOff`: no stream was
    cut off, and the failed-calls record said so to whoever read it. It is counted under the
    error's class, as a failed decision's answered calls are."""
    _use_openai(monkeypatch, model)
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    monkeypatch.setenv("AMC_PLANNER_SESSION_STREAM", "false")
    model.responses_script.append(_failed_response())
    async for cloud in _cloud(make_settings):
        async with Leased(cloud, pki_dir, "h28") as leased:
            code, details = await _code(leased.stub.Decide(leased.request()))
            assert code == grpc.StatusCode.UNAVAILABLE
            assert "The model failed to finish." in details
    assert [bool(b.get("stream")) for b in model.bodies("/responses")] == [False]
    assert await _failed_spend(db_url) == [("PlannerUnavailable", 500, 300)]


JUDGED = "Settings opened as expected. Now open Display, where the theme is."


@pytest.mark.parametrize(
    ("model_name", "thinking_mode", "display"),
    [
        ("claude-opus-5-5", "adaptive", "summarized"),  # the default: the reasoning is shown
        ("claude-opus-5-5", "adaptive", "updates"),  # the text alone: nothing is shown
        ("claude-sonnet-5-5", "off", "summarized"),
    ],
)
async def test_the_console_s_live_thinking_leaves_out_the_text_a_55_model_writes_before_its_call(
    make_settings: Any,
    model: FakeModelServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    model_name: str,
    thinking_mode: str,
    display: str,
) -> None:
    """Claude Opus/Sonnet 5.5 return the text they write before a tool call in a thinking block
    of its own: the decision records it as the rationale, and the console's live view (its SSE
    `thinking` events) showed it as the model's thinking. What the operator watches live is the
    recorded thinking, nothing else: by default the model's reasoning, as it arrives."""
    _use_anthropic(monkeypatch, model)
    monkeypatch.setenv("AMC_PLANNER_MODEL", model_name)
    monkeypatch.setenv("AMC_PLANNER_THINKING", thinking_mode)
    monkeypatch.setenv("AMC_PLANNER_THINKING_DISPLAY", display)
    thought = "The Settings list is open; Display holds the theme."
    model.anthropic_script.append(
        ScriptedTurn(
            [thinking(thought), text(JUDGED), tool_use("tap", {"element_id": "e1", **INTENT})]
        )
    )
    async for cloud in _cloud(make_settings):
        settings = ConsoleSettings(
            cloud_address=cloud.address,
            certs_dir=pki_dir,
            operator_name="ops",
            tls_server_name="localhost",
            admin_username="ops",
            admin_password=SecretStr("correct horse battery staple"),
            api_token=SecretStr(CONSOLE_TOKEN),
            session_secret=SecretStr("live-thinking-session-secret-0123456789"),
        )
        gateway = UvicornThread(create_app(settings))
        base = gateway.start()
        try:
            async with (
                Leased(cloud, pki_dir, "h28") as leased,
                httpx.AsyncClient(
                    base_url=base, headers={"Authorization": f"Bearer {CONSOLE_TOKEN}"}, timeout=20
                ) as api,
                api.stream("GET", f"/api/tasks/{leased.task.task_id}/events") as stream,
            ):
                events = _sse(stream)
                name, _ = await anext(events)
                assert name == "task"  # the snapshot: the cloud's watch is subscribed
                decision = (await leased.stub.Decide(leased.request())).decision
                await leased.host.send(result(leased.assignment))
                live = ""
                async for name, data in events:
                    if name == "thinking":
                        live += json.loads(data)["delta"]
                    elif name == "end":
                        break
        finally:
            gateway.stop()
    assert model.bodies("/v1/messages")[0]["stream"]
    assert decision.rationale == JUDGED
    assert live == "".join(b.text for b in decision.thinking)
    assert JUDGED not in live
    assert live == (thought if (thinking_mode, display) == ("adaptive", "summarized") else "")


async def _sse(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a text/event-stream response, as they arrive."""
    event, data = "message", list[str]()
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


@pytest.mark.postgres
async def test_live_thinking_crosses_replicas_in_order(postgres_server: PostgresServer) -> None:
    """Two replicas on one PostgreSQL: the one calling the model NOTIFYs, the watcher's gets it
    (SQLite has one replica, so there is nothing to cross there)."""
    db_url = postgres_server.create_database()
    store_a, store_b = Store.from_url(db_url), Store.from_url(db_url)
    bus_a, bus_b = EventBus(store_a), EventBus(store_b)
    await bus_a.start()
    await bus_b.start()
    try:
        sub = bus_b.subscribe(thinking=True, task_id="t1")
        deltas = ["Let me ", "look: ", "é\u2028\U0001f600" * 700, " done."]
        for delta in deltas:
            bus_a.thinking("t1", 2, delta)
        bus_a.thinking("other-task", 1, "not watched")
        received = ""
        while received != "".join(deltas):
            await asyncio.wait_for(sub.next(), 10)
            for task_id, attempt, text in sub.take_thinking():
                assert (task_id, attempt) == ("t1", 2)
                received += text
    finally:
        await bus_a.stop()
        await bus_b.stop()
        await store_a.close()
        await store_b.close()


# --- operators read the conversation back ------------------------------------------------------


async def test_operators_read_the_conversation_without_the_opaque_material(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    model.anthropic_script.extend(
        [
            ScriptedTurn(
                [
                    thinking("The form is open; type the PIN."),
                    text("Type it."),
                    tool_use("input_text", {"text": "4711-secret", "sensitive": True, **INTENT}),
                ]
            ),
            ScriptedTurn(
                [
                    thinking("Typed."),
                    text("Done."),
                    tool_use("complete", {"success": True, "reason": "ok"}),
                ]
            ),
        ]
    )
    async with Leased(anthropic_cloud, pki_dir, "h25") as leased:
        first = await leased.stub.Decide(leased.request())
        outcome = planner_service_pb2.ToolOutcome(
            call_id=first.session_call_id, output='{"ok":true}'
        )
        await leased.stub.Decide(leased.request(outcome))
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(leased.ops)
        a = leased.assignment

        def ask(**fields: Any) -> Any:
            request = decision_log_service_pb2.GetConversationRequest(
                task_id=a.task_id, attempt=a.attempt, **fields
            )
            return log.GetConversation(request)

        whole = await ask()
        first_page = await ask(page_size=4)
        rest = await ask(page_size=100, page_token=first_page.next_page_token)
        host_call: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(leased.ch)
        refusals = [
            await _code(
                host_call.GetConversation(
                    decision_log_service_pb2.GetConversationRequest(task_id=a.task_id, attempt=1)
                )
            ),
            await _code(ask(page_token="not-ours")),
            await _code(ask(page_token="¹")),  # a digit to str.isdigit, not to int()
            await _code(
                log.GetConversation(
                    decision_log_service_pb2.GetConversationRequest(task_id="nope", attempt=1)
                )
            ),
            await _code(
                log.GetConversation(
                    decision_log_service_pb2.GetConversationRequest(task_id=a.task_id)
                )
            ),
        ]

    kinds = decision_log_service_pb2.ConversationItemKind.Name
    assert [kinds(i.kind).removeprefix("CONVERSATION_ITEM_KIND_") for i in whole.items] == [
        "OBSERVATION",
        "REASONING",
        "ASSISTANT_TEXT",
        "TOOL_CALL",
        "TOOL_RESULT",
        "OBSERVATION",
        "REASONING",
        "ASSISTANT_TEXT",
        "TOOL_CALL",
    ]
    assert [i.seq for i in whole.items] == list(range(9))
    assert whole.items[1].text == "The form is open; type the PIN." and whole.items[1].provider
    assert whole.items[4].call_id == whole.items[3].call_id and whole.items[4].text == '{"ok":true}'
    wire = whole.SerializeToString()
    assert b"4711-secret" not in wire  # the sensitive text was masked when the call was stored
    signatures = [
        b["signature"]
        for m in model.bodies("/v1/messages")[1]["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "thinking"
    ]
    assert signatures and all(sig.encode() not in wire for sig in signatures)
    assert list(first_page.items) + list(rest.items) == list(whole.items)
    assert first_page.next_page_token and not rest.next_page_token
    assert [code for code, _ in refusals] == [
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]


# --- a decision lost after the model's turn was kept ------------------------------------------

#: A decision-log insert of step 2 fails once it is armed: the replica "dies" after the model's
#: turn was kept in the conversation and before the decision was logged or delivered.
_LOSE_STEP_2 = {
    "sqlite": [
        "CREATE TRIGGER amc_test_lose BEFORE INSERT ON decisions WHEN NEW.step_index = 2"
        " BEGIN SELECT RAISE(ABORT, 'the replica died before logging'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION amc_test_lose() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.step_index = 2 THEN RAISE EXCEPTION 'the replica died before logging'; END IF;"
        " RETURN NEW; END $$",
        "CREATE TRIGGER amc_test_lose BEFORE INSERT ON decisions FOR EACH ROW"
        " EXECUTE FUNCTION amc_test_lose()",
    ],
}


def _tool_results(body: dict[str, Any]) -> dict[str, str]:
    """call id -> the tool result text a request sends back for it (both wire formats)."""
    if "messages" in body:  # Anthropic Messages
        blocks = [b for m in body["messages"] if isinstance(m["content"], list)
                  for b in m["content"]]  # fmt: skip
        return {
            b["tool_use_id"]: b["content"]
            if isinstance(b["content"], str)
            else "".join(part["text"] for part in b["content"])
            for b in blocks
            if b.get("type") == "tool_result"
        }
    return {
        i["call_id"]: i["output"] for i in body["input"] if i.get("type") == "function_call_output"
    }


#: The model's turns: step 1, step 2 (lost), step 2 asked again, step 3.
_LOST_STEP_TURNS: list[tuple[str, str, dict[str, Any]]] = [
    ("Open Display.", "tap", {"element_id": "e1", **INTENT}),
    ("Go back.", "press_key", {"key": "back", **INTENT}),
    ("Open Display again.", "tap", {"element_id": "e2", **INTENT}),
    ("Done.", "complete", {"success": True, "reason": "ok"}),
]


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_a_call_whose_decision_was_lost_is_answered_as_not_carried_out(
    make_settings: Any,
    model: FakeModelServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
) -> None:
    """Step 2's model turn (its tool call) was kept in the conversation, then the replica died
    before logging the decision: the host never got it and asked for step 2 again, reporting
    step 1's outcome again (another replica: the first one's kept plan died with it). The
    retry answered the lost call with step 1's outcome: it told the model that a call never
    carried out did what the one before did. Each call's id is now in the decision log: an
    outcome answers the call of the decision it names, and a call no decision carried is
    answered as not carried out (a valid request for both providers: every call is answered
    in the next user turn)."""
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
    if provider == "anthropic":
        _use_anthropic(monkeypatch, model)
        path = "/v1/messages"
        model.anthropic_script.extend(
            ScriptedTurn([thinking(why), text(why), tool_use(name, args)])
            for why, name, args in _LOST_STEP_TURNS
        )
    else:
        _use_openai(monkeypatch, model)
        path = "/v1/responses"
        model.responses_script.extend(
            ScriptedTurn([reasoning(why), function_call(name, args)])
            for why, name, args in _LOST_STEP_TURNS
        )
    first_replica = await build_server(make_settings())
    await first_replica.start()
    try:
        async with Leased(first_replica, pki_dir, "h25") as leased:
            a = leased.assignment

            def step(key: str, outcome: int = 0) -> planner_service_pb2.DecideRequest:
                request = planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation_from_scene(scenes.settings_main()),
                    step_key=key,
                )
                if outcome:
                    request.previous_outcome.CopyFrom(
                        types_pb2.ActionOutcome(
                            step_index=outcome, executed=False, error=f"step {outcome} failed"
                        )
                    )
                return request

            first = await leased.stub.Decide(step("1"))
            store = first_replica.store
            dialect = store.engine.dialect.name
            async with store.write() as session:
                for statement in _LOSE_STEP_2[dialect]:
                    await session.execute(sql_text(statement))
            with pytest.raises(grpc.aio.AioRpcError):
                await leased.stub.Decide(step("2", outcome=1))
            async with store.write() as session:
                drop = " ON decisions" if dialect != "sqlite" else ""
                await session.execute(sql_text(f"DROP TRIGGER amc_test_lose{drop}"))
            lost = [i for i in await StoreSessionStore(store).load(a.task_id, a.attempt)
                    if isinstance(i, ToolCall)][-1]  # fmt: skip
            assert lost.name == "press_key"  # the lost turn was kept
            await first_replica.stop(0.5)  # the replica died: the host asks another one

            async for replica in _cloud(make_settings):
                async with channel(replica.address, pki_dir, "host-h25") as ch:
                    stub: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
                    second = await stub.Decide(step("2", outcome=1))
                    assert second.decision.tool_name == "tap"
                    assert second.decision.step_index == 2
                    third = await stub.Decide(step("3", outcome=2))
                    assert third.decision.tool_name == "complete"
    finally:
        await first_replica.stop(0.5)

    assert model.rejections == []
    _, lost_call, retry, last = [_tool_results(b) for b in model.bodies(path)]
    failed_1 = lost_call[first.session_call_id]
    assert "step 1 failed" in failed_1
    assert retry[first.session_call_id] == failed_1  # step 1's outcome stays on its own call
    assert "not carried out" in retry[lost.call_id] and "step 1 failed" not in retry[lost.call_id]
    assert "step 2 failed" in last[second.session_call_id]  # the call the host did execute
    assert "step 2 failed" not in last[lost.call_id]


async def test_a_call_an_older_replica_logged_is_not_called_not_carried_out(
    anthropic_session_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """During a rolling deploy a replica from before 0018 logs step 2 without its call id, and
    the host restarts and reports no outcome for it. The call was delivered (it is logged), so
    the model hears that its outcome was not recorded, not that it was not carried out."""
    model.anthropic_script.extend(
        ScriptedTurn([thinking(why), text(why), tool_use(name, args)])
        for why, name, args in _LOST_STEP_TURNS
    )
    async with Leased(anthropic_session_cloud, pki_dir, "h26") as leased:
        a = leased.assignment
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.settings_main()),
        )
        await leased.stub.Decide(request)
        request.previous_outcome.CopyFrom(types_pb2.ActionOutcome(step_index=1, executed=True))
        second = await leased.stub.Decide(request)
        async with anthropic_session_cloud.store.write() as session:
            await session.execute(
                update(DecisionRow)
                .where(DecisionRow.task_id == a.task_id, DecisionRow.step_index == 2)
                .values(call_id=None)
            )
        request.ClearField("previous_outcome")  # the host restarted: it does not know
        await leased.stub.Decide(request)
    assert model.rejections == []
    answered = _tool_results(model.bodies("/v1/messages")[2])[second.session_call_id]
    assert answered == NOT_RECORDED


async def test_migration_0033_adds_where_a_decision_resumed_from_and_back(db_url: str) -> None:
    """Both backends: 0033 adds the kept answer a decision went on from (`decisions.
    resumed_position`, `resumed_turn_id`), its downgrade drops them, and the schema matches the
    models again after the upgrade."""
    assert await columns_added(db_url, "decisions", "0032", "0033") == {
        "resumed_position",
        "resumed_turn_id",
    }


async def test_migration_0035_adds_when_a_kept_answer_was_answered_and_back(db_url: str) -> None:
    """Both backends: 0035 adds when the kept answer a resumed decision went on from was
    answered (`decisions.resumed_answered_at`), its downgrade drops it, and the schema matches
    the models again after the upgrade."""
    assert await columns_added(db_url, "decisions", "0034", "0035") == {"resumed_answered_at"}


async def test_migration_0018_adds_the_decisions_call_id_and_back(db_url: str) -> None:
    """Both backends: 0018 adds `decisions.call_id`, its downgrade drops it, and the schema
    matches the models again after the upgrade (read from each catalogue, as for 0016)."""
    assert await columns_added(db_url, "decisions", "0017", "0018") == {"call_id"}


#: The decision-log insert of step 1 fails: the attempt's very first decision is lost after
#: the model's turn was kept.
_LOSE_STEP_1 = {
    dialect: [s.replace("step_index = 2", "step_index = 1") for s in statements]
    for dialect, statements in _LOSE_STEP_2.items()
}


async def test_a_first_decision_that_was_lost_is_answered_as_not_carried_out(
    anthropic_session_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """The attempt's first decision was lost after its model turn was kept: the host never got
    it and asks for step 1 again. No step is logged yet, so every call in the conversation is
    one no decision carried: it is answered as not carried out, not as an outcome "not
    recorded (the planner restarted before it was reported)", which told the model that an
    action it never took may have happened."""
    model.anthropic_script.extend(
        ScriptedTurn([thinking(why), text(why), tool_use(name, args)])
        for why, name, args in _LOST_STEP_TURNS
    )
    cloud = anthropic_session_cloud
    store = cloud.store
    dialect = store.engine.dialect.name
    async with Leased(cloud, pki_dir, "h27") as leased:
        a = leased.assignment
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.settings_main()),
        )
        async with store.write() as session:
            for statement in _LOSE_STEP_1[dialect]:
                await session.execute(sql_text(statement))
        with pytest.raises(grpc.aio.AioRpcError):
            await leased.stub.Decide(request)
        async with store.write() as session:
            drop = " ON decisions" if dialect != "sqlite" else ""
            await session.execute(sql_text(f"DROP TRIGGER amc_test_lose{drop}"))
        [lost] = [i for i in await StoreSessionStore(store).load(a.task_id, a.attempt)
                  if isinstance(i, ToolCall)]  # fmt: skip
        again = await leased.stub.Decide(request)
    assert again.decision.step_index == 1
    assert model.rejections == []
    answered = _tool_results(model.bodies("/v1/messages")[1])[lost.call_id]
    assert answered == NOT_CARRIED_OUT


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_a_decision_that_thought_at_length_fits_one_record_and_its_thinking_goes_back_whole(
    make_settings: Any,
    model: FakeModelServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
) -> None:
    """64 thinking blocks of 64 KiB each (every one within the decision log's limit of one):
    the decision came to over 4 MiB, so the host's Decide, on a channel with gRPC's default
    limits, was refused RESOURCE_EXHAUSTED, and so was every read of the task's decision log
    that held it. The record now keeps its largest texts cut to fit `MAX_RECORD_BYTES`, each
    cut saying so; the next model call still gets every block back whole and signed (Anthropic)
    or with its encrypted content (OpenAI), from the conversation the cloud keeps."""
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    # Not streamed: the fakes stream text 7 characters an event, 600,000 events for 4 MiB.
    monkeypatch.setenv("AMC_PLANNER_SESSION_STREAM", "false")
    thoughts = [f"thought {i}: " + "why " * (MAX_THINKING_BLOCK_BYTES // 4 - 4) for i in range(64)]
    if provider == "anthropic":
        _use_anthropic(monkeypatch, model)
        path = "/v1/messages"
        model.anthropic_script.extend(
            [
                ScriptedTurn(
                    [*map(thinking, thoughts), tool_use("tap", {"element_id": "e1", **INTENT})]
                ),
                ScriptedTurn(
                    [thinking("Done."), tool_use("complete", {"success": True, "reason": "ok"})]
                ),
            ]
        )
    else:
        _use_openai(monkeypatch, model)
        path = "/v1/responses"
        model.responses_script.extend(
            [
                ScriptedTurn(
                    [
                        *map(reasoning, thoughts),
                        function_call("tap", {"element_id": "e1", **INTENT}),
                    ]
                ),
                ScriptedTurn(
                    [
                        reasoning("Done."),
                        function_call("complete", {"success": True, "reason": "ok"}),
                    ]
                ),
            ]
        )
    async for cloud in _cloud(make_settings):
        async with Leased(cloud, pki_dir, "h27") as leased:  # default message limits, both
            a = leased.assignment
            request = planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.settings_main()),
                step_key="1",
            )
            first = await leased.stub.Decide(request)
            request.step_key = "2"
            request.previous_outcome.CopyFrom(types_pb2.ActionOutcome(step_index=1, executed=True))
            second = await leased.stub.Decide(request)
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(leased.ops)
            listed = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=a.task_id, attempt=a.attempt, include_observation=True
                )
            )

    assert (first.decision.tool_name, second.decision.tool_name) == ("tap", "complete")
    assert first.decision.ByteSize() <= MAX_RECORD_BYTES
    record = listed.decisions[0]
    assert [d.step_index for d in listed.decisions] == [1, 2]
    made = types_pb2.Decision()
    made.CopyFrom(record)
    made.ClearField("outcome")  # recorded later, with its own small limits
    made.ClearField("verification")
    assert made.ByteSize() <= MAX_RECORD_BYTES
    blocks = [b.text for b in record.thinking]
    assert len(blocks) == 64  # every block is there, each cut by the same share
    assert all(b.startswith(t[:512]) for b, t in zip(blocks, thoughts, strict=True))
    assert all(
        f"{CUT_MARK}this thinking[{i}] is {len(t):,} bytes" in b
        for i, (b, t) in enumerate(zip(blocks, thoughts, strict=True))
    )
    assert record.purpose == INTENT["purpose"]  # the short texts stay whole
    # The next call got every block back whole, with what the provider needs to check it.
    assert model.rejections == []
    sent = model.bodies(path)[1]
    if provider == "anthropic":
        assistant = next(m["content"] for m in sent["messages"] if m["role"] == "assistant")
        returned = [b for b in assistant if b["type"] == "thinking"]
        assert [b["thinking"] for b in returned] == thoughts
        assert all(b["signature"] for b in returned)
    else:
        returned = [i for i in sent["input"] if i.get("type") == "reasoning"]
        assert [i["summary"][0]["text"] for i in returned] == thoughts
        assert all(i["encrypted_content"] for i in returned)


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_database_drop_at_the_retry_instruction_keeps_the_paid_answer(
    anthropic_session_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """The model answered step 1 without a tool call (a paid turn, kept in the conversation),
    then the database connection dropped while the cloud wrote the instruction to call one.
    The host asks again: the conversation goes on from that answer with the instruction (the
    retry the first Decide was about to make), and what the first call cost is counted once.
    Before, the retry sent the observation again after the kept answer, asking the model the
    same question anew, and the first call's cost stayed unknown (its marker never settled)."""
    model.anthropic_script.extend(
        [
            anthropic_message(thinking("Settings is open."), text("Looking."), input_tokens=1000),
            anthropic_message(tool_use("tap", {"element_id": "e1", **INTENT}), input_tokens=2000),
        ]
    )
    # The nudge's write (the retry instruction after a model turn without a tool call) is the
    # one that loses its connection (`_step_1_dropped_at`, below).
    again, totals, _, _ = await _step_1_dropped_at(
        anthropic_session_cloud, pki_dir, "h28", '"kind":"instruction"'
    )
    assert again.decision.tool_name == "tap" and again.decision.step_index == 1
    assert model.rejections == []
    first, retry = model.bodies("/v1/messages")  # the first question was asked once
    assert first["messages"] == retry["messages"][: len(first["messages"])]
    answer, nudge = retry["messages"][len(first["messages"]) :]
    assert answer["role"] == "assistant"
    assert nudge["role"] == "user" and NUDGE in json.dumps(nudge["content"])
    assert totals.usage.input_tokens == 3000  # each call once
    assert totals.unsettled.calls == 0
    # The kept answer had no call: the decision is the retry's answer, asked now.
    assert not again.decision.HasField("resumed_from")


#: Step 2's decision-log insert waits for the test's advisory lock: the replica that makes it
#: has kept the model's turn and not yet logged the decision.
_HOLD_STEP_2 = [
    "CREATE FUNCTION amc_test_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " IF NEW.step_index = 2 THEN PERFORM pg_advisory_xact_lock(4242); END IF;"
    " RETURN NEW; END $$",
    "CREATE TRIGGER amc_test_hold BEFORE INSERT ON decisions FOR EACH ROW"
    " EXECUTE FUNCTION amc_test_hold()",
]


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_call_told_not_carried_out_whose_decision_won_is_corrected(
    make_settings: Any,
    model: FakeModelServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas plan step 2 at once (the host's first Decide timed out and it asked
    another): replica 2 finds replica 1's call in the conversation with no decision logged,
    tells the model it was not carried out and asks again; then replica 1's decision is logged
    first, so replica 2 answers the host with it and the phone does that call. The record says
    it was done; the model had been told it was not, and the outcome the host then reported for
    it was dropped (the call had its result already). It is now told the call was carried out
    after all, with what it did."""
    monkeypatch.setenv("AMC_PLANNER_MODE", "session")
    _use_anthropic(monkeypatch, model)
    late = threading.Event()
    model.anthropic_script.extend(
        [
            ScriptedTurn([thinking("Open."), tool_use("tap", {"element_id": "e1", **INTENT})]),
            ScriptedTurn([thinking("Back."), tool_use("press_key", {"key": "back", **INTENT})]),
            ScriptedTurn(
                [thinking("Again."), tool_use("tap", {"element_id": "e2", **INTENT})], hold=late
            ),
            ScriptedTurn(
                [thinking("Done."), tool_use("complete", {"success": True, "reason": "ok"})]
            ),
        ]
    )
    one, two = await build_server(make_settings()), await build_server(make_settings())
    await one.start()
    await two.start()
    waiting = Store.from_url(one.settings.database_url)
    try:
        async with (
            Leased(one, pki_dir, "h29") as leased,
            channel(two.address, pki_dir, "host-h29") as ch,
        ):
            a = leased.assignment
            stub_two: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)

            def step(key: str, outcome: int = 0) -> planner_service_pb2.DecideRequest:
                request = planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation_from_scene(scenes.settings_main()),
                    step_key=key,
                )
                if outcome:
                    request.previous_outcome.CopyFrom(
                        types_pb2.ActionOutcome(step_index=outcome, executed=True)
                    )
                return request

            await leased.stub.Decide(step("1"))
            async with one.store.write() as session:
                for statement in _HOLD_STEP_2:
                    await session.execute(sql_text(statement))
            async with waiting.engine.connect() as lock:
                await lock.execute(sql_text("SELECT pg_advisory_lock(4242)"))
                first = asyncio.ensure_future(leased.stub.Decide(step("2", outcome=1)))

                async def blocked() -> bool:
                    async with waiting.engine.connect() as conn:
                        found = await conn.execute(
                            sql_text(
                                "SELECT count(*) FROM pg_locks"
                                " WHERE locktype = 'advisory' AND NOT granted"
                            )
                        )
                        return bool(found.scalar())

                await until(blocked, what="replica 1 logging step 2")
                second = asyncio.ensure_future(stub_two.Decide(step("2", outcome=1)))
                await until(lambda: len(model.bodies("/v1/messages")) == 3, what="replica 2 asks")
                await lock.execute(sql_text("SELECT pg_advisory_unlock(4242)"))
                won = await first
            late.set()
            answered = await second
            assert answered.replayed and answered.decision.tool_name == "press_key"
            assert answered.decision.decision_id == won.decision.decision_id
            await stub_two.Decide(step("3", outcome=2))
    finally:
        await waiting.close()
        await one.stop(0.5)
        await two.stop(0.5)
    assert model.rejections == []
    last = model.bodies("/v1/messages")[3]
    told = json.dumps(last)
    assert f"call {won.session_call_id} (press_key) was carried out after all" in told
    assert '\\"page_after\\":' in told.split("carried out after all", 1)[1]  # what it did


def _drop_at(written: str) -> list[str]:
    """The backend writing a conversation item whose JSON holds `written` is terminated, once
    (the sequence is not rolled back): the database connection drops mid-write."""
    return [
        "CREATE SEQUENCE amc_test_drops",
        "CREATE FUNCTION amc_test_drop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        f" IF NEW.body LIKE '%{written}%' AND nextval('amc_test_drops') = 1 THEN"
        " PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN NEW; END $$",
        "CREATE TRIGGER amc_test_drop BEFORE INSERT ON planner_session_items FOR EACH ROW"
        " EXECUTE FUNCTION amc_test_drop()",
    ]


async def _step_1_dropped_at(
    cloud: CloudServer, pki_dir: Path, host_id: str, written: str
) -> tuple[Any, Any, Any, Any]:
    """Decide step 1 with the write of `written` dropped once (UNAVAILABLE), then ask for it
    again, as the host does: (the decision, the task's totals, the stored conversation, the
    attempt's decision log as an operator lists it)."""
    async with Leased(cloud, pki_dir, host_id) as leased:
        a = leased.assignment
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.settings_main()),
            step_key="1",
        )
        async with cloud.store.write() as session:
            for statement in _drop_at(written):
                await session.execute(sql_text(statement))
        code, _ = await _code(leased.stub.Decide(request))
        assert code == grpc.StatusCode.UNAVAILABLE
        again = await leased.stub.Decide(request)
        get = task_service_pb2.GetTaskRequest(task_id=a.task_id)
        totals = (await tasks_stub(leased.ops).GetTask(get)).task.totals
        items = await StoreSessionStore(cloud.store).load(a.task_id, a.attempt)
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(leased.ops)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id, attempt=a.attempt)
        )
    return again, totals, items, listed.decisions


async def _console_decisions(
    cloud: CloudServer, pki_dir: Path, task_id: str
) -> list[dict[str, Any]]:
    """The task's decisions as the operators' console JSON API lists them (a real gateway)."""
    settings = ConsoleSettings(
        cloud_address=cloud.address,
        certs_dir=pki_dir,
        operator_name="ops",
        tls_server_name="localhost",
        admin_username="ops",
        admin_password=SecretStr("correct horse battery staple"),
        api_token=SecretStr(CONSOLE_TOKEN),
        session_secret=SecretStr("kept-answer-session-secret-0123456789"),
    )
    gateway = UvicornThread(create_app(settings))
    base = gateway.start()
    try:
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {CONSOLE_TOKEN}"}, timeout=20
        ) as api:
            listed = await api.get(f"/api/tasks/{task_id}/decisions")
    finally:
        gateway.stop()
    assert listed.status_code == 200, listed.text
    decisions: list[dict[str, Any]] = listed.json()["decisions"]
    return decisions


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_database_drop_at_the_extra_calls_answers_uses_the_kept_call(
    anthropic_session_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """The model answered step 1 with two calls (a paid turn, kept), then the database
    connection dropped while the cloud wrote "not executed" for the second. The host asks
    again: the decision is the kept answer's first call, with no model call (the model is
    asked once), its cost counted once (with the failed Decide), and the extra call answered
    once. Before, the call was answered "not carried out" and the model asked again, a second
    bill for one step (and the second answer was the decision)."""
    model.anthropic_script.extend(
        [
            anthropic_message(
                thinking("Display is what we want."),
                text("Opening Display."),
                tool_use("tap", {"element_id": "e1", **INTENT}),
                tool_use("tap", {"element_id": "e2", **INTENT}),
                input_tokens=1000,
            ),
            anthropic_message(tool_use("press_key", {"key": "back", **INTENT}), input_tokens=2000),
        ]
    )
    again, totals, items, logged = await _step_1_dropped_at(
        anthropic_session_cloud, pki_dir, "h29", "Not executed"
    )
    assert model.rejections == []
    assert len(model.bodies("/v1/messages")) == 1, "the kept answer was asked for again"
    assert again.decision.tool_name == "tap" and again.decision.step_index == 1
    assert again.decision.action.tap.element_id == "e1"
    assert again.decision.rationale == "Opening Display."
    assert again.decision.usage.input_tokens == 0  # billed with the failed Decide
    assert totals.usage.input_tokens == 1000  # once
    assert totals.unsettled.calls == 0
    first, extra = [i for i in items if isinstance(i, ToolCall)]
    assert again.session_call_id == first.call_id
    results = [i for i in items if isinstance(i, ToolResult)]
    assert results == [ToolResult(extra.call_id, EXTRA_CALL, is_error=True)]
    assert isinstance(items[-1], ToolResult)  # nothing asked after it
    # The decision log says its rationale and thinking came from that kept answer: in the
    # Decide answer, in the stored record an operator lists, and in the console's JSON.
    begins = next(n for n, i in enumerate(items) if isinstance(i, AssistantItem))
    # When it was answered: when the cloud's session store kept it.
    async with anthropic_session_cloud.store.read() as session:
        kept_at = await session.scalar(
            select(SessionItemRow.created_at).where(
                SessionItemRow.task_id == logged[0].task_id,
                SessionItemRow.attempt == logged[0].attempt,
                SessionItemRow.seq == begins,
            )
        )
    assert kept_at is not None
    resumed = types_pb2.ResumedTurn(turn_id=first.turn_id, position=begins)
    resumed.answered_at.FromDatetime(kept_at)
    assert again.decision.resumed_from == resumed
    (record,) = logged
    assert record.HasField("resumed_from") and record.resumed_from == resumed
    (shown,) = await _console_decisions(anthropic_session_cloud, pki_dir, record.task_id)
    assert shown["resumed_from"]["turn_id"] == first.turn_id
    assert shown["resumed_from"]["position"] == begins
    assert dt.datetime.fromisoformat(shown["resumed_from"]["answered_at"]) == kept_at
    assert f"answered at {kept_at:%Y-%m-%d %H:%M:%S} UTC" in shown["resumed_from"]["words"]
    # Its prompt is what the model was asked when it gave that answer: the "not executed"
    # answer to the extra call came after it (before, the record had it).
    (asked,) = model.bodies("/v1/messages")
    said = asked["messages"][-1]["content"]
    sent = said if isinstance(said, str) else "\n\n".join(b["text"] for b in said)
    assert record.user_prompt == again.decision.user_prompt == sent
    assert EXTRA_CALL not in record.user_prompt


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_database_drop_at_the_correction_goes_on_with_the_correction(
    anthropic_session_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """The model answered step 1 with a call naming an element not on screen (a paid turn,
    kept), then the database connection dropped while the cloud wrote its correction. The
    host asks again: the conversation goes on from that answer with the correction (what the
    first Decide was about to send), and each call's cost is counted once. Before, the call
    was answered "not carried out" and the observation sent again: the model was asked the
    first question anew, its unusable answer in between."""
    model.anthropic_script.extend(
        [
            anthropic_message(tool_use("tap", {"element_id": "e99", **INTENT}), input_tokens=1000),
            anthropic_message(tool_use("tap", {"element_id": "e1", **INTENT}), input_tokens=2000),
        ]
    )
    again, totals, _, logged = await _step_1_dropped_at(
        anthropic_session_cloud, pki_dir, "h28", "That tool call was rejected"
    )
    assert model.rejections == []
    asked, corrected = model.bodies("/v1/messages")
    assert asked["messages"] == corrected["messages"][: len(asked["messages"])]
    answer, correction = corrected["messages"][len(asked["messages"]) :]
    assert answer["role"] == "assistant" and correction["role"] == "user"
    told = json.dumps(correction["content"])  # a call made without thinking goes as text
    assert "That tool call was rejected" in told and "e99" in told
    assert NOT_CARRIED_OUT not in json.dumps(corrected)
    assert again.decision.action.tap.element_id == "e1"
    assert again.decision.corrective_retries == 1
    assert again.decision.usage.input_tokens == 2000  # the correction's call
    assert totals.usage.input_tokens == 3000  # each call once
    assert totals.unsettled.calls == 0
    # The record says the unusable call (and any thinking with it) came from the kept answer,
    # corrected by this decision's own call.
    (record,) = logged
    assert record.resumed_from == again.decision.resumed_from
    assert record.HasField("resumed_from") and record.resumed_from.position == 1
    # Its prompt is what its own call was sent: the observation, then the correction.
    assert record.user_prompt.startswith(asked["messages"][-1]["content"][0]["text"])
    assert "[tool result, error] That tool call was rejected" in record.user_prompt
