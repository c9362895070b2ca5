"""One real cloud replica (mTLS, SQLite) shared by the abuse tests, run on its own thread."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud.settings import CloudSettings
from tests.support.processes import make_pki
from tests.support.server_thread import ServerThread, sync_channel

HOST_IDS = ["fuzz", "other", "a", "b", "decider"]


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
def abuse_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AbuseCloud]:
    base = tmp_path_factory.mktemp("abuse-cloud")
    pki_dir = make_pki(base / "pki", HOST_IDS)
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{base / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        default_lease_seconds=5.0,
        min_lease_seconds=0.5,
        sweep_interval_seconds=0.2,
        dispatch_interval_seconds=0.5,
        host_heartbeat_seconds=1.0,
        shutdown_grace_seconds=0.5,
    )
    server = ServerThread(settings).start()
    try:
        yield AbuseCloud(server, pki_dir)
    finally:
        server.stop()
