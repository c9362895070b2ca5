"""Real cloud replicas (mTLS; SQLite, and PostgreSQL for the fuzzers) shared by the abuse
tests, each run on its own thread."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc.v1 import lease_service_pb2, types_pb2
from cloud.settings import CloudSettings
from tests.cloud.cloud_harness import ScriptedHost, result
from tests.support import leaks
from tests.support.mtls import sync_channel
from tests.support.postgres import PostgresServer
from tests.support.processes import make_pki
from tests.support.server_thread import ServerThread

HOST_IDS = ["fuzz", "other", "a", "b", "decider", "shipper", "planner"]


@dataclass
class AbuseCloud:
    server: ServerThread
    pki_dir: Path

    @property
    def address(self) -> str:
        return self.server.address

    def channel(self, identity: str | None) -> grpc.Channel:
        return sync_channel(self.address, self.pki_dir, identity)

    def assert_serving(self) -> None:
        """The replica still answers: health SERVING over a fresh connection."""
        with self.channel("operator-ops") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="session")
def abuse_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("abuse-pki") / "pki", HOST_IDS)


def _serve(database_url: str, pki_dir: Path) -> ServerThread:
    settings = CloudSettings(
        database_url=database_url,
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        default_lease_seconds=5.0,
        min_lease_seconds=0.5,
        sweep_interval_seconds=0.2,
        dispatch_interval_seconds=0.5,
        host_heartbeat_seconds=1.0,
        shutdown_grace_seconds=0.5,
    )
    thread = ServerThread(settings).start()
    leaks.keep_for_the_session(thread.server)
    return thread


@pytest.fixture(scope="session")
def abuse_cloud(tmp_path_factory: pytest.TempPathFactory, abuse_pki: Path) -> Iterator[AbuseCloud]:
    """The replica on SQLite."""
    base = tmp_path_factory.mktemp("abuse-cloud")
    server = _serve(f"sqlite+aiosqlite:///{base / 'cloud.sqlite3'}", abuse_pki)
    try:
        yield AbuseCloud(server, abuse_pki)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def abuse_cloud_postgres(postgres_session: PostgresServer, abuse_pki: Path) -> Iterator[AbuseCloud]:
    """The replica on PostgreSQL, which refuses what SQLite stores (NUL in text, over-long
    varchars), so text fuzzing runs here too (only for tests marked `postgres`: the
    `any_abuse_cloud` parameter that asks for it carries the mark)."""
    server = _serve(postgres_session.create_database(), abuse_pki)
    try:
        yield AbuseCloud(server, abuse_pki)
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_abuse_cloud(request: pytest.FixtureRequest) -> AbuseCloud:
    """The abuse replica on each backend in turn."""
    name = "abuse_cloud" if request.param == "sqlite" else "abuse_cloud_postgres"
    cloud: AbuseCloud = request.getfixturevalue(name)
    return cloud


async def assigned(host: ScriptedHost, task_id: str) -> lease_service_pb2.Assignment:
    """`task_id`'s assignment to `host`, ending (failed) any other test's task the session's
    cloud offers first: skipped and held, it kept the phone busy for its whole lease, and the
    task wanted never came."""
    while True:
        message = await host.next()
        if message.WhichOneof("kind") != "assignment":
            continue
        if message.assignment.task_id == task_id:
            return message.assignment
        await host.send(result(message.assignment, types_pb2.TASK_STATUS_FAILED, "left over"))


def first_said(call: Any) -> grpc.RpcError | None:
    """A server stream's first message (fine) or its refusal; a live stream that said nothing
    before its deadline is fine too (the fuzzers' accepted streams, read after their last
    example so that their deadlines run out side by side). The call is cancelled after."""
    try:
        next(iter(call), None)
    except grpc.RpcError as err:
        return None if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED else err
    finally:
        call.cancel()
    return None
