"""Fixtures: one real cloud (mTLS, SQLite) and one real console gateway (uvicorn) per session.

Tests stay independent by giving every simulated host its own id and pinning each task they
submit to that host, so no test's task can be handed to another test's host.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from amc.v1 import types_pb2
from cloud import pki as cloud_pki
from cloud.server import build_server
from cloud.settings import CloudSettings
from console.gateway import create_app
from console.settings import ConsoleSettings
from tests.console.console_stack import (
    ADMIN,
    API_TOKEN,
    PASSWORD,
    VIEWER,
    VIEWER_PASSWORD,
    VIEWER_TOKEN,
    Cloud,
    HostFactory,
    Operator,
    SimHost,
    UvicornThread,
)
from tests.support import leaks
from tests.support.loop_thread import LoopThread


@pytest.fixture(scope="session")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    cloud_pki.init_ca(directory)
    cloud_pki.write_server_cert(directory)
    cloud_pki.write_operator_cert(directory, "console")
    cloud_pki.write_operator_cert(directory, "tester")
    return directory


@pytest.fixture(scope="session")
def cloud(tmp_path_factory: pytest.TempPathFactory, pki_dir: Path) -> Iterator[Cloud]:
    """The real cloud server (every service, offline planner) on 127.0.0.1 port 0."""
    data = tmp_path_factory.mktemp("cloud")
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{data / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        dispatch_interval_seconds=0.1,
        sweep_interval_seconds=0.2,
        default_lease_seconds=60,
    )
    loop = LoopThread("cloud")
    server = loop.run(build_server(settings))
    loop.run(server.start())
    leaks.keep_for_the_session(server)
    try:
        yield Cloud(address=server.address, pki=pki_dir, server=server, loop=loop)
    finally:
        loop.run(server.stop(0))
        loop.stop()


@pytest.fixture(scope="session")
def console_settings(cloud: Cloud) -> ConsoleSettings:
    return ConsoleSettings(
        cloud_address=cloud.address,
        certs_dir=cloud.pki,
        operator_name="console",
        admin_username=ADMIN,
        admin_password=PASSWORD,
        api_token=API_TOKEN,
        viewer_username=VIEWER,
        viewer_password=VIEWER_PASSWORD,
        viewer_api_token=VIEWER_TOKEN,
        session_secret="test-session-secret-0123456789",
    )


@pytest.fixture(scope="session")
def gateway(console_settings: ConsoleSettings) -> Iterator[str]:
    """Base URL of the console served by a real uvicorn server in a thread."""
    server = UvicornThread(create_app(console_settings))
    base = server.start()
    try:
        yield base
    finally:
        server.stop()


@pytest.fixture(scope="session")
def operator(cloud: Cloud) -> Iterator[Operator]:
    """Direct gRPC operator calls, for setting up what the console should then show."""
    op = Operator(cloud.address, cloud.pki, "tester")
    try:
        yield op
    finally:
        op.close()


@pytest.fixture
def make_host(cloud: Cloud) -> Iterator[HostFactory]:
    """Connect simulated hosts (fresh id and certificate each); closed after the test."""
    hosts: list[SimHost] = []

    def make(
        transport: types_pb2.PlannerTransport.ValueType = types_pb2.PLANNER_TRANSPORT_CLOUD,
    ) -> SimHost:
        host_id = f"sim-{uuid.uuid4().hex[:8]}"
        cloud_pki.write_host_cert(cloud.pki, host_id)
        host = SimHost(cloud.address, cloud.pki, host_id, transport=transport)
        hosts.append(host)
        host.connect()
        return host

    try:
        yield make
    finally:
        for host in hosts:
            host.close()


@pytest.fixture
def api(gateway: str) -> Iterator[httpx.Client]:
    """An httpx client on the console's API with the bearer token."""
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.Client(base_url=gateway, headers=headers, timeout=20) as client:
        yield client


@pytest.fixture
def anon(gateway: str) -> Iterator[httpx.Client]:
    """An httpx client with no credentials (cookies kept, redirects not followed)."""
    with httpx.Client(base_url=gateway, timeout=20) as client:
        yield client
