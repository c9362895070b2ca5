"""The Node example host drops a link gone silent and reconnects, as the Python host does.

Real parts: `amc cloud serve` (SQLite, mTLS), the cloud's real Anthropic SDK against the fake
Messages server, a virtual phone served over the adb protocol, and host.js as its own process,
reaching the cloud through a loopback TCP proxy that freezes the link mid-step: both sockets
stay open and nothing is forwarded either way (a dead NAT entry, a cloud machine gone without
a reset), as tests/faults/test_half_open.py freezes the Python host's.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from amc.v1 import task_service_pb2, types_pb2
from host.devices.virtual.phone import VirtualPhone
from tests.node.rig import HOST, cloud_and_phone, fake_cloud_and_phones, running_host
from tests.node.test_node_host import HOST_ID, node
from tests.support.fakes import ANTHROPIC_KEY, FakeModelServer, anthropic_message, tool_use
from tests.support.processes import wait_task
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import until

__all__ = ["node"]

#: Short keepalives on both ends, as the Python host's half-open test sets them.
KEEPALIVE = {"time": "1", "timeout": "2"}


async def test_the_node_host_drops_a_silent_link_and_reconnects_keeping_its_lease(
    node: str, tmp_path: Path
) -> None:
    """The link freezes while step 1 is at the model, and the answer is lost in it. host.js
    set no gRPC keepalive (grpc-js pings never by default): the frozen connection looked open,
    so it never reconnected; its Decide waited on it, its lease ran out by its own clock, and
    its result went into the same dead link. With the Python host's keepalive it drops the
    link, reconnects naming its lease, asks again for the step under the same key, and the
    task succeeds on its first attempt."""
    hold = threading.Event()
    launch = anthropic_message(
        tool_use(
            "launch_app",
            {"package_name": "com.android.settings", "purpose": "open", "expected_outcome": "open"},
        )
    )
    launch.hold = hold
    done = anthropic_message(tool_use("complete", {"success": True, "reason": "settings open"}))
    planner = {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "AMC_PLANNER_MAX_RETRIES": "0",
        "AMC_CLOUD_KEEPALIVE_TIME_SECONDS": KEEPALIVE["time"],
        "AMC_CLOUD_KEEPALIVE_TIMEOUT_SECONDS": KEEPALIVE["timeout"],
        "AMC_CLOUD_MIN_CLIENT_PING_INTERVAL_SECONDS": "0.5",
    }
    with FakeModelServer(anthropic_key=ANTHROPIC_KEY) as provider:
        provider.script_anthropic(launch, done)
        planner["AMC_PLANNER_ANTHROPIC_BASE_URL"] = provider.anthropic_base_url
        async with cloud_and_phone(
            tmp_path, VirtualPhone("emulator-5554"), HOST_ID, planner
        ) as rig:
            proxy = TcpProxy([("127.0.0.1", int(rig.address.rsplit(":", 1)[1]))]).start()
            task = (
                await rig.client.tasks.SubmitTask(
                    task_service_pb2.SubmitTaskRequest(
                        goal="Open the settings",
                        lease_duration=Duration(seconds=20),
                        max_attempts=2,
                    ),
                    timeout=10,
                )
            ).task
            host = await asyncio.create_subprocess_exec(
                node,
                str(HOST),
                env={
                    "PATH": os.environ.get("PATH", ""),
                    "AMC_CLOUD_ADDRESS": proxy.address,
                    "AMC_HOST_CERTS_DIR": str(rig.pki),
                    "AMC_HOST_ID": HOST_ID,
                    "ADB_PORT": str(rig.adb_port),
                    "AMC_TASKS": "1",
                    "AMC_HOST_DATA_DIR": str(tmp_path / "host-data"),
                    "AMC_HOST_KEEPALIVE_TIME_S": KEEPALIVE["time"],
                    "AMC_HOST_KEEPALIVE_TIMEOUT_S": KEEPALIVE["timeout"],
                },
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                await until(
                    lambda: len(provider.bodies("/v1/messages")) == 1,
                    within=60,
                    what="step 1 at the model",
                )
                frozen = proxy.blackhole()
                assert frozen, "no open connection to freeze"
                cut_at = time.monotonic()
                hold.set()  # the answer goes into the frozen link
                # AMC_TASKS=1: it exits once the cloud has acknowledged the task's result.
                _, err = await asyncio.wait_for(host.communicate(), 90)
                final = await wait_task(
                    rig.client,
                    task.task_id,
                    lambda t: t.status != types_pb2.TASK_STATUS_RUNNING,
                    10,
                )
            finally:
                hold.set()
                if host.returncode is None:
                    host.kill()
                    await host.wait()
                proxy.stop()
    said = err.decode()
    assert host.returncode == 0, said
    assert all(link.client_gone_at is not None for link in frozen), said  # dropped by the host
    assert proxy.links_since(cut_at), said  # and a new one opened
    assert final.status == types_pb2.TASK_STATUS_SUCCEEDED, (final, said)
    assert [a.attempt for a in final.attempts] == [1], (final, said)
    assert len(provider.bodies("/v1/messages")) == 2, (
        said
    )  # the lost step asked again, not planned again


async def test_an_assignment_without_a_renew_interval_is_renewed_at_a_third_of_its_lease(
    node: str, tmp_path: Path
) -> None:
    """Every proto3 field may be unset, and the Python host renews an assignment that names
    no `renew_interval` at a third of its lease. host.js read the missing field and died of a
    TypeError (exit 1), the phone's task with it. The cloud here is the in-test LeaseService of
    tests/host/lease_fake.py (real mTLS, a real stream), which leaves the field out: the real
    cloud always sets it."""
    phone = VirtualPhone("emulator-5554")
    phone.hang_dumps(300)  # the first look never ends: the attempt stays on its lease
    async with fake_cloud_and_phones(tmp_path, HOST_ID, [phone]) as rig:
        cloud = rig.cloud
        cloud.lease_s = 3.0  # renewals due every second

        def renewals() -> int:
            return sum(1 for r in cloud.received if r.WhichOneof("kind") == "renewal")

        try:
            async with running_host(node, rig, HOST_ID, tmp_path / "host-data") as run:
                host = run.process
                await cloud.wait_for(lambda: cloud.hellos, 60)
                await cloud.assign("t1", phone.serial, "Turn on dark theme")
                await cloud.wait_for(lambda: renewals() >= 3 or host.returncode is not None, 60)
                # Renewed often enough: the host's own lease clock (3 s) never ended the attempt.
                ended = list(cloud.results)
        finally:
            rig.adb.unplug(phone.serial)  # ends the hung look
    assert run.alive and renewals() >= 3, run.said
    assert not ended, run.said
