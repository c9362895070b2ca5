"""The boundary every RPC crosses (`cloud.wire`, `cloud.boundary`), over real mTLS gRPC.

Proves, on SQLite and PostgreSQL: a NUL in a text field is INVALID_ARGUMENT naming the field
(unary RPCs and the Lease stream, at any depth), request bytes that do not parse are
INVALID_ARGUMENT (naming the field when it holds invalid UTF-8), a result whose summary holds
NULs or is too long is recorded sanitised, not refused; a servicer's unexpected failure is
INTERNAL with a generic message, never UNKNOWN with Python's text; and, with the database down
(a private PostgreSQL stopped and started again), calls get UNAVAILABLE "the cloud's database
is unavailable; retry", health says NOT_SERVING until the database is back, and neither the
status details nor the log carry driver text, SQL, parameters, host or port.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import select

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import task_service_pb2, types_pb2
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from cloud.store import tasks
from cloud.store.models import AttemptRow
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    hello,
    renewal,
    result,
    submit,
    wait_status,
)
from tests.support.restartable_postgres import RestartablePostgres, restartable_postgres
from tests.support.waiting import until

UNAVAILABLE = "the cloud's database is unavailable; retry"
SUBMIT = "/amc.v1.TaskService/SubmitTask"


async def _raw(ch: grpc.aio.Channel, path: str, raw: bytes) -> grpc.aio.AioRpcError:
    """Send `raw` as the request bytes of a unary RPC; return the refusal."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ch.unary_unary(path)(raw, timeout=10)
    return err.value


async def test_nul_in_a_text_field_is_invalid_argument_naming_it(
    cloud: CloudServer, ops: Any
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(ops, goal="a\x00")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "goal: NUL characters are not allowed"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(ops, goal="fine", target=types_pb2.TaskTarget(host_id="h\x00"))
    assert err.value.details() == "target.host_id: NUL characters are not allowed"
    # Nothing was stored, and the next call works.
    assert (await submit(ops, goal="Turn on dark theme")).task.goal == "Turn on dark theme"
    listed = await ops.ListTasks(task_service_pb2.ListTasksRequest())
    assert [t.goal for t in listed.tasks] == ["Turn on dark theme"]


async def test_undecodable_bytes_are_invalid_argument(cloud: CloudServer, pki_dir: Path) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        garbage = await _raw(ch, SUBMIT, b"\xff\xff\xff\xff")
        assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert garbage.details() == "request: not a valid amc.v1.SubmitTaskRequest message"
        # Field 1 (goal), length 2, bytes that are not UTF-8.
        bad_text = await _raw(ch, SUBMIT, b"\x0a\x02\xc3\x28")
        assert bad_text.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_text.details() == "goal: not valid UTF-8"
    finally:
        await ch.close()


async def test_lease_stream_answers_malformed_messages_in_stream(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    ch = channel(cloud.address, pki_dir, "host-h1")
    call: Any = ch.stream_stream("/amc.v1.LeaseService/Lease")()
    try:
        await call.write(b"\xff\xff")  # not a LeaseRequest
        first = lease_pb.LeaseResponse.FromString(await call.read())
        assert first.rejected.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert first.rejected.message == "request: not a valid amc.v1.LeaseRequest message"
        bad = hello(["p1"])
        bad.hello.process_id = "p\x00"  # an id (the agent version is a report: mended)
        await call.write(bad.SerializeToString())
        second = lease_pb.LeaseResponse.FromString(await call.read())
        assert second.rejected.message == "hello.process_id: NUL characters are not allowed"
        bad = hello(["p1", "p\x002"])
        await call.write(bad.SerializeToString())
        third = lease_pb.LeaseResponse.FromString(await call.read())
        assert third.rejected.message == "hello.devices[1].serial: NUL characters are not allowed"
        # The stream is still up: a good hello is welcomed and work follows.
        await call.write(hello(["p1"]).SerializeToString())
        welcome = lease_pb.LeaseResponse.FromString(await call.read())
        assert welcome.welcome.host_id == "h1"
        task = (await submit(ops)).task
        assignment = lease_pb.LeaseResponse.FromString(await call.read()).assignment
        assert assignment.task_id == task.task_id
    finally:
        call.cancel()
        await ch.close()


async def test_a_result_summary_is_sanitised_never_refused(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p1", "p2"])
        nul_task = (await submit(ops, goal="one")).task
        long_task = (await submit(ops, goal="two")).task
        got = {}
        for _ in range(2):
            a = (await host.next("assignment")).assignment
            got[a.task_id] = a
        await host.send(result(got[nul_task.task_id], summary="done\x00 with a NUL"))
        ack = (await host.next("result_ack")).result_ack
        assert (ack.task_id, ack.duplicate) == (nul_task.task_id, False)
        await host.send(result(got[long_task.task_id], summary="x" * 5000))
        ack = (await host.next("result_ack")).result_ack
        assert ack.task_id == long_task.task_id
        done = await wait_status(ops, nul_task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        assert done.result_summary == "done\ufffd with a NUL"
        done = await wait_status(ops, long_task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        assert len(done.result_summary) == 2000 and done.result_summary.endswith("…")
        async with cloud.store.read() as session:
            summaries = set(
                (
                    await session.scalars(
                        select(AttemptRow.summary).where(AttemptRow.task_id == nul_task.task_id)
                    )
                ).all()
            )
        assert summaries == {"done\ufffd with a NUL"}  # the final progress's summary too
    finally:
        await host.close()


async def test_an_unexpected_failure_is_internal_without_its_text(
    cloud: CloudServer, ops: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a secret detail")

    monkeypatch.setattr(tasks, "get", broken)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.GetTask(task_service_pb2.GetTaskRequest(task_id="t1"))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == "internal error; retry later (the cloud logged it)"
    # The cloud's own log keeps the traceback (a bug, not a database error).
    assert any("a secret detail" in r.getMessage() or r.exc_info for r in caplog.records)


# ---- the database goes away ------------------------------------------------------------------


@pytest.fixture
def private_pg() -> Iterator[RestartablePostgres]:
    with restartable_postgres() as pg:
        yield pg


@pytest.fixture
async def pg_cloud(private_pg: RestartablePostgres, pki_dir: Path) -> AsyncIterator[CloudServer]:
    url = private_pg.server.url("postgres")
    server = await build_server(
        CloudSettings(
            database_url=url,
            listen_address="127.0.0.1:0",
            pki_dir=pki_dir,
            database_probe_interval_seconds=0.2,
            sweep_interval_seconds=0.2,
            shutdown_grace_seconds=0.5,
        )
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


async def _health(ch: grpc.aio.Channel) -> int:
    stub: Any = health_pb2_grpc.HealthStub(ch)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    return int(reply.status)


async def _health_becomes(ch: grpc.aio.Channel, status: int) -> None:
    async def reached() -> bool:
        return await _health(ch) == status

    await until(reached, what=f"health {status}")


@pytest.mark.postgres
async def test_database_down_is_unavailable_and_not_serving_until_it_is_back(
    pg_cloud: CloudServer,
    private_pg: RestartablePostgres,
    pki_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    ch = channel(pg_cloud.address, pki_dir, "operator-ops")
    from tests.cloud.cloud_harness import tasks_stub

    ops = tasks_stub(ch)
    host = ScriptedHost(pg_cloud.address, pki_dir, "h1")
    secret_goal = "goal-that-must-not-be-logged-7731"
    try:
        await host.connect(["p1"])
        assert await _health(ch) == health_pb2.HealthCheckResponse.SERVING
        task = (await submit(ops, goal="before the outage")).task
        a = (await host.next("assignment")).assignment

        private_pg.stop()
        refusals: list[grpc.aio.AioRpcError] = []
        for call in (
            lambda: submit(ops, goal=secret_goal),
            lambda: ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id)),
            lambda: ops.ListTasks(task_service_pb2.ListTasksRequest(query=secret_goal)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call()
            refusals.append(err.value)
        for refusal in refusals:
            assert (refusal.code(), refusal.details()) == (grpc.StatusCode.UNAVAILABLE, UNAVAILABLE)
        # In-stream: the host's result is refused as retryable, with the same words.
        await host.send(result(a, summary=secret_goal))
        rejected = (await host.next("rejected")).rejected
        assert (rejected.code, rejected.message, rejected.task_id) == (
            grpc.StatusCode.UNAVAILABLE.value[0],
            UNAVAILABLE,
            task.task_id,  # which of the host's results to send again
        )
        # A renewal too (its batch fails as a whole), and the failure is logged without the
        # driver's text like every other.
        await host.send(renewal(a, summary=secret_goal))
        rejected = (await host.next("rejected")).rejected
        assert (rejected.code, rejected.message) == (
            grpc.StatusCode.UNAVAILABLE.value[0],
            UNAVAILABLE,
        )
        await _health_becomes(ch, health_pb2.HealthCheckResponse.NOT_SERVING)

        private_pg.start()
        await _health_becomes(ch, health_pb2.HealthCheckResponse.SERVING)
        await host.send(result(a, summary="after the outage"))
        assert (await host.next("result_ack")).result_ack.task_id == task.task_id
        assert (await submit(ops, goal="after the outage")).task.goal == "after the outage"
    finally:
        await host.close()
        await ch.close()
    # What the cloud, SQLAlchemy and psycopg logged (at DEBUG aiosqlite logs every statement of
    # any SQLite store in this process, other tests' included: a third party's debug output).
    logged = "\n".join(
        r.getMessage() + (str(r.exc_info[1]) if r.exc_info else "")
        for r in caplog.records
        if r.name.split(".")[0] in ("cloud", "sqlalchemy", "psycopg", "grpc")
    )
    assert "database probe failed; health NOT_SERVING" in logged
    assert "database reachable again; health SERVING" in logged
    for leak in (secret_goal, str(private_pg.port), "SELECT", "INSERT", "connection to server"):
        assert leak not in logged, leak


@pytest.mark.postgres
async def test_the_cli_says_the_cloud_is_up_and_its_database_is_not(
    pg_cloud: CloudServer, private_pg: RestartablePostgres, pki_dir: Path
) -> None:
    """An operator's `amc task list` while the cloud's PostgreSQL is down (restarting, failed
    over). Before, it read "cannot reach the cloud at …: the cloud's database is unavailable;
    retry (is it running? `amc up` starts one on this machine; point at another with --cloud
    …)": the cloud had answered, and the hint sent the operator to start or look for another
    cloud in the middle of a database incident."""
    from console import exit_codes
    from tests.console.test_cli_scripts import amc

    conn = ["--cloud", pg_cloud.address, "--pki-dir", str(pki_dir), "--operator", "ops"]
    private_pg.stop()
    ran = await amc(*conn, "task", "list")
    assert ran.code == exit_codes.CLOUD, ran
    assert ran.err == (
        f"amc task list: the cloud at {pg_cloud.address} answered, but it is waiting for the "
        "cloud's database (try again once the database is back; the cloud's health check says "
        "NOT_SERVING until then)\n"
    ), ran
