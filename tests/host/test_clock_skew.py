"""A host whose wall clock disagrees with the cloud's still knows when its lease ends: the cloud
sends the time left (`lease_remaining`) and the host counts it down on its monotonic clock.

Real cloud (SQLite, loopback mTLS) and the real lease client; the host's wall clock is moved an
hour ahead by replacing the lease client's `datetime` (a real clock cannot be set without root
and without moving every process on the machine). Before the field, such a host read every
expiry as an hour past, and stopped its task at the first renewal it could not send."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, tzinfo
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from amc.v1 import task_service_pb2, task_service_pb2_grpc
from cloud import pki
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from host import lease_client
from host import metrics as host_metrics
from host.agent import planning_wait
from host.agent.planning_wait import PlanningPostponed, WaitPolicy, plan_patiently
from host.cloud_channel import open_channel
from host.lease_client import LeaseClient, LeaseClientConfig
from host.settings import HostSettings
from planner.errors import PlannerUnavailable
from tests.host.test_lease_client import HOST_ID, StaticDevices, Stepper
from tests.support.migrated import migrated_sqlite_url
from tests.support.waiting import until


async def _ignore_wait(since: object, why: object) -> None:
    """`on_wait` for a test that does not look at the waits."""


LEASE_S = 30.0


class HourAhead(datetime):
    """The host's wall clock, an hour ahead of the cloud's."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> HourAhead:
        real = datetime.now(tz) + timedelta(hours=1)
        return cls.fromtimestamp(real.timestamp(), tz)


@pytest.fixture
async def cloud(tmp_path: Path) -> AsyncIterator[tuple[CloudServer, Path]]:
    pki_dir = pki.ensure_embedded_pki(tmp_path, [HOST_ID], operator="ops")
    server = await build_server(
        CloudSettings(
            database_url=migrated_sqlite_url(tmp_path / "cloud.sqlite3"),
            listen_address="127.0.0.1:0",
            pki_dir=pki_dir,
            dispatch_interval_seconds=0.2,
        )
    )
    await server.start()
    yield server, pki_dir
    await server.stop(0.5)


async def test_a_host_an_hour_ahead_keeps_its_lease_deadline(
    cloud: tuple[CloudServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, pki_dir = cloud
    monkeypatch.setattr(lease_client, "datetime", HourAhead)
    settings = HostSettings(
        cloud_address=server.address, certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    body = Stepper(3)
    client = LeaseClient(
        lambda: open_channel(settings),
        StaticDevices("emulator-5554"),
        body,
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
        rng=random.Random(7),
    )
    stop = asyncio.Event()
    run = asyncio.create_task(client.run(stop))
    ca = (pki_dir / "ca.pem").read_bytes()
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(pki_dir / "operator-ops.key").read_bytes(),
        certificate_chain=(pki_dir / "operator-ops.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(server.address, creds) as channel:
        lease = duration_pb2.Duration()
        lease.FromTimedelta(timedelta(seconds=LEASE_S))
        await task_service_pb2_grpc.TaskServiceStub(channel).SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="g", max_attempts=1, lease_duration=lease)
        )
    try:
        await until(lambda: bool(body.started), 20, "the assignment")
        (rt,) = client._tasks.values()
        assert rt.expires_mono - time.monotonic() > LEASE_S - 5  # from the assignment
        acked = host_metrics.renewals.labels(outcome="acked")._value.get()
        body.allow()  # progress changes: the host renews within a second
        await until(
            lambda: host_metrics.renewals.labels(outcome="acked")._value.get() > acked,
            20,
            "a renewal's answer",
        )
        assert rt.expires_mono - time.monotonic() > LEASE_S * 0.85 - 5  # from the renewal
        # The control: the same expiry read against this host's clock is an hour gone.
        renewed = server.store.now() + timedelta(seconds=LEASE_S)
        ts = timestamp_pb2.Timestamp()
        ts.FromDatetime(renewed)
        assert lease_client._mono_expiry(ts, LEASE_S) - time.monotonic() < -3000
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


async def test_a_host_an_hour_ahead_waits_for_the_planner_until_the_task_s_deadline(
    cloud: tuple[CloudServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's deadline came as a timestamp only, which `plan_patiently` compared with the
    host's clock: a host an hour ahead read a deadline half an hour away as half an hour past,
    and gave up at the planner's first unavailable answer (PlanningPostponed). The cloud now
    sends the time left (`deadline_remaining`), counted from the host's own now."""
    server, pki_dir = cloud
    monkeypatch.setattr(lease_client, "datetime", HourAhead)
    settings = HostSettings(
        cloud_address=server.address, certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    body = Stepper(1)
    client = LeaseClient(
        lambda: open_channel(settings),
        StaticDevices("emulator-5554"),
        body,
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
        rng=random.Random(7),
    )
    stop = asyncio.Event()
    run = asyncio.create_task(client.run(stop))
    ca = (pki_dir / "ca.pem").read_bytes()
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(pki_dir / "operator-ops.key").read_bytes(),
        certificate_chain=(pki_dir / "operator-ops.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(server.address, creds) as channel:
        timeout = duration_pb2.Duration()
        timeout.FromTimedelta(timedelta(minutes=30))
        await task_service_pb2_grpc.TaskServiceStub(channel).SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="g", max_attempts=1, timeout=timeout)
        )
    try:
        await until(lambda: bool(body.started), 20, "the assignment")
        (spec,) = body.started
        answers: list[str] = []

        async def plan() -> str:
            answers.append("asked")
            if len(answers) == 1:
                raise PlannerUnavailable("the provider is overloaded")
            return "decided"

        planned = await plan_patiently(
            plan,
            on_wait=_ignore_wait,
            deadline=spec.deadline,
            policy=WaitPolicy(initial_s=0.01, max_s=0.02),
        )
        assert planned == "decided" and len(answers) == 2
    finally:
        body.allow()
        stop.set()
        await asyncio.wait_for(run, 30)


async def test_a_resumed_assignment_takes_the_deadline_anew_after_the_host_clock_jumped(
    cloud: tuple[CloudServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cloud re-sends a running attempt's assignment when the host reconnects; the lease
    client took its lease from it but kept the task's deadline from the first one, on the
    host's wall clock as it was then. A host whose clock jumped an hour ahead while away read
    a deadline half an hour off as half an hour past. The resumed assignment's time left
    (`deadline_remaining`) now sets it anew, on the host's monotonic clock."""
    server, pki_dir = cloud
    settings = HostSettings(
        cloud_address=server.address, certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    body = Stepper(1)
    client = LeaseClient(
        lambda: open_channel(settings),
        StaticDevices("emulator-5554"),
        body,
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
        rng=random.Random(7),
    )
    stop = asyncio.Event()
    run = asyncio.create_task(client.run(stop))
    ca = (pki_dir / "ca.pem").read_bytes()
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(pki_dir / "operator-ops.key").read_bytes(),
        certificate_chain=(pki_dir / "operator-ops.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(server.address, creds) as channel:
        timeout = duration_pb2.Duration()
        timeout.FromTimedelta(timedelta(minutes=30))
        await task_service_pb2_grpc.TaskServiceStub(channel).SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="g", max_attempts=1, timeout=timeout)
        )
    try:
        await until(lambda: bool(body.started), 20, "the assignment")
        (spec,) = body.started
        assert spec.deadline is not None
        first = spec.deadline
        monkeypatch.setattr(lease_client, "datetime", HourAhead)  # the clock jumps, then
        server.leases.sessions[HOST_ID].close(grpc.StatusCode.UNAVAILABLE, "cut by test")
        await until(lambda: client.connects >= 2, 20, "the reconnect")
        await until(lambda: spec.deadline != first, 20, "the resumed assignment's deadline")
        assert spec.deadline is not None
        assert abs(spec.deadline - first) < 60  # the jump moved it neither way
        left = spec.deadline - time.monotonic()
        assert 25 * 60 < left <= 30 * 60
        assert len(body.started) == 1  # resumed, not restarted
    finally:
        body.allow()
        stop.set()
        await asyncio.wait_for(run, 30)


class HourBehind(datetime):
    """The host's wall clock, an hour behind the cloud's."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> HourBehind:
        real = datetime.now(tz) - timedelta(hours=1)
        return cls.fromtimestamp(real.timestamp(), tz)


async def test_a_host_clock_that_steps_while_connected_moves_no_planning_deadline(
    cloud: tuple[CloudServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline was kept on the host's wall clock and `plan_patiently` compared it with the
    wall clock at each wait: a clock that stepped an hour ahead while the host stayed connected
    (no resumed assignment to set it anew) gave up at the planner's first unavailable answer,
    half an hour early; one that stepped an hour back would wait out a provider's 31-minute
    retry-after past a deadline 30 minutes off. The deadline is now monotonic once received.
    The steps replace the `datetime` of both modules that read the wall clock here."""
    server, pki_dir = cloud
    settings = HostSettings(
        cloud_address=server.address, certs_dir=pki_dir, host_id=HOST_ID, data_dir=tmp_path / "h"
    )
    body = Stepper(1)
    client = LeaseClient(
        lambda: open_channel(settings),
        StaticDevices("emulator-5554"),
        body,
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.2),
        rng=random.Random(7),
    )
    stop = asyncio.Event()
    run = asyncio.create_task(client.run(stop))
    ca = (pki_dir / "ca.pem").read_bytes()
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(pki_dir / "operator-ops.key").read_bytes(),
        certificate_chain=(pki_dir / "operator-ops.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(server.address, creds) as channel:
        timeout = duration_pb2.Duration()
        timeout.FromTimedelta(timedelta(minutes=30))
        await task_service_pb2_grpc.TaskServiceStub(channel).SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal="g", max_attempts=1, timeout=timeout)
        )
    try:
        await until(lambda: bool(body.started), 20, "the assignment")
        (spec,) = body.started
        fast = WaitPolicy(initial_s=0.01, max_s=0.02)

        # An hour ahead: the planner is unavailable once, then decides.
        for module in (lease_client, planning_wait):
            monkeypatch.setattr(module, "datetime", HourAhead)
        answers: list[str] = []

        async def plan_once_unavailable() -> str:
            answers.append("asked")
            if len(answers) == 1:
                raise PlannerUnavailable("the provider is overloaded")
            return "decided"

        planned = await plan_patiently(
            plan_once_unavailable,
            on_wait=_ignore_wait,
            deadline=spec.deadline,
            policy=fast,
        )
        assert planned == "decided" and len(answers) == 2

        # An hour back: the provider asks for a wait longer than the time left.
        for module in (lease_client, planning_wait):
            monkeypatch.setattr(module, "datetime", HourBehind)

        async def plan_rate_limited() -> str:
            raise PlannerUnavailable("rate limited", retry_after=31 * 60)

        async def no_wait_past_the_deadline(seconds: float) -> None:
            raise AssertionError(f"waited {seconds:.0f}s past the task's deadline")

        with pytest.raises(PlanningPostponed):
            await plan_patiently(
                plan_rate_limited,
                on_wait=_ignore_wait,
                deadline=spec.deadline,
                policy=fast,
                sleep=no_wait_past_the_deadline,
            )
    finally:
        body.allow()
        stop.set()
        await asyncio.wait_for(run, 30)
