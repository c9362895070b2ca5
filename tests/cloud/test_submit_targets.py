"""SubmitTask checks its target against the fleet: a malformed host or phone is refused, a
well-formed one the cloud does not know is accepted with a warning; `validate_only` queues
nothing. And the fleet says which phones are busy with which task, and when a working host was
last seen."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, task_service_pb2, types_pb2
from cloud.server import CloudServer
from tests.cloud.cloud_harness import ScriptedHost, channel, renewal, result, submit
from tests.cloud.test_fleet_watch import WAIT_S, Watcher


def target(host_id: str = "", serial: str = "") -> types_pb2.TaskTarget:
    return types_pb2.TaskTarget(host_id=host_id, device_serial=serial)


@pytest.mark.parametrize(
    ("host_id", "serial", "detail"),
    [
        (
            "bad host",
            "",
            "target.host_id: 'bad host' is not a host id (a certificate identity: a letter or "
            "digit, then letters, digits, '.', '_' or '-', at most 128 characters)",
        ),
        ("-leading-dash", "", "target.host_id: '-leading-dash' is not a host id"),
        ("h1", "emu 1", "target.device_serial: 'emu 1' is not a phone serial"),
        ("", "tab\there", "target.device_serial: 'tab\\there' is not a phone serial"),
        ("", "télé", "target.device_serial: 'télé' is not a phone serial"),
    ],
)
async def test_a_malformed_target_is_refused(
    ops: Any, host_id: str, serial: str, detail: str
) -> None:
    for validate_only in (False, True):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await submit(ops, target=target(host_id, serial), validate_only=validate_only)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(detail)


async def test_an_unknown_target_is_accepted_with_a_warning(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    never = await submit(ops, target=target("h20"))
    assert never.task.status == types_pb2.TASK_STATUS_QUEUED
    assert list(never.warnings) == [
        "host h20 has never connected to this cloud: the task waits until it does, or until "
        "its deadline passes"
    ]
    nobody = await submit(ops, target=target("", "emulator-5554"))
    assert list(nobody.warnings) == [
        "no host has announced a phone emulator-5554: the task waits until one does, or until "
        "its deadline passes"
    ]
    host = ScriptedHost(cloud.address, pki_dir, "h21")
    try:
        odd = 'q_1%"\\'  # LIKE's wildcards and what JSON escapes: found as it is, no more
        await host.connect(["p1", "p2", "10.0.0.7:5555", odd])
        known = await submit(ops, target=target("h21", "p1"))
        assert list(known.warnings) == []
        for serial in ("p2", "10.0.0.7:5555", odd):
            assert list((await submit(ops, target=target("", serial))).warnings) == []
        for serial in ("q_", "q11%", "p", "10.0.0.7"):
            warned = (await submit(ops, target=target("", serial), validate_only=True)).warnings
            assert list(warned) == [
                f"no host has announced a phone {serial}: the task waits until one does, or "
                "until its deadline passes"
            ]
        other = await submit(ops, target=target("h21", "p9"), validate_only=True)
        assert list(other.warnings) == [
            "host h21 has not announced a phone p9 (its phones: p1, p2, 10.0.0.7:5555, "
            f"{odd}): the task waits until it does"
        ]
    finally:
        await host.close()
    gone = await submit(ops, target=target("h21"), validate_only=True)
    if gone.warnings:  # the stream's end is recorded asynchronously
        assert gone.warnings[0].startswith("host h21 is not connected now")


async def test_validate_only_queues_nothing(ops: Any) -> None:
    before = (await ops.ListTasks(task_service_pb2.ListTasksRequest(page_size=500))).tasks
    checked = await submit(ops, target=target("h22"), validate_only=True)
    assert not checked.HasField("task")
    assert checked.warnings[0].startswith("host h22 has never connected")
    after = (await ops.ListTasks(task_service_pb2.ListTasksRequest(page_size=500))).tasks
    assert [t.task_id for t in after] == [t.task_id for t in before]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(ops, goal="", validate_only=True)
    assert err.value.details() == "goal: required"


async def test_the_fleet_shows_busy_phones_and_a_working_host_as_seen(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
    watcher = Watcher(cloud.address, pki_dir, host_id="h23")
    host = ScriptedHost(cloud.address, pki_dir, "h23")

    async def h23() -> types_pb2.Host:
        listed: fleet_service_pb2.ListHostsResponse = await fleet.ListHosts(
            fleet_service_pb2.ListHostsRequest()
        )
        (found,) = [h for h in listed.hosts if h.host_id == "h23"]
        return found

    try:
        await watcher.snapshot()
        await host.connect(["p1", "p2"])
        task = (await submit(ops, goal="Open the clock", target=target("h23", "p2"))).task
        a = (await host.next("assignment")).assignment
        busy = types_pb2.BusyPhone(
            device_serial="p2", task_id=task.task_id, attempt=1, goal="Open the clock"
        )
        assert list((await h23()).busy_phones) == [busy]
        seen = await watcher.until("h23", connected=True)
        while list(seen.busy_phones) != [busy]:
            seen = await watcher.until("h23", connected=True)

        # A working host is seen: its replica vouches for its stream every heartbeat, and
        # that moves the last_seen_at ListHosts shows past its renewal (watchers are not sent
        # every host every beat: the fleet shows a connected host as seen now).
        renewed_at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        await host.send(renewal(a, 1, "working"))
        await host.next("renewed")
        loop = asyncio.get_running_loop()
        end = loop.time() + WAIT_S
        while (await h23()).last_seen_at.ToDatetime() <= renewed_at:
            assert loop.time() < end, "last_seen_at never moved while the host worked"
            await asyncio.sleep(0.1)

        await host.send(result(a))
        await host.next("result_ack")
        while list(seen.busy_phones):
            seen = await watcher.until("h23", connected=True)
        assert list((await h23()).busy_phones) == []
    finally:
        await host.close()
        await watcher.close()
        await ch.close()
