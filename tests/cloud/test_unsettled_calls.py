"""Model calls written down before they start (decision 0080, migration 0025), on both backends.

The planner's real Anthropic SDK against the fake Messages server, its calls' markers in a real
store: a marker stays exactly as long as nothing records what the provider reported of its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text, update

from amc.v1 import decision_log_service_pb2, decision_log_service_pb2_grpc
from cloud.server import CloudServer
from cloud.store import decisions, spend, states, unsettled
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.models import TaskRow, UnsettledCallRow
from planner import unsettled as planner_unsettled
from planner.decision import Billed, Decision, Usage
from planner.errors import PlannerError, PlannerUnavailable
from planner.planner import Planner
from planner.settings import MAX_CALL_TOKENS, PlannerSettings
from planner.vendors import make_adapter
from tests.cloud.cloud_harness import channel, table_names
from tests.cloud.test_spend import _submit
from tests.cloud.test_store import _columns
from tests.planner.scenes import settings_main
from tests.support.fakes import (
    ANTHROPIC_KEY,
    FakeModelServer,
    anthropic_error,
    anthropic_message,
    tool_use,
)

MODEL = "claude-sonnet-4-6"
TAP = {"element_id": "e17", "purpose": "open display", "expected_outcome": "Display opens"}
OFF_SCREEN = {"x": 5000, "y": 10, "purpose": "open display", "expected_outcome": "Display"}


def _planner(base_url: str) -> Planner:
    settings = PlannerSettings(
        provider="anthropic",
        anthropic_api_key=ANTHROPIC_KEY,
        anthropic_base_url=base_url,
        model=MODEL,
        max_retries=0,
    )
    return Planner(make_adapter(settings), settings)


async def _decide(store: Store, base_url: str, task_id: str) -> Decision:
    """One decision with the calls' markers in `store`, as a Decide makes it, by the model at
    `base_url`."""
    planner = _planner(base_url)

    async def decide() -> Decision:
        ledger = unsettled.StoreCallLedger(store, "h1", task_id, 1)
        planner_unsettled.ledger.set(ledger)
        return await planner.decide("Turn on dark theme", settings_main())

    try:
        return await asyncio.create_task(decide())  # its own context, as a Decide's handler
    finally:
        await planner.aclose()


async def test_each_call_is_unsettled_until_its_decision_is_logged(store: Store) -> None:
    task_id = await _submit(store)
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as server:
        server.script_anthropic(  # a corrective turn: two calls
            anthropic_message(tool_use("tap", OFF_SCREEN), input_tokens=500, output_tokens=100),
            anthropic_message(tool_use("tap", TAP), input_tokens=700, output_tokens=50),
        )
        decision = await _decide(store, server.anthropic_base_url, task_id)
    assert len(decision.usage.calls) == 2
    calls, at_most = await unsettled.of_task(store, task_id)
    assert calls == 2  # a process killed now would leave these
    assert at_most.input_tokens >= 1200
    # Each asked for 2,048 at most, raised for thinking to MAX_CALL_TOKENS at the most: not
    # Sonnet 4.6's own 128K limit, which no request of the planner's comes near.
    assert at_most.output_tokens == 2 * MAX_CALL_TOKENS
    assert at_most.cost_usd >= decision.usage.cost_usd > 0
    await decisions.append(store, "h1", task_id, 1, decision)
    assert (await unsettled.of_task(store, task_id))[0] == 0


async def test_a_failed_decisions_calls_settle_when_counted_and_unbilled_ones_at_once(
    store: Store,
) -> None:
    task_id = await _submit(store)
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as server:
        server.script_anthropic(
            anthropic_message(tool_use("tap", OFF_SCREEN), input_tokens=500, output_tokens=100),
            anthropic_error(500, "api_error", "Internal server error"),  # not billed
        )
        with pytest.raises(PlannerError) as caught:
            await _decide(store, server.anthropic_base_url, task_id)
    billed = caught.value.billed
    assert billed is not None and len(billed.usage.calls) == 1
    assert (await unsettled.of_task(store, task_id))[0] == 1  # the answered call's
    await spend.count_failed(store, "h1", task_id, 1, billed, "PlannerUnavailable")
    assert (await unsettled.of_task(store, task_id))[0] == 0


async def test_a_call_whose_marker_cannot_be_written_is_not_made(db_url: str) -> None:
    s = Store.from_url(db_url)
    await upgrade(s.engine)
    task_id = await _submit(s)
    async with s.write() as session:  # the write refused, as by a database gone read-only
        await session.execute(text("DROP TABLE unsettled_calls"))
    try:
        with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as server:
            server.script_anthropic(anthropic_message(tool_use("tap", TAP)))
            with pytest.raises(PlannerUnavailable, match="its record could not be written"):
                await _decide(s, server.anthropic_base_url, task_id)
            assert server.bodies("/v1/messages") == []
    finally:
        await s.close()


async def test_migration_0025_adds_the_unsettled_calls_and_back(db_url: str) -> None:
    """Both backends: 0025 adds the table `unsettled_calls` and nothing else; its downgrade
    drops it; the schema matches the models again after the upgrade."""
    s = Store.from_url(db_url)

    try:
        await upgrade(s.engine)
        task_id = await _submit(s)  # at the head: the task's row as the models write it
        await downgrade(s.engine, "0024")
        before = await table_names(s)
        await upgrade(s.engine, "0025")
        assert await table_names(s) - before == {"unsettled_calls"}
        ledger = unsettled.StoreCallLedger(s, "h1", task_id, 1)
        await ledger.opened("anthropic", MODEL, Usage(input_tokens=10, cost_usd=0.5))
        assert (await unsettled.of_task(s, task_id))[0] == 1
        await spend.count_failed(s, "h1", task_id, 1, Billed("p", "m", Usage(5)), "PlannerError")
        await downgrade(s.engine, "0024")
        assert await table_names(s) == before
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()


async def test_a_call_whose_connection_dropped_unanswered_keeps_its_marker(store: Store) -> None:
    """A connection lost after the request went out may have been billed (the provider got
    it; its answer was lost): it was settled at once as "nothing billed", so a process that
    lost the answer reported its call as fully accounted for. An API's error answer (a 500
    above) still settles at once. The provider here is a socket that reads the request and
    hangs up: the real SDK's own connection error."""

    answered: list[asyncio.StreamWriter] = []

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered.append(writer)
        await reader.read(65536)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    task_id = await _submit(store)
    try:
        with pytest.raises(PlannerUnavailable):
            await _decide(store, f"http://127.0.0.1:{port}", task_id)
    finally:
        server.close()
        for writer in answered:  # a connection still being read (the server's close leaves it)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await server.wait_closed()
    assert (await unsettled.of_task(store, task_id))[0] == 1


async def test_the_retention_pass_prunes_the_markers_of_tasks_ended_before_it(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """A marker that outlives its call is settled by no record, ever: the cloud's
    `unsettled_calls` rows were never pruned. The retention pass that prunes the decision log
    now deletes those of tasks that ended before the retention (7 days here), on both backends;
    a task that ended since, or one still active however old its marker, keeps its own.
    What it deleted is counted on the task's row (migration 0030) and said by ListDecisions'
    `pruned.unsettled`: deleted without a count, a call of unknown cost left no trace."""
    store = cloud.store
    old, recent, active = [await _submit(store) for _ in range(3)]
    month_ago = store.now() - dt.timedelta(days=30)
    for n, task_id in enumerate((old, old, recent, active)):
        bound = Usage(input_tokens=10 + n, output_tokens=100, cost_usd=0.25)
        assert await unsettled.shipped(
            store, "h1", f"call-{n}", task_id, 1, "anthropic", MODEL, month_ago, bound
        )
    async with store.write() as session:
        for task_id, ended in ((old, month_ago), (recent, store.now() - dt.timedelta(days=1))):
            await session.execute(
                update(TaskRow)
                .where(TaskRow.task_id == task_id)
                .values(status=states.FAILED, finished_at=ended)
            )

    await cloud.prune_decisions()

    assert (await unsettled.of_task(store, old))[0] == 0
    assert (await unsettled.of_task(store, recent))[0] == 1
    assert (await unsettled.of_task(store, active))[0] == 1
    async with store.read() as session:  # the host call ids taken (0031) go with them
        taken = (await session.execute(text("SELECT task_id FROM host_calls"))).scalars().all()
    assert sorted(taken) == sorted([recent, active])
    found = await decisions.pruned(store, old)
    assert found is not None and found.unsettled_calls == 2
    at_most = found.unsettled_at_most
    assert (at_most.input_tokens, at_most.output_tokens) == (21, 200)
    assert at_most.cost_usd == pytest.approx(0.5)
    assert await decisions.pruned(store, recent) is None

    await cloud.prune_decisions()  # a second pass finds nothing more: counted once
    again = await decisions.pruned(store, old)
    assert again is not None and again.unsettled_calls == 2

    ops = channel(cloud.address, pki_dir, "operator-ops")
    try:
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        listed = await log.ListDecisions(decision_log_service_pb2.ListDecisionsRequest(task_id=old))
    finally:
        await ops.close()
    assert listed.pruned.unsettled.calls == 2
    assert listed.pruned.unsettled.at_most.input_tokens == 21
    assert listed.pruned.unsettled.at_most.cost_usd == pytest.approx(0.5)


async def test_migration_0030_adds_the_tasks_pruned_unsettled_count_and_back(
    db_url: str,
) -> None:
    """Both backends: 0030 adds the four columns of the markers retention deleted (an existing
    task has none: 0), and its downgrade drops them without losing the task."""
    s = Store.from_url(db_url)

    async def tasks_columns() -> set[str]:
        async with s.engine.connect() as conn:
            return await conn.run_sync(_columns, "tasks")

    try:
        await upgrade(s.engine)
        task_id = await _submit(s)  # at the head: the task's row as the models write it
        await downgrade(s.engine, "0029")
        before = await tasks_columns()
        await upgrade(s.engine, "0030")
        assert await tasks_columns() - before == {
            "pruned_unsettled_calls",
            "pruned_unsettled_input_tokens",
            "pruned_unsettled_output_tokens",
            "pruned_unsettled_cost_usd",
        }
        async with s.engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT pruned_unsettled_calls, pruned_unsettled_cost_usd FROM tasks "
                        "WHERE task_id = :t"
                    ),
                    {"t": task_id},
                )
            ).one()
        assert tuple(row) == (0, 0)
        await downgrade(s.engine, "0029")
        assert await tasks_columns() == before
        async with s.engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM tasks"))).scalar_one() == 1
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()


async def test_migration_0031_adds_the_host_calls_and_back(db_url: str) -> None:
    """Both backends: 0031 adds the table `host_calls` and nothing else (a host's call shipped
    before it is still recorded once: its marker's key); its downgrade drops it; the schema
    matches the models again after the upgrade."""
    s = Store.from_url(db_url)
    bound = Usage(input_tokens=10, cost_usd=0.5)

    def ship(call: str) -> Any:
        return unsettled.shipped(s, "h1", call, task_id, 1, "anthropic", MODEL, None, bound)

    try:
        await upgrade(s.engine)
        task_id = await _submit(s)  # at the head: the task's row as the models write it
        await downgrade(s.engine, "0030")
        before = await table_names(s)
        async with s.write() as session:  # a call shipped before 0031: a marker alone
            session.add(
                UnsettledCallRow(
                    call_id=unsettled.host_call_key("h1", "c0"),
                    host_id="h1",
                    task_id=task_id,
                    attempt=1,
                    provider="anthropic",
                    model=MODEL,
                    started_at=s.now(),
                    at_most_input_tokens=10,
                    at_most_output_tokens=0,
                    at_most_cost_usd=0.5,
                )
            )
        await upgrade(s.engine, "0031")
        assert await table_names(s) - before == {"host_calls"}
        assert not await ship("c0")  # its resend
        assert await ship("c1")
        assert not await ship("c1")
        assert (await unsettled.of_task(s, task_id))[0] == 2
        await downgrade(s.engine, "0030")
        assert await table_names(s) == before
        assert (await unsettled.of_task(s, task_id))[0] == 2
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()
