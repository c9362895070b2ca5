"""A task, attempt or host row held elsewhere no longer stalls a host's lease stream.

An operator's open psql session (`SELECT … FOR UPDATE` left open) may hold a `tasks`,
`attempts` or `hosts` row. On PostgreSQL the stream waited for it as long as its holder kept
it in several places: a refused held lease's history row (its insert takes a key-share lock
on the task row) before the Welcome went out; a result, recorded on the stream's reader ahead
of every renewal behind it (the host's other leases ran out); the host's row written for a
hold or a stop, and the background release of a superseded process's leases, each waiting
with no bound and no word. Real PostgreSQL, real Lease streams, the lock held from a
connection of its own; SQLite has one writer and no row locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from sqlalchemy import select

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.lease.held_rows import RETRY_FIRST_S
from cloud.server import CloudServer
from cloud.store import hosts as hosts_mod
from cloud.store import states
from cloud.store.database import Store, libpq_dsn
from cloud.store.lease_events import EventKind
from cloud.store.models import AttemptRow, HostRow, LeaseEventRow
from cloud.store.revocations import Revoked
from tests.cloud.cloud_harness import ScriptedHost, lapse, renewal, result, submit
from tests.support.waiting import until

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its retries; a write that blocks never gets there.
WITHIN_S = 15.0

HOLD_TASK = "SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE"
HOLD_HOST = "SELECT 1 FROM hosts WHERE host_id = %s FOR UPDATE"


def _held(a: lease_pb.Assignment) -> list[lease_pb.HeldAssignment]:
    return [lease_pb.HeldAssignment(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id)]


async def _events(store: Store, task_id: str, kind: EventKind) -> int:
    async with store.read() as db:
        rows = await db.scalars(
            select(LeaseEventRow.id).where(
                LeaseEventRow.task_id == task_id, LeaseEventRow.kind == kind
            )
        )
        return len(rows.all())


async def _attempt(store: Store, a: lease_pb.Assignment) -> AttemptRow:
    async with store.read() as db:
        row = await db.scalar(
            select(AttemptRow).where(
                AttemptRow.task_id == a.task_id, AttemptRow.attempt == a.attempt
            )
        )
        assert row is not None
        return row


@contextlib.asynccontextmanager
async def _holding(store: Store) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A second connection, as an operator's psql session: the rows it locks stay locked
    until the test rolls back (or this ends)."""
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        yield holder
    finally:
        await holder.rollback()
        await holder.close()


async def _make_hosts_refuse(store: Store, when: str) -> None:
    """Make every update of a hosts row for which `when` (plpgsql, over NEW) holds raise, as a
    constraint would: a write no retry can mend."""
    async with _holding(store) as ddl:
        await ddl.execute(
            "CREATE FUNCTION amc_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF {when} THEN RAISE EXCEPTION 'refused'; END IF;"
            " RETURN NEW; END $$"
        )
        await ddl.execute(
            "CREATE TRIGGER amc_test_refuse BEFORE UPDATE ON hosts FOR EACH ROW"
            " EXECUTE FUNCTION amc_test_refuse()"
        )
        await ddl.commit()


async def _finished_by_h1(cloud: CloudServer, ops: Any, pki_dir: Path) -> Any:
    """A task h1 ran and finished (its result acknowledged); its assignment."""
    async with ScriptedHost(cloud.address, pki_dir, "h1") as first:
        await first.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await first.next("assignment")).assignment
        await first.send(result(a))
        assert (await first.next("result_ack")).result_ack.task_id == a.task_id
    return a


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_refused_held_lease_with_its_task_row_held_gets_its_welcome(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1 finished its attempt, then reconnects naming that lease again while the task's row
    is held: its Welcome and the lease's refusal come at once (the refusal's history row
    waited for the lock before the Welcome went out), and the history row is written once
    the lock is gone."""
    a = await _finished_by_h1(cloud, ops, pki_dir)
    async with _holding(cloud.store) as holder:
        await holder.execute(HOLD_TASK, (a.task_id,))
        with caplog.at_level(logging.WARNING, logger="cloud.lease"):
            async with ScriptedHost(cloud.address, pki_dir, "h1") as again:
                welcome = await asyncio.wait_for(
                    again.connect(["p1"], _held(a), process_id="p"), WITHIN_S
                )
                assert welcome.host_id == "h1"
                refused = (await again.next("revoked", wait=WITHIN_S)).revoked
                assert refused.task_id == a.task_id
                assert refused.reason == lease_pb.REVOKE_REASON_FINISHED, refused
                assert await _events(cloud.store, a.task_id, EventKind.REVOKED) == 0  # held
                assert f"task {a.task_id}'s row" in caplog.text, caplog.text
                await holder.rollback()

                async def recorded() -> bool:
                    return await _events(cloud.store, a.task_id, EventKind.REVOKED) == 1

                await until(recorded, WITHIN_S, "the refusal's history row written")


async def _two_leases(host: ScriptedHost, ops: Any) -> tuple[lease_pb.Assignment, ...]:
    await host.connect(["p1", "p2"], process_id="p")
    for _ in range(2):
        await submit(ops, target=types_pb2.TaskTarget(host_id=host.host_id))
    first = (await host.next("assignment")).assignment
    second = (await host.next("assignment")).assignment
    return first, second


async def _answers(host: ScriptedHost, count: int) -> list[lease_pb.LeaseResponse]:
    return [await host.next(wait=WITHIN_S) for _ in range(count)]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("table", ["attempts", "tasks"])
async def test_renewals_of_other_leases_flow_while_a_result_waits_for_its_held_row(
    cloud: CloudServer, ops: Any, pki_dir: Path, table: str
) -> None:
    """With lease a's attempt (or task) row held, h1's result of a holds up none of its
    renewals of lease b; the result is refused retryably (UNAVAILABLE, naming the rows, with
    nothing written), and recorded once, when sent again after the lock is gone."""
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        a, b = await _two_leases(host, ops)
        await holder.execute(f"SELECT 1 FROM {table} WHERE task_id = %s FOR UPDATE", (a.task_id,))
        await host.send(result(a))
        for step in (1, 2, 3):
            await host.send(renewal(b, step))
        got = await _answers(host, 4)
        kinds = [m.WhichOneof("kind") for m in got]
        assert sorted(str(k) for k in kinds) == ["rejected", "renewed", "renewed", "renewed"], got
        assert all(m.renewed.task_id == b.task_id for m in got if m.HasField("renewed"))
        rejected = next(m.rejected for m in got if m.HasField("rejected"))
        assert rejected.code == grpc.StatusCode.UNAVAILABLE.value[0], rejected
        assert rejected.task_id == a.task_id
        assert f"task {a.task_id} attempt {a.attempt}" in rejected.message, rejected.message
        assert "locked by another transaction" in rejected.message
        assert (await _attempt(cloud.store, a)).result_status is None  # nothing written
        await holder.rollback()
        await host.send(result(a))  # the host's resend
        ack = (await host.next("result_ack", wait=WITHIN_S)).result_ack
        assert ack.task_id == a.task_id and not ack.duplicate
        await host.send(renewal(b, 4))  # the stream goes on
        assert (await host.next("renewed")).renewed.task_id == b.task_id
        assert (await _attempt(cloud.store, a)).result_status == "SUCCEEDED"
        assert await _events(cloud.store, a.task_id, EventKind.RESULT) == 1


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
async def test_a_renewal_behind_its_own_result_is_answered_after_it(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """Both stores: a renewal of lease a sent right behind a's result is answered after the
    result (refused: the attempt ended), as the fence needs, and a result sent twice is
    recorded once (the second is acknowledged as a duplicate)."""
    async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
        a, b = await _two_leases(host, ops)
        await host.send(result(a))
        await host.send(renewal(a, 4))
        await host.send(result(a))
        await host.send(renewal(b, 1))
        got = await _answers(host, 4)
        of_a = [
            m for m in got if m.WhichOneof("kind") != "renewed" or m.renewed.task_id != b.task_id
        ]
        assert [m.WhichOneof("kind") for m in of_a] == ["result_ack", "revoked", "result_ack"]
        assert not of_a[0].result_ack.duplicate and of_a[2].result_ack.duplicate
        assert of_a[1].revoked.reason == lease_pb.REVOKE_REASON_FINISHED
        assert any(m.HasField("renewed") and m.renewed.task_id == b.task_id for m in got)
    assert await _events(cloud.store, a.task_id, EventKind.RESULT) == 1


async def _host(store: Store, host_id: str) -> HostRow:
    async with store.read() as db:
        row = await db.scalar(select(HostRow).where(HostRow.host_id == host_id))
        assert row is not None
        return row


def _waits(caplog: pytest.LogCaptureFixture, *words: str) -> bool:
    return any(
        r.levelno == logging.WARNING and all(w in r.getMessage() for w in words)
        for r in caplog.records
    )


async def _named_then_shown(
    store: Store,
    holder: psycopg.AsyncConnection[Any],
    caplog: pytest.LogCaptureFixture,
    write: tuple[str, str],
    held: Callable[[HostRow], bool],
    shown: Callable[[HostRow], bool],
) -> None:
    """While `holder` holds h1's row: a warning names the row and the write (`write`: the
    words the warning says it by, and how to name it here), and `held(row)` (nothing written
    yet); once the row is free, `shown(row)` within `WITHIN_S`."""
    words, name = write
    await until(
        lambda: _waits(caplog, "host h1's row is locked", words),
        WITHIN_S,
        f"a warning naming h1's row and {name}",
    )
    assert held(await _host(store, "h1"))  # still held
    await holder.rollback()

    async def written() -> bool:
        return shown(await _host(store, "h1"))

    await until(written, WITHIN_S, f"h1's row: {name} shown")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_stop_on_a_held_host_row_is_named_and_shown_once_the_row_is_free(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1 says it is stopping while its row is held: the stream answers its renewals, a
    warning names the row and what waits for it (the write waited with no bound and no
    word), and the stop is shown once the lock is gone."""
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await holder.execute(HOLD_HOST, ("h1",))
        await host.send(lease_pb.LeaseRequest(stopping=lease_pb.HostStopping()))
        await host.send(renewal(a, 2))
        assert (await host.next("renewed", wait=WITHIN_S)).renewed.task_id == a.task_id
        await _named_then_shown(
            cloud.store,
            holder,
            caplog,
            ("its stop", "its stop"),
            held=lambda row: row.stopping_since is None,
            shown=lambda row: row.stopping_since is not None,
        )


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_hold_on_a_held_host_row_is_named_and_shown_once_the_row_is_free(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's lease runs out on its open stream (a frozen host) while its row is held: the
    revoke still reaches it, a warning names the row and the hold, and the hold is shown
    once the lock is gone."""
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"), max_attempts=2)
        a = (await host.next("assignment")).assignment
        await holder.execute(HOLD_HOST, ("h1",))
        await lapse(cloud.store, a.task_id, a.attempt, ago=0)
        revoked = (await host.next("revoked", wait=WITHIN_S)).revoked
        assert revoked.reason == lease_pb.REVOKE_REASON_EXPIRED
        await _named_then_shown(
            cloud.store,
            holder,
            caplog,
            ("the hold of new work", "its hold"),
            held=lambda row: row.held_since is None,
            shown=lambda row: row.held_task_id == a.task_id,
        )


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_release_on_a_held_task_row_is_named_and_done_once_the_row_is_free(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's certificate is revoked (the deny-list's listener releases its leases in the
    background) while its lease's task row is held: a warning names the host, the task and
    why; nothing is released meanwhile; the lease is released once the lock is gone."""
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await holder.execute(HOLD_TASK, (a.task_id,))
        cloud.leases.on_deny_list(Revoked(host_ids=frozenset({"h1"})))
        await until(
            lambda: _waits(caplog, "host h1: releasing its live leases", "locked"),
            WITHIN_S,
            "a warning naming h1's release",
        )
        assert (await _attempt(cloud.store, a)).ended_at is None  # nothing released
        await holder.rollback()

        async def released() -> bool:
            row = await _attempt(cloud.store, a)
            return row.failure_reason == states.CERTIFICATE_REVOKED

        await until(released, WITHIN_S, "h1's lease released")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_late_release_of_a_revoked_certificate_spares_leases_granted_after_it(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """h1's certificate is revoked while its lease of a has its task row held: the release
    waits. Lease b goes to h1 after the revocation (a host that re-enrolled and reconnected).
    Once the row is free the release ends a only: each try read the host's live leases anew,
    and ended b too."""
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1", "p2"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await holder.execute(HOLD_TASK, (a.task_id,))
        cloud.leases.on_deny_list(Revoked(host_ids=frozenset({"h1"})))
        await asyncio.sleep(0.5)  # its first try waited and timed out
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        b = (await host.next("assignment", wait=WITHIN_S)).assignment
        await holder.rollback()

        async def released() -> bool:
            row = await _attempt(cloud.store, a)
            return row.failure_reason == states.CERTIFICATE_REVOKED

        await until(released, WITHIN_S, "h1's lease of a released")
        row = await _attempt(cloud.store, b)
        assert row.ended_at is None and row.failure_reason is None, row.failure_reason


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_an_older_end_of_a_hold_does_not_land_after_a_newer_hold(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """h1's hold is shown; h1 is heard from while its row is held, so the end of the hold
    waits and is tried again; its next lease runs out meanwhile (a new hold, tried again
    too). Once the row is free the fleet view shows the new hold: the older end, still
    retrying, used to land after it and show no hold while new work was held back."""
    mgr = cloud.leases
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        session = mgr.sessions["h1"]
        session.lapsed(120)
        await mgr._hold(session, "t1", 1, 120)  # shown
        assert (await _host(cloud.store, "h1")).held_task_id == "t1"
        await holder.execute(HOLD_HOST, ("h1",))
        mgr.touch(session)  # heard from: the end of the hold waits
        await asyncio.sleep(4.0)  # its tries: at 0, 0.5, 1.5 and 3.5 s; the next at 7.5
        session.lapsed(120)  # the next lease runs out on the open stream
        mgr._spawn(mgr._hold(session, "t2", 1, 120))
        await asyncio.sleep(1.2)
        await holder.rollback()  # the psql session ends
        await until(lambda: not mgr._closings, WITHIN_S, "the row's writes done")
        assert session.unheard()
        assert (await _host(cloud.store, "h1")).held_task_id == "t2"


@pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_hold_landing_after_a_newer_end_is_ended_too(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1's hold is being written (slowly: a pooled connection awaited) when h1 is heard
    from; the end of the hold, wanted later, is written first and finds nothing to end; the
    older hold, on its way, lands no more (the row keeps the newer write's number). Before,
    it landed after the end, and the fleet showed a heard-from host held back."""
    mgr = cloud.leases
    gate = asyncio.Event()
    real_hold = hosts_mod.hold

    async def slow_hold(*args: Any, **kwargs: Any) -> bool:
        await gate.wait()
        return await real_hold(*args, **kwargs)

    real_unhold = hosts_mod.unhold
    ends: list[bool] = []

    async def noted_unhold(*args: Any, **kwargs: Any) -> bool:
        ended = await real_unhold(*args, **kwargs)
        ends.append(ended)
        return ended

    monkeypatch.setattr(hosts_mod, "hold", slow_hold)
    monkeypatch.setattr(hosts_mod, "unhold", noted_unhold)
    async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        session = mgr.sessions["h1"]
        session.lapsed(120)
        mgr._spawn(mgr._hold(session, "t1", 1, 120))
        await asyncio.sleep(0.2)
        mgr.touch(session)  # heard from: the end of the hold, numbered newer
        await until(lambda: len(ends) == 1, WITHIN_S, "the end written first")
        gate.set()  # the older hold lands after it
        await until(lambda: not mgr._closings, WITHIN_S, "the row's writes done")
        assert not session.unheard()
        assert (await _host(cloud.store, "h1")).held_task_id is None


@pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_an_older_end_of_a_hold_on_its_way_does_not_erase_a_newer_hold(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1's hold is shown; h1 is heard from, and the end of the hold sets out (slowly: a
    pooled connection awaited, past its last check that it is still wanted); h1's next lease
    runs out meanwhile and the new hold is written. The older end, landing after it, changes
    nothing: before, it erased the new hold, and the fleet view showed no hold while new work
    was held back."""
    mgr = cloud.leases
    gate, waiting = asyncio.Event(), asyncio.Event()
    real_unhold = hosts_mod.unhold

    async def slow_unhold(*args: Any, **kwargs: Any) -> bool:
        waiting.set()
        await gate.wait()
        return await real_unhold(*args, **kwargs)

    monkeypatch.setattr(hosts_mod, "unhold", slow_unhold)
    async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        session = mgr.sessions["h1"]
        session.lapsed(120)
        await mgr._hold(session, "t1", 1, 120)  # shown
        mgr.touch(session)  # heard from: the end of the hold sets out
        await asyncio.wait_for(waiting.wait(), WITHIN_S)
        session.lapsed(120)  # the next lease runs out on the open stream
        await mgr._hold(session, "t2", 1, 120)
        assert (await _host(cloud.store, "h1")).held_task_id == "t2"
        gate.set()  # the older end lands now
        await until(lambda: not mgr._closings, WITHIN_S, "the row's writes done")
        assert session.unheard()
        assert (await _host(cloud.store, "h1")).held_task_id == "t2"


async def _lock_waiters(holder: psycopg.AsyncConnection[Any], count: int) -> bool:
    return len(await (await holder.execute(LOCK_WAITERS)).fetchall()) >= count


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_an_older_end_of_a_hold_waiting_behind_a_newer_hold_on_the_held_row_lands_not(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1's row is held (psql); its new hold waits for the row, and an older end of its hold,
    set out before the new hold was wanted, comes to wait behind it. The psql session ends:
    the row grants both in arrival order, the older end last, and the fleet view still shows
    the new hold (before, the end erased it). Should a try time out before both wait, the
    retries settle it the same way."""
    mgr = cloud.leases
    gate, waiting, tried = asyncio.Event(), asyncio.Event(), asyncio.Event()
    real_unhold = hosts_mod.unhold

    async def slow_unhold(*args: Any, **kwargs: Any) -> bool:
        waiting.set()
        await gate.wait()
        try:
            return await real_unhold(*args, **kwargs)
        finally:
            tried.set()

    async def both_waiting() -> bool:  # or the end's try over already (timed out)
        return tried.is_set() or await _lock_waiters(holder, 2)

    monkeypatch.setattr(hosts_mod, "unhold", slow_unhold)
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        session = mgr.sessions["h1"]
        session.lapsed(120)
        await mgr._hold(session, "t1", 1, 120)  # shown
        mgr.touch(session)  # heard from: the end of the hold sets out
        await asyncio.wait_for(waiting.wait(), WITHIN_S)
        await holder.execute(HOLD_HOST, ("h1",))
        session.lapsed(120)  # the next lease runs out on the open stream
        mgr._spawn(mgr._hold(session, "t2", 1, 120))
        await until(lambda: _lock_waiters(holder, 1), WITHIN_S, "the new hold waiting")
        gate.set()  # the older end comes to wait behind it
        await until(both_waiting, WITHIN_S, "both waiting")
        await holder.rollback()
        await until(lambda: not mgr._closings, WITHIN_S, "the row's writes done")
        assert session.unheard()
        assert (await _host(cloud.store, "h1")).held_task_id == "t2"


@pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_hold_write_lands_only_if_no_newer_one_of_its_stream_did(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """The store compares each hold write's number in its UPDATE: an end numbered 5 landed,
    a hold numbered 4 changes nothing; the same number again lands (a retry of a write whose
    commit was cut off); a write of another stream is not compared; an end finding no hold
    is recorded all the same (it keeps an older hold out) and says it ended none."""
    async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        stream = cloud.leases.sessions["h1"].stream_id
        store = cloud.store
        assert not await hosts_mod.unhold(store, "h1", stream, number=5)  # none to end
        assert not await hosts_mod.hold(store, "h1", stream, "t1", 1, 60, number=4)
        assert (await _host(store, "h1")).held_task_id is None
        assert await hosts_mod.hold(store, "h1", stream, "t1", 1, 60, number=6)
        assert await hosts_mod.hold(store, "h1", stream, "t1", 1, 60, number=6)  # again
        assert not await hosts_mod.unhold(store, "h1", stream, number=5)
        row = await _host(store, "h1")
        assert row.held_task_id == "t1" and row.hold_write_number == 6
        assert not await hosts_mod.unhold(store, "h1", "another-stream", number=99)
        assert await hosts_mod.unhold(store, "h1", stream, number=7)
        assert (await _host(store, "h1")).held_task_id is None


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_the_same_refusal_again_while_its_task_row_is_held_joins_the_waiting_write(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1 finished its attempt, then reconnects three times naming that lease again while the
    task's row is held: each hello is refused at once, but the refusal's history row waits in
    one background write, warned about once (each refusal spawned a retry and a warning of its
    own), and is written once the lock is gone."""
    a = await _finished_by_h1(cloud, ops, pki_dir)
    async with _holding(cloud.store) as holder:
        await holder.execute(HOLD_TASK, (a.task_id,))
        with caplog.at_level(logging.WARNING, logger="cloud.lease"):
            for _ in range(3):
                async with ScriptedHost(cloud.address, pki_dir, "h1") as again:
                    await asyncio.wait_for(
                        again.connect(["p1"], _held(a), process_id="p"), WITHIN_S
                    )
                    refused = (await again.next("revoked", wait=WITHIN_S)).revoked
                    assert refused.reason == lease_pb.REVOKE_REASON_FINISHED, refused
            warned = [r for r in caplog.records if f"task {a.task_id}'s row" in r.getMessage()]
            assert len(warned) == 1, [r.getMessage() for r in warned]
            assert await _events(cloud.store, a.task_id, EventKind.REVOKED) == 0  # held
            await holder.rollback()

            async def recorded() -> bool:
                return await _events(cloud.store, a.task_id, EventKind.REVOKED) == 1

            await until(recorded, WITHIN_S, "the refusal's history row written")


#: The backends (other than the holder's own) waiting for a row lock now.
LOCK_WAITERS = (
    "SELECT pid FROM pg_stat_activity"
    " WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND datname = current_database()"
)


async def _end_a_waiter(holder: psycopg.AsyncConnection[Any], within: float = 0.2) -> bool:
    """Terminate a backend waiting for a row the holder locks (as a database restart would end
    it), if one waits within `within` seconds: True when one was ended."""
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        waiters = await (await holder.execute(LOCK_WAITERS)).fetchall()
        if waiters:
            await holder.execute("SELECT pg_terminate_backend(%s)", (waiters[0][0],))
            return True
    return False


def _warned(caplog: pytest.LogCaptureFixture, *words: str) -> int:
    return sum(
        1
        for r in caplog.records
        if r.levelno == logging.WARNING and all(w in r.getMessage() for w in words)
    )


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_held_result_that_failed_otherwise_is_warned_about_again_when_held_again(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's result waits for its attempt row (warned once); sent again, its write is cut off
    by the database (its backend terminated while it waited) and the result fails otherwise;
    sent again, it waits for the row again: a new episode, warned about again. Before, the
    failure left it among the stream's warned results and the new wait was logged at debug."""
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    waits = ("a message from h1 waits", "locked by another transaction")
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await host.next("assignment")).assignment
        await holder.execute("SELECT 1 FROM attempts WHERE task_id = %s FOR UPDATE", (a.task_id,))
        await host.send(result(a))
        first = (await host.next("rejected", wait=WITHIN_S)).rejected
        assert "locked by another transaction" in first.message, first.message
        assert _warned(caplog, *waits) == 1
        for _ in range(20):  # until a copy's wait is caught and cut off
            await host.send(result(a))
            ended = await _end_a_waiter(holder)
            answer = (await host.next("rejected", wait=WITHIN_S)).rejected
            if ended and "locked" not in answer.message:
                break
        else:
            pytest.fail("no copy of the result was caught waiting for the row")
        assert answer.code == grpc.StatusCode.UNAVAILABLE.value[0], answer
        assert _warned(caplog, *waits) == 1  # the cut-off write is not a wait
        await host.send(result(a))  # held again
        again = (await host.next("rejected", wait=WITHIN_S)).rejected
        assert "locked by another transaction" in again.message, again.message
        assert _warned(caplog, *waits) == 2, [r.getMessage() for r in caplog.records]
        await holder.rollback()
        await host.send(result(a))
        assert (await host.next("result_ack", wait=WITHIN_S)).result_ack.task_id == a.task_id


def _device_update(*serials: str) -> lease_pb.LeaseRequest:
    return lease_pb.LeaseRequest(
        device_update=lease_pb.DeviceUpdate(
            devices=[
                types_pb2.Device(serial=s, state=types_pb2.DEVICE_STATE_ONLINE) for s in serials
            ]
        )
    )


async def _stopped_shown(store: Store) -> bool:
    return (await _host(store, "h1")).stopping_since is not None


async def _phones_shown(store: Store) -> bool:
    return [d.get("serial") for d in (await _host(store, "h1")).devices] == ["p1", "p2"]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("write", ["stop", "phones"])
async def test_a_held_row_write_cut_off_by_the_database_is_tried_again_and_lands(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture, write: str
) -> None:
    """h1's stop (or its new phone list) waits for h1's row, held in psql, and is retried in
    the background; one retry's connection is cut off while it waits (its backend terminated,
    as by a database restart). Once the row is free the write lands, the cut said once:
    before, the retries ended at the first error that was not a lock timeout, and the write
    was lost."""
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await holder.execute(HOLD_HOST, ("h1",))
        if write == "stop":
            await host.send(lease_pb.LeaseRequest(stopping=lease_pb.HostStopping()))
            what, landed = "its stop", _stopped_shown
        else:
            await host.send(_device_update("p1", "p2"))
            what, landed = "its new phone list", _phones_shown
        await until(lambda: _warned(caplog, "h1", what) > 0, WITHIN_S, "the wait warned")
        assert await _end_a_waiter(holder, within=WITHIN_S), "no retry waited for the row"
        assert not await landed(cloud.store)  # still held
        await holder.rollback()
        await until(lambda: landed(cloud.store), WITHIN_S, f"h1's row: {what} written")
        cut = _warned(caplog, f"host h1's row: {what}", "database is unavailable")
        assert cut == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_background_write_that_cannot_succeed_is_given_up_at_error_naming_its_row(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's stop waits for its row (held in psql); meanwhile the row refuses any stop (a
    trigger raising, as a constraint would): once the row is free the retry fails for good,
    and says so at ERROR naming the row and the write, once. Before, the failure ended the
    retries as a warning of a failed lease manager job naming neither."""
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await _make_hosts_refuse(cloud.store, "NEW.stopping_since IS NOT NULL")
        async with _holding(cloud.store) as holder:
            await holder.execute(HOLD_HOST, ("h1",))
            await host.send(lease_pb.LeaseRequest(stopping=lease_pb.HostStopping()))
            await until(lambda: _warned(caplog, "h1", "its stop") > 0, WITHIN_S, "the wait")
            await holder.rollback()

            def given_up() -> list[logging.LogRecord]:
                return [
                    r
                    for r in caplog.records
                    if r.levelno == logging.ERROR
                    and "host h1's row: its stop" in r.getMessage()
                    and "not tried again" in r.getMessage()
                ]

            await until(lambda: bool(given_up()), WITHIN_S, "the give-up said at ERROR")
            assert "refused" not in given_up()[0].getMessage()  # the database's text is not
            await asyncio.sleep(RETRY_FIRST_S * 3)  # no try after it
            assert len(given_up()) == 1
            assert not await _stopped_shown(cloud.store)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_stream_end_cut_off_by_the_database_is_recorded_once_the_row_is_free(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """h1's stream ends while its row is held; the end's first try is cut off while it waits
    (its backend terminated, as by a database restart). The end is tried again and recorded
    once the row is free: before, that failure dropped it with no word, and h1 read as
    connected for as long as this replica vouched for its stream."""
    async with _holding(cloud.store) as holder:
        async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
            await host.connect(["p1"], process_id="p")
            await holder.execute(HOLD_HOST, ("h1",))
        assert await _end_a_waiter(holder, within=WITHIN_S), "the end's try never waited"
        assert (await _host(cloud.store, "h1")).connected  # still held
        await holder.rollback()

        async def recorded() -> bool:
            return not (await _host(cloud.store, "h1")).connected

        await until(recorded, WITHIN_S, "h1's stream end recorded")


async def _next_answer_is_not_the_phone_lists(host: ScriptedHost) -> None:
    """The stream's next answer is the one to a message sent now (a second hello, refused),
    so the phone list sent before it was answered nothing (no rejection)."""
    await host.send(lease_pb.LeaseRequest(hello=lease_pb.HostHello()))
    answer = (await host.next("rejected", wait=WITHIN_S)).rejected
    assert "only the first message may be a hello" in answer.message, answer.message


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_phone_list_whose_first_try_is_cut_off_is_tried_again_and_lands(
    cloud: CloudServer,
    ops: Any,
    pki_dir: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """h1's new phone list waits for h1's row (held in psql) on its first try, and that try's
    connection is cut off (its backend terminated, as by a database restart). The list is kept
    and retried, the cut said once naming the row, and it lands once the row is free: before,
    the first try's failure was answered UNAVAILABLE, and the host, which sends a phone list
    only when it changes, never sent it again. The first try's wait is made long, so the cut
    ends it and not a retry."""
    monkeypatch.setattr(hosts_mod, "SWEEP_LOCK_TIMEOUT_MS", 30_000)
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    async with _holding(cloud.store) as holder, ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await holder.execute(HOLD_HOST, ("h1",))
        await host.send(_device_update("p1", "p2"))
        assert await _end_a_waiter(holder, within=WITHIN_S), "the first try never waited"
        what = "host h1's row: its new phone list"
        await until(
            lambda: _warned(caplog, what, "database is unavailable") > 0, WITHIN_S, "the cut"
        )
        assert not await _phones_shown(cloud.store)  # still held
        await holder.rollback()
        await until(lambda: _phones_shown(cloud.store), WITHIN_S, "h1's phone list written")
        assert _warned(caplog, what, "database is unavailable") == 1
        await _next_answer_is_not_the_phone_lists(host)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_phone_list_the_row_refuses_is_said_at_error_naming_the_row(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's row refuses its new phone list (a trigger raising, as a constraint would): no
    retry can mend that, so it is said at ERROR naming the row and the write, without the
    database's text, and the stream goes on. Before, it was logged as a warning of a failed
    message and answered INTERNAL, naming neither."""
    caplog.set_level(logging.WARNING, logger="cloud.lease")
    async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
        await host.connect(["p1"], process_id="p")
        await _make_hosts_refuse(cloud.store, "NEW.devices::text LIKE '%p2%'")
        await host.send(_device_update("p1", "p2"))

        def given_up() -> list[logging.LogRecord]:
            return [
                r
                for r in caplog.records
                if r.levelno == logging.ERROR
                and "host h1's row: its new phone list" in r.getMessage()
                and "not tried again" in r.getMessage()
            ]

        await until(lambda: bool(given_up()), WITHIN_S, "the give-up said at ERROR")
        assert "refused" not in given_up()[0].getMessage()  # the database's text is not
        await _next_answer_is_not_the_phone_lists(host)
        assert not await _phones_shown(cloud.store)
