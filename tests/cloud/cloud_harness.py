"""Test helpers for the cloud: mTLS channels from a PKI directory and a scripted host."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import event, text, update
from sqlalchemy import exc as sa_exc

from amc.v1 import (
    lease_service_pb2 as lease_pb,
)
from amc.v1 import (
    lease_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from cloud.store import tasks
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.models import AttemptRow, TaskRow
from tests.support.mtls import channel_credentials


@contextlib.asynccontextmanager
async def started(settings: CloudSettings, grace: float = 0.5) -> AsyncIterator[CloudServer]:
    """A started replica for `settings`, stopped on exit, also when the block (or its own
    start) fails."""
    server = await build_server(settings)
    try:
        await server.start()
        yield server
    finally:
        await server.stop(grace)


@contextlib.asynccontextmanager
async def start_replicas(
    url: str, pki_dir: Path, count: int = 2, **overrides: Any
) -> AsyncIterator[list[CloudServer]]:
    """`count` started cloud replicas sharing the database at `url`, stopped on exit: every
    one that was built, even when another's start or stop failed."""
    values: dict[str, Any] = {
        "database_url": url,
        "listen_address": "127.0.0.1:0",
        "pki_dir": pki_dir,
        "sweep_interval_seconds": 0.2,
        "dispatch_interval_seconds": 0.5,
        "shutdown_grace_seconds": 0.5,
        **overrides,
    }
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(started(CloudSettings(**values))) for _ in range(count)
        ]


def channel(address: str, pki_dir: Path, identity: str | None) -> grpc.aio.Channel:
    """mTLS channel presenting `identity` ("host-h1", "operator-ops") or no client certificate."""
    return grpc.aio.secure_channel(address, channel_credentials(pki_dir, identity))


def tasks_stub(ch: grpc.aio.Channel) -> Any:
    return task_service_pb2_grpc.TaskServiceStub(ch)


def device(serial: str) -> types_pb2.Device:
    return types_pb2.Device(serial=serial, model="sim", state=types_pb2.DEVICE_STATE_ONLINE)


def hello(
    serials: list[str],
    held: list[lease_pb.HeldAssignment] | None = None,
    process_id: str = "",
    transport: types_pb2.PlannerTransport.ValueType = types_pb2.PLANNER_TRANSPORT_CLOUD,
    outbox: types_pb2.OutboxBacklog | None = None,
) -> lease_pb.LeaseRequest:
    return lease_pb.LeaseRequest(
        hello=lease_pb.HostHello(
            devices=[device(s) for s in serials],
            agent_version="sim/1",
            planner_transport=transport,
            held_assignments=held or [],
            process_id=process_id,
            outbox=outbox,
        )
    )


def renewal(
    a: lease_pb.Assignment,
    step: int = 1,
    summary: str = "working",
    status: types_pb2.StepStatus.ValueType = types_pb2.STEP_STATUS_ACTING,
) -> lease_pb.LeaseRequest:
    return lease_pb.LeaseRequest(
        renewal=lease_pb.LeaseRenewal(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            progress=types_pb2.Progress(step_index=step, step_status=status, summary=summary),
        )
    )


def result(
    a: lease_pb.Assignment,
    status: types_pb2.TaskStatus.ValueType = types_pb2.TASK_STATUS_SUCCEEDED,
    summary: str = "done",
    step: int = 3,
) -> lease_pb.LeaseRequest:
    return lease_pb.LeaseRequest(
        result=lease_pb.TaskResult(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            status=status,
            summary=summary,
            final_progress=types_pb2.Progress(
                step_index=step, step_status=types_pb2.STEP_STATUS_SUCCEEDED, summary=summary
            ),
        )
    )


class ScriptedHost:
    """One host stream driven step by step by a test."""

    def __init__(self, address: str, pki_dir: Path, host_id: str, *, identity: str | None = None):
        self.host_id = host_id
        self._channel = channel(address, pki_dir, identity or f"host-{host_id}")
        self._stub = lease_service_pb2_grpc.LeaseServiceStub(self._channel)
        self.call: Any = None
        self.inbox: asyncio.Queue[lease_pb.LeaseResponse | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self.error: grpc.aio.AioRpcError | None = None

    async def connect(
        self,
        serials: list[str],
        held: list[lease_pb.HeldAssignment] | None = None,
        process_id: str = "",
        transport: types_pb2.PlannerTransport.ValueType = types_pb2.PLANNER_TRANSPORT_CLOUD,
        outbox: types_pb2.OutboxBacklog | None = None,
    ) -> lease_pb.Welcome:
        self.call = self._stub.Lease()
        try:
            await self.call.write(hello(serials, held, process_id, transport, outbox))
        except grpc.aio.AioRpcError as exc:  # refused before the hello went out
            # A write that races the server ending the call fails with the transport's own
            # error ("Internal error from Core"); the call's status is what the server said.
            self.error = exc
            async with asyncio.timeout(10):
                code, details = await self.call.code(), await self.call.details()
            raise AssertionError(f"stream ended: {code} {details} ({exc})") from exc
        self._reader = asyncio.create_task(self._read())
        msg = await self.next("welcome")
        return msg.welcome

    async def refusal(self, wait: float = 10.0) -> grpc.aio.AioRpcError:
        """Open the stream, write nothing, and return the status the server refused it with.

        A refusal (revoked certificate, wrong caller kind) ends the call before the server reads
        anything, so a test that writes the hello first races it: a write that loses fails with
        the transport's INTERNAL "Internal error from Core", and grpc-python then reports that as
        the call's status in place of the server's.
        """
        self.call = self._stub.Lease()
        try:
            async with asyncio.timeout(wait):
                msg = await self.call.read()
        except grpc.aio.AioRpcError as exc:
            return exc
        raise AssertionError(f"stream not refused: read {msg!r}")

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.call.read()
                if msg is grpc.aio.EOF:
                    break
                await self.inbox.put(msg)
        except grpc.aio.AioRpcError as exc:
            # Kept without its traceback, whose frames hold this host (and its closed channel
            # and call): a cycle the collector would free later, on another test's loop.
            self.error = exc.with_traceback(None)
        finally:
            await self.inbox.put(None)

    async def send(self, req: lease_pb.LeaseRequest) -> None:
        await self.call.write(req)

    async def ended(self, wait: float = 10.0) -> grpc.aio.AioRpcError | None:
        """Wait for the stream to end; the status it ended with (None: OK)."""
        async with asyncio.timeout(wait):
            while await self.inbox.get() is not None:
                pass
        return self.error

    async def next(self, kind: str | None = None, wait: float = 10.0) -> lease_pb.LeaseResponse:
        """The next message (asserting its kind when given)."""
        msg = await asyncio.wait_for(self.inbox.get(), wait)
        if msg is None:
            raise AssertionError(f"stream ended: {self.error}")
        if kind is not None:
            assert msg.WhichOneof("kind") == kind, msg
        return msg

    async def __aenter__(self) -> ScriptedHost:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.call is not None:
            with contextlib.suppress(Exception):
                await self.call.done_writing()
            self.call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        await self._channel.close()


class AutoHost:
    """A simulated host that runs every assignment: renew with progress, then succeed."""

    def __init__(
        self,
        address: str,
        pki_dir: Path,
        host_id: str,
        serials: list[str],
        on_done: Callable[[str, str, int], None],
    ) -> None:
        self.host = ScriptedHost(address, pki_dir, host_id)
        self.serials = serials
        self.on_done = on_done
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.host.connect(self.serials)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            msg = await self.host.inbox.get()
            if msg is None:
                return
            if msg.WhichOneof("kind") == "assignment":
                a = msg.assignment
                await self.host.send(renewal(a, 1, "step one"))
                await self.host.send(result(a))
            elif msg.WhichOneof("kind") == "result_ack":
                ack = msg.result_ack
                if not ack.duplicate:
                    self.on_done(self.host.host_id, ack.task_id, ack.attempt)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.host.close()


async def submit(
    stub: Any, goal: str = "Turn on dark theme", **kwargs: Any
) -> task_service_pb2.SubmitTaskResponse:
    response: task_service_pb2.SubmitTaskResponse = await stub.SubmitTask(
        task_service_pb2.SubmitTaskRequest(goal=goal, **kwargs)
    )
    return response


async def assigned(
    ops: grpc.aio.Channel,
    host: ScriptedHost,
    goal: str = "open settings",
    transport: types_pb2.PlannerTransport.ValueType = types_pb2.PLANNER_TRANSPORT_CLOUD,
) -> lease_pb.Assignment:
    """`host` connected with one phone and handed a task submitted for it: where a test of what
    a host may send under a live lease starts."""
    await host.connect([f"{host.host_id}-phone"], transport=transport)
    submitted = await tasks_stub(ops).SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            goal=goal, target=types_pb2.TaskTarget(host_id=host.host_id)
        )
    )
    assignment: lease_pb.Assignment = (await host.next("assignment")).assignment
    assert assignment.task_id == submitted.task.task_id
    return assignment


async def lapse(
    store: Store, task_id: str, attempt: int | None = None, *, ago: float = 1.0
) -> None:
    """The lease of `task_id` (that attempt, or every one) runs out now (it ran out `ago`
    seconds before).

    Tests that need a lease to end hold a long one and end it here, instead of a lease of a
    second or two: a loaded machine can stall that long, and a short lease would then run out
    in the steps before the one the test is about. A test of a host that has been silent since
    its lease ran out (frozen) passes `ago=0`: a lease run out before the host's last message
    is a live host's.
    """
    where = [AttemptRow.task_id == task_id]
    if attempt is not None:
        where.append(AttemptRow.attempt == attempt)
    async with store.write() as db:
        await db.execute(
            update(AttemptRow)
            .where(*where)
            .values(lease_expires_at=store.now() - dt.timedelta(seconds=ago))
        )


async def due(store: Store, task_id: str) -> None:
    """The deadline of `task_id` is now (`lapse`'s reasoning, for deadlines)."""
    async with store.write() as db:
        await db.execute(
            update(TaskRow).where(TaskRow.task_id == task_id).values(deadline=store.now())
        )


async def wait_status(stub: Any, task_id: str, status: int, within: float = 10.0) -> Any:
    """Poll GetTask until the task has `status` (no fixed sleeps; fails after `within`)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        task = (await stub.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))).task
        if task.status == status:
            return task
        if loop.time() > end:
            raise AssertionError(f"task {task_id} stuck in {task.status}, wanted {status}")
        await asyncio.sleep(0.05)


def count_reloads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """From now on, the ids of every `tasks.load_views` call (a watcher's reload), in order.
    The wrapper only counts: every call still reads the store."""
    reloads: list[list[str]] = []
    load_views = tasks.load_views

    async def counted(store: Store, ids: list[str], *, usage: bool = True) -> list[tasks.TaskView]:
        reloads.append(list(ids))
        return await load_views(store, ids, usage=usage)

    monkeypatch.setattr(tasks, "load_views", counted)
    return reloads


#: What a driver's message says when the database goes away: its host and port.
DRIVER_TEXT = 'connection to server at "db.internal" (10.0.0.7), port 6543 failed'


@contextlib.contextmanager
def failing_statements(store: Store, starts: str) -> Iterator[None]:
    """Every statement of `store` whose SQL starts with `starts` fails as a database that went
    away fails: SQLAlchemy's OperationalError carrying the driver's text (`DRIVER_TEXT`)."""

    def fail(_c: object, _cur: object, statement: str, params: Any, *_a: object) -> None:
        if statement.lstrip().startswith(starts):
            raise sa_exc.OperationalError(statement, params, OSError(DRIVER_TEXT))

    engines = [store.engine.sync_engine]
    if store.loop_connection is not None:
        engines.append(store.loop_connection)
    for engine in engines:
        event.listen(engine, "before_cursor_execute", fail)
    try:
        yield
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", fail)


def logged_text(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the cloud logged: messages and, when a record has one, its exception's
    text and traceback."""
    formatter = logging.Formatter()
    return "\n".join(
        r.getMessage() + (formatter.formatException(r.exc_info) if r.exc_info else "")
        for r in caplog.records
        if r.name.split(".")[0] == "cloud"
    )


async def table_names(s: Store) -> set[str]:
    """The tables in `s`'s database, from each backend's catalogue (for migrations that add
    one: its round trip reads the names before, after and after the downgrade)."""
    catalogue = text(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        if s.is_postgres
        else "SELECT name FROM sqlite_master WHERE type = 'table'"
    )
    async with s.engine.connect() as conn:
        return {str(name) for (name,) in await conn.execute(catalogue)}


async def columns_added(db_url: str, table: str, before: str, revision: str) -> set[str]:
    """The columns migration `revision` adds to `table`, once its downgrade to `before` is seen
    to leave the table as it was and the head schema to match the models again: the round trip
    every additive migration owes both backends. Read from each backend's catalogue: SQLite's
    reflection warns about the expression index of 0015."""
    s = Store.from_url(db_url)
    catalogue = text(
        "SELECT column_name FROM information_schema.columns WHERE table_name = :t"
        if s.is_postgres
        else "SELECT name FROM pragma_table_info(:t)"
    )

    async def columns() -> set[str]:
        async with s.engine.connect() as conn:
            return {str(name) for (name,) in await conn.execute(catalogue, {"t": table})}

    try:
        await upgrade(s.engine, before)
        old = await columns()
        await upgrade(s.engine, revision)
        added = await columns() - old
        await downgrade(s.engine, before)
        assert await columns() == old, f"{revision}'s downgrade left {table} changed"
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()
    return added
