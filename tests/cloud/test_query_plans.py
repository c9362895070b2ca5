"""The hot statements on live leases look up what they name, never walk the fleet (SQLite).

SQLite plans without statistics, so a plan is a property of the statement and the schema: it
took `ended_at IS NULL` to the live-expiry index and read every live attempt for a renewal batch
of ten (fixed by migration 0013 and the batch read's join order). These tests run the renewal
batch (its read, its write and the check after it) and the dispatcher's busy-phone lookup on a
real SQLite file with real leases, capture every statement the store sent, and ask SQLite how it
runs each one (EXPLAIN QUERY PLAN). PostgreSQL plans from its statistics (analysed tables), so
the same check there would test the row counts of the test, not the statement.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
import pytest
from sqlalchemy import event, inspect, select, text

from cloud.store import decisions, flows, hosts, leases, screenshots, states, tasks
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.leases import renew
from cloud.store.models import DecisionRow, FlowRow, StepScreenshotRow, TaskRow
from cloud.store.paging import page_token, past
from tests.cloud.sqlite_trace import trace
from tests.support.postgres import PostgresServer

HOSTS = 6


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    return tmp_path / "cloud.sqlite3"


def _capture(store: Store) -> Callable[[], list[tuple[str, Any]]]:
    """What the store's engines send from now on: each statement with its first parameter set
    (the loop-thread engines' as SQLite ran them, parameters inlined)."""
    sent: list[tuple[str, Any]] = []
    ran: list[str] = []

    def seen(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool
    ) -> None:
        sent.append((statement, parameters[0] if many and parameters else parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    assert store.loop_connection is not None
    trace(store.loop_connection, ran)
    return lambda: [*sent, *((statement, ()) for statement in ran)]


def _walks_live_attempts(db: Path, statement: str, parameters: Any) -> list[str]:
    """The steps of the statement's plan that read attempts without naming them."""
    with sqlite3.connect(db) as conn:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)]
    return [
        step
        for step in plan
        if step.startswith("SCAN attempts") or "ix_attempts_live_expiry" in step
    ]


async def _leases(store: Store, n: int = HOSTS) -> list[leases.Claimed]:
    """`n` tasks submitted, each claimed by its own host (h0, h1, ...): ASSIGNED."""
    out = []
    for i in range(n):
        await tasks.submit(
            store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
        )
        claimed = await leases.claim(store, f"h{i}", ["p"], 2)
        assert claimed is not None
        out.append(claimed)
    return out


async def test_renewal_batches_and_busy_phones_look_up_their_own_rows(sqlite_file: Path) -> None:
    store = Store.from_url(f"sqlite+aiosqlite:///{sqlite_file}")
    try:
        await upgrade(store.engine)
        claimed = await _leases(store)
        captured = _capture(store)
        items = [
            leases.RenewalIn(f"h{i}", c.task_id, c.attempt, c.lease_id, None)
            for i, c in enumerate(claimed)
        ]
        # Half a lease kept: the first renewal of each writes (RUNNING), the second is answered
        # from the read; a stale lease id is refused (and classified) after the write.
        stale = leases.RenewalIn("h0", claimed[0].task_id, claimed[0].attempt, "stale", None)
        first = await leases.renew_batch(store, [*items[1:], stale], 0.5)
        assert [o.written for o in first] == [True] * (HOSTS - 1) + [False]
        assert first[-1].revocation is not None
        assert all(o.expires_at is not None for o in await leases.renew_batch(store, items, 0.5))
        busy = await leases.live_serials_by_host(store, [f"h{i}" for i in range(HOSTS)])
        assert busy == {f"h{i}": {"p"} for i in range(HOSTS)}
    finally:
        await store.close()
    on_attempts = [(s, p) for s, p in captured() if "attempts" in s and not s.startswith("INSERT")]
    assert len(on_attempts) >= 4  # the read, the writes, the check after them, busy phones
    walks = {s: w for s, p in on_attempts if (w := _walks_live_attempts(sqlite_file, s, p))}
    assert not walks, walks


async def test_migration_0013_makes_the_live_expiry_index_partial_and_back(db_url: str) -> None:
    """Both backends: 0013 replaces the index, its downgrade restores the old one."""
    store = Store.from_url(db_url)

    def live_expiry(sync_conn: Any) -> list[str]:
        (index,) = [
            i for i in inspect(sync_conn).get_indexes("attempts")
            if i["name"] == "ix_attempts_live_expiry"
        ]  # fmt: skip
        return list(index["column_names"])

    try:
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(live_expiry) == ["lease_expires_at"]
        await downgrade(store.engine, "0012")
        async with store.engine.connect() as conn:
            assert await conn.run_sync(live_expiry) == ["ended_at", "lease_expires_at"]
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(live_expiry) == ["lease_expires_at"]
    finally:
        await store.close()


async def test_migration_0014_leaves_room_for_hot_updates_and_back(db_url: str) -> None:
    """PostgreSQL: 0014 sets `fillfactor = 80` on attempts and tasks, its downgrade resets it.
    SQLite has no such setting: both directions run and change nothing."""
    store = Store.from_url(db_url)

    async def options() -> dict[str, list[str] | None]:
        async with store.engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT relname, reloptions FROM pg_class "
                    "WHERE relname IN ('attempts', 'tasks') AND relkind = 'r'"
                )
            )
            return {name: opts for name, opts in rows}

    try:
        await upgrade(store.engine)
        if store.is_postgres:
            assert await options() == {n: ["fillfactor=80"] for n in ("attempts", "tasks")}
        await downgrade(store.engine, "0013")
        if store.is_postgres:
            assert await options() == {"attempts": None, "tasks": None}
        await upgrade(store.engine)
        if store.is_postgres:
            assert await options() == {n: ["fillfactor=80"] for n in ("attempts", "tasks")}
    finally:
        await store.close()


async def test_postgres_renewal_statements_find_each_lease_by_its_key_on_unanalysed_tables(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL: the renewal batch's write and its read find each lease through the attempt's
    (task_id, attempt) key, and neither goes through a partial index of live attempts, even in
    the generic plan a connection makes before the tables were ever analysed (a new
    deployment's first minute, a fleet that grew since the last ANALYZE). The read scanned
    every attempt for each batch that way (1.2-2.6 ms per batch of ten at 2,000 leases against
    0.17 ms after an ANALYZE; docs/benchmarks.md, eighteenth pass).
    The live-expiry index (built on the empty table, so believed empty) was chosen for the
    write's lookup instead, and every live lease was read for each renewal of the batch:
    400-570 us per written renewal at 2,000 leases against 65-105 (docs/benchmarks.md, ninth
    pass). The statements test "not ended" and "not expired" in forms no partial index or
    range scan can take."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        claimed = await _leases(store, 300)
        rows = [
            {
                "task_id": c.task_id, "attempt": c.attempt, "lease_id": c.lease_id,
                "host_id": f"h{n}", "has_progress": False, "step_index": None,
                "step_status": None, "summary": None, "max_steps": None, "counts": 1,
            }
            for n, c in enumerate(claimed[:50])
        ]  # fmt: skip
        write = renew._RENEW_BATCH_PG
        for n, name in enumerate(("items", "now", "keep", "running", "assigned"), 1):
            write = write.replace(f"%({name})s", f"${n}")
        read = renew._LIVE_PG_TEXT.replace("%s", "$1")
        dsn = str(store.engine.url.set(drivername="postgresql").render_as_string(False))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute(f"PREPARE w(text, text, float8, text, text) AS {write}")
            conn.execute(f"PREPARE r(text) AS {read}")
            args = (json.dumps(rows), store.now().isoformat(), 0.85, "RUNNING", "ASSIGNED")
            conn.execute("BEGIN")
            plans = {
                "write": _plan(conn, "w", args),
                "read": _plan(conn, "r", (",".join(c.task_id for c in claimed[:50]),)),
            }
            conn.execute("ROLLBACK")
    finally:
        await store.close()
    # Both look each lease up by its key. The read never scans the table (a scan per batch grows
    # with the fleet); the write's UPDATE may scan this small one by primary key (at 2,000
    # leases its generic plan takes the primary key's index).
    assert "Seq Scan on attempts" not in plans["read"], plans["read"]
    for name, plan in plans.items():
        assert "Index Scan using uq_attempts_task_id on attempts " in plan, (name, plan)
        assert "ix_attempts_live_expiry" not in plan, (name, plan)
        assert "uq_attempts_live_device" not in plan, (name, plan)


def _plan(conn: psycopg.Connection[Any], name: str, args: tuple[object, ...]) -> str:
    """EXPLAIN ANALYZE of prepared statement `name` run with `args` (literals)."""
    query = psycopg.sql.SQL("EXPLAIN (ANALYZE) EXECUTE {} ({})").format(
        psycopg.sql.Identifier(name), psycopg.sql.SQL(", ").join(map(psycopg.sql.Literal, args))
    )
    return "\n".join(str(row[0]) for row in conn.execute(query).fetchall())


async def _flow_listings(store: Store) -> list[tuple[str, Any]]:
    """The statements of ListFlows' listings (unfiltered, by one status, a page further)."""
    sent: list[tuple[str, Any]] = []

    def seen(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if "FROM flows" in statement:
            sent.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        await flows.list_page(store, (), 50, "")
        await flows.list_page(store, (flows.ACTIVE,), 50, "")
        token = page_token(flows.listing((flows.ACTIVE,)), store.now().isoformat(), "f" * 32)
        await flows.list_page(store, (flows.ACTIVE,), 50, token)
        several = (flows.DISABLED, flows.RETIRED)
        await flows.list_page(store, several, 50, "")
        token = page_token(flows.listing(several), store.now().isoformat(), "f" * 32)
        await flows.list_page(store, several, 50, token)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
    assert len(sent) == 5, sent
    return sent


async def test_flow_listings_read_in_the_order_of_an_index(sqlite_file: Path) -> None:
    """SQLite: ListFlows' pages (unfiltered, by a status, a later page) read flows through an
    index in their order (created_at, flow_id), not every flow of the listing sorted to give
    fifty (migration 0026); a page of several statuses merges a page of each (before, it read
    every flow of those statuses and sorted them: "USE TEMP B-TREE FOR ORDER BY")."""
    store = Store.from_url(f"sqlite+aiosqlite:///{sqlite_file}")
    try:
        await upgrade(store.engine)
        sent = await _flow_listings(store)
    finally:
        await store.close()
    with sqlite3.connect(sqlite_file) as conn:
        plans = [
            [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)]
            for statement, parameters in sent
        ]
    # One status or none: the page is a range of an index, in order.
    for plan in plans[:3]:
        assert not [s for s in plan if "TEMP B-TREE" in s or s == "SCAN flows"], plans
    # Several: a range of the status index per status, each cut at a page and merged; a
    # page of each is sorted again (SQLite does not know a subquery's order), never more.
    for plan in plans[3:]:
        assert plan[0] == "MERGE (UNION ALL)", plans
        searched = [s for s in plan if s.startswith(("SEARCH flows", "SCAN flows"))]
        assert len(searched) == 2, plans
        assert all("USING INDEX ix_flows_status_created_at (status=?" in s for s in searched)


async def _plans_without_sorting(store: Store, sent: list[tuple[str, Any]]) -> list[str]:
    """The text EXPLAIN of each statement with sorts and sequential scans priced out: a plan
    that still sorts has no index to read the rows in their order from."""
    plans = []
    async with store.engine.connect() as conn:
        await conn.exec_driver_sql("SET enable_sort = off")
        await conn.exec_driver_sql("SET enable_seqscan = off")
        for statement, parameters in sent:
            rows = await conn.exec_driver_sql(f"EXPLAIN {statement}", parameters)
            plans.append("\n".join(str(r[0]) for r in rows))
    return plans


async def _plan_lines(store: Store, sent: list[tuple[str, Any]]) -> list[list[str]]:
    """Each statement's plan as its lines, on either backend (PostgreSQL's EXPLAIN with sorts and
    sequential scans priced out, as `_plans_without_sorting`; SQLite's EXPLAIN QUERY PLAN)."""
    plans = []
    explain = "EXPLAIN" if store.is_postgres else "EXPLAIN QUERY PLAN"
    async with store.engine.connect() as conn:
        if store.is_postgres:
            await conn.exec_driver_sql("SET enable_sort = off")
            await conn.exec_driver_sql("SET enable_seqscan = off")
        for statement, parameters in sent:
            rows = await conn.exec_driver_sql(f"{explain} {statement}", parameters)
            plans.append([str(r[-1]) for r in rows])
    return plans


def _sort_nodes(plan: str) -> list[str]:
    """The Sort (or Incremental Sort) nodes of a text EXPLAIN (a Merge Append's "Sort Key" is
    no sort: it merges inputs already in order)."""
    return [
        line for line in plan.splitlines() if re.match(r"\s*(->\s+)?(Incremental )?Sort\s+\(", line)
    ]


async def test_postgres_flow_listings_need_no_sort(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL: ListFlows' pages can be read in their order from an index: with sorting
    priced out, no plan of theirs sorts (before migration 0026 each had to)."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        sent = await _flow_listings(store)
        plans = await _plans_without_sorting(store, sent)
    finally:
        await store.close()
    for plan in plans:
        assert not _sort_nodes(plan), plans


async def test_postgres_flow_listings_of_several_statuses_read_about_a_page(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL, 10,000 flows (98 in 100 active), analysed: a ListFlows page of the rarer
    statuses (disabled and retired, 200 flows), the first and one deep in the walk, reads
    about a page of flows. Before, the first read every flow of those statuses and sorted
    them (a Bitmap Heap Scan of 200 rows under a Sort, for 51), and a later page's position,
    an OR of two comparisons, was a filter: a walk of the listing read again what it had
    listed. Counts rows, not time: what each scan returned and what its filter threw away."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    several = (flows.DISABLED, flows.RETIRED)
    try:
        await upgrade(store.engine)
        async with store.engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO flows (flow_id, fingerprint, goal_template, flow_pb, embedding_text,"
                " status, source_task_id, source_attempt, divergences_by_step, created_at,"
                " updated_at) SELECT md5(g::text), md5('f' || g), 'goal', '\\x00', 'e',"
                " CASE mod(g, 100) WHEN 0 THEN 'disabled' WHEN 1 THEN 'retired' ELSE 'active'"
                " END, 't', 1, '{}', now() - g * interval '1 minute', now()"
                " FROM generate_series(1, 10000) g"
            )
            await conn.exec_driver_sql("ANALYZE flows")
        sent: list[tuple[str, Any]] = []

        def seen(_c: Any, _cur: Any, st: str, params: Any, _ctx: Any, _many: bool) -> None:
            if "FROM flows" in st:
                sent.append((st, params))

        event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
        try:
            rows, token = await flows.list_page(store, several, 20, "")
            for _ in range(5):  # page 6 of 10
                rows, token = await flows.list_page(store, several, 20, token)
        finally:
            event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
        assert {r.status for r in rows} == set(several) and token
        read = []
        async with store.engine.connect() as conn:
            for statement, parameters in (sent[0], sent[-1]):
                plan = await conn.exec_driver_sql(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
                )
                read.append(_rows_scanned(plan.scalar_one()[0]["Plan"]))
    finally:
        await store.close()
    assert max(read) <= len(several) * 21, read  # each status's page and one more, at most


async def test_flow_listings_of_several_statuses_walk_in_order_once_each(db_url: str) -> None:
    """Both backends: paging a listing of several statuses (each a page of its own, merged)
    lists every flow of them once, newest first, ties on the time made in flow id order (down),
    as the listing by one status does."""
    store = Store.from_url(db_url)
    made = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    statuses = (flows.ACTIVE, flows.DISABLED, flows.RETIRED)
    try:
        await upgrade(store.engine)
        async with store.write() as session:
            for i in range(30):
                session.add(
                    FlowRow(
                        flow_id=f"f{i:02d}", fingerprint=f"p{i}", goal_template="g",
                        flow_pb=b"", embedding_text="e", status=statuses[i % 3],
                        source_task_id="t", source_attempt=1, divergences_by_step={},
                        created_at=made + dt.timedelta(minutes=i // 4),  # ties, across statuses
                        updated_at=made,
                    )
                )  # fmt: skip
        for several in ((flows.ACTIVE, flows.RETIRED), statuses):
            listed: list[str] = []
            rows, token = await flows.list_page(store, several, 4, "")
            listed += [r.flow_id for r in rows]
            while token:
                rows, token = await flows.list_page(store, several, 4, token)
                listed += [r.flow_id for r in rows]
            want = [f"f{i:02d}" for i in range(30) if statuses[i % 3] in several]
            assert listed == sorted(want, key=lambda f: (int(f[1:]) // 4, f), reverse=True)
    finally:
        await store.close()


async def _task_listings(store: Store) -> list[tuple[str, Any]]:
    """The statements of ListTasks' pages by one status and by several (with and without a
    host), the first and a later one."""
    sent: list[tuple[str, Any]] = []

    def seen(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if "FROM tasks" in statement and " LIMIT " in statement:
            sent.append((statement, parameters))

    filters = [
        tasks.TaskFilter(statuses=(states.FAILED,)),
        tasks.TaskFilter(statuses=(states.FAILED, states.CANCELLED)),
        tasks.TaskFilter(statuses=states.ACTIVE, host_id="h1"),
    ]
    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        for flt in filters:
            await tasks.list_page(store, flt, 50, "")
            token = page_token(flt.listing(), store.now().isoformat(), "f" * 32)
            await tasks.list_page(store, flt, 50, token)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
    assert len(sent) == 2 * len(filters), sent
    return sent


async def test_task_listings_by_status_read_in_the_order_of_an_index(db_url: str) -> None:
    """Both backends: ListTasks' pages by status read a range of
    `ix_tasks_status_created_at_task_id` per status in their order; several statuses are a
    page of each, merged. Before (migration 0029 and the merge), several statuses were one
    walk of `ix_tasks_created_at_task_id` testing each task's status or all their tasks
    sorted (PostgreSQL, sorting priced out: a Sort), and one status's page was sorted again
    on the task id (an Incremental Sort; SQLite "USE TEMP B-TREE FOR RIGHT PART OF ORDER
    BY")."""
    store = Store.from_url(db_url)
    try:
        await upgrade(store.engine)
        plans = await _plan_lines(store, await _task_listings(store))
    finally:
        await store.close()
    arms = [1, 1, 2, 2, 3, 3]  # statuses of each page
    for plan, statuses in zip(plans, arms, strict=True):
        if store.is_postgres:
            assert not _sort_nodes("\n".join(plan)), plans
            scans = [s for s in plan if re.search(r"Index Scan( Backward)? using ix_tasks_", s)]
            assert len(scans) == statuses, plans
            assert all(" ix_tasks_status_created_at_task_id " in s for s in scans), plans
        else:
            assert not [s for s in plan if "TEMP B-TREE" in s and "RIGHT PART" in s], plans
            searched = [s for s in plan if s.startswith(("SEARCH tasks", "SCAN tasks"))]
            assert len(searched) == statuses, plans
            assert all(
                "USING INDEX ix_tasks_status_created_at_task_id (status=?" in s for s in searched
            ), plans
            if statuses > 1:
                assert plan[0] == "MERGE (UNION ALL)", plans


async def test_postgres_task_listings_of_several_statuses_read_about_a_page(
    postgres_server: PostgresServer,
) -> None:
    """PostgreSQL, 10,000 tasks (one in 100 failed, one in 100 cancelled), analysed: a
    ListTasks page of those two statuses, the first and one deep in the walk, reads about a
    page of tasks. Before, the first walked `ix_tasks_created_at_task_id` testing every
    task's status (1,001 rows for a page of 20), and the deep one read every task of those
    statuses left (101) and sorted them. Counts rows, not time (EXPLAIN ANALYZE)."""
    store = Store.from_url(postgres_server.create_database())
    flt = tasks.TaskFilter(statuses=(states.FAILED, states.CANCELLED))
    try:
        await upgrade(store.engine)
        async with store.engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO tasks (task_id, goal, status, attempt, max_attempts, lease_seconds,"
                " deadline, cancel_requested, no_replay, created_at, updated_at)"
                " SELECT md5(g::text), 'g', CASE mod(g, 100) WHEN 0 THEN 'FAILED'"
                " WHEN 1 THEN 'CANCELLED' ELSE 'SUCCEEDED' END, 1, 1, 60, now(), false, false,"
                " now() - g * interval '1 minute', now() FROM generate_series(1, 10000) g"
            )
            await conn.exec_driver_sql("ANALYZE tasks")
        sent: list[tuple[str, Any]] = []

        def seen(_c: Any, _cur: Any, st: str, params: Any, _ctx: Any, _many: bool) -> None:
            if "FROM tasks" in st and " LIMIT " in st:
                sent.append((st, params))

        event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
        try:
            views, token = await tasks.list_page(store, flt, 20, "")
            for _ in range(5):  # page 6 of 10
                views, token = await tasks.list_page(store, flt, 20, token)
        finally:
            event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
        assert {v.task.status for v in views} == set(flt.statuses) and token
        read = []
        async with store.engine.connect() as conn:
            for statement, parameters in (sent[0], sent[-1]):
                plan = await conn.exec_driver_sql(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
                )
                read.append(_rows_scanned(plan.scalar_one()[0]["Plan"]))
    finally:
        await store.close()
    assert max(read) <= len(flt.statuses) * 21, read  # each status's page and one more


async def test_task_listings_of_several_statuses_walk_in_order_once_each(db_url: str) -> None:
    """Both backends: paging ListTasks by several statuses (a page of each, merged) lists
    every task of them once, newest first, ties on the time made in task id order (down),
    with or without other filters; a token made as before the merge (same listing, same
    position) continues where it says."""
    store = Store.from_url(db_url)
    made = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    statuses = (states.QUEUED, states.RUNNING, states.FAILED, states.CANCELLED)
    try:
        await upgrade(store.engine)
        async with store.write() as session:
            for i in range(40):
                session.add(
                    TaskRow(
                        task_id=f"t{i:02d}", goal="g", status=statuses[i % 4], max_attempts=1,
                        lease_seconds=30.0, deadline=made, host_id=f"h{i % 3}",
                        created_at=made + dt.timedelta(minutes=i // 5),  # ties, across statuses
                        updated_at=made,
                    )
                )  # fmt: skip
        chosen = tuple(f"t{i:02d}" for i in range(0, 40, 2))
        for flt in (
            tasks.TaskFilter(statuses=(states.RUNNING, states.CANCELLED)),
            tasks.TaskFilter(statuses=statuses),
            tasks.TaskFilter(statuses=(states.QUEUED, states.RUNNING, states.FAILED), host_id="h1"),
            tasks.TaskFilter(statuses=(states.QUEUED, states.FAILED), task_ids=chosen),
        ):
            listed: list[str] = []
            views, token = await tasks.list_page(store, flt, 3, "")
            listed += [v.task.task_id for v in views]
            while token:
                views, token = await tasks.list_page(store, flt, 3, token)
                listed += [v.task.task_id for v in views]
            want = [
                f"t{i:02d}" for i in range(40)
                if statuses[i % 4] in flt.statuses
                and flt.host_id in ("", f"h{i % 3}")
                and (flt.task_ids is None or f"t{i:02d}" in flt.task_ids)
            ]  # fmt: skip
            assert listed == sorted(want, key=lambda t: (int(t[1:]) // 5, t), reverse=True), flt
            assert len(listed) == len(set(listed)), flt
        # The position as tokens held it before: (created_at, task_id) of the last task sent.
        flt = tasks.TaskFilter(statuses=statuses)
        token = page_token(flt.listing(), (made + dt.timedelta(minutes=5)).isoformat(), "t27")
        views, _ = await tasks.list_page(store, flt, 3, token)
        assert [v.task.task_id for v in views] == ["t26", "t25", "t24"]
    finally:
        await store.close()


def _rows_scanned(node: dict[str, Any]) -> int:
    """Rows the scans of an EXPLAIN (ANALYZE, FORMAT JSON) plan read: returned or filtered."""
    own = 0
    if "Scan" in node["Node Type"]:
        own = node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0)
    return own + sum(_rows_scanned(n) for n in node.get("Plans", []))


async def test_migration_0026_adds_the_flow_listing_indexes_and_back(db_url: str) -> None:
    """Both backends: 0026 adds ListFlows' two indexes, its downgrade drops them."""
    store = Store.from_url(db_url)
    added = {
        "ix_flows_created_at_flow_id": ["created_at", "flow_id"],
        "ix_flows_status_created_at": ["status", "created_at", "flow_id"],
    }

    def indexes(sync_conn: Any) -> dict[str, list[str]]:
        found = inspect(sync_conn).get_indexes("flows")
        return {str(i["name"]): list(i["column_names"]) for i in found if i["name"] in added}

    try:
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(indexes) == added
        await downgrade(store.engine, "0025")
        async with store.engine.connect() as conn:
            assert await conn.run_sync(indexes) == {}
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(indexes) == added
    finally:
        await store.close()


async def test_migration_0028_adds_the_screenshot_listing_index_and_back(db_url: str) -> None:
    """Both backends: 0028 adds `ix_step_screenshots_listing` (phase descending), its
    downgrade drops it; `alembic check` passes after each upgrade (the models declare it)."""
    store = Store.from_url(db_url)

    async def definition() -> str | None:
        async with store.engine.connect() as conn:
            catalogue = (
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_step_screenshots_listing'"
                if store.is_postgres
                else "SELECT sql FROM sqlite_master WHERE name = 'ix_step_screenshots_listing'"
            )
            first = (await conn.exec_driver_sql(catalogue)).first()
            return None if first is None else str(first[0])

    try:
        await upgrade(store.engine)
        made = await definition()
        assert made is not None and "(task_id, attempt, step_index, phase DESC)" in made, made
        await check(store.engine)
        await downgrade(store.engine, "0027")
        assert await definition() is None
        await upgrade(store.engine)
        assert await definition() == made
        await check(store.engine)
    finally:
        await store.close()


@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
async def test_migration_0029_adds_the_tasks_status_listing_index_and_back(db_url: str) -> None:
    """Both backends: 0029 adds `ix_tasks_status_created_at_task_id`, its downgrade drops it
    (and leaves `ix_tasks_status_created_at`); `alembic check` passes after each upgrade."""
    store = Store.from_url(db_url)
    named = ("ix_tasks_status_created_at_task_id", "ix_tasks_status_created_at")

    def indexes(sync_conn: Any) -> dict[str, list[str]]:
        found = inspect(sync_conn).get_indexes("tasks")
        return {str(i["name"]): list(i["column_names"]) for i in found if i["name"] in named}

    added = {
        "ix_tasks_status_created_at_task_id": ["status", "created_at", "task_id"],
        "ix_tasks_status_created_at": ["status", "created_at"],
    }
    try:
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(indexes) == added
        await check(store.engine)
        await downgrade(store.engine, "0028")
        async with store.engine.connect() as conn:
            assert await conn.run_sync(indexes) == {named[1]: added[named[1]]}
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(indexes) == added
        await check(store.engine)
    finally:
        await store.close()


async def _host_listings(store: Store) -> list[tuple[str, Any]]:
    """The statements of ListHosts' pages (the first, one deep in the walk, and such a page of
    the connected hosts and of the disconnected ones)."""
    sent: list[tuple[str, Any]] = []

    def seen(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if "FROM hosts" in statement:
            sent.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        await hosts.hosts_page(store, 5, hosts.HostFilter(), 50)
        await hosts.hosts_page(store, 5, hosts.HostFilter(), 50, "host-0500")
        for connection in (hosts.CONNECTED, hosts.DISCONNECTED):
            await hosts.hosts_page(store, 5, hosts.HostFilter(connection), 50, "host-0500")
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
    assert len(sent) == 4, sent
    return sent


async def test_postgres_host_listings_need_no_sort(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL: ListHosts' pages, ordered `host_id COLLATE "C"`, can be read in their order
    from an index: with sorting priced out, no plan of theirs sorts. The primary key's index
    follows the database's collation, which the planner does not take for "C" (the test
    cluster's C.UTF-8 no more than en_US.UTF-8), so before migration 0027 every page read
    the fleet and sorted it (10.7 ms against 0.05 at 10,000 hosts)."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        sent = await _host_listings(store)
        plans = await _plans_without_sorting(store, sent)
    finally:
        await store.close()
    for plan in plans:
        assert "Sort" not in plan, plans
        assert "ix_hosts_host_id_c" in plan, plans


async def test_host_listings_read_in_the_order_of_an_index(sqlite_file: Path) -> None:
    """SQLite: ListHosts' pages walk the primary key's index (BINARY: code point order), no
    temporary B-tree to sort them."""
    store = Store.from_url(f"sqlite+aiosqlite:///{sqlite_file}")
    try:
        await upgrade(store.engine)
        sent = await _host_listings(store)
    finally:
        await store.close()
    with sqlite3.connect(sqlite_file) as conn:
        plans = [
            [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)]
            for statement, parameters in sent
        ]
    for plan in plans:
        assert not [s for s in plan if "TEMP B-TREE" in s], plans


async def test_migration_0027_adds_the_hosts_c_order_index_on_postgres_and_back(
    db_url: str,
) -> None:
    """PostgreSQL: 0027 adds `ix_hosts_host_id_c` (host_id COLLATE "C"), its downgrade drops
    it. SQLite: both directions run and change nothing; `alembic check` passes on both."""
    store = Store.from_url(db_url)

    async def definition() -> str | None:
        async with store.engine.connect() as conn:
            if not store.is_postgres:
                found = await conn.exec_driver_sql(
                    "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'hosts'"
                )
                assert [r[0] for r in found if r[0]] == []
                return None
            row = await conn.exec_driver_sql(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_hosts_host_id_c'"
            )
            first = row.first()
            return None if first is None else str(first[0])

    try:
        await upgrade(store.engine)
        made = await definition()
        if store.is_postgres:
            assert made is not None and 'host_id COLLATE "C"' in made, made
        await check(store.engine)
        await downgrade(store.engine, "0026")
        assert await definition() is None
        await upgrade(store.engine)
        assert await definition() == made
        await check(store.engine)
    finally:
        await store.close()


async def _later_pages(store: Store, tasks_at: int, decisions_at: int) -> list[tuple[str, Any]]:
    """The statements of a later page of ListTasks (unfiltered), ListDecisions and
    ListStepScreenshots of task "t0", their tokens those of the rows `tasks_at` and
    `decisions_at` (screenshots too) down each listing."""
    async with store.read() as session:
        task = await session.scalar(
            select(TaskRow)
            .order_by(TaskRow.created_at.desc(), TaskRow.task_id.desc())
            .offset(tasks_at)
            .limit(1)
        )
        decision = await session.scalar(
            select(DecisionRow)
            .where(DecisionRow.task_id == "t0")
            .order_by(DecisionRow.attempt, DecisionRow.step_index)
            .offset(decisions_at)
            .limit(1)
        )
        shot = await session.scalar(
            select(StepScreenshotRow)
            .where(StepScreenshotRow.task_id == "t0")
            .order_by(
                StepScreenshotRow.attempt,
                StepScreenshotRow.step_index,
                StepScreenshotRow.phase.desc(),
            )
            .offset(decisions_at)
            .limit(1)
        )
    assert task is not None and decision is not None and shot is not None
    shot_token = page_token("screenshots/t0", shot.attempt, shot.step_index, shot.phase)
    sent: list[tuple[str, Any]] = []

    def seen(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _m: bool) -> None:
        if "ORDER BY" in statement and " LIMIT " in statement:
            sent.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        flt = tasks.TaskFilter()
        listed = [
            len((await tasks.list_page(store, flt, 50, tasks.encode_cursor(flt, task)))[0]),
            len((await decisions.list_page(store, "t0", 0, 50, decisions.cursor(decision)))[0]),
            len((await screenshots.list_page(store, "t0", 0, 50, shot_token))[0]),
        ]
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
    assert [s for s, _ in sent if "FROM tasks" in s], sent
    assert listed == [50, 50, 50] or not any(listed), listed
    return [
        next((s, p) for s, p in sent if f"FROM {table} " in s)
        for table in ("tasks", "decisions", "step_screenshots")
    ]


async def _many(store: Store, tasks_n: int, decisions_n: int) -> None:
    """PostgreSQL: `tasks_n` tasks a minute apart; `decisions_n` decisions of task "t0" (ten
    attempts) and as many screenshots (two a step), each a copy of one row the ORM wrote."""
    made = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    async with store.write() as session:
        session.add(
            TaskRow(
                task_id="t0", goal="g", status="succeeded", max_attempts=10, lease_seconds=60,
                deadline=made, created_at=made, updated_at=made,
            )
        )  # fmt: skip
        session.add(
            DecisionRow(
                decision_id="d0", host_id="h", task_id="t0", attempt=0, step_index=0,
                provider="p", model="m", system_prompt="s", user_prompt="u", tool_name="tap",
                arguments_json="{}", created_at=made,
            )
        )  # fmt: skip
        session.add(
            StepScreenshotRow(
                task_id="t0", attempt=0, step_index=0, phase="before", decision_id="d0",
                host_id="h", object_key="k", content_type="image/png", size_bytes=1, width=1,
                height=1, uploaded_at=made,
            )
        )  # fmt: skip
    per_attempt = decisions_n // 10
    copies = {
        "tasks": (
            TaskRow,
            tasks_n - 1,
            {"task_id": "md5(g::text)", "created_at": "created_at - g * interval '1 minute'"},
        ),
        "decisions": (
            DecisionRow,
            decisions_n,
            {
                "decision_id": "md5(g::text)",
                "attempt": f"1 + (g - 1) / {per_attempt}",
                "step_index": f"1 + mod(g - 1, {per_attempt})",
            },
        ),
        "step_screenshots": (
            StepScreenshotRow,
            decisions_n,
            {
                "attempt": f"1 + (g - 1) / {per_attempt}",
                "step_index": f"1 + mod(g - 1, {per_attempt}) / 2",
                "phase": "CASE mod(g, 2) WHEN 1 THEN 'before' ELSE 'after' END",
            },
        ),
    }
    async with store.engine.begin() as conn:
        for table, (model, n, computed) in copies.items():
            names = [c.name for c in model.__table__.columns]
            values = ", ".join(computed.get(name, name) for name in names)
            await conn.exec_driver_sql(
                f"INSERT INTO {table} ({', '.join(names)}) SELECT {values}"
                f" FROM {table}, generate_series(1, {n}) g"
            )
        for table in copies:
            await conn.exec_driver_sql(f"ANALYZE {table}")


async def test_postgres_later_pages_of_tasks_and_decisions_read_about_a_page(
    postgres_server: PostgresServer, migrated_postgres: str
) -> None:
    """PostgreSQL, 100,000 tasks and 10,000 decisions and screenshots of one task, analysed:
    a late page of ListTasks, ListDecisions and ListStepScreenshots reads about a page. Their
    position was an OR of comparisons, a filter: page k read the k pages before it again
    (ListTasks at row 99,000: 99,052 rows; ListDecisions at 9,500: 9,552). Counts rows, not
    time: what each scan returned and what its filter threw away (EXPLAIN ANALYZE)."""
    store = Store.from_url(postgres_server.create_database(template=migrated_postgres))
    try:
        await upgrade(store.engine)
        await _many(store, 100_000, 10_000)
        sent = await _later_pages(store, 99_000, 9_500)
        read = []
        async with store.engine.connect() as conn:
            for statement, parameters in sent:
                plan = await conn.exec_driver_sql(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
                )
                read.append(_rows_scanned(plan.scalar_one()[0]["Plan"]))
    finally:
        await store.close()
    # A page and the one more that says another follows; a screenshots page also reads the
    # token's step again (here both its phases) and leaves it out. Before migration 0028 and
    # the position without OR, the screenshots page read the task's 500 remaining ones (a
    # BitmapOr of two ranges) and sorted them.
    assert read == [51, 51, 53], read


async def test_later_pages_of_tasks_decisions_and_screenshots_start_in_an_index(
    sqlite_file: Path,
) -> None:
    """SQLite: a later page of ListTasks, ListDecisions and ListStepScreenshots starts in its
    index at the token's row (the row value is in the SEARCH's constraint); before, the
    position was no part of it, and the page read every row ahead of it again."""
    store = Store.from_url(f"sqlite+aiosqlite:///{sqlite_file}")
    try:
        await upgrade(store.engine)
        made = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
        async with store.write() as session:
            session.add(
                TaskRow(
                    task_id="t0", goal="g", status="succeeded", max_attempts=10,
                    lease_seconds=60, deadline=made, created_at=made, updated_at=made,
                )
            )  # fmt: skip
            session.add(
                DecisionRow(
                    decision_id="d0", host_id="h", task_id="t0", attempt=1, step_index=1,
                    provider="p", model="m", system_prompt="s", user_prompt="u",
                    tool_name="tap", arguments_json="{}", created_at=made,
                )
            )  # fmt: skip
            session.add(
                StepScreenshotRow(
                    task_id="t0", attempt=1, step_index=1, phase="before", decision_id="d0",
                    host_id="h", object_key="k", content_type="image/png", size_bytes=1,
                    width=1, height=1, uploaded_at=made,
                )
            )  # fmt: skip
        sent = await _later_pages(store, 0, 0)
    finally:
        await store.close()
    with sqlite3.connect(sqlite_file) as conn:
        plans = [
            [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)]
            for statement, parameters in sent
        ]
    # SQLite shows a range's lower bound as ">" and its upper as "<", inclusive or not.
    ranges = ("(created_at,task_id)<(?,?)", *["(attempt,step_index)>(?,?)"] * 2)
    for plan, started in zip(plans, ranges, strict=True):
        assert [s for s in plan if s.startswith("SEARCH") and started in s], plans
    # None sorts (screenshots since migration 0028: "USE TEMP B-TREE FOR RIGHT PART OF ORDER
    # BY" sorted each step's phases down before).
    assert not [s for p in plans for s in p if "TEMP B-TREE" in s], plans


async def test_screenshot_pages_walk_in_order_once_each(db_url: str) -> None:
    """Both backends: pages of three screenshots (pages that end on a step's "before" and on
    its "after") list every screenshot of the task once, by attempt, step, "before" first."""
    store = Store.from_url(db_url)
    made = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    try:
        await upgrade(store.engine)
        async with store.write() as session:
            for attempt in (1, 2):
                for step in (1, 2, 3, 4):
                    for phase in screenshots.PHASES:
                        session.add(
                            StepScreenshotRow(
                                task_id="t0", attempt=attempt, step_index=step, phase=phase,
                                decision_id="d", host_id="h", object_key="k",
                                content_type="image/png", size_bytes=1, width=1, height=1,
                                uploaded_at=made,
                            )
                        )  # fmt: skip
        listed: list[tuple[int, int, str]] = []
        token = ""
        while True:
            rows, token = await screenshots.list_page(store, "t0", 0, 3, token)
            listed += [(r.attempt, r.step_index, r.phase) for r in rows]
            if not token:
                break
    finally:
        await store.close()
    assert listed == [(a, s, p) for a in (1, 2) for s in (1, 2, 3, 4) for p in screenshots.PHASES]


async def _screenshot_listings(store: Store) -> list[tuple[str, Any]]:
    """The statements of ListStepScreenshots' pages of task "t0": the first, later ones from
    a step's "before" and from its "after", and one attempt's past a step."""
    sent: list[tuple[str, Any]] = []

    def seen(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if "FROM step_screenshots" in statement:
            sent.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        await screenshots.list_page(store, "t0", 0, 50, "")
        for phase in screenshots.PHASES:
            token = page_token("screenshots/t0", 2, 3, phase)
            await screenshots.list_page(store, "t0", 0, 50, token)
        await screenshots.list_page(store, "t0", 2, 50, "", after_step=3)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
    assert len(sent) == 4, sent
    return sent


async def test_screenshot_pages_read_in_the_order_of_an_index(db_url: str) -> None:
    """Both backends: ListStepScreenshots' pages read a range of `ix_step_screenshots_listing`
    in their order, "before" first, and sort nothing. The primary key's index holds a step's
    phases the other way up, and before migration 0028 every page sorted them: PostgreSQL an
    (Incremental) Sort over the key's walk, SQLite "USE TEMP B-TREE FOR RIGHT PART OF ORDER
    BY". PostgreSQL with sorting priced out (its choice otherwise follows the row counts)."""
    store = Store.from_url(db_url)
    try:
        await upgrade(store.engine)
        plans = await _plan_lines(store, await _screenshot_listings(store))
    finally:
        await store.close()
    for plan in plans:
        if store.is_postgres:
            assert not _sort_nodes("\n".join(plan)), plans
            assert [s for s in plan if "Index Scan using ix_step_screenshots_listing " in s]
        else:
            assert not [s for s in plan if "TEMP B-TREE" in s], plans
            assert [s for s in plan if "USING INDEX ix_step_screenshots_listing (" in s], plans


async def test_a_later_page_from_a_time_in_another_zone_starts_where_the_utc_time_does(
    db_url: str,
) -> None:
    """`paging.past` binds each value with its column's type: a time given in another zone
    goes through `UTCDateTime` (to UTC; on SQLite its naive text) and starts the page at the
    same row as the same instant in UTC. Before, `tuple_` typed the values from Python, and on
    SQLite 02:00+02:00 was compared as the text of 02:00, two hours late."""
    store = Store.from_url(db_url)
    made = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    newest = (TaskRow.created_at, TaskRow.task_id)
    try:
        await upgrade(store.engine)
        async with store.write() as session:
            for i in range(6):
                session.add(
                    TaskRow(
                        task_id=f"t{i}", goal="g", status="queued", max_attempts=1,
                        lease_seconds=30.0, deadline=made + dt.timedelta(days=1),
                        created_at=made + dt.timedelta(hours=i), updated_at=made,
                    )
                )  # fmt: skip
        at = made + dt.timedelta(hours=3)
        elsewhere = at.astimezone(dt.timezone(dt.timedelta(hours=2)))
        for when in (at, elsewhere):
            async with store.read() as session:
                found = await session.scalars(
                    select(TaskRow.task_id)
                    .where(past(newest, (when, "t3"), descending=True))
                    .order_by(TaskRow.created_at.desc(), TaskRow.task_id.desc())
                )
                assert list(found) == ["t2", "t1", "t0"], when
    finally:
        await store.close()
