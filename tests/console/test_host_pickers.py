"""The console's pages at fleet scale: a render reads a page of hosts, not the fleet."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cloud import pki as cloud_pki
from cloud.server import build_server
from cloud.settings import CloudSettings
from console.gateway import create_app
from console.gateway.pages import PICKER
from console.settings import ConsoleSettings
from tests.console.console_stack import (
    ADMIN,
    PASSWORD,
    Cloud,
    Operator,
    SimHost,
    UvicornThread,
)
from tests.console.test_pages import log_in
from tests.support.fleet_rows import loaded_hosts, register
from tests.support.loop_thread import LoopThread

#: Registered hosts: a few hundred.
FLEET = 300


@dataclass
class Stack:
    cloud: Cloud
    base: str


@pytest.fixture
def fleet_stack(tmp_path: Path, pki_dir: Path) -> Iterator[Stack]:
    """A cloud of its own with FLEET hosts registered, and a console on it: the session's
    cloud is shared with tests that page through every host."""
    settings = CloudSettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        dispatch_interval_seconds=0.1,
        sweep_interval_seconds=0.2,
        default_lease_seconds=60,
    )
    loop = LoopThread("fleet-cloud")
    server = loop.run(build_server(settings))
    loop.run(server.start())
    try:
        loop.run(register(server, FLEET))
        console = ConsoleSettings(
            cloud_address=server.address,
            certs_dir=pki_dir,
            operator_name="console",
            admin_username=ADMIN,
            admin_password=PASSWORD,
            api_token="fleet-api-token-0123456789abcdef",
            session_secret="test-session-secret-0123456789",
        )
        gateway = UvicornThread(create_app(console))
        base = gateway.start()
        try:
            yield Stack(Cloud(server.address, pki_dir, server, loop), base)
        finally:
            gateway.stop()
    finally:
        loop.run(server.stop(0))
        loop.stop()


def test_a_render_reads_a_page_of_hosts_not_the_fleet(fleet_stack: Stack) -> None:
    """The tasks page, the submit page and a task's page each listed the whole fleet (every
    page of ListHosts) on every render, for a host picker and for the one host a task ran on:
    at fleet scale thousands of host rows per render, and the task page again on every live
    refresh. A picker now reads one page of suggestions, and a task's page its own hosts."""
    cloud = fleet_stack.cloud
    host_id = "zz-ran-here"
    cloud_pki.write_host_cert(cloud.pki, host_id)
    host = SimHost(cloud.address, cloud.pki, host_id)
    operator = Operator(cloud.address, cloud.pki, "tester")
    try:
        host.connect()
        task = operator.submit("open settings", host_id=host_id)
        host.assignment()
        with httpx.Client(base_url=fleet_stack.base, timeout=20) as client:
            log_in(client)
            for url, most in (
                ("/tasks", PICKER + 1),
                ("/tasks?host=fleet-01", PICKER + 1),
                ("/tasks/new", PICKER + 1),
                (f"/tasks/new?again={task.task_id}", PICKER + 1),
                (f"/tasks/{task.task_id}", 1),
            ):
                with loaded_hosts() as loaded:
                    page = client.get(url)
                assert page.status_code == 200, page.text
                assert len(loaded) <= most, f"{url} loaded {len(loaded)} host rows"
            tasks = client.get("/tasks?host=FLEET-001").text
            suggested = re.findall(r'<option value="([^"]+)"', tasks.split('id="host-ids"')[1])
            assert suggested == [f"fleet-{i:04d}" for i in range(10, 20)]
            detail = client.get(f"/tasks/{task.task_id}").text
            assert host_id in detail
    finally:
        operator.close()
        host.close()
