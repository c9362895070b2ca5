"""Revoking certificates (`amc certs revoke`, `cloud.revocations`), over real mTLS gRPC.

Proves, on SQLite and PostgreSQL: a revoked certificate's open streams (a host's Lease stream,
an operator's WatchProgress) end with UNAUTHENTICATED "certificate revoked (serial …)", its
next RPC and stream are refused the same way, other certificates are untouched, the revoked
host's leases are released at once, a revoked host id refuses every certificate of that host
(also one issued later), and lifting a revocation lets the certificate in again. On PostgreSQL
with two replicas: `amc certs revoke`, run as its own process against the database, reaches
both replicas at once through NOTIFY (their timed refresh is set to an hour, so nothing else
could explain it). The CLI's own behaviour (by file, serial or host; idempotent; a bad serial
refused) is checked as an operator runs it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import progress_service_pb2, progress_service_pb2_grpc, task_service_pb2, types_pb2
from cloud import pki, revocations
from cloud.server import CloudServer, build_server
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    start_replicas,
    submit,
    tasks_stub,
    wait_status,
)
from tests.cloud.conftest import SettingsFactory
from tests.support.migrated import migrated_sqlite_url
from tests.support.postgres import PostgresServer
from tests.support.processes import free_port
from tests.support.waiting import until

AMC = str(Path(sys.executable).with_name("amc"))


@pytest.fixture
async def fast_refresh_cloud(make_settings: SettingsFactory) -> AsyncIterator[CloudServer]:
    server = await build_server(
        make_settings(default_lease_seconds=120.0, revocation_refresh_seconds=0.2)
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


def _serial(pki_dir: Path, identity: str) -> str:
    return pki.serial_hex((pki_dir / f"{identity}.pem").read_bytes())


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    return err.value


async def test_a_revoked_certificate_is_refused_and_its_streams_dropped(
    fast_refresh_cloud: CloudServer, pki_dir: Path
) -> None:
    cloud = fast_refresh_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    ops = tasks_stub(ops_ch)
    revoked_host = ScriptedHost(cloud.address, pki_dir, "h3")
    other_host = ScriptedHost(cloud.address, pki_dir, "h4")
    watcher: Any = progress_service_pb2_grpc.ProgressServiceStub(ops_ch)
    try:
        await revoked_host.connect(["h3-phone"])
        task = (await submit(ops, target=types_pb2.TaskTarget(host_id="h3"))).task
        assert (await revoked_host.next("assignment")).assignment.task_id == task.task_id
        await other_host.connect(["h4-phone"])

        serial = _serial(pki_dir, "host-h3")
        assert await revocations.revoke(cloud.store, serial=serial, reason="stolen laptop")
        ended = await revoked_host.ended(wait=30)
        assert ended is not None
        assert (ended.code(), ended.details()) == (
            grpc.StatusCode.UNAUTHENTICATED,
            f"certificate revoked (serial {serial})",
        )
        # Its lease was released at once: the task is queued again (its target is gone).
        await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_QUEUED, within=30)
        # A new stream with the same certificate is refused before anything else.
        again = ScriptedHost(cloud.address, pki_dir, "h3")
        try:
            refused = await again.refusal()
            assert (refused.code(), refused.details()) == (
                grpc.StatusCode.UNAUTHENTICATED,
                f"certificate revoked (serial {serial})",
            )
        finally:
            await again.close()
        # Others are untouched.
        assert other_host.error is None and cloud.leases.sessions.get("h4") is not None
        assert (await submit(ops, goal="still works")).task.goal == "still works"

        # An operator's open stream is dropped as soon as its certificate is revoked.
        watch = watcher.WatchProgress(progress_service_pb2.WatchProgressRequest())
        assert (await asyncio.wait_for(watch.read(), 30)).snapshot
        ops_serial = _serial(pki_dir, "operator-ops")
        await revocations.revoke(cloud.store, serial=ops_serial)
        err = await _refused(asyncio.wait_for(_drain(watch), 30))
        assert err.details() == f"certificate revoked (serial {ops_serial})"
        await _refused(ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id)))

        # Lifting the revocation lets it in again.
        assert await revocations.lift(cloud.store, serial=ops_serial)
        await _eventually(
            lambda: ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))
        )
    finally:
        await revoked_host.close()
        await other_host.close()
        await ops_ch.close()


async def _drain(call: Any) -> None:
    while await call.read() is not grpc.aio.EOF:
        pass


async def _eventually(make_call: Any, within: float = 30.0) -> Any:
    async with asyncio.timeout(within):
        while True:
            try:
                return await make_call()
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAUTHENTICATED:
                    raise
            await asyncio.sleep(0.05)


async def test_a_revoked_host_id_refuses_every_certificate_of_that_host(
    fast_refresh_cloud: CloudServer, pki_dir: Path, tmp_path: Path
) -> None:
    cloud = fast_refresh_cloud
    assert await revocations.revoke(cloud.store, host_id="h5", reason="decommissioned")
    assert not await revocations.revoke(cloud.store, host_id="h5")  # already
    # A certificate issued after the revocation, for the same host id.
    fresh = pki.create_host_cert(pki.load_ca(pki_dir), "h5")
    (tmp_path / "ca.pem").write_bytes((pki_dir / "ca.pem").read_bytes())
    (tmp_path / "host-h5.pem").write_bytes(fresh.cert_pem)
    (tmp_path / "host-h5.key").write_bytes(fresh.key_pem)
    # The replica's deny-list has it (refreshed on its timer here).
    await until(lambda: "h5" in cloud.revocations.current.host_ids)
    host = ScriptedHost(cloud.address, tmp_path, "h5")
    try:
        refused = await host.refusal()
        assert (refused.code(), refused.details()) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "host h5 revoked",
        )
    finally:
        await host.close()


async def test_serials_are_checked_and_normalised(fast_refresh_cloud: CloudServer) -> None:
    with pytest.raises(ValueError, match="hexadecimal"):
        await revocations.revoke(fast_refresh_cloud.store, serial="not-hex")
    with pytest.raises(ValueError, match="exactly one"):
        await revocations.revoke(fast_refresh_cloud.store)
    assert await revocations.revoke(fast_refresh_cloud.store, serial="0x00:AB:cd")
    assert not await revocations.revoke(fast_refresh_cloud.store, serial="abcd")


# ---- two replicas, the CLI as its own process ---------------------------------------------


async def _amc(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        AMC, *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **env}
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, output.decode()


@pytest.mark.postgres
async def test_revoke_reaches_every_replica_at_once(
    postgres_server: PostgresServer, pki_dir: Path, migrated_postgres: str
) -> None:
    url = postgres_server.create_database(template=migrated_postgres)
    async with start_replicas(
        url, pki_dir, default_lease_seconds=120.0, revocation_refresh_seconds=3600.0
    ) as (a, b):
        on_b = ScriptedHost(b.address, pki_dir, "h6")
        a_ops = channel(a.address, pki_dir, "operator-ops")
        try:
            await on_b.connect(["h6-phone"])
            code, output = await _amc(
                "certs", "revoke", "--cert", str(pki_dir / "host-h6.pem"), "--reason", "test",
                env={"AMC_CLOUD_DATABASE_URL": url},
            )  # fmt: skip
            assert code == 0, output
            serial = _serial(pki_dir, "host-h6")
            assert f"revoked: serial {serial}" in output
            ended = await on_b.ended(wait=30)
            assert ended is not None and ended.code() == grpc.StatusCode.UNAUTHENTICATED
            # Replica A refuses the certificate too, on a stream and on a unary RPC.
            await until(lambda: serial in a.revocations.current.serials)
            on_a = ScriptedHost(a.address, pki_dir, "h6")
            try:
                refused = await on_a.refusal()
                assert (refused.code(), refused.details()) == (
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"certificate revoked (serial {serial})",
                )
            finally:
                await on_a.close()
            host_ch = channel(a.address, pki_dir, "host-h6")
            try:
                err = await _refused(
                    host_ch.unary_unary("/amc.v1.PlannerService/Decide")(b"", timeout=10)
                )
                assert err.details() == f"certificate revoked (serial {serial})"
            finally:
                await host_ch.close()

            code, output = await _amc(
                "certs", "revoke", "--serial", serial, env={"AMC_CLOUD_DATABASE_URL": url}
            )
            assert code == 0 and "already revoked" in output
            code, output = await _amc(
                "certs", "unrevoke", "--cert", str(pki_dir / "host-h6.pem"),
                env={"AMC_CLOUD_DATABASE_URL": url},
            )  # fmt: skip
            assert code == 0 and f"revocation lifted: serial {serial}" in output
            await until(lambda: serial not in b.revocations.current.serials)
        finally:
            await on_b.close()
            await a_ops.close()


async def test_the_cli_refuses_a_bad_target(tmp_path: Path) -> None:
    env = {"AMC_CLOUD_DATABASE_URL": migrated_sqlite_url(tmp_path / "cloud.sqlite3")}
    code, output = await _amc("certs", "revoke", "--serial", "xyz", env=env)
    assert code == 2 and "hexadecimal" in output
    code, output = await _amc("certs", "revoke", env=env)
    assert code == 2 and "exactly one" in output
    code, output = await _amc("certs", "revoke", "--host", "h1", env=env)
    assert code == 0 and "revoked: host id h1" in output


async def test_the_cli_opens_a_database_named_by_an_sqlite_uri(tmp_path: Path) -> None:
    """`file:…?uri=true` names its file by the URI's path: revoke finds the database there.
    Before, the URL's text was read as a path ("file:/…"), and the CLI said "there is no such
    file" of a database that was there."""
    url = migrated_sqlite_url(tmp_path / "cloud.sqlite3")
    uri = f"sqlite+aiosqlite:///file:{tmp_path / 'cloud.sqlite3'}?uri=true"
    assert url != uri
    code, output = await _amc(
        "certs", "revoke", "--host", "h1", env={"AMC_CLOUD_DATABASE_URL": uri}
    )
    assert code == 0 and "revoked: host id h1" in output, output


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "postgresql+psycopg://amc:Wr0ngPassw0rd@127.0.0.1:{port}/amc",
            "cannot open the database postgresql+psycopg://amc:•••@127.0.0.1:{port}/amc: "
            "connection failed",
        ),
        (
            "sqlite+aiosqlite:///{tmp}/typo/cloud.sqlite3",
            "no cloud database at sqlite+aiosqlite:///{tmp}/typo/cloud.sqlite3: there is no such "
            "file",
        ),
        (
            "sqlite+aiosqlite:///{tmp}/empty.sqlite3",
            "no cloud database at sqlite+aiosqlite:///{tmp}/empty.sqlite3: it holds no amc tables",
        ),
        (
            # A typo (no ":" before "//"): the URL cannot be read, so no password can be masked
            # in it. Before, the line quoted it whole, password and all.
            "postgresql+psycopg//amc:Wr0ngPassw0rd@127.0.0.1:{port}/amc",
            "the database URL is not one (not shown: it may hold a password); a database URL "
            "starts DIALECT+DRIVER:// (postgresql+psycopg://, sqlite+aiosqlite:///)",
        ),
        (
            # Before: "unexpected TypeError" about pool arguments, exit 70.
            "sqlite+aiosqlite://",
            "no cloud database at sqlite+aiosqlite://: an in-memory database holds none",
        ),
    ],
    ids=["postgresql-down", "no-file", "no-tables", "not-a-url", "in-memory"],
)
async def test_a_database_revoke_cannot_use_is_one_line_naming_it(
    tmp_path: Path, url: str, says: str
) -> None:
    """Before: a server down (or a driver missing) was "amc certs revoke: unexpected
    OperationalError: (psycopg.OperationalError) …" plus SQLAlchemy's "Background on this
    error" line, exit 70 (the code of a bug); a path with a typo was made into a new database,
    migrated, and the host was "revoked" there while every replica still accepted it."""
    (tmp_path / "empty.sqlite3").touch()
    port = free_port()  # nothing listens there
    url, says = (u.format(port=port, tmp=tmp_path) for u in (url, says))
    code, output = await _amc(
        "certs", "revoke", "--host", "h1", env={"AMC_CLOUD_DATABASE_URL": url}
    )
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"amc certs revoke: {says}"), output
    assert "--database-url (AMC_CLOUD_DATABASE_URL) must be the database the replicas use" in output
    assert "Wr0ngPassw0rd" not in output
    assert not (tmp_path / "typo").exists()


async def test_a_host_whose_certificate_is_revoked_says_so_and_stops(
    fast_refresh_cloud: CloudServer, pki_dir: Path
) -> None:
    """A revoked host is refused UNAUTHENTICATED on the Lease stream and stops at once, saying
    why (decision 0084; it backed off and tried again for ever before)."""
    import random

    from host.lease_client import HostRefused, LeaseClient, LeaseClientConfig
    from tests.cloud.test_host_identity import Blocking
    from tests.host.test_lease_client import StaticDevices

    cloud = fast_refresh_cloud
    await revocations.revoke(cloud.store, serial=_serial(pki_dir, "host-h7"))
    await until(lambda: bool(cloud.revocations.current.serials))
    client = LeaseClient(
        lambda: channel(cloud.address, pki_dir, "host-h7"),
        StaticDevices("phone"),
        Blocking(),
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.5),
        rng=random.Random(1),
    )
    with pytest.raises(HostRefused) as refused:
        await asyncio.wait_for(client.run(asyncio.Event()), 30)
    assert "certificate revoked" in str(refused.value), refused.value
    assert client.connects == 0
