"""Store behaviour on both backends: migrations, the decision log and its retention, lease gate."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from unittest.mock import ANY

import pytest
from sqlalchemy import event, inspect, select, update

from amc.v1 import types_pb2
from cloud import revocations
from cloud.store import convert, decisions, hosts, idlists, lease_events, leases, states, tasks
from cloud.store import revocations as store_revocations
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.models import TaskRow
from cloud.store.ports import StoreDecisionSink, StoreLeaseGate
from planner.decision import Decision, ThinkingBlock, Usage
from planner.steps import PastStep, StepOutcome

TABLES = ("tasks", "attempts", "hosts", "decisions", "planner_session_items", "lease_events")
# (certificate_revocations, from 0007, has its own test below)


def _tables(sync_conn: object) -> set[str]:
    return set(inspect(sync_conn).get_table_names())


def _columns(sync_conn: object, table: str) -> set[str]:
    return {c["name"] for c in inspect(sync_conn).get_columns(table)}


async def test_migrations_up_down_and_check(db_url: str) -> None:
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        await check(s.engine)  # models and migration agree
        async with s.engine.connect() as conn:
            assert set(TABLES) <= await conn.run_sync(_tables)
        # 0004 is additive: going back to 0003 drops only its columns.
        await downgrade(s.engine, "0003")
        async with s.engine.connect() as conn:
            assert "outcome_executed" not in await conn.run_sync(_columns, "decisions")
            assert "max_steps" not in await conn.run_sync(_columns, "attempts")
            assert "planner_mode" in await conn.run_sync(_columns, "decisions")
        await upgrade(s.engine)
        async with s.engine.connect() as conn:
            assert {"page", "target", "outcome_executed", "outcome_error"} <= (
                await conn.run_sync(_columns, "decisions")
            )
        # 0002 is additive: going back to 0001 drops only the session table (and 0007's).
        await downgrade(s.engine, "0001")
        async with s.engine.connect() as conn:
            assert await conn.run_sync(_tables) & set(TABLES) == set(TABLES[:-2])
        await downgrade(s.engine, "base")
        async with s.engine.connect() as conn:
            assert not set(TABLES) & await conn.run_sync(_tables)
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()


async def test_migration_0007_is_additive_and_reversible(db_url: str) -> None:
    """hosts.process_id and certificate_revocations come with 0007 and go with its downgrade;
    other rows are untouched by the round trip (a task is written with today's model, so at the
    head revision, and must survive down to 0006 and back)."""
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        await tasks.submit(
            s, tasks.NewTask(goal="kept", max_attempts=1, lease_seconds=30, timeout_seconds=60)
        )
        async with s.engine.connect() as conn:
            assert "certificate_revocations" in await conn.run_sync(_tables)
            assert "process_id" in await conn.run_sync(_columns, "hosts")
        assert await revocations.revoke(s, serial="abc", reason="test")
        await downgrade(s.engine, "0006")
        async with s.engine.connect() as conn:
            assert "certificate_revocations" not in await conn.run_sync(_tables)
            assert "process_id" not in await conn.run_sync(_columns, "hosts")
        await upgrade(s.engine)
        await check(s.engine)
        listed, _ = await tasks.list_page(s, tasks.TaskFilter((), "", ""), 10, "")
        assert [v.task.goal for v in listed] == ["kept"]
        assert (await store_revocations.load(s)).serials == frozenset()
    finally:
        await s.close()


async def test_migration_0005_thinking_and_retry_columns_up_and_down(db_url: str) -> None:
    """0005 is additive: three decision columns, dropped again by its downgrade without losing
    the rows; a row from before it reads as "not recorded" (empty kinds, not truncated)."""
    new = {"thinking_kind", "retry_kind", "output_truncated"}
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        logged = _decision()
        logged.thinking_kind, logged.retry_kind, logged.output_truncated = "omitted", "nudge", True
        row = await decisions.append(s, "h1", "t-0004", 1, logged)
        (stored,) = (await decisions.list_page(s, "t-0004", 0, 5, ""))[0]
        assert (stored.thinking_kind, stored.retry_kind, stored.output_truncated) == (
            "omitted",
            "nudge",
            True,
        )
        await downgrade(s.engine, "0004")
        async with s.engine.connect() as conn:
            assert not new & await conn.run_sync(_columns, "decisions")
        await upgrade(s.engine)
        async with s.engine.connect() as conn:
            assert new <= await conn.run_sync(_columns, "decisions")
        (old,) = (await decisions.list_page(s, "t-0004", 0, 5, ""))[0]
        assert old.decision_id == row.decision_id
        assert (old.thinking_kind, old.retry_kind, old.output_truncated) == ("", "", False)
        await check(s.engine)
    finally:
        await s.close()


async def test_migration_0006_keeps_the_screen_of_each_decision(db_url: str) -> None:
    """0006 is additive: a nullable column with the decision's observation (OCR left out),
    read back only when asked; its downgrade drops it and keeps the rows."""
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        logged = _decision()
        logged.observation = types_pb2.ScreenObservation(
            elements=[
                types_pb2.UiElement(
                    element_id="e1",
                    bounds=types_pb2.Rect(left=0, top=200, right=1080, bottom=320),
                    text="Display",
                )
            ],
            screen_width=1080,
            screen_height=2400,
            foreground_package="com.android.settings",
            ocr_blocks=[types_pb2.OcrBlock(text="Display", confidence=0.9)],
        )
        row = await decisions.append(s, "h1", "t-0006", 1, logged)
        (stored,) = (await decisions.list_page(s, "t-0006", 0, 5, ""))[0]
        kept = convert.decision(stored, include_observation=True).observation
        assert [e.text for e in kept.elements] == ["Display"]
        assert (kept.screen_width, kept.screen_height) == (1080, 2400)
        assert not kept.ocr_blocks  # the raw OCR is not kept
        assert not convert.decision(stored).HasField("observation")  # only when asked
        plain = await decisions.append(s, "h1", "t-0006", 1, _decision("swipe"))
        assert plain.observation_pb is None
        await downgrade(s.engine, "0005")
        async with s.engine.connect() as conn:
            assert "observation_pb" not in await conn.run_sync(_columns, "decisions")
        await upgrade(s.engine)
        (old, _) = (await decisions.list_page(s, "t-0006", 0, 5, ""))[0]
        assert old.decision_id == row.decision_id
        assert old.observation_pb is None
        await check(s.engine)
    finally:
        await s.close()


async def test_migration_0008_step_keys_late_results_secrets_up_and_down(db_url: str) -> None:
    """0008 is additive: decisions.step_key (unique per attempt, NULLs never collide),
    attempts.late_result, the task_secrets table; its downgrade drops them, keeping the rows."""
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        await decisions.append(s, "h1", "t-0007", 1, _decision(), "1")
        await decisions.append(s, "h1", "t-0007", 1, _decision())
        await decisions.append(s, "h1", "t-0007", 1, _decision())  # two NULL keys: fine
        try:
            await decisions.append(s, "h1", "t-0007", 1, _decision(), "1")
        except decisions.StepKeyTaken:
            pass
        else:
            raise AssertionError("a second decision under one step key was written")
        found = await decisions.by_step_key(s, "t-0007", 1, "1")
        assert found is not None and found.step_index == 1
        await downgrade(s.engine, "0007")
        async with s.engine.connect() as conn:
            assert "step_key" not in await conn.run_sync(_columns, "decisions")
            assert "late_result" not in await conn.run_sync(_columns, "attempts")
            assert "task_secrets" not in await conn.run_sync(_tables)
        await upgrade(s.engine)
        assert len((await decisions.list_page(s, "t-0007", 0, 10, ""))[0]) == 3
        async with s.engine.connect() as conn:
            assert "step_key" in await conn.run_sync(_columns, "decisions")
            assert "late_result" in await conn.run_sync(_columns, "attempts")
            assert "task_secrets" in await conn.run_sync(_tables)
        await check(s.engine)
    finally:
        await s.close()


async def test_migration_0011_lease_history_and_totals_up_and_down(db_url: str) -> None:
    """0011 is additive: the lease_events table, the renewal summary, who cancelled and the
    token totals; its downgrade drops them keeping the rows, and its upgrade fills the totals
    of existing tasks from the decision log."""
    task_columns = {"cancelled_by", "input_tokens", "output_tokens", "decision_count"}
    attempt_columns = {"renewals", "first_renewed_at", "last_renewed_at"}
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        task_id = await _task(s)
        await decisions.append(s, "h1", task_id, 1, _decision())
        await decisions.append(s, "h1", task_id, 1, _decision())
        await downgrade(s.engine, "0010")
        async with s.engine.connect() as conn:
            assert "lease_events" not in await conn.run_sync(_tables)
            assert not task_columns & await conn.run_sync(_columns, "tasks")
            assert not attempt_columns & await conn.run_sync(_columns, "attempts")
        await upgrade(s.engine)
        async with s.engine.connect() as conn:
            assert task_columns <= await conn.run_sync(_columns, "tasks")
            assert attempt_columns <= await conn.run_sync(_columns, "attempts")
        view = await tasks.get(s, task_id)
        assert view is not None
        assert (view.task.input_tokens, view.task.output_tokens) == (20, 10)
        assert view.task.decision_count == 2 and view.task.cancelled_by is None
        await check(s.engine)
    finally:
        await s.close()


def _decision(text: str = "tap", sensitive: bool = False) -> Decision:
    action = types_pb2.Action(purpose="open it", expected_outcome="it opens")
    if sensitive:
        action.input_text.text = "hunter2"
        action.input_text.sensitive = True
        tool, args = "input_text", {"text": "hunter2", "sensitive": True}
    else:
        action.tap.element_id = "e1"
        tool, args = "tap", {"element_id": "e1"}
    return Decision(
        tool_name=tool,
        arguments=args,
        action=action,
        purpose="open it",
        expected_outcome="it opens",
        rationale=f"I will {text}",
        thinking=[ThinkingBlock("hmm"), ThinkingBlock("", redacted=True)],
        usage=Usage(input_tokens=10, output_tokens=5),
        provider="offline",
        model="m",
        latency_s=0.25,
        forced_retry=False,
        system_prompt="sys",
        user_prompt="user",
    )


async def _task(store: Store) -> str:
    view, _ = await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
    )
    return view.task.task_id


async def test_the_host_filter_lists_tasks_queued_for_the_host(store: Store) -> None:
    """ListTasks' host filter (the fleet's "tasks on this host →") took only tasks an attempt
    of which ran on the host, so one queued for it was in no host's list until it started."""

    async def queued_for(host_id: str) -> str:
        spec = tasks.NewTask(
            goal="g",
            max_attempts=3,
            lease_seconds=30,
            timeout_seconds=3600,
            target_host_id=host_id,
        )
        view, _ = await tasks.submit(store, spec)
        return view.task.task_id

    mine = await queued_for("h1")
    await queued_for("h2")
    listed, _ = await tasks.list_page(store, tasks.TaskFilter((), "h1", ""), 10, "")
    assert [v.task.task_id for v in listed] == [mine]


async def test_decision_steps_are_unique_under_concurrency(store: Store) -> None:
    task_id = await _task(store)
    sink = StoreDecisionSink(store)
    results = await asyncio.gather(
        *(sink.append("h1", task_id, 1, _decision(str(i))) for i in range(20))
    )
    assert sorted(r[1] for r in results if r is not None) == list(range(1, 21))
    assert await sink.append("h1", task_id, 2, _decision()) == (ANY, 1)  # per (task, attempt)

    page, token = await decisions.list_page(store, task_id, 0, 15, "")
    assert [(d.attempt, d.step_index) for d in page] == [(1, i) for i in range(1, 16)]
    rest, token2 = await decisions.list_page(store, task_id, 0, 15, token)
    assert [(d.attempt, d.step_index) for d in rest] == [(1, i) for i in range(16, 21)] + [(2, 1)]
    assert token2 == ""
    only2, _ = await decisions.list_page(store, task_id, 2, 100, "")
    assert len(only2) == 1


async def test_sensitive_text_is_masked_in_the_log(store: Store) -> None:
    task_id = await _task(store)
    logged = await StoreDecisionSink(store).append("h1", task_id, 1, _decision(sensitive=True))
    assert logged is not None
    row = await decisions.get(store, logged[0])
    assert row is not None
    assert "hunter2" not in row.arguments_json
    assert b"hunter2" not in (row.action_pb or b"")
    assert row.thinking == [{"text": "hmm", "redacted": False}, {"text": "", "redacted": True}]


async def test_retention_prunes_only_old_ended_tasks(store: Store) -> None:
    old = await _task(store)
    recent = await _task(store)
    running = await _task(store)
    sink = StoreDecisionSink(store)
    for task_id in (old, recent, running):
        for _ in range(3):
            await sink.append("h1", task_id, 1, _decision())
    now = store.now()
    async with store.write() as session:
        await session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == old)
            .values(status=states.SUCCEEDED, finished_at=now - dt.timedelta(days=8))
        )
        await session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == recent)
            .values(status=states.SUCCEEDED, finished_at=now - dt.timedelta(days=1))
        )
    removed = await decisions.prune(store, dt.timedelta(days=7), batch_size=2)
    assert removed == 3
    for task_id, left in ((old, 0), (recent, 3), (running, 3)):
        rows, _ = await decisions.list_page(store, task_id, 0, 100, "")
        assert len(rows) == left


async def test_lease_gate_and_claim(store: Store) -> None:
    task_id = await _task(store)
    claimed = await leases.claim(store, "h1", ["p"], 2)
    assert claimed is not None and claimed.task_id == task_id
    gate = StoreLeaseGate(store)
    assert await gate.is_live("h1", task_id, 1, claimed.lease_id)
    assert not await gate.is_live("h2", task_id, 1, claimed.lease_id)
    assert not await gate.is_live("h1", task_id, 1, "other")
    # The same phone cannot get a second live attempt, and the refused claim leaves nothing
    # behind: the task stays queued, with no attempt and no "assigned" event.
    second = await _task(store)
    assert await leases.claim(store, "h1", ["p"], 2) is None
    async with store.read() as session:
        task = await session.scalar(select(TaskRow).where(TaskRow.task_id == second))
        assert task is not None and (task.status, task.attempt) == (states.QUEUED, 0)
    events, _ = await lease_events.list_page(store, second, 0, 10, "")
    assert "assigned" not in [e.kind for e in events]


async def test_reported_outcomes_are_recorded_once_and_rebuild_the_history(store: Store) -> None:
    """The decision log is the attempt's memory: the steps come back as the planner recorded
    them, with the first outcome reported for each (a retried report changes nothing)."""
    task_id = await _task(store)
    first, second = _decision("tap"), _decision("type", sensitive=True)
    first.page, first.target = "com.android.settings: Settings", "Display"
    for d in (first, second):
        await decisions.append(store, "h1", task_id, 1, d)
    report = types_pb2.ActionOutcome(step_index=1, executed=False, error="no element e1")
    assert await decisions.record_outcome(store, task_id, 1, report)
    again = types_pb2.ActionOutcome(step_index=1, executed=True)
    assert not await decisions.record_outcome(store, task_id, 1, again)
    assert not await decisions.record_outcome(store, task_id, 2 + 1, again)  # other attempt
    assert not await decisions.record_outcome(
        store, task_id, 1, types_pb2.ActionOutcome(step_index=9, executed=True)
    )
    steps = await decisions.attempt_steps(store, task_id, 1)
    assert steps == [
        replace(PastStep.from_decision(first, 1), outcome=StepOutcome(False, "no element e1")),
        PastStep.from_decision(second, 2),
    ]
    assert "hunter2" not in steps[1].arguments_json  # the sensitive text stays masked
    assert await decisions.attempt_steps(store, task_id, 2) == []


async def test_an_id_list_is_one_parameter_on_both_backends(store: Store) -> None:
    """`idlists.among`: the same rows as `IN (…)`, for no id, one, and thousands (one bound
    parameter however many), ids with quotes and non-ASCII text included."""
    ids = [await _task(store) for _ in range(3)]
    odd = ["it's", 'say "hi"', "héllo", "x" * 100]
    many = [f"missing-{i}" for i in range(5000)]
    for wanted in ([], ids[:1], ids, [*ids[1:], *odd, *many]):
        async with store.read() as db:
            found = set(
                await db.scalars(
                    select(TaskRow.task_id).where(idlists.among(store, TaskRow.task_id, wanted))
                )
            )
        assert found == set(wanted) & set(ids)
    statement = select(TaskRow.task_id).where(idlists.among(store, TaskRow.task_id, many))
    assert len(statement.compile().params) == 1


async def test_the_heartbeat_vouches_for_this_replicas_streams_only(store: Store) -> None:
    """The replica's own row vouches for its connected hosts, whatever their own rows say; a
    host of another replica (which never beat) and a disconnected host are not vouched for by
    it. The beat writes no host row (`tests/cloud/test_host_heartbeat.py`)."""
    from cloud.store import hosts
    from cloud.store.models import HostRow

    for h, replica in (("spoke", "r1"), ("silent", "r1"), ("elsewhere", "r2"), ("gone", "r1")):
        await hosts.upsert_hello(store, h, [], "v", 0, replica, f"s-{h}", "p")
    assert await hosts.disconnected(store, "gone", "s-gone")
    old = store.now() - dt.timedelta(hours=1)
    async with store.write() as db:
        await db.execute(update(HostRow).values(stream_alive_at=old))
    await hosts.heartbeat(store, "r1")
    async with store.read() as db:
        alive = set(await db.scalars(select(HostRow.stream_alive_at)))
    assert alive == {old}
    assert await hosts.unvouched(store, 10.0) == {"elsewhere"}
    listed = {row.host_id: connected for row, connected in await hosts.list_hosts(store, 10.0)}
    assert listed == {"spoke": True, "silent": True, "elsewhere": False, "gone": False}


async def test_last_seen_never_steps_back_when_writers_commit_out_of_order(store: Store) -> None:
    """Every writer of `last_seen_at` (hello, devices, outbox, a stream's end, a replica's
    end) takes its time before it waits for the write lock, so a later time can commit first.
    The row keeps the latest time whatever the order: a fleet watcher never shows a time the
    database has already gone back from."""
    from cloud.store import hosts
    from cloud.store.models import HostRow

    async def last_seen() -> dt.datetime | None:
        async with store.read() as db:
            return await db.scalar(select(HostRow.last_seen_at).where(HostRow.host_id == "h1"))

    await hosts.upsert_hello(store, "h1", [], "v", 0, "r1", "s1", "p")
    hello_at = await last_seen()
    assert hello_at is not None
    later = store.now() + dt.timedelta(hours=1)
    async with store.write() as db:  # a writer whose time is later committed first
        await db.execute(update(HostRow).values(last_seen_at=later))
    await hosts.update_devices(store, "h1", [])
    await hosts.update_outbox(store, "h1", hosts.Backlog(1, 0, 0, None))
    await hosts.upsert_hello(store, "h1", [], "v", 0, "r1", "s2", "p")
    assert await last_seen() == later
    assert await hosts.disconnected(store, "h1", "s2")
    assert await last_seen() == later
    await hosts.upsert_hello(store, "h1", [], "v", 0, "r1", "s3", "p")
    assert await hosts.replica_gone(store, "r1") == ["h1"]
    assert await last_seen() == later


async def _hello(
    store: Store, host_id: str, record: hosts.HelloRecord, held: list[leases.HeldLease]
) -> leases.Settled:
    (settled,) = await leases.hellos(store, [leases.HelloIn(host_id, record, held)])
    return settled


async def test_a_hello_settles_its_held_leases_in_one_go(store: Store) -> None:
    """A reconnect's hello records the host, resumes its live lease (with a RESUMED event and
    the attempt's own progress to go on from), refuses one that is not its own and one it
    never had, and says which phones are busy; a new process's hello stops before the held
    leases (its predecessor's are released first) and `resume` settles them after."""
    record = hosts.HelloRecord([], "v", 0, "r1", "s1", "p1")
    mine, theirs = await _task(store), await _task(store)
    held = await leases.claim(store, "h1", ["phone-1"], 30)
    other = await leases.claim(store, "h2", ["phone-9"], 30)
    assert held is not None and other is not None and held.task_id == mine
    await leases.renew_batch(
        store,
        [leases.RenewalIn("h1", mine, 1, held.lease_id, leases.ProgressIn(3, 1, "half way", 10))],
    )
    ask = [
        leases.HeldLease(mine, 1, held.lease_id),
        leases.HeldLease(theirs, 1, other.lease_id),
        leases.HeldLease("no-such-task", 1, "x"),
    ]
    settled = await _hello(store, "h1", record, ask)
    assert settled.previous_process is None
    assert settled.busy == {"phone-1"}
    assert settled.checks is not None
    resumed, not_mine, unknown = settled.checks
    assert resumed.live is not None and resumed.live.lease_id == held.lease_id
    assert resumed.last_progress is not None and resumed.last_progress.summary == "half way"
    assert (not_mine.live, not_mine.revocation) == (None, leases.Revocation.NOT_YOURS)
    assert (unknown.live, unknown.revocation) == (None, leases.Revocation.UNKNOWN)
    events, _ = await lease_events.list_page(store, mine, 0, 10, "")
    assert [e.kind for e in events] == ["assigned", "resumed"]
    events, _ = await lease_events.list_page(store, theirs, 0, 10, "")
    assert "resumed" not in [e.kind for e in events]

    # The same process again: settled as before. A new process: its held leases wait.
    again = await _hello(store, "h1", record, ask[:1])
    assert again.previous_process == "p1" and again.checks is not None
    fresh = await _hello(store, "h1", replace(record, process_id="p2"), ask[:1])
    assert (fresh.previous_process, fresh.checks) == ("p1", None)
    later = await leases.resume(store, "h1", ask[:1])
    assert later.checks is not None and later.checks[0].live is not None


@contextlib.contextmanager
def _statements(store: Store) -> Iterator[list[str]]:
    """The SQL statements the store sends meanwhile (an executemany counts once)."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    engines = [store.engine.sync_engine, store.loop_connection]
    for engine in engines:
        if engine is not None:
            event.listen(engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        for engine in engines:
            if engine is not None:
                event.remove(engine, "before_cursor_execute", seen)


async def test_a_batch_of_hellos_costs_the_statements_of_one(store: Store) -> None:
    """A restart's storm settled in batches: every host's held lease resumed (one RESUMED event
    each) with its own busy phone, in as many statements for ten hosts as for two; a host
    twice in one batch sees its own first hello, and as a new process waits for its release."""
    claimed: dict[str, leases.Claimed] = {}
    for n in range(12):
        await _task(store)
        c = await leases.claim(store, f"h{n}", [f"phone-{n}"], 30)
        assert c is not None
        claimed[f"h{n}"] = c
    record = {h: hosts.HelloRecord([], "v", 0, "r1", f"s-{h}", "p1") for h in claimed}
    held = {h: [leases.HeldLease(c.task_id, c.attempt, c.lease_id)] for h, c in claimed.items()}
    await leases.hellos(store, [leases.HelloIn(h, record[h], []) for h in claimed])

    def batch(names: list[str]) -> list[leases.HelloIn]:
        return [leases.HelloIn(h, record[h], held[h]) for h in names]

    with _statements(store) as two:
        await leases.hellos(store, batch(["h0", "h1"]))
    with _statements(store) as ten:
        settled = await leases.hellos(store, batch([f"h{n}" for n in range(2, 12)]))
    assert len(ten) == len(two), (two, ten)
    for n, one in enumerate(settled, start=2):
        assert one.previous_process == "p1" and one.busy == {f"phone-{n}"}
        assert one.checks is not None and [c.live is not None for c in one.checks] == [True]
        events, _ = await lease_events.list_page(store, claimed[f"h{n}"].task_id, 0, 10, "")
        assert [e.kind for e in events] == ["assigned", "resumed"]

    twice = await leases.hellos(
        store,
        [
            leases.HelloIn("h0", replace(record["h0"], stream_id="s-again"), held["h0"]),
            leases.HelloIn("h0", replace(record["h0"], process_id="p2"), held["h0"]),
        ],
    )
    assert twice[0].previous_process == "p1" and twice[0].checks is not None
    assert (twice[1].previous_process, twice[1].checks) == ("p1", None)


@pytest.mark.parametrize("module", ["decisions", "lease_events", "screenshots"])
async def test_a_page_token_holding_a_huge_number_is_not_from_this_server(
    store: Store, module: str
) -> None:
    """A token decoding to a number past 64 bits made SQLite's driver raise OverflowError while
    binding it (INTERNAL for the caller); it is a token this server never made (ValueError:
    INVALID_ARGUMENT "page_token: …")."""
    import base64
    import importlib
    import json

    store_module = importlib.import_module(f"cloud.store.{module}")
    payload = {
        "decisions": [2**70, 1],
        "lease_events": None,
        "screenshots": [2**70, 1, "before"],
    }[module]
    raw = b"e" + str(2**70).encode() if payload is None else json.dumps(payload).encode()
    token = base64.urlsafe_b64encode(raw).decode()
    with pytest.raises(ValueError, match="not a page token from this server"):
        await store_module.list_page(store, "t", 0, 10, token)
