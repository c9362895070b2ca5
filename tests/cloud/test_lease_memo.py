"""The SQLite loop connection's memo of live leases (decision 0083): exact, or not used.

First what the memo rests on, shown on a real SQLite file: `PRAGMA data_version` on a
connection changes when another connection or process commits, never for the connection's own
commits. Then that a renewal batch is answered from the memo (one pragma, no read statement),
and that every way a lease can change behind it drops it: a cancel through the replica's RPC,
the expiry sweeper, another process writing the file, a write of the store's own on the loop
connection (committed or rolled back), a renewal write rolled back on it, and one that fell back
to the async engine. Each ends with the renewal answered as a fresh read would answer it.
The fencing and renewal suites (`test_renewal_writes.py`, `test_lease_flow.py`) run unchanged
over the memo.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text, update

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import task_service_pb2
from cloud.server import CloudServer
from cloud.store import leases, tasks
from cloud.store.database import Store
from cloud.store.models import TaskRow
from tests.cloud.cloud_harness import ScriptedHost, renewal, submit
from tests.cloud.sqlite_trace import trace

HALF = 0.5
#: Another process's write: one statement on the file, committed.
_CHILD = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
    " c.execute(sys.argv[2], sys.argv[3:]); c.commit()"
)
P1 = leases.ProgressIn(1, 2, "step 1")
P2 = leases.ProgressIn(2, 2, "step 2")


@pytest.fixture
async def sqlite_store(migrated_sqlite: Path, tmp_path: Path) -> AsyncIterator[Store]:
    """A migrated store on a SQLite file of its own (the memo exists only there)."""
    path = tmp_path / "cloud.sqlite3"
    shutil.copyfile(migrated_sqlite, path)
    store = Store.from_url(f"sqlite+aiosqlite:///{path}")
    try:
        yield store
    finally:
        await store.close()


def _db_path(store: Store) -> str:
    database = store.engine.url.database
    assert database is not None
    return database


def test_data_version_changes_for_other_connections_commits_only(tmp_path: Path) -> None:
    """What the memo rests on, on a real file in WAL mode as the store opens it: another
    connection's or process's commit changes the value, the connection's own commits and
    rollbacks and another connection's rollback or passive checkpoint do not; a checkpoint that
    truncates the log does (which only drops the memo: safe)."""
    path = tmp_path / "v.sqlite3"
    own = sqlite3.connect(path, isolation_level=None)
    own.execute("PRAGMA journal_mode=WAL")
    own.execute("PRAGMA wal_autocheckpoint=0")
    own.execute("CREATE TABLE t (x)")
    other = sqlite3.connect(path, isolation_level=None)

    def version() -> int:
        value = own.execute("PRAGMA data_version").fetchone()[0]
        assert isinstance(value, int)
        return value

    def changed(action: Any) -> bool:
        before = version()
        action()
        return version() != before

    def rolled_back(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (0)")
        conn.execute("ROLLBACK")

    def another_process() -> None:
        subprocess.run(
            [sys.executable, "-c", _CHILD, str(path), "INSERT INTO t VALUES (3)"], check=True
        )

    try:
        assert not changed(lambda: own.execute("INSERT INTO t VALUES (1)"))
        assert not changed(lambda: rolled_back(own))
        assert changed(lambda: other.execute("INSERT INTO t VALUES (2)"))
        assert not changed(lambda: rolled_back(other))
        assert changed(another_process)
        assert not changed(lambda: other.execute("PRAGMA wal_checkpoint(PASSIVE)"))
        assert not changed(lambda: own.execute("INSERT INTO t VALUES (4)"))  # restarts the WAL
        assert changed(lambda: other.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
        # Inside the connection's own write transaction, another's earlier commit shows.
        before = version()
        other.execute("INSERT INTO t VALUES (5)")
        own.execute("BEGIN IMMEDIATE")
        assert version() != before
        own.execute("COMMIT")
    finally:
        own.close()
        other.close()


async def _lease(store: Store, host_id: str = "h1") -> leases.Claimed:
    """A claimed task, its first renewal written (RUNNING) with progress P1."""
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
    )
    claimed = await leases.claim(store, host_id, ["p"], 2)
    assert claimed is not None
    (first,) = await leases.renew_batch(store, [_item(claimed, P1)], HALF)
    assert first.written
    return claimed


def _item(c: leases.Claimed, progress: leases.ProgressIn | None = None) -> leases.RenewalIn:
    return leases.RenewalIn("h1", c.task_id, c.attempt, c.lease_id, progress)


async def _answer(
    store: Store, c: leases.Claimed, progress: leases.ProgressIn | None = None
) -> Any:
    (out,) = await leases.answer_from_read(store, [_item(c, progress)], HALF)
    return out


def _reads(sent: list[str]) -> list[str]:
    """The batch reads (`_LIVE_SELECT`) among the loop connection's statements."""
    return [s for s in sent if s.startswith("SELECT a.task_id")]


async def test_an_unchanged_lease_is_answered_from_the_memo_with_one_pragma(
    sqlite_store: Store,
) -> None:
    """The memo in use: a lease read once is answered after that with the pragma and no read
    statement, and a written renewal's row (its start, new progress) is taken from its UPDATE,
    so the batches after it are answered without a read too, compared with what was written."""
    store = sqlite_store
    assert store.loop_connection is not None
    sent: list[str] = []
    trace(store.loop_connection, sent)
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
    )
    c = await leases.claim(store, "h1", ["p"], 2)
    assert c is not None
    sent.clear()
    assert await _answer(store, c, P1) == leases.Must.START
    assert len(_reads(sent)) == 1  # the claim, a write of its own on the connection, dropped it
    (started,) = await leases.write_renewals(store, [_item(c, P1)], HALF)
    sent.clear()
    first = await _answer(store, c, P1)
    assert isinstance(first, leases.RenewalOut) and first.expires_at == started.expires_at
    again = await _answer(store, c, P1)
    assert again == first
    assert sent == ["PRAGMA data_version"] * 2
    (written,) = await leases.write_renewals(store, [_item(c, P2)], HALF)
    assert written.written
    sent.clear()
    assert await _answer(store, c, P1) == leases.Must.PROGRESS  # P2 is stored now
    stored = await _answer(store, c, P2)
    assert isinstance(stored, leases.RenewalOut) and stored.expires_at == written.expires_at
    assert _reads(sent) == []


async def test_a_cancel_through_the_replicas_rpc_is_seen(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """A renewal after CancelTask is refused as cancelled although the renewal before it was
    answered from a read (on SQLite: from the memo the cancel's commit dropped)."""
    host = ScriptedHost(cloud.address, pki_dir, "h29")
    try:
        await _cancel_while_renewing(host, ops)
    finally:
        await host.close()


async def _cancel_while_renewing(host: ScriptedHost, ops: Any) -> None:
    await host.connect(["p"])
    task = (await submit(ops)).task
    a = (await host.next("assignment")).assignment
    for _ in range(2):  # the first is written (the attempt starts), the second is read
        await host.send(renewal(a))
        await host.next("renewed")
    await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="no"))
    assert (await host.next("revoked")).revoked.reason == lease_pb.REVOKE_REASON_CANCELLED
    await host.send(renewal(a))
    refused = await host.next()
    assert refused.WhichOneof("kind") == "revoked"
    assert refused.revoked.reason == lease_pb.REVOKE_REASON_CANCELLED


async def test_the_expiry_sweep_is_seen(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt the sweeper ended (here: it ran with its clock past the lease) is not
    answered from the row the memo held, still live and far from expiry by the real clock."""
    store = sqlite_store
    c = await _lease(store)
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)
    later = store.now() + dt.timedelta(seconds=60)
    with monkeypatch.context() as patched:
        patched.setattr(store, "now", lambda: later)
        assert [e.task_id for e in await leases.sweep_expired(store)] == [c.task_id]
    assert await _answer(store, c, P1) == leases.Must.NEWS
    (refused,) = await leases.renew_batch(store, [_item(c, P1)], HALF)
    assert refused.expires_at is None and refused.revocation == leases.Revocation.EXPIRED


async def test_another_process_writing_the_file_is_seen(sqlite_store: Store) -> None:
    """A cancel committed by another process (here: sqlite3 in a child process, as the CLI or a
    second replica on the file) drops the memo."""
    store = sqlite_store
    c = await _lease(store)
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)
    cancel = "UPDATE tasks SET cancel_requested = 1 WHERE task_id = ?"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, _db_path(store), cancel, c.task_id
    )
    assert await child.wait() == 0
    assert await _answer(store, c, P1) == leases.Must.NEWS
    (refused,) = await leases.renew_batch(store, [_item(c, P1)], HALF)
    assert refused.revocation == leases.Revocation.CANCELLED


def _cancel(session: Any, task_id: str) -> None:
    session.execute(update(TaskRow).where(TaskRow.task_id == task_id).values(cancel_requested=True))


async def test_a_write_of_the_stores_own_on_the_loop_connection_is_seen(
    sqlite_store: Store,
) -> None:
    """The loop connection's own commits leave `data_version` as it was; a write transaction
    begun there other than a renewal write (`Store.write_on_loop`: claims, hellos, here a
    cancel) drops the memo all the same, whether it commits or rolls back."""
    store = sqlite_store
    c = await _lease(store)
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)

    def cancel_then_fail(session: Any) -> None:
        _cancel(session, c.task_id)
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        await store.write_on_loop(cancel_then_fail)
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)  # nothing changed
    await store.write_on_loop(lambda session: _cancel(session, c.task_id))
    assert await _answer(store, c, P1) == leases.Must.NEWS
    (refused,) = await leases.renew_batch(store, [_item(c, P1)], HALF)
    assert refused.revocation == leases.Revocation.CANCELLED


async def test_a_renewal_write_rolled_back_on_the_loop_connection_leaves_the_memo_as_stored(
    sqlite_store: Store,
) -> None:
    """A renewal write whose transaction fails after its UPDATE (here: a trigger on the loop
    connection refuses the task's touch) is rolled back, and the memo does not take the row
    its UPDATE returned: new progress that was never stored is not answered as stored."""
    store = sqlite_store
    c = await _lease(store)
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)
    driver = store.loop_driver()
    driver.execute(
        "CREATE TEMP TRIGGER refuse_touch BEFORE UPDATE OF updated_at ON tasks"
        " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    )
    try:
        with pytest.raises(sqlite3.IntegrityError):
            await leases.write_renewals(store, [_item(c, P2)], HALF)
    finally:
        driver.execute("DROP TRIGGER refuse_touch")
    assert await _answer(store, c, P2) == leases.Must.PROGRESS
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)


async def test_a_renewal_write_that_fell_back_to_the_async_engine_is_seen(
    sqlite_store: Store,
) -> None:
    """When the loop connection cannot take SQLite's write lock in time (another connection
    holds it), the renewal write runs through the async engine: its row is not the memo's
    connection's to take, and its commit drops the memo, so the progress it stored (P2) is
    what the next renewal is compared with."""
    store = sqlite_store
    c = await _lease(store)
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)
    blocker = sqlite3.connect(_db_path(store), isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    fell_back: list[str] = []

    def release(*_args: Any) -> None:
        # The async engine's transaction begins: the loop connection has given up; let it write.
        if not fell_back:
            fell_back.append("yes")
            blocker.execute("ROLLBACK")

    event.listen(store.engine.sync_engine, "begin", release)
    try:
        (written,) = await leases.write_renewals(store, [_item(c, P2)], HALF)
    finally:
        event.remove(store.engine.sync_engine, "begin", release)
        blocker.close()
    assert fell_back and written.written
    assert await _answer(store, c, P1) == leases.Must.PROGRESS
    stored = await _answer(store, c, P2)
    assert isinstance(stored, leases.RenewalOut) and stored.expires_at == written.expires_at
    async with store.read() as session:
        summary = await session.scalar(
            text("SELECT summary FROM attempts WHERE task_id = :t"), {"t": c.task_id}
        )
    assert summary == P2.summary


async def test_a_commit_between_the_read_and_a_renewal_write_is_seen(sqlite_store: Store) -> None:
    """Another connection's cancel committed after the memo was last checked and before a
    renewal write on the loop connection: the write (refused by its fence) reports no row for
    the lease, and the memo is not taken as valid again on the write's word; the next batch's
    pragma drops it, so the lease is refused, not answered from its row before the cancel."""
    store = sqlite_store
    c = await _lease(store)
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
    )
    other = await leases.claim(store, "h2", ["q"], 2)  # so that the write has a row to report
    assert other is not None
    assert isinstance(await _answer(store, c, P1), leases.RenewalOut)
    async with store.write() as session:  # the async engine: another connection
        await session.execute(
            update(TaskRow).where(TaskRow.task_id == c.task_id).values(cancel_requested=True)
        )
    started = leases.RenewalIn("h2", other.task_id, other.attempt, other.lease_id, P2)
    refused, written = await leases.write_renewals(store, [_item(c, P1), started], HALF)
    assert refused.revocation == leases.Revocation.CANCELLED and written.written
    assert await _answer(store, c, P1) == leases.Must.NEWS
