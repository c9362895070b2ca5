"""Dispatch holds shared by every replica and kept across a restart: the real cloud (mTLS
gRPC, its real Anthropic SDK) against the repo's fake Messages server, which refuses the
cloud's key (HTTP 401) or is down (HTTP 529).

The host's first Decide is refused on one replica; a task queued afterwards is then handed out
by no replica (each used to hand out, and lose to its failing first step, one task before it
found out itself), nor by a replica started later on the same database. Once the provider
answers again, a probe lifts the hold and dispatch resumes on every replica.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from sqlalchemy import event

from amc.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from cloud import metrics
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from cloud.store import holds
from cloud.store.database import Store, libpq_dsn
from cloud.store.engine import check, downgrade, upgrade
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    start_replicas,
    submit,
    table_names,
    tasks_stub,
)
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, anthropic_message, tool_use
from tests.support.postgres import PostgresServer

KEY = "sk-ant-the-cloud-s-key"
#: What each replica needs to hold at once and probe often.
FAST: dict[str, Any] = {"provider_probe_seconds": 0.2, "provider_down_after_failures": 1}


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    """The fake provider the cloud's real SDK calls; it takes the cloud's key until a test
    says otherwise."""
    with FakeModelServer(anthropic_key=KEY) as fake:
        monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
        monkeypatch.setenv("AMC_PLANNER_MODEL", "claude-sonnet-4-6")
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
        monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
        yield fake


def _fail(fake: FakeModelServer, how: str) -> Callable[[], None]:
    """Make the provider refuse the key ("401") or go down ("529"); returns what undoes it."""
    if how == "529":
        fake.go_down(529)
        return fake.come_back
    with fake.lock:
        fake.messages.key = "sk-ant-another-key"

    def take_it_again() -> None:
        with fake.lock:
            fake.messages.key = KEY

    return take_it_again


#: What the fleet's DispatchStatus says lifts each hold.
LIFTS = {
    "401": "dispatch resumes when a probe call or a Decide succeeds (next probe at ",
    "529": "dispatch resumes when a probe call or a Decide succeeds (next probe at ",
    "budget": "dispatch resumes at 00:00 UTC, or once the cloud runs with a higher "
    "AMC_CLOUD_DAILY_MAX_TOKENS",
}
#: DispatchStatus.kind and the start of DispatchStatus.lifted_by for each hold.
KINDS = {
    "401": fleet_service_pb2.DISPATCH_HOLD_KIND_KEY_REFUSED,
    "529": fleet_service_pb2.DISPATCH_HOLD_KIND_PROVIDER_DOWN,
    "budget": fleet_service_pb2.DISPATCH_HOLD_KIND_DAILY_BUDGET,
}
LIFTED_BY = {
    "401": "a probe call or a Decide that succeeds, once AMC_PLANNER_",  # a replica planning
    # offline names no provider's key setting
    "529": "a probe call or a Decide that succeeds",
    "budget": "00:00 UTC, or a replica restarted with a higher AMC_CLOUD_DAILY_MAX_TOKENS",
}
#: The status Decide answers with, and the words the fleet's DispatchStatus starts with.
EXPECTED = {
    "401": (grpc.StatusCode.PERMISSION_DENIED, "the model provider refused the API key"),
    "529": (grpc.StatusCode.UNAVAILABLE, "the model provider is unavailable"),
    "budget": (grpc.StatusCode.FAILED_PRECONDITION, "the fleet's daily model budget is spent"),
}


async def _refused_first_step(
    server: CloudServer, pki_dir: Path, host: ScriptedHost
) -> tuple[str, grpc.StatusCode]:
    """Submit a task, let `host` (connected to `server`) take it and ask its first step: the
    provider fails it. Returns the task's id and the status Decide answered with."""
    ops_ch = channel(server.address, pki_dir, "operator-ops")
    host_ch = channel(server.address, pki_dir, f"host-{host.host_id}")
    try:
        task_id = (await submit(tasks_stub(ops_ch))).task.task_id
        a = (await host.next("assignment")).assignment
        assert a.task_id == task_id
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.launcher()),
            step_key="1",
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await planner.Decide(request)
        code: grpc.StatusCode = err.value.code()
        return task_id, code
    finally:
        await ops_ch.close()
        await host_ch.close()


async def _queued_and_held(
    servers: list[CloudServer],
    pki_dir: Path,
    how: str,
    *,
    seen_by: str,
    queue: bool = True,
) -> str:
    """Queue a task (or find the one queued), run a whole dispatch pass on every replica, and
    check no replica handed it out and each says why. Returns its id."""
    ops_ch = channel(servers[0].address, pki_dir, "operator-ops")
    try:
        ops = tasks_stub(ops_ch)
        if queue:
            task_id = (await submit(ops, "Open Settings")).task.task_id
        else:
            listed = await ops.ListTasks(
                task_service_pb2.ListTasksRequest(statuses=[types_pb2.TASK_STATUS_QUEUED])
            )
            (task_id,) = [t.task_id for t in listed.tasks]
        for server in servers:
            await server.leases.dispatcher.dispatch_pass()
        task = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))).task
        assert (task.status, task.attempt) == (types_pb2.TASK_STATUS_QUEUED, 0)
    finally:
        await ops_ch.close()
    for server in servers:
        fleet_ch = channel(server.address, pki_dir, "operator-ops")
        try:
            fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(fleet_ch)
            listed = await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
        finally:
            await fleet_ch.close()
        assert listed.dispatch.paused
        reason = listed.dispatch.reason
        assert reason.startswith(EXPECTED[how][1]), reason
        assert KEY not in reason
        # Every replica names the hold, since when, who found it and what lifts it.
        since = listed.dispatch.since.ToDatetime(dt.UTC)
        assert f" since {since:%H:%M:%S} UTC (seen by replica {seen_by})" in reason, reason
        assert LIFTS[how] in reason, reason
        # And in parts, for a script or a page that reads no English.
        status = listed.dispatch
        assert status.kind == KINDS[how]
        assert status.seen_by == seen_by
        assert status.lifted_by.startswith(LIFTED_BY[how]), status.lifted_by
        if how == "budget":
            assert not status.HasField("next_probe_at")
            midnight = since.replace(hour=0, minute=0, second=0, microsecond=0)
            assert status.resumes_at.ToDatetime(dt.UTC) == midnight + dt.timedelta(days=1)
        else:
            assert not status.HasField("resumes_at")
            assert status.next_probe_at.ToDatetime(dt.UTC) >= since
    return task_id


@pytest.mark.parametrize("how", ["401", "529"])
async def test_a_hold_one_replica_found_holds_on_every_replica_until_a_probe_lifts_it(
    how: str, provider: FakeModelServer, postgres_server: PostgresServer, pki_dir: Path
) -> None:
    async with start_replicas(
        postgres_server.create_database(), pki_dir, default_lease_seconds=60, **FAST
    ) as (one, two):
        # Host a, on replica one, with a phone left idle once the first task runs.
        host_a = ScriptedHost(one.address, pki_dir, "a")
        host_b = ScriptedHost(two.address, pki_dir, "b")
        try:
            await host_a.connect(["a1", "a2"])
            recover = _fail(provider, how)
            _, code = await _refused_first_step(one, pki_dir, host_a)
            assert code == EXPECTED[how][0]
            # Host b, on replica two, which never called the provider itself.
            await host_b.connect(["b1"])
            held = await _queued_and_held([one, two], pki_dir, how, seen_by=one.bus.replica_id)

            recover()  # the next probe (of either replica) is answered: dispatch resumes
            ops_ch = channel(one.address, pki_dir, "operator-ops")
            try:
                other = (await submit(tasks_stub(ops_ch), "Open Contacts")).task.task_id
            finally:
                await ops_ch.close()
            # One idle phone on each replica, two queued tasks: each replica hands out one.
            got = {
                (await h.next("assignment", wait=30)).assignment.task_id for h in (host_a, host_b)
            }
        finally:
            await host_a.close()
            await host_b.close()
    assert got == {held, other}


async def test_a_restarted_replica_keeps_the_hold_until_a_probe_lifts_it(
    provider: FakeModelServer, make_settings: Callable[..., CloudSettings], pki_dir: Path
) -> None:
    settings = make_settings(**FAST)
    first = await build_server(settings)
    await first.start()
    host = ScriptedHost(first.address, pki_dir, "a")
    try:
        await host.connect(["a1", "a2"])
        recover = _fail(provider, "401")
        await _refused_first_step(first, pki_dir, host)
    finally:
        await host.close()
        await first.stop(0.5)

    again = await build_server(make_settings(**FAST))  # the same database, the same bad key
    await again.start()
    host = ScriptedHost(again.address, pki_dir, "a")
    try:
        await host.connect(["a1", "a2"])
        held = await _queued_and_held([again], pki_dir, "401", seen_by=first.bus.replica_id)
        recover()
        assert (await host.next("assignment", wait=30)).assignment.task_id == held
    finally:
        await host.close()
        await again.stop(0.5)


async def test_migration_0021_adds_dispatch_holds_and_back(db_url: str) -> None:
    """Both backends: 0021 adds the `dispatch_holds` table (empty: nothing held), its
    downgrade drops it, and the schema matches the models again after the upgrade."""
    s = Store.from_url(db_url)

    try:
        await upgrade(s.engine, "0020")
        before = await table_names(s)
        await upgrade(s.engine, "0021")
        assert await table_names(s) - before == {"dispatch_holds"}
        assert await holds.load(s) == {}
        await downgrade(s.engine, "0020")
        assert await table_names(s) == before
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()


async def test_the_daily_cap_holds_every_task_once_spent_and_lifts_with_a_raised_cap(
    provider: FakeModelServer, make_settings: Callable[..., CloudSettings], pki_dir: Path
) -> None:
    """The day's tally is what holds tasks back, read each dispatch round against the cap the
    replica has: once one decision spent the fleet's 500 tokens, the next task is held on this
    replica and on one started later (a cloud-transport host's task used to be handed out, to
    fail at its first step, until a Decide had been refused on that very replica); the cap is a
    setting read at start, and a replica started with a raised cap hands the task out."""
    provider.script_anthropic(
        anthropic_message(
            tool_use(
                "launch_app",
                {
                    "package_name": "com.android.settings",
                    "purpose": "open it",
                    "expected_outcome": "it opens",
                },
            ),
            input_tokens=500,
            output_tokens=100,
        )
    )
    first = await build_server(make_settings(daily_max_tokens=500))
    await first.start()
    host = ScriptedHost(first.address, pki_dir, "a")
    try:
        await host.connect(["a1", "a2"])
        host_ch = channel(first.address, pki_dir, "host-a")
        try:
            ops_ch = channel(first.address, pki_dir, "operator-ops")
            await submit(tasks_stub(ops_ch))
            await ops_ch.close()
            a = (await host.next("assignment")).assignment
            planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
            await planner.Decide(
                planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation_from_scene(scenes.launcher()),
                    step_key="1",
                )
            )  # 600 tokens: the day's 500 are spent
        finally:
            await host_ch.close()
        held = await _queued_and_held([first], pki_dir, "budget", seen_by=first.bus.replica_id)
    finally:
        await host.close()
        await first.stop(0.5)

    again = await build_server(make_settings(daily_max_tokens=500))
    await again.start()
    host = ScriptedHost(again.address, pki_dir, "a")
    try:
        await host.connect(["a1", "a2"])
        await _queued_and_held(
            [again], pki_dir, "budget", queue=False, seen_by=first.bus.replica_id
        )
    finally:
        await host.close()
        await again.stop(0.5)

    raised = await build_server(make_settings(daily_max_tokens=5000))
    await raised.start()
    host = ScriptedHost(raised.address, pki_dir, "a")
    try:
        await host.connect(["a1", "a2"])
        assert (await host.next("assignment", wait=30)).assignment.task_id == held
    finally:
        await host.close()
        await raised.stop(0.5)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # PostgreSQL reads each dispatch
async def test_a_lone_sqlite_replica_reads_its_holds_once(
    provider: FakeModelServer, make_settings: Callable[..., CloudSettings], pki_dir: Path
) -> None:
    """A host's dispatch reads the shared holds before claiming, for a hold another replica
    may have set; SQLite has no other replica, so after the read at start it never asks the
    database again (a hello or a result on its hot path costs no extra query)."""
    server = await build_server(make_settings(**FAST))
    assert server.store.is_sqlite
    await server.start()
    host = ScriptedHost(server.address, pki_dir, "a")
    sent: list[str] = []

    def count(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    engine = server.store.engine.sync_engine
    try:
        await host.connect(["a1"])
        event.listen(engine, "before_cursor_execute", count)
        try:
            await server.leases.dispatcher.dispatch_host(server.leases.sessions["a"])
            await server.leases.dispatcher.dispatch_pass()
        finally:
            event.remove(engine, "before_cursor_execute", count)
    finally:
        await host.close()
        await server.stop(0.5)
    assert sent, "the dispatch ran its queries"
    assert not [s for s in sent if "dispatch_holds" in s]


async def test_a_hold_committed_during_a_hosts_claims_holds_its_next_claim(
    provider: FakeModelServer, postgres_server: PostgresServer, pki_dir: Path
) -> None:
    """Another replica commits a refused-key hold while this replica is handing a host's first
    idle phone a task (`INSERT INTO attempts`, hooked on the real engine: the row is written on
    a connection of its own and committed at that moment, as the other replica's would be).
    A host's dispatch read the holds once, before its first claim (and a pass once for all its
    hosts): its second phone got the second task, which failed at its first step. Each claim
    now reads them in its own transaction: the second task stays queued."""
    async with start_replicas(
        postgres_server.create_database(), pki_dir, count=1, default_lease_seconds=60, **FAST
    ) as (server,):
        dsn = libpq_dsn(server.store.engine)
        written: list[str] = []

        def other_replica_holds(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
            if written or not statement.lstrip().upper().startswith("INSERT INTO ATTEMPTS"):
                return
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO dispatch_holds (reason, detail, set_at, set_by) "
                    "VALUES (%s, %s, now(), %s)",
                    (holds.KEY_REFUSED, "planner: Anthropic rejected the API key", "other"),
                )
            written.append(statement)

        ops_ch = channel(server.address, pki_dir, "operator-ops")
        host = ScriptedHost(server.address, pki_dir, "a")
        engine = server.store.engine.sync_engine
        # The key is refused indeed: this replica's probe must not lift the hold before the
        # pass below (a probe that succeeds lifts it, and the task is then rightly handed out).
        _fail(provider, "401")
        event.listen(engine, "before_cursor_execute", other_replica_holds)
        try:
            ops = tasks_stub(ops_ch)
            queued = [(await submit(ops, goal)).task.task_id for goal in ("one", "two")]
            await host.connect(["a1", "a2"])
            first = (await host.next("assignment", wait=30)).assignment
            await asyncio.gather(*server.leases.dispatcher.pending())
            await server.leases.dispatcher.dispatch_pass()
            (other,) = set(queued) - {first.task_id}
            task = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=other))).task
        finally:
            event.remove(engine, "before_cursor_execute", other_replica_holds)
            await host.close()
            await ops_ch.close()
    assert written, "the hold was committed during the first claim"
    assert (task.status, task.attempt) == (types_pb2.TASK_STATUS_QUEUED, 0)


def _paused_gauge() -> float:
    """`amc_cloud_dispatch_paused` as this process's replicas set it."""
    return metrics.REGISTRY.get_sample_value("amc_cloud_dispatch_paused") or 0.0


async def test_an_offline_planner_replica_honours_a_provider_hold_while_a_provider_replica_lives(
    provider: FakeModelServer,
    postgres_server: PostgresServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mixed fleet (a planner being switched): a host's Decides travel on a connection of
    their own, which may reach the replica that calls the provider. The replica planning
    offline handed tasks out under that replica's refused-key hold (each to be refused at its
    first step, and retried until its attempts ran out); it now holds them while that replica
    lives, and hands them out once none that calls the provider is left (nothing would lift
    the hold then). It never lifts the hold itself."""
    values: dict[str, Any] = {
        "database_url": postgres_server.create_database(),
        "listen_address": "127.0.0.1:0",
        "pki_dir": pki_dir,
        "shutdown_grace_seconds": 0.5,
        "default_lease_seconds": 60,
        **FAST,
    }
    one = await build_server(CloudSettings(**values))
    await one.start()
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    offline = await build_server(CloudSettings(**values))
    await offline.start()
    host_a = ScriptedHost(one.address, pki_dir, "a")
    host_b = ScriptedHost(offline.address, pki_dir, "b")
    try:
        await host_a.connect(["a1"])
        _fail(provider, "401")
        await _refused_first_step(one, pki_dir, host_a)
        await host_b.connect(["b1"])
        held = await _queued_and_held([one, offline], pki_dir, "401", seen_by=one.bus.replica_id)
        assert _paused_gauge() == 1.0
        await host_a.close()
        await one.stop(0.5)  # no replica calls the provider now: nothing would lift the hold
        assert (await host_b.next("assignment", wait=30)).assignment.task_id == held
        assert set(await holds.load(offline.store)) == {holds.KEY_REFUSED}  # not lifted
    finally:
        await host_a.close()
        await host_b.close()
        await one.stop(0.5)
        await offline.stop(0.5)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # one replica after the other
async def test_an_offline_planner_replica_neither_honours_nor_lifts_a_provider_hold(
    provider: FakeModelServer,
    make_settings: Callable[..., CloudSettings],
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica planning with the offline planner calls no provider: a provider's refusal
    says nothing of its Decides, so it hands tasks out under a provider hold, and its own
    Decides (which prove nothing of the provider) leave the hold for a replica that calls it.
    It said so inconsistently: it dispatched while its `amc_cloud_dispatch_paused` read 1 and it
    logged "dispatch held"."""
    first = await build_server(make_settings(**FAST))
    await first.start()
    host = ScriptedHost(first.address, pki_dir, "a")
    try:
        await host.connect(["a1"])
        _fail(provider, "401")
        await _refused_first_step(first, pki_dir, host)
    finally:
        await host.close()
        await first.stop(0.5)

    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    offline = await build_server(make_settings(**FAST))
    await offline.start()
    host = ScriptedHost(offline.address, pki_dir, "b")
    ops_ch = channel(offline.address, pki_dir, "operator-ops")
    host_ch = channel(offline.address, pki_dir, "host-b")
    try:
        await host.connect(["b1"])
        task_id = (await submit(tasks_stub(ops_ch), "Open Settings")).task.task_id
        a = (await host.next("assignment", wait=30)).assignment
        assert a.task_id == task_id
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        await planner.Decide(
            planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
                step_key="1",
            )
        )
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ops_ch)
        status = (await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).dispatch
        assert not status.paused, status.reason
        assert _paused_gauge() == 0.0
        assert set(await holds.load(offline.store)) == {holds.KEY_REFUSED}  # not lifted
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()
        await offline.stop(0.5)
