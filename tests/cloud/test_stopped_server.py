"""A stopped replica is freed when its last reference goes, not later by the cycle collector.

A CI run crashed once in SQLAlchemy's compiler during a later test, when the collector freed
an earlier test's stopped replica on another event loop. With the collector off, the weak
references below die only if nothing of the replica sits in a reference cycle after `stop()`.
Real parts: the replica over mTLS on each backend; in the second test a scripted host takes a
task, plans a step with the offline planner and reports its result, and a progress watch is
still open when the replica stops.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import weakref
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import QueuePool, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from amc.v1 import (
    planner_service_pb2,
    planner_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
)
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings, SettingError
from cloud.store.database import Store
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import (
    DRIVER_TEXT,
    ScriptedHost,
    channel,
    logged_text,
    renewal,
    result,
    submit,
    tasks_stub,
)
from tests.planner import scenes


def _refs(server: CloudServer) -> dict[str, weakref.ref[Any]]:
    return {
        "replica": weakref.ref(server),
        "grpc server": weakref.ref(server.server),
        "engine": weakref.ref(server.store.engine),
    }


async def _start_and_stop(settings: CloudSettings) -> dict[str, weakref.ref[Any]]:
    """Weak references to a replica that started and stopped (only this frame held it)."""
    server = await build_server(settings)
    await server.start()
    await server.stop(0.5)
    return _refs(server)


async def _serve_and_stop(settings: CloudSettings, pki_dir: Path) -> dict[str, weakref.ref[Any]]:
    """Weak references to a replica that served a task end to end and then stopped."""
    server = await build_server(settings)
    await server.start()
    host = ScriptedHost(server.address, pki_dir, "h1")
    ops = channel(server.address, pki_dir, "operator-ops")
    try:
        await host.connect(["p"])
        task = (await submit(tasks_stub(ops))).task
        watch: Any = progress_service_pb2_grpc.ProgressServiceStub(ops).WatchProgress(
            progress_service_pb2.WatchProgressRequest(task_id=task.task_id)
        )
        assert (await watch.read()).snapshot
        a = (await host.next("assignment")).assignment
        async with channel(server.address, pki_dir, "host-h1") as ch:
            planner: Any = planner_service_pb2_grpc.PlannerServiceStub(ch)
            await planner.Decide(
                planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation_from_scene(scenes.launcher()),
                )
            )
        await host.send(renewal(a))
        await host.next("renewed")
        await host.send(result(a))
        await host.next("result_ack")
        await server.stop(0.5)  # the watch and the host's stream are still open
    finally:
        await host.close()
        await ops.close()
        await server.stop(0.5)
    return {
        **_refs(server),
        "scripted host": weakref.ref(host),
        "its channel": weakref.ref(host._channel),
    }


def _alive(refs: dict[str, weakref.ref[Any]]) -> list[str]:
    return [name for name, ref in refs.items() if ref() is not None]


async def test_a_stopped_replica_is_freed_without_the_cycle_collector(
    make_settings: Any, no_cycle_collector: None
) -> None:
    refs = await _start_and_stop(make_settings())
    assert _alive(refs) == []


async def test_a_replica_that_served_calls_is_freed_without_the_cycle_collector(
    make_settings: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch, no_cycle_collector: None
) -> None:
    """The engine is left out here: grpc's own per-call objects (the method lookup's closure,
    an aborted call's state and its exception) are cycles that hold the servicers, and
    through them the store, until the collector runs; nothing of the replica can break them."""
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    monkeypatch.delenv("AMC_PLANNER_MODE", raising=False)
    refs = await _serve_and_stop(make_settings(), pki_dir)
    del refs["engine"]
    assert _alive(refs) == []


async def test_a_start_that_fails_stops_what_it_began(db_url: str, make_settings: Any) -> None:
    """A database whose dispatch holds' table is gone, migrations off: the deny-list is read
    and the event bus starts (LISTEN on PostgreSQL) before the table is found missing. The
    bus's tasks and the pool's connections were left behind the failed start. (A database at
    an older migration is refused before anything starts now: tests/faults/
    test_schema_versions.py.)"""
    store = Store.from_url(db_url)
    async with store.write() as session:
        await session.execute(text("DROP TABLE dispatch_holds"))
    await store.close()
    before = asyncio.all_tasks()
    server = await build_server(make_settings(migrate_on_start=False))
    with pytest.raises(DBAPIError, match="dispatch_holds"):
        await server.start()
    assert [t.get_name() for t in asyncio.all_tasks() - before if not t.done()] == []
    pool = server.store.engine.pool
    assert isinstance(pool, QueuePool)
    assert pool.checkedin() == 0


async def test_a_replica_refused_for_a_taken_port_leaves_nothing_behind(
    db_url: str, make_settings: Any, no_cycle_collector: None
) -> None:
    """The port is held by another socket. The refusal came after the store, the event bus and
    the lease manager were made, and nobody can stop a replica that was never returned: they
    waited for the cycle collector. The address is checked before anything is opened now."""
    with socket.create_server(("127.0.0.1", 0)) as held:
        address = f"127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(SettingError, match=f"cannot listen on {address}"):
            await build_server(make_settings(listen_address=address))
    assert _stores_of(db_url) == []


async def test_a_replica_refused_for_openai_scoring_without_a_key_leaves_nothing_behind(
    db_url: str,
    make_settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    no_cycle_collector: None,
) -> None:
    """As the taken port: the embedder was made (and refused) after the store, the event bus
    and the lease manager."""
    for name in ("AMC_PLANNER_OPENAI_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SettingError, match="openai embeddings need the planner's OpenAI key"):
        await build_server(make_settings(flow_scorer="openai"))
    assert _stores_of(db_url) == []


def _stores_of(db_url: str) -> list[Store]:
    """The stores still in memory on the database at `db_url` (a scan: the refused replica
    was never returned, so there is nothing to hold a weak reference to)."""
    database = make_url(db_url).database
    stores = [o for o in gc.get_objects() if isinstance(o, Store)]
    return [s for s in stores if s.engine.url.database == database]


async def test_a_stop_step_the_database_fails_is_logged_without_the_driver_text(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A step of the stop that the database fails (here the replica's presence lock, released
    on its own connection) was logged with its traceback and the driver's text (the database's
    host and port); it is one scrubbed line now, and the stop still raises its first failure.
    The failure is injected into the step (a real lost connection cannot be made to fail at
    exactly that moment here)."""
    server = await build_server(make_settings())
    await server.start()

    async def lost() -> None:
        raise OperationalError("SELECT pg_advisory_unlock_all()", {}, OSError(DRIVER_TEXT))

    release = server.presence.release
    monkeypatch.setattr(server.presence, "release", lost)
    try:
        with pytest.raises(OperationalError):
            await server.stop(0.5)
    finally:
        await release()  # the lock's own connection (PostgreSQL), left open by the failed step
    text = logged_text(caplog)
    assert "stopping the replica: lost failed: database unavailable" in text
    assert "db.internal" not in text and "6543" not in text
