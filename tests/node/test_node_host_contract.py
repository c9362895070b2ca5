"""A host written in Node.js from proto/ alone (grpc-js, @grpc/proto-loader), against a real
cloud over mTLS: what the contract's comments promise such a host is what the cloud does, with
the defaults a proto3 client sends for the fields it leaves unset."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, task_service_pb2, types_pb2
from cloud.server import CloudServer
from tests.cloud.cloud_harness import channel, lapse, started, submit, tasks_stub, wait_status
from tests.cloud.conftest import SettingsFactory
from tests.node.host_wire import NodeHost

AMC = str(Path(sys.executable).with_name("amc"))
NODE_MODULES = Path(__file__).resolve().parents[2] / "node_modules" / "@grpc" / "grpc-js"
PHONE = {"serial": "p1", "model": "Pixel 8", "state": "DEVICE_STATE_ONLINE"}


@pytest.fixture
def node() -> str:
    found = shutil.which("node")
    if found is None or not NODE_MODULES.exists():
        pytest.fail("node and `npm ci` (node_modules/@grpc) are required for the polyglot test")
    return found


@pytest.fixture
async def host(node: str, cloud: CloudServer, pki_dir: Path) -> AsyncIterator[NodeHost]:
    """A Node host with the certificate of host h1."""
    started = await NodeHost.start(node, cloud.address, pki_dir, "h1")
    try:
        yield started
    finally:
        await started.close()


async def test_a_long_agent_version_is_cut_not_a_refused_hello(
    host: NodeHost, cloud: CloudServer, pki_dir: Path
) -> None:
    # What a host only reports never refuses its message (LeaseService): an agent version
    # that says a lot about its build is cut, as a phone's model is.
    version = "amc-node-host/1.4.0 (node v20.20.2; linux x64; @grpc/grpc-js 1.12; " + "x" * 100
    assert len(version) > 128

    first = await host.open({"devices": [PHONE], "agent_version": version})

    assert first["kind"] == "welcome", first
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        fleet = fleet_service_pb2_grpc.FleetServiceStub(ch)
        listed = (await fleet.ListHosts(fleet_service_pb2.ListHostsRequest())).hosts
    finally:
        await ch.close()
    assert [(h.host_id, h.agent_version) for h in listed] == [("h1", version[:128])]


async def _amc(*args: str) -> tuple[int, str, str]:
    """One `amc` command (the operator CLI) as its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMC_")}
    env.update(COLUMNS="100", AMC_CONTEXT_FILE="/nonexistent/amc-context.json")
    process = await asyncio.create_subprocess_exec(
        AMC, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, out.decode(), err.decode()


async def test_a_phone_state_this_cloud_does_not_know_is_kept_as_unspecified(
    host: NodeHost, cloud: CloudServer, pki_dir: Path
) -> None:
    # A newer host may report a state this cloud's contract has no name for (proto3 enums are
    # open; a Node host sends the number as it is). Stored as it came, it broke every reader
    # that names states: `amc host list` died on it.
    newer = {"serial": "p2", "model": "Pixel 9", "state": 9}

    assert (await host.open({"devices": [PHONE, newer]}))["kind"] == "welcome"
    code, out, err = await _amc(
        "--cloud", cloud.address, "--pki-dir", str(pki_dir), "--operator", "ops", "host", "list"
    )

    assert code == 0, err
    assert "p1 (Pixel 8, online) idle" in out
    assert "p2 (Pixel 9, unspecified) idle" in out


async def test_a_host_that_does_not_say_its_transport_is_held_back_with_the_cloud_ones(
    node: str, make_settings: SettingsFactory, pki_dir: Path
) -> None:
    # Once the fleet's daily budget refused a Decide, new tasks are held back for the day:
    # they would fail at their first step. Only direct-transport hosts plan without this cloud
    # (DispatchStatus), yet a Node host that left planner_transport unset was not held back:
    # it was handed the task, whose first Decide failed it for good ("budget exhausted").
    async with (
        started(make_settings(daily_max_tokens=100)) as cloud,
        channel(cloud.address, pki_dir, "operator-ops") as ch,
        await NodeHost.start(node, cloud.address, pki_dir, "h1") as spent,
        await NodeHost.start(node, cloud.address, pki_dir, "h2") as quiet,
    ):
        ops = tasks_stub(ch)
        hello = {"devices": [PHONE], "planner_transport": "PLANNER_TRANSPORT_CLOUD"}
        assert (await spent.open(hello))["kind"] == "welcome"
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = await spent.lease("assignment")
        request = {
            "task_id": a["task_id"],
            "attempt": a["attempt"],
            "lease_id": a["lease_id"],
            "observation": {"screen_width": 1080, "screen_height": 2400},
        }
        # The offline planner's steps are priced by their estimated tokens: planned until
        # today's spending reaches the fleet's cap.
        async with asyncio.timeout(20):
            while "error" not in (refused := await spent.decide(request)):
                pass
        assert refused["error"]["code"] == 9
        assert "tokens of the fleet's daily 100" in refused["error"]["details"]

        assert (await quiet.open({"devices": [PHONE]}))["kind"] == "welcome"
        later = (await submit(ops, target=types_pb2.TaskTarget(host_id="h2"))).task
        session = cloud.leases.sessions["h2"]
        await cloud.leases.dispatcher.dispatch_host(session)

        task = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=later.task_id))).task
        assert task.status == types_pb2.TASK_STATUS_QUEUED
        assert await cloud.leases.dispatcher.held_for(session)


async def test_a_phone_without_a_state_gets_no_task_until_it_is_said_online(
    host: NodeHost, cloud: CloudServer, pki_dir: Path
) -> None:
    # The field a proto3 host most easily leaves at its default: the phone then waits, and
    # nothing on the stream says why, so the contract says it (Device.state).
    unset = {"serial": "p1", "model": "Pixel 8"}
    assert (await host.open({"devices": [unset]}))["kind"] == "welcome"
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        task = (await submit(tasks_stub(ch))).task
        session = cloud.leases.sessions["h1"]

        assert await cloud.leases.dispatcher.dispatch_host(session) == 0

        await host.send(device_update={"devices": [PHONE]})
        assert (await host.lease("assignment"))["task_id"] == task.task_id
    finally:
        await ch.close()


#: Streams a test opens before one lives long enough for what it waits for (the welcome and
#: an assignment): a connection at its maximum age ends within a couple of seconds, and on a
#: loaded machine a start-up stall can spend those before the cloud answers.
AGED_OUT_TRIES = 5


async def _assigned_before_aged_out(host: NodeHost, hello: dict[str, object]) -> dict[str, object]:
    """Open the Lease stream with `hello` until one is welcomed and handed an assignment before
    its connection reaches its maximum age; that assignment. A stream that ends first (status
    only) is opened again with the same hello: that is what a host does, and the test is about
    the end of a stream that holds a lease, not about how fast the cloud answers."""
    for _ in range(AGED_OUT_TRIES):
        first = await host.open(hello)
        if not first:  # ended before the welcome
            continue
        assert first["kind"] == "welcome", first
        got = await host.next(
            lambda e: "status" in e or e.get("lease", {}).get("kind") == "assignment"
        )
        if "lease" in got:
            assignment: dict[str, object] = got["lease"]["assignment"]
            return assignment
    raise AssertionError(f"no stream lived to its assignment in {AGED_OUT_TRIES}: {host.events}")


async def test_a_rebalanced_stream_ends_unavailable_and_its_lease_resumes(
    node: str, make_settings: SettingsFactory, pki_dir: Path
) -> None:
    # A replica closes every connection at its maximum age (deployment: rebalancing behind an
    # L4 balancer). The host sees the stream end UNAVAILABLE, which the contract tells it to
    # answer by reconnecting; its lease, re-announced, is resumed. The age is short (each
    # stream lives about 1 s + the 1 s grace), so a stream the cloud had not yet answered when
    # it ended, on a loaded machine, is opened again (`_assigned_before_aged_out`): before,
    # a welcome or an assignment lost that way failed the test.
    settings = make_settings(max_connection_age_seconds=1.0, max_connection_age_grace_seconds=1.0)
    async with (
        started(settings) as cloud,
        channel(cloud.address, pki_dir, "operator-ops") as ch,
        await NodeHost.start(node, cloud.address, pki_dir, "h1") as host,
    ):
        hello: dict[str, object] = {"devices": [PHONE], "process_id": "run-1"}
        await submit(tasks_stub(ch))
        a = await _assigned_before_aged_out(host, hello)

        ended = await host.next(lambda e: "status" in e)

        assert ended["status"]["code"] == 14, ended  # UNAVAILABLE
        held = {k: a[k] for k in ("task_id", "attempt", "lease_id", "device_serial")}
        resumed = await _assigned_before_aged_out(host, {**hello, "held_assignments": [held]})
        assert (resumed["lease_id"], resumed["resumed"]) == (a["lease_id"], True)


async def test_a_result_held_across_a_reconnect_ends_its_attempt_not_run_again(
    host: NodeHost, cloud: CloudServer, pki_dir: Path
) -> None:
    # The host finished the task while its stream was down, and its lease ran out meanwhile.
    # It reconnects listing the lease and sends the result right after the hello, as HostHello
    # says. The hello's own dispatch handed the task to the host's now idle phone as attempt 2
    # first, and the result was refused as superseded: the work was done twice. No other
    # attempt took the task, so the hello gives the lease a new term (resumed) and the result
    # ends attempt 1.
    ch = channel(cloud.address, pki_dir, "operator-ops")
    ops = tasks_stub(ch)
    try:
        hello = {"devices": [PHONE], "process_id": "run-1"}
        assert (await host.open(hello))["kind"] == "welcome"
        task = (await submit(ops)).task
        a = await host.lease("assignment")
        held = {k: a[k] for k in ("task_id", "attempt", "lease_id", "device_serial")}
        await host.command(op="end")
        await host.next(lambda e: "status" in e)
        await lapse(cloud.store, task.task_id)
        await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_QUEUED)

        await host.command(op="open")
        await host.send(hello={**hello, "held_assignments": [held]})
        lease = {k: a[k] for k in ("task_id", "attempt", "lease_id")}
        await host.send(result={**lease, "status": "TASK_STATUS_SUCCEEDED", "summary": "done"})

        answer = await host.next(lambda e: "lease" in e and e["lease"]["kind"] != "welcome")
        assert answer["lease"]["kind"] == "assignment", answer
        resumed = answer["lease"]["assignment"]
        assert (resumed["lease_id"], resumed["resumed"]) == (a["lease_id"], True)
        answer = await host.next(lambda e: "lease" in e)
        assert answer["lease"]["kind"] == "result_ack", answer
        final = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        assert final.attempt == 1
    finally:
        await ch.close()
