"""A claim takes the oldest task its host may run, reading only the queues it may take from.

A claim walked every queued task in age order, skipping those targeted at other hosts or at
phones that were not idle: with 10,000 tasks queued for one host, every other host's claim read
all of them (0.2 → 2.9 ms on SQLite, 1.1 → 4.1 ms on PostgreSQL). It now reads the heads of
four queues in `ix_tasks_queue` (migration 0015): any phone, this host, this host's idle
phones, an idle phone's serial on any host. These tests pin the order a host gets tasks in
(both backends), that a backlog queued for another host is never read (the plans, on a real
SQLite file and a real PostgreSQL server, before and after ANALYZE), that concurrent claims
on PostgreSQL take different tasks and none comes back empty while one is free, and that the
migration goes up and down on both backends. A dispatch pass's question of where work waits
(which hosts have tasks queued for them, how many tasks any host may take) reads one index
entry per target host, not the backlog.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
from sqlalchemy import Select, event, insert, text

from cloud.store import leases, states, tasks
from cloud.store.database import Store
from cloud.store.engine import downgrade, upgrade
from cloud.store.leases.claim import _PG_DEPTH, _WAITING, _candidate
from cloud.store.models import TaskRow
from tests.support.postgres import PostgresServer

BACKLOG = 2_000


async def _submit(store: Store, host: str = "", serial: str = "", goal: str = "g") -> str:
    view, _ = await tasks.submit(
        store,
        tasks.NewTask(
            goal=goal,
            max_attempts=3,
            lease_seconds=30,
            timeout_seconds=3600,
            target_host_id=host or None,
            target_device_serial=serial or None,
        ),
    )
    return view.task.task_id


async def _backlog(store: Store, host: str | None, n: int = BACKLOG) -> None:
    """`n` tasks queued for `host` (None: any host), in one statement: the rows `tasks.submit`
    would write."""
    now = store.now()
    rows = [
        {
            "task_id": uuid.uuid4().hex, "goal": "backlog", "status": states.QUEUED,
            "attempt": 0, "max_attempts": 3, "target_host_id": host,
            "target_device_serial": None, "lease_seconds": 30.0,
            "deadline": now + dt.timedelta(hours=1), "cancel_requested": False,
            "no_replay": False, "created_at": now - dt.timedelta(minutes=5), "updated_at": now,
            "max_tokens": 0, "max_cost_usd": 0.0,
        }
        for _ in range(n)
    ]  # fmt: skip
    async with store.write() as session:
        await session.execute(insert(TaskRow), rows)


async def _taken(store: Store, host: str, idle: list[str]) -> tuple[str, str] | None:
    got = await leases.claim(store, host, idle, 2)
    return None if got is None else (got.task_id, got.device_serial)


async def test_a_host_gets_the_oldest_task_it_may_run_from_every_queue(store: Store) -> None:
    """Both backends: oldest first across the queues; a task for another host, or for a phone
    that is busy, waits; a task for a serial goes to any host with that phone idle."""
    other = await _submit(store, host="other")
    busy_serial = await _submit(store, serial="busy")
    mine_on_busy = await _submit(store, host="me", serial="busy")
    anyone = await _submit(store)
    mine = await _submit(store, host="me")
    serial_p1 = await _submit(store, serial="p1")
    mine_on_p2 = await _submit(store, host="me", serial="p2")

    # Each phone named idle is idle: a phone with a live attempt cannot take another.
    assert await _taken(store, "me", ["p1"]) == (anyone, "p1")
    assert await _taken(store, "me", ["p3"]) == (mine, "p3")
    assert await _taken(store, "me", ["p4"]) is None  # the rest need other phones or hosts
    assert await _taken(store, "me", ["p2", "busy"]) == (busy_serial, "busy")
    assert await _taken(store, "me", ["p2"]) == (mine_on_p2, "p2")
    assert await _taken(store, "you", ["p1"]) == (serial_p1, "p1")
    assert await _taken(store, "you", ["busy"]) is None  # mine_on_busy waits for "me"
    assert await _taken(store, "other", ["x"]) == (other, "x")
    assert mine_on_busy not in {other, busy_serial, anyone, mine, serial_p1, mine_on_p2}


async def test_cancelled_and_overdue_tasks_are_not_claimed(store: Store) -> None:
    """Both backends: a queued task whose cancel was requested, or whose deadline passed before
    the sweeper ended it, is passed over in each queue."""
    for host in ("", "me"):
        gone = await _submit(store, host=host)
        async with store.write() as session:
            await session.execute(
                text("UPDATE tasks SET cancel_requested = :yes WHERE task_id = :t"),
                {"yes": True, "t": gone},
            )
        late = await _submit(store, host=host)
        async with store.write() as session:
            await session.execute(
                text("UPDATE tasks SET deadline = :d WHERE task_id = :t"),
                {"d": store.now() - dt.timedelta(seconds=1), "t": late},
            )
    assert await _taken(store, "me", ["p"]) is None


def _sqlite_plans(db: Path, statements: list[tuple[str, Any]]) -> list[str]:
    """How SQLite runs each statement as it was sent (bound parameters, not literals: SQLite
    plans a statement when it is prepared, before it sees the values)."""
    out = []
    with sqlite3.connect(db) as conn:
        for statement, parameters in statements:
            plan = conn.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
            out += [row[3] for row in plan]
    return out


async def test_sqlite_a_claim_never_reads_the_queue_of_another_host(tmp_path: Path) -> None:
    """SQLite plans without statistics: every statement a claim sends finds tasks through
    `ix_tasks_queue` or a task's key, never by walking the queue in age order."""
    db = tmp_path / "cloud.sqlite3"
    store = Store.from_url(f"sqlite+aiosqlite:///{db}")
    try:
        await upgrade(store.engine)
        await _backlog(store, "other")
        mine = await _submit(store, host="me")
        assert store.loop_connection is not None
        sent: list[tuple[str, Any]] = []

        def seen(_c: Any, _cur: Any, statement: str, parameters: Any, _x: Any, _m: bool) -> None:
            sent.append((statement, parameters))

        event.listen(store.loop_connection, "before_cursor_execute", seen)
        assert await _taken(store, "me", ["p1", "p2"]) == (mine, "p1")
        assert await _taken(store, "me", ["p2"]) is None
    finally:
        await store.close()
    reads = [(s, p) for s, p in sent if s.lstrip().startswith(("SELECT", "WITH"))]
    assert len(reads) >= 2  # both claims' candidate lookups
    plans = _sqlite_plans(db, reads)
    assert any("USING INDEX ix_tasks_queue" in step for step in plans), plans
    walks = [
        step
        for step in plans
        if re.match(r"SCAN tasks\b", step) or "ix_tasks_status_created_at" in step
    ]
    assert not walks, walks


def _postgres_sql(
    store: Store, statement: Select[*tuple[Any, ...]], values: dict[str, Any]
) -> tuple[str, list[Any]]:
    """A statement as PostgreSQL gets it, with $n parameters, and their values."""
    compiled = statement.compile(dialect=store.engine.dialect)
    state = compiled.construct_expanded_state(values)
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    sql = re.sub(r"%\((\w+)\)s", number, state.statement)
    return sql, [state.parameters[n] for n in names]


def _candidate_sql(store: Store, host: str, idle: list[str]) -> tuple[str, list[Any]]:
    """The claim's candidate statement as PostgreSQL gets it."""
    values: dict[str, Any] = {"now": store.now(), "host": host, "depth": _PG_DEPTH}
    values.update((f"idle_{n}", serial) for n, serial in enumerate(idle))
    return _postgres_sql(store, _candidate(len(idle)), values)


def _postgres_plans(store: Store, sql: str, args: list[Any]) -> list[str]:
    """How PostgreSQL runs `sql` (EXPLAIN ANALYZE, rolled back) in the generic plan a
    connection makes before the tables were analysed, and after."""
    dsn = str(store.engine.url.set(drivername="postgresql").render_as_string(False))
    plans = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for analysed in (False, True):
            if analysed:
                conn.execute("ANALYZE tasks")
            conn.execute(psycopg.sql.SQL(f"PREPARE q AS {sql}"))
            query = psycopg.sql.SQL("EXPLAIN (ANALYZE) EXECUTE q ({})").format(
                psycopg.sql.SQL(", ").join(map(psycopg.sql.Literal, args))
            )
            conn.execute("BEGIN")
            plans.append("\n".join(str(r[0]) for r in conn.execute(query).fetchall()))
            conn.execute("ROLLBACK")
            conn.execute("DEALLOCATE q")
    return plans


def _rows_read(plan: str) -> int:
    """The most rows any node of an EXPLAIN ANALYZE plan produced or filtered out."""
    counts = [int(n) for n in re.findall(r"actual time=\S+ rows=(\d+)", plan)]
    counts += [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
    return max(counts, default=0)


async def test_postgres_a_claim_never_reads_the_queue_of_another_host(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL, in the generic plan a connection makes before the tables were analysed and
    after: the candidate statement reads the heads of its queues (a handful of rows), not the
    2,000 tasks queued for another host."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        await _backlog(store, "other")
        await _submit(store, host="me")
        plans = _postgres_plans(store, *_candidate_sql(store, "me", ["p1", "p2"]))
    finally:
        await store.close()
    for plan in plans:
        assert "ix_tasks_queue" in plan, plan
        assert "ix_tasks_status_created_at" not in plan, plan
        assert "Seq Scan on tasks" not in plan, plan
        assert _rows_read(plan) < 100, plan


async def test_postgres_concurrent_claims_take_different_tasks_and_none_comes_back_empty(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL: 30 hosts claim at once from a queue of 30 (a connection each, the pool's
    most): each gets its own task. A claim locks only the task it takes, and sees past the
    heads other claims hold (SKIP LOCKED over `_PG_DEPTH` heads per queue)."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        queued = {await _submit(store, goal=f"t{n}") for n in range(30)}
        got = await asyncio.gather(*(_taken(store, f"h{n}", ["p"]) for n in range(30)))
    finally:
        await store.close()
    assert None not in got
    assert {task for task, _ in (g for g in got if g is not None)} == queued


async def test_migration_0015_adds_the_queue_index_and_back(db_url: str) -> None:
    """Both backends: 0015 adds `ix_tasks_queue`, its downgrade drops it, nothing else moves.
    (Read from each catalogue: SQLite's reflection leaves expression indexes out.)"""
    store = Store.from_url(db_url)
    catalogue = (
        "SELECT indexname FROM pg_indexes WHERE tablename = 'tasks'"
        if store.is_postgres
        else "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'"
    )

    async def names() -> set[str]:
        async with store.engine.connect() as conn:
            return {str(name) for (name,) in await conn.execute(text(catalogue))}

    try:
        await upgrade(store.engine, "0014")
        before = await names()
        await upgrade(store.engine, "0015")  # later files add indexes of their own (0029)
        after = await names()
        assert after - before == {"ix_tasks_queue"} and before <= after
        await downgrade(store.engine, "0014")
        assert await names() == before
    finally:
        await store.close()


async def test_where_work_waits(store: Store) -> None:
    """Both backends: each host with tasks queued for it once, tasks for any host counted up to
    the cap; a task taken is no longer waiting."""
    assert await leases.waiting(store, cap=10) == leases.Waiting(0, frozenset())
    for host in ("b", "a", "b", "c-1"):
        await _submit(store, host=host)
    await _submit(store, host="a", serial="p1")
    for _ in range(3):
        await _submit(store)
    await _submit(store, serial="p9")  # any host's phone p9: a task for any host
    assert await leases.waiting(store, cap=10) == leases.Waiting(4, frozenset({"a", "b", "c-1"}))
    assert (await leases.waiting(store, cap=2)).any_host == 2
    assert await _taken(store, "c-1", ["p"]) is not None  # its own task, the oldest it may take
    assert await leases.waiting(store, cap=10) == leases.Waiting(4, frozenset({"a", "b"}))
    assert await _taken(store, "c-1", ["q"]) is not None  # then one for any host
    assert await leases.waiting(store, cap=10) == leases.Waiting(3, frozenset({"a", "b"}))


def _waiting_values(cap: int) -> dict[str, Any]:
    return {"cap": cap, **dict(_WAITING.compile().params)}


async def test_sqlite_where_work_waits_never_reads_the_backlog(tmp_path: Path) -> None:
    """SQLite: the dispatch pass's question finds each target host by one lookup in
    `ix_tasks_queue` (a loose index scan), not by reading the 2,000 tasks of one of them."""
    db = tmp_path / "cloud.sqlite3"
    store = Store.from_url(f"sqlite+aiosqlite:///{db}")
    try:
        await upgrade(store.engine)
        await _backlog(store, "other")
        await _submit(store, host="me")
        await _submit(store)
        assert await leases.waiting(store, cap=5) == leases.Waiting(1, frozenset({"me", "other"}))
        compiled = _WAITING.compile(dialect=store.engine.dialect)
        values = compiled.construct_params({"cap": 5})
        statement = str(compiled)
        args = [values[name] for name in compiled.positiontup or []]
    finally:
        await store.close()
    plans = _sqlite_plans(db, [(statement, args)])
    assert any("USING INDEX ix_tasks_queue" in step for step in plans), plans
    assert not [s for s in plans if re.match(r"SCAN tasks\b", s) or "status_created" in s], plans


async def test_postgres_where_work_waits_never_reads_the_backlog(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL, before ANALYZE and after: the question reads a handful of index entries, not
    the 2,000 tasks queued for one host."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        await _backlog(store, "other")
        await _submit(store, host="me")
        await _submit(store)
        assert await leases.waiting(store, cap=5) == leases.Waiting(1, frozenset({"me", "other"}))
        plans = _postgres_plans(store, *_postgres_sql(store, _WAITING, _waiting_values(5)))
    finally:
        await store.close()
    for plan in plans:
        assert "ix_tasks_queue" in plan, plan
        assert "Seq Scan on tasks" not in plan, plan
        assert _rows_read(plan) < 100, plan


async def test_postgres_a_claim_looks_past_the_heads_others_hold(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL: with 300 of the oldest tasks locked by other transactions (claims in flight
    on several replicas, and heads taken since the claim's snapshot: more than 64, the old
    depth, were in a 1,000-host burst), a claim still takes the free task behind them rather
    than coming back empty while work is queued."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        await _backlog(store, None, 300)
        free = await _submit(store, goal="free")
        dsn = str(store.engine.url.set(drivername="postgresql").render_as_string(False))
        with psycopg.connect(dsn) as other:  # a transaction holding the oldest heads
            locked = other.execute(
                "SELECT task_id FROM tasks WHERE task_id <> %s FOR UPDATE", (free,)
            ).fetchall()
            assert len(locked) == 300 < _PG_DEPTH
            assert await _taken(store, "me", ["p"]) == (free, "p")
            other.rollback()
        assert await _taken(store, "me", ["q"]) is not None
    finally:
        await store.close()


async def test_a_retry_goes_to_another_idle_phone_of_the_host_but_never_waits_for_one(
    store: Store,
) -> None:
    """A task whose attempt ended retryable on phone p1 (a phone that did not answer) gets
    its next attempt on another idle phone of the host, p2, though p1 comes first in order;
    when p1 is the host's only idle phone, p1 takes it rather than the task waiting."""
    task_id = await _submit(store)
    first = await leases.claim(store, "h1", ["p1", "p2"], 0)
    assert first is not None and first.device_serial == "p1"
    failed = "phone p1 did not answer a look at its screen"
    out = await leases.record_result(
        store, "h1", task_id, 1, first.lease_id, states.FAILED, failed, None, retryable=True
    )
    assert out.task_status == states.QUEUED
    second = await leases.claim(store, "h1", ["p1", "p2"], 0)
    assert second is not None and (second.attempt, second.device_serial) == (2, "p2")
    out = await leases.record_result(
        store, "h1", task_id, 2, second.lease_id, states.FAILED, "p2 too", None, retryable=True
    )
    assert out.task_status == states.QUEUED
    third = await leases.claim(store, "h1", ["p2"], 0)  # p2 was the last phone: the only one
    assert third is not None and (third.attempt, third.device_serial) == (3, "p2")


async def test_a_host_filling_its_phones_one_by_one_sends_few_claim_statements(
    store: Store,
) -> None:
    """Both backends: tasks submitted one after another to a host of 40 idle phones go one to
    each phone, a task for its third phone (of three idle) to that phone, and the claims send
    17 statement texts, not 40: each text is compiled the first time an engine runs it, on the
    event loop, and a new one per idle count made each of those submits wait for a compile
    (`claim._shape`)."""
    candidates: set[str] = set()

    def seen(_c: Any, _cur: Any, statement: str, _p: Any, _x: Any, _m: bool) -> None:
        if "its_phone_0" in statement:
            candidates.add(statement)

    engines = [store.engine.sync_engine, store.loop_connection]
    for engine in engines:
        if engine is not None:
            event.listen(engine, "before_cursor_execute", seen)
    try:
        serials = [f"p{i}" for i in range(40)]
        for n in range(len(serials)):
            task_id = await _submit(store)
            assert await _taken(store, "me", serials[n:]) == (task_id, serials[n])
        targeted = await _submit(store, serial="q3")
        assert await _taken(store, "me", ["q1", "q2", "q3"]) == (targeted, "q3")
    finally:
        for engine in engines:
            if engine is not None:
                event.remove(engine, "before_cursor_execute", seen)
    assert len(candidates) == 17  # for 1-8, 10, 12, 14, 16, 20, 24, 28, 32 and 40 phones
