"""No dispatch reaches a host before its hello has settled the leases it re-announces.

`LeaseManager.open` registers a session before its hello's batch settles; a dispatch pass in
that window (the periodic tick, or a queue wake from anywhere) saw a host with no busy phone.
When the host's lease had lapsed and been swept while it was away, the pass claimed the task's
next attempt for the very phone the hello was about to resume it on: the hello's attempt was
then superseded, and the work the phone had done lost. Real Lease streams and store, the pass
forced into the window (the real batcher's 5 ms window makes the race rare, not impossible).
A restarted process's hello has a longer window (its predecessor's leases released, then its
own resumed), and a hello that fails once recorded must not leave its session taking work.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.server import CloudServer
from cloud.store import hosts as hosts_mod
from cloud.store import leases as leases_mod
from tests.cloud.cloud_harness import ScriptedHost, lapse, submit

BOTH = pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


async def _lapsed_while_away(cloud: CloudServer, ops: Any, pki_dir: Path) -> Any:
    """h1's lease of a task, run out and swept while h1 was away; the assignment."""
    async with ScriptedHost(cloud.address, pki_dir, "h1") as first:
        await first.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"), max_attempts=3)
        a = (await first.next("assignment")).assignment
    for _ in range(200):
        if "h1" not in cloud.leases.sessions:
            break
        await asyncio.sleep(0.05)
    assert "h1" not in cloud.leases.sessions
    await lapse(cloud.store, a.task_id, a.attempt)
    await cloud.leases.sweeper.sweep()
    return a


def _pass_before(
    cloud: CloudServer, monkeypatch: pytest.MonkeyPatch, module: Any, name: str
) -> list[int]:
    """Run one dispatch pass as `module.name` is first called (inside `open()`)."""
    real = getattr(module, name)
    passes: list[int] = []

    async def pass_first(*args: Any, **kwargs: Any) -> Any:
        if not passes:
            passes.append(1)
            await cloud.leases.dispatcher.dispatch_pass()
        return await real(*args, **kwargs)

    monkeypatch.setattr(module, name, pass_first)
    return passes


async def _reconnect(
    cloud: CloudServer, pki_dir: Path, a: Any, process_id: str
) -> list[lease_pb.LeaseResponse]:
    held = [
        lease_pb.HeldAssignment(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, device_serial="p1"
        )
    ]
    async with ScriptedHost(cloud.address, pki_dir, "h1") as again:
        await again.connect(["p1"], held, process_id=process_id)
        got = [await again.next(wait=10)]
        while True:
            try:
                got.append(await again.next(wait=1.5))
            except TimeoutError:
                break
    return got


@BOTH
async def test_a_pass_while_the_hello_settles_leaves_its_lapsed_lease_to_it(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1's lease of a ran out and was swept while h1 was away; h1 reconnects naming a. A
    dispatch pass run as the hello's batch starts gives h1 nothing; the hello resumes a in
    the same attempt, and nothing else is assigned on p1."""
    a = await _lapsed_while_away(cloud, ops, pki_dir)
    passes = _pass_before(cloud, monkeypatch, leases_mod, "settle_hellos")
    got = await _reconnect(cloud, pki_dir, a, "p")
    assert passes == [1]
    resumed = [m.assignment for m in got if m.HasField("assignment") and m.assignment.resumed]
    assert [(r.task_id, r.attempt) for r in resumed] == [(a.task_id, a.attempt)], got
    assert not [m for m in got if m.HasField("revoked")], got


@BOTH
async def test_a_pass_while_a_restarted_process_settles_leaves_its_lapsed_lease_to_it(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, h1 back as a new process: its hello is recorded, then its predecessor's
    leases are released and its own resumed. A pass run as that release starts gives h1
    nothing (before, the phones looked idle from the hello's record to the resume: attempt 2
    was claimed on p1 and the hello's attempt refused as superseded)."""
    a = await _lapsed_while_away(cloud, ops, pki_dir)
    passes = _pass_before(cloud, monkeypatch, leases_mod, "release")
    got = await _reconnect(cloud, pki_dir, a, "q")
    assert passes == [1]
    resumed = [m.assignment for m in got if m.HasField("assignment") and m.assignment.resumed]
    assert [(r.task_id, r.attempt) for r in resumed] == [(a.task_id, a.attempt)], got
    assert not [m for m in got if m.HasField("assignment") and not m.assignment.resumed], got


@BOTH
async def test_a_hello_that_fails_once_recorded_leaves_no_session_taking_work(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hello's outbox report fails after the hello was recorded: the stream ends with the
    failure, and no session is left registered (before, it stayed, looking live: the
    dispatcher handed it a task nobody read, and the heartbeat vouched for the host)."""

    async def fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(hosts_mod, "update_outbox", fails)
    async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
        # The stream ends INTERNAL ("internal error; retry later"), its Welcome sent or not.
        with contextlib.suppress(AssertionError):
            await host.connect(["p1"], process_id="p", outbox=types_pb2.OutboxBacklog(items=1))
    for _ in range(200):
        if "h1" not in cloud.leases.sessions:
            break
        await asyncio.sleep(0.05)
    assert "h1" not in cloud.leases.sessions
